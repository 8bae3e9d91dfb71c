"""Benchmark of the thread lifecycle on the memory backend: does a sweep cost what it deletes?

One command, prints one table::

    .venv/bin/python -m bench.lifecycle_bench [--quick] [--samples N]

Each measurement is taken on a small and a large store in the same run, the
samples interleaved, and reported as medians with the ratio large / small
(target < 1.5: the cost follows what is deleted, not what is stored):

- **prune**: ``prune_threads`` deleting the 1,000 oldest threads of a store
  holding 10,000 vs 100,000 threads (every other thread is newer than the
  cutoff and stays);
- **erase**: ``erase_scope`` of a scope of 1,000 threads in a store holding
  10,000 vs 100,000 threads in other scopes;
- **erase per thread**: ``erase_scope`` of a scope of 1,000 vs 10,000
  threads (a tenth of the store sizes), per thread deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from pai_storage_memory import MemoryThreadStore

from pai_storage import ManualClock
from pai_storage import builders as b

TARGET = 1.5
DELETED = 1_000
_OLD = datetime(2001, 1, 1, tzinfo=UTC)
_NEW = datetime(2030, 1, 1, tzinfo=UTC)


async def _create(store: MemoryThreadStore, scope: str, prefix: str, count: int) -> None:
    for i in range(count):
        await store.commit_thread(b.create(scope, f"{prefix}{i}"))


async def _timed_prune(store: MemoryThreadStore, clock: ManualClock, tag: str) -> float:
    clock.set(_OLD)
    await _create(store, "old", f"{tag}-", DELETED)
    clock.set(_NEW)
    gc.collect()
    start = time.perf_counter()
    pruned = await store.prune_threads(updated_before=_OLD + timedelta(days=1), limit=DELETED)
    elapsed = time.perf_counter() - start
    assert len(pruned) == DELETED
    return elapsed


async def _timed_erase(store: MemoryThreadStore, scope: str, count: int) -> float:
    await _create(store, scope, "t", count)
    gc.collect()
    start = time.perf_counter()
    erased = await store.erase_scope(scope)
    elapsed = time.perf_counter() - start
    assert erased == count
    return elapsed


def _row(name: str, small: list[float], large: list[float], unit: float = 1.0) -> str:
    s, m = statistics.median(small) / unit, statistics.median(large) / unit
    ratio = m / s
    verdict = "ok" if ratio < TARGET else "OVER"
    return f"{name:<22}{s * 1000:>12.2f} ms{m * 1000:>12.2f} ms{ratio:>9.2f}  {verdict}"


async def main(samples: int, sizes: tuple[int, int]) -> int:
    small_n, large_n = sizes
    stores = {}
    for n in sizes:
        clock = ManualClock(_NEW)
        store = MemoryThreadStore(clock=clock)
        await _create(store, "live", "t", n - DELETED)
        stores[n] = (store, clock)
    prune: dict[int, list[float]] = {n: [] for n in sizes}
    erase: dict[int, list[float]] = {n: [] for n in sizes}
    for sample in range(samples):
        for n in sizes:
            store, clock = stores[n]
            prune[n].append(await _timed_prune(store, clock, f"s{sample}"))
            erase[n].append(await _timed_erase(store, f"tenant-{sample}", DELETED))
    per_thread: dict[int, list[float]] = {n: [] for n in (small_n // 10, large_n // 10)}
    for sample in range(samples):
        for n in per_thread:
            store = MemoryThreadStore(clock=ManualClock(_NEW))
            per_thread[n].append(await _timed_erase(store, f"big-{sample}", n) / n)
    print(f"memory backend, {samples} samples, medians; target ratio < {TARGET}")
    print(f"{'operation':<22}{'small':>15}{'large':>15}{'ratio':>9}")
    rows = [
        _row(f"prune {DELETED} of {small_n}/{large_n}", prune[small_n], prune[large_n]),
        _row(f"erase {DELETED} of {small_n}/{large_n}", erase[small_n], erase[large_n]),
    ]
    small_scope, large_scope = per_thread
    rows.append(
        _row(
            f"erase/thread {small_scope}/{large_scope}",
            [t * 1000 for t in per_thread[small_scope]],
            [t * 1000 for t in per_thread[large_scope]],
        ).replace(" ms", " us")
    )
    for row in rows:
        print(row)
    return 0 if all(row.endswith("ok") for row in rows) else 1


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller stores, 1 sample")
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    sizes = (1_000 + DELETED, 10_000) if args.quick else (10_000, 100_000)
    return asyncio.run(main(1 if args.quick else args.samples, sizes))


if __name__ == "__main__":
    sys.exit(run())
