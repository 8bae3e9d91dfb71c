"""MongoDB backend benchmark: the store against hand-written PyMongo (the floor).

::

    python -m bench.mongo_bench [--url mongodb://...] [--quick] [--write-docs [PATH]]

Without ``--url`` it starts a throwaway single-node replica set (like the test
harness). Workloads, each timed for the store and for the same operation
hand-written in raw PyMongo on the same collections and document shapes:

1. append one message (one commit) to transcripts of 10 / 1,000 / 10,000
   messages built as realistic turns (user input + assistant output per
   completed run; the appended message is the open run's next output);
2. read the newest 20 transcript messages at those sizes;
3. the first and a deep (page ~400) list page of 20 in a scope of 10,000 threads;
4. commit throughput with 1 / 8 / 32 concurrent writers on different threads
   (each appends to its own thread; a new turn every 50 appends, both kinds).

It prints a table of p50 latencies (throughput for 4) with two ratios: size
(largest / smallest; target < 1.5) and store / floor (target <= 1.5).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pai_storage_mongo.documents import root_document
from pai_storage_mongo.harness import MongodProcess
from pai_storage_mongo.store import LIST_SORT, MongoThreadStore
from pymongo import AsyncMongoClient, ReturnDocument, monitoring
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference
from pymongo.write_concern import WriteConcern

from pai_storage import CommittedResult, ThreadRecord, ThreadVersion
from pai_storage import builders as b

SCOPE = "bench"
SIZES = (10, 1_000, 10_000)
LIST_THREADS = 10_000
WRITERS = (1, 8, 32)
ROTATE = 50  # appends per turn in the throughput workload
USER = "Could you summarise the quarterly figures for the northern region, please?"
ASSISTANT = (
    "Revenue in the northern region grew 4.2% quarter on quarter, driven by renewals; "
    "costs were flat, so the operating margin improved by about one point."
)
TXN: dict[str, Any] = {
    "read_concern": ReadConcern("snapshot"),
    "write_concern": WriteConcern("majority"),
    "read_preference": ReadPreference.PRIMARY,
}
Doc = dict[str, Any]
DOCS = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


class Commands(monitoring.CommandListener):
    """Counts the commands a client sends (handshakes and heartbeats aside)."""

    IGNORED = frozenset({"hello", "isMaster", "ismaster", "ping", "endSessions", "buildInfo"})

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in self.IGNORED:
            self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


STORE_COMMANDS = Commands()
FLOOR_COMMANDS = Commands()
COUNTS: dict[str, tuple[int, int]] = {}
"""Commands of one store operation and of one floor operation, by workload."""


async def count(
    name: str, store_op: Callable[[], Awaitable[Any]], floor_op: Callable[[], Awaitable[Any]]
) -> None:
    """Record how many commands one run of each side sends (untimed)."""
    counts = []
    for commands, op in ((STORE_COMMANDS, store_op), (FLOOR_COMMANDS, floor_op)):
        commands.names.clear()
        await op()
        counts.append(len(commands.names))
    COUNTS[name] = (counts[0], counts[1])


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(op: Callable[[], Awaitable[Any]], reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        await op()
        samples.append(time.perf_counter() - start)
    return samples


# ------------------------------------------------------------------ building


class Transcript:
    """A thread driven through the store: completed turns, then one open turn."""

    def __init__(self, store: MongoThreadStore, thread_id: str) -> None:
        self.store = store
        self.thread_id = thread_id
        self.version: ThreadVersion | None = None
        self.turn = 0
        self.count = 0
        self.open_run: str | None = None

    async def commit(self, changes: dict[str, Any] | None) -> None:
        if self.version is None:
            request = b.create(SCOPE, self.thread_id, changes, metadata={"app": "bench"})
        else:
            request = b.update_at(
                SCOPE, self.thread_id, self.version, changes, root=b.root(metadata={"app": "bench"})
            )
        result = await self.store.commit_thread(request)
        assert isinstance(result, CommittedResult), result
        assert result.thread is not None
        self.version = result.thread.version

    async def build(self, messages: int, batch: int = 400) -> None:
        """Completed turns of two messages each, committed ``batch`` messages at a time."""
        await self.commit(None)
        while self.count + 2 <= messages:
            ms: list[Doc] = []
            runs: list[Doc] = []
            while self.count + 2 <= messages and len(ms) < batch:
                self.turn += 1
                run, user, reply = f"r{self.turn}", f"u{self.turn}", f"a{self.turn}"
                ms.append({"type": "insert", "record": b.message(user, USER, run_id=run)})
                ms.append(
                    {
                        "type": "insert",
                        "record": b.message(
                            reply, ASSISTANT, role="assistant", run_id=run, relation="output"
                        ),
                    }
                )
                runs.append({"type": "insert", "record": b.run(run, "completed", inputs=[user])})
                self.count += 2
            await self.commit({"messages": ms, "runs": runs})

    async def open_turn(self) -> None:
        self.turn += 1
        run, user = f"r{self.turn}", f"u{self.turn}"
        await self.commit(
            {
                "messages": [{"type": "insert", "record": b.message(user, USER, run_id=run)}],
                "runs": [{"type": "insert", "record": b.run(run, "running", inputs=[user])}],
                "lease": b.acquire(run, "bench", 600_000),
            }
        )
        self.count += 1
        self.open_run = run

    async def close_turn(self) -> None:
        assert self.open_run is not None
        run = self.open_run
        user = "u" + run[1:]
        await self.commit(
            {
                "runs": [{"type": "replace", "record": b.run(run, "completed", inputs=[user])}],
                "lease": b.release(run, "bench"),
            }
        )
        self.open_run = None

    def output(self) -> Doc:
        assert self.open_run is not None
        self.count += 1
        return b.message(
            f"o{self.count}", ASSISTANT, role="assistant", run_id=self.open_run, relation="output"
        )

    async def append(self) -> None:
        """The timed operation: one assistant message for the open run, one commit."""
        await self.commit({"messages": [{"type": "insert", "record": self.output()}]})


class RawAppender:
    """The floor: the same append hand-written in PyMongo (CAS on the root, one insert)."""

    def __init__(self, client: AsyncMongoClient[Doc], store: MongoThreadStore, t: Transcript):
        names = store.collection_names()
        db = client[store.db_name]
        self.client = client
        self.threads = db[names["threads"]]
        self.messages = db[names["messages"]]
        self.t = t

    async def append(self) -> None:
        t = self.t
        assert t.version is not None
        draft = t.output()
        async with (
            self.client.start_session(causal_consistency=False) as session,
            await session.start_transaction(**TXN),
        ):
            root = await self.threads.find_one_and_update(
                {
                    "scopeKey": SCOPE,
                    "threadId": t.thread_id,
                    "version.threadInstanceId": t.version.thread_instance_id,
                    "version.revision": t.version.revision,
                },
                [
                    {
                        "$set": {
                            "updatedAt": "$$NOW",
                            "version.revision": {"$add": ["$version.revision", 1]},
                            "_nextOrder.messages": {"$add": ["$_nextOrder.messages", 1]},
                        }
                    }
                ],
                projection={"_nextOrder": 1, "updatedAt": 1, "version": 1},
                return_document=ReturnDocument.AFTER,
                session=session,
            )
            assert root is not None
            now = root["updatedAt"]
            await self.messages.insert_one(
                {
                    "_schemaVersion": 1,
                    "scopeKey": SCOPE,
                    "threadId": t.thread_id,
                    "_order": root["_nextOrder"]["messages"] - 1,
                    **draft,
                    "createdAt": now,
                    "updatedAt": now,
                },
                session=session,
            )
        t.version = ThreadVersion(
            thread_instance_id=t.version.thread_instance_id, revision=root["version"]["revision"]
        )


# ------------------------------------------------------------------ workloads


async def bench_append(
    store: MongoThreadStore, client: AsyncMongoClient[Doc], reps: int
) -> dict[int, tuple[float, float]]:
    """Store and floor appends alternate one by one, so load changes hit both alike."""
    out: dict[int, tuple[float, float]] = {}
    for size in SIZES:
        kinds: dict[str, tuple[Transcript, Callable[[], Awaitable[None]]]] = {}
        for kind in ("store", "floor"):
            t = Transcript(store, f"append-{kind}-{size}")
            await t.build(size)
            kinds[kind] = (t, t.append if kind == "store" else RawAppender(client, store, t).append)
        samples: dict[str, list[float]] = {"store": [], "floor": []}
        for t, op in kinds.values():  # warm-up, untimed
            await t.open_turn()
            await timed(op, 10)
            await t.close_turn()
        for batch in range(0, reps, 10):
            for t, _ in kinds.values():
                await t.open_turn()  # untimed: a new turn every 10 appends
            for _ in range(10):
                for kind, (_, op) in kinds.items():
                    samples[kind] += await timed(op, 1)
            if batch == 0:
                await count(f"append@{size}", kinds["store"][1], kinds["floor"][1])
            for t, _ in kinds.values():
                await t.close_turn()
        out[size] = (p50(samples["store"]), p50(samples["floor"]))
        print(f"  append @ {size}: store {out[size][0]:.2f} ms, floor {out[size][1]:.2f} ms")
    return out


async def alternate(
    store_op: Callable[[], Awaitable[Any]], floor_op: Callable[[], Awaitable[Any]], reps: int
) -> tuple[float, float]:
    """p50 of both operations, run alternately (after a short warm-up)."""
    await timed(store_op, 10)
    await timed(floor_op, 10)
    store_samples: list[float] = []
    floor_samples: list[float] = []
    for _ in range(reps):
        store_samples += await timed(store_op, 1)
        floor_samples += await timed(floor_op, 1)
    return p50(store_samples), p50(floor_samples)


async def bench_read(
    store: MongoThreadStore, client: AsyncMongoClient[Doc], reps: int
) -> dict[int, tuple[float, float]]:
    names = store.collection_names()
    db = client[store.db_name]
    out: dict[int, tuple[float, float]] = {}
    for size in SIZES:
        thread_id = f"append-store-{size}"  # built by bench_append
        request = b.read(
            SCOPE,
            thread_id,
            messages={
                "type": "page",
                "view": "transcript",
                "order": "newest",
                "page": {"limit": 20},
            },
        )

        async def store_read(request: Doc = request) -> None:
            result = await store.read_thread(request)
            assert result.messages is not None
            assert len(result.messages.items) == 20

        async def raw_read(thread_id: str = thread_id) -> None:
            # One snapshot for both reads: a snapshot session (MongoDB 5.0+), the way
            # hand-written code reads a consistent root and page without a transaction.
            async with client.start_session(snapshot=True) as session:
                root = await db[names["threads"]].find_one(
                    {"scopeKey": SCOPE, "threadId": thread_id}, session=session
                )
                assert root is not None
                docs = await (
                    db[names["messages"]]
                    .find(
                        {
                            "scopeKey": SCOPE,
                            "threadId": thread_id,
                            "visibility.transcript": True,
                            "_order": {"$lt": root["_nextOrder"]["messages"]},
                        },
                        sort=[("_order", -1)],
                        limit=21,
                        session=session,
                    )
                    .to_list()
                )
                assert len(docs) == 21

        figures = await alternate(store_read, raw_read, reps)
        await count(f"read@{size}", store_read, raw_read)
        out[size] = figures
        print(f"  read newest 20 @ {size}: store {figures[0]:.2f} ms, floor {figures[1]:.2f} ms")
    return out


async def seed_scope(store: MongoThreadStore) -> None:
    """10,000 valid roots, inserted directly in the stored shape (seeding only)."""
    base = datetime(2030, 1, 1, tzinfo=UTC)
    docs = []
    for i in range(LIST_THREADS):
        when = base + timedelta(milliseconds=i // 3)  # ties exercise the threadId order
        record = ThreadRecord(
            scope_key="list",
            thread_id=f"thread-{i:05d}",
            version=ThreadVersion(thread_instance_id=uuid.uuid4().hex, revision=1),
            agent="assistant",
            direct_execution_allowed=True,
            list_visibility="visible",
            title=f"Thread {i}",
            metadata={"app": "bench"},
            private_metadata={},
            created_at=when,
            updated_at=when,
        )
        docs.append(root_document(record, {"messages": 1, "runs": 1, "queuedItems": 1}))
    await store.database[store.collection_name].insert_many(docs)


async def bench_list(
    store: MongoThreadStore, client: AsyncMongoClient[Doc], reps: int
) -> dict[str, tuple[float, float]]:
    await seed_scope(store)
    request: Doc = {"scopeKey": "list", "limit": 20}
    token = None
    for _ in range(400):  # walk to page ~400 (about 8,000 threads deep)
        page = await store.list_threads({**request, "pageToken": token} if token else request)
        token = page.next_page_token
        assert token is not None
    deep = {**request, "pageToken": token}
    threads = client[store.db_name][store.collection_name]
    out: dict[str, tuple[float, float]] = {}
    for name, req in (("first", request), ("deep", deep)):
        from pai_storage import ListThreadsInput

        plan = store.plan_list(ListThreadsInput.model_validate(req))
        query, hint = store.list_query(plan)

        async def store_list(req: Doc = req) -> None:
            page = await store.list_threads(req)
            assert len(page.items) == 20

        async def raw_list(query: Doc = query, hint: Any = hint) -> None:
            docs = await threads.find(query, sort=LIST_SORT, hint=hint, limit=21).to_list()
            assert len(docs) == 21

        out[name] = await alternate(store_list, raw_list, reps)
        await count(f"list@{name}", store_list, raw_list)
        print(f"  list {name} page: store {out[name][0]:.2f} ms, floor {out[name][1]:.2f} ms")
    return out


async def _throughput(
    store: MongoThreadStore,
    client: AsyncMongoClient[Doc],
    kind: str,
    writers: int,
    seconds: float,
    round_: int,
) -> float:
    transcripts = [Transcript(store, f"tp-{kind}-{writers}-{round_}-{i}") for i in range(writers)]
    for t in transcripts:
        await t.build(10)
        await t.open_turn()
    appenders = [
        t.append if kind == "store" else RawAppender(client, store, t).append for t in transcripts
    ]
    counts = [0] * writers
    deadline = time.perf_counter() + seconds

    async def writer(i: int) -> None:
        while time.perf_counter() < deadline:
            await appenders[i]()
            counts[i] += 1
            if counts[i] % ROTATE == 0:  # a new turn every ROTATE appends (both kinds)
                await transcripts[i].close_turn()
                await transcripts[i].open_turn()

    start = time.perf_counter()
    await asyncio.gather(*(writer(i) for i in range(writers)))
    return sum(counts) / (time.perf_counter() - start)


async def bench_throughput(
    store: MongoThreadStore, client: AsyncMongoClient[Doc], seconds: float, rounds: int
) -> dict[int, tuple[float, float]]:
    """Median rate of ``rounds`` short rounds per side, store and floor rounds alternating."""
    out: dict[int, tuple[float, float]] = {}
    for writers in WRITERS:
        rates: dict[str, list[float]] = {"store": [], "floor": []}
        for round_ in range(rounds):
            order = ("store", "floor") if round_ % 2 == 0 else ("floor", "store")
            for kind in order:
                rates[kind].append(await _throughput(store, client, kind, writers, seconds, round_))
        out[writers] = (statistics.median(rates["store"]), statistics.median(rates["floor"]))
        print(f"  {writers} writers: store {out[writers][0]:.0f}/s, floor {out[writers][1]:.0f}/s")
    return out


# ------------------------------------------------------------------ report


def report(results: dict[str, Any], server: str) -> str:
    append, read, lst, tp = results["append"], results["read"], results["list"], results["tp"]
    lines = [
        f"Server: {server}. Client: PyMongo {results['pymongo']} (asyncio), same host"
        f" ({os.cpu_count()} CPUs; 1-minute load average {results['load'][0]:.1f} before,"
        f" {results['load'][1]:.1f} after — other jobs shared the machine).",
        "Latencies are p50 in ms (store and floor run alternately); throughput in",
        "commits/s (median of 2-second rounds, store and floor rounds alternating).",
        "Floor = the same operation hand-written in raw PyMongo (same collections,",
        "documents and indexes).",
        "",
        "| workload | store | floor | store / floor | commands (store / floor) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]

    def cmds(name: str) -> str:
        store_n, floor_n = COUNTS.get(name, (0, 0))
        return f"{store_n} / {floor_n}"

    for size in SIZES:
        s, f = append[size]
        lines.append(
            f"| append 1 message @ {size:,} | {s:.2f} | {f:.2f} | {s / f:.2f}"
            f" | {cmds(f'append@{size}')} |"
        )
    for size in SIZES:
        s, f = read[size]
        lines.append(
            f"| newest 20 transcript @ {size:,} | {s:.2f} | {f:.2f} | {s / f:.2f}"
            f" | {cmds(f'read@{size}')} |"
        )
    for name in ("first", "deep"):
        s, f = lst[name]
        lines.append(
            f"| list {name} page of 20 (10,000 threads) | {s:.2f} | {f:.2f} | {s / f:.2f}"
            f" | {cmds(f'list@{name}')} |"
        )
    for writers in WRITERS:
        s, f = tp[writers]
        lines.append(f"| commits/s, {writers} writers | {s:.0f} | {f:.0f} | {f / s:.2f} | |")
    small, large = SIZES[0], SIZES[-1]
    lines += [
        "",
        "| size ratio (target < 1.5) | value |",
        "| --- | ---: |",
        f"| append @ {large:,} / @ {small:,} | {append[large][0] / append[small][0]:.2f} |",
        f"| newest 20 @ {large:,} / @ {small:,} | {read[large][0] / read[small][0]:.2f} |",
        f"| deep list page / first page | {lst['deep'][0] / lst['first'][0]:.2f} |",
    ]
    return "\n".join(lines)


def write_docs(table: str, path: Path) -> None:
    """Replace (or append) the top-level ``## MongoDB`` section; nothing else is touched."""
    section = (
        "## MongoDB\n\n"
        "Measured by `python -m bench.mongo_bench --write-docs` (workloads in\n"
        "`bench/mongo_bench.py`). For throughput, store / floor is floor rate / store rate.\n\n"
        f"{table}\n\n"
        "Reading the figures. The size targets hold: an append, a newest-20 read and a\n"
        "list page cost the same at 10 and 10,000 messages (or threads deep); every\n"
        "query is a bounded index range (see `tests/mongo/test_explain.py`). The last\n"
        "column counts the commands one operation sends on each side (PyMongo command\n"
        "monitoring on each side's own client). An append is three on both sides: the\n"
        "store's hold writes the final root at once (its filter compares the whole\n"
        "root the store last saw, its update pipeline takes the commit time from\n"
        "`$$NOW`), then the insert and `commitTransaction`; the relationship rules are\n"
        "checked against the facts kept on the root, so no query follows\n"
        "(`tests/mongo/test_round_trips.py` pins these counts). A newest-20 read is one\n"
        "aggregation in a snapshot session (the root, `$$NOW` and the first page\n"
        "through `$lookup`); the floor reads the root and the page with two `find`s in\n"
        "a snapshot session. A list page is one query on both sides: the store's extra\n"
        "time is the strict validation of each returned root, which the floor skips.\n"
    )
    lines = (path.read_text() if path.exists() else "# Performance\n").splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == "## MongoDB")
    except StopIteration:
        text = "".join(lines).rstrip("\n") + "\n\n" + section
    else:
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        tail = "".join(lines[end:])
        text = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    path.write_text(text)


