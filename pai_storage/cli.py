"""The ``pai-storage`` command line: demo, check, bench, copy, export and import.

::

    pai-storage demo [URL]          play the worked example of one turn (default memory://)
    pai-storage check URL           initialize a store and describe the backend
    pai-storage bench URL [...]     run the benchmark (pai_storage.benchmark)
    pai-storage copy SRC DST        copy every thread (or --scope S) to another store, verified
    pai-storage export URL          write the threads as JSON Lines (docs/lifecycle.md)
    pai-storage import URL FILE     restore threads from an export
    pai-storage --version

Every command exits 0 on success and 1 on a :class:`ThreadStoreError`, whose
message goes to stderr without a traceback and with any URL password masked.
Usage errors exit 2. ``bench`` has its own statuses (see
:mod:`pai_storage.benchmark`).

The demo plays ``docs/commits.md#worked-example-one-turn`` step by step.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import entry_points
from typing import Any, TextIO

from . import __version__
from . import builders as b
from .bundle import connect
from .clock import ManualClock, system_clock
from .demo_runtime import RuntimeDemo
from .errors import (
    ConfigurationError,
    StorageError,
    ThreadStoreConfigurationError,
    ThreadStoreError,
)
from .models import (
    CommittedResult,
    ConflictResult,
    Message,
    QueuedItem,
    RunRecord,
    TextPart,
    ThreadLease,
    ThreadReadResult,
    ThreadRecord,
    ThreadVersion,
    format_timestamp,
)
from .registry import ENTRY_POINT_GROUP, available_backends, backend_for_url, get_backend
from .store import ThreadStore
from .transfer import CopyReport
from .url import make_url, redact

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1


# ---------------------------------------------------------------- output helpers


class _DemoFailure(Exception):
    """The store answered something the worked example does not expect."""


@dataclass(frozen=True)
class _Glyphs:
    dot: str = "·"
    ellipsis: str = "…"
    arrow: str = "→"
    dash: str = "—"


_ASCII = _Glyphs(dot="|", ellipsis="...", arrow="->", dash="-")


def _glyphs_for(stream: TextIO) -> _Glyphs:
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        "·…→—".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return _ASCII
    return _Glyphs()


_USERINFO = re.compile(r"(://[^/@:\s]*:)[^@\s]*@")


def _password_masker(url: str) -> Callable[[str], str]:
    """A function that removes ``url``'s password from a message (belt and braces)."""
    try:
        parsed = make_url(url)
    except ThreadStoreError:
        parsed = None

    def mask(text: str) -> str:
        text = redact(text, parsed)
        return _USERINFO.sub(r"\1***@", text)

    return mask


def _error(message: str, mask: Callable[[str], str] = lambda s: s) -> None:
    print(f"pai-storage: error: {mask(message)}", file=sys.stderr)


# ---------------------------------------------------------------- demo


_QUESTION_1 = "What is the capital of France?"
_ANSWER_1 = "The capital of France is Paris."
_QUESTION_2 = "And of Italy?"
_ANSWER_2 = "Rome."


