"""Latency of ``ThreadStore.watch``: from a commit acknowledged to the change received.

::

    .venv/bin/python bench/watch_latency.py [--commits 200] [--pause 0.02] [--interval 0.2]
        [--backend memory --backend sqlite ...]

For each backend a writer streams ``--commits`` chunk commits into one thread
(a reply written with ``flush_every=0``: one commit per chunk, ``--pause``
seconds apart, as a model produces tokens). The watcher is ``pai-storage watch``
in another process (memory: a task of the same process, which is the only
place its threads exist), started at the version before the stream. For every
commit, the latency is the time this process read the first change that covers
it (its version or a later one) minus the time the commit was acknowledged to
the writer: a commit coalesced into a later change counts until that change. It
also checks the contract: the changes form an unbroken chain of strictly
increasing versions ending at the final one, and counts the changes that say
what changed (``changed`` not ``None``). Prints p50 and p99 per backend.

Backends: memory, sqlite (a file), postgres (``postgresql://postgres@127.0.0.1/test``),
mariadb (``mysql://root@127.0.0.1/test``) and mongo (a throwaway mongod from the
test harness).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pai_storage
from pai_storage import ThreadStore

BACKENDS = ("memory", "sqlite", "postgres", "mariadb", "mongo")


@asynccontextmanager
async def _url(backend: str) -> AsyncIterator[str]:
    if backend == "memory":
        yield "memory://"
    elif backend == "sqlite":
        with tempfile.TemporaryDirectory() as scratch:
            yield f"sqlite:///{scratch}/watch.db"
    elif backend == "postgres":
        yield "postgresql://postgres@127.0.0.1:5432/test"
    elif backend == "mariadb":
        yield "mysql://root@127.0.0.1/test"
    else:
        from pai_storage_mongo.harness import MongodProcess

        mongod = MongodProcess()
        mongod.start()
        try:
            yield mongod.url
        finally:
            mongod.stop()


async def _head(store: ThreadStore, scope: str) -> dict[str, Any]:
    root = await store.conversation(scope, "chat").get()
    assert root is not None
    return root.version.to_json()


async def _stream(store: ThreadStore, scope: str, commits: int, pause: float) -> dict[int, float]:
    """Write the reply; the acknowledgement time of each revision."""
    chat = store.conversation(scope, "chat", flush_every=0)
    acked: dict[int, float] = {}

    async def note() -> None:  # right after a commit returned: when it was acknowledged
        now = time.monotonic()
        acked[(await _head(store, scope))["revision"]] = now

    async with chat.reply() as reply:
        await note()
        for i in range(commits - 2):  # the reply's open and close are commits too
            await asyncio.sleep(pause)
            await reply.write(f"chunk {i} ")
            await note()
    await note()
    return acked


class _Seen:
    """The changes received, each with the time it was received."""

    def __init__(self) -> None:
        self.changes: list[tuple[float, dict[str, Any]]] = []
        self._final: dict[str, Any] | None = None
        self._done = asyncio.Event()

    def add(self, change: dict[str, Any]) -> None:
        self.changes.append((time.monotonic(), change))
        if change["version"] == self._final:
            self._done.set()

    async def reaches(self, final: dict[str, Any]) -> None:
        if self.changes and self.changes[-1][1]["version"] == final:
            return
        self._final = final
        await self._done.wait()


async def measure(backend: str, commits: int, pause: float, interval: float) -> dict[str, Any]:
    async with _url(backend) as url, pai_storage.open_store(url) as store:
        scope = f"bench-{uuid.uuid4().hex[:8]}"
        chat = store.conversation(scope, "chat", flush_every=0)
        await chat.add("user", "a long answer, please")
        start = await chat.get()
        assert start is not None
        seen = _Seen()
        if backend == "memory":
            changes = store.watch(scope, "chat", after=start.version, interval=interval)

            async def consume() -> None:
                async for change in changes:
                    seen.add(change.to_json())

            consumer = asyncio.create_task(consume())
            acked = await _stream(store, scope, commits, pause)
            final = await _head(store, scope)
            await seen.reaches(final)
            consumer.cancel()
        else:
            watcher = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "pai_storage", "watch", url, scope, "chat"),
                *("--interval", str(interval), "--after", json.dumps(start.version.to_json())),
                stdout=asyncio.subprocess.PIPE,
            )
            assert watcher.stdout is not None
            stdout = watcher.stdout

            async def read() -> None:
                async for line in stdout:
                    seen.add(json.loads(line))

            reader = asyncio.create_task(read())
            await asyncio.sleep(1.0)  # the watcher process imports and connects
            acked = await _stream(store, scope, commits, pause)
            final = await _head(store, scope)
            async with asyncio.timeout(120):
                await seen.reaches(final)
            watcher.terminate()
            await watcher.wait()
            reader.cancel()
        await chat.delete()
    return _report(backend, start.version.to_json(), final, acked, seen.changes)


def _report(
    backend: str,
    start: dict[str, Any],
    final: dict[str, Any],
    acked: dict[int, float],
    seen: list[tuple[float, dict[str, Any]]],
) -> dict[str, Any]:
    changes = [c for _, c in seen]
    revisions = [c["version"]["revision"] for c in changes]
    chain = changes[0]["previous"] == start and all(
        two["previous"] == one["version"] for one, two in itertools.pairwise(changes)
    )
    ordered = revisions == sorted(set(revisions))
    # Each commit's latency: until the first change that covers it arrived.
    latencies = sorted(
        (next(at for at, c in seen if c["version"]["revision"] >= revision) - ack) * 1000
        for revision, ack in acked.items()
    )
    return {
        "backend": backend,
        "commits": final["revision"] - start["revision"],
        "changes": len(changes),
        "described": sum(c.get("changed") is not None for c in changes),
        "ends_at_final": changes[-1]["version"] == final,
        "unbroken_and_ordered": chain and ordered,
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
    }


async def run(args: argparse.Namespace) -> None:
    print(
        f"load average {os.getloadavg()[0]:.1f}, interval {args.interval} s, pause {args.pause} s"
    )
    print(
        "| backend | commits | changes | with changed | ends at final | chain ordered "
        "| p50 ms | p99 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for backend in args.backend or BACKENDS:
        r = await measure(backend, args.commits, args.pause, args.interval)
        print(
            f"| {r['backend']} | {r['commits']} | {r['changes']} | {r['described']} "
            f"| {r['ends_at_final']} "
            f"| {r['unbroken_and_ordered']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.02)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--backend", action="append", choices=BACKENDS)
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