async def run(args: argparse.Namespace) -> None:
    import pymongo

    mongod = None
    url = args.url
    if url is None:
        mongod = MongodProcess()
        mongod.start()
        url = mongod.url
        server = f"mongod {mongod.version}, single-node replica set, WiredTiger cache 0.25 GB"
    else:
        server = "given server"
    # Each side on its own client, so each side's commands can be counted.
    store_client: AsyncMongoClient[Doc] = AsyncMongoClient(url, event_listeners=[STORE_COMMANDS])
    store = MongoThreadStore(
        client=store_client, db_name="pai_bench", collection_name=f"b{uuid.uuid4().hex[:8]}"
    )
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        url, tz_aware=True, event_listeners=[FLOOR_COMMANDS]
    )
    reps = 40 if args.quick else 200
    try:
        await store.initialize()
        results: dict[str, Any] = {"pymongo": pymongo.version}
        load_before = os.getloadavg()[0]
        print("append:")
        results["append"] = await bench_append(store, client, 30 if args.quick else 200)
        print("read:")
        results["read"] = await bench_read(store, client, reps)
        print("list:")
        results["list"] = await bench_list(store, client, reps)
        print("throughput:")
        results["tp"] = await bench_throughput(store, client, 2.0, 2 if args.quick else 6)
        results["load"] = (load_before, os.getloadavg()[0])
        table = report(results, server)
        print()
        print(table)
        if args.write_docs:
            write_docs(table, Path(args.write_docs))
    finally:
        for name in store.collection_names().values():
            if store._db is not None:
                await store.database.drop_collection(name)  # benchmark-owned collections
        await store.close()
        await store_client.close()
        await client.close()
        if mongod is not None:
            mongod.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a replica set to use (default: a throwaway mongod)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--write-docs",
        nargs="?",
        const=str(DOCS),
        metavar="PATH",
        help="write the section into docs/performance.md (or into PATH)",
    )
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
