"""Random commits on PostgreSQL against the reference model, aimed at the root's facts.

A commit that appends messages, starts or finishes a run, or only moves the
lease checks the relationship rules against the facts kept on the root and
writes the next facts without a query (``root_facts.derive_facts``); any other
commit queries the children and reads the facts back. The conformance
suite's model-based test plays a realistic workload; this one draws commits
shaped to reach both paths and their seams: messages appended to open,
finished, queued or missing runs, runs started beside an open one, reopened,
admitted or finished with and without their lease, messages moved between
runs, deletes and truncations, and roots whose facts are missing or belong to
another revision (as a root written before schema version 4, or by an older
process, leaves them). Every outcome must be the reference model's
(:func:`pai_storage.backend.apply_thread_changes`, which checks every run), the
stored thread must be the model's, and facts stored for the root's revision
must be the thread's (open runs, tail, and each open run's rule-relevant
messages).

``PAI_FACTS_EXAMPLES`` sets the number of examples (default 30).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import uuid
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pai_storage_postgres import PostgresThreadStore

from pai_storage import CommittedResult, ManualClock
from pai_storage import builders as b
from pai_storage.backend import (
    MessageRef,
    ThreadAggregate,
    apply_thread_changes,
    relations_from_aggregate,
)
from pai_storage.root_facts import relevant_messages

from .helpers import URL, dsn

EXAMPLES = int(os.environ.get("PAI_FACTS_EXAMPLES", "30"))
STEPS = 20
STATUSES = ("running", "waiting", "completed", "failed", "cancelled", "queued")
OPEN = ("running", "waiting")
RELATIONS = ("input", "output", "context")


class _Example:
    """One thread on the store and in the model, and the commits drawn for it."""

    def __init__(
        self,
        data: st.DataObject,
        store: PostgresThreadStore,
        clock: ManualClock,
        conn: asyncpg.Connection,
    ) -> None:
        self.data = data
        self.store = store
        self.conn = conn
        self.clock = clock
        self.tampered = False
        self.scope = "facts"
        self.tid = f"t-{uuid.uuid4().hex[:12]}"
        self.model: ThreadAggregate | None = None
        self.counter = 0
        self.log: list[str] = []
        self.loop = asyncio.get_event_loop()

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # ------------------------------------------------------------ the model's state

    def messages(self) -> list[Any]:
        return [] if self.model is None else [e.record for e in self.model.messages]

    def runs(self) -> list[Any]:
        return [] if self.model is None else [e.record for e in self.model.runs]

    def items(self) -> list[Any]:
        return [] if self.model is None else [e.record for e in self.model.queued_items]

    def open_run(self) -> Any:
        return next((r for r in self.runs() if r.status in OPEN), None)

    def some(self, ids: list[str], missing: str) -> str:
        """Usually one of ``ids``; now and then an id that does not exist."""
        if ids and self.draw(st.integers(0, 9)) > 0:
            return str(self.draw(st.sampled_from(ids)))
        return missing

    # ------------------------------------------------------------ drafts

    def message(self, mid: str, run_id: str | None, relation: str = "output") -> dict[str, Any]:
        role = "user" if relation == "input" else "assistant"
        return b.message(mid, f"text {mid}", role=role, run_id=run_id, relation=relation)  # type: ignore[arg-type]

    def run_draft(self, run: Any, **changes: Any) -> dict[str, Any]:
        data = run.to_draft().to_json()
        for key, value in changes.items():
            if key == "admitted":
                data["admission"]["admitted"] = value
            elif value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if data["status"] == "failed" and "error" not in data:
            data["error"] = {"code": "boom", "message": "failed"}
        if data["status"] != "failed":
            data.pop("error", None)
        return data

    # ------------------------------------------------------------ commit shapes

    def append(self) -> dict[str, Any]:
        """Messages appended to the open run, another run, no run or a missing one."""
        runs = [r.run_id for r in self.runs()]
        open_run = self.open_run()
        inserts = []
        for _ in range(self.draw(st.integers(1, 3))):
            kind = self.draw(st.sampled_from(["open", "open", "open", "any", "none", "missing"]))
            if kind == "open" and open_run is not None:
                run_id: str | None = open_run.run_id
            elif kind == "any":
                run_id = self.some(runs, "no-such-run")
            elif kind == "missing":
                run_id = "no-such-run"
            else:
                run_id = None
            relation = self.draw(st.sampled_from(["output", "output", "context", "input"]))
            inserts.append(b.insert(self.message(self.fresh("m"), run_id, relation)))
        if self.draw(st.integers(0, 19)) == 0:  # an id that exists
            inserts.append(b.insert(self.message(self.some(self.mids(), "m-dup"), None)))
        changes: dict[str, Any] = {"messages": inserts}
        if open_run is not None and self.draw(st.booleans()):
            changes["lease"] = self.lease_change(open_run.run_id, "renew")
        return changes

    def mids(self) -> list[str]:
        return [m.message_id for m in self.messages()]

    def start(self) -> dict[str, Any]:
        """A new run with its inputs, maybe finishing the open one in the same commit."""
        rid = self.fresh("r")
        inputs = [self.fresh("m") for _ in range(self.draw(st.integers(0, 2)))]
        status = self.draw(st.sampled_from(["running", "running", "waiting", "completed"]))
        changes: dict[str, Any] = {
            "messages": [b.insert(self.message(mid, rid, "input")) for mid in inputs],
            "runs": [],
        }
        open_run = self.open_run()
        if open_run is not None and self.draw(st.integers(0, 3)) > 0:
            final = self.draw(st.sampled_from(["completed", "failed", "cancelled"]))
            changes["runs"].append(b.replace(self.run_draft(open_run, status=final)))
        changes["runs"].append(b.insert(b.run(rid, status, inputs=inputs)))
        if self.draw(st.booleans()):
            extra = b.insert(self.message(self.fresh("m"), rid, "output"))
            changes["messages"].append(extra)
        if status in OPEN and self.draw(st.booleans()):
            changes["lease"] = b.acquire(rid, self.draw(st.sampled_from(["w1", "w2"])))
        return changes

    def finish(self) -> dict[str, Any]:
        """The open run (or another) finished, paused or resumed, maybe with an answer."""
        runs = self.runs()
        open_run = self.open_run()
        if open_run is None or self.draw(st.integers(0, 4)) == 0:
            if not runs:
                return self.append()
            open_run = self.draw(st.sampled_from(runs))
        status = self.draw(st.sampled_from(STATUSES))
        changes: dict[str, Any] = {
            "runs": [
                b.replace(self.run_draft(open_run, status=status, admitted=status != "queued"))
            ]
        }
        if self.draw(st.booleans()):
            answer = self.message(self.fresh("m"), open_run.run_id, "output")
            changes["messages"] = [b.insert(answer)]
        lease = self.model.root.lease if self.model is not None else None
        if lease is not None and self.draw(st.integers(0, 3)) > 0:
            changes["lease"] = b.release(lease.run_id, lease.owner_id, "any")
        return changes

    def queue(self) -> dict[str, Any]:
        """A queued run with its item, or one admitted (item deleted, input inserted)."""
        queued = [r for r in self.runs() if r.status == "queued"]
        if queued and self.draw(st.booleans()):
            run = self.draw(st.sampled_from(queued))
            mid = self.fresh("m")
            return {
                "messages": [b.insert(self.message(mid, run.run_id, "input"))],
                "runs": [
                    b.replace(
                        self.run_draft(run, status="running", admitted=True, inputMessageIds=[mid])
                    )
                ],
                "queuedItems": [b.delete_record(run.admission.queue_item_id or "q-none")],
            }
        rid, qid = self.fresh("r"), self.fresh("q")
        return {
            "runs": [b.insert(b.run(rid, "queued", queue_item_id=qid))],
            "queuedItems": [b.insert(b.queued_item(qid, rid, {"n": 1}))],
        }

    def rewrite(self) -> dict[str, Any]:
        """Messages replaced (moved between runs), deleted or truncated; runs deleted
        or truncated."""
        mids, runs = self.mids(), [r.run_id for r in self.runs()]
        kind = self.draw(st.sampled_from(["move", "move", "delete", "truncate", "runs"]))
        if kind == "move":
            run_id = self.draw(st.sampled_from([None, self.some(runs, "no-such-run")]))
            relation = self.draw(st.sampled_from(RELATIONS))
            draft = self.message(self.some(mids, "no-such-message"), run_id, relation)
            return {"messages": [b.replace(draft)]}
        if kind == "delete":
            return {"messages": [b.delete_record(self.some(mids, "no-such-message"))]}
        if kind == "truncate":
            after = self.draw(st.sampled_from([None, self.some(mids, "no-such-message")]))
            return {"messages": [b.truncate(after)]}
        if self.draw(st.booleans()):
            return {"runs": [b.delete_record(self.some(runs, "no-such-run"))]}
        return {"runs": [b.truncate(self.draw(st.sampled_from([None, *runs])))]}

    def lease_change(self, run_id: str, kind: str) -> dict[str, Any]:
        lease = self.model.root.lease if self.model is not None else None
        owner = lease.owner_id if lease is not None else "w1"
        if kind == "renew":
            return b.renew(run_id, owner)
        return b.release(run_id, owner, "any")

    def lease_only(self) -> dict[str, Any]:
        runs = [r.run_id for r in self.runs()]
        open_run = self.open_run()
        run_id = open_run.run_id if open_run is not None else self.some(runs, "no-such-run")
        kind = self.draw(st.sampled_from(["acquire", "renew", "release"]))
        if kind == "acquire":
            return {"lease": b.acquire(run_id, self.draw(st.sampled_from(["w1", "w2"])))}
        return {"lease": self.lease_change(run_id, kind)}

    # ------------------------------------------------------------ steps

    def step(self) -> None:
        tamper = self.draw(st.sampled_from(["none"] * 6 + ["null", "stale", "clock"]))
        if tamper != "none" and self.model is not None:
            self.tamper(tamper)
        if self.model is None:
            changes = self.draw(st.sampled_from([{}, None])) or self.start()
            self.commit(b.create(self.scope, self.tid, changes), "create")
            return
        shape = self.draw(
            st.sampled_from(
                ["append"] * 4
                + ["start"] * 2
                + ["finish"] * 2
                + ["queue", "rewrite", "rewrite", "lease", "root", "delete"]
            )
        )
        if shape == "delete":
            if self.draw(st.integers(0, 2)) > 0:
                return
            commit = b.delete(self.scope, self.tid, self.model.root.version.to_json())
        else:
            changes = {} if shape == "root" else getattr(self, _SHAPES[shape])()
            commit = b.update_at(
                self.scope, self.tid, self.model.root.version.to_json(), changes, root=b.root()
            )
        self.commit(commit, shape)

    def tamper(self, how: str) -> None:
        """Leave the root as older code would: no facts, or another revision's."""
        self.log.append(f"tamper {how}")
        if how == "clock":
            self.clock.advance(ms=self.draw(st.sampled_from([1, 30_000, 30_001])))
            return
        self.tampered = True
        value = None
        if how == "stale":
            stored = self.stored_facts()
            revision = self.model.root.version.revision if self.model is not None else 1
            value = json.dumps(
                {
                    "revision": revision - 1,
                    "facts": stored["facts"] if stored else {"tail": None, "open": []},
                }
            )
        self.run(
            self.conn.execute(
                f"UPDATE {self.store.tables.threads} SET facts = $1 "
                "WHERE scope_key = $2 AND thread_id = $3",
                value,
                self.scope.encode(),
                self.tid.encode(),
            )
        )

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def commit(self, commit: dict[str, Any], label: str) -> None:
        self.log.append(f"{label}: {json.dumps(commit.get('mutation', {}).get('changes'))}")
        where = "\n".join(self.log[-6:])
        now = self.clock()
        got: Any = None
        got_exc: BaseException | None = None
        try:
            got = self.run(self.store.commit_thread(copy.deepcopy(commit)))
        except Exception as exc:
            got_exc = exc
        new_id = uuid.uuid4().hex
        if isinstance(got, CommittedResult) and got.thread is not None:
            new_id = got.thread.version.thread_instance_id
        expected: Any = None
        exp_exc: BaseException | None = None
        try:
            expected = apply_thread_changes(
                self.model, copy.deepcopy(commit), now, instance_id=lambda: new_id
            )
        except Exception as exc:
            exp_exc = exc
        if exp_exc is not None or got_exc is not None:
            assert type(got_exc) is type(exp_exc), (
                f"{where}\nstore: {got_exc!r}\nmodel: {exp_exc!r}"
            )
            return
        assert got.to_json() == expected.result.to_json(), f"{where}\n{got!r}\n{expected.result!r}"
        if isinstance(got, CommittedResult):
            self.model = expected.aggregate
            self.tampered = False  # a commit writes the facts of its revision

    # ------------------------------------------------------------ what is stored

    def stored_facts(self) -> Any:
        text = self.run(
            self.conn.fetchval(
                f"SELECT facts FROM {self.store.tables.threads} "
                "WHERE scope_key = $1 AND thread_id = $2",
                self.scope.encode(),
                self.tid.encode(),
            )
        )
        return None if text is None else json.loads(text)

    def check_stored(self) -> None:
        where = "\n".join(self.log[-6:])
        read = self.run(
            self.store.read_thread(
                b.read(
                    self.scope,
                    self.tid,
                    messages={"type": "page", "view": "raw", "page": {"limit": 100}},
                    runs={"type": "page", "page": {"limit": 100}},
                    queuedItems={"type": "page", "page": {"limit": 100}},
                )
            )
        )
        if self.model is None:
            assert read.thread is None, where
            return
        assert read.thread is not None, where
        assert read.thread.to_json() == self.model.root.to_json(), where
        for page, expected in (
            (read.messages, self.messages()),
            (read.runs, self.runs()),
            (read.queued_items, self.items()),
        ):
            assert page is not None, where
            assert page.next_page_token is None, where
            assert [x.to_json() for x in page.items] == [x.to_json() for x in expected], where
        stored = self.stored_facts()
        if stored is None or stored["revision"] != self.model.root.version.revision:
            assert self.tampered, f"{where}\nno facts of the root's revision"
            return
        truth = relations_from_aggregate(self.model)
        facts = stored["facts"]
        tail = facts["tail"]
        expected_tail = truth.tail
        assert (tail is None) == (expected_tail is None), where
        if tail is not None and expected_tail is not None:
            assert (tail["messageId"], tail["order"], tail["runId"], tail["relation"]) == (
                expected_tail.message_id,
                expected_tail.position,
                expected_tail.run_id,
                expected_tail.relation,
            ), where
        assert [o["runId"] for o in facts["open"]] == [r.run_id for r in truth.open_runs], where
        for kept, run in zip(facts["open"], truth.open_runs, strict=True):
            assert kept["status"] == run.status, where
            assert kept["admitted"] == run.admitted, where
            assert kept["queueItemId"] == run.queue_item_id, where
            assert tuple(kept["inputMessageIds"]) == run.input_message_ids, where
            relations = truth.runs[run.run_id]
            # Only the rule-relevant messages, however the facts were made (derived,
            # or read back by queries): they stay small however long the run is.
            refs = [
                MessageRef(m["messageId"], m["order"], m["runId"], m["relation"])
                for m in kept["messages"]
            ]
            assert refs == relevant_messages(list(relations.messages)), where
            assert kept["foreign"] == relations.foreign_inside, where