class _Demo:
    """Plays the worked example of one turn on a fresh thread in a fresh scope.

    Each step prints what it commits and the state it leaves; the steps and
    their JSON are those of ``docs/commits.md#worked-example-one-turn``.
    """

    def __init__(
        self,
        store: ThreadStore,
        url: str,
        out: TextIO,
        *,
        clock: ManualClock | None,
        show_json: bool,
    ) -> None:
        self.store = store
        self.url = url
        self.out = out
        self.clock = clock
        self.show_json = show_json
        self.g = _glyphs_for(out)
        self.scope = f"demo-{uuid.uuid4().hex[:12]}"
        self.thread = "support-chat"
        self.title = "Capitals"
        self.version: ThreadVersion | None = None
        self.step = 0
        # A short lease on a real provider clock, so the takeover needs only a
        # short wait; the manual clock of memory:// just jumps past it.
        self.short_lease_ms = 30_000 if clock is not None else 1_500

    # ------------------------------------------------------------ printing

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def title_line(self, text: str) -> None:
        self.step += 1
        self.say()
        self.say(f"{self.step:>2}. {text}")

    def detail(self, label: str, text: str) -> None:
        self.say(f"    {label:<12}{text}")

    def short_version(self, version: ThreadVersion | None) -> str:
        if version is None:
            return "thread deleted"
        return (
            f"rev {version.revision} {self.g.dot} instance "
            f"{version.thread_instance_id[:8]}{self.g.ellipsis}"
        )

    def show_commit(self, commit: dict[str, Any]) -> None:
        if not self.show_json:
            return
        text = json.dumps(commit, indent=2, ensure_ascii=self.g is _ASCII)
        for line in text.splitlines():
            self.say(f"    {line}")

    def lease_text(self, lease: ThreadLease | None) -> str:
        if lease is None:
            return "none"
        return (
            f"{lease.run_id} held by {lease.owner_id} ({lease.operation}), "
            f"expires {format_timestamp(lease.expires_at)}"
        )

    def message_line(self, message: Message) -> str:
        texts = [p.text for p in message.parts if isinstance(p, TextPart)]
        text = " ".join(texts)
        if len(text) > 40:
            text = text[:39] + self.g.ellipsis
        assoc = message.association
        owner = f"[{assoc.run_id} {assoc.relation}]" if assoc.kind == "run" else "[standalone]"
        quoted = json.dumps(text, ensure_ascii=self.g is _ASCII)
        return f"{message.message_id:<4}{message.role:<10}{message.status:<10}{owner:<14}{quoted}"

    def run_line(self, run: RunRecord) -> str:
        admitted = "admitted" if run.admission.admitted else "not admitted"
        parts = [f"{run.run_id:<4}{run.status:<10}{admitted:<13}"]
        if run.input_message_ids:
            parts.append(f"inputs {','.join(run.input_message_ids)}")
        if run.operation:
            parts.append(f"op {run.operation}")
        if run.admission.queue_item_id:
            parts.append(f"queue item {run.admission.queue_item_id}")
        if run.finished_at:
            parts.append(f"finished {format_timestamp(run.finished_at)}")
        return "  ".join(parts)

    def queue_line(self, item: QueuedItem) -> str:
        return f"{item.queue_item_id:<4}for run {item.run_id}"

    def show_family(self, label: str, lines: list[str]) -> None:
        if not lines:
            self.detail(label, "(empty)")
            return
        for index, line in enumerate(lines):
            self.detail(label if index == 0 else "", line)

    async def read(self) -> ThreadReadResult:
        page = {"type": "page", "page": {"limit": 100}}
        return await self.store.read_thread(
            b.read(
                self.scope,
                self.thread,
                messages={**page, "view": "raw"},
                runs=page,
                queuedItems=page,
            )
        )

    async def show_state(self) -> None:
        result = await self.read()
        if result.thread is None:
            self.detail("thread", "none (deleted)")
            return
        self.detail("lease", self.lease_text(result.thread.lease))
        messages = result.messages.items if result.messages else []
        runs = result.runs.items if result.runs else []
        queued = result.queued_items.items if result.queued_items else []
        self.show_family("messages", [self.message_line(m) for m in messages])
        self.show_family("runs", [self.run_line(r) for r in runs])
        self.show_family("queue", [self.queue_line(q) for q in queued])

    # ------------------------------------------------------------ committing

    def update(
        self, changes: dict[str, Any], version: ThreadVersion | None = None
    ) -> dict[str, Any]:
        return b.update_at(
            self.scope, self.thread, version or self.version, changes, root=b.root(title=self.title)
        )

    async def commit(self, commit: dict[str, Any]) -> CommittedResult:
        self.show_commit(commit)
        result = await self.store.commit_thread(commit)
        if isinstance(result, ConflictResult):
            raise _DemoFailure(
                f"step {self.step} expected a commit but got a conflict "
                f"(current version: {self.short_version(result.current_version)})"
            )
        self.version = result.thread.version if result.thread is not None else None
        self.detail(
            "committed",
            f"{self.short_version(self.version)} {self.g.dot} committedAt "
            f"{format_timestamp(result.committed_at)}",
        )
        return result

    async def conflict(self, commit: dict[str, Any]) -> ConflictResult:
        self.show_commit(commit)
        result = await self.store.commit_thread(commit)
        if isinstance(result, CommittedResult):
            raise _DemoFailure(f"step {self.step} expected a conflict but the commit was applied")
        self.detail(
            "conflict",
            f"nothing applied {self.g.dot} current version is "
            f"{self.short_version(result.current_version)}",
        )
        return result

    def tick(self, seconds: float = 1) -> None:
        if self.clock is not None:
            self.clock.advance(timedelta(seconds=seconds))

    # ------------------------------------------------------------ the story

    async def run(self) -> None:
        g = self.g
        self.say(
            f"pai-storage demo {g.dot} {make_url(self.url)} {g.dot} scope {self.scope} "
            f"{g.dot} thread {self.thread}"
        )
        try:
            await self.story()
        except BaseException:
            await self.cleanup_quietly()
            raise
        await self.cleanup()

    async def story(self) -> None:
        g = self.g
        self.title_line(
            f"Create the thread: user message m1, run r1 (running), lease r1 {g.arrow} w1"
        )
        await self.commit(
            b.create(
                self.scope,
                self.thread,
                {
                    "messages": [
                        {"type": "insert", "record": b.message("m1", _QUESTION_1, run_id="r1")}
                    ],
                    "runs": [{"type": "insert", "record": b.run("r1", inputs=["m1"])}],
                    "lease": b.acquire("r1", "w1", 30_000, "send"),
                },
                title=self.title,
            )
        )
        await self.show_state()

        self.tick()
        self.title_line("A second user turn arrives while r1 runs: queue run r2 with item q1")
        await self.commit(
            self.update(
                {
                    "runs": [
                        {
                            "type": "insert",
                            "record": b.run("r2", "queued", queue_item_id="q1"),
                        }
                    ],
                    "queuedItems": [
                        {"type": "insert", "record": b.queued_item("q1", "r2", _QUESTION_2)}
                    ],
                }
            )
        )
        await self.show_state()

        self.tick()
        self.title_line("Stream r1's answer: insert assistant message m2 (streaming)")
        streaming = b.message(
            "m2", _ANSWER_1[:12], role="assistant", run_id="r1", relation="output"
        )
        streaming["status"] = "streaming"
        await self.commit(self.update({"messages": [{"type": "insert", "record": streaming}]}))
        await self.show_state()

        self.tick()
        self.title_line("Finish streaming: replace m2 (complete) and renew w1's lease")
        done = b.message("m2", _ANSWER_1, role="assistant", run_id="r1", relation="output")
        await self.commit(
            self.update(
                {
                    "messages": [{"type": "replace", "record": done}],
                    "lease": b.renew("r1", "w1", 30_000),
                }
            )
        )
        await self.show_state()

        self.tick()
        self.title_line("Finish r1 (completed) and release its lease")
        await self.commit(
            self.update(
                {
                    "runs": [
                        {"type": "replace", "record": b.run("r1", "completed", inputs=["m1"])}
                    ],
                    "lease": b.release("r1", "w1"),
                }
            )
        )
        revision_5 = self.version
        await self.show_state()

        self.tick()
        self.title_line(
            f"Admit r2: delete q1, insert its input m3, r2 running, lease r2 {g.arrow} w2"
        )
        await self.commit(
            self.update(
                {
                    "messages": [
                        {"type": "insert", "record": b.message("m3", _QUESTION_2, run_id="r2")}
                    ],
                    "runs": [{"type": "replace", "record": b.run("r2", inputs=["m3"])}],
                    "queuedItems": [{"type": "delete", "id": "q1"}],
                    "lease": b.acquire("r2", "w2", self.short_lease_ms, "send"),
                }
            )
        )
        await self.show_state()

        self.tick()
        self.title_line("A stale writer still holding revision 5 tries to fail r1")
        failed = b.run("r1", "failed", inputs=["m1"])
        failed["error"] = {"code": "timeout", "message": "gave up waiting"}
        await self.conflict(
            self.update({"runs": [{"type": "replace", "record": failed}]}, revision_5)
        )

        self.title_line("w2 stops renewing; its lease expires and w3 takes over r2")
        if self.clock is not None:
            self.clock.advance(timedelta(milliseconds=self.short_lease_ms + 1_000))
            self.detail("clock", "moved past the lease's expiry (manual clock)")
        else:
            wait = self.short_lease_ms / 1000 + 0.5
            self.detail("waiting", f"{wait:.1f} s for the lease to expire on the server clock")
            await asyncio.sleep(wait)
        await self.commit(self.update({"lease": b.acquire("r2", "w3", 30_000, "resume")}))
        await self.show_state()

        self.tick()
        self.title_line("r2 completes: insert its answer m4, r2 completed, release w3's lease")
        await self.commit(
            self.update(
                {
                    "messages": [
                        {
                            "type": "insert",
                            "record": b.message(
                                "m4", _ANSWER_2, role="assistant", run_id="r2", relation="output"
                            ),
                        }
                    ],
                    "runs": [
                        {"type": "replace", "record": b.run("r2", "completed", inputs=["m3"])}
                    ],
                    "lease": b.release("r2", "w3"),
                }
            )
        )
        await self.show_state()

        self.tick()
        self.title_line(
            f"Regenerate r1's answer: truncate after m1 and r1, r1 running again, "
            f"lease r1 {g.arrow} w1"
        )
        await self.commit(
            self.update(
                {
                    "messages": [{"type": "truncate", "afterId": "m1"}],
                    "runs": [
                        {"type": "truncate", "afterId": "r1"},
                        {
                            "type": "replace",
                            "record": b.run("r1", inputs=["m1"], operation="regenerate"),
                        },
                    ],
                    "lease": b.acquire("r1", "w1", 30_000, "regenerate"),
                }
            )
        )
        await self.show_state()

        self.tick()
        await self.final_read()

    async def final_read(self) -> None:
        g = self.g
        self.title_line("Read the thread: the root and every page come from one version")
        result = await self.read()
        root = result.thread
        if root is None:
            raise _DemoFailure("the thread is missing")
        pages = [p for p in (result.messages, result.runs, result.queued_items) if p is not None]
        same = all(p.version == root.version for p in pages)
        self.detail("observed", format_timestamp(result.observed_at))
        self.detail(
            "version",
            f"{self.short_version(root.version)} "
            f"({'root and all pages agree' if same else 'PAGES DISAGREE'})",
        )
        if not same:
            raise _DemoFailure("a read returned pages from different versions")
        transcript = await self.store.read_thread(
            b.read(
                self.scope,
                self.thread,
                messages={"type": "page", "view": "transcript", "page": {"limit": 100}},
            )
        )
        lines = [
            self.message_line(m) for m in (transcript.messages.items if transcript.messages else [])
        ]
        self.show_family("transcript", lines)

        self.title_line("List the scope's threads (newest update first)")
        listed = await self.store.list_threads({"scopeKey": self.scope, "limit": 10})
        for thread in listed.items:
            self.detail("thread", self.thread_line(thread))
        if not listed.items:
            raise _DemoFailure("the thread is missing from the list")
        self.detail("more", "yes" if listed.next_page_token else f"no {g.dash} that is all")

    def thread_line(self, thread: ThreadRecord) -> str:
        return (
            f"{thread.thread_id} {self.g.dot} {thread.title!r} {self.g.dot} agent {thread.agent} "
            f"{self.g.dot} rev {thread.version.revision} {self.g.dot} updated "
            f"{format_timestamp(thread.updated_at)}"
        )

    async def cleanup_quietly(self) -> None:
        """After a failure: delete whatever version of the thread exists, ignoring errors."""
        try:
            current = await self.store.read_thread(b.read(self.scope, self.thread))
            if current.thread is not None:
                await self.store.commit_thread(
                    b.delete(self.scope, self.thread, current.thread.version)
                )
        except ThreadStoreError:
            pass

    async def cleanup(self) -> None:
        if self.version is None:
            return
        self.title_line("Clean up: delete the thread")
        await self.commit(b.delete(self.scope, self.thread, self.version))
        await self.show_state()


