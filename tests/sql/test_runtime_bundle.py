"""``connect()`` opens the five SQL stores over one client; each store also opens alone.

The runtime stores share the thread store's :class:`SqlClient` (one SQLite
writer connection and reader pool, or one MySQL pool); closing the bundle
closes the client it made, and what one store wrote through it the others see
on the same database.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pai_storage_sql.client import SqlClient
from pai_storage_sql.guard import SqlExecutionGuard
from pai_storage_sql.kv import SqlKeyValueStore
from pai_storage_sql.snapshots import SqlSnapshotStore
from pai_storage_sql.state import SqlAgentStateStore

import pai_storage
from pai_storage import ConfigurationError

from .conftest import Target

pytestmark = pytest.mark.asyncio


async def test_connect_shares_one_client(target: Target) -> None:
    async with pai_storage.connect(target.url, **target.options) as stores:
        assert isinstance(stores.kv, SqlKeyValueStore)
        assert isinstance(stores.state, SqlAgentStateStore)
        assert isinstance(stores.snapshots, SqlSnapshotStore)
        assert isinstance(stores.guard, SqlExecutionGuard)
        clients = {
            id(store._db.client)
            for store in (stores.kv, stores.state, stores.snapshots, stores.guard)
        }
        assert len(clients) == 1
        client = stores.kv._db.client
        assert isinstance(client, SqlClient)
        await stores.kv.put(("bundle",), "k", {"v": 1})
        await stores.state.save("u", "s", "k", [1, 2])
        await stores.snapshots.put("scope", "id", b"data")
        async with stores.guard.hold("r", owner="me", lease_ttl=timedelta(minutes=1)) as lock:
            info = await stores.guard.inspect("r")
            assert info is not None
            assert info.fencing_token == lock.fencing_token
    assert client.closed
    # A store opened alone sees what the bundle wrote.
    kv = pai_storage.open_kv_store(target.url, **target.options)
    state = pai_storage.open_state_store(target.url, **target.options)
    snapshots = pai_storage.open_snapshot_store(target.url, **target.options)
    guard = pai_storage.open_guard(target.url, **target.options)
    try:
        item = await kv.get(("bundle",), "k")
        assert item is not None
        assert item.value == {"v": 1}
        assert await state.get("u", "s", "k") == [1, 2]
        got = await snapshots.get("scope", "id")
        assert got is not None
        assert got.data == b"data"
        assert await guard.inspect("r") is None  # released when the block ended
    finally:
        for store in (kv, state, snapshots, guard):
            await store.close()


async def test_store_options_are_checked(sqlite_target: Target) -> None:
    with pytest.raises(ConfigurationError, match="max_value_bytes"):
        pai_storage.open_kv_store(sqlite_target.url, max_value_bytes=512 * 1024 * 1024)
    with pytest.raises(ConfigurationError, match="session_ttl"):
        pai_storage.open_state_store(sqlite_target.url, session_ttl=5)
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        pai_storage.open_guard(sqlite_target.url, lease_ttl=timedelta(0))
    with pytest.raises(ConfigurationError, match="snapshot_ttl"):
        pai_storage.open_snapshot_store(sqlite_target.url, snapshot_ttl="1d")
