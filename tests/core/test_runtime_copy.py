"""copy_runtime(): every key-value item, agent-state session and snapshot, by value."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from pai_storage_memory.snapshots import MemorySnapshotStore
from pai_storage_memory.state import MemoryAgentStateStore

from pai_storage import ConfigurationError, ManualClock, Stores, connect
from pai_storage.transfer import RuntimeItem, copy_runtime

START = datetime(2026, 1, 1, tzinfo=UTC)
EXACT = {"b": 1, "a": 1.0, "big": 2**63 - 1, "text": "\x00\u00e9\U0001f600", "list": [None, True]}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
async def pair(clock: ManualClock) -> AsyncIterator[tuple[Stores, Stores]]:
    async with (
        connect("memory://", clock=clock) as source,
        connect("memory://", clock=clock) as target,
    ):
        yield source, target


async def _fill(stores: Stores, clock: ManualClock) -> None:
    kv, state, snapshots = stores.kv, stores.state, stores.snapshots
    await kv.put(("tenant", "docs"), "readme", EXACT)
    await kv.put(("tenant", "docs"), "readme", EXACT)  # version 2
    await kv.put(("tenant",), "short", "lives 10 minutes", ttl=timedelta(minutes=10))
    await kv.put(("other\x1e", "$where"), "k.1", [1, 1.0])
    await state.save("alice", "s1", "plan", EXACT)
    await state.save("alice", "s1", "plan", {"step": 2})  # version 2
    await state.save_list("alice", "s1", "history", [1, {"two": 2.0}, "three"])
    await state.append_list("alice", "s1", "empty", [])
    await state.save(None, "anon", "mood", "curious")
    await state.save("\x01early", "s", "v", 0)
    await snapshots.put("scope-a", "snap-1", b"\x00tar bytes", metadata={"z": 1, "a": [1.0]})
    await snapshots.put("scope-a", "snap-2", b"")
    await snapshots.put("scope-\U0001f600", "only", b"x" * 1000, metadata={"k": "v"})
    clock.advance(timedelta(minutes=4))


async def _dump(stores: Stores) -> dict[str, Any]:
    """Everything the stores hold, by value (what a copy must reproduce)."""
    out: dict[str, Any] = {"kv": {}, "state": {}, "snapshots": {}}
    page = await stores.kv.search((), limit=1000)
    for item in page.items:
        out["kv"][(*item.namespace, item.key)] = json.dumps(item.value)
    sessions = await stores.state._list_sessions(None, 1000)
    for user, session in sessions:
        values, lists = await stores.state._session_keys(user, session)
        out["state"][(user, session)] = (
            {k: json.dumps(await stores.state.get(user, session, k)) for k in values},
            {k: json.dumps(await stores.state.get_list(user, session, k)) for k in lists},
        )
    for scope in await stores.snapshots._list_scopes(None, 1000):
        for info in (await stores.snapshots.list(scope)).items:
            found = await stores.snapshots.get(scope, info.snapshot_id)
            assert found is not None
            out["snapshots"][(scope, info.snapshot_id)] = (found.data, json.dumps(info.metadata))
    return out


async def test_copy_by_value_then_resume(pair: tuple[Stores, Stores], clock: ManualClock) -> None:
    source, target = pair
    await _fill(source, clock)
    seen: list[RuntimeItem] = []
    totals: list[int] = []
    report = await copy_runtime(source, target, on_total=totals.append, on_item=seen.append)
    assert report.ok
    assert totals == [len(seen)] == [9]
    assert (report.count("kv"), report.count("state"), report.count("snapshots")) == (3, 3, 3)
    assert len(report.copied) == report.verified == 9
    assert report.present == []
    expected = await _dump(source)
    assert await _dump(target) == expected
    assert len(expected["kv"]) == 3
    assert len(expected["state"]) == 3
    assert len(expected["snapshots"]) == 3
    # Versions restart; the remaining time to live is kept; creation times are the target's.
    readme = await target.kv.get(("tenant", "docs"), "readme")
    assert readme is not None
    assert readme.version == 1
    short = await target.kv.get(("tenant",), "short")
    assert short is not None
    assert short.expires_at == START + timedelta(minutes=10)
    assert short.ttl == timedelta(minutes=6)
    plan = await target.state.get_versioned("alice", "s1", "plan")
    assert plan is not None
    assert plan.version == 1
    snap = await target.snapshots.get("scope-a", "snap-1")
    assert snap is not None
    assert snap.info.created_at == START + timedelta(minutes=4)
    # Run again: everything is there with the same content.
    again = await copy_runtime(source, target)
    assert again.ok
    assert again.copied == []
    assert len(again.present) == again.verified == 9
    assert await _dump(target) == expected


async def test_expired_data_is_not_copied(pair: tuple[Stores, Stores], clock: ManualClock) -> None:
    source, target = pair
    await _fill(source, clock)
    clock.advance(timedelta(minutes=6))  # the 10-minute item expires
    report = await copy_runtime(source, target)
    assert report.ok
    assert await target.kv.get(("tenant",), "short") is None
    assert report.count("kv") == 2


async def test_other_content_in_the_target_is_reported_and_left_alone(
    pair: tuple[Stores, Stores], clock: ManualClock
) -> None:
    source, target = pair
    await _fill(source, clock)
    await target.kv.put(("tenant", "docs"), "readme", "theirs")
    await target.state.save("alice", "s1", "history", "a value where the source has a list")
    await target.state.save(None, "anon", "extra", 1)  # a key the source does not have
    await target.snapshots.put("scope-a", "snap-2", b"other bytes")
    report = await copy_runtime(source, target)
    assert not report.ok
    assert set(report.mismatched) == {
        RuntimeItem("kv", ("tenant", "docs", "readme")),
        RuntimeItem("state", ("alice", "s1")),
        RuntimeItem("state", (None, "anon")),
        RuntimeItem("snapshots", ("scope-a", "snap-2")),
    }
    theirs = await target.kv.get(("tenant", "docs"), "readme")
    assert theirs is not None
    assert theirs.value == "theirs"
    assert await target.state.get("alice", "s1", "history") == (
        "a value where the source has a list"
    )
    # A differing session is left alone: none of the source's states are added to it.
    assert await target.state._session_keys("alice", "s1") == (["history"], [])
    assert await target.state._session_keys(None, "anon") == (["extra"], [])
    snap = await target.snapshots.get("scope-a", "snap-2")
    assert snap is not None
    assert snap.data == b"other bytes"
    assert len(report.copied) == 5


async def test_an_interrupted_session_is_finished(
    pair: tuple[Stores, Stores], clock: ManualClock
) -> None:
    source, target = pair
    await _fill(source, clock)
    # A copy stopped after the first state of alice's session.
    await target.state.append_list("alice", "s1", "empty", [])
    report = await copy_runtime(source, target)
    assert report.ok
    assert RuntimeItem("state", ("alice", "s1")) in report.copied
    assert await _dump(target) == await _dump(source)


class _Silent(MemoryAgentStateStore):
    capabilities: ClassVar[frozenset[str]] = frozenset()


class _SilentSnapshots(MemorySnapshotStore):
    capabilities: ClassVar[frozenset[str]] = frozenset()


@pytest.mark.parametrize(
    ("component", "store", "side", "message"),
    [
        ("state", _Silent, "source", "source's agent-state store"),
        ("snapshots", _SilentSnapshots, "target", "target's snapshot store"),
    ],
)
async def test_a_store_that_does_not_enumerate_refuses_before_writing(
    pair: tuple[Stores, Stores],
    clock: ManualClock,
    component: str,
    store: type[Any],
    side: str,
    message: str,
) -> None:
    source, target = pair
    await _fill(source, clock)
    stores = {"source": source, "target": target}
    base = stores[side]
    parts = {c: getattr(base, c) for c in ("kv", "state", "snapshots")}
    parts[component] = store(clock=clock)
    stores[side] = Stores(parts, dict.fromkeys(parts, "memory"))
    with pytest.raises(ConfigurationError, match=f"{message}.*--all"):
        await copy_runtime(stores["source"], stores["target"])
    assert (await target.kv.search((), limit=10)).items == []


async def test_a_bundle_without_a_runtime_store_refuses(pair: tuple[Stores, Stores]) -> None:
    source, target = pair
    partial = Stores({"threads": target.threads}, {"threads": "memory"})
    with pytest.raises(ConfigurationError, match="target provides no kv store"):
        await copy_runtime(source, partial)
