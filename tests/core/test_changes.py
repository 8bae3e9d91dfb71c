"""Mechanics of ``apply_family_changes`` (docs/commits.md#change-families-and-their-order)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pai_storage import builders as b
from pai_storage import open_store
from pai_storage.backend import (
    Entry,
    Family,
    FamilyWrite,
    ThreadAggregate,
    apply_family_changes,
    apply_thread_changes,
    change_ids,
    stamp_message,
)
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.models import MessageDraft, ThreadChanges

T0 = datetime(2030, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(seconds=1)


def _changes(changes: list[dict[str, Any]]) -> list[Any]:
    parsed = ThreadChanges.model_validate({"messages": changes})
    assert parsed.messages is not None
    return parsed.messages


def _family(*ids: str, gaps: tuple[str, ...] = ()) -> Family[Any]:
    """A message family holding ``ids`` (``gaps`` inserted and then deleted)."""
    family: Family[Any] = Family()
    position = 1
    for mid in ids + gaps:
        record = stamp_message(None, MessageDraft.model_validate(b.message(mid)), T0)
        family.entries[mid] = Entry(position, record)
        position += 1
    for mid in gaps:
        del family.entries[mid]
    family.next_position = position
    return family


def _apply(
    family: Family[Any], changes: list[dict[str, Any]], *, touched_only: bool = False
) -> FamilyWrite[Any]:
    parsed = _changes(changes)
    previous = family.entries
    if touched_only:
        previous = {i: e for i in change_ids(parsed) if (e := family.get(i)) is not None}
    return apply_family_changes(
        "messages", parsed, previous, family.next_position, T1, stamp_message
    )


def ins(mid: str, **kw: Any) -> dict[str, Any]:
    return {"type": "insert", "record": b.message(mid, **kw)}


def rep(mid: str, **kw: Any) -> dict[str, Any]:
    return {"type": "replace", "record": b.message(mid, **kw)}


def dele(mid: str) -> dict[str, Any]:
    return {"type": "delete", "id": mid}


def trunc(after: str | None) -> dict[str, Any]:
    return {"type": "truncate", "afterId": after}


def apply_write(family: Family[Any], write: FamilyWrite[Any]) -> list[tuple[str, int]]:
    """Apply a write the way a normalized backend with a unique id key would."""
    rows = {
        rid: e.position
        for rid, e in family.entries.items()
        if write.truncate_after is None or e.position <= write.truncate_after
    }
    for rid in write.deletes:
        assert rid in rows, f"delete of a row that is gone: {rid}"
        del rows[rid]
    for rid, entry in write.updates.items():
        assert rid in rows, f"update of a row that is gone: {rid}"
        assert rows[rid] == entry.position
    for entry in write.inserts:
        rid = entry.record.message_id
        assert rid not in rows, f"insert of {rid!r} while its previous row still exists"
        rows[rid] = entry.position
    return sorted(rows.items(), key=lambda kv: kv[1])


# ---------------------------------------------------------------- single rules


def test_insert_appends_in_list_order() -> None:
    family = _family("a", "b", gaps=("c",))
    write = _apply(family, [ins("x"), ins("y")])
    assert [(e.record.message_id, e.position) for e in write.inserts] == [("x", 4), ("y", 5)]
    assert write.next_position == 6
    assert write.inserts[0].record.created_at == T1
    assert apply_write(family, write) == [("a", 1), ("b", 2), ("x", 4), ("y", 5)]


def test_replace_keeps_position_and_created_at() -> None:
    family = _family("a", "b")
    write = _apply(family, [rep("a", status="error")])
    entry = write.updates["a"]
    assert entry.position == 1
    assert entry.record.status == "error"
    assert entry.record.created_at == T0
    assert entry.record.updated_at == T1
    assert write.inserts == []
    assert write.deletes == []
    assert write.next_position == family.next_position


def test_delete_and_truncate() -> None:
    family = _family("a", "b", "c", "d")
    write = _apply(family, [dele("a"), trunc("b")])
    assert write.deletes == ["a"]
    assert write.truncate_after == 2
    assert apply_write(family, write) == [("b", 2)]
    assert _apply(family, [trunc(None)]).truncate_after == 0
    assert apply_write(family, _apply(family, [trunc(None)])) == []


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ([ins("a")], "already exists"),
        ([rep("zz")], "does not exist"),
        ([dele("zz")], "does not exist"),
        ([trunc("zz")], "truncation boundary"),
        ([dele("a"), dele("a")], "does not exist"),
        ([dele("a"), rep("a")], "does not exist"),
        ([ins("x"), ins("x")], "already exists"),
        ([trunc("a"), rep("b")], "does not exist"),
        ([trunc("a"), trunc("b")], "truncation boundary"),
        ([ins("x"), trunc("a"), rep("x")], "does not exist"),
    ],
)
def test_mechanical_errors_name_the_change(changes: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(ThreadStoreInvariantError, match=words) as err:
        _apply(_family("a", "b"), changes)
    assert f"changes.messages[{len(changes) - 1}]" in str(err.value)


def test_insert_then_truncate_removes_the_insert() -> None:
    family = _family("a", "b")
    write = _apply(family, [ins("x"), trunc("a")])
    assert write.inserts == []
    assert write.final["x"] is None
    assert write.truncate_after == 1
    assert apply_write(family, write) == [("a", 1)]
    assert write.next_position >= 4  # the position x took is never handed out again


def test_truncate_then_insert_and_truncate_after_new_insert() -> None:
    family = _family("a", "b", "c")
    write = _apply(family, [trunc(None), ins("x"), ins("y"), trunc("x")])
    assert [(e.record.message_id, e.position) for e in write.inserts] == [("x", 4)]
    assert apply_write(family, write) == [("x", 4)]


def test_reinsert_of_truncated_id_gets_new_position() -> None:
    family = _family("a", "b")
    write = _apply(family, [trunc("a"), ins("b")])
    assert apply_write(family, write) == [("a", 1), ("b", 3)]


def test_delete_then_reinsert_same_id_in_one_commit() -> None:
    # After the delete the id is new again; the insert appends at the end.
    family = _family("a", "b", "c")
    write = _apply(family, [dele("b"), ins("b")])
    assert [(e.record.message_id, e.position) for e in write.inserts] == [("b", 4)]
    # The previous row of "b" was deleted one by one: the write must delete it,
    # or a normalized backend inserts a second "b" row.
    assert "b" in write.deletes
    assert apply_write(family, write) == [("a", 1), ("c", 3), ("b", 4)]


def test_delete_then_reinsert_keeps_aggregate_in_position_order() -> None:
    inserts = [{"type": "insert", "record": b.message(m)} for m in ("m1", "m2", "m3")]
    agg = apply_thread_changes(None, b.create("s", "t", {"messages": inserts}), T0).aggregate
    assert agg is not None
    commit = b.update_at(
        "s",
        "t",
        agg.root.version,
        {"messages": [dele("m2"), ins("m2", text="again")]},
        root=b.root(),
    )
    after = apply_thread_changes(agg, commit, T1).aggregate
    assert after is not None
    order = [(e.record.message_id, e.position) for e in after.messages]
    assert order == [("m1", 1), ("m3", 3), ("m2", 4)]
    ThreadAggregate.from_json(after.to_json())  # positions in order


async def test_delete_then_reinsert_read_order_via_memory_store() -> None:
    async with open_store("memory://") as store:
        inserts = [{"type": "insert", "record": b.message(m)} for m in ("m1", "m2", "m3")]
        root = (await store.commit_thread(b.create("s", "t", {"messages": inserts}))).thread
        commit = b.update_at(
            "s", "t", root.version, {"messages": [dele("m2"), ins("m2")]}, root=b.root()
        )
        assert (await store.commit_thread(commit)).type == "committed"
        page = await store.read_thread(
            b.read("s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 10}})
        )
        assert [m.message_id for m in page.messages.items] == ["m1", "m3", "m2"]


def test_positions_never_reused_after_deleting_the_tail() -> None:
    inserts = [{"type": "insert", "record": b.message(m)} for m in ("m1", "m2", "m3")]
    agg = apply_thread_changes(None, b.create("s", "t", {"messages": inserts}), T0).aggregate
    assert agg is not None
    agg = apply_thread_changes(
        agg, b.update_at("s", "t", agg.root.version, {"messages": [dele("m3")]}, root=b.root()), T1
    ).aggregate
    assert agg is not None
    assert agg.messages.high_water() == 3
    agg = apply_thread_changes(
        agg, b.update_at("s", "t", agg.root.version, {"messages": [trunc("m1")]}, root=b.root()), T1
    ).aggregate
    assert agg is not None
    agg = apply_thread_changes(
        agg, b.update_at("s", "t", agg.root.version, {"messages": [ins("m4")]}, root=b.root()), T1
    ).aggregate
    assert agg is not None
    assert [(e.record.message_id, e.position) for e in agg.messages] == [("m1", 1), ("m4", 4)]


# ---------------------------------------------------------------- property

IDS = ["a", "b", "c", "x"]


@st.composite
def scenarios(draw: Any) -> tuple[Family[Any], list[dict[str, Any]]]:
    present = draw(st.lists(st.sampled_from(IDS[:3]), unique=True, max_size=3))
    gaps = tuple(i for i in IDS[:3] if i not in present and draw(st.booleans()))
    family = _family(*present, gaps=gaps)
    changes = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["insert", "replace", "delete", "truncate"]))
        mid = draw(st.sampled_from(IDS))
        if kind == "insert":
            changes.append(ins(mid))
        elif kind == "replace":
            changes.append(rep(mid, status="error"))
        elif kind == "delete":
            changes.append(dele(mid))
        else:
            changes.append(trunc(draw(st.none() | st.sampled_from(IDS))))
    return family, changes


def reference(family: Family[Any], changes: list[dict[str, Any]]) -> list[str] | str:
    """The family's ids in order after the changes, by plain list semantics (docs/commits.md)."""
    order = [e.record.message_id for e in sorted(family, key=lambda e: e.position)]
    for change in changes:
        kind = change["type"]
        if kind == "insert":
            mid = change["record"]["messageId"]
            if mid in order:
                return "error"
            order.append(mid)
        elif kind == "replace":
            if change["record"]["messageId"] not in order:
                return "error"
        elif kind == "delete":
            if change["id"] not in order:
                return "error"
            order.remove(change["id"])
        else:
            after = change["afterId"]
            if after is None:
                order = []
            elif after not in order:
                return "error"
            else:
                order = order[: order.index(after) + 1]
    return order


