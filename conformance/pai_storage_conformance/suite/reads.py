"""Reads (docs/reads.md): pages per family, message views and bounds, id selections."""

from __future__ import annotations

from typing import Any

import pytest

from pai_storage import CommittedResult, ManualClock, ReadThreadInput, ThreadRecord, ThreadStore
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.models import MAX_ID_SELECTION_SIZE

from ._support import new_scope

__all__ = ["TestIdSelections", "TestMessageViews", "TestReads"]

pytestmark = pytest.mark.asyncio


async def _commit_create(
    store: ThreadStore, scope: str, thread: str, changes: dict[str, Any] | None = None
) -> ThreadRecord:
    result = await store.commit_thread(b.create(scope, thread, changes))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


def _msg_page(view: str = "raw", limit: int = 100, **extra: Any) -> dict[str, Any]:
    return {"type": "page", "view": view, **extra, "page": {"limit": limit}}


# A transcript with every visibility combination:
#   id   transcript context
#   m1   yes        yes
#   m2   yes        no
#   m3   no         yes
#   m4   no         no
#   m5   yes        yes
#   m6   no         yes
VISIBILITY = {
    "m1": (True, True),
    "m2": (True, False),
    "m3": (False, True),
    "m4": (False, False),
    "m5": (True, True),
    "m6": (False, True),
}
TRANSCRIPT = ["m1", "m2", "m5"]
CONTEXT = ["m1", "m3", "m5", "m6"]
RAW = list(VISIBILITY)


async def _visibility_thread(store: ThreadStore) -> tuple[str, str]:
    scope, thread = new_scope(), "views"
    changes = {
        "messages": [
            b.insert(b.message(mid, transcript=t, context=c)) for mid, (t, c) in VISIBILITY.items()
        ]
    }
    await _commit_create(store, scope, thread, changes)
    return scope, thread


async def _message_ids(
    store: ThreadStore, scope: str, thread: str, selection: dict[str, Any]
) -> list[str]:
    result = await store.read_thread(b.read(scope, thread, messages=selection))
    assert result.messages is not None
    assert result.messages.next_page_token is None
    return [m.message_id for m in result.messages.items]


def _queued_run(run_id: str, item_id: str) -> dict[str, Any]:
    return b.run(run_id, "queued", queue_item_id=item_id)


