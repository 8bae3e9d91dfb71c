"""Benchmark of the PostgreSQL backend against a hand-written asyncpg floor.

One command, prints a table::

    .venv/bin/python bench/postgres_bench.py [--url postgresql://postgres@127.0.0.1/test]

Measured (median latency unless stated), each next to the *floor*: the same
SQL statements issued directly through asyncpg with precomputed JSON, i.e.
what the store costs beyond the database itself:

- append one message to a thread holding 10, 1,000 and 10,000 messages;
- read the newest 20 transcript messages of those threads;
- list the first page and a deep page (past 9,000 threads) of 20 threads in a
  scope holding 10,000;
- commit throughput with 1, 8 and 32 concurrent writers on different threads
  (five alternating store/floor rounds, the median of each side).

Transcripts are built as turns: per run, one user input message and one
assistant output message, the run completed. Everything lives in a throwaway
schema that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.statements import hold_statement, write_statement
from pai_storage_postgres.store import SESSION_SETTINGS, keep_session

from pai_storage import CommittedResult, ThreadVersion, make_url
from pai_storage import builders as b
from pai_storage.backend import timestamp_ms

SCOPE = "bench"
FLOOR_SCOPE = "bench-floor"  # the floor writes root rows the store would not; keep them apart
SIZES = (10, 1_000, 10_000)
THREADS_IN_SCOPE = 10_000
ROUNDS = 5
"""Alternating store/floor rounds of each throughput run (median rate per side)."""


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


async def build_thread(
    store: PostgresThreadStore, thread_id: str, messages: int, scope: str = SCOPE
) -> ThreadVersion:
    turns = messages // 2
    result = await store.commit_thread(b.create(scope, thread_id))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    version = result.thread.version
    batch = 50
    for start in range(0, turns, batch):
        changes: dict[str, list[dict[str, Any]]] = {"messages": [], "runs": []}
        for n in range(start, min(turns, start + batch)):
            one = turn(n)
            changes["messages"] += one["messages"]
            changes["runs"] += one["runs"]
        result = await store.commit_thread(
            b.update_at(scope, thread_id, version, changes, root=b.root())
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        version = result.thread.version
    return version


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(fn: Callable[[], Awaitable[Any]], n: int, warmup: int = 10) -> float:
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return median_ms(samples)


async def close_and_drop(
    pool: asyncpg.Pool, store: PostgresThreadStore, dsn: str, schema: str
) -> None:
    """Close the floor's pool and the store, and drop the throwaway schema."""
    await pool.close()
    await store.close()
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    await conn.close()


# ---------------------------------------------------------------- the floor


class Floor:
    """The store's statements, hand-written on raw asyncpg with precomputed JSON."""

    def __init__(self, pool: asyncpg.Pool, store: PostgresThreadStore) -> None:
        self.pool = pool
        self.t = store.tables
        self.store = store
        t = self.t
        # Statements made once, as a hand-written application keeps them: the
        # store's hold (the root locked, the clock after the lock, its facts and
        # the named message by id) and its write (the root with the facts, the
        # insert and the watchers' NOTIFY in one statement).
        messages = store._layout.families["messages"]
        self.hold_sql = hold_statement(t.threads, (("messages", t.messages, "message_id"),))
        self.write_sql = write_statement(t.threads, ((messages, False),), True)
        self.revisions: dict[str, int] = {}  # the floor's threads are its own
        self.read_sql = store.head_page_statement("messages", "newest", "transcript")
        self.doc = json.dumps(
            b.message("x", "answer " * 40, role="assistant")
            | {"createdAt": "2030-01-01T00:00:00.000Z", "updatedAt": "2030-01-01T00:00:00.000Z"},
            separators=(",", ":"),
        )

    async def append(self, thread_id: str) -> None:
        scope, thread = FLOOR_SCOPE.encode(), thread_id.encode()
        message_id = uuid.uuid4().hex.encode()
        async with self.pool.acquire() as conn:
            await conn.execute("BEGIN")
            rows = await conn.fetch(self.hold_sql, scope, thread, [message_id])
            row = rows[0]
            now = row["now"]
            position = row["messages_next"]
            revision = self.revisions[thread_id] = self.revisions.get(thread_id, 1) + 1
            await conn.execute(
                self.write_sql,
                scope,
                thread,
                revision,
                "visible",
                None,
                now,
                -timestamp_ms(now),
                position + 1,
                row["runs_next"],
                row["queued_next"],
                row["doc"],
                row["facts"],
                "pai_bench_floor",
                "{}",
                [position],
                [message_id],
                [None],
                [None],
                [True],
                [True],
                [self.doc],
            )
            await conn.execute("COMMIT")

    async def read_newest(self, thread_id: str) -> list[Any]:
        # The store's one-statement read of the root and one page: no transaction.
        scope, thread = SCOPE.encode(), thread_id.encode()
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(self.read_sql, scope, thread, 0, 2**63 - 1, 21)
        page = []
        for r in rows:
            if r["position"] is None:
                json.loads(r["doc"])
            else:
                page.append((r["position"], json.loads(r["doc"])))
        page.sort(key=lambda item: item[0], reverse=True)
        return [doc for _, doc in page]

    async def list_page(self, cursor: tuple[int, bytes] | None) -> list[Any]:
        sql = self.store.list_statement(False, False, False, "visible", cursor is not None)
        args: list[Any] = [SCOPE.encode(), 21]
        if cursor is not None:
            args.extend(cursor)
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(sql, *args)
        return [json.loads(r["doc"]) for r in rows]


