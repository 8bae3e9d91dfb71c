"""A MongoDB snapshot document whose createdAt is not a date is damage, never absence.

``createdAt`` orders snapshots and judges their expiry; a document edited so
that it holds a string matches no date comparison, so it used to read as
absent: ``get`` returned ``None`` and ``latest`` silently returned the older
snapshot (the rollback ``latest`` promises to refuse).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo.harness import TEST_DB
from pai_storage_mongo.snapshots import MongoSnapshotStore
from pymongo import AsyncMongoClient

from pai_storage import ManualClock, StoreWarning
from pai_storage.errors import CorruptSnapshotError

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(params=["server clock", "test clock"])
async def store(
    request: pytest.FixtureRequest, mongo_url: str
) -> AsyncIterator[tuple[MongoSnapshotStore, Any, list[StoreWarning]]]:
    warnings: list[StoreWarning] = []
    clock = ManualClock() if request.param == "test clock" else None
    snapshots = MongoSnapshotStore(
        mongo_url,
        db_name=TEST_DB,
        collection_prefix=f"pai_test_{uuid.uuid4().hex[:12]}_",
        snapshot_ttl=timedelta(hours=1),
        on_warning=warnings.append,
        clock=clock,
    )
    await snapshots.initialize()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    collection = client[TEST_DB][snapshots.collection.name]
    try:
        await snapshots.put("scope", "old", b"old")
        if clock is not None:
            clock.advance(ms=5)
        await snapshots.put("scope", "new", b"new")
        yield snapshots, collection, warnings
    finally:
        await collection.drop()
        await client.close()
        await snapshots.close()


async def test_a_string_creation_time_is_a_corrupt_snapshot(
    store: tuple[MongoSnapshotStore, Any, list[StoreWarning]],
) -> None:
    snapshots, collection, warnings = store
    await collection.update_one(
        {"_id.snapshotId": "new"}, {"$set": {"createdAt": "2030-01-01T00:00:00Z"}}
    )
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await snapshots.get("scope", "new")
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await snapshots.open("scope", "new")
    with pytest.raises(CorruptSnapshotError, match="newest one cannot be known"):
        await snapshots.latest("scope")
    assert warnings
    assert all(w.kind == "invalid_record" for w in warnings)
    old = await snapshots.get("scope", "old")
    assert old is not None
    assert old.data == b"old"
    assert await snapshots.delete("scope", "new") is False  # not live: removed all the same
    latest = await snapshots.latest("scope")
    assert latest is not None
    assert latest.info.snapshot_id == "old"
