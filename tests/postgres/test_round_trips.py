"""Round trips per commit, counted with asyncpg's public query logger.

Every statement the store sends goes through one pooled connection whose
``Connection.add_query_logger`` records it (asyncpg >= 0.29). These tests pin
the statements of the common commits (an append, a run started, a run
finished, a create, a conflicting append, and a commit whose relationship
facts must be queried) so a change to the commit path shows up here, and say
what each statement is for. The common commit is four round trips, as the
least a hand-written compare-and-set transaction makes (``bench/physical_floor.py``):
begin, one hold that returns the root with its relationship facts, the clock
and the named rows, one write of the root and every family, commit.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.client import SESSION_SETTINGS, keep_session

from pai_storage import CommittedResult, ConflictResult, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

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
    if "FOR UPDATE NOWAIT" in words:  # an optimistic commit: the root locked, then updated
        verb, detail = "UPDATE", " NOWAIT"
    elif "FOR UPDATE" in words:
        detail = " FOR UPDATE"
    elif verb == "SELECT" and "unnest(" in words:
        detail = " by id"
    elif "status = 'running'" in words:
        detail = " open"
    elif "ORDER BY position DESC LIMIT 1" in words:
        detail = " tail"
    also = [part for part, mark in _ALSO if mark in words]
    if family == "threads":  # the other tables the root's statement reads or writes
        also += [
            f"{name} by id" if verb_of == "FROM" else f"{_VERBS[verb_of]} {name}"
            for verb_of, name in _OTHER.findall(words)
        ]
    return " + ".join([f"{verb} {family}{detail}", *also])


_OTHER = re.compile(
    r'(INSERT INTO|UPDATE|FROM) (?:"\w+"\.)?"pai_threads_(messages|runs|queued)\w*"'
)
_VERBS = {"INSERT INTO": "INSERT", "UPDATE": "UPDATE"}


_ALSO = (
    ("clock", "clock_timestamp()"),
    ("notify", "pg_notify("),
    ("tail", "UNION ALL (SELECT true"),
)
"""What a statement on a table may do besides, and the text that shows it."""


class Statements:
    """The statements of the one pooled connection, in the order sent.

    ``other`` is a second store on the same pool: what it commits, the counted
    store did not.
    """

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.other: PostgresThreadStore | None = None

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
    statements.other = PostgresThreadStore(client=pool, schema=pg_schema)
    try:
        await store.initialize()
        await statements.other.initialize()
        # asyncpg introspects a composite or array type the first time a
        # statement uses it: warm every statement below up on another thread.
        await _turn(store, "warm-up", await _create(store, "warm-up"))
        await statements.take()
        yield store, statements
    finally:
        await statements.other.close()
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


_HOLD = (
    # The root and its counters, locked: orders the commits of one thread; the
    # version the commit names is checked against it. The same statement reads
    # the server's clock once it has the lock (commit times never go back
    # within a thread: test_commit_clock.py), the root's relationship facts,
    # and the stored rows of the ids the commit names (an insert of an id that
    # exists is refused, a replacement needs the old row).
    "SELECT threads FOR UPDATE + clock"
)


_OPTIMISTIC = (
    # The root locked without waiting, only when stored exactly as this store
    # committed it and the server's clock is within the window of the predicted
    # commit time (the clock it returns keeps the prediction close), then
    # updated; the rows inserted only if it was; the watchers' signal. One
    # statement, which commits itself.
    "UPDATE threads NOWAIT + clock + notify"
)


async def test_an_append_of_a_version_the_store_committed_is_one_statement(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    await statements.take()
    await _commit(store, "t", version, _APPEND)
    assert await statements.take() == [f"{_OPTIMISTIC} + INSERT messages"]


async def test_an_append_of_a_version_committed_elsewhere_is_four_statements(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    store, statements = counted
    assert statements.other is not None
    version = await _create(statements.other, "t")  # unknown to the counted store
    await statements.take()
    version = await _commit(store, "t", version, _APPEND)
    assert await statements.take() == [
        "BEGIN",
        f"{_HOLD} + messages by id",
        # The new root, counters and relationship facts (derived from the held
        # ones and the writes: no query), the insert, and the watchers' signal,
        # delivered only if the transaction commits: one statement.
        "UPDATE threads + notify + INSERT messages",
        "COMMIT",
    ]
    # It committed that version itself now: the next append is optimistic.
    await _commit(store, "t", version, {"messages": [b.insert(b.message("m2"))]})
    assert await statements.take() == [f"{_OPTIMISTIC} + INSERT messages"]


async def test_a_run_started_is_one_statement_and_finished_four(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    store, statements = counted
    version = await _create(store, "t")
    await statements.take()
    version = await _commit(store, "t", version, _START)
    started = await statements.take()
    await _commit(store, "t", version, _FINISH)
    finished = await statements.take()
    # The run's facts follow from the known ones: the rules are checked without a query.
    assert started == [f"{_OPTIMISTIC} + INSERT messages + INSERT runs"]
    # A replacement needs the stored run: held.
    assert finished == [
        "BEGIN",
        f"{_HOLD} + messages by id + runs by id",
        "UPDATE threads + notify + INSERT messages + UPDATE runs",
        "COMMIT",
    ]


async def test_an_optimistic_append_over_a_moved_root_falls_back_to_the_hold(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    """Another store committed the version this one knows: the guard matches
    nothing, nothing is written, and the usual commit finds the conflict."""
    store, statements = counted
    assert statements.other is not None
    version = await _create(store, "t")
    await _commit(statements.other, "t", version, _APPEND)
    await statements.take()
    result = await store.commit_thread(
        b.update_at("s", "t", version, {"messages": [b.insert(b.message("m2"))]}, root=b.root())
    )
    assert isinstance(result, ConflictResult)
    assert await statements.take() == [
        f"{_OPTIMISTIC} + INSERT messages",
        "BEGIN",
        f"{_HOLD} + messages by id",
        "ROLLBACK",
    ]


async def test_an_optimistic_append_to_a_held_root_falls_back_at_once(
    counted: tuple[PostgresThreadStore, Statements], pg_conn: asyncpg.Connection
) -> None:
    """Another transaction holds the root: the optimistic statement does not wait
    for it (``NOWAIT``), so the commit queues for the lock the usual way, in
    the order it came (a client that pipelines its commits relies on it)."""
    store, statements = counted
    version = await _create(store, "t")
    await statements.take()
    root = f"{store.tables.threads} WHERE scope_key = $1 AND thread_id = $2"
    async with pg_conn.transaction():
        await pg_conn.fetchval(f"SELECT revision FROM {root} FOR UPDATE", b"s", b"t")
        waiting = asyncio.create_task(_commit(store, "t", version, _APPEND))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        # Failed at once, and the usual commit began (its hold waits for the lock).
        assert await statements.take() == [f"{_OPTIMISTIC} + INSERT messages", "BEGIN"]
    await waiting
    assert await statements.take() == [
        f"{_HOLD} + messages by id",
        "UPDATE threads + notify + INSERT messages",
        "COMMIT",
    ]


async def test_an_optimistic_insert_of_an_existing_id_falls_back_to_the_hold(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    """The ids an optimistic commit inserts are taken as new; the unique key
    refuses one that is not (the whole statement with it), and the usual
    commit judges it."""
    store, statements = counted
    version = await _create(store, "t")
    version = await _commit(store, "t", version, _APPEND)
    await statements.take()
    with pytest.raises(ThreadStoreInvariantError):
        await _commit(store, "t", version, _APPEND)  # m1 again
    assert await statements.take() == [
        f"{_OPTIMISTIC} + INSERT messages",
        "BEGIN",
        f"{_HOLD} + messages by id",
        "ROLLBACK",
    ]


async def test_an_optimistic_commit_whose_rule_must_read_falls_back_to_the_hold(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    """A message of a finished run (the facts on the root know open runs only)
    sends nothing optimistic: the usual commit runs the rule's queries."""
    store, statements = counted
    version = await _create(store, "t")
    version = await _commit(store, "t", version, _START)
    version = await _commit(store, "t", version, _FINISH)
    await statements.take()
    late = b.message("late", "after the run", run_id="r1", relation="output")
    await _commit(store, "t", version, {"messages": [b.insert(late)]})
    # The optimistic judgement stopped at the rule's query, before sending anything.
    assert await statements.take() == [
        "BEGIN",
        f"{_HOLD} + messages by id",
        "INSERT messages",
        # The finished run's facts: its messages and queued items (what the rule needs).
        "SELECT runs by id",
        "SELECT messages by id",
        "SELECT queued by id",
        "UPDATE threads + notify",
        "COMMIT",
    ]


