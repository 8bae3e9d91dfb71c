"""The memory store's indexed threads: same answers as the reference, cost of the change only.

The memory backend commits through :class:`IndexedTransaction` over an
:class:`IndexedThread` it updates in place, and lists through a per-scope
ordered index. These tests hold it to the reference model
(:func:`apply_thread_changes` over a :class:`ThreadAggregate`, and
:meth:`ListPlan.select`, which sorts): the same verdicts, the same post-commit
state, the same relationship facts from the staged view, the same list pages;
a refused commit leaves the stored thread exactly as it was; results share
nothing mutable with stored state; and no commit, read or list walks a whole
family or sorts a scope.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pai_storage_memory import MemoryThreadStore
from pydantic import BaseModel

from pai_storage import CommitThreadInput, ListThreadsInput, ManualClock
from pai_storage import builders as b
from pai_storage.aggregate import IndexedFamily, IndexedThread, ThreadAggregate
from pai_storage.apply import IndexedTransaction
from pai_storage.backend import (
    FAMILIES,
    ListPlan,
    RelationshipContext,
    apply_family_changes,
    apply_thread_changes,
    change_ids,
    relations_from_aggregate,
    relationship_check,
    run_commit,
    run_sync,
)
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.frozen import FrozenDict, FrozenList
from pai_storage.models import ThreadChanges

from .test_relationships import T0, commits, ins, msg, valid_aggregates

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _state(thread: IndexedThread) -> dict[str, Any]:
    return thread.to_aggregate().to_json()


def assert_indexes(thread: IndexedThread) -> None:
    """Every index of every family agrees with the entries it indexes."""
    families: tuple[IndexedFamily[Any], ...] = (thread.messages, thread.runs, thread.queued_items)
    for family in families:
        entries = list(family)
        assert [e.position for e in entries] == sorted(e.position for e in entries)
        assert {family.record_id(e): e for e in entries} == family._by_id
        assert all(e.position < family.next_position for e in entries)
        by_run: dict[str, dict[int, None]] = {}
        open_runs: dict[str, int] = {}
        for e in entries:
            record: Any = e.record
            if family is thread.runs:
                if record.status in ("running", "waiting"):
                    open_runs[record.run_id] = e.position
            elif record.run_id is not None:
                by_run.setdefault(record.run_id, {})[e.position] = None
        assert {k: set(v) for k, v in family._by_run.items()} == {
            k: set(v) for k, v in by_run.items()
        }
        assert family._open == open_runs


def _verdict_of(run: Callable[[], tuple[str, Any]]) -> tuple[str, Any]:
    try:
        outcome = run()
    except ThreadStoreInvariantError as err:
        return ("violation", None) if "relationship rule" in str(err) else (f"error: {err}", None)
    return outcome


# ---------------------------------------------------------------- commits


async def _compare_commit(data: Any, offset_ms: int) -> None:
    agg = data.draw(valid_aggregates())
    commit = CommitThreadInput.model_validate(data.draw(commits(agg)))
    now = T0 + timedelta(milliseconds=offset_ms)

    def reference() -> tuple[str, Any]:
        outcome = apply_thread_changes(agg, commit, now)
        if outcome.result.type != "committed":
            return "conflict", None
        assert outcome.aggregate is not None
        return "ok", (outcome.result, outcome.aggregate.to_json())

    thread = IndexedThread.from_aggregate(agg)
    before = _state(thread)
    tx = IndexedTransaction(thread, now)

    def indexed() -> tuple[str, Any]:
        result = run_sync(run_commit(tx, commit))
        if result.type != "committed":
            return "conflict", None
        after = tx.apply()
        assert after is thread  # an update changes the stored thread in place
        assert_indexes(after)
        return "ok", (result, _state(after))

    expected, got = _verdict_of(reference), _verdict_of(indexed)
    event(f"verdict: {expected[0].split(':')[0]}")
    assert got == expected
    if got[0] != "ok":
        assert _state(thread) == before  # refused: the stored thread was not touched
        assert_indexes(thread)


@SETTINGS
@given(data=st.data(), offset_ms=st.integers(0, 4000))
async def test_indexed_commit_agrees_with_the_reference(data: Any, offset_ms: int) -> None:
    await _compare_commit(data, offset_ms)


@SETTINGS
@given(data=st.data())
async def test_staged_view_answers_like_the_post_commit_state(data: Any) -> None:
    # The relationship check reads stored rows with the staged writes on top;
    # every fact it can ask for must equal the fact of the applied state.
    agg = data.draw(valid_aggregates())
    commit = CommitThreadInput.model_validate(data.draw(commits(agg)))
    changes = commit.mutation.changes or ThreadChanges()  # type: ignore[union-attr]
    thread = IndexedThread.from_aggregate(agg)
    writes = {}
    for spec in FAMILIES:
        named = spec.changes(changes)
        family: Any = getattr(thread, spec.attr)
        touched = {i: e for i in change_ids(named) if (e := family.get(i)) is not None}
        try:
            writes[spec.name] = apply_family_changes(
                spec.name, named, touched, family.next_position, T0
            )
        except ThreadStoreInvariantError:
            return  # a mechanical error: no post-commit state to compare
    context = RelationshipContext(
        relationship_check(changes, previous_message_runs={}, previous_item_runs={}, lease=None),
        changes,
        writes,
        None,
    )
    reader = IndexedTransaction(thread, T0).relationship_reader(context)

    post = IndexedThread.from_aggregate(agg)
    for spec in FAMILIES:
        getattr(post, spec.attr).apply(writes[spec.name])
    facts = relations_from_aggregate(post.to_aggregate())
    run_ids = sorted({*facts.runs, *(e.record.run_id for e in thread.runs), "never-seen"})
    got = await reader.run_facts(run_ids)
    for run_id in run_ids:
        expected = facts.runs.get(run_id)
        if expected is None:
            assert got[run_id].run is None
            assert not got[run_id].messages
            assert not got[run_id].queued_items
        else:
            assert got[run_id] == expected
    assert list(await reader.open_runs()) == list(facts.open_runs)
    assert await reader.tail() == facts.tail


def _long_thread_store() -> tuple[MemoryThreadStore, ManualClock]:
    clock = ManualClock(T0)
    return MemoryThreadStore(clock=clock), clock


async def _turns(store: MemoryThreadStore, count: int) -> Any:
    messages, runs = [], []
    for n in range(count):
        messages += [ins(msg(f"u{n}", f"r{n}", "input")), ins(msg(f"a{n}", f"r{n}", "output"))]
        runs.append(ins(b.run(f"r{n}", "completed", inputs=[f"u{n}"])))
    result = await store.commit_thread(b.create("s", "t", {"messages": messages, "runs": runs}))
    assert result.type == "committed"
    return result.thread.version  # type: ignore[union-attr]


def _stored(store: MemoryThreadStore, thread_id: str = "t") -> IndexedThread:
    return store._scopes["s"].threads[thread_id]


async def test_refused_commit_leaves_the_stored_thread_and_list_untouched() -> None:
    store, clock = _long_thread_store()
    version = await _turns(store, 50)
    await store.commit_thread(b.create("s", "other"))
    before = copy.deepcopy(_state(_stored(store)))
    listed = await store.list_threads({"scopeKey": "s", "limit": 10})
    clock.advance(ms=5)
    # Truncates, deletes, replaces and inserts, then breaks rule 2 (r3's
    # messages are no longer contiguous): nothing of it may remain.
    breaking = {
        "messages": [
            {"type": "truncate", "afterId": "a40"},
            {"type": "delete", "id": "a10"},
            rep_msg("a5", "r5", "output"),
            ins(msg("late", "r3", "output")),
        ],
        "runs": [{"type": "delete", "id": "r45"}],
    }
    with pytest.raises(ThreadStoreInvariantError, match="relationship rule 2 broken"):
        await store.commit_thread(b.update_at("s", "t", version, breaking, root=b.root()))
    assert _state(_stored(store)) == before
    assert_indexes(_stored(store))
    assert await store.list_threads({"scopeKey": "s", "limit": 10}) == listed
    # ... and a mechanical error (replace of a missing row) after a truncation:
    mechanical = {"messages": [{"type": "truncate", "afterId": None}, rep_msg("u1", "r1")]}
    with pytest.raises(ThreadStoreInvariantError, match="replace of message 'u1'"):
        await store.commit_thread(b.update_at("s", "t", version, mechanical, root=b.root()))
    assert _state(_stored(store)) == before
    # The same version still commits.
    ok = await store.commit_thread(
        b.update_at("s", "t", version, {"messages": [ins(msg("m"))]}, root=b.root())
    )
    assert ok.type == "committed"
    assert_indexes(_stored(store))


def rep_msg(mid: str, run: str | None = None, relation: str = "output") -> dict[str, Any]:
    return {"type": "replace", "record": msg(mid, run, relation)}


async def test_truncation_reports_the_runs_of_the_removed_rows() -> None:
    # A truncation that cuts an admitted run's messages is judged from the
    # removed rows alone: the run r2 lost its input message, so rule 3 fails.
    store, _ = _long_thread_store()
    version = await _turns(store, 3)
    cut = {"messages": [{"type": "truncate", "afterId": "a1"}, ins(msg("x", "r2", "output"))]}
    with pytest.raises(ThreadStoreInvariantError, match="rule 3 broken: run 'r2'"):
        await store.commit_thread(b.update_at("s", "t", version, cut, root=b.root()))
    fine = {
        "messages": [{"type": "truncate", "afterId": "a1"}],
        "runs": [{"type": "truncate", "afterId": "r1"}],
    }
    result = await store.commit_thread(b.update_at("s", "t", version, fine, root=b.root()))
    assert result.type == "committed"
    thread = _stored(store)
    assert [thread.messages.record_id(e) for e in thread.messages] == ["u0", "a0", "u1", "a1"]
    assert [e.record.run_id for e in thread.runs] == ["r0", "r1"]
    assert thread.messages.next_position == 7  # positions are never reused
    assert_indexes(thread)


# ---------------------------------------------------------------- lists


@st.composite
def scope_histories(draw: Any) -> list[tuple[str, str, int, str]]:
    """Steps (action, thread id, ms to advance, category): creates, updates and deletes."""
    ids = [f"t{i}" for i in range(draw(st.integers(1, 12)))]
    steps = st.tuples(
        st.sampled_from(["create", "update", "update", "delete"]),
        st.sampled_from(ids),
        st.sampled_from([0, 0, 1, 7]),  # ties in updated_at are common
        st.sampled_from(["0", "1", "2"]),
    )
    history: list[tuple[str, str, int, str]] = draw(st.lists(steps, min_size=1, max_size=40))
    return history


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=scope_histories(), limit=st.integers(1, 4), data=st.data())
async def test_list_pages_match_the_sorting_reference(
    history: list[tuple[str, str, int, str]], limit: int, data: Any
) -> None:
    clock = ManualClock(T0)
    store = MemoryThreadStore(clock=clock)
    versions: dict[str, Any] = {}
    for action, tid, ms, category in history:
        clock.advance(ms=ms)
        hidden = "hidden" if category == "2" and tid in ("t1", "t4") else "visible"
        if action == "create" and tid not in versions:
            agent = "a" if tid < "t5" else "b"
            request = b.create("s", tid, agent=agent, visibility=hidden, category=category)
        elif action == "update" and tid in versions:
            request = b.update_at(
                "s", tid, versions[tid], root=b.root(visibility=hidden, category=category)
            )
        elif action == "delete" and tid in versions:
            request = b.delete("s", tid, versions[tid])
        else:
            continue
        result = await store.commit_thread(request)
        assert result.type == "committed"
        if result.thread is None:
            del versions[tid]
        else:
            versions[tid] = result.thread.version
    scope = store._scopes.get("s")
    roots = [t.root for t in scope.threads.values()] if scope is not None else []
    if scope is not None:
        assert list(scope.order) == sorted(ListPlan.sort_key(r) for r in roots)
    query: dict[str, Any] = {"scopeKey": "s", "limit": limit}
    query |= data.draw(
        st.fixed_dictionaries(
            {},
            optional={
                "agent": st.sampled_from(["a", "b"]),
                "category": st.sampled_from(["0", "1", "2"]),
                "includeHidden": st.booleans(),
            },
        )
    )
    seen: list[str] = []
    while True:
        page = await store.list_threads(query)
        plan = store.selections.plan_list(ListThreadsInput.model_validate(query))
        expected = plan.select(roots)
        assert page == expected
        seen += [r.thread_id for r in page.items]
        if page.next_page_token is None:
            break
        query["pageToken"] = page.next_page_token
    query.pop("pageToken", None)
    plan = store.selections.plan_list(ListThreadsInput.model_validate({**query, "limit": 100}))
    everything = [r.thread_id for r in sorted(roots, key=ListPlan.sort_key) if plan.matches(r)]
    assert seen == everything


# ---------------------------------------------------------------- copies


def _containers(value: Any, found: dict[int, Any] | None = None) -> dict[int, Any]:
    """Every dict and list reachable from ``value`` (through models), by identity."""
    found = {} if found is None else found
    if isinstance(value, dict | list):
        found[id(value)] = value
        for sub in value.values() if isinstance(value, dict) else value:
            _containers(sub, found)
    elif isinstance(value, BaseModel):
        for sub in value.__dict__.values():
            _containers(sub, found)
    return found


def _stored_containers(thread: IndexedThread) -> dict[int, Any]:
    found: dict[int, Any] = {}
    _containers(thread.root, found)
    for family in (thread.messages, thread.runs, thread.queued_items):
        for entry in family:
            _containers(entry.record, found)
    return found


async def test_stored_state_shares_no_container_with_inputs_and_is_read_only() -> None:
    store, _ = _long_thread_store()
    tool = {
        "type": "tool-call",
        "toolCallId": "c1",
        "toolName": "search",
        "input": {"q": ["x", {"deep": [1]}]},
        "state": "input-available",
    }
    message = b.message("m1", metadata={"k": [1, {"z": []}]})
    message["parts"].append(tool)
    commit = CommitThreadInput.model_validate(
        b.create(
            "s",
            "t",
            {
                "messages": [ins(message), ins(msg("u0", "r0", "input"))],
                "runs": [ins(b.run("r0", "running", inputs=["u0"]))],
                "queuedItems": [],
            },
            metadata={"tags": ["a"]},
        )
    )
    result = await store.commit_thread(commit)
    stored = _stored_containers(_stored(store))
    assert len(stored) >= 8  # the walk does see the stored JSON values
    assert not stored.keys() & _containers(message).keys()  # the caller's own objects
    # What is stored nobody can change, so results may share it.
    assert all(type(value) in (FrozenDict, FrozenList) for value in stored.values())
    assert all(type(value) in (FrozenDict, FrozenList) for value in _containers(result).values())
    read = await store.read_thread(
        b.read(
            "s",
            "t",
            messages={"type": "page", "view": "raw", "page": {"limit": 10}},
            runs={"type": "page", "page": {"limit": 10}},
        )
    )
    listed = await store.list_threads({"scopeKey": "s", "limit": 10})
    for value in (*_containers(read).values(), *_containers(listed).values()):
        assert type(value) in (FrozenDict, FrozenList)
    assert read.messages is not None
    assert read.messages.items[0] == _stored(store).messages.get("m1").record  # type: ignore[union-attr]
    assert listed.items == [_stored(store).root]


# ---------------------------------------------------------------- cost


@pytest.fixture
def no_whole_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every whole-family walk and every scope sort fail loudly."""

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("walked a whole family or sorted a whole scope")

    monkeypatch.setattr(IndexedFamily, "__iter__", refuse)
    monkeypatch.setattr(IndexedThread, "to_aggregate", refuse)
    monkeypatch.setattr(ThreadAggregate, "deep_copy", refuse)
    monkeypatch.setattr(ListPlan, "select", refuse)


