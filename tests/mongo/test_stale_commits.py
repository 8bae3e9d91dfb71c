"""A stale commit (wrong version) writes nothing, so it never blocks the real writer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pai_storage_mongo.store import MongoThreadStore
from pai_storage_mongo.transactions import TXN_OPTIONS, abort

from pai_storage import CommittedResult, CommitThreadInput, ConflictResult, ThreadVersion
from pai_storage import builders as b

from .helpers import raw_collections

pytestmark = pytest.mark.asyncio


async def _create(store: MongoThreadStore) -> ThreadVersion:
    created = await store.commit_thread(
        b.create("scope", "t", {"messages": [b.insert(b.message("m1"))]})
    )
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    return created.thread.version


def _stale(version: ThreadVersion, kind: str) -> dict[str, Any]:
    wrong = {"threadInstanceId": version.thread_instance_id, "revision": version.revision + 5}
    if kind == "delete":
        return b.delete("scope", "t", wrong)
    return b.update_at(
        "scope", "t", wrong, {"messages": [b.insert(b.message("late"))]}, root=b.root()
    )


@pytest.mark.parametrize("kind", ["update", "delete"])
async def test_open_stale_commit_does_not_block_the_real_writer(
    mongo_store: MongoThreadStore, kind: str
) -> None:
    version = await _create(mongo_store)
    stale = CommitThreadInput.model_validate(_stale(version, kind))
    async with mongo_store._session() as session:
        await session.start_transaction(**TXN_OPTIONS)
        try:
            # The stale commit has judged its condition but its transaction is still open.
            outcome = await mongo_store._apply(session, stale)
            assert isinstance(outcome, ConflictResult)
            assert outcome.current_version == version
            # The real writer is not held up by a write conflict on the root.
            real = await asyncio.wait_for(
                mongo_store.commit_thread(
                    b.update_at(
                        "scope",
                        "t",
                        version,
                        {"messages": [b.insert(b.message("m2"))]},
                        root=b.root(),
                    )
                ),
                timeout=5,
            )
            assert isinstance(real, CommittedResult)
        finally:
            await abort(session)
    stored = await raw_collections(mongo_store)["threads"].find_one({"threadId": "t"})
    assert stored is not None
    assert "_heldAt" not in stored
    assert stored["version"]["revision"] == version.revision + 1


@pytest.mark.parametrize("kind", ["update", "delete"])
async def test_stale_commit_reports_the_current_version(
    mongo_store: MongoThreadStore, kind: str
) -> None:
    version = await _create(mongo_store)
    result = await mongo_store.commit_thread(_stale(version, kind))
    assert isinstance(result, ConflictResult)
    assert result.current_version == version
    other = {"threadInstanceId": "other", "revision": version.revision}
    result = await mongo_store.commit_thread(b.delete("scope", "t", other))
    assert isinstance(result, ConflictResult)
    assert result.current_version == version
    missing = await mongo_store.commit_thread(b.delete("scope", "nope", version))
    assert isinstance(missing, ConflictResult)
    assert missing.current_version is None
    # The right version still updates and deletes.
    updated = await mongo_store.commit_thread(b.update_at("scope", "t", version, root=b.root()))
    assert isinstance(updated, CommittedResult)
    assert updated.thread is not None
    deleted = await mongo_store.commit_thread(b.delete("scope", "t", updated.thread.version))
    assert isinstance(deleted, CommittedResult)
    assert deleted.thread is None
    assert await raw_collections(mongo_store)["messages"].count_documents({"threadId": "t"}) == 0