_RUNTIME = frozenset({"kv", "state", "snapshots", "guard"})


async def _run_demo(url: str, out: TextIO, show_json: bool, part: str = "all") -> None:
    backend, parsed = backend_for_url(url)
    clock = ManualClock(system_clock()) if backend.name == "memory" else None
    options: dict[str, Any] = {"clock": clock} if clock is not None else {}
    if part in ("all", "threads"):
        async with backend.open(parsed, **options) as store:
            await _Demo(store, url, out, clock=clock, show_json=show_json).run()
    if part in ("all", "runtime"):
        missing = sorted(_RUNTIME - backend.components)
        if missing:
            print(
                f"\nPart 2 (the runtime stores) skipped: the {backend.name} backend does not "
                f"provide {', '.join(missing)}",
                file=out,
            )
            return
        async with connect(parsed, **options) as stores:
            await RuntimeDemo(stores, out, clock).run()


def _cmd_demo(args: argparse.Namespace) -> int:
    url: str = args.url
    mask = _password_masker(url)
    try:
        asyncio.run(_run_demo(url, sys.stdout, args.json, args.part))
    except StorageError as exc:
        _error(f"{type(exc).__name__}: {exc}", mask)
        return EXIT_ERROR
    except _DemoFailure as exc:
        _error(f"the demo did not go as specified: {exc}", mask)
        return EXIT_ERROR
    print(file=sys.stdout)
    print("demo complete", file=sys.stdout)
    return EXIT_OK


