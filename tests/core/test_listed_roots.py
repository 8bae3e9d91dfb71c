"""``listed_roots``: the roots of a list page's rows, or the warnings that skip them;
``list_page``: a list page from a backend's ordered batches of rows.

Both text backends (PostgreSQL, SQL) list through them; these cases pin what
they give for every kind of bad row, in row order, whether the page's roots are
remembered or validated afresh, and where each batch starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pai_storage import ListThreadsInput, ThreadRecord, codec
from pai_storage.events import StoreWarning
from pai_storage.rows import ListCursor, ListRow, list_page, listed_roots
from pai_storage.selection import ListPlan, SelectionHelpers, timestamp_ms


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    codec.cache.clear()
    yield
    codec.cache.clear()


def _root(thread_id: str, scope: str = "s", ms: int = 0, agent: str = "a") -> ThreadRecord:
    return ThreadRecord.model_validate(
        {
            "scopeKey": scope,
            "threadId": thread_id,
            "version": {"threadInstanceId": "i" * 8, "revision": 1},
            "agent": agent,
            "directExecutionAllowed": True,
            "listVisibility": "visible",
            "metadata": {"k": [1]},
            "privateMetadata": {},
            "createdAt": "2026-01-02T03:04:05.000Z",
            "updatedAt": f"2026-01-02T03:04:05.{ms:03d}Z",
        }
    )


def _row(root: ThreadRecord) -> tuple[int, bytes, str]:
    return (-timestamp_ms(root.updated_at), root.thread_id.encode(), codec.encode(root))


def _skipped(thread_id: str | None, reason: str) -> StoreWarning:
    return StoreWarning(
        kind="invalid_thread_skipped",
        reason=f"stored thread root failed validation ({reason})",
        scope_key="s",
        thread_id=thread_id,
    )


@pytest.mark.parametrize("times", [1, 2, 3])  # decoded, then shared from the cache
def test_valid_rows_give_their_roots_in_row_order(times: int) -> None:
    roots = [_root(f"t{i}", ms=i) for i in range(5)]
    rows = [_row(r) for r in roots]
    for _ in range(times):
        listed = list(listed_roots("s", rows))
        assert listed == roots
        with pytest.raises(TypeError):
            listed[0].metadata["k"].append(2)  # read-only: shared by every reader
    assert list(listed_roots("s", rows)) == roots
    assert list(listed_roots("s", [])) == []


def _bad_rows() -> list[tuple[tuple[int, bytes, str], StoreWarning]]:
    good = _root("bad")
    key, tid, doc = _row(good)
    data: dict[str, Any] = json.loads(doc)
    return [
        ((key, tid, doc.replace('"agent"', '"agnt"')), _skipped("bad", "invalid ThreadRecord")),
        ((key, tid, "not json"), _skipped("bad", "invalid ThreadRecord")),
        (
            (key, tid, codec.encode(_root("bad", scope="other"))),
            _skipped("bad", "stored identity or order key does not match"),
        ),
        ((key, b"other", doc), _skipped("other", "stored identity or order key does not match")),
        ((key, b"\xff", doc), _skipped(None, "stored identity or order key does not match")),
        ((key + 1, tid, doc), _skipped("bad", "stored identity or order key does not match")),
        ((key, tid, json.dumps(data | {"threadId": 3})), _skipped("bad", "invalid ThreadRecord")),
    ]


@pytest.mark.parametrize("case", range(len(_bad_rows())))
@pytest.mark.parametrize("times", [1, 2])
def test_a_bad_row_is_skipped_with_a_warning_and_the_others_kept(case: int, times: int) -> None:
    row, warning = _bad_rows()[case]
    roots = [_root(f"t{i}", ms=i) for i in range(3)]
    rows = [_row(roots[0]), row, _row(roots[1]), _row(roots[2])]
    for _ in range(times):
        listed = list(listed_roots("s", rows))
        assert listed[0] == roots[0]
        assert listed[2:] == roots[1:]
        assert listed[1] == warning  # the reason names no stored contents


def test_roots_are_cached_as_any_read_caches_them() -> None:
    # Valid roots are shared from the codec's cache on the next listing; the
    # bad row is never cached.
    roots = [_root(f"t{i}", ms=i) for i in range(3)]
    rows = [*map(_row, roots), _bad_rows()[0][0]]
    codec.cache.clear()  # encoding kept the roots it encoded (test_codec_encode_keeps.py): none yet
    first = list(listed_roots("s", rows))
    assert len(codec.cache) == 3
    again = list(listed_roots("s", rows))
    assert all(a is b for a, b in zip(first[:3], again[:3], strict=True))


def test_roots_are_validated_as_the_caller_takes_them() -> None:
    roots = [_root(f"t{i}", ms=i) for i in range(3)]
    rows = [_row(roots[0]), ("not", "a", "row"), _row(roots[2])]
    listed = listed_roots("s", rows)  # type: ignore[arg-type]
    assert next(listed) == roots[0]  # the rest not validated yet


# ---------------------------------------------------------------- list_page

HELPERS = SelectionHelpers("test")


def _plan(limit: int, page_token: str | None = None, **filters: Any) -> ListPlan:
    request = {"scopeKey": "s", "limit": limit, "pageToken": page_token} | filters
    return HELPERS.plan_list(ListThreadsInput.model_validate(request))


class _Batches:
    """A backend's ordered batches over ``rows``, recording where each starts."""

    def __init__(self, plan: ListPlan, rows: list[ListRow]) -> None:
        self.plan = plan
        self.rows = sorted(rows, key=lambda r: (r[0], r[1]))
        self.cursors: list[ListCursor | None] = []
        self.warnings: list[StoreWarning] = []

    async def __call__(self, cursor: ListCursor | None) -> Sequence[ListRow]:
        self.cursors.append(cursor)
        after = [r for r in self.rows if cursor is None or (r[0], r[1]) > cursor]
        return after[: self.plan.fetch]

    async def warn(self, warning: StoreWarning) -> None:
        self.warnings.append(warning)

    async def page(self) -> Any:
        return await list_page(self.plan, self, self.warn)


