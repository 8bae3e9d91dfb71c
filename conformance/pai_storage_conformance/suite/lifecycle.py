"""Thread lifecycle (docs/lifecycle.md): retention sweep, scope erasure, fork, export and import.

Runs on the ``lifecycle_store`` fixture: the ``store`` of a backend that
declares the ``lifecycle`` capability; any other backend reports the topic as
not provided.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pai_storage import (
    CommittedResult,
    ConflictResult,
    ManualClock,
    ThreadExistsError,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
)
from pai_storage import builders as b
from pai_storage.backend import ThreadAggregate
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.transfer import decode_threads, encode_thread, header_line

from ._support import new_scope

__all__ = ["Conversation", "LifecycleTests", "build_conversation", "read_all"]

pytestmark = pytest.mark.asyncio

_OLD = datetime(2001, 1, 1, tzinfo=UTC)
"""Sweep tests run their clock here, long before any other test's threads, so a
sweep of every scope never touches another test's threads on a shared store."""

_OLDEST = datetime(1990, 1, 1, tzinfo=UTC)
"""The one test that sweeps every scope runs its clock here, before even ``_OLD``."""


async def _commit(store: ThreadStore, commit: dict[str, Any]) -> ThreadRecord:
    result = await store.commit_thread(commit)
    assert isinstance(result, CommittedResult), result
    assert result.thread is not None
    return result.thread


@dataclass
class Conversation:
    """A thread built turn by turn: closed turns, then optionally an open run and a queue."""

    root: ThreadRecord
    closed_runs: list[str]
    open_run: str | None
    queued_run: str | None


async def build_conversation(
    store: ThreadStore,
    clock: ManualClock | None,
    scope: str,
    thread_id: str,
    *,
    turns: int = 3,
    open_turn: bool = True,
    queued: bool = True,
    statuses: tuple[str, ...] = ("completed", "failed", "cancelled"),
) -> Conversation:
    """Commit ``turns`` closed turns (input ``m<i>``, output ``a<i>``, run ``r<i>``),
    a standalone note after the first, then an open run ``r-open`` holding the lease
    with its input ``m-open``, then a queued run ``r-queued`` with item ``q1``."""

    def tick() -> None:
        if clock is not None:
            clock.advance(ms=1_000)

    fields: dict[str, Any] = {"title": "lifecycle", "metadata": {"k": [1, 1.0, "x"]}}
    root = await _commit(store, b.create(scope, thread_id, **fields))
    closed: list[str] = []
    for i in range(turns):
        tick()
        run_id, status = f"r{i}", statuses[i % len(statuses)]
        root = await _commit(
            store,
            b.update_at(
                scope,
                thread_id,
                root.version,
                {
                    "messages": [b.insert(b.message(f"m{i}", f"question {i}", run_id=run_id))],
                    "runs": [b.insert(b.run(run_id, "running", inputs=[f"m{i}"]))],
                    "lease": b.acquire(run_id, "worker"),
                },
                root=b.root(**fields),
            ),
        )
        tick()
        answer = b.message(f"a{i}", f"answer {i}", role="assistant", run_id=run_id)
        answer["association"]["relation"] = "output"
        changes: dict[str, Any] = {
            "messages": [b.insert(answer)],
            "runs": [b.replace(b.run(run_id, status, inputs=[f"m{i}"]))],
            "lease": b.release(run_id, "worker"),
        }
        if i == 0:
            changes["messages"].append(b.insert(b.message("note", "a standalone note")))
        root = await _commit(
            store, b.update_at(scope, thread_id, root.version, changes, root=b.root(**fields))
        )
        closed.append(run_id)
    open_run = queued_run = None
    if open_turn:
        tick()
        open_run = "r-open"
        root = await _commit(
            store,
            b.update_at(
                scope,
                thread_id,
                root.version,
                {
                    "messages": [b.insert(b.message("m-open", "still thinking", run_id=open_run))],
                    "runs": [b.insert(b.run(open_run, "running", inputs=["m-open"]))],
                    "lease": b.acquire(open_run, "worker"),
                },
                root=b.root(**fields),
            ),
        )
    if queued:
        tick()
        queued_run = "r-queued"
        root = await _commit(
            store,
            b.update_at(
                scope,
                thread_id,
                root.version,
                {
                    "runs": [b.insert(b.run(queued_run, "queued", queue_item_id="q1"))],
                    "queuedItems": [b.insert(b.queued_item("q1", queued_run, {"text": "next"}))],
                },
                root=b.root(**fields),
            ),
        )
    return Conversation(root, closed, open_run, queued_run)


