"""The ``pai-storage`` command line: demo, check, bench, copy, export and import.

::

    pai-storage demo [URL]          play the worked example of one turn (default memory://)
    pai-storage check URL           initialize a store and describe the backend
    pai-storage bench URL [...]     run the benchmark (pai_storage.benchmark)
    pai-storage copy SRC DST        copy every thread (or --scope S) to another store, verified
    pai-storage export URL          write the threads as JSON Lines (docs/lifecycle.md)
    pai-storage import URL FILE     restore threads from an export
    pai-storage watch URL S T       print each change of thread T of scope S as a JSON line
    pai-storage --version

Every command exits 0 on success and 1 on a :class:`StorageError`, whose
message goes to stderr without a traceback and with any URL password masked.
Usage errors exit 2. ``bench`` has its own statuses (see
:mod:`pai_storage.benchmark`).

``check``, ``copy``, ``import`` and ``bench`` take ``--json``: stdout is then
one JSON object, ``"ok": true`` with the results, or ``"ok": false`` with
``"error": {"type": ..., "message": ...}`` (the message also goes to stderr).

The demo plays ``docs/commits.md#worked-example-one-turn`` step by step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, TextIO

from . import __version__
from .bundle import connect
from .demo_threads import DemoFailure, run_demo
from .errors import (
    ConfigurationError,
    StorageError,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
)
from .models import Message, ThreadVersion
from .registry import ENTRY_POINT_GROUP, available_backends, backend_for_url, get_backend
from .store import ThreadStore
from .transfer import CopyReport
from .url import StoreURL, make_url, redact
from .watch import ThreadChange, check_version

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1


# ---------------------------------------------------------------- output helpers


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


def _print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, ensure_ascii=False, indent=2))


def _json_error(exc: BaseException, mask: Callable[[str], str]) -> dict[str, Any]:
    return {"ok": False, "error": {"type": type(exc).__name__, "message": mask(str(exc))}}


# ---------------------------------------------------------------- demo


def _cmd_demo(args: argparse.Namespace) -> int:
    url: str = args.url
    mask = _password_masker(url)
    try:
        asyncio.run(run_demo(url, sys.stdout, args.json, args.part))
    except StorageError as exc:
        _error(f"{type(exc).__name__}: {exc}", mask)
        return EXIT_ERROR
    except DemoFailure as exc:
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


def _durability(backend: str, url: StoreURL) -> str:
    """What a commit acknowledged by this URL's store survives, when the backend
    does not report it itself."""
    if backend == "sql" and url.scheme == "sqlite":
        path = url.path[1:]  # after the slash that ends the (empty) host
        if path in ("", ":memory:"):
            return "none (an in-memory database: nothing is written to disk)"
        return (
            f"file {path} (SQLite, WAL journal: a commit is on disk when it returns; one machine)"
        )
    if backend == "sql":
        return (
            "server (InnoDB: a commit is durable as innodb_flush_log_at_trx_commit "
            "is set on the server; 1, the default, flushes every commit)"
        )
    if backend == "postgres":
        return (
            "server (a commit is durable as synchronous_commit is set on the server; "
            "docs/postgres.md shows a synchronous standby)"
        )
    if backend == "mongo":
        return "replica set (writes acknowledged by a majority of members, w: majority)"
    return f"not reported by the {backend} backend"


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
    if "durability" not in info.details:
        rows.append(("durability", _durability(backend.name, parsed)))
    return rows


def _cmd_check(args: argparse.Namespace) -> int:
    url: str = args.url
    mask = _password_masker(url)
    try:
        rows = asyncio.run(_run_check(url))
    except StorageError as exc:  # a runtime-only backend raises the general classes
        _error(f"{type(exc).__name__}: {exc}", mask)
        if isinstance(exc, ConfigurationError) and "installed schemes" in str(exc):
            for note in _broken_backends():
                print(f"pai-storage: note: {mask(note)}", file=sys.stderr)
        if args.json:
            _print_json(_json_error(exc, mask))
        return EXIT_ERROR
    if args.json:
        _print_json({"ok": True, **{key: mask(value) for key, value in rows}})
        return EXIT_OK
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
    parser.add_argument(
        "--json", action="store_true", help="print the results as one JSON object on stdout"
    )
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


def _same_store(source: str, target: str) -> bool:
    """Whether two URLs name one store (one backend, server, database and path)."""
    backend, a = backend_for_url(source)
    other, b = backend_for_url(target)
    if backend.name != other.name:
        return False

    def where(url: StoreURL) -> tuple[object, ...]:
        path = url.path
        if url.scheme == "sqlite" and path not in ("", "/", "/:memory:"):
            path = os.path.realpath(path[1:])
        return (url.host or "", url.port, url.username, path, url.query)

    return where(a) == where(b)


def _refuse_same(args: argparse.Namespace) -> None:
    if _same_store(args.source, args.target):
        raise ConfigurationError(
            "the source and the target are the same store; copy to another URL "
            "(a copy onto itself would only compare every thread with itself)"
        )


async def _run_copy(args: argparse.Namespace) -> int:
    from .transfer import copy_threads

    if args.all:
        return await _run_copy_all(args)
    _refuse_same(args)
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
    if args.json:
        _print_json({"ok": report.ok, "threads": _thread_report(report)})
    else:
        _print_thread_report(report)
    return EXIT_OK if report.ok else EXIT_ERROR


def _thread_report(report: CopyReport) -> dict[str, Any]:
    return {
        "copied": len(report.copied),
        "present": len(report.present),
        "verified": report.verified,
        "mismatched": [{"scopeKey": s, "threadId": t} for s, t in report.mismatched],
    }


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
    _refuse_same(args)
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
        if not args.json:
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
    ok = threads.ok and runtime.ok
    if args.json:
        _print_json(
            {
                "ok": ok,
                "threads": _thread_report(threads),
                "runtime": {
                    "copied": len(runtime.copied),
                    "present": len(runtime.present),
                    "verified": runtime.verified,
                    "mismatched": [
                        {"component": item.component, "where": list(item.where)}
                        for item in runtime.mismatched
                    ],
                    **{c: runtime.count(c) for c in ("kv", "state", "snapshots")},
                },
            }
        )
        return EXIT_OK if ok else EXIT_ERROR
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
    return EXIT_OK if ok else EXIT_ERROR


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
    if getattr(args, "json", False):
        _print_json(
            {
                "ok": True,
                "imported": [{"scopeKey": s, "threadId": t} for s, t in report.imported],
                "skipped": [{"scopeKey": s, "threadId": t} for s, t in report.skipped],
            }
        )
        return EXIT_OK
    print(f"imported {len(report.imported)} thread(s), skipped {len(report.skipped)} existing")
    return EXIT_OK


async def _run_watch(args: argparse.Namespace) -> int:
    if args.follow is not None and args.after is not None:
        raise ThreadStoreInvariantError("--after does not apply to --follow (it follows one reply)")
    after = None if args.after is None else _after_version(args.after)
    shown = 0
    async with _open_threads(args.url) as store:
        stream: AsyncGenerator[Message | ThreadChange, None]
        if args.follow is not None:  # one reply's message, until its run is closed
            chat = store.conversation(args.scope, args.thread)
            stream = chat.follow(args.follow or None, interval=args.interval)
        else:
            stream = store.watch(args.scope, args.thread, after=after, interval=args.interval)
        async with contextlib.aclosing(stream):  # ended before the store closes
            async for item in stream:
                print(json.dumps(item.to_json(), ensure_ascii=False), flush=True)
                shown += 1
                if shown == args.count:
                    break
    return EXIT_OK


def _after_version(text: str) -> ThreadVersion | None:
    try:
        return check_version(json.loads(text))
    except ValueError as exc:
        if isinstance(exc, StorageError):
            raise
        raise ThreadStoreInvariantError(
            'after must be a version as JSON: {"threadInstanceId": "...", "revision": N}'
        ) from None


def _cmd_watch(args: argparse.Namespace) -> int:
    mask = _password_masker(args.url)
    try:
        return asyncio.run(_run_watch(args))
    except StorageError as exc:
        _error(f"{type(exc).__name__}: {exc}", mask)
        return EXIT_ERROR


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
        failure: BaseException = exc
    except OSError as exc:
        _error(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc), mask)
        failure = exc
    except UnicodeDecodeError as exc:
        _error(f"{args.file}: not UTF-8 text ({exc.reason})", mask)
        failure = exc
    if getattr(args, "json", False):
        _print_json(_json_error(failure, mask))
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
    check.add_argument("--json", action="store_true", help="print one JSON object on stdout")

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
    copy.add_argument("--json", action="store_true", help="print one JSON object on stdout")

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
    imp.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    watch = sub.add_parser(
        "watch",
        help="print each committed change of one thread as a JSON line",
        description=(
            "Follow thread THREAD of scope SCOPE and print one JSON object per change "
            "(docs/watch.md): the new version, the one before, deleted, committedAt and the "
            "root without privateMetadata. Runs until interrupted or --count changes. With "
            "--follow, prints a streamed reply's message instead, until the reply ends."
        ),
    )
    watch.add_argument("url", metavar="URL", help="store URL")
    watch.add_argument("scope", metavar="SCOPE", help="the thread's scope key")
    watch.add_argument("thread", metavar="THREAD", help="the thread id")
    watch.add_argument(
        "--interval", type=float, default=0.2, help="seconds between two polls (default 0.2)"
    )
    watch.add_argument(
        "--after",
        metavar="VERSION",
        default=None,
        help='report every change after this version (JSON: {"threadInstanceId": ..., '
        '"revision": N}); default: from now',
    )
    watch.add_argument("--count", type=int, default=None, help="stop after N changes")
    watch.add_argument(
        "--follow",
        metavar="MESSAGE",
        nargs="?",
        const="",
        default=None,
        help="print the newest reply (or message MESSAGE) as a JSON line each time its text "
        "or status changes, and stop when its run is closed (docs/conversation.md)",
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
        if args.command == "watch":
            return _cmd_watch(args)
        return _cmd_check(args)
    except KeyboardInterrupt:
        print("pai-storage: interrupted", file=sys.stderr)
        return 130
