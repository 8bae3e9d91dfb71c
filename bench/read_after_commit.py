"""What a PostgreSQL newest-20 read costs right after a commit, and why.

::

    .venv/bin/python -m bench.read_after_commit [--url URL] [--n 300]

``bench.physical_floor`` interleaves each side's append, turn and read, so
every timed read of the store follows one of its commits. This runs that same
interleaving four times; each time, after every commit of the store, one
untimed step prepares its next read:

- *nothing*: as ``bench.physical_floor`` runs;
- *decode*: the thread's root and newest page fetched by hand and decoded by
  the codec (the records the commit wrote are then decoded);
- *other read*: the store reads another thread (its read code has just run;
  the new records are still to decode);
- *same read*: the store reads the same thread (both).

Printed: the store's read and the physical floor's read (median ms) and their
ratio, for each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pai_storage import codec, make_url
from pai_storage.models import Message, ThreadRecord

from .physical_floor import SCOPE, PgPhysical, StoreSide, build

PREPARATIONS = ("nothing", "decode", "other read", "same read")


async def run(url: str, n: int) -> None:
    import asyncpg  # type: ignore[import-untyped]
    from pai_storage_postgres import PostgresThreadStore
    from pai_storage_postgres.client import SESSION_SETTINGS, keep_session

    schema = f"pai_bench_{uuid.uuid4().hex[:10]}"
    dsn = make_url(url).render(hide_password=False, scheme="postgresql")
    store = PostgresThreadStore(url, schema=schema, max_pool_size=4)
    await store.initialize()
    pool = await asyncpg.create_pool(
        dsn, min_size=2, max_size=4, server_settings=dict(SESSION_SETTINGS), reset=keep_session
    )
    try:
        side = StoreSide(store, "store", await build(store, "store"))
        other = StoreSide(store, "other", await build(store, "other"))
        await build(store, "physical")
        floor = PgPhysical(pool, store.tables, "physical", "store")
        await floor.start()

        async def decode() -> None:
            async with pool.acquire() as conn:
                rows = await conn.fetch(floor.read_sql, SCOPE.encode(), b"store")
            for row in rows:
                codec.decode(ThreadRecord if row["position"] is None else Message, row["doc"])

        prepare: dict[str, Callable[[], Awaitable[Any]] | None] = {
            "nothing": None,
            "decode": decode,
            "other read": other.read,
            "same read": side.read,
        }
        print(f"{'after each store commit':<24} {'store read':>10} {'floor read':>10} {'ratio':>6}")
        for name in PREPARATIONS:
            store_ms, floor_ms = await interleaved(side, floor, prepare[name], n)
            print(f"{name:<24} {store_ms:10.3f} {floor_ms:10.3f} {store_ms / floor_ms:5.2f}x")
    finally:
        async with pool.acquire() as conn:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await pool.close()
        await store.close()


async def interleaved(
    side: StoreSide,
    floor: PgPhysical,
    prepare: Callable[[], Awaitable[Any]] | None,
    n: int,
    warmup: int = 10,
) -> tuple[float, float]:
    """Median ms of the store's and the floor's reads, in ``bench.physical_floor``'s
    rotation of both sides' append, turn and read."""
    cases: dict[str, Callable[[], Awaitable[Any]]] = {
        "store append": side.append,
        "store turn": side.turn,
        "store read": side.read,
        "floor append": floor.append,
        "floor turn": floor.turn,
        "floor read": floor.read,
    }
    samples: dict[str, list[float]] = {"store read": [], "floor read": []}
    keys = list(cases)
    for i in range(warmup + n):
        shift = i % len(keys)
        for key in keys[shift:] + keys[:shift]:
            t0 = time.perf_counter()
            await cases[key]()
            elapsed = time.perf_counter() - t0
            if i >= warmup and key in samples:
                samples[key].append(elapsed)
            if prepare is not None and key in ("store append", "store turn"):
                await prepare()
    return (
        statistics.median(samples["store read"]) * 1000,
        statistics.median(samples["floor read"]) * 1000,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(run(args.url, args.n))