# ---------------------------------------------------------------- check


def _broken_backends() -> list[str]:
    """Messages for installed backend entry points that failed to load."""
    loaded = available_backends()
    notes = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in loaded:
            continue
        try:
            get_backend(ep.name)
        except ThreadStoreConfigurationError as exc:
            notes.append(str(exc))
    return notes


async def _run_check(url: str) -> list[tuple[str, str]]:
    backend, parsed = backend_for_url(url)
    backend.check_driver()
    info = await backend.server_info(parsed)
    rows = [
        ("url", str(parsed)),
        ("backend", info.backend),
        ("server", info.server_version or "unknown"),
        (
            "transactions",
            "unknown" if info.transactions is None else ("yes" if info.transactions else "no"),
        ),
    ]
    shown = {key for key, _ in rows}
    rows.extend((key, value) for key, value in info.details.items() if key not in shown)
    return rows


def _cmd_check(args: argparse.Namespace) -> int:
    url: str = args.url
    mask = _password_masker(url)
    try:
        rows = asyncio.run(_run_check(url))
    except ThreadStoreConfigurationError as exc:
        _error(f"{type(exc).__name__}: {exc}", mask)
        if "installed schemes" in str(exc):
            for note in _broken_backends():
                print(f"pai-storage: note: {mask(note)}", file=sys.stderr)
        return EXIT_ERROR
    except StorageError as exc:  # a runtime-only backend raises the general classes
        _error(f"{type(exc).__name__}: {exc}", mask)
        return EXIT_ERROR
    width = max(len(key) for key, _ in rows) + 2
    for key, value in rows:
        print(f"{key:<{width}}{mask(value)}")
    print("ok")
    return EXIT_OK