async def read_all(store: ThreadStore, scope: str, thread_id: str) -> dict[str, Any]:
    """The whole thread through public reads: root and every family, oldest first."""
    out: dict[str, Any] = {"thread": None, "messages": [], "runs": [], "queuedItems": []}
    for family, attr in (
        ("messages", "messages"),
        ("runs", "runs"),
        ("queuedItems", "queued_items"),
    ):
        token: str | None = None
        while True:
            page: dict[str, Any] = {"limit": 100}
            if token is not None:
                page["pageToken"] = token
            selection: dict[str, Any] = {"type": "page", "page": page}
            if family == "messages":
                selection["view"] = "raw"
            read: ThreadReadResult = await store.read_thread(
                b.read(scope, thread_id, **{family: selection})
            )
            if read.thread is None:
                return out
            out["thread"] = read.thread.to_json()
            found = getattr(read, attr)
            out[family].extend(item.to_json() for item in found.items)
            token = found.next_page_token
            if token is None:
                break
    return out


async def _export(store: ThreadStore, scope: str | None, **options: Any) -> list[str]:
    return [line async for line in store.export_threads(scope, **options)]


async def _decoded(lines: list[str]) -> list[ThreadAggregate]:
    return [aggregate async for _, aggregate in decode_threads(lines)]


async def _ids(store: ThreadStore, scope: str) -> list[str]:
    page = await store.list_threads({"scopeKey": scope, "limit": 100, "includeHidden": True})
    return sorted(t.thread_id for t in page.items)


