"""The example's own lifecycle checks: its updated-at index and its fork transaction.

The conformance suite (``test_conformance.py``) checks what the operations
do; these check what only this backend holds: the index the server keeps
sorted beside the thread values, and how ``_fork_copy`` plans at the version it
copies.
"""

import json
from datetime import datetime, timedelta

import pytest
from pai_example_kv import KeyValueThreadStore

from pai_storage import CommittedResult, ManualClock, ThreadRecord
from pai_storage import builders as b
from pai_storage.backend import (
    ForkRequest,
    ThreadConflict,
    ThreadIndexEntry,
    new_instance_id,
)
from pai_storage.errors import ThreadStoreInvariantError


def _roots(store: KeyValueThreadStore) -> list[ThreadRecord]:
    values = [v for k, v in store.server.data.items() if k.startswith(b"root/")]
    return [ThreadRecord.model_validate(json.loads(v)["thread"]) for v in values]


def _assert_index_matches_roots(store: KeyValueThreadStore) -> None:
    roots = _roots(store)
    index = store.server.updated
    assert index.everywhere == sorted((r.updated_at, r.scope_key, r.thread_id) for r in roots)
    assert index.scopes == {
        scope: sorted((r.updated_at, r.thread_id) for r in roots if r.scope_key == scope)
        for scope in {r.scope_key for r in roots}
    }


async def _create(store: KeyValueThreadStore, scope: str, thread_id: str) -> ThreadRecord:
    result = await store.commit_thread(
        b.create(scope, thread_id, {"messages": [b.insert(b.message("m1"))]})
    )
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def test_the_updated_at_index_follows_every_kind_of_write() -> None:
    clock = ManualClock()
    async with KeyValueThreadStore(clock=clock) as store:
        a = await _create(store, "s1", "a")
        clock.advance(ms=5)
        bee = await _create(store, "s1", "b")
        clock.advance(ms=5)
        await _create(store, "s2", "c")
        clock.advance(ms=5)
        updated = await store.commit_thread(
            b.update_at("s1", "a", a.version, root=b.root(title="later"))
        )
        assert isinstance(updated, CommittedResult)
        deleted = await store.commit_thread(b.delete("s1", "b", bee.version))
        assert isinstance(deleted, CommittedResult)
        _assert_index_matches_roots(store)
        assert [t for _, _, t in store.server.updated.everywhere] == ["c", "a"]

        clock.advance(ms=5)
        fork = await store.fork_thread("s1", "a", "a-fork")
        assert isinstance(fork, CommittedResult)
        exported = [line async for line in store.export_threads("s2")]
        assert await store.erase_scope("s2") == 1
        _assert_index_matches_roots(store)
        assert "s2" not in store.server.updated.scopes

        report = await store.import_threads(exported)
        assert report.imported == [("s2", "c")]
        _assert_index_matches_roots(store)
        cutoff = clock() + timedelta(milliseconds=1)
        pruned = await store.prune_threads(updated_before=cutoff, limit=10)
        assert sorted(p.thread_id for p in pruned) == ["a", "a-fork", "c"]
        assert store.server.updated.everywhere == []
        assert store.server.updated.scopes == {}


async def test_thread_heads_walk_the_index_from_an_entry() -> None:
    clock = ManualClock()
    async with KeyValueThreadStore(clock=clock) as store:
        for thread_id in ("t3", "t1", "t2"):  # two share a millisecond: thread id breaks the tie
            await _create(store, "s", thread_id)
            if thread_id != "t1":
                clock.advance(ms=1)
        await _create(store, "other", "t0")
        heads = await store._thread_heads("s", updated_before=None, after=None, limit=10)
        assert [h.thread_id for h in heads] == ["t3", "t1", "t2"]
        rest = await store._thread_heads("s", updated_before=None, after=heads[0], limit=1)
        assert rest == [heads[1]]
        everywhere = await store._thread_heads(None, updated_before=clock(), after=None, limit=10)
        assert [(h.scope_key, h.thread_id) for h in everywhere] == [
            ("s", "t3"),
            ("s", "t1"),
            ("s", "t2"),
        ]
        assert everywhere[0] == ThreadIndexEntry.of(_by_id(store, "t3"))


def _by_id(store: KeyValueThreadStore, thread_id: str) -> ThreadRecord:
    return next(r for r in _roots(store) if r.thread_id == thread_id)


def _request(source_id: str, thread_id: str, now: datetime) -> ForkRequest:
    return ForkRequest(
        scope_key="s",
        source_thread_id=source_id,
        thread_id=thread_id,
        through_message_id=None,
        instance_id=new_instance_id(),
        test_now=now,
    )


async def test_fork_copy_plans_at_the_version_it_copies_and_refuses_an_existing_thread() -> None:
    clock = ManualClock()
    async with KeyValueThreadStore(clock=clock) as store:
        source = await _create(store, "s", "src")
        taken = await _create(store, "s", "taken")
        asked = _request("src", "new", clock())  # asked for before the source moved on
        moved = await store.commit_thread(
            b.update_at("s", "src", source.version, root=b.root(title="moved"))
        )
        assert isinstance(moved, CommittedResult)
        assert moved.thread is not None
        before = dict(store.server.data)

        with pytest.raises(ThreadConflict) as conflict:
            await store._fork_copy(_request("src", "taken", clock()))
        assert conflict.value.current == taken.version
        with pytest.raises(ThreadStoreInvariantError, match="does not exist"):
            await store._fork_copy(_request("missing", "other", clock()))
        assert store.server.data == before
        _assert_index_matches_roots(store)

        root = await store._fork_copy(asked)
        assert root.title == "moved"  # the version it held, not the one before the request
        assert root.parent_thread_id == "src"
        assert root.version.revision == 1
        assert await store.thread_digest("s", "new") is not None
        _assert_index_matches_roots(store)
