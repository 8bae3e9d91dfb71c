"""A commit is stamped with the server's clock read after it holds the thread.

The contract stamps commits with the server's time and never lets a thread's
commit times go back: a commit that waited for the root's lock must read the
clock once it has the lock, not when it asked for it. The hold returns the
clock in the same statement (``statements.hold_statement``), so the order is
the statement's to keep.

An optimistic commit (the store committed the version it appends to) has no
hold: its one statement locks the root without waiting, reading the
server's clock just before, and applies nothing when the root is held or the
clock is outside the window of the time it predicted; the usual commit then
stamps it. The tests below run
it on a warmed connection (its statement prepared, so that only the wait can
put the clock past the window), with the lock taken by a holder that leaves
the row unchanged (a commit rolled back, a fork reading the thread): a
statement that waited for it with a clock read before the wait would stamp
the append before the holder ended.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore
from support.optimistic import append_judged_by_stale_facts

from pai_storage import CommittedResult, ConflictResult, ThreadVersion
from pai_storage import builders as b

from .helpers import URL

pytestmark = pytest.mark.asyncio

WAIT = 0.5
"""Seconds the other transaction holds the root while the commit waits for it."""


async def test_a_commit_that_waited_for_the_root_is_stamped_after_the_holder_ended(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        root = f"{store.tables.threads} WHERE scope_key = $1 AND thread_id = $2"
        # The holder locks the root and leaves it unchanged: the waiting commit's
        # lock then returns the row as it was, with nothing re-evaluated.
        async with pg_conn.transaction():
            await pg_conn.fetchval(f"SELECT revision FROM {root} FOR UPDATE", b"s", b"t")
            waiting = asyncio.create_task(
                store.commit_thread(
                    b.update_at(
                        "s",
                        "t",
                        created.thread.version,
                        {"messages": [b.insert(b.message("m1"))]},
                        root=b.root(),
                    )
                )
            )
            await asyncio.sleep(WAIT)
            assert not waiting.done(), "the commit did not wait for the root's lock"
            ended = await pg_conn.fetchval("SELECT date_trunc('milliseconds', clock_timestamp())")
        result = await waiting
    assert isinstance(result, CommittedResult)
    assert result.committed_at >= ended


async def _append(store: PostgresThreadStore, version: ThreadVersion, mid: str) -> CommittedResult:
    result = await store.commit_thread(
        b.update_at("s", "t", version, {"messages": [b.insert(b.message(mid))]}, root=b.root())
    )
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result


@pytest.mark.parametrize("lock", ["FOR UPDATE", "FOR SHARE"])
async def test_an_optimistic_commit_that_waited_for_the_root_is_stamped_after_the_holder_ended(
    pg_schema: str, pg_conn: asyncpg.Connection, lock: str
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema, max_pool_size=1) as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        for n in range(3):  # the one connection's statements prepared
            version = (await _append(store, version, f"warm-{n}")).thread.version  # type: ignore[union-attr]
        root = f"{store.tables.threads} WHERE scope_key = $1 AND thread_id = $2"
        async with pg_conn.transaction():
            await pg_conn.fetchval(f"SELECT revision FROM {root} {lock}", b"s", b"t")
            waiting = asyncio.create_task(_append(store, version, "m1"))
            await asyncio.sleep(WAIT)
            assert not waiting.done(), "the commit did not wait for the root's lock"
            ended = await pg_conn.fetchval("SELECT date_trunc('milliseconds', clock_timestamp())")
        result = await waiting
    assert result.committed_at >= ended


async def test_an_optimistic_commit_never_takes_a_time_ahead_of_the_server(
    pg_schema: str,
) -> None:
    """A process whose view of the server's clock runs ahead (it predicts a
    second too late) applies nothing optimistically: the usual commit stamps it."""
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = (await _append(store, created.thread.version, "warm")).thread.version  # type: ignore[union-attr]
        store._server_clock.observe(datetime.now(UTC) + timedelta(seconds=1))
        result = await _append(store, version, "m1")
        assert result.committed_at <= datetime.now(UTC)


async def test_a_rule_broken_only_by_the_known_facts_is_the_held_commits_conflict(
    pg_schema: str,
) -> None:
    """The store knows version 2 (run ``r1`` open, owning the tail); another store
    finished the run since. Against the known facts a standalone message breaks
    a rule, but the commit names a version that is gone: the held judgement's
    conflict, not the optimistic judgement's error."""
    async with (
        PostgresThreadStore(URL, schema=pg_schema) as store,
        PostgresThreadStore(URL, schema=pg_schema) as other,
    ):
        result = await append_judged_by_stale_facts(store, other)
        assert isinstance(result, ConflictResult), result
