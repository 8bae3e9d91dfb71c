"""A whole thread to and from a row backend's rows, written once in the core.

:func:`~pai_storage.rows.thread_from_rows` is what a lifecycle load returns
from ``(position, doc)`` rows; :func:`~pai_storage.rows.insert_thread` is a
restore through the commit primitives (PostgreSQL and SQL both use them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from pai_storage import codec
from pai_storage.backend import Family, FamilyName, FamilySpec, FamilyWrite, ThreadAggregate
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.models import ThreadRecord
from pai_storage.rows import insert_thread, parse_root, thread_from_rows

from .test_relationships import valid_aggregates

ROW_FAMILIES: tuple[FamilyName, ...] = ("messages", "runs", "queuedItems")


def _rows(aggregate: ThreadAggregate) -> dict[FamilyName, list[tuple[int, str]]]:
    families: dict[FamilyName, Family[Any]] = {
        "messages": aggregate.messages,
        "runs": aggregate.runs,
        "queuedItems": aggregate.queued_items,
    }
    return {
        name: [(e.position, codec.encode(e.record)) for e in fam] for name, fam in families.items()
    }


def _counters(aggregate: ThreadAggregate) -> dict[FamilyName, int]:
    return {
        "messages": aggregate.messages.next_position,
        "runs": aggregate.runs.next_position,
        "queuedItems": aggregate.queued_items.next_position,
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_aggregates())
def test_rows_give_back_the_thread(aggregate: ThreadAggregate) -> None:
    loaded = thread_from_rows(aggregate.root, _counters(aggregate), _rows(aggregate))
    assert loaded.to_json() == aggregate.to_json()


def test_a_damaged_row_is_invalid_stored_data() -> None:
    root = _root()
    rows: dict[FamilyName, list[tuple[int, str]]] = {name: [] for name in ROW_FAMILIES}
    rows["runs"] = [(1, "{not json")]
    with pytest.raises(ThreadStoreInvariantError):
        thread_from_rows(root, dict.fromkeys(ROW_FAMILIES, 1), rows)


class _Recorder:
    """The commit primitives a restore calls, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        self.calls.append(("root", root.thread_id, dict(next_positions), created))

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        self.calls.append(("family", spec.name, [e.position for e in write.inserts]))
        return ()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_aggregates())
async def test_a_restore_writes_the_root_created_then_each_non_empty_family(
    aggregate: ThreadAggregate,
) -> None:
    tx = _Recorder()
    await insert_thread(tx, aggregate)  # type: ignore[arg-type]
    rows = _rows(aggregate)
    expected: list[tuple[Any, ...]] = [
        ("root", aggregate.root.thread_id, _counters(aggregate), True)
    ]
    expected += [("family", n, [p for p, _ in rows[n]]) for n in ROW_FAMILIES if rows[n]]
    assert tx.calls == expected


def _root() -> ThreadRecord:
    from .test_relationships import create

    aggregate = create()
    assert aggregate is not None
    return aggregate.root


def test_a_root_read_by_another_key_is_invalid_stored_data() -> None:
    root = _root()
    doc = codec.encode(root)
    assert parse_root(doc, root.scope_key, root.thread_id) == root
    with pytest.raises(ThreadStoreInvariantError, match="does not match its key"):
        parse_root(doc, root.scope_key, "another")
    with pytest.raises(ThreadStoreInvariantError, match="does not match its key"):
        parse_root(doc, "another", root.thread_id)