# ---------------------------------------------------------------- bench


def _cmd_bench(extra: Sequence[str]) -> int:
    # Imported only when asked for: the other commands never need it.
    benchmark = importlib.import_module("pai_storage.benchmark")
    parser = argparse.ArgumentParser(
        prog="pai-storage bench", description="Measure a backend's read and commit latency."
    )
    benchmark.add_arguments(parser)
    # benchmark.main reports its own errors (passwords masked) and returns the status.
    status: int = asyncio.run(benchmark.main(parser.parse_args(list(extra))))
    return status


# ---------------------------------------------------------------- copy, export, import


class _Progress:
    """A progress bar on stderr: rich's or tqdm's when installed, else a plain line."""

    def __init__(self, label: str, stream: TextIO, *, unit: str = "thread") -> None:
        self.label = label
        self.stream = stream
        self.unit = unit
        self.total = 0
        self.done = 0
        self._bar: Any = None
        self._rich: Any = None

    def start(self, total: int) -> None:
        self.total = total
        interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        if interactive and importlib.util.find_spec("rich") is not None:
            progress = importlib.import_module("rich.progress")
            console = importlib.import_module("rich.console").Console(file=self.stream)
            self._rich = progress.Progress(console=console)
            self._rich.start()
            self._bar = self._rich.add_task(self.label, total=total)
        elif interactive and importlib.util.find_spec("tqdm") is not None:
            tqdm = importlib.import_module("tqdm").tqdm
            self._bar = tqdm(total=total, desc=self.label, file=self.stream, unit=self.unit)

    def advance(self, _key: object = None) -> None:
        self.done += 1
        if self._rich is not None:
            self._rich.update(self._bar, advance=1)
        elif self._bar is not None:
            self._bar.update(1)
        elif self.done == self.total or self.done % 100 == 0:
            print(f"{self.label}: {self.done}/{self.total} {self.unit}s", file=self.stream)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self._bar is not None:
            self._bar.close()


