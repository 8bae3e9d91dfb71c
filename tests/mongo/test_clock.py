"""Time comes from the MongoDB primary unless the test-only clock overrides it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import CommittedResult, ManualClock
from pai_storage import builders as b

pytestmark = pytest.mark.asyncio


async def test_server_time_stamps_commits_reads_and_leases(
    real_clock_mongo_store: MongoThreadStore,
) -> None:
    store = real_clock_mongo_store
    before = await store.server_time()
    created = await store.commit_thread(
        b.create(
            "s",
            "t",
            {
                "messages": [{"type": "insert", "record": b.message("m1", run_id="r1")}],
                "runs": [{"type": "insert", "record": b.run("r1", inputs=["m1"])}],
                "lease": b.acquire("r1", "w1", ms=1_000),
            },
        )
    )
    after = await store.server_time()
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    assert before <= created.committed_at <= after
    lease = created.thread.lease
    assert lease is not None
    assert lease.expires_at == created.committed_at + timedelta(seconds=1)
    read = await store.read_thread(b.read("s", "t"))
    assert created.committed_at <= read.observed_at
    # The lease expires on the server's clock: after a second another owner may acquire.
    await asyncio.sleep(1.1)
    taken = await store.commit_thread(
        b.update_at(
            "s", "t", created.thread.version, {"lease": b.acquire("r1", "w2")}, root=b.root()
        )
    )
    assert isinstance(taken, CommittedResult)


async def test_the_test_clock_overrides_server_time(
    mongo_store: MongoThreadStore, clock: ManualClock
) -> None:
    created = await mongo_store.commit_thread(b.create("s", "t"))
    assert isinstance(created, CommittedResult)
    assert created.committed_at == clock()
    clock.advance(ms=1500)
    read = await mongo_store.read_thread(b.read("s", "missing"))
    assert read.observed_at == clock()
