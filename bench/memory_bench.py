"""Benchmark of the memory backend: does a turn, a read or a list page grow with the data?

One command, prints one table::

    .venv/bin/python -m bench.memory_bench [--quick] [--samples N]

Each measurement is taken at a small and a large size in the same run, the two
sizes interleaved sample by sample (so background drift hits both alike), and
reported as medians with the ratio large / small (target < 1.5):

- **turn**: the 2-commit turn of ``docs/commits.md#worked-example-one-turn``
  (insert the user message and its ``running`` run and acquire the lease;
  insert the answer, complete the run and release the lease) on a thread of
  10 vs 10,000 messages (the median of the turns starting at that size; each
  turn adds 2 messages);
- **read**: the newest 20 transcript messages of those threads;
- **list**: the first page of 20 threads of a scope holding 100 vs 10,000
  threads, and a deep page (past 90% of the scope, followed by page tokens).

Threads are built as completed turns (per run: a user input message, an
assistant output message with metadata), 100 turns per seeding commit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pai_storage_memory import MemoryThreadStore

from pai_storage import CommittedResult, ThreadVersion
from pai_storage import builders as b

OWNER = "bench-worker"
SEED_TURNS_PER_COMMIT = 100
TARGET = 1.5


def _user(n: int) -> dict[str, Any]:
    text = f"Could you summarise the figures of quarter {n} for the northern region, please?"
    return b.message(f"u{n}", text, role="user", run_id=f"r{n}", relation="input")


def _answer(n: int) -> dict[str, Any]:
    answer = b.message(
        f"a{n}",
        f"Revenue in quarter {n} grew 4.2% on renewals; costs were flat. " * 6,
        role="assistant",
        run_id=f"r{n}",
        relation="output",
        metadata={"model": "gpt", "tokens": {"in": 120, "out": 480}, "latencyMs": 1234.5},
    )
    answer["producer"] = {"kind": "agent", "id": "assistant"}
    return answer


def _completed(n: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    run = b.run(f"r{n}", "completed", inputs=[f"u{n}"])
    return [b.insert(_user(n)), b.insert(_answer(n))], b.insert(run)


class Conversation:
    """One thread grown turn by turn; remembers its version and next turn number."""

    def __init__(self, store: MemoryThreadStore, scope: str, thread_id: str) -> None:
        self.store, self.scope, self.thread_id = store, scope, thread_id
        self.version: ThreadVersion | None = None
        self.turns = 0

    async def _commit(self, request: dict[str, Any]) -> None:
        result = await self.store.commit_thread(request)
        if not isinstance(result, CommittedResult) or result.thread is None:
            raise RuntimeError(f"unexpected outcome for {self.thread_id}: {result!r}")
        self.version = result.thread.version

    async def create(self, messages: int) -> Conversation:
        await self._commit(b.create(self.scope, self.thread_id, title=self.thread_id))
        target = messages // 2
        while self.turns < target:
            batch = range(self.turns, min(target, self.turns + SEED_TURNS_PER_COMMIT))
            changes: dict[str, list[dict[str, Any]]] = {"messages": [], "runs": []}
            for n in batch:
                inserts, run = _completed(n)
                changes["messages"] += inserts
                changes["runs"].append(run)
            await self._commit(
                b.update_at(self.scope, self.thread_id, self.version, changes, root=b.root())
            )
            self.turns = batch.stop
        return self

    async def turn(self) -> None:
        n = self.turns
        self.turns += 1
        opened = {
            "messages": [b.insert(_user(n))],
            "runs": [b.insert(b.run(f"r{n}", "running", inputs=[f"u{n}"]))],
            "lease": b.acquire(f"r{n}", OWNER, 60_000),
        }
        await self._commit(
            b.update_at(self.scope, self.thread_id, self.version, opened, root=b.root())
        )
        closed = {
            "messages": [b.insert(_answer(n))],
            "runs": [b.replace(b.run(f"r{n}", "completed", inputs=[f"u{n}"]))],
            "lease": b.release(f"r{n}", OWNER),
        }
        await self._commit(
            b.update_at(self.scope, self.thread_id, self.version, closed, root=b.root())
        )

    async def read_newest(self) -> None:
        page = {"type": "page", "view": "transcript", "order": "newest", "page": {"limit": 20}}
        result = await self.store.read_thread(b.read(self.scope, self.thread_id, messages=page))
        assert result.messages is not None
        assert len(result.messages.items) == 20


async def populate(store: MemoryThreadStore, scope: str, count: int) -> None:
    """``count`` threads of one completed turn each."""
    for i in range(count):
        inserts, run = _completed(0)
        changes = {"messages": inserts, "runs": [run]}
        result = await store.commit_thread(b.create(scope, f"c{i:05d}", changes, title=f"c{i}"))
        assert isinstance(result, CommittedResult)


async def deep_token(store: MemoryThreadStore, scope: str, skip: int) -> str:
    """The page token of the page that starts after ``skip`` threads."""
    token: str | None = None
    for _ in range(skip // 20):
        request: dict[str, Any] = {"scopeKey": scope, "limit": 20}
        if token is not None:
            request["pageToken"] = token
        token = (await store.list_threads(request)).next_page_token
        assert token is not None
    assert token is not None
    return token


Op = Callable[[], Awaitable[Any]]


async def side_by_side(small: Op, large: Op, samples: int, warmup: int) -> tuple[float, float]:
    """Median milliseconds of ``small`` and ``large``, run alternately."""
    for _ in range(warmup):
        await small()
        await large()
    times: tuple[list[float], list[float]] = ([], [])
    gc.collect()
    for _ in range(samples):
        for op, out in ((small, times[0]), (large, times[1])):
            start = time.perf_counter()
            await op()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1000, statistics.median(times[1]) * 1000


@dataclass(frozen=True)
class Row:
    name: str
    small_label: str
    large_label: str
    small_ms: float
    large_ms: float

    @property
    def ratio(self) -> float:
        return self.large_ms / self.small_ms


async def run(samples: int, large_messages: int, large_threads: int) -> list[Row]:
    store = MemoryThreadStore()
    await store.initialize()
    try:
        small = await Conversation(store, "bench-turn-small", "t-small").create(10)
        large = await Conversation(store, "bench-turn-large", "t-large").create(large_messages)
        rows = []
        warmup = max(5, samples // 10)
        turn = await side_by_side(small.turn, large.turn, samples, warmup)
        rows.append(Row("turn (2 commits)", "10 msgs", f"{large_messages:,} msgs", *turn))
        read = await side_by_side(small.read_newest, large.read_newest, samples, warmup)
        rows.append(Row("read newest 20", "10 msgs", f"{large_messages:,} msgs", *read))

        await populate(store, "bench-list-small", 100)
        await populate(store, "bench-list-large", large_threads)

        def lister(scope: str, token: str | None = None) -> Op:
            request: dict[str, Any] = {"scopeKey": scope, "limit": 20}
            if token is not None:
                request["pageToken"] = token

            async def list_page() -> None:
                page = await store.list_threads(request)
                assert len(page.items) == 20

            return list_page

        first = await side_by_side(
            lister("bench-list-small"), lister("bench-list-large"), samples, warmup
        )
        rows.append(Row("list 20", "of 100", f"of {large_threads:,}", *first))
        deep = await deep_token(store, "bench-list-large", large_threads * 9 // 10)
        deep_page = await side_by_side(
            lister("bench-list-small"), lister("bench-list-large", deep), samples, warmup
        )
        label = f"of {large_threads:,}, after {large_threads * 9 // 10:,}"
        rows.append(Row("list 20", "of 100", label, *deep_page))
        return rows
    finally:
        await store.close()


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| measurement | small | median | large | median | large / small |",
        "| --- | --- | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        verdict = "" if r.ratio < TARGET else " (over target)"
        lines.append(
            f"| {r.name} | {r.small_label} | {r.small_ms:.3f} ms | {r.large_label} "
            f"| {r.large_ms:.3f} ms | {r.ratio:.2f}{verdict} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_bench", description=__doc__)
    parser.add_argument("--samples", type=int, default=200, help="samples per size (default 200)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1,000 messages / threads, 30 samples"
    )
    args = parser.parse_args(argv)
    large = 1_000 if args.quick else 10_000
    samples = 30 if args.quick else args.samples
    started = time.perf_counter()
    rows = asyncio.run(run(samples, large, large))
    print(f"memory:// — medians of {samples} samples per size, sizes interleaved")
    print(f"(Python {sys.version.split()[0]}, target large / small < {TARGET})")
    print()
    print(table(rows))
    print()
    print(f"took {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
