"""Concurrency and scope isolation.

Consistent reads (docs/reads.md#reading-a-thread), atomic racing commits
(docs/commits.md#atomicity-and-concurrency) and scopes that never see each other
(docs/data-model.md#scopes-and-isolation).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pai_storage import CommittedResult, ConflictResult, ManualClock, ThreadStore, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStorePageTokenError

from ._support import new_scope

__all__ = ["TestConcurrency", "TestIsolation"]

pytestmark = pytest.mark.asyncio

RACERS = 12


def _all_pages(limit: int = 100) -> dict[str, Any]:
    return {
        "messages": {"type": "page", "view": "raw", "page": {"limit": limit}},
        "runs": {"type": "page", "page": {"limit": limit}},
        "queuedItems": {"type": "page", "page": {"limit": limit}},
    }


def _split(results: list[Any]) -> tuple[list[CommittedResult], list[ConflictResult]]:
    committed = [r for r in results if isinstance(r, CommittedResult)]
    conflicts = [r for r in results if isinstance(r, ConflictResult)]
    assert len(committed) + len(conflicts) == len(results), results
    return committed, conflicts


def _writer_changes(revision: int) -> dict[str, Any]:
    """What the streaming writer adds when it moves the thread to ``revision``."""
    return {
        "messages": [b.insert(b.message(f"m{revision}", f"message {revision}"))],
        "runs": [b.insert(b.run(f"r{revision}", "queued", queue_item_id=f"q{revision}"))],
        "queuedItems": [b.insert(b.queued_item(f"q{revision}", f"r{revision}", revision))],
    }


class TestConcurrency:
    """Racing writers: exactly one wins; readers always see one committed version."""

    async def test_racing_updates_on_one_version(self, store: ThreadStore) -> None:
        scope, tid = new_scope(), "race"
        created = await store.commit_thread(
            b.create(
                scope,
                tid,
                {
                    "messages": [b.insert(b.message("m0", run_id="r0"))],
                    "runs": [b.insert(b.run("r0", "running", inputs=["m0"]))],
                },
            )
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        for round_ in range(3):
            commits = [
                b.update_at(
                    scope,
                    tid,
                    version,
                    {
                        "messages": [
                            b.insert(
                                b.message(
                                    f"out-{round_}-{i}",
                                    role="assistant",
                                    run_id="r0",
                                    relation="output",
                                )
                            )
                        ]
                    },
                    root=b.root(title=f"writer {round_}-{i}", metadata={"writer": i}),
                )
                for i in range(RACERS)
            ]
            results = await asyncio.gather(*(store.commit_thread(c) for c in commits))
            committed, conflicts = _split(list(results))
            assert len(committed) == 1, results
            assert len(conflicts) == RACERS - 1
            winner = committed[0].thread
            assert winner is not None
            assert winner.version == ThreadVersion(
                thread_instance_id=version.thread_instance_id, revision=version.revision + 1
            )
            for conflict in conflicts:
                assert conflict.current_version == winner.version
            index = results.index(committed[0])
            assert winner.title == f"writer {round_}-{index}"
            assert winner.metadata == {"writer": index}
            read = await store.read_thread(b.read(scope, tid, **_all_pages()))
            assert read.thread is not None
            assert read.messages is not None
            assert read.thread.version == winner.version
            assert read.thread.title == f"writer {round_}-{index}"
            outputs = [m.message_id for m in read.messages.items if m.message_id != "m0"]
            assert outputs[-1] == f"out-{round_}-{index}"
            assert len(outputs) == round_ + 1
            version = winner.version
        assert version.revision == 4

    async def test_racing_lease_acquires(self, store: ThreadStore, clock: ManualClock) -> None:
        scope, tid = new_scope(), "lease-race"
        created = await store.commit_thread(
            b.create(
                scope,
                tid,
                {
                    "messages": [b.insert(b.message("m1", run_id="r1"))],
                    "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
                },
            )
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        results = await asyncio.gather(
            *(
                store.commit_thread(
                    b.update_at(
                        scope,
                        tid,
                        version,
                        {"lease": b.acquire("r1", f"worker-{i}")},
                        root=b.root(),
                    )
                )
                for i in range(RACERS)
            )
        )
        committed, conflicts = _split(list(results))
        assert len(committed) == 1
        assert len(conflicts) == RACERS - 1
        winner = committed[0].thread
        assert winner is not None
        assert winner.lease is not None
        assert winner.lease.owner_id == f"worker-{results.index(committed[0])}"
        read = await store.read_thread(b.read(scope, tid))
        assert read.thread is not None
        assert read.thread.lease == winner.lease
        assert read.thread.version.revision == 2

    async def test_racing_creates_of_one_thread(self, store: ThreadStore) -> None:
        scope, tid = new_scope(), "create-race"
        results = await asyncio.gather(
            *(
                store.commit_thread(
                    b.create(
                        scope,
                        tid,
                        {"messages": [b.insert(b.message(f"first-{i}"))]},
                        title=f"creator {i}",
                    )
                )
                for i in range(RACERS)
            )
        )
        committed, conflicts = _split(list(results))
        assert len(committed) == 1, results
        assert len(conflicts) == RACERS - 1
        winner = committed[0].thread
        assert winner is not None
        assert winner.version.revision == 1
        for conflict in conflicts:
            assert conflict.current_version == winner.version
        index = results.index(committed[0])
        read = await store.read_thread(b.read(scope, tid, **_all_pages()))
        assert read.thread is not None
        assert read.messages is not None
        assert read.thread.version == winner.version
        assert read.thread.title == f"creator {index}"
        assert [m.message_id for m in read.messages.items] == [f"first-{index}"]
        listed = await store.list_threads({"scopeKey": scope, "limit": 100})
        assert [t.thread_id for t in listed.items] == [tid]

    async def test_writers_on_different_threads_do_not_interfere(self, store: ThreadStore) -> None:
        scope = new_scope()
        threads = [f"thread-{i}" for i in range(RACERS)]
        steps = 5

        async def writer(tid: str) -> ThreadVersion:
            result = await store.commit_thread(
                b.create(scope, tid, {"messages": [b.insert(b.message(f"{tid}-0"))]})
            )
            assert isinstance(result, CommittedResult)
            assert result.thread is not None
            version = result.thread.version
            for step in range(1, steps + 1):
                result = await store.commit_thread(
                    b.update_at(
                        scope,
                        tid,
                        version,
                        {"messages": [b.insert(b.message(f"{tid}-{step}"))]},
                        root=b.root(title=f"{tid} step {step}"),
                    )
                )
                assert isinstance(result, CommittedResult), result
                assert result.thread is not None
                version = result.thread.version
            return version

        versions = await asyncio.gather(*(writer(tid) for tid in threads))
        assert [v.revision for v in versions] == [steps + 1] * RACERS
        assert len({v.thread_instance_id for v in versions}) == RACERS
        for tid, version in zip(threads, versions, strict=True):
            read = await store.read_thread(b.read(scope, tid, **_all_pages()))
            assert read.thread is not None
            assert read.messages is not None
            assert read.thread.version == version
            assert read.thread.title == f"{tid} step {steps}"
            assert [m.message_id for m in read.messages.items] == [
                f"{tid}-{step}" for step in range(steps + 1)
            ]
        listed = await store.list_threads({"scopeKey": scope, "limit": 100})
        assert sorted(t.thread_id for t in listed.items) == sorted(threads)

    async def test_reads_see_one_version_during_writes(self, store: ThreadStore) -> None:
        scope, tid = new_scope(), "stream"
        total = 40
        created = await store.commit_thread(b.create(scope, tid, _writer_changes(1), title="rev 1"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        done = asyncio.Event()
        seen: list[list[int]] = [[], []]
        paged: list[int] = []

        async def write() -> None:
            assert created.thread is not None
            version = created.thread.version
            try:
                for revision in range(2, total + 1):
                    result = await store.commit_thread(
                        b.update_at(
                            scope,
                            tid,
                            version,
                            _writer_changes(revision),
                            root=b.root(title=f"rev {revision}"),
                        )
                    )
                    assert isinstance(result, CommittedResult), result
                    assert result.thread is not None
                    version = result.thread.version
                    assert version.revision == revision
                    await asyncio.sleep(0)
            finally:
                done.set()

        async def read_whole(revisions: list[int]) -> None:
            while True:
                finished = done.is_set()
                read = await store.read_thread(b.read(scope, tid, **_all_pages()))
                assert read.thread is not None
                assert read.messages is not None
                assert read.runs is not None
                assert read.queued_items is not None
                version = read.thread.version
                assert read.messages.version == version
                assert read.runs.version == version
                assert read.queued_items.version == version
                r = version.revision
                assert read.thread.title == f"rev {r}"
                assert [m.message_id for m in read.messages.items] == [
                    f"m{i}" for i in range(1, r + 1)
                ]
                assert [x.run_id for x in read.runs.items] == [f"r{i}" for i in range(1, r + 1)]
                assert [q.queue_item_id for q in read.queued_items.items] == [
                    f"q{i}" for i in range(1, r + 1)
                ]
                revisions.append(r)
                if finished:
                    return
                await asyncio.sleep(0)

        async def read_paged() -> None:
            """Paging while writes land: later pages never show later records."""
            while not done.is_set():
                first = await store.read_thread(
                    b.read(
                        scope,
                        tid,
                        messages={"type": "page", "view": "raw", "page": {"limit": 3}},
                    )
                )
                assert first.thread is not None
                assert first.messages is not None
                assert first.messages.version == first.thread.version
                anchor = first.thread.version.revision
                ids = [m.message_id for m in first.messages.items]
                token = first.messages.next_page_token
                while token is not None:
                    page = await store.read_thread(
                        b.read(
                            scope,
                            tid,
                            messages={
                                "type": "page",
                                "view": "raw",
                                "page": {"limit": 3, "pageToken": token},
                            },
                        )
                    )
                    assert page.thread is not None
                    assert page.messages is not None
                    assert page.messages.version == page.thread.version
                    ids.extend(m.message_id for m in page.messages.items)
                    token = page.messages.next_page_token
                    await asyncio.sleep(0)
                assert ids == [f"m{i}" for i in range(1, anchor + 1)]
                paged.append(anchor)
                await asyncio.sleep(0)

        await asyncio.gather(write(), read_whole(seen[0]), read_whole(seen[1]), read_paged())
        for revisions in seen:
            assert revisions[-1] == total
            assert revisions == sorted(revisions), "a reader saw the thread go back in time"
        observed = set(seen[0]) | set(seen[1])
        assert len(observed) >= 2, f"the readers never observed the writes: {seen}"
        assert any(anchor > 3 for anchor in paged), f"no multi-page read completed: {paged}"


class TestIsolation:
    """Nothing in one scope can be read, listed, changed or deleted through another."""

    async def _populate(self, store: ThreadStore, scope: str, tid: str) -> CommittedResult:
        result = await store.commit_thread(
            b.create(
                scope,
                tid,
                {
                    "messages": [
                        b.insert(b.message("m1", run_id="r1")),
                        b.insert(b.message("m2", role="assistant", run_id="r1", relation="output")),
                        b.insert(b.message("m3", role="assistant", run_id="r1", relation="output")),
                    ],
                    "runs": [
                        b.insert(b.run("r1", "running", inputs=["m1"])),
                        b.insert(b.run("r2", "queued", queue_item_id="q1")),
                    ],
                    "queuedItems": [b.insert(b.queued_item("q1", "r2", "next"))],
                    "lease": b.acquire("r1", "w1"),
                },
                title=f"owned by {scope}",
                category="cat",
                metadata={"scope": scope},
            )
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        return result

    @pytest.mark.parametrize(
        ("suffix_a", "tid_a", "suffix_b", "tid_b"),
        [
            ("", "t", "-other", "t"),
            ("/a", "b/c", "/a/b", "c"),
            ("", "t", "\x00", "t"),
            (".x", "$t", ".x$", "t"),
        ],
    )
    async def test_other_scope_cannot_see_or_touch(
        self, store: ThreadStore, suffix_a: str, tid_a: str, suffix_b: str, tid_b: str
    ) -> None:
        base = new_scope()
        scope_a, scope_b = base + suffix_a, base + suffix_b
        created = await self._populate(store, scope_a, tid_a)
        assert created.thread is not None
        version = created.thread.version
        before = await store.read_thread(b.read(scope_a, tid_a, **_all_pages()))

        # not readable
        for tid in {tid_a, tid_b}:
            other = await store.read_thread(b.read(scope_b, tid, **_all_pages()))
            assert other.thread is None
            assert other.messages is None
            assert other.runs is None
            assert other.queued_items is None
        # not listable
        for hidden in (False, True):
            listed = await store.list_threads(
                {"scopeKey": scope_b, "limit": 100, "includeHidden": hidden}
            )
            assert listed.items == []
            assert listed.next_page_token is None
        # not writable or deletable (the thread is missing there)
        for tid in {tid_a, tid_b}:
            update = await store.commit_thread(
                b.update_at(
                    scope_b,
                    tid,
                    version,
                    {
                        "messages": [
                            b.insert(
                                b.message("m4", role="assistant", run_id="r1", relation="output")
                            )
                        ]
                    },
                    root=b.root(title="hijacked"),
                )
            )
            assert isinstance(update, ConflictResult)
            assert update.current_version is None
            removed = await store.commit_thread(b.delete(scope_b, tid, version))
            assert isinstance(removed, ConflictResult)
            assert removed.current_version is None
        after = await store.read_thread(b.read(scope_a, tid_a, **_all_pages()))
        assert after.to_json() | {"observedAt": None} == before.to_json() | {"observedAt": None}

        # the same thread id in scope B is a separate thread
        twin = await self._populate(store, scope_b, tid_a)
        assert twin.thread is not None
        assert twin.thread.version.revision == 1
        assert twin.thread.version.thread_instance_id != version.thread_instance_id
        # updating A's version in B conflicts (instance ids differ)
        cross = await store.commit_thread(
            b.update_at(scope_b, tid_a, version, root=b.root(title="x"))
        )
        assert isinstance(cross, ConflictResult)
        assert cross.current_version == twin.thread.version
        # deleting B's twin leaves A intact
        gone = await store.commit_thread(b.delete(scope_b, tid_a, twin.thread.version))
        assert isinstance(gone, CommittedResult)
        assert gone.thread is None
        still = await store.read_thread(b.read(scope_a, tid_a, **_all_pages()))
        assert still.to_json() | {"observedAt": None} == before.to_json() | {"observedAt": None}
        listed_a = await store.list_threads({"scopeKey": scope_a, "limit": 100})
        assert [(t.scope_key, t.thread_id) for t in listed_a.items] == [(scope_a, tid_a)]
        listed_b = await store.list_threads({"scopeKey": scope_b, "limit": 100})
        assert listed_b.items == []

    async def test_child_page_token_is_bound_to_its_scope(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope("a"), new_scope("b")
        await self._populate(store, scope_a, "t")
        await self._populate(store, scope_b, "t")
        selections = {
            "messages": {"type": "page", "view": "raw", "page": {"limit": 1}},
            "runs": {"type": "page", "page": {"limit": 1}},
        }
        for family, selection in selections.items():
            first = await store.read_thread(b.read(scope_a, "t", **{family: selection}))
            page = first.messages if family == "messages" else first.runs
            assert page is not None
            assert page.next_page_token is not None
            token = page.next_page_token
            continued = {**selection, "page": {"limit": 1, "pageToken": token}}
            # the token works in its own scope
            ok = await store.read_thread(b.read(scope_a, "t", **{family: continued}))
            assert ok.thread is not None
            # and is rejected in another scope holding an identical thread
            with pytest.raises(ThreadStorePageTokenError):
                await store.read_thread(b.read(scope_b, "t", **{family: continued}))

    async def test_list_token_is_bound_to_its_scope(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope("a"), new_scope("b")
        for tid in ("t1", "t2", "t3"):
            await self._populate(store, scope_a, tid)
            await self._populate(store, scope_b, tid)
        first = await store.list_threads({"scopeKey": scope_a, "limit": 1})
        assert len(first.items) == 1
        assert first.next_page_token is not None
        token = first.next_page_token
        second = await store.list_threads({"scopeKey": scope_a, "limit": 1, "pageToken": token})
        assert len(second.items) == 1
        assert second.items[0].thread_id != first.items[0].thread_id
        assert second.items[0].scope_key == scope_a
        with pytest.raises(ThreadStorePageTokenError):
            await store.list_threads({"scopeKey": scope_b, "limit": 1, "pageToken": token})
