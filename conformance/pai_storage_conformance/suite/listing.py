"""Listing threads (docs/reads.md#listing-threads): order, keyset pages, filters, hidden threads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pai_storage import CommittedResult, ListThreadsInput, ManualClock, ThreadRecord, ThreadStore
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError, ThreadStorePageTokenError
from pai_storage.models import MAX_PAGE_SIZE

from ._support import new_scope

__all__ = ["TestListing"]

pytestmark = pytest.mark.asyncio


async def _create(store: ThreadStore, scope: str, thread: str, **root: Any) -> ThreadRecord:
    result = await store.commit_thread(b.create(scope, thread, **root))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def _touch(store: ThreadStore, record: ThreadRecord, **root: Any) -> ThreadRecord:
    result = await store.commit_thread(
        b.update_at(
            record.scope_key,
            record.thread_id,
            record.version,
            root=b.root(visibility=record.list_visibility, **root),
        )
    )
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def _list(store: ThreadStore, scope: str, limit: int = 100, **filters: Any) -> list[str]:
    page = await store.list_threads({"scopeKey": scope, "limit": limit, **filters})
    assert page.next_page_token is None
    return [t.thread_id for t in page.items]


async def _walk(store: ThreadStore, scope: str, limit: int, **filters: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    token: str | None = None
    while True:
        request: dict[str, Any] = {"scopeKey": scope, "limit": limit, **filters}
        if token is not None:
            request["pageToken"] = token
        page = await store.list_threads(request)
        assert len(page.items) <= limit
        pages.append([t.thread_id for t in page.items])
        token = page.next_page_token
        if token is None:
            return pages
        assert page.items, "a page with a next token must not be empty"
        assert len(pages) < 200, "pagination does not terminate"


async def _mixed_timestamps(store: ThreadStore, clock: ManualClock, scope: str) -> list[str]:
    """Seven threads; some share an updatedAt. Returns the expected list order."""
    # t=0: "c", "a", "b" (equal timestamps)
    for thread in ("c", "a", "b"):
        await _create(store, scope, thread)
    clock.advance(ms=1)
    # t=1: "e", "d"
    for thread in ("e", "d"):
        await _create(store, scope, thread)
    clock.advance(ms=1000)
    # t=1001: "f"
    await _create(store, scope, "f")
    clock.advance(ms=1)
    # t=1002: "0"
    await _create(store, scope, "0")
    return ["0", "f", "d", "e", "a", "b", "c"]


class TestListing:
    """list_threads: order, keyset pagination, filters, hidden threads, tokens."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    async def test_empty_scope_lists_nothing(self, store: ThreadStore) -> None:
        page = await store.list_threads({"scopeKey": new_scope(), "limit": 10})
        assert page.items == []
        assert page.next_page_token is None

    async def test_order_updated_desc_then_thread_id_asc(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        assert await _list(store, scope) == expected

    async def test_thread_id_tiebreak_is_code_point_order(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        ids = ["b", "B", "a", "_", "é", "🧵", "a b", "ab", "Z", "10", "9"]
        for thread in ids:
            await _create(store, scope, thread)
        assert await _list(store, scope) == sorted(ids)

    async def test_update_moves_thread_to_front(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        first = await _create(store, scope, "first")
        clock.advance(ms=5)
        await _create(store, scope, "second")
        clock.advance(ms=5)
        await _create(store, scope, "third")
        assert await _list(store, scope) == ["third", "second", "first"]
        clock.advance(ms=5)
        touched = await _touch(store, first, title="new")
        assert touched.updated_at == clock()
        assert await _list(store, scope) == ["first", "third", "second"]

    async def test_listed_records_are_the_current_roots(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await _create(
            store, scope, "t1", title="x", category="c", metadata={"k": [1, 2.5]}
        )
        clock.advance(ms=3)
        updated = await _touch(store, created, title="y", metadata={"k": "v"})
        page = await store.list_threads({"scopeKey": scope, "limit": 5})
        assert page.items == [updated]
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread == page.items[0]

    @pytest.mark.parametrize("limit", [1, 2, 3, 6, 7])
    async def test_keyset_walk_yields_each_thread_once_in_order(
        self, store: ThreadStore, clock: ManualClock, limit: int
    ) -> None:
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        pages = await _walk(store, scope, limit)
        assert [t for page in pages for t in page] == expected
        assert all(len(page) == limit for page in pages[:-1])
        assert len(pages) == -(-len(expected) // limit)

    async def test_limit_exactly_total_has_no_token(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        page = await store.list_threads({"scopeKey": scope, "limit": len(expected)})
        assert [t.thread_id for t in page.items] == expected
        assert page.next_page_token is None
        page = await store.list_threads({"scopeKey": scope, "limit": len(expected) - 1})
        assert page.next_page_token is not None

    async def test_keyset_neither_repeats_nor_skips_unchanged_threads(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        first = await store.list_threads({"scopeKey": scope, "limit": 3})
        seen = [t.thread_id for t in first.items]
        assert seen == expected[:3]
        # Between pages: a listed thread and an unlisted one change, a new one
        # appears, and one unlisted thread is deleted.
        clock.advance(ms=10)
        listed_root = first.items[0]
        await _touch(store, listed_root, title="moved")
        read = await store.read_thread(b.read(scope, "e"))
        assert read.thread is not None
        await _touch(store, read.thread, title="moved too")
        await _create(store, scope, "new")
        read_b = await store.read_thread(b.read(scope, "b"))
        assert read_b.thread is not None
        await store.commit_thread(b.delete(scope, "b", read_b.thread.version))

        rest: list[str] = []
        token = first.next_page_token
        while token is not None:
            page = await store.list_threads({"scopeKey": scope, "limit": 2, "pageToken": token})
            rest.extend(t.thread_id for t in page.items)
            token = page.next_page_token
        changed = {listed_root.thread_id, "e", "new", "b"}
        unchanged_rest = [t for t in expected[3:] if t not in changed]
        assert [t for t in rest if t not in changed] == unchanged_rest
        assert len(rest) == len(set(rest))
        assert "b" not in rest

    async def test_agent_filter(self, store: ThreadStore, clock: ManualClock) -> None:
        scope = new_scope()
        await _create(store, scope, "a1", agent="alpha")
        clock.advance(ms=1)
        await _create(store, scope, "b1", agent="beta")
        clock.advance(ms=1)
        await _create(store, scope, "a2", agent="alpha")
        assert await _list(store, scope, agent="alpha") == ["a2", "a1"]
        assert await _list(store, scope, agent="beta") == ["b1"]
        assert await _list(store, scope, agent="gamma") == []
        assert await _list(store, scope, agent="alph") == []

    async def test_parent_thread_filter(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _create(store, scope, "root")
        await _create(store, scope, "child1", parentThreadId="root")
        await _create(store, scope, "child2", parentThreadId="root")
        await _create(store, scope, "grandchild", parentThreadId="child1")
        assert await _list(store, scope, parentThreadId="root") == ["child1", "child2"]
        assert await _list(store, scope, parentThreadId="child1") == ["grandchild"]
        assert await _list(store, scope, parentThreadId="grandchild") == []
        assert await _list(store, scope) == ["child1", "child2", "grandchild", "root"]

    async def test_category_filter_follows_updates(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        first = await _create(store, scope, "t1", category="work")
        await _create(store, scope, "t2", category="home")
        await _create(store, scope, "t3")
        assert await _list(store, scope, category="work") == ["t1"]
        assert await _list(store, scope, category="home") == ["t2"]
        clock.advance(ms=1)
        await _touch(store, first)  # an update without category removes it
        assert await _list(store, scope, category="work") == []
        assert await _list(store, scope) == ["t1", "t2", "t3"]

    async def test_combined_filters(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _create(store, scope, "x1", agent="a", category="c", parentThreadId="p")
        await _create(store, scope, "x2", agent="a", category="c")
        await _create(store, scope, "x3", agent="a", category="d", parentThreadId="p")
        await _create(store, scope, "x4", agent="b", category="c", parentThreadId="p")
        await _create(
            store,
            scope,
            "x5",
            agent="a",
            category="c",
            parentThreadId="p",
            visibility="hidden",
        )
        both: dict[str, Any] = {"agent": "a", "category": "c", "parentThreadId": "p"}
        assert await _list(store, scope, **both) == ["x1"]
        assert await _list(store, scope, **both, includeHidden=True) == ["x1", "x5"]
        assert await _list(store, scope, agent="a", category="c") == ["x1", "x2"]

    async def test_hidden_only_with_include_hidden(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        await _create(store, scope, "visible")
        clock.advance(ms=1)
        hidden = await _create(store, scope, "hidden", visibility="hidden")
        assert await _list(store, scope) == ["visible"]
        assert await _list(store, scope, includeHidden=False) == ["visible"]
        assert await _list(store, scope, includeHidden=True) == ["hidden", "visible"]
        # Reads are not affected by list visibility.
        read = await store.read_thread(b.read(scope, "hidden"))
        assert read.thread == hidden
        # Making it visible lists it.
        clock.advance(ms=1)
        await _touch(store, hidden.model_copy(update={"list_visibility": "visible"}))
        assert await _list(store, scope) == ["hidden", "visible"]

    async def test_hidden_threads_paginate(self, store: ThreadStore) -> None:
        scope = new_scope()
        for index in range(5):
            await _create(
                store, scope, f"t{index}", visibility="hidden" if index % 2 else "visible"
            )
        pages = await _walk(store, scope, 2, includeHidden=True)
        assert [t for page in pages for t in page] == ["t0", "t1", "t2", "t3", "t4"]
        pages = await _walk(store, scope, 1)
        assert pages == [["t0"], ["t2"], ["t4"]]

    async def test_filtered_walk(self, store: ThreadStore, clock: ManualClock) -> None:
        scope = new_scope()
        for index in range(9):
            clock.advance(ms=index % 2)
            await _create(store, scope, f"t{index}", agent="even" if index % 2 == 0 else "odd")
        pages = await _walk(store, scope, 2, agent="even")
        flat = [t for page in pages for t in page]
        assert sorted(flat) == ["t0", "t2", "t4", "t6", "t8"]
        assert flat == await _list(store, scope, agent="even")

    async def test_list_continuation_may_change_limit(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        first = await store.list_threads({"scopeKey": scope, "limit": 2})
        second = await store.list_threads(
            {"scopeKey": scope, "limit": 4, "pageToken": first.next_page_token}
        )
        third = await store.list_threads(
            {"scopeKey": scope, "limit": 1, "pageToken": second.next_page_token}
        )
        assert [t.thread_id for t in first.items] == expected[:2]
        assert [t.thread_id for t in second.items] == expected[2:6]
        assert [t.thread_id for t in third.items] == expected[6:]
        assert third.next_page_token is None

    @pytest.mark.parametrize(
        ("first", "changed"),
        [
            ({}, {"agent": "alpha"}),
            ({"agent": "alpha"}, {}),
            ({"agent": "alpha"}, {"agent": "beta"}),
            ({}, {"category": "c"}),
            ({"category": "c"}, {"category": "d"}),
            ({}, {"parentThreadId": "p"}),
            ({"parentThreadId": "p"}, {"parentThreadId": "q"}),
            ({}, {"includeHidden": True}),
            ({"includeHidden": True}, {}),
        ],
    )
    async def test_continuation_must_repeat_filters(
        self, store: ThreadStore, first: dict[str, Any], changed: dict[str, Any]
    ) -> None:
        scope = new_scope()
        for index in range(4):
            await _create(
                store,
                scope,
                f"t{index}",
                agent="alpha",
                category="c",
                parentThreadId="p",
                visibility="visible",
            )
        page = await store.list_threads({"scopeKey": scope, "limit": 1, **first})
        assert page.next_page_token is not None
        with pytest.raises(ThreadStorePageTokenError):
            await store.list_threads(
                {"scopeKey": scope, "limit": 1, "pageToken": page.next_page_token, **changed}
            )

    async def test_continuation_must_repeat_scope(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope(), new_scope()
        for scope in (scope_a, scope_b):
            for index in range(3):
                await _create(store, scope, f"t{index}")
        page = await store.list_threads({"scopeKey": scope_a, "limit": 1})
        assert page.next_page_token is not None
        with pytest.raises(ThreadStorePageTokenError):
            await store.list_threads(
                {"scopeKey": scope_b, "limit": 1, "pageToken": page.next_page_token}
            )

    async def test_tampered_and_garbage_tokens_rejected(self, store: ThreadStore) -> None:
        scope = new_scope()
        for index in range(3):
            await _create(store, scope, f"t{index}")
        page = await store.list_threads({"scopeKey": scope, "limit": 1})
        token = page.next_page_token
        assert token is not None
        middle = len(token) // 2
        flipped = token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]
        for bad in (flipped, token[:-1], "garbage", "a.b.c", "🧵"):
            with pytest.raises(ThreadStorePageTokenError):
                await store.list_threads({"scopeKey": scope, "limit": 1, "pageToken": bad})

    async def test_child_page_token_is_not_a_list_token(self, store: ThreadStore) -> None:
        scope = new_scope()
        for index in range(3):
            await store.commit_thread(
                b.create(
                    scope,
                    f"t{index}",
                    {
                        "messages": [
                            {"type": "insert", "record": b.message("m1")},
                            {"type": "insert", "record": b.message("m2")},
                        ]
                    },
                )
            )
        read = await store.read_thread(
            b.read(scope, "t0", messages={"type": "page", "view": "raw", "page": {"limit": 1}})
        )
        assert read.messages is not None
        assert read.messages.next_page_token is not None
        with pytest.raises(ThreadStorePageTokenError):
            await store.list_threads(
                {"scopeKey": scope, "limit": 1, "pageToken": read.messages.next_page_token}
            )

    @pytest.mark.parametrize("limit", [0, MAX_PAGE_SIZE + 1, -5])
    async def test_limit_out_of_range_rejected(self, store: ThreadStore, limit: int) -> None:
        with pytest.raises(ThreadStoreInvariantError, match="limit"):
            await store.list_threads({"scopeKey": new_scope(), "limit": limit})

    async def test_limit_bounds_accepted(self, store: ThreadStore) -> None:
        scope = new_scope()
        for index in range(3):
            await _create(store, scope, f"t{index}")
        one = await store.list_threads({"scopeKey": scope, "limit": 1})
        assert [t.thread_id for t in one.items] == ["t0"]
        assert one.next_page_token is not None
        full = await store.list_threads({"scopeKey": scope, "limit": MAX_PAGE_SIZE})
        assert [t.thread_id for t in full.items] == ["t0", "t1", "t2"]
        assert full.next_page_token is None

    async def test_more_than_one_full_page(self, store: ThreadStore) -> None:
        scope = new_scope()
        ids = [f"t{index:03d}" for index in range(MAX_PAGE_SIZE + 5)]
        for thread in ids:
            await _create(store, scope, thread)
        pages = await _walk(store, scope, MAX_PAGE_SIZE)
        assert [len(page) for page in pages] == [MAX_PAGE_SIZE, 5]
        assert [t for page in pages for t in page] == ids

    # ------------------------------------------------------------ more continuation rules

    async def test_include_hidden_false_and_omitted_are_one_query(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        for first, then in (({}, {"includeHidden": False}), ({"includeHidden": False}, {})):
            page = await store.list_threads({"scopeKey": scope, "limit": 3, **first})
            rest = await store.list_threads(
                {"scopeKey": scope, "limit": 10, "pageToken": page.next_page_token, **then}
            )
            assert [t.thread_id for t in page.items + rest.items] == expected
            assert rest.next_page_token is None

    @pytest.mark.parametrize("limit", [1, 2])
    async def test_walk_survives_the_deletion_of_the_last_listed_thread(
        self, store: ThreadStore, clock: ManualClock, limit: int
    ) -> None:
        # The token holds a key, not a row: the thread it was taken from may
        # be gone, and the walk still resumes right after it.
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        first = await store.list_threads({"scopeKey": scope, "limit": 3})
        last = first.items[-1]
        deleted = await store.commit_thread(b.delete(scope, last.thread_id, last.version))
        assert isinstance(deleted, CommittedResult)
        rest: list[str] = []
        token = first.next_page_token
        while token is not None:
            page = await store.list_threads({"scopeKey": scope, "limit": limit, "pageToken": token})
            rest.extend(t.thread_id for t in page.items)
            token = page.next_page_token
        assert rest == expected[3:]

    async def test_keyset_walk_over_odd_thread_ids_follows_code_points(
        self, store: ThreadStore
    ) -> None:
        # Equal update times, ids that differ by U+0000, U+0001, a trailing
        # character, the last BMP character and astral characters: code-point
        # order (which is neither UTF-16 order nor a collation) on every page.
        scope = new_scope()
        ids = [
            "a",
            "a\x00",
            "a\x00b",
            "a\x01",
            "\x00",
            "a\uffff",
            "a\U0001f9f5",
            "a\U0010ffff",
            "a\ufb01",
            "A",
            "a b",
            "a\\",
            "a%",
        ]
        for thread in ids:
            await _create(store, scope, thread)
        expected = sorted(ids)
        assert await _list(store, scope) == expected
        for limit in (1, 2, 5):
            pages = await _walk(store, scope, limit)
            assert [t for page in pages for t in page] == expected

    async def test_filters_match_odd_values_exactly(self, store: ThreadStore) -> None:
        scope = new_scope()
        values = ["v", "v\x00", "v\x00w", "V", "v ", "\u00e9", "e\u0301", "\x00"]
        for index, value in enumerate(values):
            await _create(
                store, scope, f"t{index}", agent=value, category=value, parentThreadId=value
            )
        for index, value in enumerate(values):
            for field in ("agent", "category", "parentThreadId"):
                filters: dict[str, Any] = {field: value}
                assert await _list(store, scope, **filters) == [f"t{index}"], (field, value)

    async def test_empty_category_is_a_category(self, store: ThreadStore) -> None:
        # category may be empty (0 to 256 bytes): "" is a value, not an absent field.
        scope = new_scope()
        empty = await _create(store, scope, "empty", category="")
        await _create(store, scope, "none")
        assert empty.category == ""
        assert empty.to_json()["category"] == ""
        assert await _list(store, scope, category="") == ["empty"]
        read = await store.read_thread(b.read(scope, "empty"))
        assert read.thread == empty
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        by_id = {t.thread_id: t for t in listed.items}
        assert by_id["empty"].category == ""
        assert by_id["none"].category is None
        assert "category" not in by_id["none"].to_json()

    async def test_filter_of_the_longest_allowed_value(self, store: ThreadStore) -> None:
        scope = new_scope()
        longest = "\u00e9" * 128  # 256 bytes of UTF-8
        await _create(store, scope, "long", agent=longest, category=longest, parentThreadId=longest)
        await _create(store, scope, "short", agent=longest[:-1], category=longest[:-1])
        for field in ("agent", "category", "parentThreadId"):
            filters: dict[str, Any] = {field: longest}
            assert await _list(store, scope, **filters) == ["long"]
            with pytest.raises(ThreadStoreInvariantError, match=field):
                await store.list_threads({"scopeKey": scope, "limit": 5, field: longest + "e"})

    @pytest.mark.parametrize("field", ["agent", "parentThreadId"])
    @pytest.mark.parametrize("bad", ["", "a\ud800", 5, ["a"]], ids=repr)
    async def test_malformed_id_filter_is_invariant_error(
        self, store: ThreadStore, field: str, bad: object
    ) -> None:
        with pytest.raises(ThreadStoreInvariantError, match=field):
            await store.list_threads({"scopeKey": new_scope(), "limit": 5, field: bad})

    @pytest.mark.parametrize("bad", [True, 1.0, "1", None, [1]], ids=repr)
    async def test_list_limit_must_be_an_integer(self, store: ThreadStore, bad: object) -> None:
        with pytest.raises(ThreadStoreInvariantError, match="limit"):
            await store.list_threads({"scopeKey": new_scope(), "limit": bad})
        with pytest.raises(ThreadStoreInvariantError, match="limit"):
            await store.list_threads({"scopeKey": new_scope()})

    async def test_list_model_and_json_inputs_walk_alike(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        expected = await _mixed_timestamps(store, clock, scope)
        seen: list[str] = []
        token: str | None = None
        while True:
            request: dict[str, Any] = {"scopeKey": scope, "limit": 3}
            if token is not None:
                request["pageToken"] = token
            page = await store.list_threads(ListThreadsInput.model_validate(request))
            assert page == await store.list_threads(request)
            seen.extend(t.thread_id for t in page.items)
            as_json = page.to_json()
            assert as_json["items"] == [t.to_json() for t in page.items]
            token = page.next_page_token
            if token is None:
                assert "nextPageToken" not in as_json
                break
            assert as_json == {"items": as_json["items"], "nextPageToken": token}
        assert seen == expected

    async def test_order_over_the_whole_range_of_times(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        # Update times from year 1 to year 9999, before and after the Unix
        # epoch, committed out of order: lists and walks follow the times.
        scope = new_scope()
        moments = {
            "y2030": datetime(2030, 1, 1, tzinfo=UTC),
            "y0001": datetime(1, 1, 1, tzinfo=UTC),
            "y9999": datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
            "pre-epoch": datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
            "epoch": datetime(1970, 1, 1, tzinfo=UTC),
        }
        for thread, moment in moments.items():
            clock.set(moment)
            created = await _create(store, scope, thread)
            assert created.updated_at == moment
        expected = ["y9999", "y2030", "epoch", "pre-epoch", "y0001"]
        assert await _list(store, scope) == expected
        for limit in (1, 2):
            pages = await _walk(store, scope, limit)
            assert [t for page in pages for t in page] == expected
        listed = await store.list_threads({"scopeKey": scope, "limit": 5})
        assert [t.updated_at for t in listed.items] == [moments[t] for t in expected]
