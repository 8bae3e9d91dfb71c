"""Client CPU time of PostgreSQL reads and list pages against the asyncpg floor.

Wall-clock latency on a shared machine is noisy; the client process's CPU time
per operation is not, and it is what pai-storage adds on top of the database::

    .venv/bin/python bench/read_profile.py [--n 2000] [--profile read|list]

Prints, for the newest-20 read of a 1,000-message transcript and the first list
page of 20, the median wall time and the CPU time per operation of the store
and of the floor (``bench/postgres_bench.py``'s hand-written statements), in
alternating blocks. The store is measured twice: as it runs (records read
before are shared from the codec's cache), and "cold", with that cache off, so
that every stored record is decoded again. ``--profile`` runs the store's side
under ``cProfile`` and prints the top functions by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.store import SESSION_SETTINGS, keep_session

from pai_storage import builders as b
from pai_storage import codec, make_url

sys.path.insert(0, str(Path(__file__).parent))
from postgres_bench import SCOPE, Floor, build_thread, close_and_drop

BLOCK = 50


DEFAULT_CACHE = codec.cache.limits


def cache(on: bool) -> None:
    """The codec's cache at its default size, or off."""
    entries, size = DEFAULT_CACHE if on else (0, 0)
    codec.cache.resize(entries=entries, size=size)


async def measure(
    cases: dict[str, Callable[[], Awaitable[Any]]], n: int
) -> dict[str, tuple[float, float]]:
    """(median wall ms, CPU ms per operation) of each case, alternating blocks;
    a ``-cold`` case runs with the codec's cache off."""
    walls: dict[str, list[float]] = {k: [] for k in cases}
    cpus: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        for _ in range(20):
            await fn()
    for _ in range(max(1, n // BLOCK)):
        for key, fn in cases.items():
            cache(not key.endswith("-cold"))
            for _ in range(2):  # warm: the first read decodes, the second shares
                await fn()
            c0 = time.process_time()
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                await fn()
                walls[key].append(time.perf_counter() - t0)
            cpus[key].append((time.process_time() - c0) / BLOCK)
    return {
        k: (statistics.median(walls[k]) * 1000, statistics.median(cpus[k]) * 1000) for k in cases
    }


async def main(url: str, n: int, profile: str | None) -> None:
    schema = f"pai_prof_{uuid.uuid4().hex[:10]}"
    dsn = make_url(url).render(hide_password=False, scheme="postgresql")
    store = PostgresThreadStore(url, schema=schema, max_pool_size=4)
    await store.initialize()
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=4, server_settings=dict(SESSION_SETTINGS), reset=keep_session
    )
    floor = Floor(pool, store)
    try:
        await build_thread(store, "t1000", 1_000)
        for i in range(60):
            await store.commit_thread(
                b.create(SCOPE, f"list-{i:05d}", {"messages": [b.insert(b.message("m1", "hi"))]})
            )
        request = b.read(
            SCOPE,
            "t1000",
            messages={
                "type": "page",
                "view": "transcript",
                "order": "newest",
                "page": {"limit": 20},
            },
        )
        first = {"scopeKey": SCOPE, "limit": 20}
        cases: dict[str, Callable[[], Awaitable[Any]]] = {
            "read": lambda: store.read_thread(request),
            "read-cold": lambda: store.read_thread(request),
            "read-floor": lambda: floor.read_newest("t1000"),
            "list": lambda: store.list_threads(first),
            "list-cold": lambda: store.list_threads(first),
            "list-floor": lambda: floor.list_page(None),
        }
        if profile is not None:
            cache(not profile.endswith("-cold"))
            fn = cases[profile]
            for _ in range(50):
                await fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(n):
                await fn()
            prof.disable()
            stats = pstats.Stats(prof)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(40)
            return
        results = await measure(cases, n)
        print(f"{'case':<12} {'wall ms':>8} {'cpu ms':>8}")
        for key, (wall, cpu) in results.items():
            print(f"{key:<12} {wall:8.3f} {cpu:8.3f}")
        for kind in ("read", "read-cold", "list", "list-cold"):
            (w, c), (fw, fc) = results[kind], results[f"{kind.split('-')[0]}-floor"]
            print(f"{kind}: wall {w / fw:.2f}x, cpu {c / fc:.2f}x of the floor")
    finally:
        await close_and_drop(pool, store, dsn, schema)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument(
        "--profile", choices=["read", "read-cold", "list", "list-cold", "read-floor", "list-floor"]
    )
    args = parser.parse_args()
    asyncio.run(main(args.url, args.n, args.profile))
