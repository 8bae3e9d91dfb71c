"""Benchmark of the blocking API's cost per call (``pai_storage.sync``).

One command, prints one line per measurement::

    .venv/bin/python -m bench.sync_bench [--calls N] [--url URL]

Times ``conversation.get()`` (one read of a thread root) ``N`` times through
the blocking API and through the async API on the same backend, interleaved
in rounds of 100 calls so background drift hits both alike, and reports the
medians per call and their difference: what one call's hop from the caller's
thread to the portal's loop and back costs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import pai_storage
from pai_storage import sync

ROUND = 100


def _blocking_round(chat: object) -> float:
    start = time.perf_counter()
    for _ in range(ROUND):
        chat.get()  # type: ignore[attr-defined]
    return (time.perf_counter() - start) / ROUND


async def _async_round(chat: pai_storage.Conversation) -> float:
    start = time.perf_counter()
    for _ in range(ROUND):
        await chat.get()
    return (time.perf_counter() - start) / ROUND


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--url", default="memory://")
    args = parser.parse_args()
    blocking: list[float] = []
    awaited: list[float] = []

    async def measure_async(rounds: int) -> None:
        async with pai_storage.open_store(args.url) as store:
            chat = store.conversation("bench", "sync-overhead-async")
            await chat.add("user", "hi")
            for _ in range(rounds):
                awaited.append(await _async_round(chat))

    with sync.open_store(args.url) as store:
        chat = store.conversation("bench", "sync-overhead")
        chat.add("user", "hi")
        for _ in range(max(1, args.calls // ROUND)):
            blocking.append(_blocking_round(chat))
            asyncio.run(measure_async(1))
        chat.delete()
    b, a = statistics.median(blocking), statistics.median(awaited)
    print(f"{args.url}: blocking get {b * 1e6:.0f} us, async get {a * 1e6:.0f} us, ")
    print(f"portal hop {(b - a) * 1e6:.0f} us per call (medians of rounds of {ROUND})")


if __name__ == "__main__":
    main()
