"""Runtime-store writes whose reply is lost, injected by a loopback TCP proxy.

The proxy forwards the statement (or the ``COMMIT``) to the server, which
applies it, and swallows the reply. A direct store then shows the write
applied, so the only truthful error is ``OutcomeUnknownError`` — never
``UnavailableError``, which promises that nothing was written. A read whose
reply is lost is ``UnavailableError``. Runtime stores raise the general
classes, in words about a write, not a thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from support.proxy import FaultProxy

from pai_storage import (
    AgentStateStore,
    Item,
    KeyValueStore,
    OutcomeUnknownError,
    StorageError,
    UnavailableError,
    open_kv_store,
    open_state_store,
)
from pai_storage.errors import ThreadStoreError

from .helpers import URL, proxied_url

pytestmark = pytest.mark.asyncio

USER = "user-1"


@dataclass
class Stores:
    kv: KeyValueStore
    state: AgentStateStore
    direct_kv: KeyValueStore
    direct_state: AgentStateStore


@pytest_asyncio.fixture
async def stores(fault_proxy: FaultProxy, pg_schema: str) -> AsyncIterator[Stores]:
    # One connection and no statement cache: every statement's text and
    # parameters cross the proxy, so the markers below always see them.
    url = proxied_url(fault_proxy.port)
    options: dict[str, Any] = {
        "schema": pg_schema,
        "min_pool_size": 1,
        "max_pool_size": 1,
        "statement_cache_size": 0,
    }
    made = Stores(
        open_kv_store(url, **options),
        open_state_store(url, **options),
        open_kv_store(URL, schema=pg_schema),
        open_state_store(URL, schema=pg_schema),
    )
    await made.direct_kv.put(("ns",), "victim-key", 1)
    await made.direct_kv.put(("ns",), "read-key", 1)
    await made.direct_state.save(USER, "victim-session", "k", 1)
    await made.direct_state.save(USER, "s2", "victim-state-key", 1)
    await made.direct_state.save(USER, "s2", "other", 1)
    try:
        yield made
    finally:
        for store in (made.kv, made.state, made.direct_kv, made.direct_state):
            await store.close()


async def _kv_put(s: Stores) -> Any:
    return await s.kv.put(("ns",), "new-key", {"v": "marker-put"})


async def _kv_put_applied(s: Stores) -> bool:
    item = await s.direct_kv.get(("ns",), "new-key")
    return isinstance(item, Item) and item.value == {"v": "marker-put"}


async def _kv_delete(s: Stores) -> Any:
    return await s.kv.delete(("ns",), "victim-key")


async def _kv_delete_applied(s: Stores) -> bool:
    return await s.direct_kv.get(("ns",), "victim-key") is None


async def _session_delete(s: Stores) -> Any:
    return await s.state.delete(USER, "victim-session")


async def _session_delete_applied(s: Stores) -> bool:
    return not await s.direct_state.exists(USER, "victim-session")


async def _state_key_delete(s: Stores) -> Any:
    return await s.state.delete_state(USER, "s2", "victim-state-key")


async def _state_key_delete_applied(s: Stores) -> bool:
    return await s.direct_state.get(USER, "s2", "victim-state-key") is None


WRITES: list[Any] = [
    pytest.param(b"marker-put", _kv_put, _kv_put_applied, id="kv-put"),
    pytest.param(b"victim-key", _kv_delete, _kv_delete_applied, id="kv-delete"),
    pytest.param(b"victim-session", _session_delete, _session_delete_applied, id="session-delete"),
    # A transaction: its statements go through, the reply to COMMIT is lost.
    pytest.param(b"COMMIT", _state_key_delete, _state_key_delete_applied, id="state-key-delete"),
]


@pytest.mark.parametrize(("marker", "write", "applied"), WRITES)
async def test_write_with_lost_reply_is_outcome_unknown(
    fault_proxy: FaultProxy,
    stores: Stores,
    marker: bytes,
    write: Callable[[Stores], Awaitable[Any]],
    applied: Callable[[Stores], Awaitable[bool]],
) -> None:
    fault_proxy.cut_on(marker, forward=True)
    with pytest.raises(StorageError) as caught:
        await write(stores)
    assert fault_proxy.triggered.is_set()
    assert await applied(stores)  # the server applied it: "nothing applied" would be false
    assert type(caught.value) is OutcomeUnknownError, repr(caught.value)
    assert "may or may not have been applied" in str(caught.value)
    assert "thread" not in str(caught.value)
    assert caught.value.__cause__ is not None  # the driver error is chained
    fault_proxy.restore()
    await write(stores)  # the store recovers: the pool replaces the dead connection


async def test_read_with_lost_reply_is_unavailable(fault_proxy: FaultProxy, stores: Stores) -> None:
    fault_proxy.cut_on(b"read-key", forward=True)
    with pytest.raises(StorageError) as caught:
        await stores.kv.get(("ns",), "read-key")
    assert fault_proxy.triggered.is_set()
    assert type(caught.value) is UnavailableError, repr(caught.value)
    assert not isinstance(caught.value, ThreadStoreError)
    assert "nothing was applied" in str(caught.value)
    fault_proxy.restore()
    item = await stores.kv.get(("ns",), "read-key")
    assert isinstance(item, Item)


@pytest.mark.parametrize("opener", [open_kv_store, open_state_store], ids=["kv", "state"])
async def test_unreachable_server_is_the_general_unavailable_error(
    pg_schema: str, opener: Callable[..., Any]
) -> None:
    store = opener("postgresql://app:s3cr3t-pw@127.0.0.1:1/test", schema=pg_schema)
    try:
        with pytest.raises(StorageError) as caught:
            await store.initialize()
        assert type(caught.value) is UnavailableError, repr(caught.value)
        assert "nothing was applied" in str(caught.value)
        assert "s3cr3t-pw" not in str(caught.value)
        assert caught.value.__cause__ is not None
    finally:
        await store.close()
