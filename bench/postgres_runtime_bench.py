"""Benchmark of the PostgreSQL snapshot store and execution guard against an asyncpg floor.

One command, prints a table::

    .venv/bin/python bench/postgres_runtime_bench.py [--url postgresql://...] [--quick]

Each operation is timed next to its *floor*: the same SQL statements (the
stores' own ``Statements``) issued directly through asyncpg on a pool with the
same settings, so the ratio is what the store costs beyond the database
(argument checks, SHA-256 of the data on put and on every read, model
building, the guard's watchdog task). Samples of the store and the floor are
interleaved, medians reported:

- snapshot put and get of 1 MiB;
- guard acquire + release of a free resource;
- 32 workers contending for 4 locks (retry every 5 ms): acquisitions per
  second, each holder checked against a log of fencing tokens.

Everything lives in a throwaway schema that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from pai_storage_postgres.client import SESSION_SETTINGS, PgClient, keep_session
from pai_storage_postgres.guard import PostgresExecutionGuard
from pai_storage_postgres.guard import Statements as GuardStatements
from pai_storage_postgres.snapshots import PostgresSnapshotStore
from pai_storage_postgres.snapshots import Statements as SnapshotStatements

DEFAULT_URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
TARGET = 1.5
RETRY = timedelta(milliseconds=5)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def interleaved(
    pairs: dict[str, Callable[[], Awaitable[Any]]], n: int, warmup: int = 5
) -> dict[str, float]:
    """Run each callable ``n`` times, round-robin, and return median milliseconds."""
    for fn in pairs.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {key: [] for key in pairs}
    for _ in range(n):
        for key, fn in pairs.items():
            start = time.perf_counter()
            await fn()
            samples[key].append(time.perf_counter() - start)
    return {key: median_ms(values) for key, values in samples.items()}


def check_log(log: list[tuple[str, str, int]]) -> None:
    """No two holders of a resource at once; fencing tokens increase per resource."""
    holder: dict[str, int | None] = {}
    last: dict[str, int] = {}
    for event, resource, token in log:
        if event == "enter":
            if holder.get(resource) is not None or token <= last.get(resource, 0):
                raise SystemExit(f"two holders or a stale token on {resource}: {token}")
            holder[resource] = last[resource] = token
        else:
            holder[resource] = None


async def contention(
    acquire: Callable[[str], Awaitable[tuple[int, Callable[[], Awaitable[Any]]] | None]],
    seconds: float,
) -> float:
    """32 workers on 4 resources for ``seconds``: acquisitions per second."""
    log: list[tuple[str, str, int]] = []
    deadline = time.perf_counter() + seconds
    count = 0

    async def worker(n: int) -> None:
        nonlocal count
        i = 0
        while time.perf_counter() < deadline:
            resource = f"contended-{(n + i) % 4}"
            got = await acquire(resource)
            if got is None:
                await asyncio.sleep(RETRY.total_seconds())
                continue
            token, release = got
            log.append(("enter", resource, token))
            log.append(("exit", resource, token))
            await release()
            count += 1
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(32)))
    elapsed = time.perf_counter() - started
    check_log(log)
    return count / elapsed


async def main(url: str, quick: bool) -> None:
    schema = f"pai_rtbench_{uuid.uuid4().hex[:8]}"
    n = 40 if quick else 200
    seconds = 2.0 if quick else 5.0
    client = PgClient(url, schema=schema, max_pool_size=10)
    snapshots = PostgresSnapshotStore(client=client)
    guard = PostgresExecutionGuard(client=client, retry_interval=RETRY)
    dsn = client.url.render(hide_password=False, scheme="postgresql")
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=10, server_settings=dict(SESSION_SETTINGS), reset=keep_session
    )
    rows: list[tuple[str, float, float, str]] = []
    try:
        await snapshots.initialize()
        await guard.initialize()
        t = client.tables
        snap_sql = SnapshotStatements(t.snapshots)
        guard_sql = GuardStatements(t)
        data = os.urandom(1024 * 1024)
        ttl_us = 30 * 86_400 * 1_000_000
        await snapshots.put("bench", "store-1mib", data)

        async def floor_put() -> None:
            async with pool.acquire() as conn, conn.transaction():
                await conn.fetchval(
                    snap_sql.put, None, b"bench", b"floor-1mib", ttl_us, len(data), "x", "{}", data
                )

        async def floor_get() -> None:
            async with pool.acquire() as conn:
                await conn.fetchrow(snap_sql.get, None, b"bench", b"floor-1mib")

        async def store_get() -> None:
            await snapshots.get("bench", "store-1mib")

        put = await interleaved(
            {
                "store": lambda: snapshots.put("bench", "store-1mib", data),
                "floor": floor_put,
            },
            n,
        )
        rows.append(("snapshot put 1 MiB", put["store"], put["floor"], "ms"))
        got = await interleaved({"store": store_get, "floor": floor_get}, n)
        rows.append(("snapshot get 1 MiB", got["store"], got["floor"], "ms"))

        free_key = guard._lock_key(b"free-floor")
        lock_keys = {
            f"contended-{i}-floor".encode(): guard._lock_key(f"contended-{i}-floor".encode())
            for i in range(4)
        }

        async def store_lock() -> None:
            lock = await guard.try_acquire("free", owner="bench")
            assert lock is not None
            await lock.release()

        async def floor_lock() -> None:
            token = uuid.uuid4().hex
            async with pool.acquire() as conn:
                row = await conn.fetchrow(
                    guard_sql.acquire, None, 1_800_000_000, b"free-floor", token, "bench", free_key
                )
                assert row is not None
            async with pool.acquire() as conn:
                await conn.fetchrow(guard_sql.release, None, b"free-floor", token)

        lock = await interleaved({"store": store_lock, "floor": floor_lock}, n)
        rows.append(("guard acquire + release", lock["store"], lock["floor"], "ms"))

        async def store_acquire(resource: str) -> tuple[int, Callable[[], Awaitable[Any]]] | None:
            held = await guard.try_acquire(resource, owner="w")
            return None if held is None else (held.fencing_token, held.release)

        async def floor_acquire(resource: str) -> tuple[int, Callable[[], Awaitable[Any]]] | None:
            token = uuid.uuid4().hex
            key = (resource + "-floor").encode()
            async with pool.acquire() as conn:
                row = await conn.fetchrow(
                    guard_sql.acquire, None, 1_800_000_000, key, token, "w", lock_keys[key]
                )
            if row is None:
                return None

            async def release() -> None:
                async with pool.acquire() as conn:
                    await conn.fetchrow(guard_sql.release, None, key, token)

            return int(row["fencing_token"]), release

        store_rate = await contention(store_acquire, seconds)
        floor_rate = await contention(floor_acquire, seconds)
        rows.append(("32 workers / 4 locks", store_rate, floor_rate, "acq/s"))
    finally:
        await snapshots.close()
        await guard.close()
        async with pool.acquire() as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await pool.close()

    print(
        f"\nPostgreSQL runtime stores vs asyncpg floor (median of {n}; throughput {seconds:g} s)\n"
    )
    print(f"| {'operation':<26} | {'store':>10} | {'floor':>10} | {'ratio':>6} | target |")
    print(f"|{'-' * 28}|{'-' * 12}|{'-' * 12}|{'-' * 8}|--------|")
    failed = False
    for name, store, floor, unit in rows:
        ratio = floor / store if unit == "acq/s" else store / floor
        ok = ratio <= TARGET
        failed |= not ok
        shown = f"{store:.0f} {unit}" if unit == "acq/s" else f"{store:.3f} ms"
        base = f"{floor:.0f} {unit}" if unit == "acq/s" else f"{floor:.3f} ms"
        print(
            f"| {name:<26} | {shown:>10} | {base:>10} | {ratio:>5.2f}x | "
            f"{'ok' if ok else 'MISSED':>6} |"
        )
    print("\nratio: store / floor latency (floor / store for throughput); target <= 1.5x")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter runs")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.quick))