# ---------------------------------------------------------------- measurements


async def interleaved(
    cases: dict[tuple[str, int], Callable[[], Awaitable[Any]]], n: int, warmup: int = 10
) -> dict[tuple[str, int], float]:
    """Median milliseconds of each case, run round-robin ``n`` times after a warm-up."""
    samples: dict[tuple[str, int], list[float]] = {key: [] for key in cases}
    for i in range(warmup + n):
        for key, fn in cases.items():
            t0 = time.perf_counter()
            await fn()
            if i >= warmup:
                samples[key].append(time.perf_counter() - t0)
    return {key: median_ms(values) for key, values in samples.items()}


async def throughput(fn: Callable[[int], Awaitable[Any]], writers: int, seconds: float) -> float:
    stop = time.perf_counter() + seconds
    counts = [0] * writers

    async def worker(i: int) -> None:
        while time.perf_counter() < stop:
            await fn(i)
            counts[i] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(writers)))
    return sum(counts) / (time.perf_counter() - t0)


async def explain_nodes(pool: asyncpg.Pool, sql: str, args: list[Any]) -> str:
    async with pool.acquire() as conn:
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    names: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        label = node["Node Type"]
        if "Index Name" in node:
            label += f" using {node['Index Name'].rsplit('_list_', 1)[-1]}"
        names.append(label)
        for child in node.get("Plans", ()):
            walk(child)

    walk(json.loads(raw)[0]["Plan"])
    return " > ".join(names)


