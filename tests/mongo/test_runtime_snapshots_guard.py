"""MongoDB snapshot store and execution guard: conformance, layout, EXPLAIN, faults."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from pai_storage_conformance.suite.guard import ExecutionGuardTests
from pai_storage_conformance.suite.snapshots import SnapshotStoreTests
from pai_storage_mongo.guard import MongoExecutionGuard
from pai_storage_mongo.harness import TEST_DB
from pai_storage_mongo.snapshots import MongoSnapshotStore
from pymongo import AsyncMongoClient

from pai_storage import ManualClock


def _prefix() -> str:
    return f"pai_test_{uuid.uuid4().hex[:12]}_"


async def _drop(url: str, store: MongoSnapshotStore | MongoExecutionGuard) -> None:
    """Drop the test store's collection (the store itself may be closed by then)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        await client[TEST_DB].drop_collection(store._holder.name(store.component))
    finally:
        await client.close()


class TestMongoSnapshotConformance(SnapshotStoreTests):
    @pytest_asyncio.fixture
    async def snapshot_store(
        self, mongo_url: str, clock: ManualClock
    ) -> AsyncIterator[MongoSnapshotStore]:
        store = MongoSnapshotStore(
            mongo_url, clock=clock, db_name=TEST_DB, collection_prefix=_prefix()
        )
        await store.initialize()
        try:
            yield store
        finally:
            await _drop(mongo_url, store)
            await store.close()


class TestMongoGuardConformance(ExecutionGuardTests):
    @pytest_asyncio.fixture
    async def guard(self, mongo_url: str, clock: ManualClock) -> AsyncIterator[MongoExecutionGuard]:
        guard = MongoExecutionGuard(
            mongo_url, clock=clock, db_name=TEST_DB, collection_prefix=_prefix()
        )
        await guard.initialize()
        try:
            yield guard
        finally:
            await _drop(mongo_url, guard)
            await guard.close()
