"""Snapshots in a directory (``file:///path/to/dir``): one file per snapshot.

The layout and the algorithm are :mod:`pai_storage_objects.store`'s. What a
directory adds:

- a data file is written to a temporary name beside its final one
  (``.<random>.tmp``), flushed to disk (``fsync``), renamed into place and
  the directory flushed too; a crash leaves a temporary that a sweep removes
  once older than ``orphan_grace``;
- ``info.json`` is replaced the same way (temporary, fsync, rename), under an
  exclusive lock on the snapshot's ``.lock`` file (``flock``), so the
  conditional replace and delete of the info are atomic across processes on
  one machine, and on a network file system whose locks and renames are
  honoured (NFSv4);
- every file operation runs in a worker thread, one chunk (1 MiB) at a time.

A deleted snapshot leaves its (empty) directory and lock file behind.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fcntl
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, ParamSpec, TypeVar

from pai_storage.errors import ConfigurationError, UnavailableError
from pai_storage.snapshot_io import CHUNK_BYTES

from .store import Blob, Blobs, Changed, ObjectSnapshotStore

__all__ = ["DirectoryBlobs", "DirectorySnapshotStore"]

_LOCK = ".lock"

P = ParamSpec("P")
T = TypeVar("T")


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary beside it: write, fsync, rename, fsync the directory."""
    temporary = path.with_name(f".{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_dir(path.parent)


class DirectoryBlobs(Blobs):
    """The objects of a snapshot store as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key

    async def open(self) -> None:
        def check() -> None:
            self.root.mkdir(parents=True, exist_ok=True)
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise ConfigurationError(f"the snapshot directory {self.root} is not writable")

        try:
            await asyncio.to_thread(check)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot use {self.root} as a snapshot directory: {exc.strerror}"
            ) from exc

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        where = self._path(key).parent
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(where / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, _version(data)

    async def read_small(self, key: str) -> tuple[bytes, str] | None:
        return await _io(self._read, key)

    async def write_small(self, key: str, data: bytes, expect: str | None) -> None:
        def write() -> None:
            with self._locked(key):
                found = self._read(key)
                if (None if found is None else found[1]) != expect:
                    raise Changed
                _write_file(self._path(key), data)

        await _io(write)

    async def delete_small(self, key: str, expect: str) -> None:
        def delete() -> None:
            with self._locked(key):
                found = self._read(key)
                if found is None or found[1] != expect:
                    raise Changed
                self._path(key).unlink()

        await _io(delete)

    async def write_stream(self, key: str, chunks: AsyncIterator[bytes]) -> None:
        path = self._path(key)
        await _io(path.parent.mkdir, parents=True, exist_ok=True)
        temporary = path.with_name(f".{uuid.uuid4().hex}.tmp")
        fd = await _io(os.open, temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                async for chunk in chunks:
                    await _io(_write_all, fd, chunk)
                await _io(os.fsync, fd)
            finally:
                os.close(fd)
            await _io(os.replace, temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        await _io(_fsync_dir, path.parent)

    async def open_stream(
        self, key: str
    ) -> tuple[AsyncIterator[bytes], Callable[[], Awaitable[None]]] | None:
        try:
            # Open now: a file renamed over or deleted later stays readable through it.
            handle = await _io(open, self._path(key), "rb")
        except FileNotFoundError:
            return None

        async def chunks() -> AsyncIterator[bytes]:
            while chunk := await _io(handle.read, CHUNK_BYTES):
                yield chunk

        async def close() -> None:
            handle.close()

        return chunks(), close

    async def list(self, prefix: str) -> builtins.list[Blob]:
        def walk() -> builtins.list[Blob]:
            found: builtins.list[Blob] = []
            start = self._path(prefix) if prefix.endswith("/") or not prefix else self.root
            for where, _, files in os.walk(start):
                for name in files:
                    if name == _LOCK:
                        continue
                    path = Path(where) / name
                    try:
                        modified = path.stat().st_mtime
                    except FileNotFoundError:
                        continue
                    key = path.relative_to(self.root).as_posix()
                    if key.startswith(prefix):
                        found.append(Blob(key, datetime.fromtimestamp(modified, UTC)))
            return found

        return await _io(walk)

    async def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await _io(self._path(key).unlink)


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view) :]


async def _io(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking file operation in a worker thread; map a failing disk to typed errors."""
    try:
        return await asyncio.to_thread(call, *args, **kwargs)
    except (FileNotFoundError, Changed):
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ESTALE):
            raise UnavailableError(f"the snapshot directory failed: {exc.strerror}") from exc
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ConfigurationError(
                f"the snapshot directory refused an operation: {exc.strerror}"
            ) from exc
        raise UnavailableError(f"the snapshot directory failed: {exc.strerror}") from exc


class DirectorySnapshotStore(ObjectSnapshotStore):
    """Snapshots as files in a directory: ``file:///path/to/dir``.

    Streams chunks to and from disk (memory bounded by the chunk size); no
    size limit but the disk's. Safe for several processes (and machines on a
    network file system that honours ``rename`` and ``flock``).

    Parameters
    ----------
    path:
        The directory (created when missing), or ``url`` ``file:///path``.
    orphan_grace, clock, on_warning, token_secret, snapshot_ttl:
        See :class:`~pai_storage_objects.store.ObjectSnapshotStore`.
    """

    backend_name = "files"
    token_prefix = "pai-files"
    max_snapshot_bytes: ClassVar[int | None] = None

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        self.path = Path(path)
        super().__init__(DirectoryBlobs(self.path), **options)

    def __repr__(self) -> str:
        return f"DirectorySnapshotStore({str(self.path)!r})"
