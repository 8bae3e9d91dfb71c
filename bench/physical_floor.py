"""The physical floor: each store's commit and read against the least a hand-written
application does on the same database, in one run, samples interleaved.

::

    .venv/bin/python -m bench.physical_floor [--db postgres] [--db mongo] [--db sqlite] [--quick]

The floors of ``bench/postgres_bench.py``, ``bench/mongo_bench.py`` and
``bench/sql_bench.py`` make the store's own round trips (the same statements,
hand-written): they show what the store costs beyond its statements, and hide
what its statements cost beyond the database. The *physical* floor here is
the minimal compare-and-set transaction a careful application writes by hand,
on the store's own tables and indexes, with the server's clock:

- a commit: begin, one version-checked write of the root that returns the next
  position (``UPDATE root ... WHERE revision = $n RETURNING``; MongoDB a
  ``findAndModify`` guarded by the version, ``$$NOW`` as the clock), the
  inserts in one statement (``INSERT ... SELECT unnest``, ``insert_many``,
  ``executemany``), commit. PostgreSQL and MongoDB: four and three round trips;
  SQLite: the whole transaction in one call into a database thread.
- a newest-20 read: the root and the page in one snapshot (PostgreSQL one
  statement, a ``UNION ALL``; SQLite two statements in one read transaction
  on the event loop; MongoDB two ``find`` in a snapshot session),
  every document ``json.loads``-ed (PyMongo decodes BSON itself).

Timed on a thread of 1,000 messages built as completed turns (a user message
and an assistant message per run): *append* (one assistant message, one
commit), *turn* (a user and an assistant message, one commit) and *read
newest 20* (transcript). The store, the physical floor and, for PostgreSQL,
the same-round-trips floor of ``bench/postgres_bench.py`` alternate call by
call, so the machine's load hits every side alike: only the ratios of one run
are meant to be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pai_storage import CommittedResult, ThreadStore, ThreadVersion
from pai_storage import builders as b

SCOPE = "bench"
SIZE = 1_000
TEXT = "answer " * 40
Call = Callable[[], Awaitable[Any]]
Row = tuple[str, float, float, float | None]
"""Operation, store ms, physical floor ms, same-round-trips floor ms (if any)."""


# ---------------------------------------------------------------- shared


def message(message_id: str, role: Literal["user", "assistant"] = "assistant") -> dict[str, Any]:
    return b.message(message_id, TEXT, role=role)


def stamped(record: dict[str, Any], now: str) -> str:
    """A message as a hand-written application stores it: its JSON with the times."""
    return json.dumps(record | {"createdAt": now, "updatedAt": now}, separators=(",", ":"))


async def build(store: ThreadStore, thread_id: str, messages: int = SIZE) -> ThreadVersion:
    """A thread of completed turns (user input, assistant output, the run)."""
    result = await store.commit_thread(b.create(SCOPE, thread_id))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    version = result.thread.version
    for start in range(0, messages // 2, 100):
        changes: dict[str, list[dict[str, Any]]] = {"messages": [], "runs": []}
        for n in range(start, min(messages // 2, start + 100)):
            run = f"r{n}"
            changes["messages"] += [
                b.insert(b.message(f"u{n}", f"question {n} " * 8, run_id=run, relation="input")),
                b.insert(b.message(f"a{n}", TEXT, role="assistant", run_id=run, relation="output")),
            ]
            changes["runs"].append(b.insert(b.run(run, "completed", inputs=[f"u{n}"])))
        result = await store.commit_thread(
            b.update_at(SCOPE, thread_id, version, changes, root=b.root())
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        version = result.thread.version
    return version


class StoreSide:
    """The store's append, turn and newest-20 read on one thread."""

    def __init__(self, store: ThreadStore, thread_id: str, version: ThreadVersion) -> None:
        self.store = store
        self.thread_id = thread_id
        self.version = version

    async def commit(self, records: list[dict[str, Any]]) -> None:
        result = await self.store.commit_thread(
            b.update_at(
                SCOPE,
                self.thread_id,
                self.version,
                {"messages": [b.insert(r) for r in records]},
                root=b.root(),
            )
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        self.version = result.thread.version

    async def append(self) -> None:
        await self.commit([message(uuid.uuid4().hex)])

    async def turn(self) -> None:
        await self.commit([message(uuid.uuid4().hex, "user"), message(uuid.uuid4().hex)])

    async def read(self) -> None:
        result = await self.store.read_thread(
            b.read(
                SCOPE,
                self.thread_id,
                messages={
                    "type": "page",
                    "view": "transcript",
                    "order": "newest",
                    "page": {"limit": 20},
                },
            )
        )
        assert result.messages is not None
        assert len(result.messages.items) == 20


async def interleaved(
    cases: dict[str, Call], n: int, warmup: int = 10, after: dict[str, Call] | None = None
) -> dict[str, float]:
    """Median milliseconds of each case, called round-robin (the first rotating);
    ``after[key]``, when given, runs untimed right after case ``key``."""
    samples: dict[str, list[float]] = {key: [] for key in cases}
    keys = list(cases)
    after = after or {}
    for i in range(warmup + n):
        shift = i % len(keys)
        for key in keys[shift:] + keys[:shift]:
            t0 = time.perf_counter()
            await cases[key]()
            if i >= warmup:
                samples[key].append(time.perf_counter() - t0)
            if key in after:
                await after[key]()
    return {key: statistics.median(values) * 1000 for key, values in samples.items()}


async def measure(
    store: StoreSide,
    floor: Any,
    n: int,
    same_trips: dict[str, Call] | None = None,
) -> list[Row]:
    """Store, physical floor (and the same-round-trips floor where given), interleaved."""
    cases: dict[str, Call] = {}
    for op in ("append", "turn", "read"):
        cases[f"store {op}"] = getattr(store, op)
        cases[f"floor {op}"] = getattr(floor, op)
        if same_trips and op in same_trips:
            cases[f"same {op}"] = same_trips[op]
    med = await interleaved(cases, n)
    labels = {"append": "append 1 message", "turn": "turn (2 messages)", "read": "read newest 20"}
    return [
        (
            f"{label} @ {SIZE:,}",
            med[f"store {op}"],
            med[f"floor {op}"],
            med.get(f"same {op}"),
        )
        for op, label in labels.items()
    ]


# ---------------------------------------------------------------- PostgreSQL


class PgPhysical:
    """The minimal CAS transaction and root + page read, hand-written on asyncpg."""

    def __init__(self, pool: Any, tables: Any, thread_id: str, read_thread: str) -> None:
        self.pool = pool
        self.scope = SCOPE.encode()
        self.thread = thread_id.encode()
        self.read_thread = read_thread.encode()
        self.revision = 0
        self.root = ""
        t = tables
        self.root_sql = (
            f"SELECT revision, doc FROM {t.threads} WHERE scope_key = $1 AND thread_id = $2"
        )
        # The server's clock, once per statement (the contract stamps with it too).
        self.cas_sql = (
            f"UPDATE {t.threads} AS r SET revision = r.revision + 1, updated_at = c.now, "
            "sort_key = -(extract(epoch FROM c.now) * 1000)::bigint, "
            "messages_next = r.messages_next + $4, doc = $5 "
            "FROM (SELECT date_trunc('milliseconds', clock_timestamp()) AS now) AS c "
            "WHERE r.scope_key = $1 AND r.thread_id = $2 AND r.revision = $3 "
            "RETURNING r.messages_next, to_char(c.now AT TIME ZONE 'UTC', "
            '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\') AS now'
        )
        self.insert_sql = (
            f"INSERT INTO {t.messages} (scope_key, thread_id, position, message_id, run_id, "
            "relation, transcript, context, doc) SELECT $1, $2, * FROM unnest($3::bigint[], "
            "$4::bytea[], $5::bytea[], $6::text[], $7::boolean[], $8::boolean[], $9::text[])"
        )
        self.read_sql = (
            f"(SELECT NULL::bigint AS position, doc FROM {t.threads} "
            "WHERE scope_key = $1 AND thread_id = $2) UNION ALL "
            f"(SELECT position, doc FROM {t.messages} WHERE scope_key = $1 "
            "AND thread_id = $2 AND transcript ORDER BY position DESC LIMIT 21)"
        )

    async def start(self) -> None:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(self.root_sql, self.scope, self.thread)
        self.revision, self.root = row["revision"], row["doc"]

    async def commit(self, records: list[dict[str, Any]]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                self.cas_sql, self.scope, self.thread, self.revision, len(records), self.root
            )
            if row is None:
                raise RuntimeError("the floor's version check matched nothing")
            first = row["messages_next"] - len(records)
            n = len(records)
            await conn.execute(
                self.insert_sql,
                self.scope,
                self.thread,
                list(range(first, first + n)),
                [r["messageId"].encode() for r in records],
                [None] * n,
                [None] * n,
                [True] * n,
                [True] * n,
                [stamped(r, row["now"]) for r in records],
            )
        self.revision += 1

    async def append(self) -> None:
        await self.commit([message(uuid.uuid4().hex)])

    async def turn(self) -> None:
        await self.commit([message(uuid.uuid4().hex, "user"), message(uuid.uuid4().hex)])

    async def read(self) -> None:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(self.read_sql, self.scope, self.read_thread)
        docs = [json.loads(r["doc"]) for r in rows]
        assert len(docs) == 22


@contextlib.asynccontextmanager
async def postgres_sides(url: str) -> AsyncIterator[tuple[Any, Any, StoreSide, PgPhysical]]:
    """``(store, pool, store side, physical floor)`` on a fresh schema, dropped
    afterwards: the store's thread and the floor's, of :data:`SIZE` messages
    each (the floor reads the store's)."""
    import asyncpg  # type: ignore[import-untyped]
    from pai_storage_postgres import PostgresThreadStore
    from pai_storage_postgres.client import SESSION_SETTINGS, keep_session

    from pai_storage import make_url

    schema = f"pai_bench_{uuid.uuid4().hex[:10]}"
    dsn = make_url(url).render(hide_password=False, scheme="postgresql")
    store = PostgresThreadStore(url, schema=schema, max_pool_size=4)
    await store.initialize()
    pool = await asyncpg.create_pool(
        dsn, min_size=2, max_size=4, server_settings=dict(SESSION_SETTINGS), reset=keep_session
    )
    try:
        side = StoreSide(store, "store", await build(store, "store"))
        await build(store, "physical")
        physical = PgPhysical(pool, store.tables, "physical", "store")
        await physical.start()
        yield store, pool, side, physical
    finally:
        await pool.close()
        await store.close()
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


async def postgres(url: str, n: int) -> tuple[str, list[Row]]:
    from .postgres_bench import FLOOR_SCOPE, Floor
    from .postgres_bench import build_thread as build_floor_thread

    async with postgres_sides(url) as (store, pool, side, physical):
        await build_floor_thread(store, "same", SIZE, FLOOR_SCOPE)
        same = Floor(pool, store)
        async with pool.acquire() as conn:
            for table in (store.tables.threads, store.tables.messages):
                await conn.execute(f"VACUUM ANALYZE {table}")
            server = "PostgreSQL " + await conn.fetchval("SHOW server_version")
        rows = await measure(
            side,
            physical,
            n,
            {"append": lambda: same.append("same"), "read": lambda: same.read_newest("store")},
        )
        return server, rows


# ---------------------------------------------------------------- MongoDB


class MongoPhysical:
    """The minimal CAS transaction and root + page read, hand-written on PyMongo."""

    def __init__(self, client: Any, db: str, names: dict[str, str], thread_id: str) -> None:
        from pymongo import ReturnDocument
        from pymongo.read_concern import ReadConcern
        from pymongo.read_preferences import ReadPreference
        from pymongo.write_concern import WriteConcern

        self.client = client
        self.threads = client[db][names["threads"]]
        self.messages = client[db][names["messages"]]
        self.thread_id = thread_id
        self.after = ReturnDocument.AFTER
        self.txn = {
            "read_concern": ReadConcern("snapshot"),
            "write_concern": WriteConcern("majority"),
            "read_preference": ReadPreference.PRIMARY,
        }
        self.version: dict[str, Any] = {}

    async def start(self) -> None:
        root = await self.threads.find_one({"scopeKey": SCOPE, "threadId": self.thread_id})
        assert root is not None
        self.version = root["version"]

    async def commit(self, records: list[dict[str, Any]]) -> None:
        n = len(records)
        async with (
            self.client.start_session(causal_consistency=False) as session,
            await session.start_transaction(**self.txn),
        ):
            root = await self.threads.find_one_and_update(
                {
                    "scopeKey": SCOPE,
                    "threadId": self.thread_id,
                    "version.threadInstanceId": self.version["threadInstanceId"],
                    "version.revision": self.version["revision"],
                },
                [
                    {
                        "$set": {
                            "updatedAt": "$$NOW",
                            "version.revision": {"$add": ["$version.revision", 1]},
                            "_nextOrder.messages": {"$add": ["$_nextOrder.messages", n]},
                        }
                    }
                ],
                projection={"_nextOrder": 1, "updatedAt": 1, "version": 1},
                return_document=self.after,
                session=session,
            )
            if root is None:
                raise RuntimeError("the floor's version check matched nothing")
            first, now = root["_nextOrder"]["messages"] - n, root["updatedAt"]
            await self.messages.insert_many(
                [
                    {
                        "_schemaVersion": 1,
                        "scopeKey": SCOPE,
                        "threadId": self.thread_id,
                        "_order": first + i,
                        **record,
                        "createdAt": now,
                        "updatedAt": now,
                    }
                    for i, record in enumerate(records)
                ],
                session=session,
            )
        self.version = root["version"]

    async def append(self) -> None:
        await self.commit([message(uuid.uuid4().hex)])

    async def turn(self) -> None:
        await self.commit([message(uuid.uuid4().hex, "user"), message(uuid.uuid4().hex)])

    async def read(self) -> None:
        # One snapshot for both reads (a snapshot session, MongoDB 5.0+).
        async with self.client.start_session(snapshot=True) as session:
            root = await self.threads.find_one(
                {"scopeKey": SCOPE, "threadId": "store"}, session=session
            )
            assert root is not None
            docs = await self.messages.find(
                {
                    "scopeKey": SCOPE,
                    "threadId": "store",
                    "visibility.transcript": True,
                    "_order": {"$lt": root["_nextOrder"]["messages"]},
                },
                sort=[("_order", -1)],
                limit=21,
                session=session,
            ).to_list()
            assert len(docs) == 21


async def mongo(url: str | None, n: int) -> tuple[str, list[Row]]:
    from pai_storage_mongo.harness import MongodProcess
    from pai_storage_mongo.store import MongoThreadStore
    from pymongo import AsyncMongoClient

    mongod = None
    if url is None:
        mongod = MongodProcess()
        mongod.start()
        url = mongod.url
    store = MongoThreadStore(
        url, db_name="pai_bench", collection_name=f"floor{uuid.uuid4().hex[:8]}"
    )
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, tz_aware=True)
    try:
        await store.initialize()
        side = StoreSide(store, "store", await build(store, "store"))
        await build(store, "physical")
        physical = MongoPhysical(client, "pai_bench", store.collection_names(), "physical")
        await physical.start()
        rows = await measure(side, physical, n)
        server = f"MongoDB {mongod.version}" if mongod else "MongoDB (given server)"
        return server + ", single-node replica set", rows
    finally:
        for name in store.collection_names().values():
            await client["pai_bench"].drop_collection(name)
        await store.close()
        await client.close()
        if mongod is not None:
            mongod.stop()


