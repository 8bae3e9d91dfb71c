"""The relationship facts a PostgreSQL root keeps for the next commit (``facts`` column).

A commit that appends messages or starts or finishes a run checks the
relationship rules against the facts the held root carries, with no query.
These tests check the facts are the thread's, that facts written for another
revision (a process that does not keep them updated the root) or none at all
(a root stored before schema version 4) make the commit query the children
instead, and that malformed facts are reported, never trusted.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore

from pai_storage import CommittedResult, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .helpers import URL

pytestmark = pytest.mark.asyncio


async def _commit(
    store: PostgresThreadStore, version: ThreadVersion | None, changes: dict[str, Any]
) -> ThreadVersion:
    request = (
        b.create("s", "t", changes=changes)
        if version is None
        else b.update_at("s", "t", version, changes, root=b.root())
    )
    result = await store.commit_thread(request)
    assert isinstance(result, CommittedResult), result
    assert result.thread is not None
    return result.thread.version


async def _facts(conn: asyncpg.Connection, schema: str) -> Any:
    text = await conn.fetchval(f'SELECT facts FROM "{schema}".pai_threads')
    return None if text is None else json.loads(text)


_START = {
    "messages": [b.insert(b.message("u1", "question", run_id="r1"))],
    "runs": [b.insert(b.run("r1", inputs=["u1"]))],
}
_SECOND_RUN = {
    "messages": [b.insert(b.message("u2", "again", run_id="r2"))],
    "runs": [b.insert(b.run("r2", inputs=["u2"]))],
}


async def test_the_root_keeps_the_facts_of_its_revision(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        version = await _commit(store, None, {"messages": [b.insert(b.message("m1"))]})
        version = await _commit(store, version, _START)
    stored = await _facts(pg_conn, pg_schema)
    assert stored["revision"] == version.revision
    assert stored["facts"]["tail"]["messageId"] == "u1"
    assert [o["runId"] for o in stored["facts"]["open"]] == ["r1"]


async def test_facts_of_another_revision_are_not_trusted(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    """Facts saying no run is open, written for an older revision, do not let a
    second run start beside the open one (rule 5: at most one open run)."""
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        version = await _commit(store, None, {})
        version = await _commit(store, version, _START)
        stale = {"revision": version.revision - 1, "facts": {"tail": None, "open": []}}
        await pg_conn.execute(f'UPDATE "{pg_schema}".pai_threads SET facts = $1', json.dumps(stale))
        with pytest.raises(ThreadStoreInvariantError, match="rule 5"):
            await _commit(store, version, _SECOND_RUN)
        # The same facts naming the held revision are trusted (the test's control).
        lying = {"revision": version.revision, "facts": {"tail": None, "open": []}}
        await pg_conn.execute(f'UPDATE "{pg_schema}".pai_threads SET facts = $1', json.dumps(lying))
        await _commit(store, version, _SECOND_RUN)


async def test_a_root_without_facts_is_checked_by_queries_and_gains_them(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        version = await _commit(store, None, {})
        version = await _commit(store, version, _START)
        # As a root stored before schema version 4 left it.
        await pg_conn.execute(f'UPDATE "{pg_schema}".pai_threads SET facts = NULL')
        with pytest.raises(ThreadStoreInvariantError, match="rule 5"):
            await _commit(store, version, _SECOND_RUN)
        answer = b.message("a1", "answer", role="assistant", run_id="r1", relation="output")
        version = await _commit(store, version, {"messages": [b.insert(answer)]})
    stored = await _facts(pg_conn, pg_schema)
    assert stored["revision"] == version.revision
    assert stored["facts"]["tail"]["messageId"] == "a1"
    assert [o["runId"] for o in stored["facts"]["open"]] == ["r1"]


@pytest.mark.parametrize(
    "facts",
    [
        "not json",
        json.dumps([1, 2]),
        json.dumps({"revision": 2}),
        json.dumps({"revision": 2, "facts": {"tail": None}}),
        json.dumps({"revision": 2, "facts": {"tail": None, "open": [{"runId": 1}]}}),
    ],
)
async def test_malformed_facts_are_reported(
    pg_schema: str, pg_conn: asyncpg.Connection, facts: str
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        version = await _commit(store, None, {})
        assert version.revision == 1
        version = await _commit(store, version, {})
        await pg_conn.execute(f'UPDATE "{pg_schema}".pai_threads SET facts = $1', facts)
        with pytest.raises(ThreadStoreInvariantError, match="invalid stored thread"):
            await _commit(store, version, {"messages": [b.insert(b.message("m1"))]})


async def test_facts_read_back_keep_only_the_rule_relevant_messages(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    """A commit that must query the children (a replacement) stores the open run's
    input, first other and last message, not every message of the run."""
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        version = await _commit(store, None, _START)
        for i in range(20):
            answer = b.message(f"a{i}", "part", role="assistant", run_id="r1", relation="output")
            version = await _commit(store, version, {"messages": [b.insert(answer)]})
        edited = b.message("a19", "edited", role="assistant", run_id="r1", relation="output")
        await _commit(store, version, {"messages": [b.replace(edited)]})
    stored = await _facts(pg_conn, pg_schema)
    (run,) = stored["facts"]["open"]
    assert [m["messageId"] for m in run["messages"]] == ["u1", "a0", "a19"]
