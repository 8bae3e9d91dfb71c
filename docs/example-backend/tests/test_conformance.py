"""The conformance suite consumed by subclassing: one class and one fixture per store."""

from collections.abc import AsyncIterator

import pytest_asyncio
from pai_example_kv import KeyValueItemStore, KeyValueThreadStore
from pai_storage_conformance import KeyValueStoreTests, ThreadStoreConformance

from pai_storage import KeyValueStore, ManualClock, ThreadStore


class TestKeyValueThreads(ThreadStoreConformance):
    @pytest_asyncio.fixture
    async def store(self, clock: ManualClock) -> AsyncIterator[ThreadStore]:
        async with KeyValueThreadStore(clock=clock) as store:
            yield store

    @pytest_asyncio.fixture
    async def real_clock_store(self) -> AsyncIterator[ThreadStore]:
        async with KeyValueThreadStore() as store:
            yield store


class TestKeyValueItems(KeyValueStoreTests):
    @pytest_asyncio.fixture
    async def kv_store(self, clock: ManualClock) -> AsyncIterator[KeyValueStore]:
        async with KeyValueItemStore(clock=clock) as store:
            yield store
