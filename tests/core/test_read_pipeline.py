"""The read pipeline gives the same result whether a backend answers the root and
a page in one request (``ReadSnapshot.head_and_page``) or in separate ones."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pai_storage import ThreadReadResult
from pai_storage import builders as b
from pai_storage.backend import (
    AggregateSnapshot,
    ChildPagePlan,
    FamilySpec,
    SelectionHelpers,
    SnapshotRoot,
    ThreadAggregate,
    Window,
    apply_thread_changes,
    run_read,
    run_sync,
)
from pai_storage.errors import ThreadStorePageTokenError
from pai_storage.models import ReadThreadInput

T0 = datetime(2030, 1, 1, tzinfo=UTC)
OBSERVED = T0 + timedelta(hours=1)
HELPERS = SelectionHelpers("pai-test")


class SeparateRequests(AggregateSnapshot):
    """The same snapshot without the one-request primitive (root, then pages)."""

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        return None


class Recording(AggregateSnapshot):
    """Records whether the one-request primitive answered."""

    combined = 0

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        Recording.combined += 1
        return await super().head_and_page(spec, plan, window)


def _thread() -> ThreadAggregate:
    messages = []
    runs = []
    for n in range(12):
        run_id = f"r{n}"
        messages.append(b.insert(b.message(f"u{n}", f"q{n}", run_id=run_id, relation="input")))
        hidden = b.message(f"h{n}", "note", role="system")
        hidden["visibility"] = {"transcript": False, "context": True}
        messages.append(b.insert(hidden))
        status = "completed" if n % 3 else "failed"
        runs.append(b.insert(b.run(run_id, status, inputs=[f"u{n}"])))
    created = apply_thread_changes(
        None, b.create("s", "t", {"messages": messages, "runs": runs}), T0
    )
    assert created.aggregate is not None
    return created.aggregate


def _read(snapshot: AggregateSnapshot, request: dict[str, Any]) -> ThreadReadResult:
    plan = HELPERS.plan_read(ReadThreadInput.model_validate(request))
    return run_sync(run_read(snapshot, plan))


SELECTIONS: list[tuple[dict[str, Any], int]] = [
    (
        {
            "messages": {
                "type": "page",
                "view": "transcript",
                "order": "newest",
                "page": {"limit": 5},
            }
        },
        3,
    ),
    ({"messages": {"type": "page", "view": "raw", "page": {"limit": 7}}}, 4),
    (
        {"messages": {"type": "page", "view": "context", "order": "newest", "page": {"limit": 50}}},
        1,
    ),
    ({"runs": {"type": "page", "statuses": ["failed"], "page": {"limit": 2}}}, 2),
    ({"runs": {"type": "page", "order": "newest", "page": {"limit": 3}}}, 4),
    ({"queuedItems": {"type": "page", "page": {"limit": 3}}}, 1),
]


@pytest.mark.parametrize(("include", "expected_pages"), SELECTIONS)
def test_one_request_and_separate_requests_read_the_same_pages(
    include: dict[str, Any], expected_pages: int
) -> None:
    thread = _thread()
    family = next(iter(include))
    selection = include[family]
    token = None
    pages = 0
    while True:
        page_request = selection["page"] | ({"pageToken": token} if token else {})
        request = b.read("s", "t", **{family: selection | {"page": page_request}})
        before = Recording.combined
        one = _read(Recording(thread, OBSERVED), request)
        assert Recording.combined == before + 1
        separate = _read(SeparateRequests(thread, OBSERVED), request)
        assert one == separate
        assert one.to_json() == separate.to_json()
        pages += 1
        page = one.messages or one.runs or one.queued_items
        assert page is not None
        token = page.next_page_token
        if token is None:
            break
    assert pages == expected_pages


def test_a_first_page_does_not_show_records_beyond_the_counter() -> None:
    # The prospective window of a first page is only capped by the largest
    # position: the rows must stay below the family's counter of the head.
    thread = _thread()
    request = b.read("s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 100}})
    one = _read(Recording(thread, OBSERVED), request)
    assert one.messages is not None
    assert len(one.messages.items) == 24
    plan = HELPERS.plan_read(ReadThreadInput.model_validate(request))
    single = plan.single_page()
    assert single is not None
    assert single[1].prospective_window().upper == 2**63 - 1


def test_reads_that_need_more_than_one_request_take_the_separate_path() -> None:
    thread = _thread()
    for include in (
        {},
        {"messages": {"type": "ids", "messageIds": ["u1", "u2"]}},
        {"messages": {"type": "page", "view": "raw", "afterMessageId": "u3", "page": {"limit": 2}}},
        {
            "messages": {"type": "page", "view": "raw", "page": {"limit": 2}},
            "runs": {"type": "page", "page": {"limit": 2}},
        },
    ):
        request = b.read("s", "t", **include)
        plan = HELPERS.plan_read(ReadThreadInput.model_validate(request))
        assert plan.single_page() is None
        before = Recording.combined
        one = _read(Recording(thread, OBSERVED), request)
        assert Recording.combined == before
        assert one == _read(SeparateRequests(thread, OBSERVED), request)


def test_a_missing_thread_and_a_recreated_thread_behave_alike() -> None:
    request = b.read("s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 2}})
    missing = _read(Recording(None, OBSERVED), request)
    assert missing.thread is None
    assert missing.messages is None
    assert missing == _read(SeparateRequests(None, OBSERVED), request)

    first = _read(Recording(_thread(), OBSERVED), request)
    assert first.messages is not None
    assert first.messages.next_page_token is not None
    token = first.messages.next_page_token
    later = b.read(
        "s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 2, "pageToken": token}}
    )
    recreated = _thread()  # a new incarnation: the token must be refused on both paths
    for snapshot in (Recording(recreated, OBSERVED), SeparateRequests(recreated, OBSERVED)):
        with pytest.raises(ThreadStorePageTokenError, match="earlier incarnation"):
            _read(snapshot, later)


def _plan(request: dict[str, Any], helpers: SelectionHelpers = HELPERS) -> Any:
    return helpers.plan_read(ReadThreadInput.model_validate(request))


def _same_plan(one: Any, other: Any) -> bool:
    # Every attribute alike but the codec and the filter (a new closure per
    # plan; what it accepts is compared by the reads below).
    def attributes(plan: Any) -> dict[str, Any] | None:
        if plan is None:
            return None
        names = [n for n in type(plan).__slots__ if n not in ("_codec", "_accepts")]
        return {n: getattr(plan, n) for n in names} | {"filters": plan._accepts is not None}

    return all(
        attributes(getattr(one, family)) == attributes(getattr(other, family))
        for family in ("messages", "runs", "queued_items")
    ) and (one.scope_key, one.thread_id) == (other.scope_key, other.thread_id)


def _raw_page(token: str | None = None) -> dict[str, Any]:
    page: dict[str, Any] = {"limit": 2} if token is None else {"limit": 2, "pageToken": token}
    return {"type": "page", "view": "raw", "page": page}


def test_a_page_plan_cannot_be_changed() -> None:
    plan = _plan(b.read("s", "t", messages=_raw_page())).messages
    for name in ("limit", "view", "family", "_cursor", "anything"):
        with pytest.raises(AttributeError, match="value shared by reads"):
            setattr(plan, name, None)
        with pytest.raises(AttributeError, match="value shared by reads"):
            delattr(plan, name)
    assert plan.limit == 2