async def main(url: str, quick: bool) -> None:
    schema = f"pai_bench_{uuid.uuid4().hex[:10]}"
    dsn = make_url(url).render(hide_password=False, scheme="postgresql")
    store = PostgresThreadStore(url, schema=schema, max_pool_size=40)
    await store.initialize()
    pool = await asyncpg.create_pool(
        dsn, min_size=4, max_size=40, server_settings=dict(SESSION_SETTINGS), reset=keep_session
    )
    floor = Floor(pool, store)
    rows: list[tuple[str, str, str, str]] = []
    n = 60 if quick else 200
    started = time.perf_counter()
    try:
        print(f"building transcripts {SIZES} and {THREADS_IN_SCOPE} threads ...", file=sys.stderr)
        versions = {}
        for size in SIZES:
            versions[size] = await build_thread(store, f"t{size}", size)
            await build_thread(store, f"floor{size}", size, FLOOR_SCOPE)
        await _fill_scope(store)
        async with pool.acquire() as conn:
            for table in (store.tables.threads, store.tables.messages, store.tables.runs):
                await conn.execute(f"VACUUM ANALYZE {table}")

        # 1. append one message; 2. newest 20 transcript messages. Sizes, store
        # and floor are interleaved so drift (autovacuum, checkpoints) hits all alike.
        sized = {size: versions[size] for size in SIZES}

        async def append(size: int) -> None:
            msg = b.message(uuid.uuid4().hex, "answer " * 40, role="assistant")
            result = await store.commit_thread(
                b.update_at(
                    SCOPE, f"t{size}", sized[size], {"messages": [b.insert(msg)]}, root=b.root()
                )
            )
            assert isinstance(result, CommittedResult)
            assert result.thread is not None
            sized[size] = result.thread.version

        async def read(size: int) -> None:
            result = await store.read_thread(
                b.read(
                    SCOPE,
                    f"t{size}",
                    messages={
                        "type": "page",
                        "view": "transcript",
                        "order": "newest",
                        "page": {"limit": 20},
                    },
                )
            )
            assert result.messages is not None

        cases: dict[tuple[str, int], Callable[[], Awaitable[Any]]] = {}
        for size in SIZES:
            cases[("append", size)] = lambda size=size: append(size)
            cases[("append-floor", size)] = lambda size=size: floor.append(f"floor{size}")
            cases[("read", size)] = lambda size=size: read(size)
            cases[("read-floor", size)] = lambda size=size: floor.read_newest(f"t{size}")
        med = await interleaved(cases, n)
        for kind, label in (("append", "append 1 message"), ("read", "read newest 20")):
            for size in SIZES:
                ours, base = med[(kind, size)], med[(f"{kind}-floor", size)]
                rows.append(
                    (
                        f"{label} @ {size:,}",
                        f"{ours:.2f} ms",
                        f"{base:.2f} ms",
                        f"{ours / base:.2f}x",
                    )
                )
            ratio = med[(kind, 10_000)] / med[(kind, 10)]
            rows.append((f"{label}: 10,000 / 10", f"{ratio:.2f}", "", "target < 1.5"))

        # 3. list first and deep page of 20 in a scope of 10,000
        first = {"scopeKey": SCOPE, "limit": 20}
        token = None
        deep_cursor: tuple[int, bytes] | None = None
        pages = 0
        while pages < 450:
            page = await store.list_threads({**first, "pageToken": token} if token else first)
            token = page.next_page_token
            pages += 1
            last = page.items[-1]
            deep_cursor = (-timestamp_ms(last.updated_at), last.thread_id.encode())
        deep = {**first, "pageToken": token}
        lists = await interleaved(
            {
                ("first", 0): lambda: store.list_threads(first),
                ("deep", 0): lambda: store.list_threads(deep),
                ("floor-first", 0): lambda: floor.list_page(None),
                ("floor-deep", 0): lambda: floor.list_page(deep_cursor),
            },
            n,
        )
        list_first, list_deep = lists[("first", 0)], lists[("deep", 0)]
        floor_first, floor_deep = lists[("floor-first", 0)], lists[("floor-deep", 0)]
        rows.append(
            (
                "list first page of 20",
                f"{list_first:.2f} ms",
                f"{floor_first:.2f} ms",
                f"{list_first / floor_first:.2f}x",
            )
        )
        rows.append(
            (
                f"list deep page (#{pages + 1}) of 20",
                f"{list_deep:.2f} ms",
                f"{floor_deep:.2f} ms",
                f"{list_deep / floor_deep:.2f}x",
            )
        )
        rows.append(
            ("list ratio deep / first", f"{list_deep / list_first:.2f}", "", "target < 1.5")
        )
        plan = await explain_nodes(
            pool,
            store.list_statement(False, False, False, "visible", True),
            [SCOPE.encode(), 21, *(deep_cursor or ())],
        )

        # 4. throughput, writers on different threads
        seconds = 2.0 if quick else 4.0
        for writers in (1, 8, 32):
            tids = [f"w{writers}-{i}" for i in range(writers)]
            fids = [f"fw{writers}-{i}" for i in range(writers)]
            state: dict[str, ThreadVersion] = {}
            for tid in tids + fids:
                scope = FLOOR_SCOPE if tid.startswith("f") else SCOPE
                state[tid] = await build_thread(store, tid, 10, scope)

            async def commit(
                i: int, tids: list[str] = tids, state: dict[str, ThreadVersion] = state
            ) -> None:
                tid = tids[i]
                msg = b.message(uuid.uuid4().hex, "answer " * 40, role="assistant")
                result = await store.commit_thread(
                    b.update_at(
                        SCOPE, tid, state[tid], {"messages": [b.insert(msg)]}, root=b.root()
                    )
                )
                assert isinstance(result, CommittedResult)
                assert result.thread is not None
                state[tid] = result.thread.version

            # Alternating rounds, the median of each side: background load
            # drifts over seconds and must hit store and floor alike.
            rates: dict[str, list[float]] = {"ours": [], "base": []}
            for _ in range(ROUNDS):
                rates["ours"].append(await throughput(commit, writers, seconds / ROUNDS))
                rates["base"].append(
                    await throughput(
                        lambda i, fids=fids: floor.append(fids[i]), writers, seconds / ROUNDS
                    )
                )
            ours = statistics.median(rates["ours"])
            base = statistics.median(rates["base"])
            rows.append(
                (
                    f"commits/s, {writers} writer(s)",
                    f"{ours:,.0f}/s",
                    f"{base:,.0f}/s",
                    f"{base / ours:.2f}x",
                )
            )
    finally:
        await close_and_drop(pool, store, dsn, schema)

    server = store._server_version or "PostgreSQL"
    print(
        f"\npai-storage PostgreSQL benchmark — {server}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"median of {n} runs per latency, {time.perf_counter() - started:.0f} s total\n"
    )
    widths = [max(len(r[i]) for r in [*rows, HEADER]) for i in range(4)]
    for r in [HEADER, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    print(f"\nEXPLAIN of the deep list page: {plan}")


HEADER = ("measurement", "pai-storage", "asyncpg floor", "vs floor")


async def _fill_scope(store: PostgresThreadStore) -> None:
    async def one(i: int) -> None:
        await store.commit_thread(
            b.create(SCOPE, f"list-{i:05d}", {"messages": [b.insert(b.message("m1", "hi"))]})
        )

    sem = asyncio.Semaphore(16)

    async def guarded(i: int) -> None:
        async with sem:
            await one(i)

    await asyncio.gather(*(guarded(i) for i in range(THREADS_IN_SCOPE)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.quick))
