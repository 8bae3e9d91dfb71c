"""Streaming a snapshot in and out: the incoming stream of a ``put``, the reader of ``open``.

A snapshot's data travels as chunks of bytes, so a put or a read holds one
chunk at a time (:data:`CHUNK_BYTES`), never the whole snapshot:

- :class:`SnapshotStream` is what a streaming backend receives from ``put``:
  the validated names and metadata plus the data as an async iterator of
  chunks. It counts and hashes the bytes while the backend consumes them and
  refuses a snapshot over the backend's limit as soon as it passes it; once
  the chunks are exhausted, ``size`` and ``sha256`` are final.
- :class:`ReplayedChunks` hands a driver's streamed upload the chunks a
  backend read ahead, then the rest, and lets the source's failure win over
  the error the driver aborts with.
- :class:`SnapshotReader` is what ``open`` returns: the snapshot's
  :class:`~pai_storage.snapshots.SnapshotInfo` and its data as verified chunks.
  It holds the last chunk back until the size and SHA-256 of everything read
  match the stored ones, so a damaged snapshot raises
  :class:`~pai_storage.errors.CorruptSnapshotError` at the latest when the
  last chunk would be handed out (earlier when it is longer than stored).

The user guide is ``docs/snapshots.md``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import io
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from .errors import (
    ConfigurationError,
    CorruptSnapshotError,
    InvalidInputError,
    SnapshotTooLargeError,
)

if TYPE_CHECKING:
    from .snapshots import SnapshotInfo

__all__ = [
    "CHUNK_BYTES",
    "OpenedSnapshot",
    "ReplayedChunks",
    "SnapshotData",
    "SnapshotReader",
    "SnapshotStream",
    "chunks_of",
    "source_chunks",
    "too_large",
]

CHUNK_BYTES = 1024 * 1024
"""The size of the chunks a file object is read in and a reader hands out (1 MiB)."""


class _BinaryFile(Protocol):
    def read(self, size: int = ..., /) -> Any: ...


SnapshotData = bytes | bytearray | memoryview | _BinaryFile | AsyncIterable[bytes]
"""What ``put`` takes: bytes-like, a binary file object, or an async iterable of bytes."""


def too_large(size: int, limit: int, backend: str) -> SnapshotTooLargeError:
    """The error for a snapshot of ``size`` bytes (or more) over ``limit``."""
    return SnapshotTooLargeError(
        f"snapshot is {size:,} bytes, over the {backend} backend's limit of {limit:,} "
        "bytes; store large snapshots in another backend with a hybrid bundle: "
        "connect(url, snapshots=other_url)"
    )


def chunks_of(data: bytes, size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
    """``data`` as chunks of at most ``size`` bytes (one empty chunk for no data)."""

    async def chunks() -> AsyncIterator[bytes]:
        view = memoryview(data)
        if not view:
            return
        for start in range(0, len(view), size):
            yield bytes(view[start : start + size])

    return chunks()


async def _file_chunks(source: _BinaryFile) -> AsyncIterator[bytes]:
    read = source.read
    # A file on disk blocks: read it in a worker thread. An in-memory buffer is
    # read directly, an async file's read is awaited.
    on_disk = not isinstance(source, io.BytesIO) and callable(getattr(source, "fileno", None))
    while True:
        if inspect.iscoroutinefunction(read):
            chunk = await read(CHUNK_BYTES)
        elif on_disk:
            chunk = await asyncio.to_thread(read, CHUNK_BYTES)
        else:
            chunk = read(CHUNK_BYTES)
        if isinstance(chunk, str):
            raise InvalidInputError(
                "data must be bytes: the file object returned str (open it in binary mode, 'rb')"
            )
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise InvalidInputError(
                f"data must be bytes: the file object's read() returned {type(chunk).__qualname__}"
            )
        if not chunk:
            return
        yield bytes(chunk)


async def _iterable_chunks(source: AsyncIterable[Any]) -> AsyncIterator[bytes]:
    async for chunk in source:
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise InvalidInputError(
                f"data must be bytes: the async iterable yielded {type(chunk).__qualname__}"
            )
        if chunk:
            yield bytes(chunk)


def source_chunks(data: object) -> AsyncIterator[bytes] | None:
    """The chunks of a file object or an async iterable; ``None`` for anything else."""
    if hasattr(data, "read") and callable(data.read):
        return _file_chunks(data)
    if hasattr(data, "__aiter__"):
        return _iterable_chunks(data)
    return None


class ReplayedChunks:
    """The chunks a backend read ahead, then the rest of the source, for one upload.

    A backend reads a stream's first chunks to choose between one small write
    and a streamed upload; for the upload it hands on :meth:`chunks`: the
    chunks read ahead (forgotten once handed out), then the rest. When the
    source fails (the caller's iterator raised, the size limit was passed),
    the driver aborts its upload with an error of its own; run the upload
    inside :meth:`source_failure` so the source's error is the one raised.
    """

    def __init__(self, head: list[bytes], rest: AsyncIterator[bytes]) -> None:
        self._head = head
        self._rest = rest
        self.failure: BaseException | None = None
        """What the source raised while the upload read it, if anything."""

    async def chunks(self) -> AsyncIterator[bytes]:
        """The chunks read ahead, then the rest (iterate once)."""
        try:
            for chunk in self._head:
                yield chunk
            self._head.clear()
            async for chunk in self._rest:
                yield chunk
        except BaseException as exc:  # the caller's source or the size limit
            self.failure = exc
            raise

    @contextmanager
    def source_failure(self) -> Iterator[None]:
        """Raise the source's failure instead of the error the upload aborted with."""
        try:
            yield
        except Exception:
            if self.failure is not None:
                raise self.failure from None
            raise


class SnapshotStream:
    """The data of a streamed ``put``: chunks counted and hashed as a backend takes them.

    A backend iterates :meth:`chunks` once, storing each chunk; when the
    iteration ends, :attr:`size` and :attr:`sha256` describe exactly the bytes
    it received. An iteration that raises (a bad chunk, the size limit, the
    caller's own source failing) must leave nothing stored.
    """

    def __init__(
        self,
        *,
        scope: str,
        snapshot_id: str,
        metadata: dict[str, Any],
        metadata_json: str,
        source: AsyncIterator[bytes],
        limit: int | None,
        backend: str,
    ) -> None:
        self.scope = scope
        self.snapshot_id = snapshot_id
        self.metadata = metadata
        self.metadata_json = metadata_json
        self.size = 0
        self._hash = hashlib.sha256()
        self._source = source
        self._limit = limit
        self._backend = backend
        self._done = False
        self._taken = False

    @property
    def sha256(self) -> str:
        """The SHA-256 of the bytes taken so far (final once :meth:`chunks` is exhausted)."""
        return self._hash.hexdigest()

    @property
    def done(self) -> bool:
        """Whether every chunk was taken."""
        return self._done

    async def chunks(self) -> AsyncIterator[bytes]:
        """The data, one chunk at a time (iterate once)."""
        if self._taken:
            raise RuntimeError("a snapshot stream is read once")
        self._taken = True
        async for chunk in self._source:
            self.size += len(chunk)
            if self._limit is not None and self.size > self._limit:
                raise too_large(self.size, self._limit, self._backend)
            self._hash.update(chunk)
            yield chunk
        self._done = True

    async def read_all(self) -> bytes:
        """Every chunk joined (for a backend that stores a snapshot as one value)."""
        parts = [chunk async for chunk in self.chunks()]
        return b"".join(parts)

    def info(self, created_at: datetime, expires_at: datetime | None) -> SnapshotInfo:
        """The info of this snapshot once stored at ``created_at`` (after the chunks)."""
        from .snapshots import SnapshotInfo

        if not self._done:
            raise RuntimeError("the snapshot stream was not read to its end")
        return SnapshotInfo.model_construct(
            scope=self.scope,
            snapshot_id=self.snapshot_id,
            size=self.size,
            sha256=self.sha256,
            metadata=self.metadata,
            created_at=created_at,
            expires_at=expires_at,
        )


@dataclass
class OpenedSnapshot:
    """What a backend's ``_open`` returns: the info and the stored data as chunks.

    ``chunks`` yields the bytes exactly as stored (the reader verifies them);
    ``close`` releases whatever the backend holds (a file, a response, a
    cursor) and is called once, whether or not the chunks were read.
    """

    info: SnapshotInfo
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]] | None = None


