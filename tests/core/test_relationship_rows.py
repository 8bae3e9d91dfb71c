"""The relationship facts of a normalized backend, folded once in the core from its rows.

A backend that keeps records as rows (PostgreSQL, SQL) queries three sets of
rows for the runs a commit affects and hands them to
:func:`~pai_storage.relationships.run_facts_from_rows`; the spans with gaps
(:func:`~pai_storage.relationships.gapped_spans`) are the only ones it must
look inside for a foreign message. Folded from an aggregate's rows, the facts
equal the aggregate's own (:func:`relations_from_aggregate`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from pai_storage import builders as b
from pai_storage import codec
from pai_storage.backend import (
    MessageRef,
    QueueRef,
    RunRef,
    RunRelations,
    ThreadAggregate,
    gapped_spans,
    message_ref_from_row,
    relations_from_aggregate,
    run_facts_from_rows,
    run_ref_from_row,
)
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.rows import enc, enc_opt

from .test_relationships import valid_aggregates


def run_doc(run_id: str, status: str = "completed", **options: Any) -> str:
    """A stored run's text (the fields the rules read), as a ``doc`` column holds it."""
    return json.dumps(b.run(run_id, status, **options))


def test_rows_fold_into_facts_per_asked_run() -> None:
    facts = run_facts_from_rows(
        ["r1", "r2"],
        runs=[(enc("r1"), run_doc("r1", inputs=["m1"]))],
        messages=[
            (enc("r1"), 7, enc("m2"), "output"),
            (enc("r1"), 5, enc("m1"), "input"),
            (enc("r2"), 9, enc("m9"), None),
        ],
        items=[(enc("r2"), enc("q2"), 4), (enc("r2"), enc("q1"), 3)],
    )
    assert list(facts) == ["r1", "r2"]
    r1, r2 = facts["r1"], facts["r2"]
    assert r1.run == RunRef("r1", "completed", True, None, ("m1",))
    # Messages and queued items come back in position order, whatever the rows' order.
    assert list(r1.messages) == [
        MessageRef("m1", 5, "r1", "input"),
        MessageRef("m2", 7, "r1", "output"),
    ]
    assert r2.run is None  # no run row: a missing run
    assert list(r2.messages) == [MessageRef("m9", 9, "r2", None)]
    assert list(r2.queued_items) == [QueueRef("q1", "r2"), QueueRef("q2", "r2")]
    assert not r1.foreign_inside  # the backend's to find out
    assert not r2.foreign_inside


def test_rows_of_runs_not_asked_for_are_ignored() -> None:
    # SQL matches rows by a digest of the run id: another id may share it.
    facts = run_facts_from_rows(
        ["r1"],
        runs=[(enc("rX"), run_doc("rX"))],
        messages=[(enc("rX"), 1, enc("m1"), "input")],
        items=[(enc("rX"), enc("q1"), 1)],
    )
    assert set(facts) == {"r1"}
    assert facts["r1"].run is None
    assert not facts["r1"].messages
    assert not facts["r1"].queued_items


def test_an_invalid_stored_run_is_an_invariant_error() -> None:
    with pytest.raises(ThreadStoreInvariantError, match="stored run is invalid"):
        run_facts_from_rows(["r1"], runs=[(enc("r1"), "{}")], messages=[], items=[])


def test_only_spans_with_gaps_are_looked_inside() -> None:
    facts = run_facts_from_rows(
        ["dense", "gapped", "single", "none"],
        runs=[],
        messages=[
            (enc("dense"), 1, enc("a"), "input"),
            (enc("dense"), 2, enc("b"), "output"),
            (enc("gapped"), 3, enc("c"), "input"),
            (enc("gapped"), 6, enc("d"), "output"),
            (enc("single"), 8, enc("e"), "input"),
        ],
        items=[],
    )
    assert gapped_spans(facts) == [("gapped", 3, 6)]


def test_open_run_and_tail_rows() -> None:
    assert run_ref_from_row((enc("r1"), run_doc("r1", "running"))) == RunRef(
        "r1", "running", True, None, ()
    )
    assert message_ref_from_row((4, enc("m1"), enc("r1"), "input")) == MessageRef(
        "m1", 4, "r1", "input"
    )
    assert message_ref_from_row((4, enc("m1"), None, None)) == MessageRef("m1", 4, None, None)


def _rows(aggregate: ThreadAggregate) -> tuple[list[Any], list[Any], list[Any]]:
    """The rows a normalized backend would return for every run (in storage order)."""
    runs = [(enc(e.record.run_id), codec.encode(e.record)) for e in aggregate.runs]
    messages = [
        (
            enc_opt(e.record.run_id),
            e.position,
            enc(e.record.message_id),
            getattr(e.record.association, "relation", None),
        )
        for e in reversed(list(aggregate.messages))  # any order: the fold sorts
        if e.record.run_id is not None
    ]
    items = [
        (enc(e.record.run_id), enc(e.record.queue_item_id), e.position)
        for e in aggregate.queued_items
    ]
    return runs, messages, items


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_aggregates())
def test_folded_rows_agree_with_the_aggregate(aggregate: ThreadAggregate) -> None:
    expected = relations_from_aggregate(aggregate).runs
    runs, messages, items = _rows(aggregate)
    folded = run_facts_from_rows(list(expected), runs, messages, items)
    owners = {e.position: e.record.run_id for e in aggregate.messages}
    for run_id, lo, hi in gapped_spans(folded):
        # What a backend's query answers: another message strictly inside the span.
        folded[run_id].foreign_inside = any(
            lo < p < hi and owner != run_id for p, owner in owners.items()
        )
    assert _plain(folded) == _plain(expected)


def _plain(facts: Mapping[str, RunRelations]) -> dict[str, tuple[Any, ...]]:
    return {
        k: (v.run, list(v.messages), v.foreign_inside, list(v.queued_items))
        for k, v in facts.items()
    }
