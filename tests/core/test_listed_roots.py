"""``listed_roots``: the roots of a list page's rows, or the warnings that skip them.

Both text backends (PostgreSQL, SQL) list through it; these cases pin what it
gives for every kind of bad row, in row order, whether the page's roots are
remembered or validated afresh.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from pai_storage import ThreadRecord
from pai_storage.events import StoreWarning
from pai_storage.models import stored_records
from pai_storage.rows import dump, listed_roots
from pai_storage.selection import timestamp_ms


@pytest.fixture(autouse=True)
def fresh_memo() -> Iterator[None]:
    stored_records.clear()
    yield
    stored_records.clear()


def _root(thread_id: str, scope: str = "s", ms: int = 0) -> ThreadRecord:
    return ThreadRecord.model_validate(
        {
            "scopeKey": scope,
            "threadId": thread_id,
            "version": {"threadInstanceId": "i" * 8, "revision": 1},
            "agent": "a",
            "directExecutionAllowed": True,
            "listVisibility": "visible",
            "metadata": {"k": [1]},
            "privateMetadata": {},
            "createdAt": "2026-01-02T03:04:05.000Z",
            "updatedAt": f"2026-01-02T03:04:05.{ms:03d}Z",
        }
    )


def _row(root: ThreadRecord) -> tuple[int, bytes, str]:
    return (-timestamp_ms(root.updated_at), root.thread_id.encode(), dump(root))


def _skipped(thread_id: str | None, reason: str) -> StoreWarning:
    return StoreWarning(
        kind="invalid_thread_skipped",
        reason=f"stored thread root failed validation ({reason})",
        scope_key="s",
        thread_id=thread_id,
    )


@pytest.mark.parametrize("times", [1, 2, 3])  # validated, then remembered
def test_valid_rows_give_their_roots_in_row_order(times: int) -> None:
    roots = [_root(f"t{i}", ms=i) for i in range(5)]
    rows = [_row(r) for r in roots]
    for _ in range(times):
        listed = list(listed_roots("s", rows))
        assert listed == roots
        listed[0].metadata["k"].append(2)  # a copy: nothing later changes
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
            (key, tid, dump(_root("bad", scope="other"))),
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


def test_roots_are_kept_as_any_read_keeps_them() -> None:
    # Read twice before they are kept, whether or not a bad row is beside them;
    # the bad row is never kept.
    roots = [_root(f"t{i}", ms=i) for i in range(3)]
    rows = [*map(_row, roots), _bad_rows()[0][0]]
    list(listed_roots("s", rows))
    assert len(stored_records) == 0
    list(listed_roots("s", rows))
    assert len(stored_records) == 3


def test_roots_are_validated_as_the_caller_takes_them() -> None:
    roots = [_root(f"t{i}", ms=i) for i in range(3)]
    rows = [_row(roots[0]), ("not", "a", "row"), _row(roots[2])]
    listed = listed_roots("s", rows)  # type: ignore[arg-type]
    assert next(listed) == roots[0]  # the rest not validated yet
