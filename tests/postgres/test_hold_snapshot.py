"""A commit queued behind another on the same thread is judged against the state
the lock gives it, not the state its statement's snapshot saw before the wait.

The hold reads the root ``FOR UPDATE`` and the rows the changes name in one
statement; in ``READ COMMITTED`` the lock returns the root as the commit that
held it left it, while the rest of the statement reads the snapshot taken
before the wait. A commit naming the version the holder is writing (a client
that pipelines its commits knows it: the revision goes up by one) must still
be judged against that version's rows, as the reference model judges it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore

from pai_storage import CommittedResult, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .helpers import URL

pytestmark = pytest.mark.asyncio


async def _waiting(conn: asyncpg.Connection, count: int) -> None:
    """Until ``count`` backends wait, directly or not, for ``conn``'s transaction."""
    me = await conn.fetchval("SELECT pg_backend_pid()")
    for _ in range(1000):
        # The activity view is read once per transaction unless its snapshot is cleared.
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = await conn.fetch(
            "SELECT pid, pg_blocking_pids(pid) AS by FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock'"
        )
        behind = {me}  # the backends waiting for ``conn``, or for one that waits for it
        for _ in rows:
            behind.update(r["pid"] for r in rows if not behind.isdisjoint(r["by"]))
        if len(behind) > count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the commits did not wait for the root's lock")


async def _queued_behind(
    store: PostgresThreadStore,
    conn: asyncpg.Connection,
    first: dict[str, Any],
    second: dict[str, Any],
) -> tuple[Any, Any]:
    """Run ``first`` then ``second``, both waiting for the root while another
    transaction holds it, so ``second`` takes its snapshot before ``first`` commits."""
    threads = store.tables.threads
    async with conn.transaction():
        await conn.fetchval(
            f"SELECT revision FROM {threads} WHERE scope_key = $1 AND thread_id = $2 FOR UPDATE",
            b"s",
            b"t",
        )
        a = asyncio.create_task(store.commit_thread(first))
        await _waiting(conn, 1)
        b_ = asyncio.create_task(store.commit_thread(second))
        await _waiting(conn, 2)
    results = await asyncio.gather(a, b_, return_exceptions=True)
    return results[0], results[1]


def _next(version: ThreadVersion) -> ThreadVersion:
    return ThreadVersion(
        thread_instance_id=version.thread_instance_id, revision=version.revision + 1
    )


async def _created_with_m1(store: PostgresThreadStore) -> ThreadVersion:
    """The version of a new thread ``s``/``t`` holding the message ``m1``."""
    created = await store.commit_thread(
        b.create("s", "t", changes={"messages": [b.insert(b.message("m1"))]})
    )
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    return created.thread.version


async def test_a_pipelined_commit_sees_the_message_the_one_before_it_inserted(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        v1 = await _created_with_m1(store)
        streaming = b.message("m2", "par", status="streaming")
        done = b.message("m2", "partial answer", status="complete")
        first, second = await _queued_behind(
            store,
            pg_conn,
            b.update_at("s", "t", v1, {"messages": [b.insert(streaming)]}, root=b.root()),
            b.update_at("s", "t", _next(v1), {"messages": [b.replace(done)]}, root=b.root()),
        )
        assert isinstance(first, CommittedResult), first
        assert isinstance(second, CommittedResult), second
        assert second.thread is not None
        assert second.thread.version.revision == 3


async def test_a_pipelined_commit_is_judged_on_the_runs_the_one_before_it_changed(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    """The first commit makes ``m1`` the input of a new finished run ``r2``; the
    second turns ``m1`` standalone again, which leaves ``r2`` without its input
    message (rule 3): the check must look at ``r2``, the run ``m1`` had when the
    second commit applied."""
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        v1 = await _created_with_m1(store)
        into_run = b.message("m1", run_id="r2", relation="input")
        finished = b.run("r2", "completed", inputs=["m1"])
        first, second = await _queued_behind(
            store,
            pg_conn,
            b.update_at(
                "s",
                "t",
                v1,
                {"messages": [b.replace(into_run)], "runs": [b.insert(finished)]},
                root=b.root(),
            ),
            b.update_at(
                "s", "t", _next(v1), {"messages": [b.replace(b.message("m1"))]}, root=b.root()
            ),
        )
        assert isinstance(first, CommittedResult), first
        assert isinstance(second, ThreadStoreInvariantError), second
        assert "rule 3" in str(second)
