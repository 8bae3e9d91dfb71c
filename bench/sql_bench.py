"""Benchmark of the SQL backend on SQLite against raw aiosqlite running the same statements.

One command, prints a table::

    .venv/bin/python bench/sql_bench.py [--quick] [--dir /tmp]

Measured (median latency), each next to the *floor*: the very statements the
store sent for the same operation, recorded once and replayed through a bare
aiosqlite connection with the same pragmas (WAL, ``busy_timeout``), one
trip to the driver's thread per statement (``execute_fetchall``), with
their parameters precomputed and ``json.loads`` of every document read instead
of model validation; i.e. what the store costs beyond SQLite and the driver
thread (input validation, strict parsing, stamping, planning, relationship
rules, tokens, the connection pool, and SQLAlchemy where it is still used):

- a turn (one commit: a user message, an assistant message, the completed
  run) on a thread holding 10, 1,000 and 10,000 messages;
- reading the newest 20 transcript messages of those threads;
- listing the first page of 20 threads of a scope holding 2,000 threads.

With ``--peers``, the same turn and read-20 on LangGraph's ``AsyncSqliteSaver``
(a trivial graph over ``MessagesState``) and the OpenAI Agents SDK's
``SQLiteSession``, each on its own SQLite file, ratios against pai-storage in
the same run. They are not dependencies of pai-storage; install
``langgraph-checkpoint-sqlite`` and ``openai-agents`` beside it to run them.

Ratios printed in the same run: each operation against its floor, and the
size-growth ratio of a turn (10,000 messages against 10). Each database is a
fresh file under ``--dir``, removed at the end. The store's statements are
recorded on a copy of the database, never during a timed run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiosqlite
from pai_storage_sql import SqlThreadStore
from pai_storage_sql.client import InlineDriver

from pai_storage import CommittedResult, ThreadVersion
from pai_storage import builders as b

SCOPE = "bench"
LIST_SCOPE = "bench-list"
SIZES = (10, 1_000, 10_000)
THREADS_IN_SCOPE = 2_000

Statement = tuple[str, Any, bool]
"""SQL text, parameters, and whether it ran as ``executemany``; ``("COMMIT", None,
False)`` and ``("ROLLBACK", None, False)`` mark the end of a transaction."""


def turn(n: int) -> dict[str, list[dict[str, Any]]]:
    """One completed turn: user input, assistant output, the run."""
    run_id = f"r{n}"
    user = b.message(f"u{n}", f"question {n} " * 8, run_id=run_id, relation="input")
    answer = b.message(
        f"a{n}",
        f"answer {n} " * 40,
        role="assistant",
        run_id=run_id,
        relation="output",
        metadata={"model": "gpt", "tokens": {"in": 120, "out": 480}, "latencyMs": 1234.5},
    )
    answer["producer"] = {"kind": "agent", "id": "assistant"}
    return {
        "messages": [b.insert(user), b.insert(answer)],
        "runs": [b.insert(b.run(run_id, "completed", inputs=[f"u{n}"]))],
    }


async def build_thread(store: SqlThreadStore, thread_id: str, messages: int) -> ThreadVersion:
    result = await store.commit_thread(b.create(SCOPE, thread_id))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    version = result.thread.version
    turns, batch = messages // 2, 100
    for start in range(0, turns, batch):
        changes: dict[str, list[dict[str, Any]]] = {"messages": [], "runs": []}
        for n in range(start, min(turns, start + batch)):
            one = turn(n)
            changes["messages"] += one["messages"]
            changes["runs"] += one["runs"]
        result = await store.commit_thread(
            b.update_at(SCOPE, thread_id, version, changes, root=b.root())
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        version = result.thread.version
    return version


def read_20(thread_id: str) -> dict[str, Any]:
    return b.read(
        SCOPE,
        thread_id,
        messages={"type": "page", "view": "transcript", "order": "newest", "page": {"limit": 20}},
    )


LIST_20 = {"scopeKey": LIST_SCOPE, "limit": 20}


async def timed(n: int, *sides: Callable[[], Awaitable[Any]], warmup: int = 10) -> list[float]:
    """Median milliseconds of ``n`` calls of each side (the store, its floors) after
    ``warmup`` untimed ones, the sides alternating call by call so that drift on
    the machine hits all of them."""
    for _ in range(warmup):
        for fn in sides:
            await fn()
    samples: list[list[float]] = [[] for _ in sides]
    for _ in range(n):
        for side, fn in enumerate(sides):
            t0 = time.perf_counter()
            await fn()
            samples[side].append(time.perf_counter() - t0)
    return [statistics.median(s) * 1000 for s in samples]


# ---------------------------------------------------------------- recording


class Recorder:
    """Records every statement a store sends to aiosqlite, and each commit or rollback.

    It listens at the driver (``aiosqlite.Connection._execute``, through which
    every call to the database thread goes), so it sees the statements the
    store runs through SQLAlchemy and those it runs on the driver connection
    alike, and the transaction control of both; and at :class:`InlineDriver`,
    through which a commit run whole in the database thread runs each of its
    statements.
    """

    _INLINE = ("execute_fetchall", "execute", "executemany", "commit", "rollback")

    def __init__(self) -> None:
        self.log: list[Statement] = []
        self.on = False
        self._originals: dict[str, Any] = {}

    def attach(self) -> None:
        self._originals = {"_execute": aiosqlite.Connection._execute} | {
            name: getattr(InlineDriver, name) for name in self._INLINE
        }
        call: Callable[..., Awaitable[Any]] = self._originals["_execute"]
        recorder = self

        async def execute(conn: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.on:
                recorder._note(getattr(fn, "__name__", ""), args)
            return await call(conn, fn, *args, **kwargs)

        aiosqlite.Connection._execute = execute  # type: ignore[method-assign,assignment]
        for name in self._INLINE:
            setattr(InlineDriver, name, self._inline(name, self._originals[name]))

    def _inline(self, name: str, original: Any) -> Any:
        recorder = self

        async def run(driver: Any, *args: Any) -> Any:
            if recorder.on:
                recorder._note(name, args)
            return await original(driver, *args)

        return run

    def detach(self) -> None:
        for name, original in self._originals.items():
            setattr(InlineDriver if name != "_execute" else aiosqlite.Connection, name, original)
        self._originals = {}

    def _note(self, name: str, args: tuple[Any, ...]) -> None:
        if name in ("execute", "_execute_fetchall", "execute_fetchall"):
            self.log.append((args[0], args[1] if len(args) > 1 else (), False))
        elif name == "executemany":
            self.log.append((args[0], list(args[1]), True))
        elif name == "commit":
            self.log.append(("COMMIT", None, False))
        elif name == "rollback":
            self.log.append(("ROLLBACK", None, False))

    async def record(self, fn: Callable[[], Awaitable[Any]]) -> list[Statement]:
        self.log, self.on = [], True
        try:
            await fn()
        finally:
            self.on = False
        return self.log


# ---------------------------------------------------------------- the floor


class Floor:
    """Replays recorded statements on bare aiosqlite connections (a writer and a reader)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer: aiosqlite.Connection | None = None
        self.reader: aiosqlite.Connection | None = None

    async def open(self) -> None:
        self.writer = await self._connect()
        self.reader = await self._connect()

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None, timeout=5)
        for pragma in ("journal_mode=WAL", "busy_timeout=5000", "foreign_keys=ON"):
            await conn.execute(f"PRAGMA {pragma}")
        return conn

    async def close(self) -> None:
        for conn in (self.writer, self.reader):
            if conn is not None:
                await conn.close()

    async def replay(self, statements: list[Statement], write: bool) -> None:
        conn = self.writer if write else self.reader
        assert conn is not None
        for sql, params, many in statements:
            if sql == "COMMIT":
                await conn.commit()
            elif sql == "ROLLBACK":
                await conn.rollback()
            elif many:
                await conn.executemany(sql, params)
            else:
                # One trip to the driver's thread per statement (execute and fetch).
                rows = await conn.execute_fetchall(sql, params)
                _decode(rows)

    async def replay_in_one_trip(self, statements: list[Statement]) -> None:
        """The statements of one write, all in one trip to the driver's thread.

        What a commit of the store costs at the least: its statements with no
        trip between threads per statement (through aiosqlite's own queue, as
        the store's commits run; see ``SqlClient.run_write``).
        """
        assert self.writer is not None
        await self.writer._execute(_run_all, self.writer._conn, statements)


