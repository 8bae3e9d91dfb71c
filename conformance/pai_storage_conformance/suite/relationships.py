"""Relationship rules and the worked example of one turn.

The rules are docs/commits.md#relationship-rules; the example is
docs/commits.md#worked-example-one-turn.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

import pytest

from pai_storage import CommittedResult, ConflictResult, ManualClock, ThreadStore, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from ._support import new_scope

__all__ = ["TestRelationshipRules", "TestWorkedExample"]

pytestmark = pytest.mark.asyncio


# ------------------------------------------------------------------ helpers


def _user(
    mid: str,
    run_id: str | None = None,
    relation: Literal["input", "context", "output"] = "input",
) -> dict[str, Any]:
    return b.message(mid, f"user says {mid}", run_id=run_id, relation=relation)


def _out(mid: str, run_id: str, status: str = "complete") -> dict[str, Any]:
    return b.message(
        mid, f"agent says {mid}", role="assistant", run_id=run_id, relation="output", status=status
    )


def _queued(run_id: str, item_id: str) -> dict[str, Any]:
    return b.run(run_id, "queued", queue_item_id=item_id)


def _all_pages() -> dict[str, Any]:
    return {
        "messages": {"type": "page", "view": "raw", "page": {"limit": 100}},
        "runs": {"type": "page", "page": {"limit": 100}},
        "queuedItems": {"type": "page", "page": {"limit": 100}},
    }


async def _snapshot(store: ThreadStore, scope: str, tid: str) -> dict[str, Any]:
    """The whole thread as JSON (root and every family), without ``observedAt``."""
    read = await store.read_thread(b.read(scope, tid, **_all_pages()))
    data = read.to_json()
    del data["observedAt"]
    return data


def _committed(result: Any) -> CommittedResult:
    assert isinstance(result, CommittedResult), f"expected a committed result, got {result!r}"
    return result


async def _commit_ok(store: ThreadStore, commit: dict[str, Any]) -> ThreadVersion:
    result = _committed(await store.commit_thread(commit))
    assert result.thread is not None
    return result.thread.version


async def _assert_rule_broken(
    store: ThreadStore, scope: str, tid: str, commit: dict[str, Any], rule: int
) -> None:
    """The commit raises an invariant error naming ``rule`` and applies nothing."""
    before = await _snapshot(store, scope, tid)
    with pytest.raises(ThreadStoreInvariantError) as caught:
        await store.commit_thread(commit)
    message = str(caught.value)
    assert re.search(rf"\brule {rule}\b", message), (
        f"expected the error to name relationship rule {rule}, got: {message}"
    )
    after = await _snapshot(store, scope, tid)
    assert after == before


async def _assert_create_rule_broken(
    store: ThreadStore, scope: str, tid: str, changes: dict[str, Any], rule: int
) -> None:
    await _assert_rule_broken(store, scope, tid, b.create(scope, tid, changes), rule)
    assert (await store.read_thread(b.read(scope, tid))).thread is None


async def _turn_thread(store: ThreadStore, scope: str, tid: str = "t") -> ThreadVersion:
    """r1 completed (m1 input, m2 output) then r2 running (m3 input) owning the tail."""
    return await _commit_ok(
        store,
        b.create(
            scope,
            tid,
            {
                "messages": [
                    b.insert(_user("m1", "r1")),
                    b.insert(_out("m2", "r1")),
                    b.insert(_user("m3", "r2")),
                ],
                "runs": [
                    b.insert(b.run("r1", "completed", inputs=["m1"])),
                    b.insert(b.run("r2", "running", inputs=["m3"])),
                ],
                "lease": b.acquire("r2", "w1"),
            },
        ),
    )


async def _done_thread(store: ThreadStore, scope: str, tid: str = "t") -> ThreadVersion:
    """r1 (m1, m2) and r2 (m3, m4) both completed; no open run, no lease."""
    return await _commit_ok(
        store,
        b.create(
            scope,
            tid,
            {
                "messages": [
                    b.insert(_user("m1", "r1")),
                    b.insert(_out("m2", "r1")),
                    b.insert(_user("m3", "r2")),
                    b.insert(_out("m4", "r2")),
                ],
                "runs": [
                    b.insert(b.run("r1", "completed", inputs=["m1"])),
                    b.insert(b.run("r2", "completed", inputs=["m3"])),
                ],
            },
        ),
    )


class TestRelationshipRules:
    """Every relationship rule, judged on the post-commit state, on create and on update."""

    # ------------------------------------------------------------------ rule 1

    async def test_rule1_run_message_names_existing_run(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _commit_ok(
            store,
            b.create(
                scope,
                "t",
                {
                    "messages": [b.insert(_user("m0")), b.insert(_user("m1", "r1"))],
                    "runs": [b.insert(b.run("r1", "completed", inputs=["m1"]))],
                },
            ),
        )
        assert version.revision == 1

    async def test_rule1_violated_on_create(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _assert_create_rule_broken(
            store, scope, "t", {"messages": [b.insert(_user("m1", "ghost"))]}, 1
        )

    async def test_rule1_violated_on_update(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _done_thread(store, scope)
        # an output message naming a run that does not exist
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope, "t", version, {"messages": [b.insert(_out("m5", "ghost"))]}, root=b.root()
            ),
            1,
        )
        # re-pointing an existing message at a missing run
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope, "t", version, {"messages": [b.replace(_out("m4", "ghost"))]}, root=b.root()
            ),
            1,
        )
        # deleting a run whose messages stay behind
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(scope, "t", version, {"runs": [b.delete_record("r1")]}, root=b.root()),
            1,
        )
        # truncating every run while the messages stay
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(scope, "t", version, {"runs": [b.truncate(None)]}, root=b.root()),
            1,
        )
        # removing the messages and the runs together is fine
        final = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {"messages": [b.truncate("m2")], "runs": [b.delete_record("r2")]},
                root=b.root(),
            ),
        )
        assert final.revision == 2
        read = await store.read_thread(b.read(scope, "t", **_all_pages()))
        assert read.messages is not None
        assert read.runs is not None
        assert [m.message_id for m in read.messages.items] == ["m1", "m2"]
        assert [r.run_id for r in read.runs.items] == ["r1"]

    # ------------------------------------------------------------------ rule 2

    async def test_rule2_contiguous_runs_pass(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {"messages": [b.insert(_out("m4", "r2")), b.insert(_out("m5", "r2"))]},
                root=b.root(),
            ),
        )
        assert version.revision == 2

    async def test_rule2_violated_by_appending_to_older_run(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "messages": [b.insert(_out("m4", "r2"))],
                    "runs": [b.replace(b.run("r2", "completed", inputs=["m3"]))],
                    "lease": b.release("r2", "w1"),
                },
                root=b.root(),
            ),
        )
        # r1 = [m1, m2], r2 = [m3, m4]: appending another r1 message after r2's breaks r1's interval
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope, "t", version, {"messages": [b.insert(_out("m5", "r1"))]}, root=b.root()
            ),
            2,
        )
        # so does appending to both runs in one commit
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                version,
                {"messages": [b.insert(_out("m5", "r2")), b.insert(_out("m6", "r1"))]},
                root=b.root(),
            ),
            2,
        )

    async def test_rule2_violated_on_create(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [
                    b.insert(_user("m1", "r1")),
                    b.insert(b.message("note", "a standalone note", role="system")),
                    b.insert(_out("m2", "r1")),
                ],
                "runs": [b.insert(b.run("r1", "completed", inputs=["m1"]))],
            },
            2,
        )

    # ------------------------------------------------------------------ rule 3

    async def test_rule3_inputs_in_order_pass(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _commit_ok(
            store,
            b.create(
                scope,
                "t",
                {
                    "messages": [
                        b.insert(_user("m1", "r1")),
                        b.insert(_user("m2", "r1")),
                        b.insert(_user("c1", "r1", relation="context")),
                        b.insert(_out("o1", "r1")),
                    ],
                    "runs": [b.insert(b.run("r1", "running", inputs=["m1", "m2"]))],
                },
            ),
        )
        read = await store.read_thread(b.read(scope, "t", **_all_pages()))
        assert read.thread is not None
        assert read.thread.version == version
        assert read.runs is not None
        assert read.runs.items[0].input_message_ids == ["m1", "m2"]

    @pytest.mark.parametrize(
        ("case", "messages", "inputs"),
        [
            ("wrong order", [_user("m1", "r1"), _user("m2", "r1")], ["m2", "m1"]),
            ("missing input", [_user("m1", "r1")], ["m1", "m9"]),
            ("not listed", [_user("m1", "r1"), _user("m2", "r1")], ["m1"]),
            ("context relation", [_user("m1", "r1", relation="context")], ["m1"]),
            ("output relation", [_out("m1", "r1")], ["m1"]),
            ("context first", [_user("c", "r1", relation="context"), _user("m1", "r1")], ["m1"]),
            ("no inputs listed", [_user("m1", "r1")], []),
            ("standalone input", [_user("m1")], ["m1"]),
        ],
    )
    async def test_rule3_violated_on_create(
        self,
        store: ThreadStore,
        case: str,
        messages: list[dict[str, Any]],
        inputs: list[str],
    ) -> None:
        scope = new_scope()
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(m) for m in messages],
                "runs": [b.insert(b.run("r1", "running", inputs=inputs))],
            },
            3,
        )

    async def test_rule3_violated_on_update(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        # adding a second input right after the first (before any output) is fine
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "messages": [b.insert(_user("m3b", "r2"))],
                    "runs": [b.replace(b.run("r2", "running", inputs=["m3", "m3b"]))],
                },
                root=b.root(),
            ),
        )
        assert version.revision == 2
        # an input message after the run's output
        with_output = await _commit_ok(
            store,
            b.update_at(
                scope, "t", version, {"messages": [b.insert(_out("m4", "r2"))]}, root=b.root()
            ),
        )
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope, "t", with_output, {"messages": [b.insert(_user("m5", "r2"))]}, root=b.root()
            ),
            3,
        )
        # listing the late input does not help: the interval must start with the inputs
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                with_output,
                {
                    "messages": [b.insert(_user("m5", "r2"))],
                    "runs": [b.replace(b.run("r2", "running", inputs=["m3", "m3b", "m5"]))],
                },
                root=b.root(),
            ),
            3,
        )
        # replacing the run's input list with a wrong one
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                with_output,
                {"runs": [b.replace(b.run("r2", "running", inputs=["m4"]))]},
                root=b.root(),
            ),
            3,
        )
        # turning an input into context
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                with_output,
                {"messages": [b.replace(_user("m3", "r2", relation="context"))]},
                root=b.root(),
            ),
            3,
        )

    async def test_rule3_output_before_inputs_is_rejected(self, store: ThreadStore) -> None:
        # The output comes first by position but sorts last by id: a store must judge
        # "nothing precedes the inputs" by position, not by message id.
        scope = new_scope()
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [
                    b.insert(_out("zz", "r1")),
                    b.insert(_user("in", "r1")),
                    b.insert(_out("aa", "r1")),
                ],
                "runs": [b.insert(b.run("r1", "running", inputs=["in"]))],
            },
            3,
        )

    # ------------------------------------------------------------------ rule 4

    async def test_rule4_queued_and_cancelled_runs_without_messages_pass(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "runs": [b.insert(_queued("r3", "q3")), b.insert(_queued("r4", "q4"))],
                    "queuedItems": [
                        b.insert(b.queued_item("q3", "r3", {"text": "later"})),
                        b.insert(b.queued_item("q4", "r4", {"text": "never"})),
                    ],
                },
                root=b.root(),
            ),
        )
        # cancel r4 before admission: delete its item, cancel it unadmitted
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "runs": [
                        b.replace(b.run("r4", "cancelled", admitted=False, queue_item_id="q4"))
                    ],
                    "queuedItems": [b.delete_record("q4")],
                },
                root=b.root(),
            ),
        )
        assert version.revision == 3

    async def test_rule4_violated_on_create(self, store: ThreadStore) -> None:
        scope = new_scope()
        # a queued run owning a message
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(_user("m1", "r1"))],
                "runs": [b.insert(_queued("r1", "q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
            },
            4,
        )
        # a queued run with input ids (of a standalone message)
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(_user("m1"))],
                "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1", inputs=["m1"]))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
            },
            4,
        )
        # a run cancelled before admission owning a message
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(_user("m1", "r1"))],
                "runs": [b.insert(b.run("r1", "cancelled", admitted=False, inputs=["m1"]))],
            },
            4,
        )

    async def test_rule4_violated_on_update(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _done_thread(store, scope)
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "runs": [
                        b.insert(_queued("r3", "q3")),
                        b.insert(b.run("r4", "cancelled", admitted=False)),
                    ],
                    "queuedItems": [b.insert(b.queued_item("q3", "r3"))],
                },
                root=b.root(),
            ),
        )
        # an output message for the queued run r3
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope, "t", version, {"messages": [b.insert(_out("m9", "r3"))]}, root=b.root()
            ),
            4,
        )
        # a message for the never-admitted cancelled run r4
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope, "t", version, {"messages": [b.insert(_out("m9", "r4"))]}, root=b.root()
            ),
            4,
        )
        # giving the queued run input ids before admission
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                version,
                {"runs": [b.replace(b.run("r3", "queued", queue_item_id="q3", inputs=["m1"]))]},
                root=b.root(),
            ),
            4,
        )

    # ------------------------------------------------------------------ rule 5

    async def test_rule5_open_run_owning_tail_passes(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "messages": [b.insert(_out("m4", "r2", "incomplete"))],
                    "runs": [b.replace(b.run("r2", "waiting", inputs=["m3"]))],
                },
                root=b.root(),
            ),
        )
        assert version.revision == 2

    @pytest.mark.parametrize("second", ["running", "waiting"])
    async def test_rule5_two_open_runs_on_create(self, store: ThreadStore, second: str) -> None:
        scope = new_scope()
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(_user("m1", "r1")), b.insert(_user("m2", "r2"))],
                "runs": [
                    b.insert(b.run("r1", "running", inputs=["m1"])),
                    b.insert(b.run("r2", second, inputs=["m2"])),
                ],
            },
            5,
        )

    async def test_rule5_open_run_not_owning_tail_on_create(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(_user("m1", "r1")), b.insert(_user("m2", "r2"))],
                "runs": [
                    b.insert(b.run("r1", "running", inputs=["m1"])),
                    b.insert(b.run("r2", "completed", inputs=["m2"])),
                ],
            },
            5,
        )

    async def test_rule5_violated_on_update(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        # a standalone message after the running run's interval
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope, "t", version, {"messages": [b.insert(_user("late"))]}, root=b.root()
            ),
            5,
        )
        # reopening the completed r1 while r2 runs: two open runs
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                version,
                {"runs": [b.replace(b.run("r1", "waiting", inputs=["m1"]))]},
                root=b.root(),
            ),
            5,
        )
        # completing r2 then appending a standalone message is fine
        done = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "messages": [b.insert(_user("late"))],
                    "runs": [b.replace(b.run("r2", "completed", inputs=["m3"]))],
                    "lease": b.release("r2", "w1"),
                },
                root=b.root(),
            ),
        )
        # reopening r1 now: r1 does not own the tail
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                done,
                {"runs": [b.replace(b.run("r1", "running", inputs=["m1"]))]},
                root=b.root(),
            ),
            5,
        )

    # ------------------------------------------------------------------ rule 6

    async def test_rule6_queue_admission_passes(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _commit_ok(
            store,
            b.create(
                scope,
                "t",
                {
                    "runs": [
                        b.insert(_queued("r1", "q1")),
                        b.insert(_queued("r2", "q2")),
                        b.insert(b.run("r3", "cancelled", admitted=True)),
                    ],
                    "queuedItems": [
                        b.insert(b.queued_item("q1", "r1", ["a"])),
                        b.insert(b.queued_item("q2", "r2", {"b": 1})),
                    ],
                },
            ),
        )
        # admit r1: delete its item, insert its input, mark it running and admitted
        version = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "messages": [b.insert(_user("m1", "r1"))],
                    "runs": [b.replace(b.run("r1", "running", inputs=["m1"], queue_item_id="q1"))],
                    "queuedItems": [b.delete_record("q1")],
                    "lease": b.acquire("r1", "w1"),
                },
                root=b.root(),
            ),
        )
        read = await store.read_thread(b.read(scope, "t", **_all_pages()))
        assert read.queued_items is not None
        assert read.runs is not None
        assert [q.queue_item_id for q in read.queued_items.items] == ["q2"]
        assert read.runs.items[0].admission.admitted is True
        assert read.runs.items[0].admission.admitted_at is not None
        assert version.revision == 2

    @pytest.mark.parametrize(
        ("case", "runs", "items"),
        [
            ("queued run without item", [_queued("r1", "q1")], []),
            ("queued run without item id", [b.run("r1", "queued")], []),
            (
                "queued run with item id but other item",
                [_queued("r1", "q1"), _queued("r2", "q2")],
                [b.queued_item("q2", "r1"), b.queued_item("q1", "r2")],
            ),
            (
                "queued run with two items",
                [_queued("r1", "q1")],
                [b.queued_item("q1", "r1"), b.queued_item("q2", "r1")],
            ),
            ("item names missing run", [], [b.queued_item("q1", "ghost")]),
            (
                "item names non-queued run",
                [b.run("r1", "cancelled", admitted=False, queue_item_id="q1")],
                [b.queued_item("q1", "r1")],
            ),
            (
                "admitted run with item",
                [b.run("r1", "completed", queue_item_id="q1")],
                [b.queued_item("q1", "r1")],
            ),
            (
                "queued and admitted",
                [b.run("r1", "queued", admitted=True, queue_item_id="q1")],
                [b.queued_item("q1", "r1")],
            ),
            ("running not admitted", [b.run("r1", "running", admitted=False)], []),
            ("waiting not admitted", [b.run("r1", "waiting", admitted=False)], []),
            ("completed not admitted", [b.run("r1", "completed", admitted=False)], []),
            ("failed not admitted", [b.run("r1", "failed", admitted=False)], []),
        ],
    )
    async def test_rule6_violated_on_create(
        self,
        store: ThreadStore,
        case: str,
        runs: list[dict[str, Any]],
        items: list[dict[str, Any]],
    ) -> None:
        scope = new_scope()
        changes: dict[str, Any] = {}
        if runs:
            changes["runs"] = [b.insert(r) for r in runs]
        if items:
            changes["queuedItems"] = [b.insert(i) for i in items]
        await _assert_create_rule_broken(store, scope, "t", changes, 6)

    async def test_rule6_violated_on_update(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _commit_ok(
            store,
            b.create(
                scope,
                "t",
                {
                    "runs": [b.insert(_queued("r1", "q1"))],
                    "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
                },
            ),
        )
        cases: list[tuple[str, dict[str, Any]]] = [
            # admitting without deleting the item: an admitted run with an item
            (
                "item left behind",
                {
                    "messages": [b.insert(_user("m1", "r1"))],
                    "runs": [b.replace(b.run("r1", "running", inputs=["m1"], queue_item_id="q1"))],
                },
            ),
            # deleting the item but leaving the run queued
            ("queued run without item", {"queuedItems": [b.delete_record("q1")]}),
            # marking the run running without admitting it
            (
                "running not admitted",
                {
                    "runs": [b.replace(b.run("r1", "running", admitted=False, queue_item_id="q1"))],
                    "queuedItems": [b.delete_record("q1")],
                },
            ),
            # admitting while still queued
            (
                "queued and admitted",
                {"runs": [b.replace(b.run("r1", "queued", admitted=True, queue_item_id="q1"))]},
            ),
            # pointing the item at another run
            (
                "item names another run",
                {
                    "runs": [b.insert(b.run("r2", "cancelled", admitted=True))],
                    "queuedItems": [b.replace(b.queued_item("q1", "r2"))],
                },
            ),
            # a second item for the queued run
            ("second item", {"queuedItems": [b.insert(b.queued_item("q2", "r1"))]}),
        ]
        for case, changes in cases:
            try:
                await _assert_rule_broken(
                    store, scope, "t", b.update_at(scope, "t", version, changes, root=b.root()), 6
                )
            except AssertionError as exc:
                raise AssertionError(f"case {case!r}: {exc}") from exc

    # ------------------------------------------------------------------ rule 7

    async def test_rule7_lease_on_open_run_passes(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        waiting = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    version,
                    {
                        "runs": [b.replace(b.run("r2", "waiting", inputs=["m3"]))],
                        "lease": b.renew("r2", "w1"),
                    },
                    root=b.root(),
                )
            )
        )
        assert waiting.thread is not None
        assert waiting.thread.lease is not None
        assert waiting.thread.lease.run_id == "r2"

    async def test_rule7_lease_naming_non_open_run_on_create(self, store: ThreadStore) -> None:
        scope = new_scope()
        # a lease naming a completed run
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(_user("m1", "r1"))],
                "runs": [b.insert(b.run("r1", "completed", inputs=["m1"]))],
                "lease": b.acquire("r1", "w1"),
            },
            7,
        )
        # a lease naming a queued run
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "runs": [b.insert(_queued("r1", "q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
                "lease": b.acquire("r1", "w1"),
            },
            7,
        )

    async def test_rule7_lease_naming_missing_run_on_create(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _assert_create_rule_broken(
            store,
            scope,
            "t",
            {
                "messages": [b.insert(_user("m1", "r1"))],
                "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
                "lease": b.acquire("r9", "w1"),
            },
            7,
        )
        await _assert_create_rule_broken(store, scope, "t", {"lease": b.acquire("r1", "w1")}, 7)

    @pytest.mark.parametrize("final", ["completed", "failed", "cancelled"])
    async def test_rule7_finishing_run_without_releasing_lease(
        self, store: ThreadStore, final: str
    ) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                version,
                {"runs": [b.replace(b.run("r2", final, inputs=["m3"]))]},
                root=b.root(),
            ),
            7,
        )
        # finishing and releasing together is fine
        done = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "runs": [b.replace(b.run("r2", final, inputs=["m3"]))],
                    "lease": b.release("r2", "w1", "any"),
                },
                root=b.root(),
            ),
        )
        assert done.revision == 2

    async def test_rule7_acquire_for_non_open_run_on_update(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        # after expiry, acquiring the lease for the completed r1
        clock.advance(timedelta(hours=1))
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(scope, "t", version, {"lease": b.acquire("r1", "w2")}, root=b.root()),
            7,
        )
        # takeover of the running run is fine
        taken = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {"lease": b.acquire("r2", "w2", 1_000, "resume")},
                root=b.root(),
            ),
        )
        assert taken.revision == 2

    async def test_rule7_lease_naming_missing_run_on_update(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        # deleting the leased run (and its messages) while the lease stays
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(
                scope,
                "t",
                version,
                {"messages": [b.truncate("m2")], "runs": [b.delete_record("r2")]},
                root=b.root(),
            ),
            7,
        )
        # after expiry, acquiring the lease for a run that does not exist
        clock.advance(timedelta(hours=1))
        await _assert_rule_broken(
            store,
            scope,
            "t",
            b.update_at(scope, "t", version, {"lease": b.acquire("nope", "w2")}, root=b.root()),
            7,
        )

    # ------------------------------------------------------- boundaries a commit moves
    #
    # A normalized backend checks only the records a commit touches plus the
    # boundaries it moves; each case below breaks a rule through a record the
    # commit does not mention (a run's inputs, a neighbour of a replaced message,
    # an item whose run goes away), so a backend must load it to notice.

    @pytest.mark.parametrize(
        ("case", "changes", "rule"),
        [
            ("delete an input of a run", {"messages": [b.delete_record("m1")]}, 3),
            (
                "delete the second input of a run",
                {"messages": [b.delete_record("m1b")]},
                3,
            ),
            ("truncate into a run's inputs", {"messages": [b.truncate("m1")]}, 3),
            (
                "re-point an output at an earlier run past a later one",
                {"messages": [b.replace(_out("m4", "r1"))]},
                2,
            ),
            (
                "turn the middle of a run's interval standalone",
                {"messages": [b.replace(b.message("m2", role="assistant"))]},
                2,
            ),
            (
                "turn an input standalone",
                {"messages": [b.replace(b.message("m3"))]},
                3,
            ),
            (
                "turn an output into an input",
                {"messages": [b.replace(_user("m2", "r1"))]},
                3,
            ),
            (
                "un-admit a run that owns messages",
                {"runs": [b.replace(b.run("r2", "cancelled", admitted=False, inputs=["m3"]))]},
                4,
            ),
            (
                "insert an open run while none owns the tail",
                {
                    "messages": [b.insert(_user("m5", "r3"))],
                    "runs": [b.insert(b.run("r3", "running", inputs=["m5"]))],
                    "lease": b.acquire("r3", "w1"),
                },
                None,
            ),
        ],
    )
    async def test_rules_through_records_the_commit_does_not_name(
        self,
        store: ThreadStore,
        case: str,
        changes: dict[str, Any],
        rule: int | None,
    ) -> None:
        scope = new_scope()
        version = await _commit_ok(
            store,
            b.create(
                scope,
                "t",
                {
                    "messages": [
                        b.insert(_user("m1", "r1")),
                        b.insert(_user("m1b", "r1")),
                        b.insert(_out("m2", "r1")),
                        b.insert(_out("m2b", "r1")),
                        b.insert(_user("m3", "r2")),
                        b.insert(_out("m4", "r2")),
                    ],
                    "runs": [
                        b.insert(b.run("r1", "completed", inputs=["m1", "m1b"])),
                        b.insert(b.run("r2", "cancelled", inputs=["m3"])),
                    ],
                },
            ),
        )
        commit = b.update_at(scope, "t", version, changes, root=b.root())
        if rule is None:  # the control case: a valid commit
            assert (await _commit_ok(store, commit)).revision == 2
            return
        await _assert_rule_broken(store, scope, "t", commit, rule)

    async def test_rule6_broken_by_removing_or_changing_the_queued_run(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        version = await _commit_ok(
            store,
            b.create(
                scope,
                "t",
                {
                    "messages": [b.insert(_user("m1", "r0")), b.insert(_out("m2", "r0"))],
                    "runs": [
                        b.insert(b.run("r0", "completed", inputs=["m1"])),
                        b.insert(_queued("r1", "q1")),
                        b.insert(_queued("r2", "q2")),
                    ],
                    "queuedItems": [
                        b.insert(b.queued_item("q1", "r1")),
                        b.insert(b.queued_item("q2", "r2")),
                    ],
                },
            ),
        )
        cases: list[tuple[str, dict[str, Any]]] = [
            ("delete the queued run, keep its item", {"runs": [b.delete_record("r1")]}),
            ("truncate the queued runs, keep their items", {"runs": [b.truncate("r0")]}),
            (
                "truncate every run, keep the items",
                {"runs": [b.truncate(None)], "messages": [b.truncate(None)]},
            ),
            (
                "cancel the queued run, keep its item",
                {"runs": [b.replace(b.run("r1", "cancelled", admitted=False, queue_item_id="q1"))]},
            ),
            (
                "point the queued run at another item id",
                {"runs": [b.replace(_queued("r1", "q9"))]},
            ),
            (
                "swap the item ids of two queued runs",
                {"runs": [b.replace(_queued("r1", "q2"))]},
            ),
            (
                "delete an item, insert it for another run",
                {
                    "queuedItems": [
                        b.delete_record("q1"),
                        b.insert(b.queued_item("q1", "r2")),
                    ]
                },
            ),
        ]
        for case, changes in cases:
            try:
                await _assert_rule_broken(
                    store, scope, "t", b.update_at(scope, "t", version, changes, root=b.root()), 6
                )
            except AssertionError as exc:
                raise AssertionError(f"case {case!r}: {exc}") from exc
        # control: cancelling both queued runs with their items is fine
        done = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "runs": [
                        b.replace(b.run("r1", "cancelled", admitted=False, queue_item_id="q1")),
                        b.delete_record("r2"),
                    ],
                    "queuedItems": [b.delete_record("q1"), b.delete_record("q2")],
                },
                root=b.root(),
            ),
        )
        assert done.revision == 2

    async def test_rule7_broken_by_truncating_the_leased_run(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        for changes in (
            {"messages": [b.truncate("m2")], "runs": [b.truncate("r1")]},
            {"messages": [b.truncate(None)], "runs": [b.truncate(None)]},
        ):
            await _assert_rule_broken(
                store, scope, "t", b.update_at(scope, "t", version, changes, root=b.root()), 7
            )
        # releasing in the same commit is fine
        done = await _commit_ok(
            store,
            b.update_at(
                scope,
                "t",
                version,
                {
                    "messages": [b.truncate("m2")],
                    "runs": [b.truncate("r1")],
                    "lease": b.release("r2", "w1"),
                },
                root=b.root(),
            ),
        )
        assert done.revision == 2

    async def test_rule5_broken_by_a_new_open_run(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = await _turn_thread(store, scope)
        for status in ("running", "waiting"):
            await _assert_rule_broken(
                store,
                scope,
                "t",
                b.update_at(
                    scope,
                    "t",
                    version,
                    {
                        "messages": [b.insert(_user("m9", "r9"))],
                        "runs": [b.insert(b.run("r9", status, inputs=["m9"]))],
                    },
                    root=b.root(),
                ),
                5,
            )


class TestWorkedExample:
    """The worked example: one turn, a queued second turn, streaming, admission, regeneration."""

    async def test_one_turn_end_to_end(self, store: ThreadStore, clock: ManualClock) -> None:
        scope, tid = new_scope(), "worked-example"
        t0 = clock()

        # 1. create with m1 and r1 running, lease for r1 (owner w1, send)
        r1 = _committed(
            await store.commit_thread(
                b.create(
                    scope,
                    tid,
                    {
                        "messages": [b.insert(_user("m1", "r1"))],
                        "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
                        "lease": b.acquire("r1", "w1", 30_000, "send"),
                    },
                    title="worked example",
                )
            )
        )
        assert r1.thread is not None
        v1 = r1.thread.version
        assert v1.revision == 1
        assert r1.thread.lease is not None
        assert (r1.thread.lease.run_id, r1.thread.lease.owner_id) == ("r1", "w1")
        assert r1.thread.lease.operation == "send"

        # 2. a second turn arrives: r2 queued with item q1
        t2 = clock.advance(ms=1_000)
        v2 = await _commit_ok(
            store,
            b.update_at(
                scope,
                tid,
                v1,
                {
                    "runs": [b.insert(_queued("r2", "q1"))],
                    "queuedItems": [b.insert(b.queued_item("q1", "r2", {"text": "and another"}))],
                },
                root=b.root(title="worked example"),
            ),
        )
        assert v2 == ThreadVersion(thread_instance_id=v1.thread_instance_id, revision=2)

        # 3. stream r1's answer: insert m2 streaming, then replace complete + renew
        t3 = clock.advance(ms=1_000)
        v3 = await _commit_ok(
            store,
            b.update_at(
                scope,
                tid,
                v2,
                {"messages": [b.insert(_out("m2", "r1", "streaming"))]},
                root=b.root(title="worked example"),
            ),
        )
        t4 = clock.advance(ms=1_000)
        c4 = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    tid,
                    v3,
                    {
                        "messages": [b.replace(_out("m2", "r1", "complete"))],
                        "lease": b.renew("r1", "w1", 30_000),
                    },
                    root=b.root(title="worked example"),
                )
            )
        )
        assert c4.thread is not None
        v4 = c4.thread.version
        assert v4.revision == 4
        assert c4.thread.lease is not None
        assert c4.thread.lease.renewed_at == t4
        assert c4.thread.lease.acquired_at == t0
        assert c4.thread.lease.expires_at == t4 + timedelta(seconds=30)
        read = await store.read_thread(
            b.read(scope, tid, messages={"type": "ids", "messageIds": ["m2"]})
        )
        assert read.messages is not None
        (m2,) = read.messages.items
        assert m2.status == "complete"
        assert m2.created_at == t3
        assert m2.updated_at == t4

        # 4a. finish r1 and release its lease
        t5 = clock.advance(ms=1_000)
        c5 = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    tid,
                    v4,
                    {
                        "runs": [b.replace(b.run("r1", "completed", inputs=["m1"]))],
                        "lease": b.release("r1", "w1", "unexpired"),
                    },
                    root=b.root(title="worked example"),
                )
            )
        )
        assert c5.thread is not None
        assert c5.thread.lease is None
        v5 = c5.thread.version
        assert v5.revision == 5

        # 4b. admit r2: delete q1, insert m3, r2 running/admitted, acquire for r2
        t6 = clock.advance(ms=1_000)
        c6 = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    tid,
                    v5,
                    {
                        "messages": [b.insert(_user("m3", "r2"))],
                        "runs": [
                            b.replace(b.run("r2", "running", inputs=["m3"], queue_item_id="q1"))
                        ],
                        "queuedItems": [b.delete_record("q1")],
                        "lease": b.acquire("r2", "w2", 30_000, "send"),
                    },
                    root=b.root(title="worked example"),
                )
            )
        )
        assert c6.thread is not None
        v6 = c6.thread.version
        assert v6 == ThreadVersion(thread_instance_id=v1.thread_instance_id, revision=6)
        assert c6.thread.lease is not None
        assert (c6.thread.lease.run_id, c6.thread.lease.owner_id) == ("r2", "w2")
        assert c6.thread.lease.acquired_at == t6

        state = await store.read_thread(b.read(scope, tid, **_all_pages()))
        assert state.thread is not None
        assert state.thread.version == v6
        assert state.messages is not None
        assert state.runs is not None
        assert state.queued_items is not None
        assert [m.message_id for m in state.messages.items] == ["m1", "m2", "m3"]
        assert state.queued_items.items == []
        runs = {r.run_id: r for r in state.runs.items}
        assert [r.run_id for r in state.runs.items] == ["r1", "r2"]
        assert runs["r1"].status == "completed"
        assert runs["r1"].finished_at == t5
        assert runs["r1"].admission.admitted_at == t0
        assert runs["r2"].status == "running"
        assert runs["r2"].admission.admitted is True
        assert runs["r2"].admission.admitted_at == t6
        assert runs["r2"].admission.queue_item_id == "q1"
        assert runs["r2"].created_at == t2
        assert runs["r2"].finished_at is None
        assert state.messages.version == state.runs.version == state.queued_items.version == v6

        # r2 answers, completes and releases (revision 7)
        clock.advance(ms=1_000)
        v7 = await _commit_ok(
            store,
            b.update_at(
                scope,
                tid,
                v6,
                {
                    "messages": [b.insert(_out("m4", "r2"))],
                    "runs": [
                        b.replace(b.run("r2", "completed", inputs=["m3"], queue_item_id="q1"))
                    ],
                    "lease": b.release("r2", "w2", "any"),
                },
                root=b.root(title="worked example"),
            ),
        )
        assert v7.revision == 7

        # 5. regenerate the first answer: truncate after m1 and r1, reopen r1, acquire
        regenerate = b.update_at(
            scope,
            tid,
            v7,
            {
                "messages": [b.truncate("m1")],
                "runs": [
                    b.truncate("r1"),
                    b.replace(b.run("r1", "running", inputs=["m1"], operation="regenerate")),
                ],
                "lease": b.acquire("r1", "w3", 30_000, "regenerate"),
            },
            root=b.root(title="worked example"),
        )
        # a writer that commits first makes the regeneration conflict
        t8 = clock.advance(ms=1_000)
        v8 = await _commit_ok(
            store,
            b.update_at(scope, tid, v7, root=b.root(title="renamed by someone else")),
        )
        stale = await store.commit_thread(regenerate)
        assert isinstance(stale, ConflictResult)
        assert stale.current_version == v8
        unchanged = await store.read_thread(b.read(scope, tid, **_all_pages()))
        assert unchanged.messages is not None
        assert [m.message_id for m in unchanged.messages.items] == ["m1", "m2", "m3", "m4"]
        assert unchanged.thread is not None
        assert unchanged.thread.updated_at == t8

        # re-planned at revision 8, the regeneration commits (revision 9)
        t9 = clock.advance(ms=1_000)
        regenerate["condition"]["version"] = v8.to_json()
        c9 = _committed(await store.commit_thread(regenerate))
        assert c9.thread is not None
        v9 = c9.thread.version
        assert v9.revision == 9
        assert c9.thread.lease is not None
        assert c9.thread.lease.operation == "regenerate"
        assert c9.thread.lease.owner_id == "w3"
        assert c9.thread.lease.acquired_at == t9
        after = await store.read_thread(b.read(scope, tid, **_all_pages()))
        assert after.messages is not None
        assert after.runs is not None
        assert [m.message_id for m in after.messages.items] == ["m1"]
        assert [r.run_id for r in after.runs.items] == ["r1"]
        (r1_again,) = after.runs.items
        assert r1_again.status == "running"
        assert r1_again.operation == "regenerate"
        assert r1_again.finished_at is None
        assert r1_again.admission.admitted_at == t0
        assert r1_again.created_at == t0
        assert r1_again.updated_at == t9

        # the stale writer of revision 7 (r2's worker) now gets a conflict
        late = await store.commit_thread(
            b.update_at(
                scope,
                tid,
                v7,
                {"messages": [b.insert(_out("m5", "r2"))]},
                root=b.root(title="worked example"),
            )
        )
        assert isinstance(late, ConflictResult)
        assert late.current_version == v9
        # and the removed records can be inserted again as new ones
        redo = await _commit_ok(
            store,
            b.update_at(
                scope,
                tid,
                v9,
                {
                    "messages": [b.insert(_out("m2", "r1", "streaming"))],
                    "lease": b.renew("r1", "w3"),
                },
                root=b.root(title="worked example"),
            ),
        )
        assert redo.revision == 10
        final = await store.read_thread(b.read(scope, tid, **_all_pages()))
        assert final.messages is not None
        assert [m.message_id for m in final.messages.items] == ["m1", "m2"]
        assert final.messages.items[1].status == "streaming"
        assert final.messages.items[1].created_at == final.messages.items[1].updated_at