def _open_threads(url: str) -> ThreadStore:
    backend, parsed = backend_for_url(url)
    return backend.open(parsed)


async def _run_copy(args: argparse.Namespace) -> int:
    from .transfer import copy_threads

    if args.all:
        return await _run_copy_all(args)
    progress = _Progress("copy", sys.stderr)
    async with _open_threads(args.source) as source, _open_threads(args.target) as target:
        try:
            report = await copy_threads(
                source,
                target,
                args.scope,
                verify=not args.no_verify,
                on_total=progress.start,
                on_thread=progress.advance,
            )
        finally:
            progress.close()
    _print_thread_report(report)
    return EXIT_OK if report.ok else EXIT_ERROR


def _print_thread_report(report: CopyReport) -> None:
    print(
        f"copied {len(report.copied)} thread(s), {len(report.present)} already present, "
        f"{report.verified} verified, {len(report.mismatched)} mismatched"
    )
    for scope_key, thread_id in report.mismatched:
        print(f"mismatch: scope {scope_key!r} thread {thread_id!r}", file=sys.stderr)


async def _run_copy_all(args: argparse.Namespace) -> int:
    from .transfer import copy_runtime, copy_threads, require_enumeration

    if args.scope is not None:
        raise ConfigurationError(
            "--all copies every scope of every store; it cannot be combined with --scope"
        )
    async with connect(args.source) as source, connect(args.target) as target:
        require_enumeration(source, target)  # refuse before anything is written
        progress = _Progress("copy threads", sys.stderr)
        try:
            threads = await copy_threads(
                source.threads,
                target.threads,
                verify=not args.no_verify,
                on_total=progress.start,
                on_thread=progress.advance,
            )
        finally:
            progress.close()
        _print_thread_report(threads)
        progress = _Progress("copy runtime data", sys.stderr, unit="item")
        try:
            runtime = await copy_runtime(
                source,
                target,
                verify=not args.no_verify,
                on_total=progress.start,
                on_item=progress.advance,
            )
        finally:
            progress.close()
    counts = ", ".join(
        f"{runtime.count(component)} {noun}"
        for component, noun in (
            ("kv", "item(s)"),
            ("state", "session(s)"),
            ("snapshots", "snapshot(s)"),
        )
    )
    print(
        f"copied {len(runtime.copied)} runtime item(s), {len(runtime.present)} already present "
        f"({counts} in all), {runtime.verified} verified, {len(runtime.mismatched)} mismatched"
    )
    for item in runtime.mismatched:
        print(f"mismatch: {item}", file=sys.stderr)
    return EXIT_OK if threads.ok and runtime.ok else EXIT_ERROR


async def _run_export(args: argparse.Namespace, stream: TextIO) -> int:
    count = 0
    async with _open_threads(args.url) as store:
        async for line in store.export_threads(args.scope):
            stream.write(line)
            count += line.startswith('{"kind":"thread"')
    print(f"exported {count} thread(s)", file=sys.stderr)
    return EXIT_OK


async def _run_import(args: argparse.Namespace, stream: TextIO) -> int:
    async with _open_threads(args.url) as store:
        if args.fail_on_existing:
            report = await store.import_threads(stream, on_conflict="fail")
        else:
            report = await store.import_threads(stream, on_conflict="skip")
    print(f"imported {len(report.imported)} thread(s), skipped {len(report.skipped)} existing")
    return EXIT_OK


def _cmd_transfer(args: argparse.Namespace) -> int:
    urls = [getattr(args, name, None) for name in ("url", "source", "target")]
    maskers = [_password_masker(u) for u in urls if u]

    def mask(text: str) -> str:
        for one in maskers:
            text = one(text)
        return text

    try:
        if args.command == "copy":
            return asyncio.run(_run_copy(args))
        if args.command == "export":
            if args.output in (None, "-"):
                return asyncio.run(_run_export(args, sys.stdout))
            with open(args.output, "w", encoding="utf-8", newline="") as out:
                return asyncio.run(_run_export(args, out))
        if args.file == "-":
            return asyncio.run(_run_import(args, sys.stdin))
        with open(args.file, encoding="utf-8", newline="") as source:
            return asyncio.run(_run_import(args, source))
    except StorageError as exc:
        _error(f"{type(exc).__name__}: {exc}", mask)
        return EXIT_ERROR
    except OSError as exc:
        _error(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc), mask)
        return EXIT_ERROR
    except UnicodeDecodeError as exc:
        _error(f"{args.file}: not UTF-8 text ({exc.reason})", mask)
        return EXIT_ERROR