_SHAPES = {
    "append": "append",
    "start": "start",
    "finish": "finish",
    "queue": "queue",
    "rewrite": "rewrite",
    "lease": "lease_only",
}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_commits_and_facts_agree_with_the_reference_model(
    pg_schema: str, data: st.DataObject
) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        clock = ManualClock()
        store = PostgresThreadStore(URL, schema=pg_schema, clock=clock, max_pool_size=2)
        conn = loop.run_until_complete(asyncpg.connect(dsn(), timeout=10))
        try:
            example = _Example(data, store, clock, conn)
            for _ in range(STEPS):
                example.step()
                example.check_stored()
        finally:
            loop.run_until_complete(conn.close())
            loop.run_until_complete(store.close())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_a_thread_with_malformed_facts_can_be_deleted(pg_schema: str) -> None:
    """A delete reads no facts: malformed ones (refused by any other commit) never
    keep a thread from being deleted, by its owner, a retention sweep or a scope
    erasure."""

    async def scenario() -> None:
        async with PostgresThreadStore(URL, schema=pg_schema) as store:
            created = await store.commit_thread(b.create("s", "t"))
            assert isinstance(created, CommittedResult)
            assert created.thread is not None
            conn = await asyncpg.connect(dsn(), timeout=10)
            try:
                await conn.execute(f"UPDATE {store.tables.threads} SET facts = 'not json'")
            finally:
                await conn.close()
            deleted = await store.commit_thread(b.delete("s", "t", created.thread.version))
            assert isinstance(deleted, CommittedResult)
            assert deleted.thread is None

    asyncio.run(scenario())
