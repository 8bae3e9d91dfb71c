"""Large MongoDB snapshots in GridFS: the bucket beside the snapshot collection.

A snapshot over the document limit (:data:`~pai_storage_mongo.snapshots.MAX_SNAPSHOT_BYTES`,
15 MiB) keeps its document in the snapshot collection -- the same ``_id``,
``createdAt``, ``size``, ``sha256`` and ``metadata``, so listing, ordering and
expiry are unchanged -- with ``blob: <ObjectId>`` in place of ``data``. The
bytes are a GridFS file in the bucket ``<collection>_blobs``
(``<collection>_blobs.files`` and ``<collection>_blobs.chunks``, chunks of
:data:`GRIDFS_CHUNK_BYTES`), uploaded before the document names it: a reader
never sees a half-written file.

TTL indexes do not reach GridFS: the snapshot collection's TTL index removes
a large snapshot's document, never its file. So files are removed by the store:

- ``delete`` removes the file of the snapshot it deleted at once;
- ``purge_expired`` removes the files of the expired snapshots it deletes,
  then every file no document names that was uploaded more than
  :data:`ORPHAN_GRACE` ago (the TTL monitor's leftovers, replaced snapshots,
  uploads whose put failed before its document was written).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bson import Int64, ObjectId
from gridfs import AsyncGridFSBucket
from gridfs.errors import NoFile
from pymongo import ASCENDING

from pai_storage.errors import CorruptSnapshotError

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

__all__ = ["GRIDFS_CHUNK_BYTES", "ORPHAN_GRACE", "SnapshotFiles"]

GRIDFS_CHUNK_BYTES = 1024 * 1024
"""The GridFS chunk size of snapshot files: 1 MiB (a read holds one or two)."""

ORPHAN_GRACE = timedelta(hours=1)
"""How old an unnamed file must be before ``purge_expired`` removes it (an upload in
progress is unnamed until its document is written)."""

_BATCH = 4
"""Chunks fetched per batch by a read (4 MiB)."""

Doc = dict[str, Any]


def _damaged(scope: str, what: str) -> CorruptSnapshotError:
    return CorruptSnapshotError(
        f"a stored snapshot of scope {scope!r} is damaged ({what}) and was not returned"
    )


class SnapshotFiles:
    """The GridFS bucket of one snapshot collection."""

    def __init__(self, collection: AsyncCollection[Doc]) -> None:
        self.collection = collection
        self.name = f"{collection.name}_blobs"
        self.bucket = AsyncGridFSBucket(
            collection.database, bucket_name=self.name, chunk_size_bytes=GRIDFS_CHUNK_BYTES
        )
        self.files = self._beside(collection, f"{self.name}.files")
        self.chunks = self._beside(collection, f"{self.name}.chunks")

    async def create_indexes(self) -> None:
        """The bucket's indexes: chunks by ``(files_id, n)``, unique (every read of
        a file is one bounded range of it), files by ``uploadDate`` (the orphan
        sweep). Idempotent on the server."""
        await self.chunks.create_index(
            [("files_id", ASCENDING), ("n", ASCENDING)], unique=True, name="files_id_1_n_1"
        )
        await self.files.create_index([("uploadDate", ASCENDING)], name="uploadDate_1")

    @staticmethod
    def _beside(collection: AsyncCollection[Doc], name: str) -> AsyncCollection[Doc]:
        """The collection ``name`` with ``collection``'s options (majority concerns,
        the primary), never the URL's defaults."""
        return collection.database.get_collection(
            name,
            codec_options=collection.codec_options,
            read_preference=collection.read_preference,
            write_concern=collection.write_concern,
            read_concern=collection.read_concern,
        )

    async def upload(self, scope: str, snapshot_id: str, chunks: AsyncIterator[bytes]) -> ObjectId:
        """Upload the chunks as a new GridFS file; nothing stays if they fail.

        Written here in the GridFS format (chunks ``{files_id, n, data}`` of
        ``chunkSize`` bytes but the last, then the files entry) rather than
        through PyMongo's upload stream, which buffers 32 MiB of chunks (and
        their BSON encoding) before each insert: a put holds at most
        :data:`_BATCH` chunks here.
        """
        file_id = ObjectId()
        pending = bytearray()
        batch: list[Doc] = []
        n = 0
        length = 0

        async def flush(final: bool) -> None:
            nonlocal n
            while len(pending) >= GRIDFS_CHUNK_BYTES or (final and pending):
                piece = bytes(pending[:GRIDFS_CHUNK_BYTES])
                del pending[:GRIDFS_CHUNK_BYTES]
                batch.append({"files_id": file_id, "n": n, "data": piece})
                n += 1
                if len(batch) >= _BATCH:
                    await self.chunks.insert_many(batch, ordered=True)
                    batch.clear()
            if final and batch:
                await self.chunks.insert_many(batch, ordered=True)
                batch.clear()

        try:
            async for chunk in chunks:
                pending += chunk
                length += len(chunk)
                await flush(False)
            await flush(True)
            await self.files.insert_one(
                {
                    "_id": file_id,
                    "length": Int64(length),
                    "chunkSize": GRIDFS_CHUNK_BYTES,
                    "uploadDate": datetime.now(UTC),
                    "filename": snapshot_id,
                    "metadata": {"scope": scope, "snapshotId": snapshot_id},
                }
            )
        except BaseException:
            await self.chunks.delete_many({"files_id": file_id})  # the chunks written so far
            raise
        return file_id

    async def open(
        self, file_id: object, scope: str
    ) -> tuple[AsyncIterator[bytes], Callable[[], Awaitable[None]]] | None:
        """The file's bytes as chunks; ``None`` when the file is gone.

        The chunks are read from ``<bucket>.chunks`` in order of ``n``, a few
        per batch: a driver cursor's first batch would otherwise hold 101
        chunks (101 MiB). A missing chunk, one out of order or of the wrong
        size is damage.
        """
        found = await self.files.find_one({"_id": file_id})
        if found is None:
            return None
        length, size = found.get("length"), found.get("chunkSize")
        if not isinstance(length, int) or not isinstance(size, int) or size <= 0:
            raise _damaged(scope, "its GridFS file entry does not decode")
        count = -(-length // size)
        cursor = (
            self.chunks.find({"files_id": file_id}, projection={"n": 1, "data": 1})
            .sort("n", ASCENDING)
            .batch_size(_BATCH)
        )

        async def chunks() -> AsyncIterator[bytes]:
            expected = 0
            async for chunk in cursor:
                data = chunk.get("data")
                if chunk.get("n") != expected or not isinstance(data, bytes):
                    raise _damaged(scope, "a GridFS chunk is missing or out of order")
                expected += 1
                yield data
            if expected != count:
                raise _damaged(scope, "a GridFS chunk is missing")

        async def close() -> None:
            await cursor.close()

        return chunks(), close

    async def read(self, file_id: object, scope: str) -> bytes | None:
        """The whole file (for ``get``), or ``None`` when it is gone."""
        opened = await self.open(file_id, scope)
        if opened is None:
            return None
        chunks, close = opened
        try:
            return b"".join([chunk async for chunk in chunks])
        finally:
            await close()

    async def delete(self, file_id: object) -> None:
        """Delete a file and its chunks (nothing when it is gone)."""
        with contextlib.suppress(NoFile):
            await self.bucket.delete(file_id)

    async def sweep(self, now: datetime | None = None) -> int:
        """Delete every file no snapshot document names, uploaded over the grace ago."""
        cutoff = (now or datetime.now(UTC)) - ORPHAN_GRACE
        removed = 0
        cursor = self.files.find({"uploadDate": {"$lte": cutoff}}, projection={"_id": 1})
        async for found in cursor:
            if await self.collection.find_one({"blob": found["_id"]}, projection={"_id": 1}):
                continue
            await self.delete(found["_id"])
            removed += 1
        return removed
