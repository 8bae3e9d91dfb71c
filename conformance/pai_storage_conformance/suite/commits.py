"""Commits (docs/commits.md): create, update, delete, stamping, change rules, conflicts."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ManualClock,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ThreadVersion,
)
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from ._support import new_scope

__all__ = ["TestConflicts", "TestCreateUpdateDelete"]

pytestmark = pytest.mark.asyncio


async def _create(
    store: ThreadStore,
    scope: str,
    thread: str = "t1",
    changes: dict[str, Any] | None = None,
    **root: Any,
) -> ThreadRecord:
    result = await store.commit_thread(b.create(scope, thread, changes, **root))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def _update(
    store: ThreadStore,
    scope: str,
    version: ThreadVersion,
    changes: dict[str, Any] | None = None,
    thread: str = "t1",
    **root: Any,
) -> CommittedResult:
    result = await store.commit_thread(
        b.update_at(scope, thread, version, changes, root=b.root(**root))
    )
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result


async def _read_all(store: ThreadStore, scope: str, thread: str = "t1") -> ThreadReadResult:
    return await store.read_thread(
        b.read(
            scope,
            thread,
            messages={"type": "page", "view": "raw", "page": {"limit": 100}},
            runs={"type": "page", "page": {"limit": 100}},
            queuedItems={"type": "page", "page": {"limit": 100}},
        )
    )


def _ids(result: ThreadReadResult) -> tuple[list[str], list[str], list[str]]:
    assert result.messages is not None
    assert result.runs is not None
    assert result.queued_items is not None
    return (
        [m.message_id for m in result.messages.items],
        [r.run_id for r in result.runs.items],
        [q.queue_item_id for q in result.queued_items.items],
    )


async def _messages(store: ThreadStore, scope: str, thread: str = "t1") -> list[str]:
    return _ids(await _read_all(store, scope, thread))[0]


def _three_messages() -> dict[str, Any]:
    return {"messages": [b.insert(b.message(f"m{i}")) for i in (1, 2, 3)]}


VIA = pytest.mark.parametrize("via", ["json", "model"])
"""Run a test with its commit inputs as JSON dicts and as parsed models."""


def _as(via: str, commit: dict[str, Any]) -> dict[str, Any] | CommitThreadInput:
    """``commit`` as given (``"json"``) or parsed into its model (``"model"``)."""
    return commit if via == "json" else CommitThreadInput.model_validate(commit)


class TestCreateUpdateDelete:
    """Create, update and delete; stamping; mechanical change rules."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    # ------------------------------------------------------------ roots

    async def test_create_round_trips_every_root_field(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        result = await store.commit_thread(
            b.create(
                scope,
                "t1",
                agent="planner",
                visibility="hidden",
                directExecutionAllowed=False,
                parentThreadId="parent-1",
                category="work",
                title="A title",
                metadata={"m": 1},
                privateMetadata={"p": [True]},
            )
        )
        assert isinstance(result, CommittedResult)
        assert result.type == "committed"
        assert result.committed_at == clock()
        root = result.thread
        assert root is not None
        assert root.scope_key == scope
        assert root.thread_id == "t1"
        assert root.agent == "planner"
        assert root.direct_execution_allowed is False
        assert root.parent_thread_id == "parent-1"
        assert root.list_visibility == "hidden"
        assert root.category == "work"
        assert root.title == "A title"
        assert root.metadata == {"m": 1}
        assert root.private_metadata == {"p": [True]}
        assert root.lease is None
        assert root.created_at == root.updated_at == clock()
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread == root

    async def test_create_minimal_root_omits_optional_fields(self, store: ThreadStore) -> None:
        scope = new_scope()
        root = await _create(store, scope)
        assert root.parent_thread_id is None
        assert root.category is None
        assert root.title is None
        assert root.direct_execution_allowed is True
        assert root.list_visibility == "visible"
        assert root.metadata == {}
        assert root.private_metadata == {}

    async def test_update_replaces_complete_mutable_root(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(
            store,
            scope,
            agent="planner",
            directExecutionAllowed=False,
            parentThreadId="parent-1",
            category="work",
            title="old",
            metadata={"keep": "no", "x": 1},
            privateMetadata={"secret": 1},
        )
        clock.advance(ms=250)
        result = await _update(
            store, scope, created.version, visibility="hidden", metadata={"new": True}
        )
        root = result.thread
        assert root is not None
        assert root.category is None
        assert root.title is None
        assert root.metadata == {"new": True}
        assert root.private_metadata == {}
        assert root.list_visibility == "hidden"
        # creation-only fields are kept
        assert root.agent == "planner"
        assert root.direct_execution_allowed is False
        assert root.parent_thread_id == "parent-1"
        json = root.to_json()
        assert "category" not in json
        assert "title" not in json
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread == root

    async def test_update_sets_category_and_title(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        result = await _update(store, scope, created.version, category="c2", title="t2")
        assert result.thread is not None
        assert (result.thread.category, result.thread.title) == ("c2", "t2")

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("agent", "other"),
            ("directExecutionAllowed", False),
            ("parentThreadId", "p2"),
        ],
    )
    async def test_creation_only_field_in_update_is_invariant_error(
        self, store: ThreadStore, field: str, value: Any
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope, title="before")
        with pytest.raises(ThreadStoreInvariantError, match=field):
            await store.commit_thread(
                b.update_at(
                    scope, "t1", created.version, root=b.root(title="after", **{field: value})
                )
            )
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread == created

    async def test_updated_at_is_committed_at_and_created_at_kept(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        t0 = clock()
        clock.advance(ms=1234)
        result = await _update(store, scope, created.version, title="x")
        assert result.committed_at == clock()
        assert result.thread is not None
        assert result.thread.updated_at == result.committed_at
        assert result.thread.created_at == t0
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        assert read.thread.updated_at == clock()
        assert read.thread.created_at == t0

    async def test_timestamps_are_truncated_to_milliseconds(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        clock.set(datetime.fromisoformat("2031-02-03T04:05:06.789+00:00"))
        created = await _create(store, scope)
        assert created.created_at == datetime.fromisoformat("2031-02-03T04:05:06.789+00:00")
        assert created.created_at.microsecond % 1000 == 0
        assert created.created_at.utcoffset() is not None

    async def test_a_clock_between_milliseconds_stamps_whole_milliseconds(
        self, store: ThreadStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # ManualClock.set truncates; a provider clock does not. Put microseconds in
        # the clock itself so the store's own truncation is what is checked, for
        # every stamp a commit or a read makes.
        def between(moment: str) -> datetime:
            value = datetime.fromisoformat(moment)
            monkeypatch.setattr(clock, "_now", value)
            assert clock() == value
            return value.replace(microsecond=value.microsecond // 1000 * 1000)

        scope = new_scope()
        t0 = between("2031-02-03T04:05:06.789999+00:00")
        created = await _create(
            store,
            scope,
            changes={
                "messages": [b.insert(b.message("m1", run_id="r1"))],
                "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
                "lease": b.acquire("r1", "w1", 1_000),
            },
        )
        t1 = between("2031-02-03T04:05:07.000500+00:00")
        done = await _update(
            store,
            scope,
            created.version,
            {
                "runs": [b.replace(b.run("r1", "completed", inputs=["m1"]))],
                "lease": b.release("r1", "w1", "any"),
            },
        )
        t2 = between("2031-02-03T04:05:07.123456+00:00")
        read = await _read_all(store, scope)
        assert created.lease is not None
        assert (created.created_at, created.lease.acquired_at) == (t0, t0)
        assert created.lease.expires_at == t0 + timedelta(seconds=1)
        assert done.committed_at == t1
        assert read.observed_at == t2
        assert read.thread is not None
        assert read.thread.updated_at == t1
        assert read.messages is not None
        assert read.runs is not None
        run = read.runs.items[0]
        assert (run.admission.admitted_at, run.finished_at, run.updated_at) == (t0, t1, t1)
        assert read.messages.items[0].created_at == t0
        json = read.to_json()
        assert json["observedAt"] == "2031-02-03T04:05:07.123Z"
        assert json["runs"]["items"][0]["finishedAt"] == "2031-02-03T04:05:07.000Z"

    async def test_committed_at_never_goes_backwards_within_a_thread(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        # A clock that steps back (or a server whose clock lags) stamps the commit
        # with the thread's updatedAt instead: commit times, every stamp of the
        # commit and lease times stay monotonic within the thread.
        scope = new_scope()
        created = await _create(store, scope, changes={"messages": [b.insert(b.message("m1"))]})
        t0 = created.updated_at
        clock.set(t0 - timedelta(hours=1))
        result = await _update(
            store,
            scope,
            created.version,
            {
                "messages": [b.insert(b.message("m2", run_id="r1"))],
                "runs": [b.insert(b.run("r1", "running", inputs=["m2"]))],
                "lease": b.acquire("r1", "w1", 1_000),
            },
            title="stepped back",
        )
        assert result.committed_at == t0
        assert result.thread is not None
        assert result.thread.updated_at == t0
        assert result.thread.created_at == t0
        lease = result.thread.lease
        assert lease is not None
        assert lease.acquired_at == t0
        assert lease.expires_at == t0 + timedelta(seconds=1)
        read = await _read_all(store, scope)
        assert read.messages is not None
        assert read.runs is not None
        assert read.messages.items[1].created_at == t0
        assert read.runs.items[0].admission.admitted_at == t0
        # the clock moves on, still behind: the lease is judged at the clamped time
        clock.advance(ms=30 * 60_000)
        renewed = await _update(
            store, scope, result.thread.version, {"lease": b.renew("r1", "w1", 2_000)}
        )
        assert renewed.committed_at == t0
        assert renewed.thread is not None
        assert renewed.thread.lease is not None
        assert renewed.thread.lease.renewed_at == t0
        # a delete is stamped the same way
        deleted = await store.commit_thread(b.delete(scope, "t1", renewed.thread.version))
        assert isinstance(deleted, CommittedResult)
        assert deleted.committed_at == t0
        # once the clock passes updatedAt again, commits take its time
        later = t0 + timedelta(seconds=5)
        clock.set(later)
        again = await _create(store, scope)
        assert again.created_at == later

    # ------------------------------------------------------------ child stamps

    async def test_message_created_at_kept_by_replace(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        t0 = clock()
        created = await _create(
            store, scope, changes={"messages": [b.insert(b.message("m1", "v1"))]}
        )
        clock.advance(ms=500)
        result = await _update(
            store, scope, created.version, {"messages": [b.replace(b.message("m1", "v2"))]}
        )
        read = await _read_all(store, scope)
        assert read.messages is not None
        message = read.messages.items[0]
        assert message.created_at == t0
        assert message.updated_at == result.committed_at == clock()
        assert getattr(message.parts[0], "text", None) == "v2"

    async def test_message_insert_stamps_both_timestamps(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        clock.advance(ms=42)
        await _update(store, scope, created.version, {"messages": [b.insert(b.message("m1"))]})
        read = await _read_all(store, scope)
        assert read.messages is not None
        message = read.messages.items[0]
        assert message.created_at == message.updated_at == clock()

    async def test_untouched_message_keeps_updated_at(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        t0 = clock()
        created = await _create(store, scope, changes={"messages": [b.insert(b.message("m1"))]})
        clock.advance(ms=10)
        await _update(store, scope, created.version, {"messages": [b.insert(b.message("m2"))]})
        read = await _read_all(store, scope)
        assert read.messages is not None
        assert read.messages.items[0].updated_at == t0
        assert read.messages.items[1].updated_at == clock()

    async def test_run_admitted_at_and_finished_at_lifecycle(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        t0 = clock()
        created = await _create(
            store,
            scope,
            changes={
                "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1", "payload"))],
            },
        )
        read = await _read_all(store, scope)
        assert read.runs is not None
        run = read.runs.items[0]
        assert run.admission.admitted is False
        assert run.admission.admitted_at is None
        assert run.finished_at is None
        assert run.created_at == run.updated_at == t0
        assert "admittedAt" not in run.to_json()["admission"]
        assert "finishedAt" not in run.to_json()

        # Admit: delete the queued item, insert the input, run becomes running.
        t1 = clock.advance(ms=100)
        admitted = await _update(
            store,
            scope,
            created.version,
            {
                "messages": [b.insert(b.message("m1", run_id="r1"))],
                "runs": [b.replace(b.run("r1", "running", inputs=["m1"], queue_item_id="q1"))],
                "queuedItems": [b.delete_record("q1")],
            },
        )
        run = (await _read_all(store, scope)).runs.items[0]  # type: ignore[union-attr]
        assert run.admission.admitted_at == t1
        assert run.finished_at is None
        assert run.created_at == t0
        assert run.updated_at == t1

        # Complete: admitted_at kept, finished_at stamped.
        t2 = clock.advance(ms=100)
        assert admitted.thread is not None
        completed = await _update(
            store,
            scope,
            admitted.thread.version,
            {"runs": [b.replace(b.run("r1", "completed", inputs=["m1"], queue_item_id="q1"))]},
        )
        run = (await _read_all(store, scope)).runs.items[0]  # type: ignore[union-attr]
        assert run.admission.admitted_at == t1
        assert run.finished_at == t2

        # Replace while still terminal (another terminal status): finished_at kept.
        t3 = clock.advance(ms=100)
        assert completed.thread is not None
        still = await _update(
            store,
            scope,
            completed.thread.version,
            {
                "runs": [
                    b.replace(
                        b.run(
                            "r1",
                            "failed",
                            inputs=["m1"],
                            queue_item_id="q1",
                            metadata={"n": 1},
                        )
                    )
                ]
            },
        )
        run = (await _read_all(store, scope)).runs.items[0]  # type: ignore[union-attr]
        assert run.finished_at == t2
        assert run.updated_at == t3
        assert run.admission.admitted_at == t1

        # Regenerate: leaving terminal removes finished_at; admitted_at kept.
        clock.advance(ms=100)
        assert still.thread is not None
        await _update(
            store,
            scope,
            still.thread.version,
            {
                "runs": [
                    b.replace(
                        b.run(
                            "r1",
                            "running",
                            inputs=["m1"],
                            queue_item_id="q1",
                            operation="regenerate",
                        )
                    )
                ]
            },
        )
        run = (await _read_all(store, scope)).runs.items[0]  # type: ignore[union-attr]
        assert run.finished_at is None
        assert "finishedAt" not in run.to_json()
        assert run.admission.admitted_at == t1
        assert run.operation == "regenerate"

    async def test_run_inserted_terminal_is_stamped(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        await _create(store, scope, changes={"runs": [b.insert(b.run("r1", "completed"))]})
        read = await _read_all(store, scope)
        assert read.runs is not None
        run = read.runs.items[0]
        assert run.admission.admitted_at == clock()
        assert run.finished_at == clock()

    async def test_run_cancelled_before_admission(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(
            store,
            scope,
            changes={
                "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
            },
        )
        t1 = clock.advance(ms=7)
        await _update(
            store,
            scope,
            created.version,
            {
                "runs": [b.replace(b.run("r1", "cancelled", queue_item_id="q1", admitted=False))],
                "queuedItems": [b.delete_record("q1")],
            },
        )
        read = await _read_all(store, scope)
        assert read.runs is not None
        run = read.runs.items[0]
        assert run.admission.admitted is False
        assert run.admission.admitted_at is None
        assert run.finished_at == t1

    async def test_queued_item_created_at(self, store: ThreadStore, clock: ManualClock) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        t1 = clock.advance(ms=20)
        first = await _update(
            store,
            scope,
            created.version,
            {
                "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1", {"v": 1}))],
            },
        )
        clock.advance(ms=20)
        assert first.thread is not None
        await _update(
            store,
            scope,
            first.thread.version,
            {"queuedItems": [b.replace(b.queued_item("q1", "r1", {"v": 2}))]},
        )
        read = await _read_all(store, scope)
        assert read.queued_items is not None
        item = read.queued_items.items[0]
        assert item.created_at == t1
        assert item.input == {"v": 2}

    # ------------------------------------------------------------ mechanical errors

    @pytest.mark.parametrize(
        ("changes", "named"),
        [
            ({"messages": [b.insert(b.message("m2"))]}, "m2"),
            ({"messages": [b.replace(b.message("m9"))]}, "m9"),
            ({"messages": [b.delete_record("m9")]}, "m9"),
            ({"messages": [b.truncate("m9")]}, "m9"),
            ({"messages": [b.delete_record("m1"), b.delete_record("m1")]}, "m1"),
            ({"messages": [b.delete_record("m3"), b.replace(b.message("m3"))]}, "m3"),
            ({"messages": [b.truncate("m1"), b.replace(b.message("m2"))]}, "m2"),
            ({"messages": [b.truncate(None), b.truncate("m1")]}, "m1"),
            (
                {"runs": [b.insert(b.run("r1", "completed")), b.insert(b.run("r1", "completed"))]},
                "r1",
            ),
            ({"runs": [b.replace(b.run("r9", "completed"))]}, "r9"),
            ({"runs": [b.delete_record("r9")]}, "r9"),
            ({"runs": [b.truncate("r9")]}, "r9"),
            ({"queuedItems": [b.replace(b.queued_item("q9", "r1"))]}, "q9"),
            ({"queuedItems": [b.delete_record("q9")]}, "q9"),
        ],
    )
    async def test_mechanical_error_applies_nothing(
        self, store: ThreadStore, changes: dict[str, Any], named: str
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages(), title="before")
        before = await _read_all(store, scope)
        # A valid change first, so a partial apply would be visible.
        changes = {**changes}
        if "messages" in changes:
            changes["messages"] = [b.insert(b.message("extra")), *changes["messages"]]
        else:
            changes["messages"] = [b.insert(b.message("extra"))]
        with pytest.raises(ThreadStoreInvariantError, match=named):
            await store.commit_thread(
                b.update_at(scope, "t1", created.version, changes, root=b.root(title="after"))
            )
        after = await _read_all(store, scope)
        assert after.thread == created
        assert _ids(after) == _ids(before) == (["m1", "m2", "m3"], [], [])

    async def test_insert_of_existing_id_on_create_is_invariant_error(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError, match="m1"):
            await store.commit_thread(
                b.create(
                    scope,
                    "t1",
                    {"messages": [b.insert(b.message("m1")), b.insert(b.message("m1"))]},
                )
            )
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None

    @pytest.mark.parametrize(
        ("changes", "named"),
        [
            ({"messages": [b.replace(b.message("m1"))]}, "m1"),
            ({"runs": [b.delete_record("r1")]}, "r1"),
            ({"messages": [b.truncate("m1")]}, "m1"),
            ({"queuedItems": [b.delete_record("q1")]}, "q1"),
            (
                {
                    "messages": [
                        b.insert(b.message("a")),
                        b.delete_record("a"),
                        b.delete_record("a"),
                    ]
                },
                "a",
            ),
        ],
    )
    async def test_create_judges_changes_against_an_empty_thread(
        self, store: ThreadStore, changes: dict[str, Any], named: str
    ) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError, match=named):
            await store.commit_thread(b.create(scope, "t1", changes))
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None

    async def test_create_applies_changes_in_list_order(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _create(
            store,
            scope,
            changes={
                "messages": [
                    b.truncate(None),
                    b.insert(b.message("a")),
                    b.insert(b.message("b")),
                    b.truncate(None),
                    b.insert(b.message("c")),
                    b.insert(b.message("d")),
                    b.delete_record("c"),
                    b.replace(b.message("d", "edited")),
                ],
                "runs": [
                    b.insert(b.run("r1", "queued", queue_item_id="q1")),
                    b.replace(b.run("r1", "queued", queue_item_id="q1", metadata={"v": 2})),
                ],
                "queuedItems": [
                    b.insert(b.queued_item("q1", "r1", 1)),
                    b.replace(b.queued_item("q1", "r1", 2)),
                ],
            },
        )
        read = await _read_all(store, scope)
        assert _ids(read) == (["d"], ["r1"], ["q1"])
        assert read.messages is not None
        assert read.runs is not None
        assert read.queued_items is not None
        assert getattr(read.messages.items[0].parts[0], "text", None) == "edited"
        assert read.runs.items[0].metadata == {"v": 2}
        assert read.queued_items.items[0].input == 2

    async def test_truncate_null_removes_all(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(
            store,
            scope,
            changes={
                **_three_messages(),
                "runs": [b.insert(b.run(f"r{i}", "completed")) for i in (1, 2)],
            },
        )
        await _update(
            store,
            scope,
            created.version,
            {"messages": [b.truncate(None)], "runs": [b.truncate(None)]},
        )
        assert _ids(await _read_all(store, scope)) == ([], [], [])

    async def test_truncate_after_id_removes_later_records(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(
            store,
            scope,
            changes={
                "messages": [b.insert(b.message(f"m{i}")) for i in range(1, 6)],
                "runs": [b.insert(b.run(f"r{i}", "completed")) for i in (1, 2, 3)],
            },
        )
        await _update(
            store,
            scope,
            created.version,
            {"messages": [b.truncate("m2")], "runs": [b.truncate("r1")]},
        )
        assert _ids(await _read_all(store, scope)) == (["m1", "m2"], ["r1"], [])

    async def test_truncate_after_last_removes_nothing(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        result = await _update(store, scope, created.version, {"messages": [b.truncate("m3")]})
        assert result.thread is not None
        assert result.thread.version.revision == 2
        assert await _messages(store, scope) == ["m1", "m2", "m3"]

    async def test_truncate_removes_records_inserted_earlier_in_the_commit(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        await _update(
            store,
            scope,
            created.version,
            {"messages": [b.insert(b.message("m4")), b.truncate("m2"), b.insert(b.message("m5"))]},
        )
        assert await _messages(store, scope) == ["m1", "m2", "m5"]

    async def test_truncate_on_queued_items_rejected(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(
            store,
            scope,
            changes={
                "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
            },
        )
        with pytest.raises(ThreadStoreInvariantError, match="queuedItems"):
            await store.commit_thread(
                b.update_at(
                    scope, "t1", created.version, {"queuedItems": [b.truncate(None)]}, root=b.root()
                )
            )
        assert _ids(await _read_all(store, scope)) == ([], ["r1"], ["q1"])

    # ------------------------------------------------------------ change order

    async def test_insert_then_replace_in_one_commit(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        clock.advance(ms=3)
        await _update(
            store,
            scope,
            created.version,
            {
                "messages": [
                    b.insert(b.message("m1", "first")),
                    b.replace(b.message("m1", "second")),
                ]
            },
        )
        read = await _read_all(store, scope)
        assert read.messages is not None
        [message] = read.messages.items
        assert getattr(message.parts[0], "text", None) == "second"
        assert message.created_at == message.updated_at == clock()

    async def test_insert_then_delete_in_one_commit(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        await _update(
            store,
            scope,
            created.version,
            {"messages": [b.insert(b.message("m4")), b.delete_record("m4")]},
        )
        assert await _messages(store, scope) == ["m1", "m2", "m3"]

    async def test_delete_then_insert_same_id_appends(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        await _update(
            store,
            scope,
            created.version,
            {"messages": [b.delete_record("m1"), b.insert(b.message("m1"))]},
        )
        assert await _messages(store, scope) == ["m2", "m3", "m1"]
        newest = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages={"type": "page", "view": "raw", "order": "newest", "page": {"limit": 2}},
            )
        )
        assert newest.messages is not None
        assert [m.message_id for m in newest.messages.items] == ["m1", "m3"]

    async def test_inserts_append_in_list_order(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        await _update(
            store,
            scope,
            created.version,
            {
                "messages": [
                    b.insert(b.message("z")),
                    b.insert(b.message("a")),
                    b.insert(b.message("k")),
                ]
            },
        )
        assert await _messages(store, scope) == ["m1", "m2", "m3", "z", "a", "k"]

    async def test_rules_are_checked_on_the_result_not_per_family(self, store: ThreadStore) -> None:
        # Messages apply before runs: a message naming a run inserted later in
        # the same commit is valid because the rules check the final state.
        scope = new_scope()
        await _create(
            store,
            scope,
            changes={
                "messages": [
                    b.insert(b.message("m1", run_id="r1")),
                    b.insert(b.message("m2", role="assistant", run_id="r1", relation="output")),
                ],
                "runs": [b.insert(b.run("r1", "completed", inputs=["m1"]))],
            },
        )
        assert _ids(await _read_all(store, scope)) == (["m1", "m2"], ["r1"], [])

    async def test_relationship_violation_applies_nothing(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages(), title="before")
        with pytest.raises(ThreadStoreInvariantError):
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t1",
                    created.version,
                    {"messages": [b.insert(b.message("m4", run_id="ghost"))]},
                    root=b.root(title="after"),
                )
            )
        after = await _read_all(store, scope)
        assert after.thread == created
        assert _ids(after)[0] == ["m1", "m2", "m3"]

    # ------------------------------------------------------------ delete

    async def test_delete_result_and_missing_after(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        clock.advance(ms=9)
        result = await store.commit_thread(b.delete(scope, "t1", created.version))
        assert isinstance(result, CommittedResult)
        assert result.thread is None
        assert result.committed_at == clock()
        read = await _read_all(store, scope)
        assert read.thread is None
        assert read.messages is None
        listed = await store.list_threads({"scopeKey": scope, "limit": 10, "includeHidden": True})
        assert listed.items == []

    async def test_delete_removes_only_that_thread(self, store: ThreadStore) -> None:
        scope = new_scope()
        full = {
            **_three_messages(),
            "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
            "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
        }
        doomed = await _create(store, scope, "doomed", full)
        survivor = await _create(store, scope, "survivor", full)
        await store.commit_thread(b.delete(scope, "doomed", doomed.version))
        kept = await _read_all(store, scope, "survivor")
        assert kept.thread == survivor
        assert _ids(kept) == (["m1", "m2", "m3"], ["r1"], ["q1"])
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert [t.thread_id for t in listed.items] == ["survivor"]

        recreated = await _create(store, scope, "doomed")
        fresh = await _read_all(store, scope, "doomed")
        assert fresh.thread == recreated
        assert _ids(fresh) == ([], [], [])
        by_id = await store.read_thread(
            b.read(
                scope,
                "doomed",
                messages={"type": "ids", "messageIds": ["m1", "m2", "m3"]},
                runs={"type": "ids", "runIds": ["r1"]},
                queuedItems={"type": "ids", "queueItemIds": ["q1"]},
            )
        )
        assert _ids(by_id) == ([], [], [])

    async def test_recreated_thread_accepts_old_child_ids(self, store: ThreadStore) -> None:
        scope = new_scope()
        doomed = await _create(store, scope, changes=_three_messages())
        await store.commit_thread(b.delete(scope, "t1", doomed.version))
        await _create(store, scope, changes={"messages": [b.insert(b.message("m3"))]})
        assert await _messages(store, scope) == ["m3"]

    # ------------------------------------------------------------ absent fields

    @VIA
    async def test_explicit_null_optional_fields_are_absent(
        self, store: ThreadStore, via: str
    ) -> None:
        # An optional field sent as null is read as absent: never stored or returned as null.
        scope = new_scope()
        message = b.message("m1", run_id="r1")
        message["producer"] = {"kind": "user", "id": None}
        message["parts"] = [
            {"type": "text", "text": "hi", "providerMetadata": None},
            {"type": "file", "mediaType": "text/plain", "url": "u", "filename": None},
            {
                "type": "tool-call",
                "toolCallId": "c1",
                "toolName": "search",
                "input": {},
                "state": "input-available",
                "errorText": None,
                "callProviderMetadata": None,
            },
        ]
        run = b.run("r1", "completed", inputs=["m1"], operation=None)
        run.update({"operation": None, "error": None, "initiator": {"kind": "user", "id": None}})
        run["admission"]["queueItemId"] = None
        result = await store.commit_thread(
            _as(
                via,
                b.create(
                    scope,
                    "t1",
                    {"messages": [b.insert(message)], "runs": [b.insert(run)]},
                    parentThreadId=None,
                    category=None,
                    title=None,
                ),
            )
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        read = await _read_all(store, scope)
        assert read.thread == result.thread
        root = read.thread.to_json()
        for field in ("parentThreadId", "category", "title", "lease"):
            assert field not in root, field
        assert read.messages is not None
        stored_message = read.messages.items[0].to_json()
        assert stored_message["producer"] == {"kind": "user"}
        assert stored_message["parts"] == [
            {"type": "text", "text": "hi"},
            {"type": "file", "mediaType": "text/plain", "url": "u"},
            {
                "type": "tool-call",
                "toolCallId": "c1",
                "toolName": "search",
                "input": {},
                "state": "input-available",
            },
        ]
        assert read.runs is not None
        stored_run = read.runs.items[0].to_json()
        for field in ("operation", "error"):
            assert field not in stored_run, field
        assert stored_run["initiator"] == {"kind": "user"}
        assert "queueItemId" not in stored_run["admission"]
        assert stored_run["admission"] == {"admitted": True, "admittedAt": stored_run["createdAt"]}

    # ------------------------------------------------------------ admission stamps

    @VIA
    async def test_admitted_at_removed_when_admission_turns_false(
        self, store: ThreadStore, clock: ManualClock, via: str
    ) -> None:
        scope = new_scope()
        t0 = clock()
        created = await store.commit_thread(
            _as(
                via,
                b.create(
                    scope, "t1", {"runs": [b.insert(b.run("r1", "cancelled", admitted=True))]}
                ),
            )
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        run = (await _read_all(store, scope)).runs.items[0]  # type: ignore[union-attr]
        assert run.admission.admitted_at == t0
        assert run.finished_at == t0

        clock.advance(ms=10)
        unadmitted = await store.commit_thread(
            _as(
                via,
                b.update_at(
                    scope,
                    "t1",
                    created.thread.version,
                    {"runs": [b.replace(b.run("r1", "cancelled", admitted=False))]},
                    root=b.root(),
                ),
            )
        )
        assert isinstance(unadmitted, CommittedResult)
        assert unadmitted.thread is not None
        run = (await _read_all(store, scope)).runs.items[0]  # type: ignore[union-attr]
        assert run.admission.admitted is False
        assert run.admission.admitted_at is None
        assert "admittedAt" not in run.to_json()["admission"]
        assert run.finished_at == t0  # still terminal: finished once

        t2 = clock.advance(ms=10)
        await _update(
            store,
            scope,
            unadmitted.thread.version,
            {"runs": [b.replace(b.run("r1", "cancelled", admitted=True))]},
        )
        run = (await _read_all(store, scope)).runs.items[0]  # type: ignore[union-attr]
        assert run.admission.admitted_at == t2
        assert run.to_json()["admission"]["admittedAt"] == run.to_json()["updatedAt"]

    # ------------------------------------------------------------ positions

    async def test_replace_keeps_position_in_every_family(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(
            store,
            scope,
            changes={
                **_three_messages(),
                "runs": [
                    b.insert(b.run(f"r{i}", "queued", queue_item_id=f"q{i}")) for i in (1, 2, 3)
                ],
                "queuedItems": [b.insert(b.queued_item(f"q{i}", f"r{i}")) for i in (1, 2, 3)],
            },
        )
        clock.advance(ms=5)
        await _update(
            store,
            scope,
            created.version,
            {
                "messages": [b.replace(b.message("m1", "edited")), b.replace(b.message("m2"))],
                "runs": [
                    b.replace(b.run("r1", "queued", queue_item_id="q1", metadata={"e": 1})),
                    b.replace(b.run("r2", "queued", queue_item_id="q2")),
                ],
                "queuedItems": [b.replace(b.queued_item("q1", "r1", "edited"))],
            },
        )
        read = await _read_all(store, scope)
        assert _ids(read) == (["m1", "m2", "m3"], ["r1", "r2", "r3"], ["q1", "q2", "q3"])
        newest = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages={"type": "page", "view": "raw", "order": "newest", "page": {"limit": 9}},
                runs={"type": "page", "order": "newest", "page": {"limit": 9}},
                queuedItems={"type": "page", "order": "newest", "page": {"limit": 9}},
            )
        )
        assert _ids(newest) == (["m3", "m2", "m1"], ["r3", "r2", "r1"], ["q3", "q2", "q1"])

    @pytest.mark.parametrize("removal", ["delete-last", "truncate-all"])
    async def test_positions_are_never_reused(self, store: ThreadStore, removal: str) -> None:
        # A page token's upper anchor is the family's high-water mark when the first page
        # was read: a record inserted later gets a higher position, even after the records
        # at the top were removed, so it never shows up on a later page.
        scope = new_scope()
        created = await _create(
            store,
            scope,
            changes={
                **_three_messages(),
                "runs": [b.insert(b.run(f"r{i}", "completed")) for i in (1, 2, 3)],
            },
        )
        first = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages={"type": "page", "view": "raw", "page": {"limit": 1}},
                runs={"type": "page", "page": {"limit": 1}},
            )
        )
        assert first.messages is not None
        assert first.runs is not None
        assert [m.message_id for m in first.messages.items] == ["m1"]
        assert [r.run_id for r in first.runs.items] == ["r1"]
        message_token = first.messages.next_page_token
        run_token = first.runs.next_page_token
        assert message_token is not None
        assert run_token is not None

        if removal == "delete-last":
            changes: dict[str, Any] = {
                "messages": [b.delete_record("m3"), b.insert(b.message("m4"))],
                "runs": [b.delete_record("r3"), b.insert(b.run("r4", "completed"))],
            }
            expected_messages, expected_runs = ["m2"], ["r2"]
        else:
            changes = {
                "messages": [
                    b.truncate(None),
                    b.insert(b.message("m4")),
                    b.insert(b.message("m5")),
                ],
                "runs": [
                    b.truncate(None),
                    b.insert(b.run("r4", "completed")),
                    b.insert(b.run("r5", "completed")),
                ],
            }
            expected_messages, expected_runs = [], []
        await _update(store, scope, created.version, changes)

        later = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages={
                    "type": "page",
                    "view": "raw",
                    "page": {"limit": 10, "pageToken": message_token},
                },
                runs={"type": "page", "page": {"limit": 10, "pageToken": run_token}},
            )
        )
        assert later.messages is not None
        assert later.runs is not None
        assert [m.message_id for m in later.messages.items] == expected_messages
        assert [r.run_id for r in later.runs.items] == expected_runs
        assert later.messages.next_page_token is None
        assert later.runs.next_page_token is None
        # a fresh read shows the new records, after every older one
        fresh = _ids(await _read_all(store, scope))
        if removal == "delete-last":
            assert fresh[:2] == (["m1", "m2", "m4"], ["r1", "r2", "r4"])
        else:
            assert fresh[:2] == (["m4", "m5"], ["r4", "r5"])

    async def test_truncate_after_a_record_inserted_in_the_same_commit(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        await _update(
            store,
            scope,
            created.version,
            {
                "messages": [
                    b.insert(b.message("m4")),
                    b.insert(b.message("m5")),
                    b.truncate("m4"),
                ]
            },
        )
        assert await _messages(store, scope) == ["m1", "m2", "m3", "m4"]

    # ------------------------------------------------------------ revisions

    @VIA
    async def test_every_commit_adds_one_even_without_changes(
        self, store: ThreadStore, clock: ManualClock, via: str
    ) -> None:
        scope = new_scope()
        created = await store.commit_thread(_as(via, b.create(scope, "t1", title="same")))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        for revision in (2, 3, 4):
            now = clock.advance(ms=1)
            commit = b.update_at(scope, "t1", version, root=b.root(title="same"))
            if revision == 3:
                commit["mutation"]["changes"] = {"messages": [], "runs": [], "queuedItems": []}
            result = await store.commit_thread(_as(via, commit))
            assert isinstance(result, CommittedResult)
            assert result.thread is not None
            assert result.thread.version == ThreadVersion(
                thread_instance_id=version.thread_instance_id, revision=revision
            )
            assert result.committed_at == result.thread.updated_at == now
            assert result.thread.created_at == created.thread.created_at
            version = result.thread.version
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        assert read.thread.version == version
        assert read.thread.title == "same"


class TestConflicts:
    """A false condition is a conflict with the current version; nothing applied."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    async def test_wrong_revision_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, title="one")
        second = await _update(store, scope, created.version, title="two")
        assert second.thread is not None
        result = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                created.version,
                {"messages": [b.insert(b.message("m1"))]},
                root=b.root(title="stale"),
            )
        )
        assert isinstance(result, ConflictResult)
        assert result.type == "conflict"
        assert result.current_version == second.thread.version
        read = await _read_all(store, scope)
        assert read.thread == second.thread
        assert _ids(read) == ([], [], [])

    async def test_future_revision_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        ahead = ThreadVersion(thread_instance_id=created.version.thread_instance_id, revision=2)
        result = await store.commit_thread(b.update_at(scope, "t1", ahead, root=b.root(title="x")))
        assert isinstance(result, ConflictResult)
        assert result.current_version == created.version

    async def test_wrong_instance_id_with_right_revision_conflicts(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        created = await _create(store, scope, title="original")
        forged = {"threadInstanceId": uuid4().hex, "revision": created.version.revision}
        update = await store.commit_thread(
            b.update_at(scope, "t1", forged, root=b.root(title="forged"))
        )
        assert isinstance(update, ConflictResult)
        assert update.current_version == created.version
        delete = await store.commit_thread(b.delete(scope, "t1", forged))
        assert isinstance(delete, ConflictResult)
        assert delete.current_version == created.version
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread == created

    async def test_create_on_existing_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages(), title="first")
        result = await store.commit_thread(
            b.create(scope, "t1", {"messages": [b.insert(b.message("x"))]}, title="second")
        )
        assert isinstance(result, ConflictResult)
        assert result.current_version == created.version
        read = await _read_all(store, scope)
        assert read.thread == created
        assert _ids(read)[0] == ["m1", "m2", "m3"]

    async def test_create_on_existing_hidden_thread_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, visibility="hidden")
        result = await store.commit_thread(b.create(scope, "t1"))
        assert isinstance(result, ConflictResult)
        assert result.current_version == created.version

    async def test_update_on_missing_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = {"threadInstanceId": uuid4().hex, "revision": 1}
        result = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                version,
                {"messages": [b.insert(b.message("m1"))]},
                root=b.root(title="x"),
            )
        )
        assert isinstance(result, ConflictResult)
        assert result.current_version is None
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None
        listed = await store.list_threads({"scopeKey": scope, "limit": 5, "includeHidden": True})
        assert listed.items == []

    async def test_delete_on_missing_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        result = await store.commit_thread(
            b.delete(scope, "t1", {"threadInstanceId": "abc", "revision": 3})
        )
        assert isinstance(result, ConflictResult)
        assert result.current_version is None

    async def test_delete_after_delete_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        first = await store.commit_thread(b.delete(scope, "t1", created.version))
        assert isinstance(first, CommittedResult)
        second = await store.commit_thread(b.delete(scope, "t1", created.version))
        assert isinstance(second, ConflictResult)
        assert second.current_version is None

    async def test_stale_delete_conflicts_and_keeps_thread(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        updated = await _update(store, scope, created.version, title="new")
        assert updated.thread is not None
        result = await store.commit_thread(b.delete(scope, "t1", created.version))
        assert isinstance(result, ConflictResult)
        assert result.current_version == updated.thread.version
        read = await _read_all(store, scope)
        assert read.thread == updated.thread
        assert _ids(read)[0] == ["m1", "m2", "m3"]

    async def test_conflict_takes_precedence_over_mechanical_errors(
        self, store: ThreadStore
    ) -> None:
        # The condition is judged before the child changes (docs/commits.md#how-a-commit-is-judged:
        # the version differs -> conflict); a stale commit whose changes would
        # also fail mechanically is a conflict, not an error.
        scope = new_scope()
        created = await _create(store, scope)
        updated = await _update(store, scope, created.version, title="x")
        assert updated.thread is not None
        result = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                created.version,
                {"messages": [b.delete_record("missing")]},
                root=b.root(),
            )
        )
        assert isinstance(result, ConflictResult)
        assert result.current_version == updated.thread.version

    async def test_conflict_does_not_bump_revision(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        for _ in range(3):
            stale = await store.commit_thread(
                b.update_at(
                    scope, "t1", {"threadInstanceId": "x", "revision": 1}, root=b.root(title="no")
                )
            )
            assert isinstance(stale, ConflictResult)
        result = await _update(store, scope, created.version, title="yes")
        assert result.thread is not None
        assert result.thread.version.revision == 2

    async def test_conflict_takes_precedence_over_relationship_rules(
        self, store: ThreadStore
    ) -> None:
        # A stale commit is judged by its condition only: changes whose result would break
        # a relationship rule are not looked at, so it is a conflict, not an error.
        scope = new_scope()
        created = await _create(store, scope, changes=_three_messages())
        updated = await _update(store, scope, created.version, title="x")
        assert updated.thread is not None
        result = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                created.version,
                {"messages": [b.insert(b.message("m4", run_id="x"))]},
                root=b.root(),
            )
        )
        assert isinstance(result, ConflictResult)
        assert result.current_version == updated.thread.version
        missing = await store.commit_thread(
            b.update_at(
                scope,
                "absent",
                created.version,
                {"messages": [b.delete_record("m9"), b.insert(b.message("m1", run_id="x"))]},
                root=b.root(),
            )
        )
        assert isinstance(missing, ConflictResult)
        assert missing.current_version is None
        assert _ids(await _read_all(store, scope))[0] == ["m1", "m2", "m3"]

    @VIA
    async def test_conflict_result_json_form(self, store: ThreadStore, via: str) -> None:
        scope = new_scope()
        created = await _create(store, scope)
        stale = {"threadInstanceId": created.version.thread_instance_id, "revision": 7}
        result = await store.commit_thread(
            _as(via, b.update_at(scope, "t1", stale, root=b.root(title="x")))
        )
        assert isinstance(result, ConflictResult)
        assert result.to_json() == {
            "type": "conflict",
            "currentVersion": created.version.to_json(),
        }
        again = await store.commit_thread(_as(via, b.create(scope, "t1")))
        assert isinstance(again, ConflictResult)
        assert again.to_json()["currentVersion"] == {
            "threadInstanceId": created.version.thread_instance_id,
            "revision": 1,
        }

    async def test_judging_order_when_several_things_are_wrong(self, store: ThreadStore) -> None:
        # Mechanics in family order (messages, runs, queued items), then the lease
        # precondition, then the relationship rules of the result.
        scope = new_scope()
        created = await _create(
            store,
            scope,
            changes={
                "messages": [b.insert(b.message("m1"))],
                "runs": [b.insert(b.run("r1", "completed"))],
            },
        )
        version = created.version
        wrong = {
            "messages": [b.delete_record("m9")],
            "runs": [b.delete_record("r9")],
            "queuedItems": [b.delete_record("q9")],
        }
        for family, named in (("messages", "m9"), ("runs", "r9"), ("queuedItems", "q9")):
            with pytest.raises(ThreadStoreInvariantError) as caught:
                await store.commit_thread(b.update_at(scope, "t1", version, wrong, root=b.root()))
            message = str(caught.value)
            assert f"{family}[0]" in message
            assert named in message
            del wrong[family]
        # a mechanical error wins over a lease conflict (there is no lease to renew)
        with pytest.raises(ThreadStoreInvariantError, match="q9"):
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t1",
                    version,
                    {"queuedItems": [b.delete_record("q9")], "lease": b.renew("r1", "w1")},
                    root=b.root(),
                )
            )
        # a lease conflict wins over a broken relationship rule
        conflict = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                version,
                {
                    "messages": [b.insert(b.message("m2", run_id="ghost"))],
                    "lease": b.renew("r1", "w1"),
                },
                root=b.root(),
            )
        )
        assert isinstance(conflict, ConflictResult)
        assert conflict.current_version == version
        read = await _read_all(store, scope)
        assert read.thread == created
        assert _ids(read) == (["m1"], ["r1"], [])
