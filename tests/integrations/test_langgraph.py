"""LangGraph end to end on PaiCheckpointSaver (interrupt, resume, a second
process, history, sync graphs) and the PaiStore contract."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp

import pai_storage
from pai_storage import InvalidInputError
from pai_storage.integrations.langgraph import PaiCheckpointSaver, PaiStore

from .conftest import Target
from .langgraph_app import SCOPE, ask, build

ROOT = Path(__file__).resolve().parents[2]


def _texts(state: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in state["messages"]]


async def test_interrupt_resume_and_history(stores: pai_storage.Stores) -> None:
    saver = PaiCheckpointSaver(stores, scope_key=SCOPE)
    app = build(saver)
    config = {"configurable": {"thread_id": "t1"}}

    first = await app.ainvoke(ask("capital of France?"), config)
    assert _texts(first) == ["capital of France?", "plan: answer 'capital of France?'"]
    waiting = await app.aget_state(config)
    assert waiting.next == ("act",)

    done = await app.ainvoke(None, config)  # the human approved: resume
    assert _texts(done)[-1] == "done after 1 plans"
    assert (await app.aget_state(config)).next == ()

    await app.ainvoke(ask("and of Italy?"), config)
    second = await app.ainvoke(None, config)
    assert _texts(second) == [
        "capital of France?",
        "plan: answer 'capital of France?'",
        "done after 1 plans",
        "and of Italy?",
        "plan: answer 'and of Italy?'",
        "done after 2 plans",
    ]

    # History through LangGraph: newest first, every step, each one's parent the next.
    history = [s async for s in app.aget_state_history(config)]
    assert len(history) >= 8
    assert history[0].values == second
    steps = [s.metadata["step"] for s in history]
    assert steps == sorted(steps, reverse=True)
    for newer, older in itertools.pairwise(history):
        assert (
            newer.parent_config["configurable"]["checkpoint_id"]
            == (older.config["configurable"]["checkpoint_id"])
        )
    page = [s async for s in app.aget_state_history(config, before=history[2].config, limit=2)]
    assert [s.config for s in page] == [h.config for h in history[3:5]]
    # A past checkpoint still reads back whole (its unchanged channels included).
    past = await app.aget_state(history[3].config)
    assert past.values == history[3].values

    # Through pai-storage: one item per checkpoint under the thread's namespace.
    items = await stores.kv.search((SCOPE, "langgraph", "t1", "ns:", "checkpoints"), limit=100)
    assert len(items.items) == len(history)
    await saver.adelete_thread("t1")
    assert (await app.aget_state(config)).values == {}
    assert (await stores.kv.search((SCOPE, "langgraph", "t1"), limit=10)).items == []


async def test_resume_from_a_second_process(durable_target: Target) -> None:
    async with PaiCheckpointSaver.from_url(
        durable_target.url, scope_key=SCOPE, **durable_target.options
    ) as saver:
        await build(saver).ainvoke(ask("ship it?"), {"configurable": {"thread_id": "job-7"}})

    payload = {"url": durable_target.url, "options": durable_target.options, "thread_id": "job-7"}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integrations.langgraph_app",
        json.dumps(payload),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout=300)
    assert child.returncode == 0, err.decode()[-3000:]
    assert json.loads(out) == ["ship it?", "plan: answer 'ship it?'", "done after 1 plans"]

    async with PaiCheckpointSaver.from_url(
        durable_target.url, scope_key=SCOPE, **durable_target.options
    ) as saver:
        state = await build(saver).aget_state({"configurable": {"thread_id": "job-7"}})
        assert state.next == ()
        assert _texts(state.values)[-1] == "done after 1 plans"


async def test_sync_graph_from_a_worker_thread(stores: pai_storage.Stores) -> None:
    saver = PaiCheckpointSaver(stores, scope_key=SCOPE)
    app = build(saver)
    config = {"configurable": {"thread_id": "sync"}}
    await asyncio.to_thread(app.invoke, ask("hi"), config)
    result = await asyncio.to_thread(app.invoke, None, config)
    assert _texts(result)[-1] == "done after 1 plans"
    listed = await asyncio.to_thread(lambda: list(saver.list(config, limit=2)))
    assert len(listed) == 2
    # On the loop's own thread a sync call would deadlock: refused instead.
    with pytest.raises(InvalidInputError, match="another thread"):
        saver.get_tuple(config)


async def test_tenants_are_isolated_and_erased(stores: pai_storage.Stores) -> None:
    one = build(PaiCheckpointSaver(stores, scope_key="tenant-a"))
    two = build(PaiCheckpointSaver(stores, scope_key="tenant-b"))
    config = {"configurable": {"thread_id": "same-id"}}
    await one.ainvoke(ask("from a"), config)
    assert (await two.aget_state(config)).values == {}
    await two.ainvoke(ask("from b"), config)
    erased = await stores.erase_scope("tenant-a")
    assert erased.kv_items > 0
    assert (await one.aget_state(config)).values == {}
    assert _texts((await two.aget_state(config)).values)[0] == "from b"


async def test_bad_ids_are_refused(stores: pai_storage.Stores) -> None:
    saver = PaiCheckpointSaver(stores)
    checkpoint = empty_checkpoint()
    with pytest.raises(InvalidInputError, match="thread_id"):
        await saver.aput({"configurable": {"checkpoint_ns": ""}}, checkpoint, {}, {})
    bad = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "x"}}
    with pytest.raises(InvalidInputError, match="checkpoint_id"):
        await saver.aget_tuple(bad)
    with pytest.raises(InvalidInputError, match="U\\+001F"):
        await saver.aput({"configurable": {"thread_id": "a\x1fb"}}, checkpoint, {}, {})


async def test_unchanged_channels_found_by_a_saver_that_did_not_write_them(
    stores: pai_storage.Stores,
) -> None:
    writer, other = PaiCheckpointSaver(stores), PaiCheckpointSaver(stores)
    first = empty_checkpoint()
    first["channel_values"] = {"a": "a1", "b": "b1"}
    first["channel_versions"] = {"a": "1", "b": "1"}
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = await writer.aput(config, first, {"step": 0}, {"a": "1", "b": "1"})
    second = empty_checkpoint()
    second["channel_values"] = {"a": "a2", "b": "b1"}
    second["channel_versions"] = {"a": "2", "b": "1"}
    # `other` has never seen the parent: it reads where `b` lives from the store.
    latest = await other.aput(stored, second, {"step": 1}, {"a": "2"})
    for saver in (writer, other, PaiCheckpointSaver(stores)):
        found = await saver.aget_tuple(latest)
        assert found is not None
        assert found.checkpoint["channel_values"] == {"a": "a2", "b": "b1"}


class _Calls:
    """A key-value store that records the name of every method called on it."""

    def __init__(self, kv: pai_storage.KeyValueStore) -> None:
        self.kv, self.names = kv, list[str]()

    def __getattr__(self, name: str) -> Any:
        self.names.append(name)
        return getattr(self.kv, name)


class _CancelledAfter:
    """A key-value store whose caller is cancelled after ``puts`` writes."""

    def __init__(self, kv: pai_storage.KeyValueStore, puts: int) -> None:
        self.kv, self.puts = kv, puts

    async def put(self, *args: Any, **kwargs: Any) -> Any:
        if self.puts == 0:
            raise asyncio.CancelledError
        self.puts -= 1
        return await self.kv.put(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


async def test_an_interrupted_copy_leaves_no_checkpoint_without_its_values(
    stores: pai_storage.Stores,
) -> None:
    # `a` is written once, at the first checkpoint; the later ones point at it.
    writer = PaiCheckpointSaver(stores)
    config: dict[str, Any] = {"configurable": {"thread_id": "src", "checkpoint_ns": ""}}
    for step in range(4):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = f"00000000-0000-6000-8000-{step:012x}"
        checkpoint["channel_values"] = {"a": "kept", "b": step} if step == 0 else {"b": step}
        checkpoint["channel_versions"] = {"a": "1", "b": str(step + 1)}
        new = {"a": "1", "b": "1"} if step == 0 else {"b": str(step + 1)}
        config = await writer.aput(config, checkpoint, {"step": step}, new)
        await writer.aput_writes(config, [("b", step)], task_id=f"task-{step}")
    for puts in range(8):
        copier = PaiCheckpointSaver(stores)
        copier.kv = _CancelledAfter(stores.kv, puts)  # type: ignore[assignment]
        with pytest.raises(asyncio.CancelledError):
            await copier.acopy_thread("src", f"dst-{puts}")
        target = await writer.aget_tuple({"configurable": {"thread_id": f"dst-{puts}"}})
        if target is not None:  # an earlier checkpoint, whole, with its writes
            assert target.checkpoint["channel_values"]["a"] == "kept"
            step = target.metadata["step"]
            assert target.pending_writes == [(f"task-{step}", "b", step)]
    await writer.acopy_thread("src", "dst")
    whole = [t async for t in writer.alist({"configurable": {"thread_id": "dst"}})]
    assert [t.metadata["step"] for t in whole] == [3, 2, 1, 0]


async def test_latest_read_skips_channels_stored_empty(stores: pai_storage.Stores) -> None:
    # `s` is consumed (a new version, no value) at the first checkpoint and
    # unchanged at the second: reading the latest has nothing to fetch for it.
    writer = PaiCheckpointSaver(stores)
    first = empty_checkpoint()
    first["channel_values"] = {"a": "a1"}
    first["channel_versions"] = {"a": "1", "s": "1"}
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = await writer.aput(config, first, {"step": 0}, {"a": "1", "s": "1"})
    second = empty_checkpoint()
    second["channel_values"] = {"a": "a2"}
    second["channel_versions"] = {"a": "2", "s": "1"}
    await writer.aput(stored, second, {"step": 1}, {"a": "2"})
    reader = PaiCheckpointSaver(stores)
    calls = _Calls(reader.kv)
    reader.kv = calls  # type: ignore[assignment]
    found = await reader.aget_tuple({"configurable": {"thread_id": "t"}})
    assert found is not None
    assert found.checkpoint["channel_values"] == {"a": "a2"}
    # The latest checkpoint, then its pending writes: no read of the first.
    assert [n for n in calls.names if n != "_ensure_ready"] == ["search", "search"]


async def _long_thread(saver: PaiCheckpointSaver, steps: int, matching: set[int]) -> list[str]:
    """A thread of ``steps`` checkpoints, each with a pending write; the steps
    in ``matching`` have ``source: "input"``, the others ``"loop"``. Returns the
    checkpoint ids, oldest first."""
    config: dict[str, Any] = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
    ids = []
    for step in range(steps):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = f"00000000-0000-6000-8000-{step:012x}"  # ascending: newest last
        source = "input" if step in matching else "loop"
        config = await saver.aput(config, checkpoint, {"source": source, "step": step}, {})
        await saver.aput_writes(config, [("out", step)], task_id=f"task-{step}")
        ids.append(checkpoint["id"])
    return ids


async def test_filtered_list_builds_only_the_checkpoints_it_yields(
    stores: pai_storage.Stores,
) -> None:
    # More checkpoints than one page of values; the matches are far apart, the
    # newest of them past the first 50.
    matching = {3, 10, 60}
    ids = await _long_thread(PaiCheckpointSaver(stores), 120, matching)
    reader = PaiCheckpointSaver(stores)
    calls = _Calls(reader.kv)
    reader.kv = calls  # type: ignore[assignment]
    thread = {"configurable": {"thread_id": "long"}}

    def reads() -> list[str]:
        names = [n for n in calls.names if n != "_ensure_ready"]
        calls.names.clear()
        return names

    # limit=1: one pending-write listing (`search`), not one per checkpoint read.
    [first] = [t async for t in reader.alist(thread, filter={"source": "input"}, limit=1)]
    assert first.metadata == {"source": "input", "step": 60}
    assert first.pending_writes == [("task-60", "out", 60)]
    assert reads().count("search") == 1

    # Unlimited: every match, newest first, one pending-write listing each.
    found = [t async for t in reader.alist(thread, filter={"source": "input"})]
    assert [t.metadata["step"] for t in found] == [60, 10, 3]
    assert [t.pending_writes for t in found] == [[(f"task-{s}", "out", s)] for s in (60, 10, 3)]
    assert reads().count("search") == 3

    # The `before` cursor and the filter together.
    older = [t async for t in reader.alist(thread, filter={"source": "input"}, before=first.config)]
    assert [t.metadata["step"] for t in older] == [10, 3]
    assert reads().count("search") == 2

    # No filter, limit=1: the thread's namespaces, the keys, one value, its
    # pending writes.
    [latest] = [t async for t in reader.alist(thread, limit=1)]
    assert latest.config["configurable"]["checkpoint_id"] == ids[-1]
    assert reads() == ["list_namespaces", "list_keys", "get_many", "search"]
    # A filter nothing matches reads no pending writes at all.
    assert [t async for t in reader.alist(thread, filter={"source": "fork"})] == []
    assert "search" not in reads()
    # limit=0 lists nothing, as LangGraph's in-memory saver.
    assert [t async for t in reader.alist(thread, limit=0)] == []


async def test_list_with_a_checkpoint_id_lists_that_checkpoint(
    stores: pai_storage.Stores,
) -> None:
    # As LangGraph's savers: a checkpoint_id in the config selects that one.
    saver = PaiCheckpointSaver(stores)
    ids = await _long_thread(saver, 5, {1})
    one = {"configurable": {"thread_id": "long", "checkpoint_id": ids[2]}}
    assert [t.metadata["step"] async for t in saver.alist(one)] == [2]
    one["configurable"]["checkpoint_ns"] = ""
    assert [t.metadata["step"] async for t in saver.alist(one)] == [2]
    assert [t.pending_writes async for t in saver.alist(one)] == [[("task-2", "out", 2)]]
    assert [t async for t in saver.alist(one, filter={"source": "input"})] == []
    assert [
        t async for t in saver.alist(one, before={"configurable": {"checkpoint_id": ids[2]}})
    ] == []
    older = {"configurable": {"checkpoint_id": ids[3]}}
    assert [t.metadata["step"] async for t in saver.alist(one, before=older)] == [2]
    gone = {
        "configurable": {"thread_id": "long", "checkpoint_id": ids[0].replace("0000-6", "0001-6")}
    }
    assert [t async for t in saver.alist(gone)] == []


# ---------------------------------------------------------------- PaiStore


async def test_store_put_get_delete_and_kv_view(stores: pai_storage.Stores) -> None:
    store = PaiStore(stores, prefix=("tenant-1",))
    await store.aput(("memories", "u1"), "likes", {"food": "tea", "n": 1.0})
    item = await store.aget(("memories", "u1"), "likes")
    assert item is not None
    assert item.value == {"food": "tea", "n": 1.0}
    assert item.namespace == ("memories", "u1")
    assert item.created_at <= item.updated_at
    raw = await stores.kv.get(("tenant-1", "memories", "u1"), "likes")
    assert raw is not None
    assert raw.value == {"food": "tea", "n": 1.0}
    await store.adelete(("memories", "u1"), "likes")
    assert await store.aget(("memories", "u1"), "likes") is None
    assert await store.aget(("memories", "nobody"), "likes") is None


async def test_store_search_filter_offset(stores: pai_storage.Stores) -> None:
    store = PaiStore(stores)
    for i in range(12):
        ns = ("docs", "a" if i % 2 else "b")
        await store.aput(ns, f"k{i:02}", {"i": i, "kind": "even" if i % 2 == 0 else "odd"})
    await store.aput(("other",), "k", {"i": 100})
    found = await store.asearch(("docs",), limit=100)
    assert len(found) == 12
    assert all(r.namespace[0] == "docs" for r in found)
    odd = await store.asearch(("docs",), filter={"kind": "odd"}, limit=100)
    assert sorted(r.value["i"] for r in odd) == [1, 3, 5, 7, 9, 11]
    big = await store.asearch(("docs",), filter={"i": {"$gte": 8}, "kind": {"$ne": "odd"}})
    assert sorted(r.value["i"] for r in big) == [8, 10]
    first, second = (
        await store.asearch(("docs",), limit=5),
        await store.asearch(("docs",), limit=5, offset=5),
    )
    assert not {(r.namespace, r.key) for r in first} & {(r.namespace, r.key) for r in second}
    assert (await store.asearch(("docs", "b"), query="ignored", limit=100))[0].score is None


async def test_store_list_namespaces(stores: pai_storage.Stores) -> None:
    store = PaiStore(stores, prefix=("t",))
    for ns in [("a", "x", "1"), ("a", "y", "2"), ("b", "x", "1"), ("c",)]:
        await store.aput(ns, "k", {"v": 1})
    assert await store.alist_namespaces() == [
        ("a", "x", "1"),
        ("a", "y", "2"),
        ("b", "x", "1"),
        ("c",),
    ]
    assert await store.alist_namespaces(prefix=("a",)) == [("a", "x", "1"), ("a", "y", "2")]
    assert await store.alist_namespaces(suffix=("1",)) == [("a", "x", "1"), ("b", "x", "1")]
    assert await store.alist_namespaces(prefix=("*", "x")) == [("a", "x", "1"), ("b", "x", "1")]
    assert await store.alist_namespaces(max_depth=1) == [("a",), ("b",), ("c",)]
    assert await store.alist_namespaces(limit=2, offset=1) == [("a", "y", "2"), ("b", "x", "1")]
    batch = await store.abatch(
        [
            PutOp(("z",), "k", {"v": 2}),
            GetOp(("z",), "k"),
            SearchOp(("z",)),
            ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("z",)),)),
        ]
    )
    assert batch[0] is None
    assert batch[1] is not None
    assert batch[1].value == {"v": 2}  # a put is seen by a later get of the batch
    assert [r.key for r in batch[2]] == ["k"]
    assert batch[3] == [("z",)]


async def test_store_does_not_show_the_savers_items(stores: pai_storage.Stores) -> None:
    # One tenant for both, as docs/langgraph.md pairs them: the saver's items
    # live under ("tenant-1", "langgraph", ...), a namespace LangGraph reserves.
    saver = PaiCheckpointSaver(stores, scope_key="tenant-1")
    store = PaiStore(stores, prefix=("tenant-1",))
    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": ["hi"]}
    checkpoint["channel_versions"] = {"messages": saver.get_next_version(None, None)}
    saved = await saver.aput(config, checkpoint, {"step": 1}, checkpoint["channel_versions"])
    await saver.aput_writes(saved, [("messages", "x")], "task-1")
    await store.aput(("memories", "u1"), "likes", {"food": "tea"})
    assert [(r.namespace, r.key) for r in await store.asearch((), limit=100)] == [
        (("memories", "u1"), "likes")
    ]
    assert await store.asearch(("langgraph",)) == []
    assert await store.asearch((), filter={"checkpoint": {"$ne": None}}) == []
    assert await store.alist_namespaces() == [("memories", "u1")]
    assert await store.alist_namespaces(max_depth=1) == [("memories",)]
    assert await store.alist_namespaces(suffix=("checkpoints",)) == []
    assert await saver.aget_tuple(config) is not None  # the saver still sees them


async def test_store_ttl(target: Target) -> None:
    clock = pai_storage.ManualClock()
    async with target.connect(clock=clock) as stores:
        store = PaiStore(stores, ttl_config={"default_ttl": 1.0, "refresh_on_read": True})
        await store.aput(("cache",), "default", {"v": 1})  # the default TTL: 1 minute
        await store.aput(("cache",), "long", {"v": 2}, ttl=10)
        await store.aput(("cache",), "forever", {"v": 3}, ttl=None)
        clock.advance(timedelta(seconds=50))
        assert await store.aget(("cache",), "default") is not None  # read: refreshed to +60 s
        clock.advance(timedelta(seconds=50))
        assert await store.aget(("cache",), "default", refresh_ttl=False) is not None
        clock.advance(timedelta(seconds=11))
        assert await store.aget(("cache",), "default") is None
        assert await store.aget(("cache",), "long") is not None
        clock.advance(timedelta(minutes=20))
        assert await store.aget(("cache",), "long") is None
        assert await store.aget(("cache",), "forever") is not None
        with pytest.raises(InvalidInputError, match="ttl"):
            await store.aput(("cache",), "bad", {"v": 1}, ttl=-1)


async def test_store_from_url_and_sync_batch(target: Target) -> None:
    async with PaiStore.from_url(target.url, **target.options) as store:
        await asyncio.to_thread(store.put, ("ns",), "k", {"v": 1})
        item = await asyncio.to_thread(store.get, ("ns",), "k")
        assert item is not None
        assert item.value == {"v": 1}
        with pytest.raises(InvalidInputError, match="another thread"):
            store.get(("ns",), "k")
