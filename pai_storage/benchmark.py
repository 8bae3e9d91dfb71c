"""``pai-storage bench``: the standard workload against any store URL.

::

    pai-storage bench URL [--threads N] [--messages M] [--writers K] [--reads R]

The benchmark works only inside a scope it creates for itself,
``pai-bench-<uuid4>``, and refuses to start unless that scope is empty. It then

1. creates ``N`` threads (one ``create`` commit each);
2. appends ``M`` messages to every thread, one message per commit, as agent
   turns: an *open* commit inserts the user message and its ``running`` run and
   acquires the run's lease; a *close* commit inserts the assistant message,
   completes the run and releases the lease. ``K`` writers run concurrently,
   each driving one thread at a time (so commits never conflict);
3. reads the newest 20 transcript messages of threads, ``R`` reads in all
   (default: one per thread), with ``K`` concurrent readers;
4. lists the scope 20 threads a page, to the end, checking that it finds
   exactly the ``N`` threads it created;
5. deletes exactly the threads it created (by id, at the version it last
   committed) and checks that the scope is empty again. Cleanup also runs when
   the workload fails or is interrupted; ``--keep`` skips it.

It prints a progress bar to stderr and a summary table (p50/p95/p99 latency
per operation and commits per second) to stdout. Only the standard library is
used. Exit status: 0 on success, 1 when an operation fails or the store
misbehaves, 2 when the scope is not empty (it never touches data it did not
create).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import builders as b
from .errors import ThreadStoreError
from .models import CommittedResult, ThreadVersion
from .registry import open_store
from .store import ThreadStore
from .url import StoreURL, make_url, redact

__all__ = ["BenchResult", "OpStats", "add_arguments", "main", "percentile", "run_benchmark"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2

SCOPE_PREFIX = "pai-bench-"
READ_PAGE = 20
LIST_PAGE = 20
LEASE_MS = 60_000

_USER_TEXT = "Could you summarise the quarterly figures for the northern region, please?"
_ASSISTANT_TEXT = (
    "Revenue in the northern region grew 4.2% quarter on quarter, driven by renewals; "
    "costs were flat, so the operating margin improved by about one point."
)


# ---------------------------------------------------------------- arguments


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's arguments (the store URL and the workload size) to ``parser``."""
    parser.add_argument("url", metavar="URL", help="store URL, e.g. memory:// or postgresql://...")
    parser.add_argument(
        "--threads",
        "-n",
        type=_positive,
        default=100,
        metavar="N",
        help="threads to create (default 100)",
    )
    parser.add_argument(
        "--messages",
        "-m",
        type=_non_negative,
        default=100,
        metavar="M",
        help="messages to append to each thread, one commit each (default 100)",
    )
    parser.add_argument(
        "--writers",
        "-k",
        type=_positive,
        default=8,
        metavar="K",
        help="concurrent writers and readers (default 8)",
    )
    parser.add_argument(
        "--reads",
        type=_non_negative,
        default=None,
        metavar="R",
        help="reads of the newest 20 messages (default: one per thread)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the benchmark's threads in place instead of deleting them",
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="do not draw the progress bar on stderr",
    )


# ---------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ascending values, by linear interpolation."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return sorted_values[0]
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


@dataclass
class OpStats:
    """Latencies (seconds) of one kind of operation and the wall time of its phase."""

    name: str
    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0

    @property
    def count(self) -> int:
        return len(self.latencies)

    def quantile_ms(self, q: float) -> float:
        return percentile(sorted(self.latencies), q) * 1000.0

    @property
    def per_second(self) -> float:
        return self.count / self.wall if self.wall > 0 else math.nan