class TestReads:
    """Missing threads, one page per requested family, one version per result."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    async def test_missing_thread_has_no_root_and_no_pages(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        result = await store.read_thread(
            b.read(
                new_scope(),
                "nope",
                messages=_msg_page(),
                runs={"type": "page", "page": {"limit": 5}},
                queuedItems={"type": "ids", "queueItemIds": ["q1"]},
            )
        )
        assert result.thread is None
        assert result.messages is None
        assert result.runs is None
        assert result.queued_items is None
        assert result.observed_at == clock()

    async def test_observed_at_follows_the_clock(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        await _commit_create(store, scope, "t1")
        clock.advance(ms=1500)
        result = await store.read_thread(b.read(scope, "t1"))
        assert result.observed_at == clock()

    async def test_no_include_returns_no_pages(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _commit_create(store, scope, "t1", {"messages": [b.insert(b.message("m1"))]})
        result = await store.read_thread(b.read(scope, "t1"))
        assert result.thread is not None
        assert result.messages is None
        assert result.runs is None
        assert result.queued_items is None

    async def test_page_only_for_requested_family(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _commit_create(
            store,
            scope,
            "t1",
            {
                "messages": [b.insert(b.message("m1"))],
                "runs": [b.insert(_queued_run("r1", "q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
            },
        )
        only_runs = await store.read_thread(
            b.read(scope, "t1", runs={"type": "page", "page": {"limit": 10}})
        )
        assert only_runs.messages is None
        assert only_runs.queued_items is None
        assert only_runs.runs is not None
        assert [r.run_id for r in only_runs.runs.items] == ["r1"]

        only_queued = await store.read_thread(
            b.read(scope, "t1", queuedItems={"type": "page", "page": {"limit": 10}})
        )
        assert only_queued.messages is None
        assert only_queued.runs is None
        assert only_queued.queued_items is not None
        assert [q.queue_item_id for q in only_queued.queued_items.items] == ["q1"]

        only_messages = await store.read_thread(b.read(scope, "t1", messages=_msg_page()))
        assert only_messages.runs is None
        assert only_messages.queued_items is None
        assert only_messages.messages is not None
        assert [m.message_id for m in only_messages.messages.items] == ["m1"]

    async def test_empty_families_give_empty_pages(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _commit_create(store, scope, "t1")
        result = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages=_msg_page(),
                runs={"type": "page", "page": {"limit": 10}},
                queuedItems={"type": "page", "page": {"limit": 10}},
            )
        )
        for page in (result.messages, result.runs, result.queued_items):
            assert page is not None
            assert page.items == []
            assert page.next_page_token is None
            assert page.version == created.version

    async def test_empty_id_selection_results_are_empty_pages(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _commit_create(store, scope, "t1")
        result = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages={"type": "ids", "messageIds": ["m1"]},
                runs={"type": "ids", "runIds": ["r1"]},
                queuedItems={"type": "ids", "queueItemIds": ["q1"]},
            )
        )
        for page in (result.messages, result.runs, result.queued_items):
            assert page is not None
            assert page.items == []
            assert page.next_page_token is None
            assert page.version == created.version

    async def test_root_and_pages_carry_the_same_version(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _commit_create(
            store, scope, "t1", {"messages": [b.insert(b.message("m1"))]}
        )
        version = created.version
        for index in range(3):
            clock.advance(ms=10)
            result = await store.commit_thread(
                b.update_at(
                    scope,
                    "t1",
                    version,
                    {"messages": [b.insert(b.message(f"n{index}"))]},
                    root=b.root(),
                )
            )
            assert isinstance(result, CommittedResult)
            assert result.thread is not None
            version = result.thread.version
        read = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages=_msg_page(limit=2),
                runs={"type": "page", "page": {"limit": 1}},
                queuedItems={"type": "ids", "queueItemIds": ["q"]},
            )
        )
        assert read.thread is not None
        assert read.thread.version == version
        assert version.revision == 4
        for page in (read.messages, read.runs, read.queued_items):
            assert page is not None
            assert page.version == version

    # ------------------------------------------------------------ inputs and edges

    async def test_missing_thread_ignores_a_missing_anchor(self, store: ThreadStore) -> None:
        # A missing thread gives no pages whatever was requested: its bounds
        # name nothing, and that is not an error.
        result = await store.read_thread(
            b.read(
                new_scope(),
                "nope",
                messages=_msg_page(afterMessageId="m404", beforeMessageId="m405"),
            )
        )
        assert result.thread is None
        assert result.messages is None
        assert result.to_json() == {"observedAt": result.to_json()["observedAt"], "thread": None}

    async def test_empty_include_is_the_root_alone(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _commit_create(
            store, scope, "t1", {"messages": [b.insert(b.message("m1"))]}
        )
        request = {"scopeKey": scope, "threadId": "t1", "include": {}}
        for form in (request, ReadThreadInput.model_validate(request)):
            result = await store.read_thread(form)
            assert result.thread == created
            assert (result.messages, result.runs, result.queued_items) == (None, None, None)
            assert set(result.to_json()) == {"observedAt", "thread"}

    @pytest.mark.parametrize(
        "bounds",
        [
            {"afterMessageId": "m5", "beforeMessageId": "m2"},
            {"afterMessageId": "m3", "beforeMessageId": "m3"},
            {"afterMessageId": "m6", "beforeMessageId": "m1"},
        ],
    )
    @pytest.mark.parametrize("order", ["oldest", "newest"])
    @pytest.mark.parametrize("view", ["raw", "transcript"])
    async def test_bounds_that_leave_no_room_give_an_empty_page(
        self, store: ThreadStore, bounds: dict[str, str], order: str, view: str
    ) -> None:
        scope, thread = await _visibility_thread(store)
        for limit in (1, 100):
            result = await store.read_thread(
                b.read(scope, thread, messages=_msg_page(view, limit, order=order, **bounds))
            )
            assert result.thread is not None
            assert result.messages is not None
            assert result.messages.items == []
            assert result.messages.next_page_token is None
            assert result.messages.version == result.thread.version

    @pytest.mark.parametrize("bound", ["afterMessageId", "beforeMessageId"])
    @pytest.mark.parametrize("bad", ["", "x" * 1025, "m\ud800", 5, ["m1"]], ids=repr)
    async def test_malformed_anchor_is_invariant_error(
        self, store: ThreadStore, bound: str, bad: object
    ) -> None:
        scope, thread = await _visibility_thread(store)
        selection = {"type": "page", "view": "raw", bound: bad, "page": {"limit": 5}}
        for target in (thread, "missing"):
            with pytest.raises(ThreadStoreInvariantError, match=bound):
                await store.read_thread(b.read(scope, target, messages=selection))

    @pytest.mark.parametrize(
        ("family", "key"),
        [("messages", "messageIds"), ("runs", "runIds"), ("queuedItems", "queueItemIds")],
    )
    @pytest.mark.parametrize("bad", ["", "x" * 1025, "a\udc00", 7, None], ids=repr)
    async def test_malformed_id_in_an_id_selection_is_invariant_error(
        self, store: ThreadStore, family: str, key: str, bad: object
    ) -> None:
        scope = new_scope()
        await _commit_create(store, scope, "t1")
        for target in ("t1", "missing"):
            with pytest.raises(ThreadStoreInvariantError, match=key):
                await store.read_thread(
                    b.read(scope, target, **{family: {"type": "ids", key: ["ok", bad]}})
                )

    @pytest.mark.parametrize("bad", ["", "x" * 1025, "r\ud800", 3], ids=repr)
    async def test_malformed_queued_item_run_filter_is_invariant_error(
        self, store: ThreadStore, bad: object
    ) -> None:
        scope = new_scope()
        await _commit_create(store, scope, "t1")
        selection = {"type": "page", "runId": bad, "page": {"limit": 5}}
        with pytest.raises(ThreadStoreInvariantError, match="runId"):
            await store.read_thread(b.read(scope, "t1", queuedItems=selection))

    async def test_empty_statuses_filter_is_invariant_error(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _commit_create(store, scope, "t1")
        selection = {"type": "page", "statuses": [], "page": {"limit": 5}}
        with pytest.raises(ThreadStoreInvariantError, match="statuses"):
            await store.read_thread(b.read(scope, "t1", runs=selection))

    async def test_odd_message_ids_select_and_bound_exactly(self, store: ThreadStore) -> None:
        # Ids that differ only by U+0000, a trailing character or case, with
        # the longest allowed id: ids selections and bounds match them exactly.
        odd = ["a", "a\x00", "\x00", "a\x00b", "A", "a ", "a\uffff", "a\U0001f9f5", "k" * 1024]
        odd += ["\u00e9", "e\u0301"]  # one text, two code-point sequences: two ids
        scope, thread = new_scope(), "odd"
        await _commit_create(
            store, scope, thread, {"messages": [b.insert(b.message(mid, mid)) for mid in odd]}
        )
        wanted = ["k" * 1024, "e\u0301", "a\x00b", "\x00", "missing", "a", "\u00e9"]
        result = await store.read_thread(
            b.read(scope, thread, messages={"type": "ids", "messageIds": wanted})
        )
        assert result.messages is not None
        got = [(m.message_id, getattr(m.parts[0], "text", None)) for m in result.messages.items]
        assert got == [(mid, mid) for mid in wanted if mid != "missing"]
        for index, anchor in enumerate(odd):
            after = await _message_ids(store, scope, thread, _msg_page(afterMessageId=anchor))
            before = await _message_ids(store, scope, thread, _msg_page(beforeMessageId=anchor))
            assert (before, after) == (odd[:index], odd[index + 1 :]), repr(anchor)
        with pytest.raises(ThreadStoreInvariantError):
            await store.read_thread(
                b.read(scope, thread, messages=_msg_page(afterMessageId="a\x01"))
            )

    @pytest.mark.parametrize(
        ("family", "key", "attr", "id_attr"),
        [
            ("messages", "messageIds", "messages", "message_id"),
            ("runs", "runIds", "runs", "run_id"),
            ("queuedItems", "queueItemIds", "queued_items", "queue_item_id"),
        ],
    )
    async def test_hundred_existing_ids_come_back_in_requested_order(
        self, store: ThreadStore, family: str, key: str, attr: str, id_attr: str
    ) -> None:
        scope, thread = new_scope(), "many"
        count = MAX_ID_SELECTION_SIZE
        await _commit_create(
            store,
            scope,
            thread,
            {
                "messages": [b.insert(b.message(f"m{i:03d}")) for i in range(count)],
                "runs": [b.insert(_queued_run(f"r{i:03d}", f"q{i:03d}")) for i in range(count)],
                "queuedItems": [
                    b.insert(b.queued_item(f"q{i:03d}", f"r{i:03d}", i)) for i in range(count)
                ],
            },
        )
        prefix = {"messages": "m", "runs": "r", "queuedItems": "q"}[family]
        # A shuffled order that is neither insertion order nor its reverse.
        order = [(i * 37) % count for i in range(count)]
        ids = [f"{prefix}{i:03d}" for i in order]
        for form in (
            b.read(scope, thread, **{family: {"type": "ids", key: ids}}),
            ReadThreadInput.model_validate(
                b.read(scope, thread, **{family: {"type": "ids", key: ids}})
            ),
        ):
            result = await store.read_thread(form)
            page = getattr(result, attr)
            assert page is not None
            assert [getattr(item, id_attr) for item in page.items] == ids
            assert page.next_page_token is None


class TestMessageViews:
    """raw / transcript / context views, order, and exclusive bounds."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    @pytest.mark.parametrize(
        ("view", "expected"),
        [("raw", RAW), ("transcript", TRANSCRIPT), ("context", CONTEXT)],
    )
    async def test_view_default_order_is_oldest(
        self, store: ThreadStore, view: str, expected: list[str]
    ) -> None:
        scope, thread = await _visibility_thread(store)
        assert await _message_ids(store, scope, thread, _msg_page(view)) == expected
        oldest = _msg_page(view, order="oldest")
        assert await _message_ids(store, scope, thread, oldest) == expected

    @pytest.mark.parametrize(
        ("view", "expected"),
        [("raw", RAW), ("transcript", TRANSCRIPT), ("context", CONTEXT)],
    )
    async def test_view_newest_order(
        self, store: ThreadStore, view: str, expected: list[str]
    ) -> None:
        scope, thread = await _visibility_thread(store)
        newest = _msg_page(view, order="newest")
        assert await _message_ids(store, scope, thread, newest) == expected[::-1]

    async def test_view_follows_replaced_visibility(self, store: ThreadStore) -> None:
        scope, thread = new_scope(), "t1"
        created = await _commit_create(
            store,
            scope,
            thread,
            {"messages": [b.insert(b.message("m1")), b.insert(b.message("m2"))]},
        )
        hidden = b.message("m1", transcript=False, context=True)
        await store.commit_thread(
            b.update_at(
                scope,
                thread,
                created.version,
                {"messages": [{"type": "replace", "record": hidden}]},
                root=b.root(),
            )
        )
        assert await _message_ids(store, scope, thread, _msg_page("transcript")) == ["m2"]
        assert await _message_ids(store, scope, thread, _msg_page("context")) == ["m1", "m2"]
        assert await _message_ids(store, scope, thread, _msg_page("raw")) == ["m1", "m2"]

    async def test_replace_keeps_position(self, store: ThreadStore) -> None:
        scope, thread = new_scope(), "t1"
        created = await _commit_create(
            store,
            scope,
            thread,
            {
                "messages": [
                    b.insert(b.message("m1")),
                    b.insert(b.message("m2")),
                    b.insert(b.message("m3")),
                ]
            },
        )
        await store.commit_thread(
            b.update_at(
                scope,
                thread,
                created.version,
                {"messages": [{"type": "replace", "record": b.message("m1", "edited")}]},
                root=b.root(),
            )
        )
        result = await store.read_thread(b.read(scope, thread, messages=_msg_page()))
        assert result.messages is not None
        assert [m.message_id for m in result.messages.items] == ["m1", "m2", "m3"]
        first = result.messages.items[0].parts[0]
        assert getattr(first, "text", None) == "edited"

    @pytest.mark.parametrize(
        ("view", "bounds", "expected"),
        [
            ("raw", {"afterMessageId": "m2"}, ["m3", "m4", "m5", "m6"]),
            ("raw", {"beforeMessageId": "m3"}, ["m1", "m2"]),
            ("raw", {"afterMessageId": "m2", "beforeMessageId": "m5"}, ["m3", "m4"]),
            ("raw", {"afterMessageId": "m1", "beforeMessageId": "m2"}, []),
            ("raw", {"afterMessageId": "m6"}, []),
            ("raw", {"beforeMessageId": "m1"}, []),
            # Anchors need not be in the view.
            ("transcript", {"afterMessageId": "m3"}, ["m5"]),
            ("transcript", {"beforeMessageId": "m4"}, ["m1", "m2"]),
            ("transcript", {"afterMessageId": "m1", "beforeMessageId": "m6"}, ["m2", "m5"]),
            ("context", {"beforeMessageId": "m2"}, ["m1"]),
            ("context", {"afterMessageId": "m2", "beforeMessageId": "m4"}, ["m3"]),
            ("context", {"afterMessageId": "m4"}, ["m5", "m6"]),
        ],
    )
    async def test_exclusive_bounds(
        self,
        store: ThreadStore,
        view: str,
        bounds: dict[str, Any],
        expected: list[str],
    ) -> None:
        scope, thread = await _visibility_thread(store)
        oldest = _msg_page(view, **bounds)
        assert await _message_ids(store, scope, thread, oldest) == expected
        newest = _msg_page(view, order="newest", **bounds)
        assert await _message_ids(store, scope, thread, newest) == expected[::-1]

    async def test_bounds_with_a_small_page(self, store: ThreadStore) -> None:
        scope, thread = await _visibility_thread(store)
        result = await store.read_thread(
            b.read(
                scope,
                thread,
                messages=_msg_page("raw", limit=1, order="newest", beforeMessageId="m5"),
            )
        )
        assert result.messages is not None
        assert [m.message_id for m in result.messages.items] == ["m4"]
        assert result.messages.next_page_token is not None

    @pytest.mark.parametrize("bound", ["afterMessageId", "beforeMessageId"])
    async def test_missing_anchor_is_invariant_error(self, store: ThreadStore, bound: str) -> None:
        scope, thread = await _visibility_thread(store)
        extra: dict[str, Any] = {bound: "m404"}
        with pytest.raises(ThreadStoreInvariantError, match="m404"):
            await store.read_thread(b.read(scope, thread, messages=_msg_page(**extra)))
        # The store stays usable.
        assert await _message_ids(store, scope, thread, _msg_page("transcript")) == TRANSCRIPT

    async def test_deleted_message_is_a_missing_anchor(self, store: ThreadStore) -> None:
        scope, thread = new_scope(), "t1"
        created = await _commit_create(
            store,
            scope,
            thread,
            {"messages": [b.insert(b.message("m1")), b.insert(b.message("m2"))]},
        )
        await store.commit_thread(
            b.update_at(
                scope,
                thread,
                created.version,
                {"messages": [{"type": "delete", "id": "m1"}]},
                root=b.root(),
            )
        )
        with pytest.raises(ThreadStoreInvariantError, match="m1"):
            await store.read_thread(b.read(scope, thread, messages=_msg_page(afterMessageId="m1")))

    async def test_run_id_is_not_a_message_anchor(self, store: ThreadStore) -> None:
        scope, thread = new_scope(), "t1"
        await _commit_create(
            store,
            scope,
            thread,
            {
                "messages": [b.insert(b.message("m1"))],
                "runs": [b.insert(_queued_run("r1", "q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1"))],
            },
        )
        with pytest.raises(ThreadStoreInvariantError, match="r1"):
            await store.read_thread(b.read(scope, thread, messages=_msg_page(beforeMessageId="r1")))