def _run_all(conn: sqlite3.Connection, statements: list[Statement]) -> None:
    for sql, params, many in statements:
        if sql == "COMMIT":
            conn.commit()
        elif sql == "ROLLBACK":
            conn.rollback()
        elif many:
            conn.executemany(sql, params)
        else:
            _decode(conn.execute(sql, params).fetchall())


def _decode(rows: Any) -> None:
    # Like a store, decode what it read (json.loads, not model validation).
    for row in rows:
        for value in row:
            if isinstance(value, str) and value.startswith("{"):
                json.loads(value)


# ---------------------------------------------------------------- peers


def _texts(n: int) -> tuple[str, str]:
    return f"question {n} " * 8, f"answer {n} " * 40


class LangGraphSqlite:
    """LangGraph's ``AsyncSqliteSaver`` under a trivial graph over ``MessagesState``.

    A turn is one ``graph.ainvoke`` with the user message (the node returns the
    assistant message); reading the newest 20 is ``aget_tuple`` and a slice.
    """

    name = "LangGraph AsyncSqliteSaver"

    def __init__(self, path: str) -> None:
        self.path = path
        self.replies: dict[str, Any] = {}

    async def __aenter__(self) -> LangGraphSqlite:
        from langchain_core.runnables import RunnableConfig  # type: ignore[import-not-found]
        from langgraph.checkpoint.sqlite.aio import (  # type: ignore[import-not-found]
            AsyncSqliteSaver,
        )
        from langgraph.graph import (  # type: ignore[import-not-found]
            END,
            START,
            MessagesState,
            StateGraph,
        )

        self._cm = AsyncSqliteSaver.from_conn_string(self.path)
        self.saver = await self._cm.__aenter__()

        def respond(state: Any, config: Any) -> dict[str, Any]:
            return {"messages": [self.replies[config["configurable"]["thread_id"]]]}

        # LangGraph passes the config to a node whose parameter is annotated so.
        respond.__annotations__["config"] = RunnableConfig

        builder: Any = StateGraph(MessagesState)
        builder.add_node("respond", respond)
        builder.add_edge(START, "respond")
        builder.add_edge("respond", END)
        self.graph = builder.compile(checkpointer=self.saver)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._cm.__aexit__(None, None, None)

    async def seed(self, conv: str, messages: int) -> None:
        from langchain_core.messages import (  # type: ignore[import-not-found]
            AIMessage,
            HumanMessage,
        )

        history: list[Any] = []
        for n in range(messages // 2):
            question, answer = _texts(n)
            history += [HumanMessage(question, id=f"u{n}"), AIMessage(answer, id=f"a{n}")]
        self.replies[conv] = history[-1]
        await self.graph.ainvoke({"messages": history[:-1]}, {"configurable": {"thread_id": conv}})

    async def turn(self, conv: str, n: int) -> None:
        from langchain_core.messages import AIMessage, HumanMessage

        question, answer = _texts(n)
        self.replies[conv] = AIMessage(answer, id=f"a{n}")
        await self.graph.ainvoke(
            {"messages": [HumanMessage(question, id=f"u{n}")]},
            {"configurable": {"thread_id": conv}},
        )

    async def read_20(self, conv: str) -> None:
        found = await self.saver.aget_tuple({"configurable": {"thread_id": conv}})
        assert len(found.checkpoint["channel_values"]["messages"][-20:]) == 20


class OpenAISqliteSession:
    """The OpenAI Agents SDK's ``SQLiteSession``: a turn is ``add_items`` of the
    user and the assistant item; reading is ``get_items(limit=20)``."""

    name = "OpenAI Agents SQLiteSession"

    def __init__(self, path: str) -> None:
        self.path = path
        self.sessions: dict[str, Any] = {}

    async def __aenter__(self) -> OpenAISqliteSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in self.sessions.values():
            session.close()

    def _items(self, n: int) -> list[dict[str, Any]]:
        question, answer = _texts(n)
        return [
            {"role": "user", "content": question},
            {
                "type": "message",
                "id": f"msg_a{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            },
        ]

    async def seed(self, conv: str, messages: int) -> None:
        from agents import SQLiteSession  # type: ignore[import-not-found]

        session = self.sessions[conv] = SQLiteSession(conv, self.path)
        items = [item for n in range(messages // 2) for item in self._items(n)]
        for start in range(0, len(items), 1000):
            await session.add_items(items[start : start + 1000])

    async def turn(self, conv: str, n: int) -> None:
        await self.sessions[conv].add_items(self._items(n))

    async def read_20(self, conv: str) -> None:
        assert len(await self.sessions[conv].get_items(limit=20)) == 20


async def time_peer(peer: Any, sizes: tuple[int, ...], turns: int, reads: int) -> dict[str, float]:
    """A peer's median turn and read-20 at each size (its own fresh conversation per size)."""
    out: dict[str, float] = {}
    for size in sizes:
        conv = f"c{size}"
        await peer.seed(conv, size)
        counter = iter(range(size, size + turns + 10))

        async def one_turn(conv: str = conv, counter: Iterator[int] = counter) -> None:
            await peer.turn(conv, next(counter))

        async def one_read(conv: str = conv) -> None:
            await peer.read_20(conv)

        (out[f"turn @ {size:,} messages"],) = await timed(turns, one_turn)
        (out[f"read newest 20 @ {size:,} messages"],) = await timed(reads, one_read)
    return out


async def run_peers(work: Path, sizes: tuple[int, ...], turns: int, reads: int) -> list[Any]:
    """Each installed peer's timings, or why it was not run."""
    results: list[Any] = []
    for make in (LangGraphSqlite, OpenAISqliteSession):
        path = str(work / f"{make.__name__}.db")
        try:
            async with make(path) as peer:
                results.append((make.name, await time_peer(peer, sizes, turns, reads)))
        except ImportError as exc:
            results.append((make.name, f"not installed ({exc.name})"))
    return results


# ---------------------------------------------------------------- the run


async def record_turns(
    store: SqlThreadStore, recorder: Recorder, size: int, version: ThreadVersion, count: int
) -> list[list[Statement]]:
    """The statements of ``count`` turns on the thread of ``size`` messages, turn by turn."""
    sequence = []
    for n in range(count):
        request = b.update_at(SCOPE, f"t{size}", version, turn(size + n), root=b.root())
        done: list[Any] = []

        async def commit(request: dict[str, Any] = request, done: list[Any] = done) -> None:
            done.append(await store.commit_thread(request))

        sequence.append(await recorder.record(commit))
        result = done[0]
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        version = result.thread.version
    return sequence


async def time_turns(
    store: SqlThreadStore,
    floor: Floor,
    one_trip: Floor,
    size: int,
    version: ThreadVersion,
    recorded: list[list[Statement]],
    turns: int,
) -> list[float]:
    """A turn on the store's thread of ``size`` messages against its recorded replay,
    statement by statement and in one trip (each on its own copy of the database)."""
    counter = iter(range(turns + 10))
    replay = iter(recorded)
    replay_again = iter(recorded)

    async def store_turn() -> None:
        nonlocal version
        result = await store.commit_thread(
            b.update_at(SCOPE, f"t{size}", version, turn(size + next(counter)), root=b.root())
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        version = result.thread.version

    async def floor_turn() -> None:
        await floor.replay(next(replay), write=True)

    async def one_trip_turn() -> None:
        await one_trip.replay_in_one_trip(next(replay_again))

    return await timed(turns, store_turn, floor_turn, one_trip_turn)


async def time_reads(
    store: SqlThreadStore, floor: Floor, size: int, recorded: list[Statement], reads: int
) -> list[float]:
    """Reading the newest 20 transcript messages against the recorded replay."""

    async def store_read() -> None:
        await store.read_thread(read_20(f"t{size}"))

    async def floor_read() -> None:
        await floor.replay(recorded, write=False)

    return await timed(reads, store_read, floor_read)


async def main(directory: str, quick: bool, peers: bool) -> None:
    sizes = (10, 1_000) if quick else SIZES
    threads = 200 if quick else THREADS_IN_SCOPE
    turns = 30 if quick else 200
    reads = 50 if quick else 300
    work = Path(tempfile.mkdtemp(prefix="pai-sql-bench-", dir=directory))
    print(machine(), file=sys.stderr)
    try:
        store_ms = await run(work, sizes, threads, turns, reads)
        if peers:
            print("\npeers (median ms, same machine, same run):")
            for name, found in await run_peers(work, sizes, turns, reads):
                if isinstance(found, str):
                    print(f"- {name}: {found}")
                    continue
                cells = ", ".join(
                    f"{op} {ms:.3f} ({ms / store_ms[op]:.2f}x pai-storage)"
                    for op, ms in found.items()
                )
                print(f"- {name}: {cells}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print(f"after: {machine()}", file=sys.stderr)


def machine() -> str:
    """Versions and the load average, for the report of a run."""
    import os
    import platform
    import sqlite3
    from importlib.metadata import version

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"SQLite {sqlite3.sqlite_version}, aiosqlite {version('aiosqlite')}, "
        f"SQLAlchemy {version('sqlalchemy')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )


async def run(
    work: Path, sizes: tuple[int, ...], threads: int, turns: int, reads: int
) -> dict[str, float]:
    base = work / "base.db"
    print(f"building threads of {sizes} messages and {threads} threads ...", file=sys.stderr)
    versions: dict[int, ThreadVersion] = {}
    async with SqlThreadStore(f"sqlite:///{base}") as store:
        for size in sizes:
            versions[size] = await build_thread(store, f"t{size}", size)
        for i in range(threads):
            result = await store.commit_thread(b.create(LIST_SCOPE, f"l{i:05}", title=f"{i}"))
            assert isinstance(result, CommittedResult)
    for name in ("store", "record", "floor", "one-trip"):
        shutil.copy(base, work / f"{name}.db")

    # Record the statements of every timed operation on a copy of the database.
    recorded_turns: dict[int, list[list[Statement]]] = {}
    recorded_reads: dict[int, list[Statement]] = {}
    async with SqlThreadStore(f"sqlite:///{work / 'record.db'}") as store:
        await store.initialize()
        # Connections are opened (and their pragmas run) before recording: the
        # recorded statements are those of the operations alone.
        await store.read_thread(read_20(f"t{sizes[0]}"))
        recorder = Recorder()
        recorder.attach()
        try:
            for size in sizes:
                recorded_turns[size] = await record_turns(
                    store, recorder, size, versions[size], turns + 10
                )
                recorded_reads[size] = await recorder.record(
                    functools.partial(store.read_thread, read_20(f"t{size}"))
                )
            recorded_list = await recorder.record(functools.partial(store.list_threads, LIST_20))
        finally:
            recorder.detach()

    rows: list[tuple[str, float, float, float | None]] = []
    floor = Floor(str(work / "floor.db"))
    one_trip = Floor(str(work / "one-trip.db"))
    await floor.open()
    await one_trip.open()
    try:
        async with SqlThreadStore(f"sqlite:///{work / 'store.db'}") as store:
            await store.initialize()
            for size in sizes:
                store_ms, floor_ms, one_trip_ms = await time_turns(
                    store, floor, one_trip, size, versions[size], recorded_turns[size], turns
                )
                rows.append((f"turn @ {size:,} messages", store_ms, floor_ms, one_trip_ms))
            for size in sizes:
                store_ms, floor_ms = await time_reads(
                    store, floor, size, recorded_reads[size], reads
                )
                rows.append((f"read newest 20 @ {size:,} messages", store_ms, floor_ms, None))
            store_ms, floor_ms = await timed(
                reads,
                lambda: store.list_threads(LIST_20),
                lambda: floor.replay(recorded_list, write=False),
            )
            rows.append((f"list 20 of {threads:,} threads", store_ms, floor_ms, None))
    finally:
        await floor.close()
        await one_trip.close()

    header = (
        "operation",
        "store ms",
        "aiosqlite floor ms",
        "store / floor",
        "one-trip floor ms",
        "store / one-trip",
    )
    table = [header] + [
        (
            op,
            f"{s:.3f}",
            f"{f:.3f}",
            f"{s / f:.2f}x",
            "" if o is None else f"{o:.3f}",
            "" if o is None else f"{s / o:.2f}x",
        )
        for op, s, f, o in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
        if i == 0:
            print("| " + " | ".join("-" * w for w in widths) + " |")
    by_op = {op: s for op, s, _, _ in rows}
    small, large = sizes[0], sizes[-1]
    growth = by_op[f"turn @ {large:,} messages"] / by_op[f"turn @ {small:,} messages"]
    print(f"\nturn at {large:,} messages / turn at {small:,} messages: {growth:.2f}x")
    statements = {size: len(seq[0]) for size, seq in recorded_turns.items()}
    print(f"statements per turn (with COMMIT): {statements}")
    return by_op


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few samples")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the databases go")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also time LangGraph's AsyncSqliteSaver and the OpenAI Agents SQLiteSession "
        "(langgraph-checkpoint-sqlite, openai-agents) on the same workload",
    )
    args = parser.parse_args()
    asyncio.run(main(args.dir, args.quick, args.peers))
