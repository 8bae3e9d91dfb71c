"""Operations that run whole in SQLite's database thread, at their edges.

``SqlClient.run_write`` / ``run_read`` run a whole transaction in one call to
aiosqlite's thread (see docs/sql.md, "A commit is one call into the database
thread"). These tests pin what must hold around that call: a caller cancelled
at any point (a write or a lease renewal whose caller gave up while it waited
for another connection's write lock is not applied), a body that fails or
waits where nothing may wait, a later operation never seeing what an earlier
one left behind, and the in-memory database (its one connection is kept
when an operation is cancelled: closing it would lose the database).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pai_storage_sql import SqlExecutionGuard, SqlKeyValueStore
from pai_storage_sql.client import Operation, SqlClient
from sqlalchemy import text

from pai_storage import StoreWarning
from pai_storage.backend import emit_warning

pytestmark = pytest.mark.asyncio


class _Boom(BaseException):
    """Neither an ``Exception`` nor a cancellation."""


def _db(tmp_path: Path) -> tuple[str, str]:
    path = str(tmp_path / "pai.db")
    return path, f"sqlite:///{path}"


def _busy(seconds: float) -> None:
    """Keep the database thread busy (called inside a body, in that thread)."""
    time.sleep(seconds)


async def _hold_write_lock(path: str, seconds: float) -> None:
    """Another connection (as another process would) holds the write lock a while."""
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("BEGIN IMMEDIATE")
        await asyncio.sleep(seconds)
        raw.execute("ROLLBACK")
    finally:
        raw.close()


async def _create_table(client: SqlClient, name: str) -> None:
    async def body(op: Operation) -> None:
        await op.run_text(f"CREATE TABLE {name} (x INTEGER)")

    await client.run_write(body)


async def _rows(client: SqlClient, name: str) -> list[int]:
    async def body(op: Operation) -> list[int]:
        rows = await op.driver.execute_fetchall(f"SELECT x FROM {name} ORDER BY x", ())
        return [int(r[0]) for r in rows]

    return await client.run_read(body)


# ---------------------------------------------------------------- cancellation


async def test_a_write_cancelled_while_waiting_for_the_lock_is_not_applied(
    tmp_path: Path,
) -> None:
    path, url = _db(tmp_path)
    async with SqlKeyValueStore(url, busy_timeout=5) as kv:
        await kv.put(["ns"], "k", {"v": 1})
        holder = asyncio.create_task(_hold_write_lock(path, 0.5))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(kv.put(["ns"], "k", {"v": 2}), 0.1)
        await holder
        item = await kv.get(["ns"], "k")
        assert item is not None
        assert item.value == {"v": 1}


async def test_a_renewal_abandoned_by_its_caller_does_not_extend_the_lease(
    tmp_path: Path,
) -> None:
    path, url = _db(tmp_path)
    async with SqlExecutionGuard(url, lease_ttl=timedelta(seconds=30), busy_timeout=5) as guard:
        lock = await guard.acquire("res", owner="me")
        before = await guard.inspect("res")
        assert before is not None
        holder = asyncio.create_task(_hold_write_lock(path, 0.5))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(lock.renew(), 0.1)
        await holder
        after = await guard.inspect("res")
        assert after is not None
        assert after.expires_at == before.expires_at
        await lock.release()


async def test_a_cancelled_write_gives_its_slot_back_and_leaves_no_transaction(
    tmp_path: Path,
) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")
        engines = await client.ready()
        held = engines.held_writer
        assert held is not None
        started = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def slow(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (1)")
            loop.call_soon_threadsafe(started.set)
            _busy(0.2)  # the thread is busy: the caller is cancelled meanwhile
            await op.run_text("INSERT INTO t VALUES (2)")

        task = asyncio.create_task(client.run_write(slow))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Whatever the outcome, it is whole; the slot is back; a later write runs.
        assert await _rows(client, "t") in ([], [1, 2])
        assert held.count <= held.limit
        assert not held.waiters

        async def three(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (3)")

        await asyncio.wait_for(client.run_write(three), 5)
        assert 3 in await _rows(client, "t")


async def test_a_write_cancelled_before_its_turn_on_the_writer_never_runs(
    tmp_path: Path,
) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")
        loop = asyncio.get_running_loop()
        gate = asyncio.Event()

        async def first(op: Operation) -> None:
            loop.call_soon_threadsafe(gate.set)
            _busy(0.2)
            await op.run_text("INSERT INTO t VALUES (1)")

        async def second(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (2)")

        one = asyncio.create_task(client.run_write(first))
        await gate.wait()
        two = asyncio.create_task(client.run_write(second))  # waits for the writer slot
        await asyncio.sleep(0.01)
        two.cancel()
        with pytest.raises(asyncio.CancelledError):
            await two
        await one
        assert await _rows(client, "t") == [1]


async def test_a_cancelled_operation_still_delivers_its_warnings_once(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        got: list[str] = []

        async def on_warning(warning: StoreWarning) -> None:
            got.append(warning.reason)

        async def body(op: Operation) -> None:
            await emit_warning(on_warning, StoreWarning("invalid_record", "before"))
            loop.call_soon_threadsafe(started.set)
            _busy(0.1)
            await emit_warning(on_warning, StoreWarning("invalid_record", "after"))

        task = asyncio.create_task(client.run_write(body))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        assert got == ["before", "after"]

        async def quiet(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (1)")

        await client.run_write(quiet)
        assert got == ["before", "after"]  # nothing left over in the thread


# ---------------------------------------------------------------- bodies


async def test_a_body_that_waits_in_its_finally_is_rolled_back(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")

        async def body(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (1)")
            try:
                await asyncio.sleep(0)  # refused: closed with GeneratorExit
            finally:
                await asyncio.sleep(0)  # ...which this ignores

        with pytest.raises(RuntimeError):
            await client.run_write(body)
        assert await _rows(client, "t") == []

        async def two(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (2)")

        await client.run_write(two)
        assert await _rows(client, "t") == [2]


async def test_sqlalchemy_execution_in_the_thread_is_refused_and_rolled_back(
    tmp_path: Path,
) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")

        async def body(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (1)")
            await op.conn.execute(text("INSERT INTO t VALUES (2)"))

        with pytest.raises(Exception, match="event loop"):
            await client.run_write(body)
        assert await _rows(client, "t") == []

        async def three(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (3)")

        await client.run_write(three)
        assert await _rows(client, "t") == [3]


async def test_sqlalchemy_execution_in_the_thread_is_a_runtime_error(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")

        async def body(op: Operation) -> None:
            conn = client.connection(op)
            await conn.exec_driver_sql("INSERT INTO t VALUES (2)")

        with pytest.raises(RuntimeError):
            await client.run_write(body)


async def test_a_base_exception_in_the_body_rolls_back_and_frees_the_writer(
    tmp_path: Path,
) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")
        held = (await client.ready()).held_writer
        assert held is not None

        async def body(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (1)")
            raise _Boom()

        with pytest.raises(_Boom):
            await client.run_write(body)
        assert await _rows(client, "t") == []
        assert held.count <= held.limit

        async def two(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (2)")

        await asyncio.wait_for(client.run_write(two), 5)
        assert await _rows(client, "t") == [2]


async def test_a_failed_body_keeps_its_own_exception(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    async with SqlClient(url) as client:
        await _create_table(client, "t")

        async def body(op: Operation) -> None:
            await op.run_text("INSERT INTO t VALUES (1)")
            raise KeyError("mine")

        with pytest.raises(KeyError, match="mine"):
            await client.run_write(body)
        assert await _rows(client, "t") == []


# ---------------------------------------------------------------- in memory


async def test_an_in_memory_database_survives_a_cancelled_operation() -> None:
    async with SqlKeyValueStore("sqlite:///:memory:") as kv:
        await kv.put(["ns"], "kept", {"v": 0})
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        client = kv._db.client

        async def slow(op: Operation) -> None:
            loop.call_soon_threadsafe(started.set)
            _busy(0.1)

        task = asyncio.create_task(client.run_write(slow))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        item = await kv.get(["ns"], "kept")
        assert item is not None
        assert item.value == {"v": 0}


async def test_an_in_memory_database_survives_a_cancelled_read() -> None:
    from pai_storage_sql import SqlThreadStore

    from pai_storage import builders as b

    async with SqlThreadStore("sqlite:///:memory:") as store:
        await store.commit_thread(b.create("s", "t"))
        client = store.client
        started = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def slow_read() -> None:
            async with client.reading() as op:  # the statement-by-statement path

                def slow() -> int:  # runs in aiosqlite's thread, inside the statement
                    loop.call_soon_threadsafe(started.set)
                    _busy(0.1)
                    return 1

                await op.driver.create_function("pai_slow", 0, slow)
                await op.driver.execute_fetchall("SELECT pai_slow()")

        task = asyncio.create_task(slow_read())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        read = await store.read_thread(b.read("s", "t"))
        assert read.thread is not None  # the database, and the thread, are still there
        assert (await store.list_threads({"scopeKey": "s", "limit": 10})).items


async def test_in_memory_reads_and_writes_take_turns(tmp_path: Path) -> None:
    async with SqlKeyValueStore("sqlite:///:memory:") as kv:

        async def put(n: int) -> None:
            await kv.put(["ns"], f"k{n}", {"v": n})

        await asyncio.gather(*(put(n) for n in range(20)))
        got = await asyncio.gather(*(kv.get(["ns"], f"k{n}") for n in range(20)))
        assert [g.value["v"] for g in got if g is not None] == list(range(20))


# ---------------------------------------------------------------- concurrency


async def test_concurrent_runtime_reads_and_writes_agree(tmp_path: Path) -> None:
    _, url = _db(tmp_path)
    async with SqlKeyValueStore(url, pool_size=4) as kv:

        async def writer(n: int) -> None:
            for i in range(10):
                await kv.put(["ns", str(n)], f"k{i}", {"n": n, "i": i})

        async def reader(n: int) -> list[Any]:
            return [await kv.get(["ns", str(n)], f"k{i}") for i in range(10)]

        await asyncio.gather(*(writer(n) for n in range(4)), *(reader(n) for n in range(8)))
        for n in range(4):
            items = await reader(n)
            assert [item.value for item in items if item is not None] == [
                {"n": n, "i": i} for i in range(10)
            ]
