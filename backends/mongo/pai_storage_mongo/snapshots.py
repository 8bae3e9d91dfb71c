"""The MongoDB snapshot store: one document per snapshot, the data as BSON Binary.

Collection ``pai_snapshots`` by default (see :mod:`pai_storage_mongo.client` for
names and prefixes). One document per snapshot::

    {_id: {scope, snapshotId}, createdAt: Date, size: Int64, sha256: "<hex>",
     metadata: "<canonical JSON text>", data: BinData(0), _schemaVersion: 1}

- ``_id`` is the compound key, so ``get``/``delete`` are one ``_id`` lookup and
  ``put`` of an existing id replaces the document in place;
- index ``{_id.scope: 1, createdAt: -1, _id.snapshotId: -1}`` serves ``list``
  and ``latest`` newest first as one bounded index scan (strings compare in
  code-point order under MongoDB's simple collation);
- the same index lists the scopes holding a live snapshot (a copy of the
  store): a scope's first entry is its newest snapshot, so one probe per
  scope, bounded below by the last scope found, finds the next one;
- TTL index ``{createdAt: 1}`` with ``expireAfterSeconds`` = ``snapshot_ttl``
  (none when ``snapshot_ttl`` is ``None``): MongoDB's monitor removes expired
  snapshots in the background, while every read filters on the server clock
  (``$$NOW``) so an expired snapshot is absent at once;
- a document must fit MongoDB's 16 MiB limit, so data up to
  :data:`MAX_SNAPSHOT_BYTES` (15 MiB) lives in the document; a larger
  snapshot's bytes are a GridFS file the document names (``blob``, no
  ``data``; :mod:`pai_storage_mongo.snapshot_files`), so there is no size limit
  and a streamed put or an ``open`` holds one chunk at a time.

See ``docs/mongodb.md``.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from bson import Binary, Int64
from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument

from pai_storage.backend import ENUMERATE
from pai_storage.errors import ConfigurationError, CorruptSnapshotError
from pai_storage.events import StoreWarning
from pai_storage.runtime import parse_json_text
from pai_storage.snapshot_io import OpenedSnapshot, ReplayedChunks, SnapshotStream, chunks_of
from pai_storage.snapshots import Snapshot, SnapshotDraft, SnapshotInfo, SnapshotStore

from .client import closed_error
from .documents import decoded
from .runtime import MongoRuntimeStore
from .snapshot_files import SnapshotFiles

__all__ = ["MAX_SNAPSHOT_BYTES", "SCHEMA_VERSION", "MongoSnapshotStore", "indexes"]

MAX_SNAPSHOT_BYTES = 15 * 1024 * 1024
"""The largest snapshot kept in its document: 15 MiB.

