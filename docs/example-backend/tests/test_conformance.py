"""The conformance suite consumed by subclassing: one class, one fixture."""

from collections.abc import AsyncIterator

import pytest_asyncio
from pai_example_kv import KeyValueThreadStore
from pai_storage_conformance import ThreadStoreConformance

from pai_storage import ManualClock, ThreadStore


class TestKeyValueStore(ThreadStoreConformance):
    @pytest_asyncio.fixture
    async def store(self, clock: ManualClock) -> AsyncIterator[ThreadStore]:
        async with KeyValueThreadStore(clock=clock) as store:
            yield store

    @pytest_asyncio.fixture
    async def real_clock_store(self) -> AsyncIterator[ThreadStore]:
        async with KeyValueThreadStore() as store:
            yield store
