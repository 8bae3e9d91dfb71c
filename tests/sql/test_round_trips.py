"""Statements per commit and per read on SQLite, seen by ``sqlite3``'s public trace callback.

A write runs whole in one call into the writer connection's thread (see
``SqlClient.run_write``), so on SQLite a statement is not a network round trip
but it is still work in the database and in Python: these tests pin today's
statements of the common commits (an append, a run started, a run finished, a
conflicting append, a commit of a root stored without its relationship
facts, and every way an optimistic commit falls back), with what each is
for, so that a change to the commit path shows up here: the hold that
returns the root with its relationship facts, the named rows, the writes,
the root with the facts after the commit, and the commit. A commit of a
version this store committed, that only inserts messages and runs with no
lease involved, is optimistic: no hold and no named rows, the root updated
only when stored exactly as known. The lists are expected to shrink, never
to grow silently.
The callback sits on the ``sqlite3`` connection under the client's one held
writer connection (reached through SQLAlchemy's ``get_raw_connection`` and
aiosqlite's ``Cursor.connection``), so it sees every statement the engine's
listeners see and the transaction control (``COMMIT``, ``ROLLBACK``) they do
not.

A read of the root and one page is pinned the same way, on the one reader
connection of a store with ``pool_size=1``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_sql import SqlThreadStore
from sqlalchemy import update

from pai_storage import CommittedResult, ConflictResult, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .conftest import Target

pytestmark = pytest.mark.asyncio

_TABLE = re.compile(r"\bpai_threads(?:_(messages|runs|queued)\w*)?\b")


def label(sql: str) -> str:
    """A statement as ``VERB family[ detail]``: ``SELECT messages by id``, ..."""
    words = " ".join(sql.split())
    verb = words.split(" ", 1)[0].upper()
    found = _TABLE.search(words)
    if found is None:
        return words.upper()
    family = found.group(1) or "threads"
    detail = ""
    if verb == "SELECT":
        if "status IN" in words:
            detail = " open"
        elif "ORDER BY" in words and "DESC" in words:
            detail = " tail"
        elif re.search(r"\b(id_h|run_h) IN\b", words):
            detail = " by id"
    return f"{verb} {family}{detail}"


class Statements:
    """Every statement the writer's ``sqlite3`` connection runs, in order."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def log(self, sql: str) -> None:
        self.sent.append(sql)

    def take(self) -> list[str]:
        sent, self.sent = self.sent, []
        return [label(sql) for sql in sent]


@pytest_asyncio.fixture
async def counted(sqlite_target: Target) -> AsyncIterator[tuple[SqlThreadStore, Statements]]:
    statements = Statements()
    async with sqlite_target.store() as store:
        await _create(store, "warm-up")  # the writer connection is held from here on
        held = (await store.client.ready()).held_writer
        await _trace(held, statements)
        yield store, statements


@pytest_asyncio.fixture
async def other(counted: tuple[SqlThreadStore, Statements]) -> AsyncIterator[SqlThreadStore]:
    """A second store on the counted store's client: what it commits, the counted
    store did not (its statements are traced too)."""
    async with SqlThreadStore(client=counted[0].client) as store:
        yield store


async def _trace(held: Any, statements: Statements) -> None:
    """Trace every statement of ``held``, a pool holding its one connection."""
    assert held is not None
    assert len(held.idle) == 1
    raw = (await held.idle[0].get_raw_connection()).driver_connection
    assert raw is not None
    async with raw.cursor() as cursor:
        cursor.connection.set_trace_callback(statements.log)


async def _create(store: SqlThreadStore, thread_id: str) -> ThreadVersion:
    result = await store.commit_thread(b.create("s", thread_id))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread.version


