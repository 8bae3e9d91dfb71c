"""Snapshots as objects: one immutable data object per snapshot, one small info object per id.

The snapshot algorithm of the directory (``file://``) and S3 (``s3://``)
stores, written once over a small primitive, :class:`Blobs` (what a place to
keep named objects must do). Layout, under the store's root::

    <H(scope)>/<H(snapshot_id)>/info.json      the snapshot's info (JSON, below)
    <H(scope)>/<H(snapshot_id)>/<ms>-<random>.data  its data, written once, never changed

``H`` is the SHA-256 of the name's UTF-8, in hex: any valid name becomes a
short, case-safe path segment; the info holds the names themselves and a
read checks them. ``info.json`` is ``{"v": 1, "scope", "snapshotId",
"createdAt" (ms), "expiresAt" (ms or null), "size", "sha256", "metadata"
(a JSON object), "data" (the data object's name)}``.

- ``put`` streams the data to a new data object that no reader knows (a
  temporary file renamed into place, a multipart upload completed at the
  end), then replaces ``info.json`` with a conditional write that names it:
  a snapshot is switched in one atomic step, so a reader sees the old one or
  the new one, never a torn or mixed one, whatever other processes do. The
  data object the replaced info named is then deleted.
- a read takes ``info.json`` then opens the data object it names; if that
  object was deleted in between (a concurrent replacement), it reads the info
  again. The reader checks size and SHA-256 as always.
- expiry is judged on the store's clock against ``expiresAt``; an expired
  snapshot is absent at once. ``purge_expired`` deletes expired snapshots and
  every data object no info names that is older than ``orphan_grace`` (a put
  that died before switching, a replacement that lost a race). A ``put``
  sweeps its scope with one listing: a data object's name starts with its
  snapshot's creation time (``<ms>``), so the data of expired snapshots is
  deleted without reading their infos (which ``purge_expired`` removes and
  counts), and so are the unnamed old data objects of the same id.
- ``list`` reads the info of every snapshot of the scope (one small read
  each) and orders them newest first: a listing costs one read per snapshot
  of the scope, whatever the page size.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from pai_storage.backend import truncate_ms
from pai_storage.clock import system_clock
from pai_storage.errors import ConfigurationError, CorruptSnapshotError
from pai_storage.events import StoreWarning
from pai_storage.runtime import canonical_json, option_duration
from pai_storage.snapshot_io import OpenedSnapshot, SnapshotStream
from pai_storage.snapshots import SnapshotInfo, StreamingSnapshotStore

__all__ = [
    "DEFAULT_ORPHAN_GRACE",
    "Blob",
    "Blobs",
    "Changed",
    "ObjectSnapshotStore",
    "name_hash",
]

DEFAULT_ORPHAN_GRACE = timedelta(hours=1)
"""How old a data object that no info names must be before a sweep deletes it.

Longer than any upload: a put writes its data object before the info that
names it, so a younger unnamed object may be a put in progress."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INFO = "info.json"
_DATA = ".data"
_SWITCH_ATTEMPTS = 16
_READ_CONCURRENCY = 16


class Changed(Exception):
    """A conditional write or delete found another version than expected."""


@dataclass(frozen=True, slots=True)
class Blob:
    """An object found by :meth:`Blobs.list`: its key and when it was last written."""

    key: str
    modified: datetime