# ---------------------------------------------------------------- SQLite


class SqlitePhysical:
    """The minimal CAS transaction on plain ``sqlite3`` in one call into the
    writer's own thread, and the root + page read in one call on the event loop
    (as the store runs its commits and reads)."""

    def __init__(self, path: str, thread_id: str) -> None:
        self.path = path
        self.thread_id = thread_id
        self.writer = self._connect()
        self.reader = self._connect()
        # A thread for the writer, like the store's executor.
        self.write_thread = ThreadPoolExecutor(1)
        self.revision = 0
        self.root = ""
        self.keys: dict[str, bytes] = {}

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode=WAL", "busy_timeout=5000", "foreign_keys=ON"):
            conn.execute(f"PRAGMA {pragma}")
        return conn

    def start(self) -> None:
        rows = self.writer.execute("SELECT tkey, thread_id, revision, doc FROM pai_threads")
        for key, thread, revision, doc in rows.fetchall():
            name = bytes(thread).decode()
            self.keys[name] = key
            if name == self.thread_id:
                self.revision, self.root = revision, doc

    def close(self) -> None:
        self.write_thread.shutdown()
        self.writer.close()
        self.reader.close()

    def _commit(self, records: list[dict[str, Any]]) -> None:
        from pai_storage_sql.schema import digest

        conn, n = self.writer, len(records)
        now = datetime.now(UTC)
        ms = int(now.timestamp() * 1000)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "UPDATE pai_threads SET revision = revision + 1, updated_ms = ?, sort_key = ?, "
                "messages_next = messages_next + ?, doc = ? WHERE tkey = ? AND revision = ? "
                "RETURNING messages_next",
                (ms, -ms, n, self.root, self.keys[self.thread_id], self.revision),
            ).fetchone()
            if row is None:
                raise RuntimeError("the floor's version check matched nothing")
            first = row[0] - n
            conn.executemany(
                "INSERT INTO pai_threads_messages (tkey, position, id_h, message_id, run_h, "
                "run_id, relation, transcript, context, doc) "
                "VALUES (?, ?, ?, ?, NULL, NULL, NULL, 1, 1, ?)",
                [
                    (
                        self.keys[self.thread_id],
                        first + i,
                        digest(r["messageId"]),
                        r["messageId"].encode(),
                        stamped(r, stamp),
                    )
                    for i, r in enumerate(records)
                ],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.revision += 1

    def _read(self) -> int:
        conn, key = self.reader, self.keys["store"]
        conn.execute("BEGIN")
        try:
            root = conn.execute("SELECT doc FROM pai_threads WHERE tkey = ?", (key,)).fetchone()
            page = conn.execute(
                "SELECT doc FROM pai_threads_messages WHERE tkey = ? AND transcript "
                "ORDER BY position DESC LIMIT 21",
                (key,),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        return len([json.loads(root[0]), *(json.loads(d) for (d,) in page)])

    async def append(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.write_thread, self._commit, [message(uuid.uuid4().hex)])

    async def turn(self) -> None:
        records = [message(uuid.uuid4().hex, "user"), message(uuid.uuid4().hex)]
        await asyncio.get_running_loop().run_in_executor(self.write_thread, self._commit, records)

    async def read(self) -> None:
        assert self._read() == 22  # on the event loop, as the store reads


async def sqlite(directory: str, n: int) -> tuple[str, list[Row]]:
    from pai_storage_sql import SqlThreadStore

    work = Path(tempfile.mkdtemp(prefix="pai-floor-", dir=directory))
    path = work / "floor.db"
    physical: SqlitePhysical | None = None
    try:
        async with SqlThreadStore(f"sqlite:///{path}") as store:
            side = StoreSide(store, "store", await build(store, "store"))
            await build(store, "physical")
            physical = SqlitePhysical(str(path), "physical")
            physical.start()
            rows = await measure(side, physical, n)
        return f"SQLite {sqlite3.sqlite_version} (file, WAL)", rows
    finally:
        if physical is not None:
            physical.close()
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the run


def table(server: str, rows: list[Row]) -> str:
    head: tuple[str, ...] = ("operation", "pai-storage", "physical floor", "vs physical")
    same = any(r[3] is not None for r in rows)
    if same:
        head += ("same-trips floor", "vs same-trips")
    lines: list[tuple[str, ...]] = [head]
    for op, ours, floor, trips in rows:
        cells: tuple[str, ...] = (op, f"{ours:.3f} ms", f"{floor:.3f} ms", f"{ours / floor:.2f}x")
        if same:
            cells += ("", "") if trips is None else (f"{trips:.3f} ms", f"{ours / trips:.2f}x")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [f"{server}:"]
    for i, line in enumerate(lines):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
        if i == 0:
            out.append("| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(out)


async def run(args: argparse.Namespace) -> None:
    n = 60 if args.quick else 300
    dbs = args.db or ["postgres", "mongo", "sqlite"]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, median of {n} per cell, load {load}")
    for db in dbs:
        print(f"{db}: building ...", file=sys.stderr)
        if db == "postgres":
            server, rows = await postgres(args.postgres_url, n)
        elif db == "mongo":
            server, rows = await mongo(args.mongo_url, n)
        else:
            server, rows = await sqlite(args.dir, n)
        print("\n" + table(server, rows), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", choices=("postgres", "mongo", "sqlite"))
    parser.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--mongo-url", help="a replica set (default: a throwaway mongod)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the SQLite file goes")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
