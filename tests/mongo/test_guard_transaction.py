"""MongoDB guard: an acquisition is one transaction, so a cut leaves no half-made lock.

The lock, the next fencing token from the counter and that token on the lock
are committed together or not at all. A connection cut in the middle (through
the loopback fault proxy) never leaves a lock without its fencing token.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo.guard import MongoExecutionGuard
from pai_storage_mongo.harness import TEST_DB
from pymongo import AsyncMongoClient
from support.proxy import FaultProxy

from pai_storage.errors import OutcomeUnknownError, StorageError, UnavailableError

from .helpers import proxied_url

pytestmark = pytest.mark.asyncio

COUNTER_STEP = b"\x00fencing\x00"
"""Bytes only the counter's ``findAndModify`` carries: its ``_id`` ``{counter: "fencing"}``."""


@pytest_asyncio.fixture
async def proxy(replica_port: int) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(replica_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest_asyncio.fixture
async def guard(mongo_url: str, proxy: FaultProxy) -> AsyncIterator[MongoExecutionGuard]:
    prefix = f"pai_test_{uuid.uuid4().hex[:12]}_"
    url = proxied_url(proxy.port, serverSelectionTimeoutMS="800")
    guard = MongoExecutionGuard(url, db_name=TEST_DB, collection_prefix=prefix)
    await guard.initialize()
    try:
        yield guard
    finally:
        name = guard.collection_name
        await guard.close()
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
        try:
            await client[TEST_DB].drop_collection(name)
        finally:
            await client.close()


async def test_a_cut_before_the_fencing_token_leaves_no_lock(
    guard: MongoExecutionGuard, proxy: FaultProxy
) -> None:
    proxy.cut_on(COUNTER_STEP, forward=False)  # the lock is taken, the counter never reached
    with pytest.raises(StorageError) as caught:
        await guard.try_acquire("sandbox", owner="w1")
    assert isinstance(caught.value, UnavailableError | OutcomeUnknownError), repr(caught.value)
    assert proxy.triggered.is_set()
    proxy.restore()
    assert await guard.inspect("sandbox") is None  # never a lock without its fencing token
    # The cut transaction lives on in the server until it ends it (within its
    # transaction lifetime): meanwhile the resource is busy, not an error.
    assert await guard.try_acquire("sandbox", owner="w2") is None
    lock = await guard.try_acquire("other", owner="w1")  # the store works on
    assert lock is not None
    assert lock.fencing_token > 0
    assert await lock.release() is True
