"""Child-family pagination (docs/reads.md#page-tokens): limits, tokens, continuations, snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from pai_storage import CommittedResult, ReadThreadInput, ThreadRecord, ThreadStore, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError, ThreadStorePageTokenError
from pai_storage.models import MAX_PAGE_SIZE
from pai_storage.tokens import PageTokenCodec

from ._support import new_scope, token_parts, token_payload

__all__ = ["TestPagination"]

pytestmark = pytest.mark.asyncio

ATTR = {"messages": "messages", "runs": "runs", "queuedItems": "queued_items"}
ID_ATTR = {"messages": "message_id", "runs": "run_id", "queuedItems": "queue_item_id"}


def _with_page(selection: dict[str, Any], limit: int, token: str | None) -> dict[str, Any]:
    page: dict[str, Any] = {"limit": limit}
    if token is not None:
        page["pageToken"] = token
    return {**selection, "page": page}


async def _page(
    store: ThreadStore,
    scope: str,
    thread: str,
    family: str,
    selection: dict[str, Any],
    limit: int,
    token: str | None = None,
) -> tuple[list[str], str | None]:
    result = await store.read_thread(
        b.read(scope, thread, **{family: _with_page(selection, limit, token)})
    )
    page = getattr(result, ATTR[family])
    assert page is not None
    assert result.thread is not None
    assert page.version == result.thread.version
    assert len(page.items) <= limit
    return [getattr(item, ID_ATTR[family]) for item in page.items], page.next_page_token


async def _walk(
    store: ThreadStore,
    scope: str,
    thread: str,
    family: str,
    selection: dict[str, Any],
    limit: int,
) -> list[list[str]]:
    pages: list[list[str]] = []
    token: str | None = None
    while True:
        ids, token = await _page(store, scope, thread, family, selection, limit, token)
        pages.append(ids)
        if token is None:
            return pages
        assert ids, "a page with a next token must not be empty"
        assert len(pages) < 200, "pagination does not terminate"


def _flat(pages: list[list[str]]) -> list[str]:
    return [item for page in pages for item in page]


async def _create(
    store: ThreadStore, scope: str, thread: str, changes: dict[str, Any] | None = None
) -> ThreadRecord:
    result = await store.commit_thread(b.create(scope, thread, changes))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def _update(
    store: ThreadStore, scope: str, thread: str, version: ThreadVersion, changes: dict[str, Any]
) -> ThreadRecord:
    result = await store.commit_thread(b.update_at(scope, thread, version, changes, root=b.root()))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


# Seven messages; transcript/context visibility alternates.
MESSAGES = {f"m{i}": (i % 2 == 1, i % 3 != 0) for i in range(1, 8)}
VIEWS = {
    "raw": list(MESSAGES),
    "transcript": [m for m, (t, _) in MESSAGES.items() if t],
    "context": [m for m, (_, c) in MESSAGES.items() if c],
}
# Runs r1..r7 with mixed terminal statuses, plus a queued run rq with item q.
RUN_STATUSES = {
    "r1": "completed",
    "r2": "failed",
    "r3": "cancelled",
    "r4": "completed",
    "r5": "failed",
    "r6": "completed",
    "r7": "cancelled",
}


async def _full_thread(store: ThreadStore, scope: str, thread: str = "t1") -> ThreadRecord:
    return await _create(
        store,
        scope,
        thread,
        {
            "messages": [
                b.insert(b.message(mid, transcript=t, context=c))
                for mid, (t, c) in MESSAGES.items()
            ],
            "runs": [
                *[
                    b.insert(b.run(rid, status, operation=None))
                    for rid, status in RUN_STATUSES.items()
                ],
                *[b.insert(b.run(f"rq{i}", "queued", queue_item_id=f"q{i}")) for i in range(1, 6)],
            ],
            "queuedItems": [
                b.insert(b.queued_item(f"q{i}", f"rq{i}", {"n": i})) for i in range(1, 6)
            ],
        },
    )


MSG_RAW = {"type": "page", "view": "raw"}


class TestPagination:
    """Page limits, next tokens, full walks and token validation."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    # ------------------------------------------------------------ limits

    @pytest.mark.parametrize("limit", [0, MAX_PAGE_SIZE + 1, -1])
    @pytest.mark.parametrize(
        ("family", "selection"),
        [
            ("messages", MSG_RAW),
            ("runs", {"type": "page"}),
            ("queuedItems", {"type": "page"}),
        ],
    )
    async def test_limit_out_of_range_is_invariant_error(
        self, store: ThreadStore, family: str, selection: dict[str, Any], limit: int
    ) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        with pytest.raises(ThreadStoreInvariantError, match="limit"):
            await store.read_thread(
                b.read(scope, "t1", **{family: _with_page(selection, limit, None)})
            )

    async def test_limit_bounds_are_accepted(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        ids, token = await _page(store, scope, "t1", "messages", MSG_RAW, 1)
        assert (ids, token is not None) == (["m1"], True)
        ids, token = await _page(store, scope, "t1", "messages", MSG_RAW, MAX_PAGE_SIZE)
        assert (ids, token) == (VIEWS["raw"], None)

    # ------------------------------------------------------------ next tokens

    async def test_token_present_exactly_when_more_items_exist(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        ids, token = await _page(store, scope, "t1", "messages", MSG_RAW, 7)
        assert (ids, token) == (VIEWS["raw"], None)
        ids, token = await _page(store, scope, "t1", "messages", MSG_RAW, 6)
        assert ids == VIEWS["raw"][:6]
        assert token is not None
        rest, last = await _page(store, scope, "t1", "messages", MSG_RAW, 6, token)
        assert (rest, last) == (["m7"], None)

    async def test_exact_multiple_has_no_trailing_empty_page(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _create(
            store, scope, "t1", {"messages": [b.insert(b.message(f"m{i}")) for i in range(4)]}
        )
        pages = await _walk(store, scope, "t1", "messages", MSG_RAW, 2)
        assert pages == [["m0", "m1"], ["m2", "m3"]]

    async def test_filtered_page_token_only_when_more_matches(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        # Only two runs are "failed": a page of two is the whole result.
        selection = {"type": "page", "statuses": ["failed"]}
        ids, token = await _page(store, scope, "t1", "runs", selection, 2)
        assert (ids, token) == (["r2", "r5"], None)

    # ------------------------------------------------------------ full walks

    @pytest.mark.parametrize("view", ["raw", "transcript", "context"])
    @pytest.mark.parametrize("order", ["oldest", "newest"])
    @pytest.mark.parametrize("limit", [1, 2, 3])
    async def test_walk_messages_yields_each_once_in_order(
        self, store: ThreadStore, view: str, order: str, limit: int
    ) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        expected = VIEWS[view] if order == "oldest" else VIEWS[view][::-1]
        pages = await _walk(
            store, scope, "t1", "messages", {"type": "page", "view": view, "order": order}, limit
        )
        assert _flat(pages) == expected
        assert all(len(page) == limit for page in pages[:-1])

    @pytest.mark.parametrize("order", ["oldest", "newest"])
    async def test_walk_messages_with_bounds(self, store: ThreadStore, order: str) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        selection = {
            "type": "page",
            "view": "raw",
            "order": order,
            "afterMessageId": "m1",
            "beforeMessageId": "m7",
        }
        expected = ["m2", "m3", "m4", "m5", "m6"]
        pages = await _walk(store, scope, "t1", "messages", selection, 2)
        assert _flat(pages) == (expected if order == "oldest" else expected[::-1])

    @pytest.mark.parametrize(
        ("statuses", "expected"),
        [
            (None, [*RUN_STATUSES, "rq1", "rq2", "rq3", "rq4", "rq5"]),
            (["completed"], ["r1", "r4", "r6"]),
            (["failed", "cancelled"], ["r2", "r3", "r5", "r7"]),
            (["queued", "completed"], ["r1", "r4", "r6", "rq1", "rq2", "rq3", "rq4", "rq5"]),
            (["running"], []),
        ],
    )
    @pytest.mark.parametrize("order", ["oldest", "newest"])
    async def test_walk_runs_with_status_filter(
        self,
        store: ThreadStore,
        statuses: list[str] | None,
        expected: list[str],
        order: str,
    ) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        selection: dict[str, Any] = {"type": "page", "order": order}
        if statuses is not None:
            selection["statuses"] = statuses
        pages = await _walk(store, scope, "t1", "runs", selection, 2)
        assert _flat(pages) == (expected if order == "oldest" else expected[::-1])

    @pytest.mark.parametrize("order", ["oldest", "newest"])
    async def test_walk_queued_items(self, store: ThreadStore, order: str) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        expected = [f"q{i}" for i in range(1, 6)]
        pages = await _walk(store, scope, "t1", "queuedItems", {"type": "page", "order": order}, 2)
        assert _flat(pages) == (expected if order == "oldest" else expected[::-1])
        assert len(pages) == 3

    async def test_queued_items_run_filter(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        selection = {"type": "page", "runId": "rq3"}
        pages = await _walk(store, scope, "t1", "queuedItems", selection, 1)
        assert pages == [["q3"]]
        none = await _walk(store, scope, "t1", "queuedItems", {"type": "page", "runId": "r1"}, 1)
        assert none == [[]]

    async def test_walk_queued_items_with_run_filter_over_many_items(
        self, store: ThreadStore
    ) -> None:
        # Every queued run has exactly one item; walk a filter that matches
        # none of the first items to check the filter does not stop the walk.
        scope = new_scope()
        await _full_thread(store, scope)
        pages = await _walk(store, scope, "t1", "queuedItems", {"type": "page", "runId": "rq5"}, 1)
        assert pages == [["q5"]]

    async def test_continuation_may_change_limit(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        first, token = await _page(store, scope, "t1", "messages", MSG_RAW, 2)
        assert first == ["m1", "m2"]
        second, token = await _page(store, scope, "t1", "messages", MSG_RAW, 4, token)
        assert second == ["m3", "m4", "m5", "m6"]
        third, token = await _page(store, scope, "t1", "messages", MSG_RAW, 1, token)
        assert (third, token) == (["m7"], None)

    async def test_continuation_repeated_gives_same_page(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", "runs", {"type": "page"}, 3)
        again = await _page(store, scope, "t1", "runs", {"type": "page"}, 3, token)
        once_more = await _page(store, scope, "t1", "runs", {"type": "page"}, 3, token)
        assert again == once_more
        assert again[0] == ["r4", "r5", "r6"]

    # ------------------------------------------------------------ mismatched continuations

    @pytest.mark.parametrize(
        ("family", "first", "changed"),
        [
            ("messages", MSG_RAW, {"type": "page", "view": "transcript"}),
            ("messages", MSG_RAW, {"type": "page", "view": "context"}),
            ("messages", MSG_RAW, {"type": "page", "view": "raw", "order": "newest"}),
            (
                "messages",
                {"type": "page", "view": "raw", "order": "newest"},
                {"type": "page", "view": "raw", "order": "oldest"},
            ),
            ("messages", MSG_RAW, {"type": "page", "view": "raw", "afterMessageId": "m1"}),
            ("messages", MSG_RAW, {"type": "page", "view": "raw", "beforeMessageId": "m7"}),
            (
                "messages",
                {"type": "page", "view": "raw", "afterMessageId": "m1"},
                {"type": "page", "view": "raw", "afterMessageId": "m2"},
            ),
            (
                "messages",
                {"type": "page", "view": "raw", "beforeMessageId": "m7"},
                MSG_RAW,
            ),
            ("runs", {"type": "page"}, {"type": "page", "statuses": ["completed"]}),
            (
                "runs",
                {"type": "page", "statuses": ["completed", "failed", "cancelled", "queued"]},
                {"type": "page", "statuses": ["completed", "failed", "cancelled"]},
            ),
            ("runs", {"type": "page"}, {"type": "page", "order": "newest"}),
            ("queuedItems", {"type": "page"}, {"type": "page", "runId": "rq1"}),
            ("queuedItems", {"type": "page"}, {"type": "page", "order": "newest"}),
        ],
    )
    async def test_changed_query_rejects_token(
        self,
        store: ThreadStore,
        family: str,
        first: dict[str, Any],
        changed: dict[str, Any],
    ) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", family, first, 1)
        assert token is not None
        with pytest.raises(ThreadStorePageTokenError):
            await _page(store, scope, "t1", family, changed, 1, token)

    async def test_explicit_default_order_is_the_same_query(self, store: ThreadStore) -> None:
        # "order" defaults to "oldest": a token from the default form continues
        # the explicit one unless the backend treats them as different queries.
        # docs/reads.md#continuation-rules: the same query, so it continues.
        scope = new_scope()
        await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", "messages", MSG_RAW, 2)
        ids, _ = await _page(
            store, scope, "t1", "messages", {**MSG_RAW, "order": "oldest"}, 2, token
        )
        assert ids == ["m3", "m4"]

    @pytest.mark.parametrize(
        ("family", "other"),
        [("messages", "runs"), ("runs", "queuedItems"), ("queuedItems", "messages")],
    )
    async def test_token_of_another_family_rejected(
        self, store: ThreadStore, family: str, other: str
    ) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        selection = MSG_RAW if family == "messages" else {"type": "page"}
        other_selection = MSG_RAW if other == "messages" else {"type": "page"}
        _, token = await _page(store, scope, "t1", family, selection, 1)
        assert token is not None
        with pytest.raises(ThreadStorePageTokenError):
            await _page(store, scope, "t1", other, other_selection, 1, token)

    async def test_token_of_another_thread_rejected(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope, "t1")
        await _full_thread(store, scope, "t2")
        for family, selection in (
            ("messages", MSG_RAW),
            ("runs", {"type": "page"}),
            ("queuedItems", {"type": "page"}),
        ):
            _, token = await _page(store, scope, "t1", family, selection, 1)
            with pytest.raises(ThreadStorePageTokenError):
                await _page(store, scope, "t2", family, selection, 1, token)

    async def test_token_of_another_scope_rejected(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope(), new_scope()
        await _full_thread(store, scope_a)
        await _full_thread(store, scope_b)
        for family, selection in (
            ("messages", MSG_RAW),
            ("runs", {"type": "page"}),
            ("queuedItems", {"type": "page"}),
        ):
            _, token = await _page(store, scope_a, "t1", family, selection, 1)
            with pytest.raises(ThreadStorePageTokenError):
                await _page(store, scope_b, "t1", family, selection, 1, token)

    async def test_tampered_token_rejected(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", "messages", MSG_RAW, 2)
        assert token is not None
        for index in (0, len(token) // 3, len(token) // 2, len(token) - 1):
            flipped = "A" if token[index] != "A" else "B"
            tampered = token[:index] + flipped + token[index + 1 :]
            with pytest.raises(ThreadStorePageTokenError):
                await _page(store, scope, "t1", "messages", MSG_RAW, 2, tampered)
        for mangled in (token[:-1], token + "A", token[1:]):
            with pytest.raises(ThreadStorePageTokenError):
                await _page(store, scope, "t1", "messages", MSG_RAW, 2, mangled)

    @pytest.mark.parametrize(
        "garbage", ["garbage", "a.b.c", "...", "🧵", "null", "{}", "eyJ2IjoxfQ", " "]
    )
    async def test_garbage_token_rejected(self, store: ThreadStore, garbage: str) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        with pytest.raises(ThreadStorePageTokenError):
            await _page(store, scope, "t1", "messages", MSG_RAW, 2, garbage)
        with pytest.raises(ThreadStorePageTokenError):
            await _page(store, scope, "t1", "runs", {"type": "page"}, 2, garbage)

    # ------------------------------------------------------------ snapshot anchors

    @pytest.mark.parametrize("order", ["oldest", "newest"])
    async def test_later_pages_never_show_later_inserts(
        self, store: ThreadStore, order: str
    ) -> None:
        scope = new_scope()
        created = await _create(
            store, scope, "t1", {"messages": [b.insert(b.message(f"m{i}")) for i in range(1, 5)]}
        )
        selection = {"type": "page", "view": "raw", "order": order}
        first, token = await _page(store, scope, "t1", "messages", selection, 2)
        await _update(
            store, scope, "t1", created.version, {"messages": [b.insert(b.message("m5"))]}
        )
        rest = _flat(await _walk_from(store, scope, "messages", selection, 2, token))
        expected = ["m1", "m2", "m3", "m4"]
        assert first + rest == (expected if order == "oldest" else expected[::-1])

    async def test_delete_last_then_insert_is_not_shown(self, store: ThreadStore) -> None:
        scope = new_scope()
        version = (
            await _create(
                store,
                scope,
                "t1",
                {"messages": [b.insert(b.message(f"m{i}")) for i in range(1, 5)]},
            )
        ).version
        first, token = await _page(store, scope, "t1", "messages", MSG_RAW, 2)
        assert first == ["m1", "m2"]
        version = (
            await _update(
                store, scope, "t1", version, {"messages": [{"type": "delete", "id": "m4"}]}
            )
        ).version
        version = (
            await _update(store, scope, "t1", version, {"messages": [b.insert(b.message("m5"))]})
        ).version
        rest = _flat(await _walk_from(store, scope, "messages", MSG_RAW, 2, token))
        assert rest == ["m3"]
        fresh = _flat(await _walk(store, scope, "t1", "messages", MSG_RAW, 2))
        assert fresh == ["m1", "m2", "m3", "m5"]

    async def test_delete_last_and_insert_in_one_commit_is_not_shown(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        created = await _create(
            store, scope, "t1", {"messages": [b.insert(b.message(f"m{i}")) for i in range(1, 5)]}
        )
        first, token = await _page(store, scope, "t1", "messages", MSG_RAW, 3)
        assert first == ["m1", "m2", "m3"]
        await _update(
            store,
            scope,
            "t1",
            created.version,
            {"messages": [{"type": "delete", "id": "m4"}, b.insert(b.message("m5"))]},
        )
        rest, last = await _page(store, scope, "t1", "messages", MSG_RAW, 3, token)
        assert (rest, last) == ([], None)

    async def test_runs_and_queued_items_pages_never_show_later_inserts(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        created = await _full_thread(store, scope)
        runs_first, runs_token = await _page(store, scope, "t1", "runs", {"type": "page"}, 10)
        queued_first, queued_token = await _page(
            store, scope, "t1", "queuedItems", {"type": "page"}, 4
        )
        await _update(
            store,
            scope,
            "t1",
            created.version,
            {
                "runs": [b.insert(b.run("rq9", "queued", queue_item_id="q9"))],
                "queuedItems": [b.insert(b.queued_item("q9", "rq9"))],
            },
        )
        runs_rest = _flat(await _walk_from(store, scope, "runs", {"type": "page"}, 10, runs_token))
        queued_rest = _flat(
            await _walk_from(store, scope, "queuedItems", {"type": "page"}, 4, queued_token)
        )
        assert runs_first + runs_rest == [*RUN_STATUSES, "rq1", "rq2", "rq3", "rq4", "rq5"]
        assert queued_first + queued_rest == ["q1", "q2", "q3", "q4", "q5"]

    async def test_records_deleted_after_first_page_are_not_shown(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(
            store, scope, "t1", {"messages": [b.insert(b.message(f"m{i}")) for i in range(1, 7)]}
        )
        _, token = await _page(store, scope, "t1", "messages", MSG_RAW, 2)
        await _update(
            store, scope, "t1", created.version, {"messages": [{"type": "delete", "id": "m4"}]}
        )
        rest = _flat(await _walk_from(store, scope, "messages", MSG_RAW, 2, token))
        assert rest == ["m3", "m5", "m6"]

    @pytest.mark.parametrize(
        ("family", "selection"),
        [
            ("messages", MSG_RAW),
            ("runs", {"type": "page"}),
            ("queuedItems", {"type": "page"}),
        ],
    )
    async def test_token_of_deleted_and_recreated_thread_rejected(
        self, store: ThreadStore, family: str, selection: dict[str, Any]
    ) -> None:
        scope = new_scope()
        created = await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", family, selection, 1)
        assert token is not None
        deleted = await store.commit_thread(b.delete(scope, "t1", created.version))
        assert isinstance(deleted, CommittedResult)
        await _full_thread(store, scope)
        with pytest.raises(ThreadStorePageTokenError, match="earlier incarnation"):
            await _page(store, scope, "t1", family, selection, 1, token)

    # ------------------------------------------------------------ later pages, more cases

    @pytest.mark.parametrize("with_runs", [False, True], ids=["one-family", "two-families"])
    async def test_continuation_of_a_deleted_thread_reads_nothing(
        self, store: ThreadStore, with_runs: bool
    ) -> None:
        scope = new_scope()
        created = await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", "messages", MSG_RAW, 2)
        assert token is not None
        deleted = await store.commit_thread(b.delete(scope, "t1", created.version))
        assert isinstance(deleted, CommittedResult)
        include: dict[str, Any] = {"messages": _with_page(MSG_RAW, 2, token)}
        if with_runs:
            include["runs"] = {"type": "page", "page": {"limit": 2}}
        result = await store.read_thread(b.read(scope, "t1", **include))
        assert result.thread is None
        assert (result.messages, result.runs, result.queued_items) == (None, None, None)

    async def test_earlier_incarnation_is_refused_in_a_read_of_several_families(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        created = await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", "runs", {"type": "page"}, 2)
        assert token is not None
        await store.commit_thread(b.delete(scope, "t1", created.version))
        await _full_thread(store, scope)
        with pytest.raises(ThreadStorePageTokenError, match="earlier incarnation"):
            await store.read_thread(
                b.read(
                    scope,
                    "t1",
                    messages=_with_page(MSG_RAW, 2, None),
                    runs=_with_page({"type": "page"}, 2, token),
                    queuedItems={"type": "ids", "queueItemIds": ["q1"]},
                )
            )

    @pytest.mark.parametrize("order", ["oldest", "newest"])
    @pytest.mark.parametrize("with_runs", [False, True], ids=["one-family", "two-families"])
    async def test_deleting_a_bound_anchor_does_not_end_the_walk(
        self, store: ThreadStore, order: str, with_runs: bool
    ) -> None:
        scope = new_scope()
        created = await _full_thread(store, scope)
        selection = {
            "type": "page",
            "view": "raw",
            "order": order,
            "afterMessageId": "m1",
            "beforeMessageId": "m7",
        }
        first, token = await _page(store, scope, "t1", "messages", selection, 2)
        await _update(
            store,
            scope,
            "t1",
            created.version,
            {"messages": [{"type": "delete", "id": "m1"}, {"type": "delete", "id": "m7"}]},
        )
        rest: list[str] = []
        while token is not None:
            include: dict[str, Any] = {"messages": _with_page(selection, 2, token)}
            if with_runs:
                include["runs"] = {"type": "page", "page": {"limit": 1}}
            result = await store.read_thread(b.read(scope, "t1", **include))
            assert result.messages is not None
            rest.extend(m.message_id for m in result.messages.items)
            token = result.messages.next_page_token
        expected = ["m2", "m3", "m4", "m5", "m6"]
        assert first + rest == (expected if order == "oldest" else expected[::-1])
        # A new first page looks the anchors up again: now they are missing.
        with pytest.raises(ThreadStoreInvariantError, match="m1"):
            await _page(store, scope, "t1", "messages", selection, 2)

    async def test_replaced_records_show_their_current_content_on_later_pages(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        created = await _full_thread(store, scope)
        first = await store.read_thread(b.read(scope, "t1", messages=_with_page(MSG_RAW, 2, None)))
        assert first.messages is not None
        token = first.messages.next_page_token
        updated = await _update(
            store,
            scope,
            "t1",
            created.version,
            {"messages": [{"type": "replace", "record": b.message("m3", "edited")}]},
        )
        second = await store.read_thread(
            b.read(scope, "t1", messages=_with_page(MSG_RAW, 2, token))
        )
        assert second.messages is not None
        assert [m.message_id for m in second.messages.items] == ["m3", "m4"]
        assert getattr(second.messages.items[0].parts[0], "text", None) == "edited"
        assert first.messages.version == created.version
        assert second.messages.version == updated.version

    @pytest.mark.parametrize(
        ("first", "again"),
        [
            (["failed", "completed"], ["completed", "failed"]),
            (["failed", "completed"], ["completed", "failed", "completed"]),
        ],
    )
    async def test_statuses_are_compared_as_a_set(
        self, store: ThreadStore, first: list[str], again: list[str]
    ) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        ids, token = await _page(store, scope, "t1", "runs", {"type": "page", "statuses": first}, 2)
        assert ids == ["r1", "r2"]
        rest = _flat(
            await _walk_from(store, scope, "runs", {"type": "page", "statuses": again}, 2, token)
        )
        assert rest == ["r4", "r5", "r6"]

    @pytest.mark.parametrize("bad", [True, False, 1.0, "2", None, [2]], ids=repr)
    async def test_limit_must_be_an_integer(self, store: ThreadStore, bad: object) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        for family, selection in (
            ("messages", MSG_RAW),
            ("runs", {"type": "page"}),
            ("queuedItems", {"type": "page"}),
        ):
            request = b.read(scope, "t1", **{family: {**selection, "page": {"limit": bad}}})
            with pytest.raises(ThreadStoreInvariantError, match="limit"):
                await store.read_thread(request)

    async def test_walk_of_more_than_one_full_page(self, store: ThreadStore) -> None:
        scope = new_scope()
        ids = [f"m{i:03d}" for i in range(MAX_PAGE_SIZE + 30)]
        await _create(store, scope, "t1", {"messages": [b.insert(b.message(m)) for m in ids]})
        pages = await _walk(store, scope, "t1", "messages", MSG_RAW, MAX_PAGE_SIZE)
        assert [len(page) for page in pages] == [MAX_PAGE_SIZE, 30]
        assert _flat(pages) == ids
        newest = {**MSG_RAW, "order": "newest"}
        pages = await _walk(store, scope, "t1", "messages", newest, MAX_PAGE_SIZE)
        assert _flat(pages) == ids[::-1]

    async def test_model_and_json_inputs_walk_alike(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        selection = {"type": "page", "view": "context", "order": "newest"}
        json_pages = await _walk(store, scope, "t1", "messages", selection, 2)
        model_pages: list[list[str]] = []
        token: str | None = None
        while True:
            request = ReadThreadInput.model_validate(
                b.read(scope, "t1", messages=_with_page(selection, 2, token))
            )
            result = await store.read_thread(request)
            assert result.messages is not None
            model_pages.append([m.message_id for m in result.messages.items])
            page_json = result.to_json()["messages"]
            token = result.messages.next_page_token
            if token is None:
                assert "nextPageToken" not in page_json
                break
            assert page_json["nextPageToken"] == token
        assert model_pages == json_pages == [["m7", "m5"], ["m4", "m2"], ["m1"]]

    async def test_token_of_another_store_is_rejected(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _full_thread(store, scope)
        _, token = await _page(store, scope, "t1", "messages", MSG_RAW, 2)
        assert token is not None
        prefix = token_parts(token)[0].decode()[:-1]
        payload = token_payload(token)
        for codec, words in (
            (PageTokenCodec(prefix + "-elsewhere"), "another store"),
            (PageTokenCodec(prefix, secret=b"another deployment's secret"), "tampered"),
        ):
            # The same page of the same query, minted by the other store.
            forged = codec.encode(payload["k"], scope, payload["q"], payload["p"])
            with pytest.raises(ThreadStorePageTokenError, match=words):
                await _page(store, scope, "t1", "messages", MSG_RAW, 2, forged)

    @pytest.mark.parametrize("order", ["oldest", "newest"])
    async def test_truncation_and_new_inserts_between_pages(
        self, store: ThreadStore, order: str
    ) -> None:
        # A truncation removes the tail; messages inserted in the same commit
        # take new positions above the token's upper anchor, so the walk ends
        # with what is left of the messages it started with.
        scope = new_scope()
        created = await _create(
            store, scope, "t1", {"messages": [b.insert(b.message(f"m{i}")) for i in range(1, 7)]}
        )
        selection = {"type": "page", "view": "raw", "order": order}
        first, token = await _page(store, scope, "t1", "messages", selection, 2)
        await _update(
            store,
            scope,
            "t1",
            created.version,
            {"messages": [b.truncate("m3"), b.insert(b.message("m7"))]},
        )
        rest = _flat(await _walk_from(store, scope, "messages", selection, 2, token))
        if order == "oldest":
            assert first + rest == ["m1", "m2", "m3"]
        else:
            assert (first, rest) == (["m6", "m5"], ["m3", "m2", "m1"])
        fresh = _flat(await _walk(store, scope, "t1", "messages", selection, 2))
        expected = ["m1", "m2", "m3", "m7"]
        assert fresh == (expected if order == "oldest" else expected[::-1])

    async def test_two_families_walk_together_in_one_read(self, store: ThreadStore) -> None:
        # Each family's token continues its own query; one read carries both.
        scope = new_scope()
        await _full_thread(store, scope)
        messages = {"type": "page", "view": "transcript", "order": "newest"}
        runs = {"type": "page", "statuses": ["completed", "queued"]}
        tokens: dict[str, str | None] = {"messages": None, "runs": None}
        seen: dict[str, list[str]] = {"messages": [], "runs": []}
        limits = {"messages": 1, "runs": 3}
        first = True
        while first or any(tokens.values()):
            include = {
                family: _with_page(selection, limits[family], tokens[family])
                for family, selection in (("messages", messages), ("runs", runs))
                if first or tokens[family] is not None
            }
            first = False
            result = await store.read_thread(b.read(scope, "t1", **include))
            assert result.thread is not None
            for family in include:
                page = getattr(result, ATTR[family])
                assert page.version == result.thread.version
                seen[family].extend(getattr(item, ID_ATTR[family]) for item in page.items)
                tokens[family] = page.next_page_token
        assert seen["messages"] == VIEWS["transcript"][::-1]
        assert seen["runs"] == ["r1", "r4", "r6", "rq1", "rq2", "rq3", "rq4", "rq5"]


async def _walk_from(
    store: ThreadStore,
    scope: str,
    family: str,
    selection: dict[str, Any],
    limit: int,
    token: str | None,
) -> list[list[str]]:
    pages: list[list[str]] = []
    while token is not None:
        ids, token = await _page(store, scope, "t1", family, selection, limit, token)
        pages.append(ids)
        assert len(pages) < 200, "pagination does not terminate"
    return pages
