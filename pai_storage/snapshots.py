"""The snapshot store: opaque binary snapshots of a sandbox workspace.

A snapshot is a blob of bytes (typically a tar archive) under ``(scope,
snapshot_id)``, with a little JSON metadata, its size and its SHA-256 digest.
The data may be streamed both ways: ``put`` takes bytes, a binary file object
or an async iterable of chunks, and :meth:`SnapshotStore.open` returns a
:class:`~pai_storage.snapshot_io.SnapshotReader` handing out verified chunks,
so a put or a read holds one chunk at a time on a backend that stores chunks
(:class:`StreamingSnapshotStore`). The user guide is ``docs/snapshots.md``.

:class:`SnapshotStore` is the contract. Its public methods validate every
argument (a bad one raises :class:`~pai_storage.errors.InvalidInputError` and
writes nothing), then call a few protected hooks a backend implements. The
core computes the digest on ``put`` and checks it on every read, so a backend
can never hand damaged bytes to a caller: a mismatch is reported through
``on_warning`` and raises :class:`~pai_storage.errors.CorruptSnapshotError`.

Invariants every backend keeps (the conformance topic checks them):

- ``put`` of an existing id replaces it (new data, metadata, ``created_at``);
- a snapshot expires ``snapshot_ttl`` after its creation and is absent to
  every operation from that instant, swept or not;
- ``list`` is newest first: ``created_at`` descending, then ``snapshot_id``
  descending (code-point order) among snapshots created in the same
  millisecond; :meth:`SnapshotStore.latest` is the first snapshot of that order;
- nothing under one scope is visible or changeable through another.
"""

from __future__ import annotations

import builtins
import hashlib
from abc import abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, StrictBytes, StrictInt, StrictStr

from .clock import Clock
from .errors import (
    ConfigurationError,
    CorruptSnapshotError,
    InvalidInputError,
    PageTokenError,
)
from .events import StoreWarning, WarningCallback
from .models import JsonObject, Page, StoreModel, Timestamp
from .runtime import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    RuntimeStore,
    check_limit,
    check_name,
    check_value,
    option_duration,
    token_strings,
)
from .snapshot_io import (
    OpenedSnapshot,
    SnapshotData,
    SnapshotReader,
    SnapshotStream,
    chunks_of,
    source_chunks,
    too_large,
)

__all__ = [
    "DEFAULT_SNAPSHOT_TTL",
    "MAX_METADATA_BYTES",
    "Snapshot",
    "SnapshotDraft",
    "SnapshotInfo",
    "SnapshotReader",
    "SnapshotStore",
    "SnapshotStream",
    "StreamingSnapshotStore",
]

DEFAULT_SNAPSHOT_TTL = timedelta(days=30)
"""How long a snapshot lives after its creation, unless configured otherwise.

The same as the agent-state store's default session TTL, so a snapshot never
expires before the session it belongs to."""

MAX_METADATA_BYTES = 64 * 1024
"""The size limit of a snapshot's metadata: 64 KiB of canonical JSON."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SnapshotInfo(StoreModel):
    """What is known about a stored snapshot, without its data."""

    scope: StrictStr
    snapshot_id: StrictStr
    size: StrictInt = Field(ge=0)
    """The size of the data, in bytes."""
    sha256: StrictStr
    """The SHA-256 digest of the data, lowercase hex."""
    metadata: JsonObject
    created_at: Timestamp
    expires_at: Timestamp | None = None
    """When the snapshot expires; ``None`` when the store keeps snapshots forever."""


class Snapshot(StoreModel):
    """A snapshot: its info and its data (verified against the digest)."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    info: SnapshotInfo
    data: StrictBytes


