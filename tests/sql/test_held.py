"""The connections a client keeps checked out between operations (SQLite).

A client that made its SQLite engines keeps one writer connection and up to
``pool_size`` reader connections checked out of SQLAlchemy's pool between
operations (see docs/sql.md). These tests pin what that must not change:
operations beyond the limit wait their turn, a cancelled or failed operation
never leaves its connection or its slot behind, closing returns every
connection to the pool, and the engines stay usable directly meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pai_storage_sql.client import Engines, SqlClient
from sqlalchemy import text

from pai_storage import ConfigurationError, ConflictResult
from pai_storage import builders as b

from .conftest import Target

pytestmark = pytest.mark.asyncio


def counts(engines: Engines) -> tuple[int, int]:
    assert engines.held_writer is not None
    assert engines.held_reader is not None
    return engines.held_writer.count, engines.held_reader.count


async def test_operations_beyond_the_limit_wait_and_reuse_the_held_connections(
    sqlite_target: Target,
) -> None:
    async with sqlite_target.store(pool_size=2) as store:
        await store.commit_thread(b.create("s", "t"))
        engines = await store.client.ready()
        seen: set[int] = set()

        async def read() -> None:
            async with store.client.reading() as op:
                seen.add(id(op.driver))
                await asyncio.sleep(0.001)
                await op.run_text("SELECT 1")

        async def commit(i: int) -> None:
            await store.commit_thread(b.create("s", f"t{i}"))

        await asyncio.gather(*(read() for _ in range(20)), *(commit(i) for i in range(10)))
        assert len(seen) <= 2
        assert counts(engines) == (1, 2)
        assert engines.held_reader is not None
        assert len(engines.held_reader.idle) == 2
        assert engines.held_writer is not None
        assert len(engines.held_writer.idle) == 1
        listed = await store.list_threads({"scopeKey": "s", "limit": 50})
        assert len(listed.items) == 11


async def test_a_cancelled_waiter_leaves_no_slot_behind(sqlite_target: Target) -> None:
    async with sqlite_target.store(pool_size=1) as store:
        engines = await store.client.ready()
        inside, leave = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with store.client.reading():
                inside.set()
                await leave.wait()

        holder = asyncio.create_task(hold())
        await inside.wait()
        waiter = asyncio.create_task(store.list_threads({"scopeKey": "s", "limit": 10}))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        leave.set()
        await holder
        assert (await store.list_threads({"scopeKey": "s", "limit": 10})).items == []
        assert counts(engines) == (0, 1)


async def test_a_cancelled_operation_drops_its_connection(sqlite_target: Target) -> None:
    async with sqlite_target.store(pool_size=1) as store:
        engines = await store.client.ready()
        async with store.client.reading() as op:
            first = op.driver
        inside = asyncio.Event()

        async def stuck() -> None:
            async with store.client.reading():
                inside.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(stuck())
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert counts(engines) == (0, 0)  # invalidated and given back, not kept
        async with store.client.reading() as op:
            assert op.driver is not first
        assert counts(engines) == (0, 1)


async def test_a_driver_failure_drops_the_connection_a_conflict_keeps_it(
    sqlite_target: Target,
) -> None:
    async with sqlite_target.store() as store:
        created = await store.commit_thread(b.create("s", "t"))
        engines = await store.client.ready()
        async with store.client.writing() as op:
            first = op.driver
        # A conflict is the store's answer, not a driver failure: the connection stays.
        again = await store.commit_thread(b.create("s", "t"))
        assert isinstance(again, ConflictResult)
        async with store.client.writing() as op:
            assert op.driver is first
        with pytest.raises(Exception, match="no such table"):
            async with store.client.writing() as op:
                await op.conn.execute(text("SELECT * FROM no_such_table"))
        assert counts(engines) == (0, 0)
        async with store.client.writing() as op:
            assert op.driver is not first
        assert created.thread is not None
        read = await store.read_thread(b.read("s", "t"))
        assert read.thread is not None
        assert read.thread.version == created.thread.version


async def test_closing_while_an_operation_waits(sqlite_target: Target) -> None:
    store = sqlite_target.store(pool_size=1)
    await store.initialize()
    inside, leave = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with store.client.reading():
            inside.set()
            await leave.wait()

    holder = asyncio.create_task(hold())
    await inside.wait()
    waiter = asyncio.create_task(store.client.reading().__aenter__())
    await asyncio.sleep(0.01)
    engines = await store.client.ready()
    await store.close()
    leave.set()
    await holder
    with pytest.raises(ConfigurationError, match="closed"):
        await waiter
    for engine in (engines.writer, engines.reader):
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_engines_stay_usable_directly_while_connections_are_held(
    sqlite_target: Target,
) -> None:
    client = SqlClient(sqlite_target.url)
    async with client, sqlite_target.store(client=client) as store:
        await store.commit_thread(b.create("s", "t"))
        await store.read_thread(b.read("s", "t"))
        engines: Any = await client.ready()
        assert counts(engines) == (1, 1)
        async with engines.writer.begin() as conn:
            await conn.execute(text("SELECT 1"))
        async with engines.reader.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM pai_threads"))).scalar() == 1
        await store.commit_thread(b.create("s", "u"))
    for engine in (engines.writer, engines.reader):
        assert engine.sync_engine.pool.checkedout() == 0