@dataclass
class BenchResult:
    """What one run measured."""

    url: str
    scope: str
    threads: int
    messages: int
    writers: int
    ops: dict[str, OpStats] = field(default_factory=dict)
    cleaned_up: bool = False
    remaining: int | None = None

    @property
    def commits(self) -> int:
        return sum(self.ops[k].count for k in ("create", "commit", "delete") if k in self.ops)

    @property
    def commits_per_second(self) -> float:
        stats = self.ops.get("commit")
        return stats.per_second if stats is not None else math.nan

    def as_json(self) -> dict[str, Any]:
        """The results as ``pai-storage bench --json`` prints them (milliseconds)."""
        return {
            "url": self.url,
            "scope": self.scope,
            "threads": self.threads,
            "messages": self.messages,
            "writers": self.writers,
            "operations": {
                stats.name: {
                    "count": stats.count,
                    "p50Ms": stats.quantile_ms(50),
                    "p95Ms": stats.quantile_ms(95),
                    "p99Ms": stats.quantile_ms(99),
                    "maxMs": max(stats.latencies) * 1000.0,
                    "perSecond": stats.per_second,
                }
                for stats in self.ops.values()
                if stats.count
            },
            "commitsPerSecond": None
            if math.isnan(self.commits_per_second)
            else self.commits_per_second,
            "cleanedUp": self.cleaned_up,
            "remaining": self.remaining,
        }

    def summary(self) -> str:
        """The summary table printed at the end of a run."""
        header = ("operation", "count", "p50 ms", "p95 ms", "p99 ms", "max ms", "ops/s")
        rows: list[tuple[str, ...]] = [header]
        for stats in self.ops.values():
            if not stats.count:
                continue
            rows.append(
                (
                    stats.name,
                    str(stats.count),
                    f"{stats.quantile_ms(50):.2f}",
                    f"{stats.quantile_ms(95):.2f}",
                    f"{stats.quantile_ms(99):.2f}",
                    f"{max(stats.latencies) * 1000.0:.2f}",
                    f"{stats.per_second:.0f}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [
            f"pai-storage bench: {self.url}",
            f"scope {self.scope}: {self.threads} threads x {self.messages} messages, "
            f"{self.writers} writers",
            "",
        ]
        for index, row in enumerate(rows):
            cells = [
                row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i])
                for i in range(len(row))
            ]
            lines.append("  ".join(cells))
            if index == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("")
        commit = self.ops.get("commit")
        if commit is not None and commit.count:
            lines.append(
                f"commits/s: {self.commits_per_second:.0f} "
                f"({commit.count} append commits in {commit.wall:.2f} s, "
                f"{self.writers} writers)"
            )
        else:
            lines.append("commits/s: n/a (no append commits; use --messages > 0)")
        if self.cleaned_up:
            lines.append(f"cleanup: deleted the {self.threads} benchmark threads; scope is empty")
        elif self.remaining is not None:
            lines.append(f"kept: {self.remaining} threads remain in scope {self.scope}")
        return "\n".join(lines)


# ---------------------------------------------------------------- progress