class SnapshotReader:
    """A stored snapshot, read as verified chunks.

    ``info`` is known at once; ``async for chunk in reader`` hands out the
    data. Use it as ``async with reader:`` (or call :meth:`aclose`) so the
    backend's resources are released even when the data is not read to its end.
    It is read once: iterating it again, or after :meth:`aclose`, raises
    :class:`~pai_storage.errors.ConfigurationError`, as a closed store does.

    Integrity: every chunk is counted and hashed as it is read. More bytes
    than stored raise :class:`~pai_storage.errors.CorruptSnapshotError` at
    once; otherwise the last chunk is handed out only after the size and the
    SHA-256 of all the data matched, so a damaged snapshot raises before
    the iteration ends normally. Whoever writes the chunks somewhere must
    treat them as unverified until the iteration finished without an error.
    """

    def __init__(self, opened: OpenedSnapshot, on_corrupt: Callable[[], Awaitable[None]]) -> None:
        self.info: SnapshotInfo = opened.info
        self._opened = opened
        self._on_corrupt = on_corrupt
        self._started = False
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release the backend's resources (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._opened.chunks.aclose()  # type: ignore[attr-defined]
        except AttributeError:
            pass
        finally:
            if self._opened.close is not None:
                await self._opened.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._started:
            raise ConfigurationError("a snapshot reader is read once; open the snapshot again")
        if self._closed:
            raise ConfigurationError("the snapshot reader is closed")
        self._started = True
        return self._verified()

    async def read(self) -> bytes:
        """All the data, verified (for small snapshots: it is held in memory)."""
        parts = [chunk async for chunk in self]
        return b"".join(parts)

    async def _verified(self) -> AsyncIterator[bytes]:
        expected = self.info.size
        digest = hashlib.sha256()
        size = 0
        held: bytes | None = None
        async for chunk in self._opened.chunks:
            size += len(chunk)
            if size > expected:
                await self._corrupt()
            digest.update(chunk)
            if held is not None:
                yield held
            held = bytes(chunk)
        if size != expected or digest.hexdigest() != self.info.sha256:
            await self._corrupt()
        if held is not None:
            yield held

    async def _corrupt(self) -> None:
        await self._on_corrupt()
        raise CorruptSnapshotError(
            "snapshot data does not match its size and SHA-256 digest: the stored copy is "
            f"damaged and was not returned (scope {self.info.scope!r}, snapshot id "
            f"{self.info.snapshot_id!r})"
        )
