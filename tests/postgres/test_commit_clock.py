"""A commit is stamped with the server's clock read after it holds the thread.

The contract stamps commits with the server's time and never lets a thread's
commit times go back: a commit that waited for the root's lock must read the
clock once it has the lock, not when it asked for it. The hold returns the
clock in the same statement (``statements.hold_statement``), so the order is
the statement's to keep.

The store committed the thread it appends to here, so the append is
optimistic first: its guard checks the server's clock when it finds the
root, after the wait, and finds it past its window; the usual commit then
stamps it. A guard that checked the clock before the wait would commit the
append with a time before the holder ended, and fail this test.
"""

from __future__ import annotations

import asyncio

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore

from pai_storage import CommittedResult
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