def _newest_first(count: int, agent: str = "a") -> list[ThreadRecord]:
    return [_root(f"t{i}", ms=100 - i, agent=agent) for i in range(count)]


def _bad(after: ThreadRecord) -> ListRow:
    # Listed right after ``after`` (the same order key, a greater thread id).
    return (-timestamp_ms(after.updated_at), after.thread_id.encode() + b"~", "not json")


async def test_a_page_of_valid_rows_is_one_batch_from_the_start() -> None:
    roots = _newest_first(5)
    batches = _Batches(_plan(2), [_row(r) for r in roots])
    page = await batches.page()
    assert page.items == roots[:2]
    assert page.next_page_token is not None
    assert batches.cursors == [None]
    assert batches.warnings == []


async def test_skipped_rows_continue_after_the_last_row_seen() -> None:
    roots = _newest_first(4)
    bad = [_bad(roots[0]), (_bad(roots[0])[0], b"t0~~", "not json")]
    batches = _Batches(_plan(2), [*map(_row, roots), *bad])  # fetch 3: t0 and the two bad
    page = await batches.page()
    assert page.items == roots[:2]
    assert page.next_page_token is not None  # t2 was found too: there is a next page
    assert batches.cursors == [None, (bad[1][0], bad[1][1])]
    assert batches.warnings == [
        _skipped("t0~", "invalid ThreadRecord"),
        _skipped("t0~~", "invalid ThreadRecord"),
    ]


async def test_a_short_batch_ends_the_page() -> None:
    roots = _newest_first(2)
    batches = _Batches(_plan(5), [_row(roots[0]), _bad(roots[0]), _row(roots[1])])
    page = await batches.page()
    assert page.items == roots
    assert page.next_page_token is None
    assert batches.cursors == [None]
    assert len(batches.warnings) == 1


async def test_rows_the_filters_refuse_are_seen_but_not_warned() -> None:
    # A backend filters on its columns; a root whose own fields do not pass is
    # left out quietly, and a full batch of them still continues.
    others = _newest_first(3, agent="other")
    mine = [_root(f"u{i}", ms=10 - i, agent="b") for i in range(2)]
    batches = _Batches(_plan(1, agent="b"), [*map(_row, others), *map(_row, mine)])
    page = await batches.page()
    assert page.items == mine[:1]
    assert batches.cursors[0] is None
    assert len(batches.cursors) == 3
    assert batches.warnings == []


async def test_the_first_batch_starts_at_the_page_token() -> None:
    roots = _newest_first(5)
    rows = [_row(r) for r in roots]
    first = await _Batches(_plan(2), rows).page()
    batches = _Batches(_plan(2, page_token=first.next_page_token), rows)
    page = await batches.page()
    assert page.items == roots[2:4]
    assert batches.cursors == [(-timestamp_ms(roots[1].updated_at), b"t1")]
