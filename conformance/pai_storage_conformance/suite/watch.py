"""Watching a thread on the store under test (docs/watch.md).

``ThreadStore.watch`` is the core's loop over the backend's change signal
(polling by default), so these tests check the contract on every backend:
versions only go forward, the final version of a burst is always reported,
a deletion is reported, another scope's thread of the same id is never seen,
``after=`` starts where it says, and a change that says what changed
(``changed``) says it right. A backend that declares ``watch_changes`` must
say it for a commit its watcher was waiting for. Intervals are short; every
wait is for an event, bounded only by a generous guard against a hang.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from pai_storage import ThreadChange, ThreadStore, ThreadVersion
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.watch import WATCH_CHANGES, ChangeSet, FamilyChanges

from ._support import new_scope

__all__ = ["TestWatch"]

pytestmark = pytest.mark.asyncio

INTERVAL = 0.01
LONG_INTERVAL = 30.0  # seconds: a watcher woken sooner was woken by the backend's signal
HANG_GUARD = 60.0  # seconds: only ever reached when a change is never reported


async def _version(store: ThreadStore, scope: str, thread_id: str) -> ThreadVersion:
    root = await store.conversation(scope, thread_id).get()
    assert root is not None
    return root.version


async def _add(store: ThreadStore, scope: str, thread_id: str, text: str = "hi") -> ThreadVersion:
    chat = store.conversation(scope, thread_id)
    await chat.add("user", text)
    return await _version(store, scope, thread_id)


async def _until(changes: AsyncIterator[ThreadChange], final: ThreadVersion) -> list[ThreadChange]:
    """Every change up to and including the one reporting ``final``."""
    seen: list[ThreadChange] = []
    async with asyncio.timeout(HANG_GUARD):
        async for change in changes:
            seen.append(change)
            if change.version == final:
                return seen
    raise AssertionError("the watch ended")  # pragma: no cover - it is endless


async def _next(changes: AsyncIterator[ThreadChange]) -> ThreadChange:
    return await anext(changes)


def _forward(changes: list[ThreadChange]) -> None:
    revisions = [c.version.revision for c in changes if c.version is not None]
    assert revisions == sorted(set(revisions)), revisions
    for change in changes:
        if change.previous is not None and change.version is not None:
            assert change.version.revision > change.previous.revision


def _inserted(message_id: str) -> ChangeSet:
    return ChangeSet(messages=FamilyChanges(inserted=(message_id,)))


class TestWatch:
    """``store.watch(scope, thread)`` and ``store.watch_scope(scope)``."""

    async def test_what_changed_is_right_whenever_it_is_said(self, store: ThreadStore) -> None:
        scope = new_scope()
        start = await _add(store, scope, "t")
        chat = store.conversation(scope, "t")
        changes = store.watch(scope, "t", after=start, interval=INTERVAL)
        expected: dict[int, ChangeSet] = {}  # by revision: what each commit changed

        async def write() -> ThreadVersion:
            for i in range(12):
                if i % 4 == 3:
                    await chat.update(metadata={"turn": i})
                    change = ChangeSet()
                else:
                    change = _inserted((await chat.add("user", f"message {i}")).message_id)
                version = await _version(store, scope, "t")
                expected[version.revision] = change
                await asyncio.sleep(0)
            return version

        writer = asyncio.create_task(write())
        seen = await _until(changes, await writer)
        _forward(seen)
        for change in seen:
            if change.changed is None:
                continue  # unknown: allowed (the watcher re-reads the thread)
            assert change.previous is not None
            assert change.version is not None
            folded = [
                expected[r]
                for r in range(change.previous.revision + 1, change.version.revision + 1)
            ]
            merged = folded[0]
            for later in folded[1:]:
                merged = merged.merge(later)
            assert change.changed == merged
            assert change.to_json()["changed"] == merged.to_json()

    async def test_a_waiting_watcher_is_told_what_a_commit_changed(
        self, store: ThreadStore
    ) -> None:
        if WATCH_CHANGES not in store.capabilities:
            pytest.skip(
                f"capability {WATCH_CHANGES!r} not provided by the {store.backend_name} backend: "
                "its watchers are not told what changed (ThreadChange.changed is None)"
            )
        scope = new_scope()
        start = await _add(store, scope, "t")
        chat = store.conversation(scope, "t")
        changes = store.watch(scope, "t", after=start, interval=LONG_INTERVAL)
        async with asyncio.timeout(HANG_GUARD):
            first = await chat.add("user", "while the watcher starts")
            await _next(changes)  # the watcher is running; its signal is listening
            for i in range(3):
                watching = asyncio.create_task(_next(changes))
                message = await chat.add("user", f"while the watcher waits {i}")
                change = await watching
                assert change.commits == 1
                assert change.changed == _inserted(message.message_id), change.changed
            watching = asyncio.create_task(_next(changes))
            await chat.update(metadata={"topic": "x"})
            change = await watching
        assert change.changed == ChangeSet()  # the root only: no record, no lease
        assert first.message_id not in change.to_json()["changed"]["messages"]["inserted"]
        await changes.aclose()

    async def test_every_commit_is_reported_in_order_ending_at_the_last(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        start = await _add(store, scope, "t")
        changes = store.watch(scope, "t", after=start, interval=INTERVAL)

        async def write() -> ThreadVersion:
            last = start
            for i in range(20):
                last = await _add(store, scope, "t", f"chunk {i}")
                await asyncio.sleep(0)
            return last

        writer = asyncio.create_task(write())
        seen = await _until(changes, await writer)
        _forward(seen)
        assert seen[0].previous == start
        assert all(c.scope_key == scope and c.thread_id == "t" for c in seen)
        assert all(not c.deleted and c.thread is not None for c in seen)
        for one, two in itertools.pairwise(seen):
            assert two.previous == one.version  # nothing between two reported changes
        assert sum(c.commits or 0 for c in seen) == 20
        final = seen[-1]
        assert final.thread is not None
        assert final.thread.version == final.version
        assert final.committed_at == final.thread.updated_at

    async def test_a_slow_consumer_gets_the_burst_coalesced_into_the_final_version(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        start = await _add(store, scope, "t")
        changes = store.watch(scope, "t", after=start, interval=INTERVAL)
        last = start
        for i in range(10):  # before the consumer looks at all
            last = await _add(store, scope, "t", f"chunk {i}")
        async with asyncio.timeout(HANG_GUARD):
            first = await _next(changes)
        assert (first.previous, first.version, first.commits) == (start, last, 10)

    async def test_a_deletion_is_reported(self, store: ThreadStore) -> None:
        scope = new_scope()
        start = await _add(store, scope, "t")
        changes = store.watch(scope, "t", after=start, interval=INTERVAL)
        assert await store.conversation(scope, "t").delete()
        async with asyncio.timeout(HANG_GUARD):
            change = await _next(changes)
        assert change.deleted
        assert change.version is None
        assert change.thread is None
        assert change.previous == start
        assert change.committed_at is None

    async def test_another_scope_and_another_thread_are_not_seen(self, store: ThreadStore) -> None:
        scope, other = new_scope(), new_scope()
        start = await _add(store, scope, "t")
        await _add(store, other, "t")
        changes = store.watch(scope, "t", after=start, interval=INTERVAL)
        watching = asyncio.create_task(_next(changes))
        for i in range(5):
            await _add(store, other, "t", f"elsewhere {i}")
            await _add(store, scope, "t2", f"beside {i}")
        mine = await _add(store, scope, "t")
        async with asyncio.timeout(HANG_GUARD):
            change = await watching
        assert (change.scope_key, change.thread_id, change.version) == (scope, "t", mine)
        assert change.previous == start

    async def test_after_an_older_version_reports_the_head_at_once(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        old = await _add(store, scope, "t")
        head = await _add(store, scope, "t")
        async with asyncio.timeout(HANG_GUARD):
            change = await _next(store.watch(scope, "t", after=old.to_json(), interval=INTERVAL))
        assert (change.previous, change.version, change.commits) == (old, head, 1)

    async def test_after_the_head_waits_for_the_next_commit(self, store: ThreadStore) -> None:
        scope = new_scope()
        head = await _add(store, scope, "t")
        changes = store.watch(scope, "t", after=head, interval=INTERVAL)
        watching = asyncio.create_task(_next(changes))
        for _ in range(3):  # a few looks at an unchanged thread report nothing
            await asyncio.sleep(INTERVAL)
        assert not watching.done()
        nxt = await _add(store, scope, "t")
        async with asyncio.timeout(HANG_GUARD):
            change = await watching
        assert (change.previous, change.version) == (head, nxt)

    async def test_without_after_only_later_commits_are_reported(self, store: ThreadStore) -> None:
        scope = new_scope()
        start = await _add(store, scope, "t")
        changes = store.watch(scope, "t", interval=INTERVAL)
        watching = asyncio.create_task(_next(changes))
        async with asyncio.timeout(HANG_GUARD):
            while not watching.done():  # the watcher starts at some version; commit past it
                await _add(store, scope, "t")
                await asyncio.sleep(INTERVAL)
        change = await watching
        assert change.previous is not None
        assert change.version is not None
        assert change.previous.revision >= start.revision
        assert change.version.revision > change.previous.revision

    async def test_after_a_version_of_a_missing_thread_reports_the_deletion(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        gone = await _add(store, scope, "t")
        assert await store.conversation(scope, "t").delete()
        async with asyncio.timeout(HANG_GUARD):
            change = await _next(store.watch(scope, "t", after=gone, interval=INTERVAL))
        assert change.deleted
        assert change.previous == gone

    async def test_a_thread_created_later_is_reported_with_no_previous(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        changes = store.watch(scope, "new", interval=INTERVAL)
        watching = asyncio.create_task(_next(changes))
        await asyncio.sleep(INTERVAL)
        created = await _add(store, scope, "new")
        async with asyncio.timeout(HANG_GUARD):
            change = await watching
        assert change.previous is None
        assert change.commits is None
        assert change.version is not None
        assert change.version.thread_instance_id == created.thread_instance_id

    async def test_bad_arguments_are_refused_at_the_call(self, store: ThreadStore) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError):
            store.watch("", "t")
        with pytest.raises(ThreadStoreInvariantError):
            store.watch(scope, "x" * 2000)
        for interval in (0, -1, float("nan"), float("inf"), "1", True):
            with pytest.raises(ThreadStoreInvariantError, match="interval"):
                store.watch(scope, "t", interval=interval)  # type: ignore[arg-type]
        with pytest.raises(ThreadStoreInvariantError, match="after"):
            store.watch(scope, "t", after="v1")  # type: ignore[arg-type]
        with pytest.raises(ThreadStoreInvariantError):
            store.watch(scope, "t", after={"threadInstanceId": "i", "revision": 0})
        with pytest.raises(ThreadStoreInvariantError):
            store.watch_scope("", interval=INTERVAL)

    async def test_the_conversation_handle_watches_its_thread(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "chat", flush_every=0)
        await chat.add("user", "question")
        start = await _version(store, scope, "chat")
        changes = chat.watch(after=start, interval=INTERVAL)
        async with chat.reply() as answer:
            for chunk in ("one ", "two ", "three"):
                await answer.write(chunk)
        final = await _version(store, scope, "chat")
        seen = await _until(changes, final)
        _forward(seen)
        assert seen[0].previous == start

    async def test_watch_scope_reports_the_threads_that_change(self, store: ThreadStore) -> None:
        scope, other = new_scope(), new_scope()
        await _add(store, scope, "a")
        changes = store.watch_scope(scope, interval=INTERVAL)
        watching = asyncio.create_task(_next(changes))
        async with asyncio.timeout(HANG_GUARD):
            while not watching.done():  # the watcher starts at some point; change past it
                await _add(store, other, "b")
                await _add(store, scope, "b")
                await asyncio.sleep(INTERVAL)
        change = await watching
        assert (change.scope_key, change.thread_id) == (scope, "b")
        assert change.version is not None
        assert not change.deleted
