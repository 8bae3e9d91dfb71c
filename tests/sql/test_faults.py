"""Faults on real databases: a SQLite file locked by another process, a MariaDB
connection killed while its commit waits.

- SQLite locked past ``busy_timeout`` by another process: the commit fails with
  ``UnavailableError`` and nothing is written; once the lock is gone the same
  store commits again.
- A MySQL server that accepts connections and never answers: opening gives
  up after ``connect_timeout`` with ``UnavailableError``.
- MariaDB connection killed (``KILL <id>`` from another session) while the
  store's commit waits for the thread's row lock: a typed error
  (``UnavailableError``: the commit had not reached ``COMMIT``), nothing
  applied, and the store's next commit succeeds on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pai_storage_sql import SqlThreadStore
from pai_storage_sql.store import thread_key
from sqlalchemy import text

import pai_storage
from pai_storage import CommittedResult
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreUnavailableError, UnavailableError

from .conftest import Target, mysql_engine

pytestmark = pytest.mark.asyncio

LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
conn.close()
"""


async def test_sqlite_locked_by_another_process_is_unavailable_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}"
    async with SqlThreadStore(url, busy_timeout=0.2) as store:
        created = await store.commit_thread(b.create("s", "t", title="before"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        script = tmp_path / "locker.py"
        script.write_text(LOCKER)
        locker = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert locker.stdout is not None
        assert locker.stdin is not None
        try:
            assert (await locker.stdout.readline()).strip() == b"locked"
            with pytest.raises(ThreadStoreUnavailableError, match="busy_timeout"):
                await store.commit_thread(b.create("s", "new"))
            with pytest.raises(ThreadStoreUnavailableError, match="busy_timeout"):
                await store.commit_thread(
                    b.update_at("s", "t", version, None, root=b.root(title="after"))
                )
            # Reads go on while a writer holds the lock (WAL).
            read = await store.read_thread(b.read("s", "t"))
            assert read.thread is not None
            assert read.thread.title == "before"
        finally:
            locker.stdin.write(b"done\n")
            await locker.stdin.drain()
            await locker.wait()
        assert (await store.read_thread(b.read("s", "new"))).thread is None
        read = await store.read_thread(b.read("s", "t"))
        assert read.thread is not None
        assert read.thread.version == version
        assert read.thread.title == "before"
        # The store recovers: the same commit now succeeds.
        again = await store.commit_thread(
            b.update_at("s", "t", version, None, root=b.root(title="after"))
        )
        assert isinstance(again, CommittedResult)


async def test_mariadb_connection_killed_mid_commit(mysql_target: Target) -> None:
    async with mysql_target.store(pool_size=2) as store:
        created = await store.commit_thread(
            b.create("s", "t", {"messages": [b.insert(b.message("m1", "first"))]})
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        table = store.tables.threads.name
        engine = mysql_engine()
        try:
            async with engine.connect() as locker, engine.connect() as admin:
                # Another session holds the thread's root row: the store's commit
                # waits on its SELECT ... FOR UPDATE, mid-transaction.
                await locker.execute(
                    text(f"SELECT revision FROM `{table}` WHERE tkey = :k FOR UPDATE"),
                    {"k": thread_key("s", "t")},
                )
                change = {"messages": [b.insert(b.message("m2", "second"))]}
                commit = asyncio.ensure_future(
                    store.commit_thread(
                        b.update_at("s", "t", version, change, root=b.root(title="killed"))
                    )
                )
                victim = None
                for _ in range(500):
                    rows = (
                        await admin.execute(
                            text(
                                "SELECT id FROM information_schema.processlist "
                                "WHERE info LIKE :pattern AND id <> CONNECTION_ID()"
                            ),
                            {"pattern": f"%FROM {table}%FOR UPDATE%"},
                        )
                    ).all()
                    await admin.rollback()
                    if rows:
                        victim = int(rows[0][0])
                        break
                    await asyncio.sleep(0.01)
                assert victim is not None, "the store's commit never waited on the row lock"
                await admin.execute(text(f"KILL {victim}"))
                with pytest.raises(ThreadStoreUnavailableError):
                    await commit
                await locker.rollback()
        finally:
            await engine.dispose()
        read = await store.read_thread(
            b.read("s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 10}})
        )
        assert read.thread is not None
        assert read.thread.version == version
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["m1"]
        # The store recovers on a fresh connection.
        change = {"messages": [b.insert(b.message("m2", "second"))]}
        again = await store.commit_thread(
            b.update_at("s", "t", version, change, root=b.root(title="after"))
        )
        assert isinstance(again, CommittedResult)


async def test_mysql_server_that_never_answers_is_unavailable_within_connect_timeout() -> None:
    """A server that accepts the TCP connection and never sends its greeting (a
    hung mysqld, a proxy whose backend is gone, the wrong port): opening gives
    up after ``connect_timeout`` with ``UnavailableError``, the password hidden,
    instead of waiting forever (the driver's own timeout covers only TCP)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"mysql://root:S3cretPW@127.0.0.1:{silent.getsockname()[1]}/test"
        for opener, error in (
            (pai_storage.open_store, ThreadStoreUnavailableError),
            (pai_storage.open_kv_store, UnavailableError),
        ):
            started = time.monotonic()

            async def use(opener: Any = opener) -> None:
                async with opener(url, connect_timeout=0.3):
                    pass

            with pytest.raises(error) as caught:
                await asyncio.wait_for(use(), 30)  # the bound of the test, not of the store
            assert time.monotonic() - started < 10
            assert "S3cretPW" not in str(caught.value)
            assert "connect_timeout=0.3s" in str(caught.value)


async def test_mysql_cancelled_operations_log_no_pool_error(
    mysql_target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """Callers cancelled at any point (``wait_for`` timeouts from 0.5 to 5 ms)
    leave nothing for the connection pool to log as an error, and the store
    keeps working."""
    async with pai_storage.open_kv_store(mysql_target.url, **mysql_target.options) as kv:
        await kv.put(("c",), "k", "x")
        with caplog.at_level(logging.WARNING, logger="sqlalchemy"):
            for i in range(60):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(kv.put(("c",), "k", "x" * 5000), 0.0005 + i / 12000)
            await asyncio.sleep(0.2)
        assert [r.getMessage() for r in caplog.records if r.name.startswith("sqlalchemy")] == []
        assert await kv.get(("c",), "k") is not None
