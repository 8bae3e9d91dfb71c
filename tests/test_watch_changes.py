"""What a change says changed (``ThreadChange.changed``, docs/watch.md): the
``ChangeSet`` of a commit, how changes fold, when it is unknown, its JSON form,
and a scope's watcher woken by the memory backend's signal."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pai_storage_memory import MemoryThreadStore

from pai_storage import CommitThreadInput, ManualClock, ThreadVersion, builders
from pai_storage.watch import WATCH_CHANGES, ChangeSet, CommitNote, FamilyChanges, _Notes

HANG_GUARD = 60.0
LONG = 3600.0  # seconds between polls: only the signal wakes the watcher


def _commit(changes: dict[str, Any]) -> CommitThreadInput:
    return CommitThreadInput.model_validate(builders.create("s", "t", changes))


def _version(revision: int, instance: str = "i") -> ThreadVersion:
    return ThreadVersion.model_validate({"threadInstanceId": instance, "revision": revision})


def test_a_commit_names_the_ids_it_inserts_updates_deletes_and_truncates() -> None:
    commit = CommitThreadInput.model_validate(
        {
            **builders.create("s", "t"),
            "condition": {"type": "version", "version": _version(3).to_json()},
            "mutation": {
                "type": "update",
                "root": {"listVisibility": "visible", "metadata": {}, "privateMetadata": {}},
                "changes": {
                    "messages": [
                        builders.insert(builders.message("m1")),
                        builders.replace(builders.message("m0")),
                        builders.delete_record("m-old"),
                        builders.truncate("m1"),
                    ],
                    "queuedItems": [builders.insert(builders.queued_item("q1", "r1"))],
                    "lease": builders.release("r0", "owner"),
                },
            },
        }
    )
    changes = ChangeSet.of_commit(commit)
    assert changes == ChangeSet(
        messages=FamilyChanges(("m1",), ("m0",), ("m-old",), truncated=True),
        queued_items=FamilyChanges(inserted=("q1",)),
        lease=True,
    )
    assert not changes.runs
    assert ChangeSet.from_json(json.loads(json.dumps(changes.to_json()))) == changes


def test_a_delete_has_no_change_set() -> None:
    commit = CommitThreadInput.model_validate(builders.delete("s", "t", _version(2).to_json()))
    assert ChangeSet.of_commit(commit) is None
    assert CommitNote.of_commit(commit, None) is None


def test_folded_changes_keep_each_id_once_in_first_seen_order() -> None:
    one = ChangeSet(messages=FamilyChanges(inserted=("a", "b")))
    two = ChangeSet(messages=FamilyChanges(inserted=("b", "c"), updated=("a",)), lease=True)
    assert one.merge(two) == ChangeSet(
        messages=FamilyChanges(inserted=("a", "b", "c"), updated=("a",)), lease=True
    )


def test_a_change_is_described_only_when_every_commit_it_covers_was_heard() -> None:
    notes = _Notes()
    heard = {r: ChangeSet(messages=FamilyChanges(inserted=(f"m{r}",))) for r in (2, 3, 5)}
    notes.add([CommitNote(_version(r), c) for r, c in heard.items()])
    both = notes.covering(_version(1), _version(3))
    assert both == ChangeSet(messages=FamilyChanges(inserted=("m2", "m3")))
    assert notes.covering(_version(3), _version(5)) is None  # revision 4 was not heard
    notes.add([CommitNote(_version(1, "new"), ChangeSet())])
    assert notes.covering(_version(5), _version(1, "new")) is None  # a deletion is folded in
    notes.add([CommitNote(_version(2, "new"), ChangeSet())])
    assert notes.covering(None, _version(2, "new")) is None  # revision 1 was forgotten
    notes.add([CommitNote(_version(r, "newer"), ChangeSet()) for r in (1, 2)])
    assert notes.covering(None, _version(2, "newer")) == ChangeSet()  # created: all heard


def test_the_memory_backend_declares_it() -> None:
    assert WATCH_CHANGES in MemoryThreadStore.capabilities


async def test_a_change_says_what_changed_in_its_json_form() -> None:
    store = MemoryThreadStore()
    chat = store.conversation("s", "t")
    await chat.add("user", "one")
    root = await chat.get()
    assert root is not None
    changes = store.watch("s", "t", after=root.version, interval=LONG)
    watching = asyncio.create_task(anext(changes))
    await asyncio.sleep(0.01)  # the watcher waits (a commit before it started is not told)
    message = await chat.add("user", "two")
    async with asyncio.timeout(HANG_GUARD):
        change = await watching
    document = json.loads(json.dumps(change.to_json()))
    assert document["changed"]["messages"]["inserted"] == [message.message_id]
    assert document["changed"]["lease"] is False
    await changes.aclose()


@pytest.mark.parametrize("rounds", [3])
async def test_a_scope_watcher_is_woken_by_the_commit_not_the_interval(rounds: int) -> None:
    store = MemoryThreadStore()
    await store.conversation("s", "a").add("user", "hi")
    changes = store.watch_scope("s", interval=LONG)
    for i in range(rounds):
        watching = asyncio.create_task(anext(changes))
        await asyncio.sleep(0.01)  # the watcher has looked once and waits
        await store.conversation("s", f"b{i}").add("user", "hi")
        async with asyncio.timeout(HANG_GUARD):
            change = await watching
        assert change.thread_id == f"b{i}"
        assert change.changed is None  # a scope's watcher is not told what changed
    await changes.aclose()


async def test_a_thread_deleted_and_created_again_is_not_described() -> None:
    # One change folds the deletion and the new incarnation's commits: the
    # creation's change set alone would hide that every record of the old
    # incarnation is gone (docs/watch.md: `changed` is None for a deletion).
    store = MemoryThreadStore()
    chat = store.conversation("s", "t")
    await chat.add("user", "one", messageId="old")
    root = await chat.get()
    assert root is not None
    changes = store.watch("s", "t", after=root.version, interval=LONG)
    watching = asyncio.create_task(anext(changes))
    await asyncio.sleep(0.01)
    await chat.add("user", "two")
    async with asyncio.timeout(HANG_GUARD):
        first = await watching
    assert first.changed is not None
    await chat.delete()  # while the consumer is busy: both fold into its next change
    await chat.add("user", "again", messageId="new")
    async with asyncio.timeout(HANG_GUARD):
        change = await anext(changes)
    assert not change.deleted
    assert change.previous == first.version
    assert change.commits is None  # another incarnation
    assert change.changed is None  # not "only 'new' was inserted": 'old' is gone too
    await changes.aclose()


async def test_a_scope_watcher_finds_a_commit_that_shows_after_a_later_stamped_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A commit is stamped before it is visible: of two concurrent commits (one
    # clock), the one stamped first can become visible second. Here the store's
    # clock steps back to stamp the second one earlier.
    clock = ManualClock()
    store = MemoryThreadStore(clock=clock)
    first_look = asyncio.Event()
    list_threads = store.list_threads

    async def listed(request: Any) -> Any:
        page = await list_threads(request)
        first_look.set()
        return page

    monkeypatch.setattr(store, "list_threads", listed)

    async def settled() -> None:
        # The watcher gets to its wait in a few loop turns (memory: no I/O),
        # whatever the machine's load: turns, not a time.
        for _ in range(10):
            await asyncio.sleep(0)

    await store.conversation("s", "a").add("user", "hi")
    changes = store.watch_scope("s", interval=LONG)
    watching = asyncio.create_task(anext(changes))
    async with asyncio.timeout(HANG_GUARD):
        await first_look.wait()
    await settled()
    clock.advance(ms=20)
    await store.conversation("s", "b").add("user", "hi")
    async with asyncio.timeout(HANG_GUARD):
        assert (await watching).thread_id == "b"
    watching = asyncio.create_task(anext(changes))
    await settled()
    clock.advance(ms=-10)  # stamped before "b", visible after it
    await store.conversation("s", "c").add("user", "hi")
    async with asyncio.timeout(HANG_GUARD):
        assert (await watching).thread_id == "c"
    await changes.aclose()
