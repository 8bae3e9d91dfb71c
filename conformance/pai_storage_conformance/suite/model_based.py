"""Model-based testing: random valid and invalid commits, store vs reference model.

A Hypothesis state machine plays a realistic agent workload (turns, queued
turns, streaming, completion, admission, cancellation, regeneration, deletes
and re-creates, lease expiry and takeover, stale writers, and many kinds of
invalid change) against the store under test and, side by side, against the
core's reference model :func:`pai_storage.backend.apply_thread_changes` on a
:class:`pai_storage.backend.ThreadAggregate` per thread. Every outcome (committed,
conflict, or which exception) must agree, and after every step the reads and
the list must agree.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from pai_storage import (
    CommittedResult,
    ConflictResult,
    ManualClock,
    Message,
    QueuedItem,
    RunRecord,
    ThreadStore,
    ThreadVersion,
)
from pai_storage import builders as b
from pai_storage.backend import ApplyResult, ThreadAggregate, apply_thread_changes

from ._support import run_model

__all__ = ["TestModelBased"]

pytestmark = pytest.mark.asyncio

T = TypeVar("T")

OWNERS = ("w1", "w2", "w3")
DURATIONS = st.sampled_from([1, 500, 30_000, 60_000, 86_400_000])
ADVANCES = st.sampled_from([1, 250, 29_999, 30_000, 30_001, 120_000])
OPEN = ("running", "waiting")
FINAL = ("completed", "failed", "cancelled")
THREADS_PER_EXAMPLE = 2
STEPS = 30


def _messages(agg: ThreadAggregate) -> list[Message]:
    return [e.record for e in sorted(agg.messages, key=lambda e: e.position)]


def _runs(agg: ThreadAggregate) -> list[RunRecord]:
    return [e.record for e in sorted(agg.runs, key=lambda e: e.position)]


def _items(agg: ThreadAggregate) -> list[QueuedItem]:
    return [e.record for e in sorted(agg.queued_items, key=lambda e: e.position)]


def _run_draft(run: RunRecord, **changes: Any) -> dict[str, Any]:
    """The draft of a stored run with some fields changed (camelCase JSON keys)."""
    data = run.to_json()
    for stamped in ("createdAt", "updatedAt", "finishedAt"):
        data.pop(stamped, None)
    data["admission"].pop("admittedAt", None)
    for key, value in changes.items():
        if key == "admitted":
            data["admission"]["admitted"] = value
        elif value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def _outcome(result: Any) -> str:
    return "committed" if isinstance(result, CommittedResult) else "conflict"


class _Workload(RuleBasedStateMachine):
    """One example: a fresh scope and fresh thread ids, store and model side by side."""

    store: ThreadStore
    clock: ManualClock
    loop: asyncio.AbstractEventLoop
    base_scope: str

    def __init__(self) -> None:
        super().__init__()
        token = uuid.uuid4().hex[:12]
        self.scope = f"{self.base_scope}/{token}"
        self.tids = [f"thread-{token}-{i}" for i in range(THREADS_PER_EXAMPLE)]
        self.model: dict[str, ThreadAggregate | None] = dict.fromkeys(self.tids)
        self.history: dict[str, list[ThreadVersion]] = {tid: [] for tid in self.tids}
        self.instance_ids: set[str] = set()
        self.counter = 0
        self.log: list[str] = []

    # ------------------------------------------------------------ plumbing

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def pick(self, data: st.DataObject, *, existing: bool = True) -> str:
        """A thread id: usually one that exists (or, for a create, one that does not)."""
        preferred = [t for t in self.tids if (self.model[t] is not None) == existing]
        if preferred and data.draw(st.integers(0, 9)) < 9:
            return data.draw(st.sampled_from(preferred))
        return data.draw(st.sampled_from(self.tids))

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def commit(self, tid: str, commit: dict[str, Any], label: str) -> None:
        """Run ``commit`` on the store and on the model; their outcomes must agree."""
        self.log.append(label)
        before = self.model[tid]
        now = self.clock()
        got: Any = None
        got_exc: BaseException | None = None
        try:
            got = self.run(self.store.commit_thread(copy.deepcopy(commit)))
        except Exception as exc:  # compared with the model's below
            got_exc = exc
        new_id = uuid.uuid4().hex
        if isinstance(got, CommittedResult) and got.thread is not None:
            new_id = got.thread.version.thread_instance_id
        expected: ApplyResult | None = None
        exp_exc: BaseException | None = None
        try:
            expected = apply_thread_changes(
                before, copy.deepcopy(commit), now, instance_id=lambda: new_id
            )
        except Exception as exc:
            exp_exc = exc
        where = f"step {len(self.log)} ({label}) on {tid!r}: {commit!r}"
        if exp_exc is not None or got_exc is not None:
            assert type(got_exc) is type(exp_exc), (
                f"{where}\nstore: {got_exc!r} / {got!r}\nmodel: {exp_exc!r} / {expected!r}"
            )
            return
        assert expected is not None
        assert _outcome(got) == _outcome(expected.result), (
            f"{where}\nstore: {got!r}\nmodel: {expected.result!r}"
        )
        if isinstance(got, ConflictResult):
            assert got.current_version == expected.result.current_version, where  # type: ignore[union-attr]
            return
        assert got.to_json() == expected.result.to_json(), where
        if got.thread is not None and got.thread.version.revision == 1:
            iid = got.thread.version.thread_instance_id
            assert iid not in self.instance_ids, f"{where}: instance id {iid!r} reused"
            self.instance_ids.add(iid)
        self.model[tid] = expected.aggregate
        if expected.aggregate is not None:
            self.history[tid].append(expected.aggregate.root.version)

    def version(self, tid: str) -> dict[str, Any]:
        agg = self.model[tid]
        if agg is not None:
            return agg.root.version.to_json()
        if self.history[tid]:
            return self.history[tid][-1].to_json()
        return {"threadInstanceId": "never-existed", "revision": 1}

    def update(
        self, tid: str, changes: dict[str, Any] | None = None, **root: Any
    ) -> dict[str, Any]:
        agg = self.model[tid]
        if agg is not None and not root:
            current = agg.root
            root = {
                "visibility": current.list_visibility,
                "metadata": current.metadata,
                "privateMetadata": current.private_metadata,
            }
            if current.title is not None:
                root["title"] = current.title
            if current.category is not None:
                root["category"] = current.category
        return b.update_at(self.scope, tid, self.version(tid), changes, root=b.root(**root))

    @staticmethod
    def message(
        mid: str,
        run_id: str | None,
        relation: str = "input",
        *,
        role: str = "user",
        status: str = "complete",
        transcript: bool = True,
        context: bool = True,
    ) -> dict[str, Any]:
        return b.message(
            mid,
            f"text of {mid}",
            role=role,  # type: ignore[arg-type]
            run_id=run_id,
            relation=relation,  # type: ignore[arg-type]
            status=status,
            transcript=transcript,
            context=context,
            metadata={"n": len(mid), "tag": mid},
        )

    # ------------------------------------------------------------ workload

    @initialize(data=st.data())
    def create_threads(self, data: st.DataObject) -> None:
        for tid in self.tids:
            self._create(data, tid)

    @rule(data=st.data())
    def create_with_first_turn(self, data: st.DataObject) -> None:
        self._create(data, self.pick(data, existing=False))

    def _create(self, data: st.DataObject, tid: str) -> None:
        rid, mid = self.fresh("r"), self.fresh("m")
        changes: dict[str, Any] = {
            "messages": [b.insert(self.message(mid, rid))],
            "runs": [b.insert(b.run(rid, "running", inputs=[mid]))],
        }
        if data.draw(st.booleans()):
            changes["lease"] = b.acquire(
                rid, data.draw(st.sampled_from(OWNERS)), data.draw(DURATIONS), "send"
            )
        root: dict[str, Any] = {
            "visibility": data.draw(st.sampled_from(["visible", "hidden"])),
            "metadata": {"created": self.counter},
        }
        if data.draw(st.booleans()):
            root["title"] = f"title {self.counter}"
        if data.draw(st.booleans()):
            root["category"] = data.draw(st.sampled_from(["a", "b"]))
        self.commit(tid, b.create(self.scope, tid, changes, **root), "create")

    @rule(data=st.data())
    def queue_turn(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        rid, qid = self.fresh("r"), self.fresh("q")
        changes = {
            "runs": [b.insert(b.run(rid, "queued", queue_item_id=qid))],
            "queuedItems": [b.insert(b.queued_item(qid, rid, {"text": f"turn {qid}", "n": 1.5}))],
        }
        self.commit(tid, self.update(tid, changes), "queue turn")

    def _open_run(self, tid: str) -> RunRecord | None:
        agg = self.model[tid]
        if agg is None:
            return None
        return next((r for r in _runs(agg) if r.status in OPEN), None)

    def _lease_change(self, data: st.DataObject, tid: str, kind: str, run_id: str) -> Any:
        agg = self.model[tid]
        lease = agg.root.lease if agg is not None else None
        holder = lease.owner_id if lease is not None else "w1"
        owner = data.draw(st.sampled_from([holder, holder, holder, *OWNERS]))
        if kind == "renew":
            return b.renew(run_id, owner, data.draw(DURATIONS))
        return b.release(run_id, owner, data.draw(st.sampled_from(["unexpired", "any"])))

    @rule(data=st.data())
    def stream_output(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        run = self._open_run(tid)
        agg = self.model[tid]
        if run is None or agg is None:
            return self.read_only(tid)
        messages = _messages(agg)
        last = messages[-1] if messages else None
        if last is not None and last.run_id == run.run_id and last.status == "streaming":
            draft = self.message(
                last.message_id,
                run.run_id,
                "output",
                role="assistant",
                status=data.draw(st.sampled_from(["complete", "incomplete", "error"])),
            )
            change = b.replace(draft)
        else:
            tool = data.draw(st.booleans())
            change = b.insert(
                self.message(
                    self.fresh("m"),
                    run.run_id,
                    data.draw(st.sampled_from(["output", "output", "context"])),
                    role="tool" if tool else "assistant",
                    status="streaming",
                    transcript=not tool,
                    context=data.draw(st.booleans()),
                )
            )
        changes: dict[str, Any] = {"messages": [change]}
        if data.draw(st.booleans()):
            changes["lease"] = self._lease_change(data, tid, "renew", run.run_id)
        self.commit(tid, self.update(tid, changes), "stream output")

    @rule(data=st.data())
    def pause_or_resume(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        run = self._open_run(tid)
        if run is None:
            return self.read_only(tid)
        status = "waiting" if run.status == "running" else "running"
        changes: dict[str, Any] = {"runs": [b.replace(_run_draft(run, status=status))]}
        if data.draw(st.booleans()):
            changes["lease"] = self._lease_change(data, tid, "renew", run.run_id)
        self.commit(tid, self.update(tid, changes), f"run {status}")

    @rule(data=st.data())
    def finish_and_release(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        run = self._open_run(tid)
        agg = self.model[tid]
        if run is None or agg is None:
            return self.read_only(tid)
        status = data.draw(st.sampled_from(FINAL))
        extra: dict[str, Any] = {"status": status}
        if status == "failed":
            extra["error"] = {"code": "boom", "message": "the model failed"}
        changes: dict[str, Any] = {"runs": [b.replace(_run_draft(run, **extra))]}
        if agg.root.lease is not None and data.draw(st.integers(0, 9)) < 9:
            changes["lease"] = self._lease_change(data, tid, "release", agg.root.lease.run_id)
        self.commit(tid, self.update(tid, changes), f"finish {status}")

    @rule(data=st.data())
    def admit_queued(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        agg = self.model[tid]
        queued = list(_runs(agg)) if agg is not None else []
        queued = [r for r in queued if r.status == "queued"]
        if not queued:
            return self.read_only(tid)
        if self._open_run(tid) is not None and data.draw(st.integers(0, 3)) < 3:
            return self.read_only(tid)  # mostly admit when the previous turn is done
        run = data.draw(st.sampled_from(queued))
        mid = self.fresh("m")
        changes: dict[str, Any] = {
            "messages": [b.insert(self.message(mid, run.run_id))],
            "runs": [
                b.replace(_run_draft(run, status="running", admitted=True, inputMessageIds=[mid]))
            ],
            "queuedItems": [b.delete_record(run.admission.queue_item_id or "none")],
        }
        if data.draw(st.integers(0, 4)) < 4:
            changes["lease"] = b.acquire(
                run.run_id,
                data.draw(st.sampled_from(OWNERS)),
                data.draw(DURATIONS),
                data.draw(st.sampled_from(["send", "trigger"])),
            )
        self.commit(tid, self.update(tid, changes), "admit queued")

    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        agg = self.model[tid]
        queued = [r for r in _runs(agg) if r.status == "queued"] if agg is not None else []
        if not queued:
            return self.read_only(tid)
        run = data.draw(st.sampled_from(queued))
        changes = {
            "runs": [b.replace(_run_draft(run, status="cancelled", admitted=False))],
            "queuedItems": [b.delete_record(run.admission.queue_item_id or "none")],
        }
        self.commit(tid, self.update(tid, changes), "cancel queued")

    @rule(data=st.data())
    def regenerate(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        agg = self.model[tid]
        if agg is None:
            return self.read_only(tid)
        runs = _runs(agg)
        done = [
            r for r in runs if r.admission.admitted and r.status in FINAL and r.input_message_ids
        ]
        if not done:
            return self.read_only(tid)
        run = data.draw(st.sampled_from(done))
        later = runs[runs.index(run) + 1 :]
        later_ids = {r.run_id for r in later}
        changes: dict[str, Any] = {
            "messages": [b.truncate(run.input_message_ids[-1])],
            "runs": [
                b.truncate(run.run_id),
                b.replace(_run_draft(run, status="running", operation="regenerate", error=None)),
            ],
            "lease": b.acquire(
                run.run_id, data.draw(st.sampled_from(OWNERS)), data.draw(DURATIONS), "regenerate"
            ),
        }
        items = [b.delete_record(i.queue_item_id) for i in _items(agg) if i.run_id in later_ids]
        if items:
            changes["queuedItems"] = items
        self.commit(tid, self.update(tid, changes), "regenerate")

    @rule(data=st.data())
    def take_over_lease(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        run = self._open_run(tid)
        if run is None:
            return self.read_only(tid)
        change = b.acquire(
            run.run_id, data.draw(st.sampled_from(OWNERS)), data.draw(DURATIONS), "resume"
        )
        self.commit(tid, self.update(tid, {"lease": change}), "take over lease")

    @rule(data=st.data())
    def update_root(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        root: dict[str, Any] = {
            "visibility": data.draw(st.sampled_from(["visible", "hidden"])),
            "metadata": {"k": data.draw(st.integers(-3, 3)), "$set": {"a.b": [1, 1.0, None]}},
            "privateMetadata": {"secret": self.counter},
        }
        if data.draw(st.booleans()):
            root["title"] = f"renamed {self.counter}"
        if data.draw(st.booleans()):
            root["category"] = data.draw(st.sampled_from(["a", "b"]))
        self.commit(tid, self.update(tid, None, **root), "update root")

    @rule(data=st.data())
    def delete_thread(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        if data.draw(st.integers(0, 2)) > 0:  # deletes are rarer than other steps
            return self.read_only(tid)
        self.commit(tid, b.delete(self.scope, tid, self.version(tid)), "delete")

    @rule(data=st.data())
    def stale_writer(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        if not self.history[tid]:
            return self.read_only(tid)
        version = data.draw(st.sampled_from(self.history[tid])).to_json()
        agg = self.model[tid]
        older = {v.thread_instance_id for v in self.history[tid]}
        if agg is not None:
            older.discard(agg.root.version.thread_instance_id)
            reuse_old_id: bool = data.draw(st.booleans())
            if older and reuse_old_id:
                # an earlier incarnation's id with the current revision: still stale
                version = {
                    "threadInstanceId": data.draw(st.sampled_from(sorted(older))),
                    "revision": agg.root.version.revision,
                }
        if data.draw(st.booleans()):
            commit = b.delete(self.scope, tid, version)
        else:
            commit = b.update_at(self.scope, tid, version, root=b.root(title="stale writer"))
        self.commit(tid, commit, "stale writer")

    @rule(ms=ADVANCES)
    def advance_clock(self, ms: int) -> None:
        self.log.append(f"advance {ms}ms")
        self.clock.advance(timedelta(milliseconds=ms))

    @rule(data=st.data())
    def invalid_change(self, data: st.DataObject) -> None:
        tid = self.pick(data)
        agg = self.model[tid]
        kind = data.draw(
            st.sampled_from(
                [
                    "replace missing message",
                    "delete missing run",
                    "insert existing message",
                    "truncate at missing boundary",
                    "message names missing run",
                    "standalone message after open run",
                    "queued run without item",
                    "delete queued item only",
                    "lease for finished run",
                    "lease for missing run",
                    "duration zero",
                    "creation-only field in update",
                    "message without parts",
                    "input after output",
                    "two open runs",
                    "create existing thread",
                ]
            )
        )
        messages = _messages(agg) if agg is not None else []
        runs = _runs(agg) if agg is not None else []
        changes: dict[str, Any]
        if kind == "replace missing message":
            changes = {"messages": [b.replace(self.message("no-such-message", None))]}
        elif kind == "delete missing run":
            changes = {"runs": [b.delete_record("no-such-run")]}
        elif kind == "insert existing message":
            mid = messages[0].message_id if messages else "m-dup"
            changes = {
                "messages": [b.insert(self.message(mid, None))] * (1 if messages else 2),
            }
        elif kind == "truncate at missing boundary":
            changes = {"messages": [b.truncate("no-such-message")]}
        elif kind == "message names missing run":
            changes = {
                "messages": [b.insert(self.message(self.fresh("m"), "no-such-run", "output"))]
            }
        elif kind == "standalone message after open run":
            changes = {"messages": [b.insert(self.message(self.fresh("m"), None))]}
        elif kind == "queued run without item":
            changes = {"runs": [b.insert(b.run(self.fresh("r"), "queued", queue_item_id="q-none"))]}
        elif kind == "delete queued item only":
            items = _items(agg) if agg is not None else []
            changes = {
                "queuedItems": [b.delete_record(items[0].queue_item_id if items else "q-none")]
            }
        elif kind == "lease for finished run":
            finished = [r for r in runs if r.status in FINAL]
            rid = finished[0].run_id if finished else "no-such-run"
            changes = {"lease": b.acquire(rid, "w1")}
            if data.draw(st.booleans()):
                self.clock.advance(timedelta(days=2))  # every lease expired: judge rule 7
                self.log.append("advance 2 days")
        elif kind == "lease for missing run":
            changes = {"lease": b.acquire("no-such-run", "w1")}
        elif kind == "duration zero":
            changes = {"lease": b.renew(runs[0].run_id if runs else "r", "w1", 0)}
        elif kind == "creation-only field in update":
            commit = self.update(tid)
            commit["mutation"]["root"]["agent"] = "other-agent"
            self.commit(tid, commit, f"invalid: {kind}")
            return
        elif kind == "message without parts":
            draft = self.message(self.fresh("m"), None)
            draft["parts"] = []
            changes = {"messages": [b.insert(draft)]}
        elif kind == "input after output":
            run = self._open_run(tid)
            rid = run.run_id if run is not None else "no-such-run"
            changes = {
                "messages": [
                    b.insert(self.message(self.fresh("m"), rid, "output", role="assistant")),
                    b.insert(self.message(self.fresh("m"), rid, "input")),
                ]
            }
        elif kind == "two open runs":
            rid, mid = self.fresh("r"), self.fresh("m")
            changes = {
                "messages": [b.insert(self.message(mid, rid))],
                "runs": [b.insert(b.run(rid, "running", inputs=[mid]))],
            }
        else:  # create existing thread (a conflict when it exists)
            rid, mid = self.fresh("r"), self.fresh("m")
            changes = {
                "messages": [b.insert(self.message(mid, rid))],
                "runs": [b.insert(b.run(rid, "waiting", inputs=[mid]))],
            }
            self.commit(tid, b.create(self.scope, tid, changes), f"invalid: {kind}")
            return
        self.commit(tid, self.update(tid, changes), f"invalid: {kind}")

    def read_only(self, tid: str) -> None:
        """A step with nothing to commit: the invariant still compares the reads."""
        self.log.append(f"read {tid}")

    # ------------------------------------------------------------ invariants

    @invariant()
    def reads_agree(self) -> None:
        for tid in self.tids:
            agg = self.model[tid]
            read = self.run(
                self.store.read_thread(
                    b.read(
                        self.scope,
                        tid,
                        messages={"type": "page", "view": "raw", "page": {"limit": 100}},
                        runs={"type": "page", "page": {"limit": 100}},
                        queuedItems={"type": "page", "page": {"limit": 100}},
                    )
                )
            )
            where = f"after {self.log[-3:]} on {tid!r}"
            if agg is None:
                assert read.thread is None, where
                assert read.messages is None, where
                assert read.runs is None, where
                assert read.queued_items is None, where
                continue
            assert read.thread is not None, where
            assert read.thread.to_json() == agg.root.to_json(), where
            version = agg.root.version
            assert read.messages is not None, where
            assert read.runs is not None, where
            assert read.queued_items is not None, where
            for page, expected in (
                (read.messages, _messages(agg)),
                (read.runs, _runs(agg)),
                (read.queued_items, _items(agg)),
            ):
                assert page.version == version, where
                assert [x.to_json() for x in page.items] == [x.to_json() for x in expected], where
                assert page.next_page_token is None, where
            self._views_agree(tid, agg, where)

    def _views_agree(self, tid: str, agg: ThreadAggregate, where: str) -> None:
        """Filtered, newest-first, small pages: the first page matches the model."""
        messages = _messages(agg)
        runs = _runs(agg)
        read = self.run(
            self.store.read_thread(
                b.read(
                    self.scope,
                    tid,
                    messages={
                        "type": "page",
                        "view": "transcript",
                        "order": "newest",
                        "page": {"limit": 2},
                    },
                    runs={
                        "type": "page",
                        "order": "newest",
                        "statuses": ["queued", "running", "waiting"],
                        "page": {"limit": 2},
                    },
                )
            )
        )
        assert read.messages is not None, where
        assert read.runs is not None, where
        transcript = [m for m in reversed(messages) if m.visibility.transcript]
        assert [m.message_id for m in read.messages.items] == [
            m.message_id for m in transcript[:2]
        ], where
        assert (read.messages.next_page_token is not None) == (len(transcript) > 2), where
        active = [r for r in reversed(runs) if r.status in ("queued", "running", "waiting")]
        assert [r.run_id for r in read.runs.items] == [r.run_id for r in active[:2]], where
        assert (read.runs.next_page_token is not None) == (len(active) > 2), where

    @invariant()
    def list_agrees(self) -> None:
        for hidden in (True, False):
            listed = self.run(
                self.store.list_threads(
                    {"scopeKey": self.scope, "limit": 100, "includeHidden": hidden}
                )
            )
            roots = [agg.root for agg in self.model.values() if agg is not None]
            if not hidden:
                roots = [r for r in roots if r.list_visibility == "visible"]
            roots.sort(key=lambda r: r.thread_id)
            roots.sort(key=lambda r: r.updated_at, reverse=True)
            assert [r.to_json() for r in listed.items] == [r.to_json() for r in roots], (
                f"list (includeHidden={hidden}) after {self.log[-3:]}"
            )
            assert listed.next_page_token is None


def _machine(
    store: ThreadStore, clock: ManualClock, loop: asyncio.AbstractEventLoop, scope: str
) -> type[_Workload]:
    class Workload(_Workload):
        pass

    Workload.store = store
    Workload.clock = clock
    Workload.loop = loop
    Workload.base_scope = scope
    return Workload


class TestModelBased:
    """Random valid and invalid commits agree with the reference model."""

    async def test_store_agrees_with_reference_model(
        self, store: ThreadStore, clock: ManualClock, pai_examples: int
    ) -> None:
        loop = asyncio.get_running_loop()
        scope = f"conformance-model-{uuid.uuid4()}"
        machine = _machine(store, clock, loop, scope)
        await run_model(
            machine,
            examples=pai_examples,
            steps=STEPS,
            also_suppress=[HealthCheck.filter_too_much],
        )