# ---------------------------------------------------------------- entry point


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pai-storage",
        description="Durable, versioned storage for AI-agent conversation state.",
    )
    parser.add_argument("--version", action="version", version=f"pai-storage {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="play one agent turn: a thread, then the runtime stores",
        description=(
            "Part 1 plays the worked example of one turn on a fresh thread in a fresh scope; "
            "part 2 plays one agent turn with every runtime store (guard, agent state, "
            "key-value workspace, snapshots) and a guard takeover. Everything is deleted after."
        ),
    )
    demo.add_argument(
        "url", metavar="URL", nargs="?", default="memory://", help="store URL (default memory://)"
    )
    demo.add_argument("--json", action="store_true", help="also print each commit's JSON input")
    demo.add_argument(
        "--runtime",
        dest="part",
        action="store_const",
        const="runtime",
        default="all",
        help="play only part 2: one agent turn with the runtime stores and a guard takeover",
    )
    demo.add_argument(
        "--threads-only",
        dest="part",
        action="store_const",
        const="threads",
        help="play only part 1: the worked example on a thread",
    )

    check = sub.add_parser(
        "check",
        help="initialize a store and describe its backend",
        description="Initialize a store and report its backend, server version and transactions.",
    )
    check.add_argument("url", metavar="URL", help="store URL, e.g. postgresql://user@host/db")

    copy = sub.add_parser(
        "copy",
        help="copy threads from one store to another, resumably, and verify them",
        description=(
            "Copy every thread (or those of --scope) from SRC_URL to DST_URL exactly "
            "(versions, timestamps, positions). Threads already in the target with the same "
            "content are skipped, so an interrupted copy resumes; afterwards each thread's "
            "digest is compared on both sides. With --all the key-value items, agent-state "
            "sessions and snapshots follow, copied by value (versions restart, snapshots take "
            "the target's creation time; locks are not copied) and compared the same way. "
            "Exits 1 when anything differs."
        ),
    )
    copy.add_argument("source", metavar="SRC_URL", help="store to copy from")
    copy.add_argument("target", metavar="DST_URL", help="store to copy to")
    copy.add_argument("--scope", metavar="S", default=None, help="copy only this scope")
    copy.add_argument(
        "--all",
        action="store_true",
        help=(
            "also copy the runtime stores (key-value items, agent-state sessions, snapshots) "
            "by value; every scope"
        ),
    )
    copy.add_argument("--no-verify", action="store_true", help="skip the digest comparison")

    export = sub.add_parser(
        "export",
        help="write threads as versioned JSON Lines",
        description="Write every thread (or those of --scope) in the format of docs/lifecycle.md.",
    )
    export.add_argument("url", metavar="URL", help="store URL")
    export.add_argument("--scope", metavar="S", default=None, help="export only this scope")
    export.add_argument(
        "-o", "--output", metavar="FILE", default=None, help="write to FILE (default stdout)"
    )

    imp = sub.add_parser(
        "import",
        help="restore threads from an export",
        description=(
            "Restore every thread of FILE ('-': stdin) exactly. Each thread is written whole or "
            "not at all; existing threads are skipped (or, with --fail-on-existing, stop the "
            "import). A corrupt line stops it with its line number."
        ),
    )
    imp.add_argument("url", metavar="URL", help="store URL")
    imp.add_argument("file", metavar="FILE", help="an export file, or '-' for stdin")
    imp.add_argument(
        "--fail-on-existing", action="store_true", help="stop at a thread that exists already"
    )

    # The benchmark's options belong to pai_storage.benchmark, imported only when used.
    sub.add_parser(
        "bench",
        help="benchmark a backend (run 'pai-storage bench --help' for options)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "bench":
            return _cmd_bench(extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command == "demo":
            return _cmd_demo(args)
        if args.command in ("copy", "export", "import"):
            return _cmd_transfer(args)
        return _cmd_check(args)
    except KeyboardInterrupt:
        print("pai-storage: interrupted", file=sys.stderr)
        return 130