class TestIdSelections:
    """``ids`` selections: 1..100 distinct ids, requested order, missing omitted."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    async def _thread(self, store: ThreadStore) -> tuple[str, str]:
        scope, thread = new_scope(), "ids"
        await _commit_create(
            store,
            scope,
            thread,
            {
                "messages": [b.insert(b.message(f"m{i}")) for i in range(1, 6)],
                "runs": [
                    *[b.insert(b.run(f"r{i}", "completed", operation=None)) for i in range(1, 4)],
                    *[b.insert(_queued_run(f"rq{i}", f"q{i}")) for i in range(1, 4)],
                ],
                "queuedItems": [b.insert(b.queued_item(f"q{i}", f"rq{i}", i)) for i in range(1, 4)],
            },
        )
        return scope, thread

    async def test_message_ids_keep_requested_order_and_omit_missing(
        self, store: ThreadStore
    ) -> None:
        scope, thread = await self._thread(store)
        result = await store.read_thread(
            b.read(
                scope, thread, messages={"type": "ids", "messageIds": ["m4", "nope", "m1", "m3"]}
            )
        )
        assert result.thread is not None
        assert result.messages is not None
        assert [m.message_id for m in result.messages.items] == ["m4", "m1", "m3"]
        assert result.messages.next_page_token is None
        assert result.messages.version == result.thread.version

    async def test_run_ids_keep_requested_order_and_omit_missing(self, store: ThreadStore) -> None:
        scope, thread = await self._thread(store)
        result = await store.read_thread(
            b.read(scope, thread, runs={"type": "ids", "runIds": ["rq2", "r3", "x", "r1"]})
        )
        assert result.runs is not None
        assert [r.run_id for r in result.runs.items] == ["rq2", "r3", "r1"]
        assert result.runs.next_page_token is None

    async def test_queued_item_ids_keep_requested_order_and_omit_missing(
        self, store: ThreadStore
    ) -> None:
        scope, thread = await self._thread(store)
        result = await store.read_thread(
            b.read(scope, thread, queuedItems={"type": "ids", "queueItemIds": ["q3", "q9", "q1"]})
        )
        assert result.queued_items is not None
        assert [q.queue_item_id for q in result.queued_items.items] == ["q3", "q1"]
        assert [q.input for q in result.queued_items.items] == [3, 1]

    async def test_a_run_id_does_not_select_a_message(self, store: ThreadStore) -> None:
        scope, thread = await self._thread(store)
        result = await store.read_thread(
            b.read(scope, thread, messages={"type": "ids", "messageIds": ["r1", "q1"]})
        )
        assert result.messages is not None
        assert result.messages.items == []

    async def test_hundred_ids_accepted(self, store: ThreadStore) -> None:
        scope, thread = await self._thread(store)
        ids = [f"x{i}" for i in range(MAX_ID_SELECTION_SIZE - 2)] + ["m2", "m5"]
        assert len(ids) == 100
        result = await store.read_thread(
            b.read(scope, thread, messages={"type": "ids", "messageIds": ids})
        )
        assert result.messages is not None
        assert [m.message_id for m in result.messages.items] == ["m2", "m5"]

    @pytest.mark.parametrize(
        ("family", "key"),
        [("messages", "messageIds"), ("runs", "runIds"), ("queuedItems", "queueItemIds")],
    )
    @pytest.mark.parametrize("count", [0, 101])
    async def test_bad_id_count_is_invariant_error(
        self, store: ThreadStore, family: str, key: str, count: int
    ) -> None:
        scope, thread = await self._thread(store)
        ids = [f"id{i}" for i in range(count)]
        with pytest.raises(ThreadStoreInvariantError, match=key):
            await store.read_thread(b.read(scope, thread, **{family: {"type": "ids", key: ids}}))

    @pytest.mark.parametrize(
        ("family", "key", "ids"),
        [
            ("messages", "messageIds", ["m1", "m2", "m1"]),
            ("runs", "runIds", ["r1", "r1"]),
            ("queuedItems", "queueItemIds", ["q2", "q1", "q2"]),
        ],
    )
    async def test_duplicate_id_is_invariant_error(
        self, store: ThreadStore, family: str, key: str, ids: list[str]
    ) -> None:
        scope, thread = await self._thread(store)
        with pytest.raises(ThreadStoreInvariantError, match=r"distinct|duplicate"):
            await store.read_thread(b.read(scope, thread, **{family: {"type": "ids", key: ids}}))

    async def test_duplicate_id_rejected_even_for_missing_thread(self, store: ThreadStore) -> None:
        with pytest.raises(ThreadStoreInvariantError, match="messageIds"):
            await store.read_thread(
                b.read(new_scope(), "missing", messages={"type": "ids", "messageIds": ["a", "a"]})
            )
