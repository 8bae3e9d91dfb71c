"""The lifecycle primitives of the SQL thread store (updated-at index, whole-thread
load and restore) under the shared lifecycle topic, on SQLite and MariaDB.

The shared topic runs on a store that declares the ``lifecycle`` capability.
Its prune-race test lets the racing commits keep the frozen test clock, so a
commit that lands before the sweep reads the thread leaves it older than the
cutoff and rightly prunable; on a backend whose operations really interleave
that test then fails although nothing is wrong. Here it runs corrected: the
clock moves past the cutoff first, so a commit that lands takes the thread out
of the sweep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest_asyncio
from pai_storage_conformance.suite.lifecycle import LifecycleTests
from pai_storage_sql import SqlThreadStore

from pai_storage import CommittedResult, ManualClock, ThreadRecord, ThreadStore
from pai_storage import builders as b
from pai_storage.backend import LIFECYCLE

from .conftest import Target


class LifecycleSqlStore(SqlThreadStore):
    capabilities = frozenset({LIFECYCLE})


class TestSqlLifecycle(LifecycleTests):
    @pytest_asyncio.fixture
    async def lifecycle_store(
        self, target: Target, clock: ManualClock
    ) -> AsyncIterator[ThreadStore]:
        async with LifecycleSqlStore(target.url, clock=clock, **target.options) as store:
            yield store

    async def test_prune_racing_commits_either_land_first_or_conflict(
        self, lifecycle_store: ThreadStore, clock: ManualClock
    ) -> None:
        store, scope = lifecycle_store, "prune-race"
        clock.set(clock() - timedelta(days=30))
        roots = []
        for i in range(20):
            created = await store.commit_thread(b.create(scope, f"t{i}"))
            assert isinstance(created, CommittedResult)
            assert created.thread is not None
            roots.append(created.thread)
        cutoff = clock() + timedelta(milliseconds=1)
        clock.advance(ms=2)  # a commit that lands now stamps the thread past the cutoff

        async def touch(root: ThreadRecord) -> bool:
            result = await store.commit_thread(
                b.update(scope, root.thread_id, root.version, title="touched")
            )
            return isinstance(result, CommittedResult)

        sweep = asyncio.ensure_future(store.prune_threads(scope, updated_before=cutoff))
        touched = await asyncio.gather(*(touch(r) for r in roots))
        gone = {p.thread_id for p in await sweep}
        for root, landed in zip(roots, touched, strict=True):
            read = await store.read_thread(b.read(scope, root.thread_id))
            if root.thread_id in gone:
                assert not landed
                assert read.thread is None
            else:
                assert landed
                assert read.thread is not None
                assert read.thread.title == "touched"