@pytest.mark.usefixtures("no_whole_scans")
async def test_turn_read_and_list_never_walk_the_whole_thread_or_scope() -> None:
    store, clock = _long_thread_store()
    version = await _turns(store, 200)
    for n in range(200, 203):
        clock.advance(ms=1)
        opened = {
            "messages": [ins(msg(f"u{n}", f"r{n}", "input"))],
            "runs": [ins(b.run(f"r{n}", "running", inputs=[f"u{n}"]))],
            "lease": b.acquire(f"r{n}", "w", 60_000),
        }
        result = await store.commit_thread(b.update_at("s", "t", version, opened, root=b.root()))
        assert result.type == "committed"
        closed = {
            "messages": [ins(msg(f"a{n}", f"r{n}", "output"))],
            "runs": [rep_run(f"r{n}", f"u{n}")],
            "lease": b.release(f"r{n}", "w"),
        }
        result = await store.commit_thread(
            b.update_at("s", "t", result.thread.version, closed, root=b.root())
        )  # type: ignore[union-attr]
        assert result.type == "committed"
        version = result.thread.version  # type: ignore[union-attr]
    newest = {"type": "page", "view": "transcript", "order": "newest", "page": {"limit": 5}}
    read = await store.read_thread(b.read("s", "t", messages=newest))
    assert read.messages is not None
    assert [m.message_id for m in read.messages.items] == ["a202", "u202", "a201", "u201", "a200"]
    token = read.messages.next_page_token
    newest["page"] = {"limit": 5, "pageToken": token}
    more = await store.read_thread(b.read("s", "t", messages=newest))
    assert [m.message_id for m in more.messages.items] == ["u200", "a199", "u199", "a198", "u198"]  # type: ignore[union-attr]
    clock.advance(ms=1)
    for i in range(30):
        await store.commit_thread(b.create("s", f"x{i:02d}"))
    listed = await store.list_threads({"scopeKey": "s", "limit": 3})
    assert [r.thread_id for r in listed.items] == ["x00", "x01", "x02"]  # same time: by id
    deep = await store.list_threads(
        {"scopeKey": "s", "limit": 30, "pageToken": listed.next_page_token}
    )
    assert [r.thread_id for r in deep.items][-2:] == ["x29", "t"]  # 't' is older
    deleted = await store.commit_thread(b.delete("s", "t", version))
    assert deleted.type == "committed"


def rep_run(run_id: str, user: str) -> dict[str, Any]:
    return {"type": "replace", "record": b.run(run_id, "completed", inputs=[user])}


def test_reference_apply_is_still_a_value_function() -> None:
    # apply_thread_changes keeps its contract: the input aggregate is not modified.
    created = apply_thread_changes(None, b.create("s", "t", {"messages": [ins(msg("m1"))]}), T0)
    assert created.aggregate is not None
    before = created.aggregate.to_json()
    update = b.update_at(
        "s", "t", created.aggregate.root.version, {"messages": [ins(msg("m2"))]}, root=b.root()
    )
    after = apply_thread_changes(created.aggregate, update, T0 + timedelta(milliseconds=1))
    assert created.aggregate.to_json() == before
    assert after.aggregate is not None
    assert list(after.aggregate.messages.entries) == ["m1", "m2"]