class Progress:
    """A stdlib progress bar on a stream (stderr); one line per phase when not a tty."""

    def __init__(self, stream: TextIO | None, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._label = ""
        self._total = 0
        self._done = 0
        self._start = 0.0
        self._last_draw = 0.0

    def start(self, label: str, total: int) -> None:
        self._label, self._total, self._done = label, total, 0
        self._start = self._last_draw = time.perf_counter()
        self._draw(force=True)

    def advance(self, n: int = 1) -> None:
        self._done += n
        self._draw(force=self._done >= self._total)

    def finish(self) -> None:
        if self.stream is None:
            return
        elapsed = time.perf_counter() - self._start
        rate = self._done / elapsed if elapsed > 0 else 0.0
        line = f"{self._label:<8} {self._bar(1.0)} {self._done}/{self._total} "
        line += f"in {elapsed:.2f} s ({rate:.0f}/s)"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + "\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _bar(self, fraction: float) -> str:
        filled = round(fraction * self.width)
        return "[" + "#" * filled + "." * (self.width - filled) + "]"

    def _draw(self, force: bool = False) -> None:
        if self.stream is None or not self.tty:
            return
        now = time.perf_counter()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        fraction = self._done / self._total if self._total else 1.0
        elapsed = now - self._start
        rate = self._done / elapsed if elapsed > 0 else 0.0
        self.stream.write(
            f"\r\x1b[2K{self._label:<8} {self._bar(fraction)} {fraction * 100:5.1f}% "
            f"{self._done}/{self._total} {rate:.0f}/s"
        )
        self.stream.flush()


# ---------------------------------------------------------------- workload


class BenchFailure(Exception):
    """The store answered something the workload does not expect."""


class _ScopeNotEmpty(BenchFailure):
    """The fresh scope already holds threads: refuse to run."""


async def _timed(stats: OpStats, call: Awaitable[Any]) -> Any:
    start = time.perf_counter()
    result = await call
    stats.latencies.append(time.perf_counter() - start)
    return result


async def _run_pool(
    items: Iterable[Any],
    workers: int,
    job: Callable[[Any], Awaitable[None]],
) -> None:
    """Run ``job`` on every item with ``workers`` concurrent tasks; first error wins."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)

    async def worker() -> None:
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await job(item)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(max(1, min(workers, queue.qsize()))):
                group.create_task(worker())
    except BaseExceptionGroup as errors:
        # The other workers were cancelled; report the first failure itself.
        first = errors.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _committed(result: Any, what: str) -> CommittedResult:
    if not isinstance(result, CommittedResult):
        raise BenchFailure(f"{what}: the store answered a conflict; nothing else writes here")
    return result


class _Workload:
    def __init__(self, store: ThreadStore, result: BenchResult, progress: Progress) -> None:
        self.store = store
        self.result = result
        self.progress = progress
        self.scope = result.scope
        self.owner = f"bench-{uuid.uuid4().hex[:8]}"
        # Every thread this run created, with the version it last committed,
        # and every id it tried to create (a create whose outcome is unknown
        # may still have applied; the ids live in this run's own fresh scope).
        self.created: dict[str, ThreadVersion] = {}
        self.attempted: set[str] = set()
        for name in ("create", "commit", "read", "list", "delete"):
            result.ops[name] = OpStats(name)

    async def scope_is_empty(self) -> bool:
        page = await self.store.list_threads(
            {"scopeKey": self.scope, "limit": 1, "includeHidden": True}
        )
        return not page.items

    async def create_threads(self, ids: Sequence[str], writers: int) -> None:
        stats = self.result.ops["create"]
        self.progress.start("create", len(ids))

        async def create(thread_id: str) -> None:
            self.attempted.add(thread_id)
            outcome = await _timed(
                stats, self.store.commit_thread(b.create(self.scope, thread_id, title=thread_id))
            )
            thread = _committed(outcome, f"create {thread_id}").thread
            assert thread is not None
            self.created[thread_id] = thread.version
            self.progress.advance()

        start = time.perf_counter()
        await _run_pool(ids, writers, create)
        stats.wall = time.perf_counter() - start
        self.progress.finish()

    def _turn_changes(self, step: int) -> dict[str, Any]:
        """The changes of append commit ``step``: even opens a turn, odd closes it."""
        turn = step // 2
        run_id = f"r{turn}"
        user_id, assistant_id = f"m{2 * turn}", f"m{2 * turn + 1}"
        if step % 2 == 0:
            return {
                "messages": [
                    {"type": "insert", "record": b.message(user_id, _USER_TEXT, run_id=run_id)}
                ],
                "runs": [{"type": "insert", "record": b.run(run_id, inputs=[user_id])}],
                "lease": b.acquire(run_id, self.owner, LEASE_MS),
            }
        return {
            "messages": [
                {
                    "type": "insert",
                    "record": b.message(
                        assistant_id,
                        _ASSISTANT_TEXT,
                        role="assistant",
                        run_id=run_id,
                        relation="output",
                    ),
                }
            ],
            "runs": [{"type": "replace", "record": b.run(run_id, "completed", inputs=[user_id])}],
            "lease": b.release(run_id, self.owner),
        }

    async def append(self, messages: int, writers: int) -> None:
        stats = self.result.ops["commit"]
        self.progress.start("commit", len(self.created) * messages)

        async def fill(thread_id: str) -> None:
            for step in range(messages):
                request = b.update_at(
                    self.scope,
                    thread_id,
                    self.created[thread_id],
                    self._turn_changes(step),
                    root=b.root(title=thread_id),
                )
                outcome = await _timed(stats, self.store.commit_thread(request))
                thread = _committed(outcome, f"commit {step} on {thread_id}").thread
                assert thread is not None
                self.created[thread_id] = thread.version
                self.progress.advance()

        start = time.perf_counter()
        await _run_pool(list(self.created), writers, fill)
        stats.wall = time.perf_counter() - start
        self.progress.finish()

    async def read(self, reads: int, writers: int, messages: int) -> None:
        stats = self.result.ops["read"]
        ids = list(self.created)
        targets = [ids[i % len(ids)] for i in range(reads)]
        expected = min(READ_PAGE, messages)
        self.progress.start("read", len(targets))
        selection = {
            "type": "page",
            "view": "transcript",
            "order": "newest",
            "page": {"limit": READ_PAGE},
        }

        async def read_one(thread_id: str) -> None:
            outcome = await _timed(
                stats,
                self.store.read_thread(b.read(self.scope, thread_id, messages=selection)),
            )
            if outcome.thread is None or outcome.messages is None:
                raise BenchFailure(f"read {thread_id}: the thread is missing")
            if len(outcome.messages.items) != expected:
                raise BenchFailure(
                    f"read {thread_id}: expected {expected} messages, "
                    f"got {len(outcome.messages.items)}"
                )
            self.progress.advance()

        start = time.perf_counter()
        await _run_pool(targets, writers, read_one)
        stats.wall = time.perf_counter() - start
        self.progress.finish()

    async def list_all(self) -> None:
        stats = self.result.ops["list"]
        pages = math.ceil(len(self.created) / LIST_PAGE)
        self.progress.start("list", pages)
        seen: set[str] = set()
        token: str | None = None
        start = time.perf_counter()
        while True:
            request: dict[str, Any] = {"scopeKey": self.scope, "limit": LIST_PAGE}
            if token is not None:
                request["pageToken"] = token
            page = await _timed(stats, self.store.list_threads(request))
            seen.update(thread.thread_id for thread in page.items)
            self.progress.advance()
            token = page.next_page_token
            if token is None:
                break
        stats.wall = time.perf_counter() - start
        self.progress.finish()
        if seen != set(self.created):
            raise BenchFailure(
                f"list: expected the {len(self.created)} benchmark threads, found {len(seen)} "
                f"({len(seen - set(self.created))} unknown, "
                f"{len(set(self.created) - seen)} missing)"
            )

    async def cleanup(self, writers: int) -> None:
        """Delete exactly the threads this run created, then check the scope is empty."""
        stats = self.result.ops["delete"]
        self.progress.start("delete", len(self.created))

        async def delete(thread_id: str) -> None:
            version = self.created[thread_id]
            outcome = await _timed(
                stats, self.store.commit_thread(b.delete(self.scope, thread_id, version))
            )
            if not isinstance(outcome, CommittedResult):
                # Our own last commit may have applied without us learning its
                # version (an error mid-commit): re-read our thread and retry once.
                current = await self.store.read_thread(b.read(self.scope, thread_id))
                if current.thread is not None:
                    _committed(
                        await self.store.commit_thread(
                            b.delete(self.scope, thread_id, current.thread.version)
                        ),
                        f"delete {thread_id}",
                    )
            del self.created[thread_id]
            self.attempted.discard(thread_id)
            self.progress.advance()

        start = time.perf_counter()
        await _run_pool(list(self.created), writers, delete)
        stats.wall = time.perf_counter() - start
        self.progress.finish()
        for thread_id in sorted(self.attempted):
            # Creates whose outcome was unknown: delete them if they applied.
            current = await self.store.read_thread(b.read(self.scope, thread_id))
            if current.thread is not None:
                _committed(
                    await self.store.commit_thread(
                        b.delete(self.scope, thread_id, current.thread.version)
                    ),
                    f"delete {thread_id}",
                )
        self.attempted.clear()
        if not await self.scope_is_empty():
            raise BenchFailure(f"cleanup: scope {self.scope} still holds threads")
        self.result.cleaned_up = True


async def run_benchmark(
    store: ThreadStore,
    *,
    url: str,
    threads: int,
    messages: int,
    writers: int,
    reads: int | None = None,
    keep: bool = False,
    progress: Progress | None = None,
    scope: str | None = None,
) -> BenchResult:
    """Run the standard workload on ``store`` in a fresh scope; see the module docstring.

    Raises :class:`BenchFailure` when the scope is not empty (before writing
    anything) or when the store answers unexpectedly; store errors propagate.
    Threads created before a failure are deleted unless ``keep``.
    """
    result = BenchResult(
        url=url,
        scope=scope or f"{SCOPE_PREFIX}{uuid.uuid4()}",
        threads=threads,
        messages=messages,
        writers=writers,
    )
    work = _Workload(store, result, progress or Progress(None))
    if not await work.scope_is_empty():
        raise _ScopeNotEmpty(
            f"scope {result.scope} is not empty; the benchmark only writes to a fresh "
            "scope and will not touch it"
        )
    thread_ids = [f"t{i:06d}" for i in range(threads)]
    try:
        await work.create_threads(thread_ids, writers)
        if messages:
            await work.append(messages, writers)
            await work.read(threads if reads is None else reads, writers, messages)
        await work.list_all()
    finally:
        if keep:
            result.remaining = len(work.created)
        elif work.attempted:
            await work.cleanup(writers)
    return result


async def main(args: argparse.Namespace) -> int:
    """Run ``pai-storage bench`` with arguments parsed by :func:`add_arguments`."""
    url: str = args.url
    as_json = getattr(args, "json", False)
    progress = Progress(sys.stderr if getattr(args, "progress", True) else None)

    parsed: StoreURL | None = None

    def fail(status: int, exc: BaseException, message: str) -> int:
        print(message, file=sys.stderr)
        if as_json:
            error = {"type": type(exc).__name__, "message": redact(str(exc), parsed)}
            print(json.dumps({"ok": False, "status": status, "error": error}))
        return status

    try:
        parsed = make_url(url)
        store = open_store(parsed)
    except ThreadStoreError as exc:
        return fail(EXIT_FAILED, exc, f"pai-storage bench: {type(exc).__name__}: {exc}")
    shown = str(parsed)  # the password masked
    try:
        async with store:
            result = await run_benchmark(
                store,
                url=shown,
                threads=args.threads,
                messages=args.messages,
                writers=args.writers,
                reads=getattr(args, "reads", None),
                keep=getattr(args, "keep", False),
                progress=progress,
            )
    except _ScopeNotEmpty as exc:
        return fail(EXIT_REFUSED, exc, f"pai-storage bench: refused: {exc}")
    except (BenchFailure, ThreadStoreError) as exc:
        message = redact(f"{type(exc).__name__}: {exc}", parsed)
        return fail(EXIT_FAILED, exc, f"pai-storage bench: failed: {message}")
    if as_json:
        print(json.dumps({"ok": True, **result.as_json()}, indent=2))
    else:
        print(result.summary())
    return EXIT_OK
