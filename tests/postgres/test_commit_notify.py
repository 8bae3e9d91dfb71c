"""A commit tells the thread's watchers with a ``NOTIFY`` inside its transaction.

The notification rides on the root's update (``statements.update_root_notify_statement``),
before the relationship check: PostgreSQL delivers it only if the transaction
commits, so a commit the check rolls back is never heard, and one that commits
is heard once.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.watch import watch_channel

from pai_storage import CommittedResult
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .helpers import URL

pytestmark = pytest.mark.asyncio

HEARD_WITHIN = 5.0
"""Seconds a notification has to arrive."""


async def test_only_a_commit_that_commits_is_heard(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    heard: asyncio.Queue[str] = asyncio.Queue()

    def listen(_conn: object, _pid: int, _channel: str, message: str) -> None:
        heard.put_nowait(message)

    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        await pg_conn.add_listener(watch_channel(store.tables), listen)
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        await asyncio.wait_for(heard.get(), HEARD_WITHIN)  # the create's
        version = created.thread.version
        # Rule 1 (a message names a missing run) is judged after the root's update.
        orphan = {"messages": [b.insert(b.message("m1", "hi", run_id="missing"))]}
        with pytest.raises(ThreadStoreInvariantError, match="missing run"):
            await store.commit_thread(b.update_at("s", "t", version, orphan, root=b.root()))
        appended = await store.commit_thread(
            b.update_at("s", "t", version, {"messages": [b.insert(b.message("m1"))]}, root=b.root())
        )
        assert isinstance(appended, CommittedResult)
        assert appended.thread is not None
        # Notifications arrive in commit order: the next one heard is the append's.
        note = json.loads(await asyncio.wait_for(heard.get(), HEARD_WITHIN))
        assert note["v"] == appended.thread.version.to_json()
        await asyncio.sleep(0.2)  # anything sent twice would have arrived by now
        assert heard.empty()