class Blobs(ABC):
    """Where an :class:`ObjectSnapshotStore` keeps its objects (a directory, a bucket).

    Keys are ``/``-separated relative paths. Small objects (the infos) are
    read and written whole with a *version* (an ETag, a digest) for
    conditional writes; data objects are written once from chunks, atomically
    (visible whole or not at all), and read as chunks.
    """

    @abstractmethod
    async def read_small(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and version, or ``None`` when it does not exist."""

    @abstractmethod
    async def write_small(self, key: str, data: bytes, expect: str | None) -> None:
        """Write the object if its version is ``expect`` (``None``: if it does not exist).

        Raises :class:`Changed` otherwise, writing nothing.
        """

    @abstractmethod
    async def delete_small(self, key: str, expect: str) -> None:
        """Delete the object if its version is ``expect``, else raise :class:`Changed`.

        A service without conditional deletes deletes it anyway (say so in its docs).
        """

    @abstractmethod
    async def write_stream(self, key: str, chunks: AsyncIterator[bytes]) -> None:
        """Write a new object from ``chunks``, visible only once complete.

        If the chunks raise, nothing stays behind (or only what a sweep of
        objects older than the grace removes) and the error goes through.
        """

    @abstractmethod
    async def open_stream(
        self, key: str
    ) -> tuple[AsyncIterator[bytes], Callable[[], Awaitable[None]]] | None:
        """The object's bytes as chunks and a way to release it; ``None`` when absent."""

    @abstractmethod
    async def list(self, prefix: str) -> builtins.list[Blob]:
        """Every object whose key starts with ``prefix`` (in-flight temporaries included)."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Delete the object; nothing when it does not exist."""

    async def open(self) -> None:
        """Check that the place exists and can be used (called once, on initialize)."""

    async def close(self) -> None:
        """Release the client."""


def name_hash(name: str) -> str:
    """The path segment of a scope or snapshot id: SHA-256 of its UTF-8, hex."""
    return hashlib.sha256(name.encode()).hexdigest()


def _ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _created_ms(key: str) -> int | None:
    """The creation time a data object's name starts with (``None``: not a data object)."""
    name = key.rpartition("/")[2]
    stamp, dash, _ = name.partition("-")
    if not name.endswith(_DATA) or not dash or not stamp.isdigit():
        return None
    return int(stamp)


def _from_ms(value: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=value)


class _Damaged(Exception):
    """An info object that does not decode."""


@dataclass(frozen=True, slots=True)
class _Stored:
    """An info object read from the store: its info, data object and version."""

    info: SnapshotInfo
    data: str
    version: str

    def live(self, now: datetime) -> bool:
        expires = self.info.expires_at
        return expires is None or expires > now


class ObjectSnapshotStore(StreamingSnapshotStore):
    """Snapshots as objects (see the module docstring); a backend supplies :class:`Blobs`.

    Parameters
    ----------
    orphan_grace:
        How old an unnamed data object must be before a sweep deletes it
        (default one hour; a :class:`~datetime.timedelta`).
    clock, on_warning, token_secret, snapshot_ttl:
        The options of :class:`~pai_storage.snapshots.SnapshotStore`.
    """

    max_snapshot_bytes: ClassVar[int | None] = None

    def __init__(
        self, blobs: Blobs, *, orphan_grace: timedelta = DEFAULT_ORPHAN_GRACE, **options: Any
    ) -> None:
        super().__init__(**options)
        grace = option_duration("orphan_grace", orphan_grace, optional=False)
        self.orphan_grace: timedelta = grace
        self._blobs = blobs

    # ------------------------------------------------------------ lifecycle

    async def _initialize(self) -> None:
        await self._blobs.open()

    async def _close(self) -> None:
        await self._blobs.close()

    # ------------------------------------------------------------ keys and infos

    def _clock(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    @staticmethod
    def _dir(scope: str, snapshot_id: str) -> str:
        return f"{name_hash(scope)}/{name_hash(snapshot_id)}/"

    def _encode(self, info: SnapshotInfo, data: str) -> bytes:
        expires = info.expires_at
        document = {
            "v": 1,
            "scope": info.scope,
            "snapshotId": info.snapshot_id,
            "createdAt": _ms(info.created_at),
            "expiresAt": None if expires is None else _ms(expires),
            "size": info.size,
            "sha256": info.sha256,
            "metadata": info.metadata,
            "data": data,
        }
        return canonical_json(document).encode()

    @staticmethod
    def _decode(raw: bytes, version: str) -> _Stored:
        try:
            doc = json.loads(raw)
            scope, snapshot_id = doc["scope"], doc["snapshotId"]
            created, expires = doc["createdAt"], doc["expiresAt"]
            size, sha256, metadata, data = doc["size"], doc["sha256"], doc["metadata"], doc["data"]
            if not (
                doc.get("v") == 1
                and type(scope) is str
                and type(snapshot_id) is str
                and type(created) is int
                and (expires is None or type(expires) is int)
                and type(size) is int
                and size >= 0
                and type(sha256) is str
                and len(sha256) == 64
                and type(metadata) is dict
                and type(data) is str
                and data.endswith(_DATA)
                and "/" not in data
            ):
                raise _Damaged
            info = SnapshotInfo.model_construct(
                scope=scope,
                snapshot_id=snapshot_id,
                size=size,
                sha256=sha256,
                metadata=metadata,
                created_at=_from_ms(created),
                expires_at=None if expires is None else _from_ms(expires),
            )
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError, AttributeError):
            raise _Damaged from None
        return _Stored(info, data, version)

    async def _read_info(self, scope: str, snapshot_id: str) -> _Stored | None:
        """The info of the id (whatever its expiry), ``None``; damaged raises."""
        found = await self._blobs.read_small(self._dir(scope, snapshot_id) + _INFO)
        if found is None:
            return None
        try:
            stored = self._decode(*found)
        except _Damaged:
            stored = None
        if stored is None or (stored.info.scope, stored.info.snapshot_id) != (scope, snapshot_id):
            await self._damaged(scope, snapshot_id)
            raise CorruptSnapshotError(
                f"a stored snapshot of scope {scope!r} is damaged (its info does not decode) "
                "and was not returned"
            )
        return stored

    async def _damaged(self, scope: str, snapshot_id: str | None = None) -> None:
        await self.warn(
            StoreWarning(
                kind="invalid_record",
                reason="a stored snapshot info object does not decode",
                scope_key=scope,
                snapshot_id=snapshot_id,
            )
        )

    # ------------------------------------------------------------ hooks

    async def _put_stream(self, stream: SnapshotStream) -> SnapshotInfo:
        where = self._dir(stream.scope, stream.snapshot_id)
        # Stamped when the put starts: the data object's name carries it, for sweeps.
        created_at = self._clock()
        data = f"{_ms(created_at)}-{uuid.uuid4().hex}{_DATA}"
        await self._blobs.write_stream(where + data, stream.chunks())
        try:
            info = stream.info(created_at, self.snapshot_expiry(created_at))
            encoded = self._encode(info, data)
            replaced = await self._switch(where + _INFO, encoded)
        except BaseException:
            await self._blobs.delete(where + data)
            raise
        if replaced is not None:
            await self._blobs.delete(where + replaced)
        with contextlib.suppress(Exception):  # the snapshot is stored: a sweep can wait
            await self._sweep_scope(name_hash(stream.scope) + "/", where, where + data)
        return info

    async def _switch(self, key: str, encoded: bytes) -> str | None:
        """Replace the info at ``key``; the data object the replaced one named, if any."""
        for _ in range(_SWITCH_ATTEMPTS):
            found = await self._blobs.read_small(key)
            try:
                await self._blobs.write_small(key, encoded, None if found is None else found[1])
            except Changed:
                continue  # another put or delete got there first: replace what it left
            if found is None:
                return None
            try:
                return self._decode(*found).data
            except _Damaged:
                return None  # its data object, if any, is an orphan for the sweep
        raise ConfigurationError(  # pragma: no cover - needs 16 writers in a row to win
            "the snapshot's info kept changing while it was replaced"
        )

    async def _open(self, scope: str, snapshot_id: str) -> OpenedSnapshot | None:
        where = self._dir(scope, snapshot_id)
        for _ in range(_SWITCH_ATTEMPTS):
            stored = await self._read_info(scope, snapshot_id)
            if stored is None or not stored.live(self._clock()):
                return None
            opened = await self._blobs.open_stream(where + stored.data)
            if opened is not None:
                return OpenedSnapshot(stored.info, opened[0], opened[1])
            again = await self._read_info(scope, snapshot_id)
            if again is not None and again.version == stored.version:
                await self._damaged(scope, snapshot_id)
                raise CorruptSnapshotError(
                    f"a stored snapshot of scope {scope!r} is damaged (its data object is "
                    f"missing) and was not returned (snapshot id {snapshot_id!r})"
                )
        return None  # replaced as fast as we looked: nothing stable to return

    async def _list(
        self, scope: str, after: tuple[datetime, str] | None, limit: int
    ) -> builtins.list[SnapshotInfo]:
        now = self._clock()
        stored = await self._infos(name_hash(scope) + "/", scope)
        live = sorted(
            (s.info for s in stored if s.live(now)),
            key=lambda i: (i.created_at, i.snapshot_id),
            reverse=True,
        )
        if after is not None:
            live = [i for i in live if (i.created_at, i.snapshot_id) < after]
        return live[:limit]

    async def _delete(self, scope: str, snapshot_id: str) -> bool:
        where = self._dir(scope, snapshot_id)
        for _ in range(_SWITCH_ATTEMPTS):
            found = await self._blobs.read_small(where + _INFO)
            if found is None:
                return False
            try:
                stored: _Stored | None = self._decode(*found)
            except _Damaged:
                stored = None  # a damaged snapshot can be deleted
            try:
                await self._blobs.delete_small(where + _INFO, found[1])
            except Changed:
                continue
            if stored is None:
                return True
            await self._blobs.delete(where + stored.data)
            return stored.live(self._clock())
        return False

    async def _purge_expired(self) -> int:
        return await self._purge()

    # ------------------------------------------------------------ sweeping

    async def _infos(self, prefix: str, scope: str | None) -> builtins.list[_Stored]:
        """The decodable infos under ``prefix`` (damaged ones reported and skipped)."""
        keys = [b.key for b in await self._blobs.list(prefix) if b.key.endswith("/" + _INFO)]
        gate = asyncio.Semaphore(_READ_CONCURRENCY)

        async def one(key: str) -> _Stored | None:
            async with gate:
                found = await self._blobs.read_small(key)
            if found is None:
                return None  # deleted since it was listed
            try:
                stored = self._decode(*found)
            except _Damaged:
                await self._damaged(scope or "")
                return None
            if scope is not None and stored.info.scope != scope:
                return None
            return stored

        return [s for s in await asyncio.gather(*(one(k) for k in keys)) if s is not None]

    async def _purge(self) -> int:
        """Delete every expired snapshot, then old data nothing names; the count of the first."""
        now = self._clock()
        blobs = await self._blobs.list("")
        named: set[str] = set()
        expired = 0
        for stored in await self._infos("", None):
            where = self._dir(stored.info.scope, stored.info.snapshot_id)
            if stored.live(now):
                named.add(where + stored.data)
                continue
            try:
                await self._blobs.delete_small(where + _INFO, stored.version)
            except Changed:
                named.add(where + stored.data)  # replaced meanwhile: its data may be named
                continue
            await self._blobs.delete(where + stored.data)
            expired += 1
        for blob in blobs:
            if blob.key not in named and self._stale(blob) and await self._still_unnamed(blob.key):
                await self._blobs.delete(blob.key)
        return expired

    async def _sweep_scope(self, prefix: str, own: str, keep: str) -> None:
        """After a put: one listing of the scope; delete expired data and own unnamed data."""
        ttl = self.snapshot_ttl
        cutoff = None if ttl is None else _ms(self._clock() - ttl)
        for blob in await self._blobs.list(prefix):
            if blob.key == keep or blob.key.endswith("/" + _INFO):
                continue
            created = _created_ms(blob.key)
            if cutoff is not None and created is not None and created <= cutoff:
                await self._blobs.delete(blob.key)  # expired: purge_expired drops its info
            elif (
                blob.key.startswith(own)
                and self._stale(blob)
                and await self._still_unnamed(blob.key)
            ):
                await self._blobs.delete(blob.key)

    def _stale(self, blob: Blob) -> bool:
        """Older than the grace, by the real clock: uploads take real time."""
        if blob.key.endswith("/" + _INFO):
            return False
        return blob.modified <= datetime.now(UTC) - self.orphan_grace

    async def _still_unnamed(self, key: str) -> bool:
        """Whether no info names ``key`` now (a put may have named it since the listing)."""
        where, _, name = key.rpartition("/")
        found = await self._blobs.read_small(where + "/" + _INFO)
        if found is None:
            return True
        try:
            return self._decode(*found).data != name
        except _Damaged:
            return True
