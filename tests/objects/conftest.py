"""Fixtures of the snapshot-store tests: a directory store, an S3 store on moto's emulator."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from pai_storage import ManualClock
from pai_storage.bundle import open_snapshot_store
from pai_storage.snapshots import SnapshotStore

pytest.importorskip("obstore", reason="the s3 extra: pip install 'pai-storage[s3]'")
from pai_storage_objects.harness import MotoServer


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """moto's S3 emulator in a child process, one per test process, with bucket ``snapshots``."""
    server = MotoServer()
    server.start()
    server.create_bucket("snapshots")
    yield server
    server.stop()


def s3_url() -> str:
    return f"s3://snapshots/{uuid.uuid4().hex}"


@pytest_asyncio.fixture
async def directory_store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[SnapshotStore]:
    async with open_snapshot_store(f"file://{tmp_path}/snapshots", clock=clock) as store:
        yield store


@pytest_asyncio.fixture
async def s3_store(moto: MotoServer, clock: ManualClock) -> AsyncIterator[SnapshotStore]:
    async with open_snapshot_store(s3_url(), clock=clock, **moto.options()) as store:
        yield store