class _Stream:
    """A reply streaming into a thread while the body runs: one commit every ``pause``
    seconds (``0``: back to back), each adding one assistant message to the open
    run; every fifth closes it and opens the next turn with its question."""

    def __init__(
        self, store: ThreadStore, scope: str, thread_id: str, root: ThreadRecord, pause: float
    ) -> None:
        self._store, self._scope, self._thread_id = store, scope, thread_id
        self._root, self._pause = root, pause
        self.commits = 0
        self._moved = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def wait_for(self, commits: int) -> None:
        """Wait (bounded) until at least ``commits`` commits landed."""
        async with asyncio.timeout(60):
            while self.commits < commits:
                self._moved.clear()
                await self._moved.wait()

    async def _next(self) -> None:
        turn, step = divmod(self.commits, 5)
        run_id = f"stream-{turn}"
        changes: dict[str, Any]
        if step == 0:
            question = b.message(f"{run_id}-q", "go on", run_id=run_id)
            changes = {
                "messages": [b.insert(question)],
                "runs": [b.insert(b.run(run_id, "running", inputs=[f"{run_id}-q"]))],
            }
        else:
            token = b.message(
                f"{run_id}-{step}",
                f"part {step}",
                role="assistant",
                run_id=run_id,
                relation="output",
            )
            changes = {"messages": [b.insert(token)]}
            if step == 4:
                changes["runs"] = [b.replace(b.run(run_id, "completed", inputs=[f"{run_id}-q"]))]
        self._root = await _commit(
            self._store,
            b.update_at(self._scope, self._thread_id, self._root.version, changes, root=b.root()),
        )
        self.commits += 1
        self._moved.set()

    async def _loop(self) -> None:
        while True:
            await self._next()
            await asyncio.sleep(self._pause)

    async def __aenter__(self) -> _Stream:
        self._task = asyncio.create_task(self._loop())
        await self.wait_for(1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        if self._task.done():
            self._task.result()  # a failed commit fails the test
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _assert_fork_of_one_version(source: ThreadAggregate, fork: ThreadAggregate) -> None:
    """``fork`` holds what a fork of ``source`` at one earlier version holds (the
    source only grew and closed runs since): the messages below the fork's
    counter, less those of the runs the fork left out, and the runs below its
    counter, less the one that was still open then."""
    runs = [e.record.run_id for e in source.runs if e.position < fork.runs.next_position]
    copied_runs = [e.record.run_id for e in fork.runs]
    assert copied_runs in (runs, runs[:-1]), fork.root.thread_id
    assert all(e.record.status not in ("running", "waiting", "queued") for e in fork.runs)
    kept = set(copied_runs)
    expected = [
        e
        for e in source.messages
        if e.position < fork.messages.next_position
        and (e.record.run_id is None or e.record.run_id in kept)
    ]
    assert list(fork.messages) == expected, fork.root.thread_id


class LifecycleTests:
    """Prune, erase, fork, export and import, on the ``lifecycle_store`` fixture."""

    # ------------------------------------------------------------ export / import

    async def test_export_then_import_restores_every_thread_exactly(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("export")
        await build_conversation(store, clock, scope, "t1")
        await build_conversation(store, clock, scope, "t2", open_turn=False, queued=False)
        await _commit(store, b.create(scope, "hidden", visibility="hidden"))
        before = {t: await read_all(store, scope, t) for t in ("t1", "t2", "hidden")}
        digests = {t: await store.thread_digest(scope, t) for t in before}
        lines = await _export(store, scope)
        assert json.loads(lines[0]) == {"format": "pai-storage.threads", "version": 1}
        assert sum(1 for line in lines if json.loads(line).get("kind") == "thread") == 3
        assert await store.erase_scope(scope) == 3
        assert await _ids(store, scope) == []
        clock.advance(timedelta(days=30))
        report = await store.import_threads(lines)
        assert sorted(report.imported) == [(scope, "hidden"), (scope, "t1"), (scope, "t2")]
        assert report.skipped == []
        for thread_id, state in before.items():
            assert await read_all(store, scope, thread_id) == state
            assert await store.thread_digest(scope, thread_id) == digests[thread_id]
        assert await _ids(store, scope) == ["hidden", "t1", "t2"]

    async def test_imported_thread_keeps_working(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("import-commit")
        conv = await build_conversation(store, clock, scope, "t", queued=False)
        lines = await _export(store, scope)
        await store.erase_scope(scope)
        await store.import_threads(lines)
        clock.advance(ms=1_000)
        # The lease came back with the thread: its owner can still finish the run.
        done = b.run("r-open", "completed", inputs=["m-open"])
        root = await _commit(
            store,
            b.update_at(
                scope,
                "t",
                conv.root.version,
                {"runs": [b.replace(done)], "lease": b.release("r-open", "worker")},
                root=b.root(),
            ),
        )
        assert root.version.revision == conv.root.version.revision + 1
        assert root.version.thread_instance_id == conv.root.version.thread_instance_id
        read = await store.read_thread(
            b.read(scope, "t", messages={"type": "ids", "messageIds": ["m0"]})
        )
        assert read.messages is not None
        assert read.messages.items[0].message_id == "m0"

    async def test_import_skips_or_fails_on_an_existing_thread(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("import-conflict")
        await build_conversation(store, clock, scope, "t1", turns=1)
        lines = await _export(store, scope)
        before = await read_all(store, scope, "t1")
        report = await store.import_threads(lines)
        assert report.imported == []
        assert report.skipped == [(scope, "t1")]
        with pytest.raises(ThreadExistsError, match="line 2") as caught:
            await store.import_threads(lines, on_conflict="fail")
        assert (caught.value.scope_key, caught.value.thread_id) == (scope, "t1")
        assert await read_all(store, scope, "t1") == before
        with pytest.raises(ThreadStoreInvariantError, match="on_conflict"):
            await store.import_threads(lines, on_conflict="replace")  # type: ignore[arg-type]

    async def test_a_corrupt_line_is_rejected_with_its_number_and_its_thread_not_written(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("import-corrupt")
        await build_conversation(store, clock, scope, "first", turns=1, open_turn=False)
        await build_conversation(store, clock, scope, "second", turns=2)
        lines = await _export(store, scope)
        await store.erase_scope(scope)
        starts = [i for i, line in enumerate(lines) if json.loads(line).get("kind") == "thread"]
        second = starts[1]
        bad_at = second + 3  # a record line of the second thread
        for corrupt in (
            "{not json\n",
            '["a list"]\n',
            lines[bad_at].replace('"position":', '"positio":'),
            lines[bad_at].replace('"record":{', '"record":{"extra":1,'),
            lines[bad_at].replace('"metadata":{', '"metadata":{"nan":NaN,', 1),
            lines[bad_at].replace('"position":', '"position":-', 1),
        ):
            broken = [*lines[:bad_at], corrupt, *lines[bad_at + 1 :]]
            with pytest.raises(ThreadStoreInvariantError, match=f"line {bad_at + 1}:"):
                await store.import_threads(broken)
            # Every thread before the bad one is in; nothing of the bad one is.
            assert await _ids(store, scope) == ["first"]
            assert (await read_all(store, scope, "second"))["thread"] is None
            await store.erase_scope(scope)

    async def test_an_edited_or_truncated_block_is_refused(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("import-edited")
        await build_conversation(store, clock, scope, "t", turns=2)
        lines = await _export(store, scope)
        await store.erase_scope(scope)
        edited = [line.replace("answer 1", "answer X") for line in lines]
        with pytest.raises(ThreadStoreInvariantError, match="digest"):
            await store.import_threads(edited)
        with pytest.raises(ThreadStoreInvariantError, match=f"line {len(lines)}: .*ends inside"):
            await store.import_threads(lines[:-1])
        with pytest.raises(ThreadStoreInvariantError, match="line 1:"):
            await store.import_threads(lines[1:])
        with pytest.raises(ThreadStoreInvariantError, match="version 2 is not supported"):
            await store.import_threads([lines[0].replace('"version":1', '"version":2'), *lines[1:]])
        assert (await read_all(store, scope, "t"))["thread"] is None

    async def test_import_checks_the_relationship_rules(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("import-rules")
        await build_conversation(store, clock, scope, "t", turns=1, open_turn=True, queued=False)
        (aggregate,) = await _decoded(await _export(store, scope))
        await store.erase_scope(scope)
        # A block with a valid digest whose lease names a closed run (rule 7).
        lease = aggregate.root.lease
        assert lease is not None
        broken = ThreadAggregate(
            root=aggregate.root.model_copy(
                update={"lease": lease.model_copy(update={"run_id": "r0"})}
            ),
            messages=aggregate.messages,
            runs=aggregate.runs,
            queued_items=aggregate.queued_items,
        )
        block = [header_line(), *encode_thread(broken)]
        with pytest.raises(ThreadStoreInvariantError, match=f"line {len(block)}: .*rule 7"):
            await store.import_threads(block)
        assert (await read_all(store, scope, "t"))["thread"] is None

    async def test_export_of_chosen_threads_and_of_an_empty_scope(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("export-some")
        for thread_id in ("a", "b", "c"):
            await build_conversation(store, clock, scope, thread_id, turns=1)
        chosen = await _decoded(await _export(store, scope, thread_ids=["c", "a", "missing"]))
        assert [a.root.thread_id for a in chosen] == ["c", "a"]
        assert await _export(store, new_scope("empty")) == [header_line()]
        for bad in ({"thread_ids": "a"}, {"thread_ids": ["a", ""]}):
            with pytest.raises(ThreadStoreInvariantError):
                await _export(store, scope, **bad)
        with pytest.raises(ThreadStoreInvariantError, match="needs a scope_key"):
            await _export(store, None, thread_ids=["a"])
        with pytest.raises(ThreadStoreInvariantError):
            await _export(store, "")

    async def test_thread_digest_follows_the_content(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("digest")
        conv = await build_conversation(store, clock, scope, "t", turns=1, open_turn=False)
        first = await store.thread_digest(scope, "t")
        assert first is not None
        assert first.startswith("sha256:")
        assert await store.thread_digest(scope, "t") == first
        await _commit(
            store, b.update_at(scope, "t", conv.root.version, root=b.root(title="lifecycle"))
        )
        assert await store.thread_digest(scope, "t") != first
        assert await store.thread_digest(scope, "missing") is None

    # ------------------------------------------------------------ fork

    async def test_fork_copies_closed_turns_and_drops_open_run_queue_and_lease(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("fork")
        conv = await build_conversation(store, clock, scope, "src")
        source_before = await read_all(store, scope, "src")
        clock.advance(ms=5_000)
        result = await store.fork_thread(scope, "src", "fork")
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        fork = result.thread
        assert fork.parent_thread_id == "src"
        assert fork.version.revision == 1
        assert fork.version.thread_instance_id != conv.root.version.thread_instance_id
        assert fork.lease is None
        assert fork.created_at == fork.updated_at == clock()
        assert (fork.title, fork.metadata, fork.agent) == (
            "lifecycle",
            {"k": [1, 1.0, "x"]},
            "assistant",
        )
        copied = await read_all(store, scope, "fork")
        assert copied["thread"] == fork.to_json()
        kept = [m for m in source_before["messages"] if m["messageId"] != "m-open"]
        assert copied["messages"] == kept  # timestamps and order unchanged
        assert [r["runId"] for r in copied["runs"]] == conv.closed_runs
        assert copied["runs"] == [
            r for r in source_before["runs"] if r["runId"] in conv.closed_runs
        ]
        assert copied["queuedItems"] == []
        assert await read_all(store, scope, "src") == source_before
        (aggregate,) = await _decoded(await _export(store, scope, thread_ids=["fork"]))
        assert aggregate.root == fork  # the rules hold: decoding checks every one
        # The fork is an ordinary thread: commits go on from revision 1.
        clock.advance(ms=1_000)
        more = b.message("m-next", "next question", run_id="r-next")
        next_root = await _commit(
            store,
            b.update_at(
                scope,
                "fork",
                fork.version,
                {
                    "messages": [b.insert(more)],
                    "runs": [b.insert(b.run("r-next", "running", inputs=["m-next"]))],
                    "lease": b.acquire("r-next", "w2"),
                },
                root=b.root(),
            ),
        )
        assert next_root.version.revision == 2

    async def test_fork_through_a_message_cuts_there(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("fork-cut")
        await build_conversation(store, clock, scope, "src", turns=3)
        source = await read_all(store, scope, "src")
        order = [m["messageId"] for m in source["messages"]]
        assert order == ["m0", "a0", "note", "m1", "a1", "m2", "a2", "m-open"]
        cases = {
            "note": (["m0", "a0", "note"], ["r0"]),
            "a1": (["m0", "a0", "note", "m1", "a1"], ["r0", "r1"]),
            # m1 is cut from its answer: its run reaches past the cut and goes, with m1.
            "m1": (["m0", "a0", "note"], ["r0"]),
            "m0": ([], []),
            "m-open": (["m0", "a0", "note", "m1", "a1", "m2", "a2"], ["r0", "r1", "r2"]),
        }
        for cut, (messages, runs) in cases.items():
            fork_id = f"fork-{cut}"
            result = await store.fork_thread(scope, "src", fork_id, through_message_id=cut)
            assert isinstance(result, CommittedResult), cut
            copied = await read_all(store, scope, fork_id)
            assert [m["messageId"] for m in copied["messages"]] == messages, cut
            assert [r["runId"] for r in copied["runs"]] == runs, cut
            assert copied["queuedItems"] == []
            assert copied["thread"]["parentThreadId"] == "src"
        decoded = await _decoded(await _export(store, scope))
        assert len(decoded) == 1 + len(cases)

    async def test_a_fork_at_every_cut_copies_exactly_what_the_rules_allow(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("fork-every")
        await build_conversation(store, clock, scope, "src", turns=4)
        (source,) = await _decoded(await _export(store, scope, thread_ids=["src"]))
        messages = list(source.messages)
        cuts: list[str | None] = [None, *(e.record.message_id for e in messages)]
        forks = {cut: f"fork-{i}" for i, cut in enumerate(cuts)}
        for cut, fork_id in forks.items():
            clock.advance(ms=1)
            result = await store.fork_thread(scope, "src", fork_id, through_message_id=cut)
            assert isinstance(result, CommittedResult)
        decoded = await _decoded(await _export(store, scope, thread_ids=list(forks.values())))
        for (cut, fork_id), fork in zip(forks.items(), decoded, strict=True):
            assert fork.root.thread_id == fork_id
            # What the rules allow, worked out here from the whole source.
            end = (
                len(messages)
                if cut is None
                else 1 + [e.record.message_id for e in messages].index(cut)
            )
            cut_created = messages[end - 1].record.created_at if cut is not None else None
            dropped = {
                e.record.run_id
                for e in source.runs
                if e.record.status in ("running", "waiting", "queued")
                or (cut_created is not None and e.record.created_at > cut_created)
            }
            dropped |= {e.record.run_id for e in messages[end:] if e.record.run_id is not None}
            expected_messages = [e for e in messages[:end] if e.record.run_id not in dropped]
            expected_runs = [e for e in source.runs if e.record.run_id not in dropped]
            assert list(fork.messages) == expected_messages, cut
            assert list(fork.runs) == expected_runs, cut
            assert len(fork.queued_items) == 0
            for mine, theirs in (
                (fork.messages, source.messages),
                (fork.runs, source.runs),
                (fork.queued_items, source.queued_items),
            ):
                assert mine.next_position == theirs.next_position

    async def test_fork_conflicts_on_an_existing_thread_and_rejects_bad_input(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("fork-bad")
        await build_conversation(store, clock, scope, "src", turns=1)
        other = await _commit(store, b.create(scope, "taken"))
        result = await store.fork_thread(scope, "src", "taken")
        assert isinstance(result, ConflictResult)
        assert result.current_version == other.version
        assert (await read_all(store, scope, "taken"))["messages"] == []
        with pytest.raises(ThreadStoreInvariantError, match="does not exist"):
            await store.fork_thread(scope, "missing", "new")
        with pytest.raises(ThreadStoreInvariantError, match="does not exist"):
            await store.fork_thread(scope, "src", "new", through_message_id="nope")
        with pytest.raises(ThreadStoreInvariantError):
            await store.fork_thread(scope, "src", "src")
        with pytest.raises(ThreadStoreInvariantError):
            await store.fork_thread(scope, "src", "")
        with pytest.raises(ThreadStoreInvariantError):
            await store.fork_thread(new_scope("elsewhere"), "src", "new")
        assert await _ids(store, scope) == ["src", "taken"]

    async def test_a_busy_thread_of_5000_messages_forks_at_one_version(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        """A reply streams into the source every 100 ms while it is forked, with
        and without a cut: every fork succeeds and is the source at one version."""
        store, scope = lifecycle_store, new_scope("fork-busy")
        root = await _commit(store, b.create(scope, "src"))
        for batch in range(10):  # 1,000 closed turns of 5 messages: 5,000 messages
            messages: list[dict[str, Any]] = []
            runs: list[dict[str, Any]] = []
            for turn in range(batch * 100, (batch + 1) * 100):
                question, run_id = f"q{turn}", f"r{turn}"
                messages.append(b.insert(b.message(question, run_id=run_id)))
                for part in range(1, 5):
                    reply = b.message(
                        f"a{turn}-{part}", role="assistant", run_id=run_id, relation="output"
                    )
                    messages.append(b.insert(reply))
                runs.append(b.insert(b.run(run_id, "completed", inputs=[question])))
            changes = {"messages": messages, "runs": runs}
            root = await _commit(
                store, b.update_at(scope, "src", root.version, changes, root=b.root())
            )
        streaming = _Stream(store, scope, "src", root, pause=0.1)
        async with streaming:
            for i, cut in enumerate([None, "a617-4", "q999"]):
                before = streaming.commits
                result = await store.fork_thread(scope, "src", f"fork-{i}", through_message_id=cut)
                assert isinstance(result, CommittedResult), (cut, result)
                await streaming.wait_for(before + 1)  # the next fork meets a moved source
        (source, fork) = await _decoded(await _export(store, scope, thread_ids=["src", "fork-0"]))
        _assert_fork_of_one_version(source, fork)
        assert len(fork.messages) >= 5_000
        for fork_id, last_turn in (("fork-1", 617), ("fork-2", 998)):
            # A cut in the 5,000: the newest message and run copied are the cut's turn.
            newest = {"type": "page", "order": "newest", "page": {"limit": 1}}
            read = await store.read_thread(
                b.read(scope, fork_id, messages={**newest, "view": "raw"}, runs=newest)
            )
            assert read.messages is not None
            assert read.runs is not None
            assert [m.message_id for m in read.messages.items] == [f"a{last_turn}-4"], fork_id
            assert [r.run_id for r in read.runs.items] == [f"r{last_turn}"], fork_id

    async def test_a_small_thread_committed_back_to_back_forks_every_time(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("fork-racing")
        conv = await build_conversation(
            store, clock, scope, "src", turns=2, open_turn=False, queued=False
        )
        streaming = _Stream(store, scope, "src", conv.root, pause=0.0)
        async with streaming:
            for i in range(25):
                before = streaming.commits
                result = await store.fork_thread(scope, "src", f"fork-{i}")
                assert isinstance(result, CommittedResult), (i, result)
                await streaming.wait_for(before + 1)
        (source,) = await _decoded(await _export(store, scope, thread_ids=["src"]))
        forks = await _decoded(
            await _export(store, scope, thread_ids=[f"fork-{i}" for i in range(25)])
        )
        assert len(forks) == 25
        for fork in forks:
            _assert_fork_of_one_version(source, fork)

    # ------------------------------------------------------------ retention sweep

    async def test_prune_deletes_old_idle_threads_only(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("prune")
        clock.set(_OLD)
        old_done = await build_conversation(store, clock, scope, "old-done", open_turn=False)
        old_open = await build_conversation(store, clock, scope, "old-open", queued=False)
        hidden = await _commit(store, b.create(scope, "old-hidden", visibility="hidden"))
        clock.advance(timedelta(days=10))
        cutoff = clock()
        clock.advance(ms=1)
        await _commit(store, b.create(scope, "recent"))
        assert old_open.root.updated_at < cutoff
        pruned = await store.prune_threads(scope, updated_before=cutoff)
        assert sorted((p.scope_key, p.thread_id, p.version) for p in pruned) == sorted(
            [
                (scope, "old-done", old_done.root.version),
                (scope, "old-hidden", hidden.version),
            ]
        )
        assert await _ids(store, scope) == ["old-open", "recent"]
        for gone in ("old-done", "old-hidden"):
            assert await read_all(store, scope, gone) == {
                "thread": None,
                "messages": [],
                "runs": [],
                "queuedItems": [],
            }
        assert await store.prune_threads(scope, updated_before=cutoff) == []

    async def test_prune_skips_an_expired_lease_run_still_open_but_not_a_waiting_one_closed(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("prune-waiting")
        clock.set(_OLD)
        conv = await build_conversation(store, clock, scope, "t", turns=1, queued=False)
        # The run stays open after its lease expired: the thread is still not pruned.
        clock.advance(timedelta(days=5))
        assert await store.prune_threads(scope, updated_before=clock()) == []
        # Once the run is closed, the thread goes.
        closed = b.run("r-open", "failed", inputs=["m-open"])
        root = await _commit(
            store,
            b.update_at(
                scope,
                "t",
                conv.root.version,
                {"runs": [b.replace(closed)], "lease": b.release("r-open", "worker", "any")},
                root=b.root(),
            ),
        )
        clock.advance(ms=1)
        pruned = await store.prune_threads(scope, updated_before=clock())
        assert [(p.thread_id, p.version) for p in pruned] == [("t", root.version)]

    async def test_prune_limit_and_batches_across_scopes(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store = lifecycle_store
        scopes = [new_scope("prune-all"), new_scope("prune-all")]
        clock.set(_OLDEST)
        created = []
        for i in range(130):
            clock.advance(ms=1)
            created.append(await _commit(store, b.create(scopes[i % 2], f"t{i:03}")))
        cutoff = clock() + timedelta(milliseconds=1)
        first = await store.prune_threads(updated_before=cutoff, limit=120)
        assert len(first) == 120
        # Oldest first, across scopes.
        assert [(p.scope_key, p.thread_id) for p in first] == [
            (t.scope_key, t.thread_id) for t in created[:120]
        ]
        rest = await store.prune_threads(None, updated_before=cutoff, limit=50)
        assert [p.thread_id for p in rest] == [t.thread_id for t in created[120:]]
        for scope in scopes:
            assert await _ids(store, scope) == []
        with pytest.raises(ThreadStoreInvariantError, match="limit"):
            await store.prune_threads(updated_before=cutoff, limit=0)
        with pytest.raises(ThreadStoreInvariantError, match="aware"):
            await store.prune_threads(updated_before=datetime(1990, 1, 1))
        with pytest.raises(ThreadStoreInvariantError):
            await store.prune_threads("", updated_before=cutoff)

    async def test_prune_racing_commits_either_land_first_or_conflict(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, new_scope("prune-race")
        clock.set(_OLD)
        roots = [await _commit(store, b.create(scope, f"t{i}")) for i in range(20)]
        cutoff = clock() + timedelta(milliseconds=1)
        clock.advance(ms=2)  # a commit that lands first makes its thread newer than the cutoff

        async def touch(root: ThreadRecord) -> bool:
            result = await store.commit_thread(
                b.update_at(scope, root.thread_id, root.version, root=b.root(title="touched"))
            )
            return isinstance(result, CommittedResult)

        sweep = asyncio.ensure_future(store.prune_threads(scope, updated_before=cutoff))
        touched = await asyncio.gather(*(touch(r) for r in roots))
        gone = {p.thread_id for p in await sweep}
        for root, landed in zip(roots, touched, strict=True):
            read = await store.read_thread(b.read(scope, root.thread_id))
            if root.thread_id in gone:
                assert not landed
                assert read.thread is None
            else:
                assert landed
                assert read.thread is not None
                assert read.thread.title == "touched"

    # ------------------------------------------------------------ scope erasure

    async def test_erase_scope_removes_everything_of_one_scope_only(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope, other = lifecycle_store, new_scope("erase"), new_scope("keep")
        for i in range(105):
            await _commit(
                store, b.create(scope, f"t{i}", visibility="hidden" if i % 3 else "visible")
            )
        await build_conversation(store, clock, scope, "conv")
        kept = await build_conversation(store, clock, other, "conv")
        assert await store.erase_scope(scope) == 106
        assert await _ids(store, scope) == []
        for thread_id in ("t0", "t1", "conv"):
            assert (await read_all(store, scope, thread_id))["thread"] is None
        assert await store.erase_scope(scope) == 0
        assert await _export(store, scope) == [header_line()]
        assert (await read_all(store, other, "conv"))["thread"] == kept.root.to_json()
        # The scope can be used again afterwards.
        again = await _commit(store, b.create(scope, "conv"))
        assert again.version.revision == 1
        assert again.version != kept.root.version
