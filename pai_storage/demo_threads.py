"""``pai-storage demo``, part 1: the worked example of one turn on a thread, step by step.

It plays ``docs/commits.md#worked-example-one-turn`` on a fresh thread in a
fresh scope, printing what each step commits and the state it leaves; part 2
(the runtime stores) is :mod:`pai_storage.demo_runtime`. The command line is
:mod:`pai_storage.cli`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TextIO

from . import builders as b
from .backend import format_timestamp  # the public name, wherever the records module keeps it
from .bundle import connect
from .clock import ManualClock, system_clock
from .demo_runtime import RuntimeDemo
from .errors import ThreadStoreError
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
)
from .registry import backend_for_url
from .store import ThreadStore
from .url import make_url

__all__ = ["DemoFailure", "run_demo"]


class DemoFailure(Exception):
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
            raise DemoFailure(
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
            raise DemoFailure(f"step {self.step} expected a conflict but the commit was applied")
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
            raise DemoFailure("the thread is missing")
        pages = [p for p in (result.messages, result.runs, result.queued_items) if p is not None]
        same = all(p.version == root.version for p in pages)
        self.detail("observed", format_timestamp(result.observed_at))
        self.detail(
            "version",
            f"{self.short_version(root.version)} "
            f"({'root and all pages agree' if same else 'PAGES DISAGREE'})",
        )
        if not same:
            raise DemoFailure("a read returned pages from different versions")
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
            raise DemoFailure("the thread is missing from the list")
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


async def run_demo(url: str, out: TextIO, show_json: bool, part: str = "all") -> None:
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
