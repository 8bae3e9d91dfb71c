"""Which commits may be judged from a known root alone (``root_cache.optimistic``),
and the process's view of the server's clock (``clock.ServerClock``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pai_storage_memory import MemoryThreadStore

from pai_storage import CommittedResult, CommitThreadInput, ThreadRecord, ThreadVersion
from pai_storage import builders as b
from pai_storage.clock import ServerClock
from pai_storage.root_cache import CachedRoot, RootCache, optimistic
from pai_storage.root_facts import NO_FACTS


async def _root(lease: bool = False) -> ThreadRecord:
    store = MemoryThreadStore()
    changes: dict[str, Any] = {
        "messages": [b.insert(b.message("u1", run_id="r1"))],
        "runs": [b.insert(b.run("r1", "running", inputs=["u1"]))],
    }
    if lease:
        changes["lease"] = b.acquire("r1", "worker")
    result = await store.commit_thread(b.create("s", "t", changes))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


def _known(root: ThreadRecord) -> CachedRoot[None]:
    return CachedRoot(None, root, {"messages": 2, "runs": 2, "queuedItems": 1}, NO_FACTS)


def _commit(root: ThreadRecord, changes: dict[str, Any] | None, **kw: Any) -> CommitThreadInput:
    version = kw.pop("version", root.version)
    return CommitThreadInput.model_validate(
        b.update_at("s", "t", version, changes, root=b.root(**kw))
    )


APPEND = {"messages": [b.insert(b.message("m2", run_id="r1", relation="output"))]}


@pytest.mark.asyncio
async def test_inserts_of_messages_and_runs_at_the_known_version_are_optimistic() -> None:
    root = await _root()
    known = _known(root)
    assert optimistic(_commit(root, APPEND), known)
    assert optimistic(_commit(root, None, title="only the root"), known)
    assert optimistic(
        _commit(root, {"runs": [b.insert(b.run("r2", "completed", inputs=[]))]}), known
    )


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"runs": [b.replace(b.run("r1", "completed", inputs=["u1"]))]}, id="replace"),
        pytest.param({"messages": [b.delete_record("u1")]}, id="delete"),
        pytest.param({"queuedItems": [b.insert(b.queued_item("q1", "r1"))]}, id="queued"),
        pytest.param({"lease": b.acquire("r1", "worker")}, id="lease change"),
    ],
)
async def test_anything_but_inserts_is_held(changes: dict[str, Any]) -> None:
    root = await _root()
    assert not optimistic(_commit(root, changes), _known(root))


@pytest.mark.asyncio
async def test_another_version_a_create_a_delete_or_a_lease_on_the_root_is_held() -> None:
    root = await _root()
    known = _known(root)
    other = ThreadVersion(thread_instance_id=root.version.thread_instance_id, revision=9)
    assert not optimistic(_commit(root, APPEND, version=other), known)
    create = CommitThreadInput.model_validate(b.create("s", "t", APPEND))
    assert not optimistic(create, known)
    delete = CommitThreadInput.model_validate(b.delete("s", "t", root.version))
    assert not optimistic(delete, known)
    leased = await _root(lease=True)
    assert leased.lease is not None
    assert not optimistic(_commit(leased, APPEND), _known(leased))


@pytest.mark.asyncio
async def test_the_cache_keeps_its_own_counters_and_the_newest_revision() -> None:
    store = MemoryThreadStore()
    created = await store.commit_thread(b.create("s", "t"))
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    updated = await store.commit_thread(b.update(created.thread, title="next"))
    assert isinstance(updated, CommittedResult)
    assert updated.thread is not None
    cache: RootCache[None] = RootCache()
    counters = {"messages": 2, "runs": 2, "queuedItems": 1}
    cache.put(("s", "t"), CachedRoot(None, updated.thread, counters, NO_FACTS))
    counters["messages"] = 99
    entry = cache.get(("s", "t"))
    assert entry is not None
    assert entry.next_positions["messages"] == 2
    cache.offer(("s", "t"), CachedRoot(None, created.thread, counters, NO_FACTS))
    assert cache.get(("s", "t")) is entry
    cache.drop(("s", "t"))
    assert cache.get(("s", "t")) is None


def test_the_server_clock_predicts_nothing_before_it_saw_the_server() -> None:
    assert ServerClock().predict() is None


def test_the_server_clock_follows_the_servers_offset_to_the_millisecond() -> None:
    clock = ServerClock()
    clock.observe(datetime.now(UTC) + timedelta(seconds=30))  # a server 30 s ahead
    predicted = clock.predict()
    assert predicted is not None
    assert predicted.microsecond % 1000 == 0
    ahead = predicted - datetime.now(UTC)
    assert timedelta(seconds=29.9) < ahead <= timedelta(seconds=30)


def test_three_misses_in_a_row_pause_the_predictions() -> None:
    clock = ServerClock()
    clock.observe(datetime.now(UTC))
    clock.missed()
    clock.missed()
    assert clock.predict() is not None
    clock.missed()
    assert [clock.predict() for _ in range(ServerClock.PAUSE)] == [None] * ServerClock.PAUSE
    assert clock.predict() is not None


def test_misses_far_apart_do_not_pause_the_predictions() -> None:
    clock = ServerClock()
    clock.observe(datetime.now(UTC))
    for _ in range(3):
        clock.missed()
        for _ in range(ServerClock.OF - 2):
            clock.hit()
    assert clock.predict() is not None


def test_the_clock_keeps_the_latest_view_of_the_server_until_reset() -> None:
    clock = ServerClock()
    now = datetime.now(UTC)
    clock.observe(now + timedelta(seconds=30))
    clock.observe(now)  # an older reading (a slow reply): a lower bound, kept out
    predicted = clock.predict()
    assert predicted is not None
    assert predicted - datetime.now(UTC) > timedelta(seconds=29)
    clock.reset(now)  # a prediction proved ahead of the server
    predicted = clock.predict()
    assert predicted is not None
    assert abs(predicted - datetime.now(UTC)) < timedelta(seconds=1)