async def test_an_optimistic_commit_outside_the_clock_window_falls_back_to_the_hold(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    """A predicted commit time the server's clock is too far past writes
    nothing; the usual commit reads the clock."""
    store, statements = counted
    version = await _create(store, "t")
    await statements.take()
    slow = datetime.now(UTC) - timedelta(seconds=1)
    store._server_clock.reset(slow)  # the process's view of the server's clock, a second behind
    result = await store.commit_thread(b.update_at("s", "t", version, _APPEND, root=b.root()))
    assert isinstance(result, CommittedResult)
    assert await statements.take() == [
        f"{_OPTIMISTIC} + INSERT messages",
        "BEGIN",
        f"{_HOLD} + messages by id",
        "UPDATE threads + notify + INSERT messages",
        "COMMIT",
    ]
    assert result.thread is not None
    assert abs(result.thread.updated_at - datetime.now(UTC)) < timedelta(seconds=0.5)


async def test_a_create_is_five_statements(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    store, statements = counted
    result = await store.commit_thread(b.create("s", "new", changes=_APPEND))
    assert isinstance(result, CommittedResult)
    assert await statements.take() == [
        "BEGIN",
        # Whether the key is taken, and the server's clock: nothing to lock yet.
        "SELECT threads + clock",
        # The root, taking the key (ON CONFLICT DO NOTHING: a concurrent create
        # wins or loses here).
        "INSERT threads",
        "UPDATE threads + notify + INSERT messages",
        "COMMIT",
    ]


async def test_a_commit_whose_facts_do_not_follow_queries_them(
    counted: tuple[PostgresThreadStore, Statements],
    pg_schema: str,
) -> None:
    """The fallback: a commit that deletes a message (or a root stored without facts)."""
    store, statements = counted
    version = await _create(store, "t")
    version = await _commit(store, "t", version, _APPEND)
    await statements.take()
    await _commit(store, "t", version, {"messages": [b.delete_record("m1")]})
    assert await statements.take() == [
        "BEGIN",
        f"{_HOLD} + messages by id",
        "DELETE messages",
        # The open runs (one running or waiting run at most) and the last message,
        # after the writes: the rules' facts, and the next commit's.
        "SELECT runs open + tail",
        "UPDATE threads + notify",
        "COMMIT",
    ]


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
    assert await statements.take() == ["BEGIN", f"{_HOLD} + messages by id", "ROLLBACK"]


async def test_three_clock_misses_make_the_next_commits_held(
    counted: tuple[PostgresThreadStore, Statements],
) -> None:
    """A network too slow for the window (simulated: the process's view of the
    server's clock a second behind before each commit) costs a wasted statement
    per commit only until three commits missed: the next ones hold at once."""
    store, statements = counted
    version = await _create(store, "t")
    for n in range(3):
        store._server_clock.reset(datetime.now(UTC) - timedelta(seconds=1))
        version = await _commit(store, "t", version, {"messages": [b.insert(b.message(f"m{n}"))]})
    await statements.take()
    await _commit(store, "t", version, {"messages": [b.insert(b.message("m3"))]})
    assert await statements.take() == [
        "BEGIN",
        f"{_HOLD} + messages by id",
        "UPDATE threads + notify + INSERT messages",
        "COMMIT",
    ]