async def _commit(
    store: SqlThreadStore, thread_id: str, version: ThreadVersion, changes: dict[str, Any]
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


async def test_an_append_of_a_version_the_store_committed_is_four_statements(
    counted: tuple[SqlThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    statements.take()
    await _commit(store, "t", version, _APPEND)
    assert statements.take() == [
        # Takes SQLite's write lock first: orders the commits (of every thread:
        # SQLite has one writer); the clock is read after it.
        "BEGIN IMMEDIATE",
        # The root with the facts after this commit (derived from the known
        # ones: no query), only where it is stored exactly as this store
        # committed it; nothing is written before it.
        "UPDATE threads",
        # The ids are taken to be new: the unique keys refuse one that is not.
        "INSERT messages",
        "COMMIT",
    ]


async def test_an_append_of_a_version_committed_elsewhere_is_six_statements(
    counted: tuple[SqlThreadStore, Statements], other: SqlThreadStore
) -> None:
    store, statements = counted
    version = await _create(other, "t")  # unknown to the counted store
    statements.take()
    version = await _commit(store, "t", version, _APPEND)
    assert statements.take() == [
        "BEGIN IMMEDIATE",
        # The root, its counters and its relationship facts; the version the
        # commit names is checked against it. (The clock is the process's:
        # SQLite has no server.)
        "SELECT threads",
        # The stored rows of the ids the commit names: an insert of an id that
        # exists is refused, a replace or delete needs the old row.
        "SELECT messages by id",
        "INSERT messages",
        # The root, written once after the relationship check, with the facts
        # after this commit: the rules were judged from the stored facts and
        # the writes, with no query (pai_storage.root_facts).
        "UPDATE threads",
        "COMMIT",
    ]
    # It committed that version itself now: the next append is optimistic.
    await _commit(store, "t", version, {"messages": [b.insert(b.message("m2"))]})
    assert "SELECT threads" not in statements.take()


async def test_a_run_started_is_five_statements_and_finished_eight(
    counted: tuple[SqlThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    statements.take()
    version = await _commit(store, "t", version, _START)
    started = statements.take()
    await _commit(store, "t", version, _FINISH)
    finished = statements.take()
    # The run's facts (its record, its messages' positions, its queued items)
    # come from the root's facts and the writes: nothing is queried.
    assert started == [
        "BEGIN IMMEDIATE",
        "UPDATE threads",
        "INSERT messages",
        "INSERT runs",
        "COMMIT",
    ]
    # A replacement needs the stored run: held.
    assert finished == [
        "BEGIN IMMEDIATE",
        "SELECT threads",  # the root and its facts (under the write lock)
        "SELECT messages by id",  # the named messages' stored rows
        "SELECT runs by id",  # the named runs' stored rows
        "INSERT messages",
        "UPDATE runs",
        "UPDATE threads",
        "COMMIT",
    ]


async def test_an_optimistic_append_over_a_moved_root_falls_back_to_the_hold(
    counted: tuple[SqlThreadStore, Statements], other: SqlThreadStore
) -> None:
    """Another store committed the version this one knows: the root's update
    matches nothing, so nothing is written, and the held judgement finds the
    conflict in the same transaction."""
    store, statements = counted
    version = await _create(store, "t")
    await _commit(other, "t", version, {})  # the root alone: the positions stay free
    statements.take()
    result = await store.commit_thread(
        b.update_at("s", "t", version, {"messages": [b.insert(b.message("m2"))]}, root=b.root())
    )
    assert isinstance(result, ConflictResult)
    assert statements.take() == [
        "BEGIN IMMEDIATE",
        "UPDATE threads",  # matches nothing: nothing written
        "SELECT threads",  # judged again, held, still holding the lock
        "ROLLBACK",
    ]


async def test_an_optimistic_insert_of_an_existing_id_falls_back_to_the_hold(
    counted: tuple[SqlThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    version = await _commit(store, "t", version, _APPEND)
    statements.take()
    with pytest.raises(ThreadStoreInvariantError):
        await _commit(store, "t", version, _APPEND)  # m1 again
    assert statements.take() == [
        "BEGIN IMMEDIATE",
        "UPDATE threads",
        "INSERT messages",  # refused by the unique key: the root's update undone
        "ROLLBACK",
        "BEGIN IMMEDIATE",
        "SELECT threads",
        "SELECT messages by id",
        "ROLLBACK",
    ]


async def test_an_optimistic_commit_whose_rule_must_read_falls_back_to_the_hold(
    counted: tuple[SqlThreadStore, Statements],
) -> None:
    """A message of a finished run (the facts on the root know open runs only)."""
    store, statements = counted
    version = await _create(store, "t")
    version = await _commit(store, "t", version, _START)
    version = await _commit(store, "t", version, _FINISH)
    statements.take()
    late = b.message("late", "after the run", run_id="r1", relation="output")
    await _commit(store, "t", version, {"messages": [b.insert(late)]})
    sent = statements.take()
    # The optimistic judgement stopped at the rule's query, before writing anything.
    assert sent[:3] == ["BEGIN IMMEDIATE", "SELECT threads", "SELECT messages by id"]
    assert "SELECT runs by id" in sent[3:]
    assert sent[-1] == "COMMIT"


async def test_a_commit_without_stored_facts_queries_them_once(
    counted: tuple[SqlThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    t = store.tables.threads
    engines = await store.client.ready()
    async with engines.writer.begin() as conn:  # a root written without its facts
        await conn.execute(update(t).values(facts=None))
    statements.take()
    version = await _commit(store, "t", version, _START)
    assert statements.take() == [
        # The store knows the root it committed, but not as stored now: its
        # optimistic update matches nothing, and nothing was written.
        "BEGIN IMMEDIATE",
        "UPDATE threads",
        "SELECT threads",
        "SELECT messages by id",
        "SELECT runs by id",
        "INSERT messages",
        "INSERT runs",
        # Unknown facts: the rules' bounded queries after the writes, the open
        # runs, the last message and the facts of the runs the commit touched
        # (its record, its messages' positions, its queued items) ...
        "SELECT runs open",
        "SELECT messages tail",
        "SELECT runs by id",
        "SELECT messages by id",
        "SELECT queued by id",
        # ... which are the facts the root is written with (read once).
        "UPDATE threads",
        "COMMIT",
    ]
    await _commit(store, "t", version, _FINISH)
    assert "SELECT runs open" not in statements.take()


async def test_a_conflicting_append_is_three_statements(
    counted: tuple[SqlThreadStore, Statements],
) -> None:
    store, statements = counted
    stale = await _create(store, "t")
    await _commit(store, "t", stale, _APPEND)
    statements.take()
    result = await store.commit_thread(
        b.update_at("s", "t", stale, {"messages": [b.insert(b.message("m2"))]}, root=b.root())
    )
    assert isinstance(result, ConflictResult)
    # The root's version is not the one named: nothing else is read or written.
    assert statements.take() == ["BEGIN IMMEDIATE", "SELECT threads", "ROLLBACK"]


@pytest_asyncio.fixture
async def reads_counted(sqlite_target: Target) -> AsyncIterator[tuple[SqlThreadStore, Statements]]:
    """A store with one reader connection whose statements are traced."""
    statements = Statements()
    async with sqlite_target.store(pool_size=1) as store:
        await _create(store, "warm-up")
        await store.read_thread(b.read("s", "warm-up"))  # the reader is held from here on
        held = (await store.client.ready()).held_reader
        await _trace(held, statements)
        yield store, statements


async def test_a_newest_page_read_is_one_statement(
    reads_counted: tuple[SqlThreadStore, Statements],
) -> None:
    store, statements = reads_counted
    version = await _create(store, "t")
    for n in range(3):
        version = await _commit(
            store, "t", version, {"messages": [b.insert(b.message(f"m{n}", "hello"))]}
        )
    statements.sent.clear()
    newest = {"type": "page", "view": "transcript", "order": "newest", "page": {"limit": 2}}
    result = await store.read_thread(b.read("s", "t", messages=newest))
    assert result.messages is not None
    assert [m.message_id for m in result.messages.items] == ["m2", "m1"]
    assert result.messages.next_page_token is not None
    # The root, its counters and the page's rows below the messages counter in
    # one UNION ALL: its own snapshot, so no BEGIN or ROLLBACK, on the event
    # loop (the held reader's busy_timeout is 0: it never waits for a lock).
    assert len(statements.sent) == 1
    assert " UNION ALL " in " ".join(statements.sent[0].split())
