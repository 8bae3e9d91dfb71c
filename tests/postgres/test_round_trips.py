"""Round trips per commit, counted with asyncpg's public query logger.

Every statement the store sends goes through one pooled connection whose
``Connection.add_query_logger`` records it (asyncpg >= 0.29). These tests pin
today's statements of the common commits (an append, a run started, a run
finished, a conflicting append) so a change to the commit path shows up here,
and say what each statement is for. Issue 35 aims at four round trips for a
common commit (begin, one hold that returns the root with its relationship
facts and the clock, one write of the root and every family, commit): the
lists below are expected to shrink, never to grow silently.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.client import SESSION_SETTINGS, keep_session

from pai_storage import CommittedResult, ConflictResult, ThreadVersion
from pai_storage import builders as b

from .helpers import dsn

pytestmark = pytest.mark.asyncio

_TABLE = re.compile(r'"pai_threads(?:_(messages|runs|queued)\w*)?"')


def label(sql: str) -> str:
    """A statement as ``VERB family[ detail]``: ``SELECT threads FOR UPDATE``,
    ``SELECT messages by id`` (a probe per key of an ``unnest`` array), ..."""
    words = " ".join(sql.split())
    verb = words.lstrip("(").split(" ", 1)[0].upper()
    if verb == "WITH":  # a CTE: named for its first statement, then what else it does
        verb = words.split("(", 1)[1].split(" ", 1)[0].upper()
    found = _TABLE.search(words)
    if found is None:
        if "pg_notify(" in words:
            return "notify"
        return "clock" if "clock_timestamp()" in words else verb
    family = found.group(1) or "threads"
    detail = ""
    if "FOR UPDATE" in words:
        detail = " FOR UPDATE"
    elif verb == "SELECT" and "unnest(" in words:
        detail = " by id"
    elif "status = 'running'" in words:
        detail = " open"
    elif "ORDER BY position DESC LIMIT 1" in words:
        detail = " tail"
    also = [part for part, mark in _ALSO if mark in words]
    return " + ".join([f"{verb} {family}{detail}", *also])


_ALSO = (
    ("clock", "clock_timestamp()"),
    ("notify", "pg_notify("),
    ("tail", "UNION ALL (SELECT true"),
)
"""What a statement on a table may do besides, and the text that shows it."""


class Statements:
    """The statements of the one pooled connection, in the order sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def log(self, record: Any) -> None:
        self.sent.append(record.query)

    async def take(self) -> list[str]:
        # asyncpg hands a record to a synchronous logger with loop.call_soon.
        await asyncio.sleep(0)
        sent, self.sent = self.sent, []
        return [label(sql) for sql in sent]


@pytest_asyncio.fixture
async def counted(pg_schema: str) -> AsyncIterator[tuple[PostgresThreadStore, Statements]]:
    statements = Statements()

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(statements.log)

    # One connection, set up as the store's own pool would be (its session
    # settings, and no reset statements between operations).
    pool = await asyncpg.create_pool(
        dsn(),
        min_size=1,
        max_size=1,
        init=init,
        server_settings=dict(SESSION_SETTINGS),
        reset=keep_session,
    )
    store = PostgresThreadStore(client=pool, schema=pg_schema)
    try:
        await store.initialize()
        # asyncpg introspects a composite or array type the first time a
        # statement uses it: warm every statement below up on another thread.
        await _turn(store, "warm-up", await _create(store, "warm-up"))
        await statements.take()
        yield store, statements
    finally:
        await store.close()
        await pool.close()


async def _create(store: PostgresThreadStore, thread_id: str) -> ThreadVersion:
    result = await store.commit_thread(b.create("s", thread_id))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread.version


async def _commit(
    store: PostgresThreadStore, thread_id: str, version: ThreadVersion, changes: dict[str, Any]
) -> ThreadVersion:
    result = await store.commit_thread(b.update_at("s", thread_id, version, changes, root=b.root()))
    assert isinstance(result, CommittedResult), result
    assert result.thread is not None
    return result.thread.version


_APPEND = {"messages": [b.insert(b.message("m1", "hello"))]}
_START = {
    "messages": [b.insert(b.message("u1", "question", run_id="r1"))],
    "runs": [b.insert(b.run("r1", inputs=["u1"]))],
}
_FINISH = {
    "messages": [
        b.insert(b.message("a1", "answer", role="assistant", run_id="r1", relation="output"))
    ],
    "runs": [b.replace(b.run("r1", "completed", inputs=["u1"]))],
}


async def _turn(store: PostgresThreadStore, thread_id: str, version: ThreadVersion) -> None:
    version = await _commit(store, thread_id, version, _APPEND)
    version = await _commit(store, thread_id, version, _START)
    await _commit(store, thread_id, version, _FINISH)


async def test_an_append_is_seven_statements(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    await statements.take()
    await _commit(store, "t", version, _APPEND)
    assert await statements.take() == [
        "BEGIN",
        # The root and its counters, locked: orders the commits of one thread;
        # the version the commit names is checked against it. The same
        # statement reads the server's clock once it has the lock, so that
        # commit times never go back within a thread (the contract stamps with
        # the server's time; test_commit_clock.py).
        "SELECT threads FOR UPDATE + clock",
        # The stored rows of the ids the commit names: an insert of an id that
        # exists is refused, a replace or delete needs the old row.
        "SELECT messages by id",
        # The new root and counters; the same statement tells the watchers of
        # the thread (watch, LISTEN), delivered only if the transaction commits.
        "UPDATE threads + notify",
        "INSERT messages",
        # The relationship facts after the writes, for the rules the core judges,
        # in one statement: the open (running or waiting) runs, at most two of
        # them, and the last message (a run's messages stay one interval, rule 2).
        "SELECT runs open + tail",
        "COMMIT",
    ]


async def test_a_run_started_and_finished_are_twelve_statements_each(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    await statements.take()
    version = await _commit(store, "t", version, _START)
    started = await statements.take()
    await _commit(store, "t", version, _FINISH)
    finished = await statements.take()
    common = [
        "BEGIN",
        # The root, locked, and the server's clock after the lock (as for an append).
        "SELECT threads FOR UPDATE + clock",
        "SELECT messages by id",  # the named messages' stored rows
        "SELECT runs by id",  # the named runs' stored rows
        "UPDATE threads + notify",  # the root, and the watchers' signal
        "INSERT messages",
    ]
    facts = [
        # The open runs (one running or waiting run at most) and the last message.
        "SELECT runs open + tail",
        # The facts of every run the commit touched: its record (status,
        # admission, inputs), the positions of its messages (inputs present,
        # one interval) and its queued items (admission).
        "SELECT runs by id",
        "SELECT messages by id",
        "SELECT queued by id",
        "COMMIT",
    ]
    assert started == [*common, "INSERT runs", *facts]
    assert finished == [*common, "UPDATE runs", *facts]


async def test_a_conflicting_append_is_three_statements(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    store, statements = counted
    stale = await _create(store, "t")
    await _commit(store, "t", stale, _APPEND)
    await statements.take()
    result = await store.commit_thread(
        b.update_at("s", "t", stale, {"messages": [b.insert(b.message("m2"))]}, root=b.root())
    )
    assert isinstance(result, ConflictResult)
    # The held root's version is not the one named: nothing else is read or written.
    assert await statements.take() == ["BEGIN", "SELECT threads FOR UPDATE + clock", "ROLLBACK"]
