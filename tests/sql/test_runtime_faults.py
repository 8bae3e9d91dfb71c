"""Runtime-store writes that meet a locked database or a killed connection.

SQLite: another process holds the write lock past ``busy_timeout``; every
runtime write raises ``UnavailableError`` and writes nothing, and works again
once the lock is gone. MariaDB: a write waiting on a row lock has its
connection killed (``KILL``) from another session; it raises
``UnavailableError``, nothing of it is applied, and the store's next
operation takes a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pai_storage_sql.client import SqlClient
from pai_storage_sql.guard import SqlExecutionGuard
from pai_storage_sql.kv import SqlKeyValueStore
from pai_storage_sql.snapshots import SqlSnapshotStore
from pai_storage_sql.state import SqlAgentStateStore
from sqlalchemy import text

from pai_storage import UnavailableError
from pai_storage.errors import ThreadStoreError

from .conftest import Target, mysql_engine

pytestmark = pytest.mark.asyncio


@contextlib.contextmanager
def unavailable(match: str | None = None) -> Iterator[None]:
    """The block raises the general ``UnavailableError``, never a thread-store class."""
    with pytest.raises(UnavailableError, match=match) as raised:
        yield
    assert not isinstance(raised.value, ThreadStoreError), type(raised.value)


HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


async def test_sqlite_locked_past_busy_timeout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/locked.db"
    client = SqlClient.shared(url, busy_timeout=0.2)
    kv = SqlKeyValueStore(client=client)
    state = SqlAgentStateStore(client=client)
    snapshots = SqlSnapshotStore(client=client)
    guard = SqlExecutionGuard(client=client, lease_ttl=timedelta(minutes=1))
    stores = (kv, state, snapshots, guard)
    try:
        for store in stores:
            await store.initialize()
        await kv.put(("ns",), "k", "before")
        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            HOLDER,
            str(tmp_path / "locked.db"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None
            assert (await holder.stdout.readline()).strip() == b"locked"
            with unavailable("busy_timeout"):
                await kv.put(("ns",), "k", "during")
            with unavailable("busy_timeout"):
                await state.append_list("u", "s", "l", [1])
            with unavailable("busy_timeout"):
                await state.save_if_version("u", "s", "v", 1, 0)
            with unavailable():
                await snapshots.put("scope", "id", b"x")
            with unavailable():
                await guard.try_acquire("r", owner="w")
            # Reads go on (WAL readers do not wait for the writer).
            item = await kv.get(("ns",), "k")
            assert item is not None
            assert item.value == "before"
        finally:
            assert holder.stdin is not None
            holder.stdin.write(b"done\n")
            await holder.stdin.drain()
            holder.stdin.close()
            await holder.wait()
        item = await kv.get(("ns",), "k")
        assert item is not None
        assert item.value == "before"
        assert item.version == 1
        assert await state.get_list("u", "s", "l") == []
        assert await snapshots.get("scope", "id") is None
        assert await guard.inspect("r") is None
        await kv.put(("ns",), "k", "after")
        assert await state.append_list("u", "s", "l", [1]) == 1
        lock = await guard.try_acquire("r", owner="w")
        assert lock is not None
        await lock.release()
    finally:
        for store in stores:
            await store.close()
    plain = sqlite3.connect(tmp_path / "locked.db")
    try:
        count = plain.execute("SELECT count(*) FROM pai_snapshots").fetchone()[0]
    finally:
        plain.close()
    assert count == 0


async def test_mysql_write_killed_while_waiting(mysql_target: Target) -> None:
    client = SqlClient.shared(mysql_target.url, **mysql_target.options)
    kv = SqlKeyValueStore(client=client)
    table = client.tables.runtime.kv.name
    blocker = mysql_engine()
    try:
        await kv.put(("ns",), "k", "before")
        async with blocker.connect() as lock_conn:
            await lock_conn.execute(text(f"SELECT * FROM {table} FOR UPDATE"))
            write = asyncio.ensure_future(kv.put(("ns",), "k", "during"))
            victim = None
            for _ in range(500):  # until the write waits on the row lock
                rows = await lock_conn.execute(
                    text(
                        "SELECT id FROM information_schema.processlist "
                        "WHERE info LIKE :pattern AND id <> CONNECTION_ID()"
                    ),
                    {"pattern": f"INSERT INTO {table}%"},
                )
                victim = rows.scalar()
                if victim is not None:
                    break
                await asyncio.sleep(0.01)
            assert victim is not None, "the write never reached the row lock"
            await lock_conn.execute(text(f"KILL {int(victim)}"))
            with unavailable():
                await write
            await lock_conn.rollback()
        item = await kv.get(("ns",), "k")
        assert item is not None
        assert item.value == "before"
        assert item.version == 1
        again = await kv.put(("ns",), "k", "after")
        assert again.version == 2
    finally:
        await kv.close()
        await blocker.dispose()
