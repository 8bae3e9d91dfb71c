"""Benchmark of the SQL runtime stores on SQLite against raw aiosqlite running the same statements.

One command, prints a table::

    .venv/bin/python bench/sql_runtime_bench.py [--quick] [--dir /tmp]

Each operation is timed next to its *floor*: the very statements the store
sent for that operation, recorded at the driver (every call into aiosqlite,
transaction control included) on a copy of the database, and replayed in the
same order through bare aiosqlite connections (a writer and a reader, same
pragmas): one trip to the driver's thread per statement
(``execute_fetchall``), parameters precomputed. The floor does the work any
hand-written store must do with what it reads: ``json.loads`` of every JSON
value, SHA-256 of a snapshot's data on put and of what a snapshot read
returns. The ratio is what the store costs beyond SQLite and the driver thread
(argument checks, canonical JSON, hashing, model building, page tokens, the
guard's watchdog task, SQLAlchemy's execution layer). Store and floor
alternate call by call; medians reported:

- key-value get, put and put_if_version of one small item;
- key-value search, first page of 20, under a namespace prefix holding 100
  and one holding 100,000 items (the large prefix inserted straight into the
  table with one ``executemany``; the loading time is printed);
- agent-state save of one value, and append of one item to a list of 10 and
  to a list of 10,000 items (each list grows by one item per sample);
- snapshot put and get of 1 MiB;
- guard acquire + release of a free resource.

Targets: every ratio within 1.5x of the floor, and the size-growth ratios
(search at 100,000 / at 100 items, append at 10,000 / at 10 items) within
1.5x too; the command exits with status 1 when one is missed. Each database
is a fresh file under ``--dir``, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pai_storage_sql import (
    SqlAgentStateStore,
    SqlClient,
    SqlExecutionGuard,
    SqlKeyValueStore,
    SqlSnapshotStore,
)
from sqlalchemy import insert

from pai_storage import Item
from pai_storage.backend import namespace_path
from pai_storage.runtime import canonical_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.sql_bench import Floor, Recorder, Statement, machine

TARGET = 1.5
SMALL, LARGE, PAGE = 100, 100_000, 20
WARMUP = 5
VALUE = {"title": "a benchmark item", "tags": ["x", "y"], "score": 1.5}
USER, SESSION = "bench-user", "bench-session"


class Stores:
    """The four runtime stores on one client."""

    def __init__(self, path: Path) -> None:
        self.client = SqlClient(f"sqlite:///{path}")
        self.kv = SqlKeyValueStore(client=self.client)
        self.state = SqlAgentStateStore(client=self.client)
        self.snapshots = SqlSnapshotStore(client=self.client)
        self.guard = SqlExecutionGuard(client=self.client)

    async def __aenter__(self) -> Stores:
        for store in (self.kv, self.state, self.snapshots, self.guard):
            await store.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for store in (self.kv, self.state, self.snapshots, self.guard):
            await store.close()
        await self.client.close()


class RuntimeFloor(Floor):
    """The recorded statements on bare aiosqlite, decoding what they read."""

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
                for row in await conn.execute_fetchall(sql, params):
                    for value in row:
                        decode(value)


def decode(value: object) -> None:
    """What a hand-written store does with a value it read: JSON parsed, blobs hashed."""
    if isinstance(value, bytes | str):
        head = value[:1]
        if head in (b"{", b"[", "{", "["):
            with contextlib.suppress(ValueError):  # a binary key or digest like JSON
                json.loads(value)
        elif isinstance(value, bytes) and len(value) >= 4096:
            hashlib.sha256(value).digest()


Operation = Callable[[], Awaitable[Any]]


class Plan:
    """One timed operation: the store's call and how many samples of it are recorded."""

    def __init__(
        self,
        name: str,
        make: Callable[[Stores], Operation],
        write: bool,
        floor_extra: Callable[[], Any] | None = None,
        prepare: Callable[[Stores], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.make = make
        self.write = write
        self.floor_extra = floor_extra
        self.prepare = prepare
        """Run before the samples are recorded or timed (neither recorded nor timed)."""


def plans(data: bytes, large: int) -> list[Plan]:
    """The operations, in the order they are recorded and timed (each may depend on
    the state the ones before it left)."""
    ns = ("bench", "kv")
    out = [
        Plan("kv get", lambda s: lambda: s.kv.get(ns, "item"), False),
        Plan("kv put", lambda s: lambda: s.kv.put(ns, "item", VALUE), True),
    ]

    version: dict[int, int] = {}

    async def current(s: Stores) -> None:
        found = await s.kv.get(ns, "item")
        assert found is not None
        version[id(s)] = found.version

    def cas(s: Stores) -> Operation:
        async def run() -> None:
            done = await s.kv.put_if_version(ns, "item", VALUE, version[id(s)])
            assert isinstance(done, Item)
            version[id(s)] = done.version

        return run

    out.append(Plan("kv put_if_version", cas, True, prepare=current))
    for prefix, count in (("small", SMALL), ("big", large)):

        def search(s: Stores, prefix: str = prefix) -> Operation:
            async def run() -> None:
                page = await s.kv.search((prefix,), limit=PAGE)
                assert len(page.items) == PAGE
                assert page.next_page_token

            return run

        out.append(Plan(f"kv search page at {count:,}", search, False))
    out.append(
        Plan("state save", lambda s: lambda: s.state.save(USER, SESSION, "value", VALUE), True)
    )
    for size in (10, 10_000):
        item = {"i": -1, "text": "an appended item"}
        out.append(
            Plan(
                f"state append to {size:,} items",
                lambda s, size=size, item=item: (
                    lambda: s.state.append_list(USER, SESSION, f"list-{size}", [item])
                ),
                True,
            )
        )
    out.append(
        Plan(
            "snapshot put 1 MiB",
            lambda s: lambda: s.snapshots.put("bench", "one-mib", data),
            True,
            floor_extra=lambda: hashlib.sha256(data).digest(),
        )
    )
    out.append(
        Plan("snapshot get 1 MiB", lambda s: lambda: s.snapshots.get("bench", "one-mib"), False)
    )

    def lock(s: Stores) -> Operation:
        async def run() -> None:
            held = await s.guard.try_acquire("free", owner="bench")
            assert held is not None
            await held.release()

        return run

    out.append(Plan("guard acquire + release", lock, True))
    return out


async def seed(path: Path, large: int, data: bytes) -> float:
    """The base database: the searched prefixes, the lists, the item, the snapshot.
    Returns the seconds the large prefix took to load."""
    async with Stores(path) as s:
        await s.kv.put(("bench", "kv"), "item", VALUE)
        for i in range(SMALL):
            await s.kv.put(("small", "docs"), f"k{i:06d}", VALUE)
        # The large prefix: rows as the store writes them, one executemany.
        text = canonical_json(VALUE)
        now = datetime.now(UTC).replace(microsecond=0)
        rows = [
            s.kv._values(
                _sk(("big", "docs"), f"k{i:06d}"),
                ("big", "docs"),
                f"k{i:06d}",
                text,
                None,
                now,
                os.urandom(16),
            )
            for i in range(large)
        ]
        engines = await s.client.ready()
        started = time.perf_counter()
        async with engines.writer.begin() as conn:
            await conn.execute(insert(s.kv.table), rows)
        loaded = time.perf_counter() - started
        for size in (10, 10_000):
            items = [{"i": i, "text": "an item of the list"} for i in range(size)]
            await s.state.save_list(USER, SESSION, f"list-{size}", items)
        await s.snapshots.put("bench", "one-mib", data)
    return loaded


def _sk(namespace: tuple[str, ...], key: str) -> bytes:
    from pai_storage_sql.runtime_tables import sort_key

    return sort_key(namespace_path(namespace), key)


async def opened(s: Stores) -> None:
    """Open the writer and a reader connection (their pragmas run) without writing."""
    async with s.client.write():
        pass
    await s.kv.get(("bench", "kv"), "item")


async def timed(store: Operation, floor: Operation, n: int) -> tuple[float, float]:
    """Median milliseconds of ``n`` calls of each side after ``WARMUP`` untimed ones,
    alternating call by call."""
    for _ in range(WARMUP):
        await store()
        await floor()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for side, fn in enumerate((store, floor)):
            t0 = time.perf_counter()
            await fn()
            samples[side].append(time.perf_counter() - t0)
    return statistics.median(samples[0]) * 1000, statistics.median(samples[1]) * 1000


async def run(work: Path, n: int, large: int) -> bool:
    data = os.urandom(1024 * 1024)
    base = work / "base.db"
    print(f"loading {SMALL + large:,} key-value items ...", file=sys.stderr)
    loaded = await seed(base, large, data)
    for name in ("store", "record", "floor"):
        shutil.copy(base, work / f"{name}.db")
    todo = plans(data, large)

    # The statements of every sample, recorded on a copy, in the order they are timed.
    recorded: dict[str, list[list[Statement]]] = {}
    async with Stores(work / "record.db") as s:
        await opened(s)
        recorder = Recorder()
        recorder.attach()
        try:
            for plan in todo:
                if plan.prepare is not None:
                    recorder.detach()
                    await plan.prepare(s)
                    recorder.attach()
                operation = plan.make(s)
                recorded[plan.name] = [await recorder.record(operation) for _ in range(WARMUP + n)]
        finally:
            recorder.detach()

    rows: list[tuple[str, float, float, int]] = []
    floor = RuntimeFloor(str(work / "floor.db"))
    await floor.open()
    try:
        async with Stores(work / "store.db") as s:
            await opened(s)
            for plan in todo:
                if plan.prepare is not None:
                    await plan.prepare(s)
                sequences = iter(recorded[plan.name])
                extra = plan.floor_extra

                async def floor_op(
                    sequences: Any = sequences, write: bool = plan.write, extra: Any = extra
                ) -> None:
                    if extra is not None:
                        extra()
                    await floor.replay(next(sequences), write=write)

                store_ms, floor_ms = await timed(plan.make(s), floor_op, n)
                trips = len(recorded[plan.name][0])
                rows.append((plan.name, store_ms, floor_ms, trips))
    finally:
        await floor.close()

    print(f"\nSQLite runtime stores vs aiosqlite floor (median of {n})\n")
    print(f"| {'operation':<30} | {'store':>9} | {'floor':>9} | {'ratio':>6} | stmts | target |")
    print(f"|{'-' * 32}|{'-' * 11}|{'-' * 11}|{'-' * 8}|-------|--------|")
    failed = False
    by_name: dict[str, float] = {}
    for name, store_ms, floor_ms, trips in rows:
        ratio = store_ms / floor_ms
        ok = ratio <= TARGET
        failed |= not ok
        by_name[name] = store_ms
        print(
            f"| {name:<30} | {store_ms:>6.3f} ms | {floor_ms:>6.3f} ms | {ratio:>5.2f}x | "
            f"{trips:>5} | {'ok' if ok else 'MISSED':>6} |"
        )
    print(
        "\nratio: store / floor latency; target <= 1.5x; stmts: statements per operation "
        "(transaction control included)"
    )
    print(
        f"\n| {'size growth (store)':<36} | {'large':>9} | {'small':>9} | {'ratio':>6} | target |"
    )
    print(f"|{'-' * 38}|{'-' * 11}|{'-' * 11}|{'-' * 8}|--------|")
    for label, big, small in (
        (
            f"kv search page: {large:,} / {SMALL} items",
            by_name[f"kv search page at {large:,}"],
            by_name[f"kv search page at {SMALL}"],
        ),
        (
            "state append: 10,000 / 10 items",
            by_name["state append to 10,000 items"],
            by_name["state append to 10 items"],
        ),
    ):
        ratio = big / small
        ok = ratio <= TARGET
        failed |= not ok
        print(
            f"| {label:<36} | {big:>6.3f} ms | {small:>6.3f} ms | {ratio:>5.2f}x | "
            f"{'ok' if ok else 'MISSED':>6} |"
        )
    print(
        f"\nloaded {large:,} key-value rows with one executemany in {loaded:.2f} s "
        "(straight into the table, not through the store)"
    )
    return not failed


async def main(directory: str, quick: bool) -> None:
    n = 40 if quick else 200
    large = 10_000 if quick else LARGE
    work = Path(tempfile.mkdtemp(prefix="pai-sql-runtime-bench-", dir=directory))
    print(machine(), file=sys.stderr)
    try:
        ok = await run(work, n, large)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print(f"after: {machine()}", file=sys.stderr)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, a smaller prefix")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the databases go")
    args = parser.parse_args()
    asyncio.run(main(args.dir, args.quick))