@dataclass(frozen=True, slots=True)
class SnapshotDraft:
    """A validated ``put``, for a backend to store and stamp with its clock."""

    scope: str
    snapshot_id: str
    data: bytes
    """The store's own copy of the data."""
    size: int
    sha256: str
    metadata: dict[str, Any]
    """The store's own copy of the metadata."""
    metadata_json: str
    """The canonical JSON text of ``metadata``."""

    def info(self, created_at: datetime, expires_at: datetime | None) -> SnapshotInfo:
        """The info of this snapshot once stored at ``created_at``."""
        return SnapshotInfo.model_construct(
            scope=self.scope,
            snapshot_id=self.snapshot_id,
            size=self.size,
            sha256=self.sha256,
            metadata=self.metadata,
            created_at=created_at,
            expires_at=expires_at,
        )


class SnapshotStore(RuntimeStore):
    """Opaque binary snapshots, per scope, newest first, integrity-checked.

    Parameters
    ----------
    clock:
        Test-only clock override; production uses the provider's clock.
    on_warning:
        Receives recoverable integrity warnings (a damaged snapshot).
    token_secret:
        Key (bytes) that makes page tokens unforgeable; set it in production.
    snapshot_ttl:
        How long a snapshot lives after its creation (a
        :class:`~datetime.timedelta`, default 30 days); ``None`` keeps
        snapshots forever.

    Raises
    ------
    ConfigurationError
        An option has the wrong type or is out of range.
    """

    max_snapshot_bytes: ClassVar[int | None] = None
    """The largest snapshot this backend stores, in bytes (``None``: no limit).

    A store that keeps a snapshot as one value (one row, one document) holds it
    whole in memory on ``put`` and ``get``, so its limit also bounds their memory;
    a :class:`StreamingSnapshotStore` holds one chunk at a time."""
    capabilities: ClassVar[frozenset[str]] = frozenset()
    """Optional features this store implements:
    :data:`~pai_storage.state.ENUMERATE` when it provides :meth:`_list_scopes`."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
        snapshot_ttl: timedelta | None = DEFAULT_SNAPSHOT_TTL,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning, token_secret=token_secret)
        self.snapshot_ttl: timedelta | None = option_duration("snapshot_ttl", snapshot_ttl)

    # ------------------------------------------------------------ public API

    async def put(
        self,
        scope: str,
        snapshot_id: str,
        data: SnapshotData,
        *,
        metadata: dict[str, Any] | None = None,
    ) -> SnapshotInfo:
        """Store ``data`` as snapshot ``snapshot_id`` of ``scope``, replacing any such snapshot.

        ``data`` is ``bytes``; a ``bytearray`` or ``memoryview`` is accepted
        and copied at once, so changing the buffer afterwards changes nothing
        stored. It may also be a binary file object (read to its end in chunks,
        from where it stands) or an async iterable of ``bytes`` chunks: the
        size and SHA-256 are computed while the chunks are stored, and a
        failure while reading them (a bad chunk, the size limit, the source's
        own error) stores nothing. ``metadata`` (default: none) is a
        strict-JSON object of at most 64 KiB.

        Raises
        ------
        InvalidInputError
            A bad name, ``data`` not bytes-like, or metadata not a JSON object
            or over 64 KiB.
        SnapshotTooLargeError
            ``data`` is larger than the backend's :attr:`max_snapshot_bytes`
            (for streamed data: as soon as the chunks pass it).
        SerializationError
            ``metadata`` is not strict JSON.
        """
        scope = check_name("scope", scope)
        snapshot_id = check_name("snapshot_id", snapshot_id)
        source = source_chunks(data)
        blob = self._check_data(data) if source is None else b""
        if metadata is None:
            metadata = {}
        if type(metadata) is not dict:
            raise InvalidInputError(
                f"metadata must be a dict (a JSON object), not {type(metadata).__qualname__}"
            )
        meta, meta_json = check_value(metadata, path="metadata", limit=MAX_METADATA_BYTES)
        if source is not None:
            stream = SnapshotStream(
                scope=scope,
                snapshot_id=snapshot_id,
                metadata=meta,
                metadata_json=meta_json,
                source=source,
                limit=self.max_snapshot_bytes,
                backend=self.backend_name,
            )
            await self._ensure_ready()
            return await self._put_stream(stream)
        draft = SnapshotDraft(
            scope=scope,
            snapshot_id=snapshot_id,
            data=blob,
            size=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(),
            metadata=meta,
            metadata_json=meta_json,
        )
        await self._ensure_ready()
        return await self._put(draft)

    async def get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        """The snapshot, or ``None`` when absent or expired.

        Raises
        ------
        InvalidInputError
            A bad name.
        CorruptSnapshotError
            The stored data no longer matches its digest (reported through
            ``on_warning`` first); the damaged bytes are not returned.
        """
        scope = check_name("scope", scope)
        snapshot_id = check_name("snapshot_id", snapshot_id)
        await self._ensure_ready()
        return await self._verified(await self._get(scope, snapshot_id))

    async def open(self, scope: str, snapshot_id: str) -> SnapshotReader | None:
        """A reader of the snapshot's data in chunks, or ``None`` when absent or expired.

        Use it as ``async with reader:`` and ``async for chunk in reader:``;
        ``reader.info`` is the snapshot's info. The chunks are verified as they
        are read (see :class:`~pai_storage.snapshot_io.SnapshotReader`).

        Raises
        ------
        InvalidInputError
            A bad name.
        CorruptSnapshotError
            The stored snapshot is damaged: here when its info does not decode,
            while reading when its data does not match the stored size and
            SHA-256 (at the latest instead of handing out the last chunk).
        """
        scope = check_name("scope", scope)
        snapshot_id = check_name("snapshot_id", snapshot_id)
        await self._ensure_ready()
        opened = await self._open(scope, snapshot_id)
        if opened is None:
            return None
        info = opened.info

        async def report() -> None:
            await self._report_corrupt(info.scope, info.snapshot_id)

        return SnapshotReader(opened, report)

    async def latest(self, scope: str) -> Snapshot | None:
        """The newest snapshot of ``scope`` (the first of :meth:`list`), or ``None``.

        Raises
        ------
        InvalidInputError
            A bad scope.
        CorruptSnapshotError
            The newest snapshot's data no longer matches its digest; an older
            snapshot is never returned in its place.
        """
        scope = check_name("scope", scope)
        await self._ensure_ready()
        return await self._verified(await self._latest(scope))

    async def list(
        self, scope: str, *, limit: int = DEFAULT_PAGE_LIMIT, page_token: str | None = None
    ) -> Page[SnapshotInfo]:
        """The snapshots of ``scope``, newest first, one keyset page at a time.

        Order: ``created_at`` descending, then ``snapshot_id`` descending.

        Raises
        ------
        InvalidInputError
            A bad scope or ``limit`` (1 to 1,000).
        PageTokenError
            ``page_token`` is malformed, tampered with, or from another query
            (another scope, another store kind).
        """
        scope = check_name("scope", scope)
        limit = check_limit(limit)
        query = {"scope": scope}
        after: tuple[datetime, str] | None = None
        if page_token is not None:
            position = self.decode_token(page_token, "snapshots", scope, query)
            (snapshot_id,) = token_strings(position, "id")
            after = (_from_ms(position.get("t")), snapshot_id)
        await self._ensure_ready()
        infos = await self._list(scope, after, limit + 1)
        token = None
        if len(infos) > limit:
            infos = infos[:limit]
            last = infos[-1]
            position = {"t": _to_ms(last.created_at), "id": last.snapshot_id}
            token = self.encode_token("snapshots", scope, query, position)
        return Page[SnapshotInfo].model_construct(items=infos, next_page_token=token)

    async def delete(self, scope: str, snapshot_id: str) -> bool:
        """Delete a snapshot; ``False`` when it did not exist (or had expired)."""
        scope = check_name("scope", scope)
        snapshot_id = check_name("snapshot_id", snapshot_id)
        await self._ensure_ready()
        return await self._delete(scope, snapshot_id)

    async def purge_expired(self) -> int:
        """Delete every expired snapshot now; return how many were deleted."""
        await self._ensure_ready()
        return await self._purge_expired()

    async def _erase_scope(self, scope: str) -> int:
        """Delete every snapshot of ``scope``, expired or not.

        The primitive of :meth:`Stores.erase_scope <pai_storage.Stores.erase_scope>`
        (``scope`` is a valid name, the store initialized); returns how many
        snapshots were deleted. This default deletes the live snapshots page
        by page, then purges every expired snapshot of the store (expired
        snapshots are not listed), counting only the live ones; a backend
        deletes the scope's snapshots, expired ones included, with one scoped
        delete instead.
        """
        erased, token = 0, None
        while True:
            page = await self.list(scope, limit=MAX_PAGE_LIMIT, page_token=token)
            for info in page.items:
                erased += await self.delete(scope, info.snapshot_id)
            token = page.next_page_token
            if token is None:
                break
        await self._purge_expired()
        return erased

    # ------------------------------------------------------------ for backends

    def snapshot_expiry(self, created_at: datetime) -> datetime | None:
        """When a snapshot created at ``created_at`` expires (``None``: never)."""
        return None if self.snapshot_ttl is None else created_at + self.snapshot_ttl

    # ------------------------------------------------------------ hooks

    @abstractmethod
    async def _put(self, draft: SnapshotDraft) -> SnapshotInfo:
        """Store ``draft``, replacing any snapshot with its id; return its info.

        ``created_at`` is the provider's clock (or the test clock, :meth:`now`);
        ``expires_at`` is :meth:`snapshot_expiry` of it. Use
        :meth:`SnapshotDraft.info` to build the result.
        """

    @abstractmethod
    async def _get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        """The stored, unexpired snapshot as stored (the core verifies it)."""

    @abstractmethod
    async def _list(
        self, scope: str, after: tuple[datetime, str] | None, limit: int
    ) -> builtins.list[SnapshotInfo]:
        """Up to ``limit`` unexpired snapshots of ``scope``, newest first.

        Ordered by ``(created_at, snapshot_id)`` descending; with ``after``
        only those strictly before that position in this order.
        """

    @abstractmethod
    async def _delete(self, scope: str, snapshot_id: str) -> bool:
        """Delete a snapshot; whether an unexpired one existed."""

    @abstractmethod
    async def _purge_expired(self) -> int:
        """Delete every expired snapshot; return the count."""

    async def _put_stream(self, stream: SnapshotStream) -> SnapshotInfo:
        """Store a streamed ``put``; the default joins the chunks and calls :meth:`_put`.

        A backend that stores chunks overrides it (see :class:`StreamingSnapshotStore`).
        """
        data = await stream.read_all()
        draft = SnapshotDraft(
            scope=stream.scope,
            snapshot_id=stream.snapshot_id,
            data=data,
            size=stream.size,
            sha256=stream.sha256,
            metadata=stream.metadata,
            metadata_json=stream.metadata_json,
        )
        return await self._put(draft)

    async def _open(self, scope: str, snapshot_id: str) -> OpenedSnapshot | None:
        """The stored, unexpired snapshot as chunks; by default :meth:`_get`, whole."""
        snapshot = await self._get(scope, snapshot_id)
        if snapshot is None:
            return None
        return OpenedSnapshot(snapshot.info, chunks_of(snapshot.data))

    async def _latest(self, scope: str) -> Snapshot | None:
        """The newest unexpired snapshot of ``scope``, as stored.

        Default: the first of :meth:`_list`, then :meth:`_get`, again if it
        vanished in between. Override it with one query where the database
        allows.
        """
        for _ in range(16):
            first = await self._list(scope, None, 1)
            if not first:
                return None
            found = await self._get(scope, first[0].snapshot_id)
            if found is not None:
                return found
        return None  # deleted as fast as we looked: nothing stable to return

    # ------------------------------------------------------------ enumeration

    async def _list_scopes(self, after: str | None, limit: int) -> builtins.list[str]:
        """Up to ``limit`` scopes holding at least one live snapshot, by code point.

        Strictly after ``after``; served by an index, never a scan per page. A
        backend that implements it declares
        :data:`~pai_storage.state.ENUMERATE` in :attr:`capabilities`.
        """
        raise ConfigurationError(
            f"the {self.backend_name} snapshot store does not enumerate its scopes, "
            "so it cannot take part in a copy of the runtime stores (--all)"
        )

    # ------------------------------------------------------------ internals

    def _check_data(self, data: object) -> bytes:
        if type(data) is bytes:
            blob = data
        elif isinstance(data, bytearray | memoryview):
            blob = bytes(data)  # the store's own copy: the caller may reuse its buffer
        else:
            raise InvalidInputError(
                "data must be bytes (or a bytearray or memoryview), a binary file object or an "
                f"async iterable of bytes, not {type(data).__qualname__}"
            )
        limit = self.max_snapshot_bytes
        if limit is not None and len(blob) > limit:
            raise too_large(len(blob), limit, self.backend_name)
        return blob

    async def _report_corrupt(self, scope: str, snapshot_id: str) -> None:
        await self.warn(
            StoreWarning(
                kind="invalid_record",
                reason="snapshot data does not match its size and SHA-256 digest",
                scope_key=scope,
                snapshot_id=snapshot_id,
            )
        )

    async def _verified(self, snapshot: Snapshot | None) -> Snapshot | None:
        if snapshot is None:
            return None
        info = snapshot.info
        if len(snapshot.data) == info.size and hashlib.sha256(snapshot.data).hexdigest() == (
            info.sha256
        ):
            return snapshot
        reason = "snapshot data does not match its size and SHA-256 digest"
        await self._report_corrupt(info.scope, info.snapshot_id)
        raise CorruptSnapshotError(
            f"{reason}: the stored copy is damaged and was not returned "
            f"(scope {info.scope!r}, snapshot id {info.snapshot_id!r})"
        )


class StreamingSnapshotStore(SnapshotStore):
    """A snapshot store that stores and reads chunks: memory bounded by the chunk size.

    A backend implements :meth:`_put_stream` and :meth:`_open` (plus
    ``_list``, ``_delete`` and ``_purge_expired``); ``put`` of bytes and
    ``get`` are derived from them here.

    - ``_put_stream(stream)``: iterate ``stream.chunks()`` once, storing each
      chunk where no reader sees it (a temporary file, a multipart upload);
      when the iteration ends, make the snapshot visible in one atomic step
      with ``stream.info(created_at, self.snapshot_expiry(created_at))`` and
      return that info. If the iteration raises, remove what was stored and
      let the error through.
    - ``_open(scope, snapshot_id)``: ``None``, or an
      :class:`~pai_storage.snapshot_io.OpenedSnapshot` with the info and the
      stored bytes as chunks (unverified: the reader checks them).
    """

    async def _put(self, draft: SnapshotDraft) -> SnapshotInfo:
        stream = SnapshotStream(
            scope=draft.scope,
            snapshot_id=draft.snapshot_id,
            metadata=draft.metadata,
            metadata_json=draft.metadata_json,
            source=chunks_of(draft.data),
            limit=None,  # checked already
            backend=self.backend_name,
        )
        return await self._put_stream(stream)

    @abstractmethod
    async def _put_stream(self, stream: SnapshotStream) -> SnapshotInfo:
        """Store the chunks, then make the snapshot visible at once (see the class)."""

    @abstractmethod
    async def _open(self, scope: str, snapshot_id: str) -> OpenedSnapshot | None:
        """The stored, unexpired snapshot as chunks (see the class)."""

    async def _get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        opened = await self._open(scope, snapshot_id)
        if opened is None:
            return None
        try:
            data = b"".join([chunk async for chunk in opened.chunks])
        finally:
            if opened.close is not None:
                await opened.close()
        return Snapshot.model_construct(info=opened.info, data=data)


def _to_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _from_ms(value: object) -> datetime:
    if type(value) is not int:
        raise PageTokenError("page token is malformed")
    try:
        return _EPOCH + timedelta(milliseconds=value)
    except OverflowError:
        raise PageTokenError("page token is malformed") from None
