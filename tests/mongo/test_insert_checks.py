"""Inserts are not looked up first, yet every outcome is exactly the reference model's.

A commit's first attempt trusts the unique indexes to refuse an insert of an
existing id (saving a round trip per appended record). Whenever that attempt
ends in anything but a commit before its inserts were written — a later
mechanical error, a lease conflict, the index refusing an insert — the commit
is judged again with every named row loaded. These cases are where the
shortcut alone would disagree with the reference.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import CommittedResult, ConflictResult
from pai_storage import builders as b
from pai_storage.backend import apply_thread_changes
from pai_storage.errors import ThreadStoreInvariantError

from .helpers import raw_collections


def _setup() -> dict[str, Any]:
    """m1 and m2 of run r1, which holds the lease (owner w1); r2 queued with q1."""
    return b.create(
        "s",
        "t",
        {
            "messages": [
                b.insert(b.message("m1", run_id="r1")),
                b.insert(b.message("m2", role="assistant", run_id="r1", relation="output")),
            ],
            "runs": [
                b.insert(b.run("r1", inputs=["m1"])),
                b.insert(b.run("r2", "queued", queue_item_id="q1")),
            ],
            "queuedItems": [b.insert(b.queued_item("q1", "r2"))],
            "lease": b.acquire("r1", "w1", 600_000),
        },
    )


CASES: dict[str, dict[str, Any]] = {
    "existing-insert-then-lease-conflict": {
        "messages": [b.insert(b.message("m1"))],
        "lease": b.acquire("r1", "w2"),
    },
    "existing-insert-then-missing-replace": {
        "messages": [b.insert(b.message("m1")), b.replace(b.message("m9"))],
    },
    "existing-insert-then-error-in-a-later-family": {
        "messages": [b.insert(b.message("m3", run_id="r1", relation="output"))],
        "runs": [b.insert(b.run("r1")), b.replace(b.run("r9"))],
    },
    "existing-insert-then-error-in-runs": {
        "messages": [b.insert(b.message("m1"))],
        "runs": [b.replace(b.run("r9"))],
    },
    "existing-insert-cut-by-a-later-truncation": {
        "messages": [b.insert(b.message("m2")), b.truncate("m1")],
    },
    "existing-queued-item-insert": {
        "queuedItems": [b.insert(b.queued_item("q1", "r2"))],
    },
    "new-insert-then-lease-conflict": {
        "messages": [b.insert(b.message("m3", run_id="r1", relation="output"))],
        "lease": b.acquire("r1", "w2"),
    },
    "new-inserts-commit": {
        "messages": [b.insert(b.message("m3", run_id="r1", relation="output"))],
        "lease": b.renew("r1", "w1", 600_000),
    },
    "reinsert-after-delete-commits": {
        "messages": [
            b.delete_record("m2"),
            b.insert(b.message("m2", role="assistant", run_id="r1", relation="output")),
        ],
    },
}


# The outcome kind each case must have (the reference decides the exact error).
EXPECTED = {
    "existing-insert-then-lease-conflict": "invariant",
    "existing-insert-then-missing-replace": "invariant",
    "existing-insert-then-error-in-a-later-family": "invariant",
    "existing-insert-then-error-in-runs": "invariant",
    "existing-insert-cut-by-a-later-truncation": "invariant",
    "existing-queued-item-insert": "invariant",
    "new-insert-then-lease-conflict": "conflict",
    "new-inserts-commit": "committed",
    "reinsert-after-delete-commits": "committed",
}


def _outcome(value: Any) -> tuple[str, str]:
    if isinstance(value, ThreadStoreInvariantError):
        return "invariant", str(value)
    if isinstance(value, ConflictResult):
        return "conflict", ""
    assert isinstance(value, CommittedResult), value
    return "committed", ""


def _reference(changes: dict[str, Any]) -> tuple[str, str]:
    """The reference model's outcome for the same commit on the same thread."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    created = apply_thread_changes(None, _setup(), now)
    assert created.aggregate is not None
    commit = b.update_at("s", "t", created.aggregate.root.version, changes, root=b.root())
    try:
        return _outcome(apply_thread_changes(created.aggregate, commit, now).result)
    except ThreadStoreInvariantError as exc:
        return _outcome(exc)


@pytest.mark.parametrize("case", list(CASES))
async def test_outcomes_match_the_reference(mongo_store: MongoThreadStore, case: str) -> None:
    expected = _reference(CASES[case])
    assert expected[0] == EXPECTED[case]
    setup = await mongo_store.commit_thread(_setup())
    assert isinstance(setup, CommittedResult)
    assert setup.thread is not None
    version = setup.thread.version
    try:
        result: Any = await mongo_store.commit_thread(
            b.update_at("s", "t", version, CASES[case], root=b.root())
        )
    except ThreadStoreInvariantError as exc:
        result = exc
    assert _outcome(result) == expected
    read = await mongo_store.read_thread(b.read("s", "t"))
    assert read.thread is not None
    assert read.thread.version.revision == version.revision + (expected[0] == "committed")


async def test_a_root_counter_behind_its_rows_is_an_invalid_thread(
    mongo_store: MongoThreadStore,
) -> None:
    setup = await mongo_store.commit_thread(_setup())
    assert isinstance(setup, CommittedResult)
    assert setup.thread is not None
    threads = raw_collections(mongo_store)["threads"]
    await threads.update_one({"threadId": "t"}, {"$set": {"_nextOrder.messages": 2}})
    append = b.update_at(
        "s", "t", setup.thread.version, {"messages": [b.insert(b.message("m3"))]}, root=b.root()
    )
    with pytest.raises(ThreadStoreInvariantError, match="invalid stored thread: _nextOrder"):
        await mongo_store.commit_thread(append)
    stored = await raw_collections(mongo_store)["messages"].count_documents({"threadId": "t"})
    assert stored == 2