The data lives in one document beside its metadata (at most 64 KiB), under
MongoDB's 16 MiB document limit. A larger snapshot's bytes go to GridFS."""

SCHEMA_VERSION = 1

NEWEST_INDEX = "scope_newest"
TTL_INDEX = "createdAt_ttl"
BLOB_INDEX = "blob"
_MAX_TTL_SECONDS = 2**31 - 1  # the largest expireAfterSeconds MongoDB accepts

_NEWEST_KEYS = [("_id.scope", ASCENDING), ("createdAt", DESCENDING), ("_id.snapshotId", DESCENDING)]
_NEWEST_SORT = [("createdAt", DESCENDING), ("_id.snapshotId", DESCENDING)]
_INFO_FIELDS = {"createdAt": 1, "size": 1, "sha256": 1, "metadata": 1}

Doc = dict[str, Any]

_DAMAGED_TIME: Doc = {"createdAt": {"$not": {"$type": "date"}}}
"""Documents whose creation time is not a date (damaged: the store writes dates only)."""


def indexes(snapshot_ttl: timedelta | None) -> list[IndexModel]:
    """The indexes of the snapshot collection for a store with this ``snapshot_ttl``."""
    models = [
        IndexModel(_NEWEST_KEYS, name=NEWEST_INDEX),
        # Sparse: only large snapshots name a GridFS file (the purge's sweep looks them up).
        IndexModel([("blob", ASCENDING)], name=BLOB_INDEX, sparse=True),
    ]
    if snapshot_ttl is not None:
        seconds = math.ceil(snapshot_ttl.total_seconds())
        if seconds <= _MAX_TTL_SECONDS:
            models.append(
                IndexModel([("createdAt", ASCENDING)], name=TTL_INDEX, expireAfterSeconds=seconds)
            )
    return models


class MongoSnapshotStore(MongoRuntimeStore, SnapshotStore):
    """Snapshots in a MongoDB collection, sharing the client of a ``connect()`` call.

    Every operation is judged on the server's clock (``$$NOW``, or the test
    ``clock``): ``put`` is one upserting ``findAndModify`` whose pipeline
    stamps ``createdAt``; reads filter out expired snapshots themselves, and
    so does ``delete`` (one more delete removes an expired leftover).
    Snapshots over :data:`MAX_SNAPSHOT_BYTES` (15 MiB) are refused before
    anything is sent.

    Takes the parameters of :class:`~pai_storage_mongo.runtime.MongoRuntimeStore`
    (``url``, ``client``, where the collection lives) and the options of
    :class:`~pai_storage.snapshots.SnapshotStore` (``clock``, ``on_warning``,
    ``token_secret``, ``snapshot_ttl``).
    """

    component = "snapshots"
    ttl_index = TTL_INDEX
    ttl_option = "snapshot_ttl"
    max_snapshot_bytes: ClassVar[int | None] = None
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})

    def __init__(self, url: Any = None, *, client: object = None, **options: Any) -> None:
        super().__init__(url, client=client, **options)
        ttl = self.snapshot_ttl
        self._ttl_ms: int | None = None if ttl is None else ttl // timedelta(milliseconds=1)
        self._files: SnapshotFiles | None = None

    def _indexes(self) -> list[IndexModel]:
        return indexes(self.snapshot_ttl)

    async def _initialize(self) -> None:
        await super()._initialize()
        with self._holder.errors("connect"):
            await self.files.create_indexes()

    def _unopened_error(self) -> ConfigurationError:
        """The closed-store error of the client holder's operations."""
        return closed_error()

    # ------------------------------------------------------------ queries

    def live_filter(self) -> Doc:
        """The filter clause that keeps unexpired snapshots only (empty: none expire)."""
        if self._ttl_ms is None:
            return {}
        now = self.now()
        if now is not None:
            return {"createdAt": {"$gt": now - timedelta(milliseconds=self._ttl_ms)}}
        return {"$expr": {"$gt": ["$createdAt", {"$subtract": ["$$NOW", self._ttl_ms]}]}}

    def _expired_filter(self) -> Doc:
        """The filter clause that keeps expired snapshots only (with a ``snapshot_ttl``)."""
        assert self._ttl_ms is not None
        now = self.now()
        if now is not None:
            return {"createdAt": {"$lte": now - timedelta(milliseconds=self._ttl_ms)}}
        return {"$expr": {"$lte": ["$createdAt", {"$subtract": ["$$NOW", self._ttl_ms]}]}}

    def live_or_damaged(self) -> Doc:
        """The filter clause of a read by id: live snapshots, and damaged ones to report.

        A document whose ``createdAt`` is not a date (edited by hand) matches
        no date comparison: without this it would read as absent.
        """
        live = self.live_filter()
        if not live:
            return {}
        return {"$or": [live, _DAMAGED_TIME]}

    def list_query(self, scope: str, after: tuple[datetime, str] | None) -> Doc:
        """The filter of ``list`` (and ``latest`` with no ``after``); EXPLAIN tests use it."""
        query: Doc = {"_id.scope": scope, **self.live_filter()}
        if after is not None:
            created_at, snapshot_id = after
            # createdAt <= t bounds the index scan; the $nor drops the rest of the
            # same millisecond at or above the last id already returned.
            query["createdAt"] = {"$lte": created_at, **query.get("createdAt", {})}
            query["$nor"] = [{"createdAt": created_at, "_id.snapshotId": {"$gte": snapshot_id}}]
        return query

    @staticmethod
    def key(scope: str, snapshot_id: str) -> Doc:
        """The ``_id`` of a snapshot document (field order matters: always build it here)."""
        return {"scope": scope, "snapshotId": snapshot_id}

    # ------------------------------------------------------------ hooks

    async def _put(self, draft: SnapshotDraft) -> SnapshotInfo:
        if draft.size > MAX_SNAPSHOT_BYTES:
            stream = SnapshotStream(
                scope=draft.scope,
                snapshot_id=draft.snapshot_id,
                metadata=draft.metadata,
                metadata_json=draft.metadata_json,
                source=chunks_of(draft.data),
                limit=None,
                backend=self.backend_name,
            )
            return await self._put_stream(stream)
        document = {
            "_id": self.key(draft.scope, draft.snapshot_id),
            "size": Int64(draft.size),
            "sha256": draft.sha256,
            "metadata": draft.metadata_json,
            "data": Binary(draft.data),
            "_schemaVersion": SCHEMA_VERSION,
        }
        created_at = await self._write(document)
        return draft.info(created_at, self.snapshot_expiry(created_at))

    @property
    def files(self) -> SnapshotFiles:
        """The GridFS bucket of large snapshots (initialize first)."""
        collection = self.collection
        if self._files is None or self._files.collection is not collection:
            self._files = SnapshotFiles(collection)
        return self._files

    async def _put_stream(self, stream: SnapshotStream) -> SnapshotInfo:
        # Up to the document limit the chunks are joined and kept in the document
        # (the seed's layout); past it they are uploaded to GridFS as they come.
        head: builtins.list[bytes] = []
        held = 0
        chunks = stream.chunks()
        async for chunk in chunks:
            head.append(chunk)
            held += len(chunk)
            if held > MAX_SNAPSHOT_BYTES:
                break
        else:
            draft = SnapshotDraft(
                scope=stream.scope,
                snapshot_id=stream.snapshot_id,
                data=b"".join(head),
                size=stream.size,
                sha256=stream.sha256,
                metadata=stream.metadata,
                metadata_json=stream.metadata_json,
            )
            return await self._put(draft)

        replay = ReplayedChunks(head, chunks)
        with replay.source_failure(), self._holder.errors("write"):
            file_id = await self.files.upload(stream.scope, stream.snapshot_id, replay.chunks())
        try:
            document = {
                "_id": self.key(stream.scope, stream.snapshot_id),
                "size": Int64(stream.size),
                "sha256": stream.sha256,
                "metadata": stream.metadata_json,
                "blob": file_id,
                "_schemaVersion": SCHEMA_VERSION,
            }
            created_at = await self._write(document)
        except BaseException:
            with self._holder.errors("write"):
                await self.files.delete(file_id)
            raise
        return stream.info(created_at, self.snapshot_expiry(created_at))

    async def _write(self, document: Doc) -> datetime:
        """Upsert a snapshot document, stamping ``createdAt`` on the store's clock."""
        pipeline: list[Doc] = [
            {"$replaceWith": {"$literal": document}},
            {"$set": {"createdAt": self._now()}},
        ]
        with self._holder.errors("write"):
            stored = decoded(
                await self._modify.find_one_and_update(
                    {"_id": document["_id"]},
                    pipeline,
                    projection={"_id": 0, "createdAt": 1},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            )
        return _date(stored.get("createdAt") if stored else None)

    async def _open(self, scope: str, snapshot_id: str) -> OpenedSnapshot | None:
        with self._holder.errors("read"):
            doc = await self.collection.find_one(
                {"_id": self.key(scope, snapshot_id), **self.live_or_damaged()},
                projection={"data": 0},
            )
        if doc is None:
            return None
        info = await self._info(scope, doc)
        if info is None:
            raise CorruptSnapshotError(
                f"a stored snapshot of scope {scope!r} is damaged (its document does not "
                "decode) and was not returned"
            )
        if "blob" not in doc:
            snapshot = await self._get(scope, snapshot_id)  # a small one: read it whole
            return None if snapshot is None else OpenedSnapshot(info, chunks_of(snapshot.data))
        with self._holder.errors("read"):
            opened = await self.files.open(doc["blob"], scope)
        if opened is None:
            raise CorruptSnapshotError(
                f"a stored snapshot of scope {scope!r} is damaged (its GridFS file is missing) "
                f"and was not returned (snapshot id {snapshot_id!r})"
            )
        chunks, close = opened

        async def mapped() -> Any:
            with self._holder.errors("read"):
                async for chunk in chunks:
                    yield chunk

        return OpenedSnapshot(info, mapped(), close)

    async def _get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        with self._holder.errors("read"):
            doc = await self.collection.find_one(
                {"_id": self.key(scope, snapshot_id), **self.live_or_damaged()}
            )
        return None if doc is None else await self._snapshot(scope, doc)

    async def _latest(self, scope: str) -> Snapshot | None:
        with self._holder.errors("read"):
            cursor = (
                self.collection.find(self.list_query(scope, None))
                .sort(_NEWEST_SORT)
                .hint(NEWEST_INDEX)
                .limit(1)
            )
            docs = await cursor.to_list(1)
            # A document whose createdAt is not a date has no place in the order:
            # the newest cannot be known, so latest refuses rather than roll back.
            damaged = await self.collection.find_one(
                {"_id.scope": scope, **_DAMAGED_TIME}, projection={"_id": 1}, hint=NEWEST_INDEX
            )
        if damaged is not None:
            await self.warn(
                StoreWarning(
                    kind="invalid_record",
                    reason="a stored snapshot document's createdAt is not a date",
                    scope_key=scope,
                )
            )
            raise CorruptSnapshotError(
                f"a stored snapshot of scope {scope!r} is damaged (its creation time is not "
                "a date), so the newest one cannot be known; nothing was returned"
            )
        return await self._snapshot(scope, docs[0]) if docs else None

    async def _list(
        self, scope: str, after: tuple[datetime, str] | None, limit: int
    ) -> builtins.list[SnapshotInfo]:
        with self._holder.errors("read"):
            cursor = (
                self.collection.find(self.list_query(scope, after), projection=_INFO_FIELDS)
                .sort(_NEWEST_SORT)
                .hint(NEWEST_INDEX)
                .limit(limit)
                .batch_size(limit)
            )
            docs = await cursor.to_list(limit)
        infos = []
        for doc in docs:
            info = await self._info(scope, doc)
            if info is not None:
                infos.append(info)
        return infos

    async def _delete(self, scope: str, snapshot_id: str) -> bool:
        key = self.key(scope, snapshot_id)
        # Liveness is in the filter, never in the answer: a delete the driver
        # retries is answered from the server's record of the first attempt.
        with self._holder.errors("write"):
            live = await self._modify.find_one_and_delete(
                {"_id": key, **self.live_filter()}, projection={"blob": 1}
            )
            gone = live
            if live is None and self._ttl_ms is not None:
                # Not live: an expired or damaged leftover goes too (never one put since).
                gone = await self._modify.find_one_and_delete(
                    {"_id": key, "$or": [self._expired_filter(), _DAMAGED_TIME]},
                    projection={"blob": 1},
                )
            if gone is not None and "blob" in gone:
                await self.files.delete(gone["blob"])
        return live is not None

    async def _purge_expired(self) -> int:
        count = 0
        with self._holder.errors("write"):
            if self._ttl_ms is not None:
                expired = self._expired_filter()
                # The GridFS files of expired large snapshots first (a TTL index never
                # reaches them), then every document; a file whose document the TTL
                # monitor removed first is left to the sweep below.
                named = self.collection.find({**expired, "blob": {"$exists": True}}, {"blob": 1})
                async for doc in named:
                    await self.files.delete(doc["blob"])
                result = await self.collection.delete_many(expired)
                count = int(result.deleted_count)
            await self.files.sweep()
        return count

    async def _erase_scope(self, scope: str) -> int:
        with self._holder.errors("write"):  # expired snapshots too: no liveness filter
            # The GridFS files of the scope's large snapshots first: an erasure
            # leaves no byte of the tenant behind for the sweep to find later.
            named = self.collection.find(
                {"_id.scope": scope, "blob": {"$exists": True}}, projection={"blob": 1}
            )
            async for doc in named:
                await self.files.delete(doc["blob"])
            result = await self.collection.delete_many({"_id.scope": scope})
        return int(result.deleted_count)

    async def _list_scopes(self, after: str | None, limit: int) -> builtins.list[str]:
        # One probe of scope_newest per scope: the first entry above the last
        # scope found whose createdAt is live. The liveness bound is a plain
        # date (the test clock, else the server's time read once per page), so
        # it bounds the index scan: expired entries are skipped, not fetched,
        # and the probe reads the index only (a covered plan).
        live: Doc = {}
        if self._ttl_ms is not None:
            now = self.now() or await self._holder.server_time()
            live = {"createdAt": {"$gt": now - timedelta(milliseconds=self._ttl_ms)}}
        scopes: builtins.list[str] = []
        last = after
        while len(scopes) < limit:
            bound = {"$gte": ""} if last is None else {"$gt": last}
            query: Doc = {"_id.scope": bound, **live}
            with self._holder.errors("read"):
                docs = await (
                    self.collection.find(query, projection={"_id.scope": 1})
                    .sort(_NEWEST_KEYS)
                    .hint(NEWEST_INDEX)
                    .limit(1)
                    .to_list(1)
                )
            if not docs:
                break
            last = str(docs[0]["_id"]["scope"])
            scopes.append(last)
        return scopes

    # ------------------------------------------------------------ documents

    async def _info(self, scope: str, doc: Mapping[str, Any]) -> SnapshotInfo | None:
        """The document's info, or ``None`` (reported) when it does not decode."""
        try:
            key = doc["_id"]
            snapshot_id = key["snapshotId"]
            metadata = parse_json_text(doc["metadata"])
            size, sha256, created_at = doc["size"], doc["sha256"], doc["createdAt"]
            if (
                type(snapshot_id) is not str
                or type(metadata) is not dict
                or not isinstance(size, int)
                or type(sha256) is not str
                or not isinstance(created_at, datetime)
            ):
                raise ValueError("a field has the wrong type")
        except (KeyError, TypeError, ValueError):
            await self.warn(
                StoreWarning(
                    kind="invalid_record",
                    reason="a stored snapshot document does not decode (fields or metadata)",
                    scope_key=scope,
                )
            )
            return None
        created_at = _date(created_at)
        return SnapshotInfo.model_construct(
            scope=scope,
            snapshot_id=snapshot_id,
            size=int(size),
            sha256=sha256,
            metadata=metadata,
            created_at=created_at,
            expires_at=self.snapshot_expiry(created_at),
        )

    async def _snapshot(self, scope: str, doc: Mapping[str, Any]) -> Snapshot:
        info = await self._info(scope, doc)
        if info is None:
            raise CorruptSnapshotError(
                f"a stored snapshot of scope {scope!r} is damaged (its document does not "
                "decode) and was not returned"
            )
        data = doc.get("data")
        if "blob" in doc:
            with self._holder.errors("read"):
                data = await self.files.read(doc["blob"], scope)
            if data is None:
                raise CorruptSnapshotError(
                    f"a stored snapshot of scope {scope!r} is damaged (its GridFS file is "
                    f"missing) and was not returned (snapshot id {info.snapshot_id!r})"
                )
        # The core checks size and digest; anything but bytes is damage it cannot see.
        return Snapshot.model_construct(info=info, data=bytes(data) if type(data) is bytes else b"")


def _date(value: object) -> datetime:
    """A stored date as an aware UTC datetime (the client may or may not be tz-aware)."""
    if not isinstance(value, datetime):
        raise CorruptSnapshotError("MongoDB returned no creation time for the stored snapshot")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
