"""Large MongoDB snapshots in GridFS: layout, 200 MB streamed, damage, file removal.

Up to 15 MiB a snapshot keeps the seed's layout (its bytes in the document);
past it the document names a GridFS file (``blob``) in ``<collection>_blobs``.
TTL indexes never reach GridFS files, so the store removes them: ``delete``
at once, ``purge_expired`` for expired snapshots and for files no document
names (after the grace).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo.harness import TEST_DB
from pai_storage_mongo.snapshot_files import ORPHAN_GRACE
from pai_storage_mongo.snapshots import MAX_SNAPSHOT_BYTES, MongoSnapshotStore
from pymongo import AsyncMongoClient

from pai_storage import ManualClock, StoreWarning
from pai_storage.errors import CorruptSnapshotError

pytestmark = pytest.mark.asyncio

MIB = 1024 * 1024


class Fixture:
    def __init__(self, store: MongoSnapshotStore, db: Any, clock: ManualClock) -> None:
        self.store = store
        self.db = db
        self.clock = clock
        self.warnings: list[StoreWarning] = []
        name = store.collection.name
        self.docs = db[name]
        self.files = db[f"{name}_blobs.files"]
        self.chunks = db[f"{name}_blobs.chunks"]


@pytest_asyncio.fixture
async def gridfs(mongo_url: str) -> AsyncIterator[Fixture]:
    clock = ManualClock()
    warnings: list[StoreWarning] = []
    store = MongoSnapshotStore(
        mongo_url,
        db_name=TEST_DB,
        collection_prefix=f"pai_test_{uuid.uuid4().hex[:12]}_",
        clock=clock,
        on_warning=warnings.append,
    )
    await store.initialize()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    made = Fixture(store, client[TEST_DB], clock)
    made.warnings = warnings
    try:
        yield made
    finally:
        for collection in (made.docs, made.files, made.chunks):
            await collection.drop()
        await client.close()
        await store.close()


async def test_past_the_document_limit_a_snapshot_goes_to_gridfs(gridfs: Fixture) -> None:
    store = gridfs.store
    small = bytes(range(256)) * 4096  # (15 MiB exactly: test_runtime_snapshots_guard.py)
    large = bytes(range(256)) * (MAX_SNAPSHOT_BYTES // 256) + b"!"
    await store.put("sc", "small", small, metadata={"n": 1})
    info = await store.put("sc", "large", large, metadata={"n": 2})
    assert (info.size, info.sha256) == (len(large), hashlib.sha256(large).hexdigest())
    small_doc = await gridfs.docs.find_one({"_id.snapshotId": "small"})
    large_doc = await gridfs.docs.find_one({"_id.snapshotId": "large"})
    assert small_doc is not None
    assert large_doc is not None
    assert "data" in small_doc
    assert "blob" not in small_doc
    assert "data" not in large_doc
    assert "blob" in large_doc
    assert set(small_doc) - {"data"} == set(large_doc) - {"blob"}
    assert await gridfs.files.count_documents({}) == 1
    got = await store.get("sc", "large")
    assert got is not None
    assert got.data == large
    assert got.info == info
    reader = await store.open("sc", "large")
    assert reader is not None
    async with reader:
        assert await reader.read() == large
    gridfs.clock.advance(ms=1)
    await store.put("sc", "newest", large)
    latest = await store.latest("sc")
    assert latest is not None
    assert latest.data == large
    listed = [i.snapshot_id for i in (await store.list("sc")).items]
    assert listed == ["newest", "small", "large"]  # one order whatever the layout


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _reset_peak() -> bool:
    path = Path("/proc/self/clear_refs")
    if not path.exists():
        return False
    path.write_text("5")
    return True


async def test_a_200_mb_snapshot_in_gridfs(gridfs: Fixture) -> None:
    if not _reset_peak():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure the peak RSS")
    before = _rss_kib("VmRSS") * 1024
    written = hashlib.sha256()

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(200):
            chunk = os.urandom(MIB)
            written.update(chunk)
            yield chunk

    info = await gridfs.store.put("big", "200mb", chunks())
    assert (info.size, info.sha256) == (200 * MIB, written.hexdigest())
    read = hashlib.sha256()
    reader = await gridfs.store.open("big", "200mb")
    assert reader is not None
    async with reader:
        async for chunk in reader:
            read.update(chunk)
    growth = _rss_kib("VmHWM") * 1024 - before
    assert read.hexdigest() == written.hexdigest()
    assert growth < 64 * MIB, f"peak RSS grew by {growth / MIB:.1f} MiB"
    print(f"\nmongo GridFS: 200 MB put and read, peak RSS growth {growth / MIB:.1f} MiB")
    assert await gridfs.store.delete("big", "200mb")
    assert await gridfs.files.count_documents({}) == 0
    assert await gridfs.chunks.count_documents({}) == 0


async def test_damaged_gridfs_chunks_are_corrupt(gridfs: Fixture) -> None:
    store = gridfs.store
    data = bytes(range(251)) * ((MAX_SNAPSHOT_BYTES + 3 * MIB) // 251)
    await store.put("sc", "s", data)
    doc = await gridfs.docs.find_one({"_id.snapshotId": "s"})
    assert doc is not None
    chunk = await gridfs.chunks.find_one({"files_id": doc["blob"], "n": 5})
    assert chunk is not None
    flipped = bytes([chunk["data"][0] ^ 1]) + bytes(chunk["data"][1:])
    await gridfs.chunks.update_one({"_id": chunk["_id"]}, {"$set": {"data": flipped}})
    with pytest.raises(CorruptSnapshotError, match="SHA-256"):
        await store.get("sc", "s")
    reader = await store.open("sc", "s")
    assert reader is not None
    with pytest.raises(CorruptSnapshotError, match="SHA-256"):
        await reader.read()
    await reader.aclose()
    await gridfs.chunks.delete_one({"_id": chunk["_id"]})  # a missing chunk
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await store.get("sc", "s")
    await gridfs.files.delete_many({})  # a missing file
    with pytest.raises(CorruptSnapshotError, match="GridFS file is missing"):
        await store.open("sc", "s")
    assert gridfs.warnings


async def test_gridfs_files_are_removed_with_their_snapshots(gridfs: Fixture) -> None:
    store, clock = gridfs.store, gridfs.clock
    ttl = store.snapshot_ttl
    assert ttl is not None
    large = b"L" * (MAX_SNAPSHOT_BYTES + 1)

    async def counts() -> tuple[int, int]:
        return await gridfs.files.count_documents({}), await gridfs.chunks.count_documents({})

    await store.put("sc", "deleted", large)
    assert await store.delete("sc", "deleted")
    assert await counts() == (0, 0)  # a delete removes the file and its chunks at once

    await store.put("sc", "expires", large)
    clock.advance(ttl)
    assert await store.purge_expired() == 1
    assert await counts() == (0, 0)  # an expired snapshot's file goes with it

    # The TTL monitor removes documents only: the file stays until a purge, which
    # removes files no document names once they are older than the grace.
    await store.put("sc", "monitored", large)
    await gridfs.docs.delete_many({})  # what the TTL monitor does
    await store.put("sc", "replaced", large)
    await store.put("sc", "replaced", b"small now")  # its old file is named no more
    await store.purge_expired()
    assert (await counts())[0] == 2, "young unnamed files may be uploads in progress"
    old = datetime.now(UTC) - ORPHAN_GRACE - timedelta(minutes=1)  # uploads take real time
    await gridfs.files.update_many({}, {"$set": {"uploadDate": old}})
    await store.purge_expired()
    assert await counts() == (0, 0)
    got = await store.get("sc", "replaced")
    assert got is not None
    assert got.data == b"small now"


async def test_a_failed_upload_leaves_no_file(gridfs: Fixture) -> None:
    async def failing() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield os.urandom(MIB)
        raise OSError("source broke")

    with pytest.raises(OSError, match="source broke"):
        await gridfs.store.put("sc", "s", failing())
    assert await gridfs.store.get("sc", "s") is None
    assert await gridfs.files.count_documents({}) == 0
    assert await gridfs.chunks.count_documents({}) == 0


async def test_erasing_a_scope_removes_its_gridfs_files(gridfs: Fixture) -> None:
    large = b"E" * (MAX_SNAPSHOT_BYTES + 1)
    await gridfs.store.put("tenant", "a", large)
    await gridfs.store.put("other", "b", large)
    assert await gridfs.store._erase_scope("tenant") == 1
    assert await gridfs.files.count_documents({"metadata.scope": "tenant"}) == 0
    assert await gridfs.files.count_documents({"metadata.scope": "other"}) == 1
    doc = await gridfs.docs.find_one({"_id.snapshotId": "b"})
    assert doc is not None
    assert await gridfs.chunks.count_documents({"files_id": doc["blob"]}) == 16
    assert await gridfs.chunks.count_documents({}) == 16
