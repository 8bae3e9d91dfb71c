"""The strict parsers backends use: records, union results and whole aggregates.

They accept exactly the JSON form of docs/data-model.md#the-json-form.
"""

from __future__ import annotations

import asyncio

import pytest

import pai_storage as p
from pai_storage import builders as b
from pai_storage.backend import ThreadAggregate, apply_thread_changes, system_clock
from pai_storage.errors import ThreadStoreInvariantError, ThreadStoreSerializationError
from pai_storage.parsing import (
    parse,
    parse_aggregate,
    parse_commit_result,
    parse_message,
    parse_queued_item,
    parse_run,
    parse_thread,
)


def _aggregate() -> ThreadAggregate:
    async def build() -> ThreadAggregate:
        commit = b.create(
            "s",
            "t",
            {
                "messages": [{"type": "insert", "record": b.message("m1", run_id="r1")}],
                "runs": [{"type": "insert", "record": b.run("r1", inputs=["m1"])}],
            },
        )
        outcome = apply_thread_changes(None, commit, system_clock())
        assert outcome.aggregate is not None
        return outcome.aggregate

    return asyncio.run(build())


def test_commit_results_parse_from_json() -> None:
    conflict = parse_commit_result({"type": "conflict", "currentVersion": None})
    assert isinstance(conflict, p.ConflictResult)
    assert conflict.current_version is None
    committed = parse_commit_result(
        {"type": "committed", "thread": None, "committedAt": "2030-01-01T00:00:00.000Z"}
    )
    assert isinstance(committed, p.CommittedResult)
    assert committed.to_json() == {
        "type": "committed",
        "thread": None,
        "committedAt": "2030-01-01T00:00:00.000Z",
    }


def test_union_parse_rejects_unknown_tag_with_typed_error() -> None:
    with pytest.raises(ThreadStoreInvariantError, match="unknown type"):
        parse(p.Part, {"type": "video", "url": "x"})
    with pytest.raises(ThreadStoreSerializationError, match=r"data\.x: NaN"):
        parse(p.Part, {"type": "data", "name": "n", "data": {"x": float("nan")}})


def test_record_parsers_round_trip() -> None:
    aggregate = _aggregate()
    message = aggregate.messages.entries["m1"].record
    run = aggregate.runs.entries["r1"].record
    assert parse_message(message.to_json()) == message
    assert parse_run(run.to_json()) == run
    assert parse_thread(aggregate.root.to_json()) == aggregate.root
    item = parse_queued_item(
        {
            "queueItemId": "q",
            "runId": "r",
            "input": [1, 1.0, "2030-01-01T00:00:00Z"],
            "metadata": {},
            "createdAt": "2030-01-01T00:00:00.000Z",
        }
    )
    assert item.input == [1, 1.0, "2030-01-01T00:00:00Z"]
    assert type(item.input[1]) is float


def test_aggregate_parser_is_strict() -> None:
    data = _aggregate().to_json()
    assert parse_aggregate(data).to_json() == data
    broken = {**data, "messages": {**data["messages"], "nextPosition": 1}}
    with pytest.raises(ThreadStoreInvariantError, match="positions"):
        parse_aggregate(broken)
    with pytest.raises(ThreadStoreInvariantError, match="top-level"):
        parse_aggregate({**data, "extra": 1})