def _outcome(family: Family[Any], changes: list[dict[str, Any]], touched_only: bool) -> Any:
    try:
        write = _apply(family, changes, touched_only=touched_only)
    except ThreadStoreInvariantError as err:
        return ("error", str(err))
    return (
        {k: (None if v is None else (v.position, v.record)) for k, v in write.final.items()},
        [(e.position, e.record) for e in write.inserts],
        {k: (v.position, v.record) for k, v in write.updates.items()},
        sorted(write.deletes),
        write.truncate_after,
        write.next_position,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_touched_rows_suffice(scenario: tuple[Family[Any], list[dict[str, Any]]]) -> None:
    family, changes = scenario
    assert _outcome(family, changes, True) == _outcome(family, changes, False)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_write_matches_list_semantics(scenario: tuple[Family[Any], list[dict[str, Any]]]) -> None:
    family, changes = scenario
    expected = reference(family, changes)
    try:
        write = _apply(family, changes, touched_only=True)
    except ThreadStoreInvariantError:
        assert expected == "error"
        return
    assert expected != "error"
    rows = apply_write(family, write)
    assert [rid for rid, _ in rows] == expected
    positions = [p for _, p in rows]
    assert all(p < write.next_position for p in positions)
    assert write.next_position >= family.next_position
    inserted = {e.record.message_id for e in write.inserts}
    old = {rid: e.position for rid, e in family.entries.items()}
    for rid, position in rows:  # old rows keep their position; new ones are above the old counter
        if rid in inserted:
            assert position >= family.next_position
        else:
            assert position == old[rid]


# ---------------------------------------------------------------- stamps and the root


def _run_after(commits: list[tuple[datetime, dict[str, Any]]]) -> Any:
    agg = None
    for now, run in commits:
        change = {"runs": [{"type": "insert" if agg is None else "replace", "record": run}]}
        if agg is None:
            agg = apply_thread_changes(None, b.create("s", "t", change), now).aggregate
        else:
            agg = apply_thread_changes(
                agg, b.update_at("s", "t", agg.root.version, change, root=b.root()), now
            ).aggregate
        assert agg is not None
    return agg.runs.get("r1").record


def test_run_stamps_admitted_at_and_finished_at() -> None:
    t = [T0 + timedelta(seconds=i) for i in range(5)]
    queued = b.run("r1", "cancelled", admitted=False)
    run = _run_after([(t[0], queued)])
    assert run.admission.admitted_at is None
    assert run.finished_at == t[0]  # inserted in a terminal status
    run = _run_after([(t[0], b.run("r1", "running")), (t[1], b.run("r1", "waiting"))])
    assert run.admission.admitted_at == t[0]  # kept while admitted stays true
    assert run.finished_at is None
    assert run.created_at == t[0]
    assert run.updated_at == t[1]
    run = _run_after(
        [
            (t[0], b.run("r1", "running")),
            (t[1], b.run("r1", "completed")),
            (t[2], b.run("r1", "failed")),
        ]
    )
    assert run.finished_at == t[1]  # kept while it stays terminal
    run = _run_after(
        [
            (t[0], b.run("r1", "running")),
            (t[1], b.run("r1", "completed")),
            (t[2], b.run("r1", "running", operation="regenerate")),
        ]
    )
    assert run.finished_at is None  # removed when it leaves the terminal statuses
    assert "finishedAt" not in run.to_json()
    assert run.admission.admitted_at == t[0]


def test_queued_item_and_message_replace_keep_created_at() -> None:
    agg = apply_thread_changes(
        None,
        b.create(
            "s",
            "t",
            {
                "messages": [ins("m1")],
                "runs": [{"type": "insert", "record": b.run("r1", "queued", queue_item_id="q1")}],
                "queuedItems": [{"type": "insert", "record": b.queued_item("q1", "r1", 1)}],
            },
        ),
        T0,
    ).aggregate
    assert agg is not None
    changes = {
        "messages": [rep("m1", text="edited")],
        "queuedItems": [{"type": "replace", "record": b.queued_item("q1", "r1", 2)}],
    }
    after = apply_thread_changes(
        agg, b.update_at("s", "t", agg.root.version, changes, root=b.root()), T1
    ).aggregate
    assert after is not None
    message = after.messages.get("m1").record
    assert (message.created_at, message.updated_at) == (T0, T1)
    assert message.parts[0].text == "edited"
    item = after.queued_items.get("q1").record
    assert (item.created_at, item.input) == (T0, 2)


def test_root_update_replaces_mutable_fields_only() -> None:
    create = b.create(
        "s", "t", agent="a1", parentThreadId="p", category="c", title="x", metadata={"k": 1}
    )
    agg = apply_thread_changes(None, create, T0, instance_id=lambda: "inst").aggregate
    assert agg is not None
    root = agg.root
    assert root.version.thread_instance_id == "inst"
    assert root.version.revision == 1
    assert (root.created_at, root.updated_at) == (T0, T0)
    update = b.update_at(
        "s", "t", root.version, root=b.root(visibility="hidden", metadata={"k": 2})
    )
    result = apply_thread_changes(agg, update, T1)
    after = result.aggregate.root
    assert result.result.thread == after
    assert result.result.committed_at == T1
    assert after.version.thread_instance_id == "inst"
    assert after.version.revision == 2
    assert (after.agent, after.parent_thread_id, after.direct_execution_allowed) == (
        "a1",
        "p",
        True,
    )
    assert (after.category, after.title) == (None, None)  # omitted: removed
    assert after.list_visibility == "hidden"
    assert after.metadata == {"k": 2}
    assert (after.created_at, after.updated_at) == (T0, T1)


@pytest.mark.parametrize("field", ["agent", "directExecutionAllowed", "parentThreadId"])
def test_creation_only_fields_rejected_in_update(field: str) -> None:
    agg = apply_thread_changes(None, b.create("s", "t"), T0).aggregate
    assert agg is not None
    value: Any = True if field == "directExecutionAllowed" else "x"
    update = b.update_at("s", "t", agg.root.version, root=b.root(**{field: value}))
    with pytest.raises(ThreadStoreInvariantError, match=field):
        apply_thread_changes(agg, update, T1)


def test_conditions() -> None:
    agg = apply_thread_changes(None, b.create("s", "t"), T0).aggregate
    assert agg is not None
    version = agg.root.version
    again = apply_thread_changes(agg, b.create("s", "t"), T1)
    assert again.result.type == "conflict"
    assert again.result.current_version == version
    assert again.aggregate is agg
    for stale in (
        {"threadInstanceId": version.thread_instance_id, "revision": 2},
        {"threadInstanceId": "other", "revision": 1},
    ):
        for commit in (b.update_at("s", "t", stale, root=b.root()), b.delete("s", "t", stale)):
            outcome = apply_thread_changes(agg, commit, T1)
            assert outcome.result.type == "conflict"
            assert outcome.result.current_version == version
    for commit in (b.update_at("s", "t", version, root=b.root()), b.delete("s", "t", version)):
        outcome = apply_thread_changes(None, commit, T1)
        assert outcome.result.type == "conflict"
        assert outcome.result.current_version is None
    deleted = apply_thread_changes(agg, b.delete("s", "t", version), T1)
    assert deleted.result.type == "committed"
    assert deleted.result.thread is None
    assert deleted.aggregate is None
