"""Snapshots in S3-compatible object storage (``s3://bucket/prefix``), through ``obstore``.

The layout and the algorithm are :mod:`pai_storage_objects.store`'s. What S3 adds:

- a data object is a multipart upload of 5 MiB parts, at most
  :data:`UPLOAD_CONCURRENCY` in flight, completed only once every chunk was
  read; if the chunks fail the upload is aborted, so no object appears;
- ``info.json`` is replaced with a conditional ``PUT`` (``If-None-Match: *``
  when there is none, ``If-Match: <ETag>`` otherwise), so two writers never
  both think they replaced the same info;
- S3 has no conditional ``DELETE`` on general-purpose buckets: a delete (or a
  purge) racing with a put of the *same* snapshot id may remove the new
  snapshot; it never leaves a torn or mixed one;
- the client is `obstore <https://developmentseed.org/obstore/>`_, the Python
  binding of the Rust ``object_store`` crate: native async, streaming uploads
  (multipart) and downloads, conditional puts, the usual AWS environment
  variables, one small wheel with no other dependency.

Configuration: ``endpoint``, ``region``, ``access_key_id``,
``secret_access_key``, ``session_token`` as options, else the usual
environment variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ...).
An ``http://`` endpoint (an emulator on loopback) is allowed when given.
"""

from __future__ import annotations

import builtins
import gc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from pai_storage.errors import ConfigurationError, UnavailableError
from pai_storage.snapshot_io import CHUNK_BYTES, ReplayedChunks

from .store import Blob, Blobs, Changed, ObjectSnapshotStore

if TYPE_CHECKING:
    from obstore.store import S3Config

__all__ = ["PART_BYTES", "UPLOAD_CONCURRENCY", "S3Blobs", "S3SnapshotStore"]

PART_BYTES = 5 * 1024 * 1024
"""The size of a multipart upload's parts: S3's smallest (but for the last)."""

UPLOAD_CONCURRENCY = 4
"""Parts in flight at once: a put holds at most about ``PART_BYTES`` times this."""

CREDENTIAL_OPTIONS = ("access_key_id", "secret_access_key", "session_token")
S3_OPTIONS = ("endpoint", "region", *CREDENTIAL_OPTIONS)


@contextmanager
def _errors(action: str) -> Iterator[None]:
    """Map obstore's errors; the message is the first line of the service's (no secrets)."""
    try:
        yield
    except (Changed, FileNotFoundError):
        raise
    except (AlreadyExistsError, PreconditionError) as exc:
        raise Changed from exc
    except (PermissionDeniedError, UnauthenticatedError) as exc:
        raise ConfigurationError(
            f"S3 refused to {action}: check the credentials and the bucket's permissions"
        ) from exc
    except (BaseError, OSError) as exc:
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise UnavailableError(f"S3 failed to {action}: {first}") from exc


class S3Blobs(Blobs):
    """The objects of a snapshot store under a prefix of an S3 bucket."""

    def __init__(self, store: S3Store, where: str) -> None:
        self._store = store
        self.where = where

    async def open(self) -> None:
        with _errors("list the bucket"):
            await obstore.list(self._store, "", chunk_size=1).collect_async()

    async def close(self) -> None:
        # Drop the client while the event loop runs: its connection pool is then
        # torn down now, not by the interpreter's finalization (which obstore
        # 0.12 may abort on).
        self._store = None  # type: ignore[assignment]
        gc.collect()

    async def read_small(self, key: str) -> tuple[bytes, str] | None:
        try:
            with _errors("read an object"):
                result = await obstore.get_async(self._store, key)
                data = bytes(await result.bytes_async())
        except FileNotFoundError:
            return None
        return data, str(result.meta["e_tag"])

    async def write_small(self, key: str, data: bytes, expect: str | None) -> None:
        with _errors("write an object"):
            await obstore.put_async(
                self._store, key, data, mode="create" if expect is None else {"e_tag": expect}
            )

    async def delete_small(self, key: str, expect: str) -> None:
        await self.delete(key)  # no conditional delete on general-purpose buckets

    async def write_stream(self, key: str, chunks: AsyncIterator[bytes]) -> None:
        # A small object goes in one PUT; a large one as a multipart upload.
        head: list[bytes] = []
        held = 0
        async for chunk in chunks:
            head.append(chunk)
            held += len(chunk)
            if held >= PART_BYTES:
                break
        else:
            with _errors("upload an object"):
                await obstore.put_async(self._store, key, b"".join(head), use_multipart=False)
            return
        replay = ReplayedChunks(head, chunks)
        with replay.source_failure(), _errors("upload an object"):
            await obstore.put_async(
                self._store,
                key,
                replay.chunks(),
                use_multipart=True,
                chunk_size=PART_BYTES,
                max_concurrency=UPLOAD_CONCURRENCY,
            )

    async def open_stream(
        self, key: str
    ) -> tuple[AsyncIterator[bytes], Callable[[], Awaitable[None]]] | None:
        try:
            with _errors("read an object"):
                result = await obstore.get_async(self._store, key)
        except FileNotFoundError:
            return None
        stream = result.stream(min_chunk_size=CHUNK_BYTES)

        async def chunks() -> AsyncIterator[bytes]:
            while True:
                with _errors("read an object"):
                    try:
                        chunk = await stream.__anext__()
                    except StopAsyncIteration:
                        return
                yield bytes(chunk)

        async def close() -> None:
            return None  # the response is released when the stream is dropped

        return chunks(), close

    async def list(self, prefix: str) -> builtins.list[Blob]:
        found: builtins.list[Blob] = []
        with _errors("list the bucket"):
            async for batch in obstore.list(self._store, prefix or None):
                for meta in batch:
                    modified: datetime = meta["last_modified"]
                    found.append(Blob(str(meta["path"]), modified))
        return found

    async def delete(self, key: str) -> None:
        try:
            with _errors("delete an object"):
                await obstore.delete_async(self._store, key)
        except FileNotFoundError:
            pass


class S3SnapshotStore(ObjectSnapshotStore):
    """Snapshots in an S3-compatible bucket: ``s3://bucket/prefix``.

    Streams chunks (multipart uploads, streamed downloads). No size limit of
    its own (:attr:`max_snapshot_bytes` is ``None``): the service's applies
    (AWS S3: 10,000 parts of ``PART_BYTES``, so about 48 GiB); a larger
    upload fails with the service's error and stores nothing.

    Parameters
    ----------
    bucket, prefix:
        Where the snapshots live (``prefix`` may be empty).
    endpoint, region, access_key_id, secret_access_key, session_token:
        The service; each falls back to the usual AWS environment variable.
    orphan_grace, clock, on_warning, token_secret, snapshot_ttl:
        See :class:`~pai_storage_objects.store.ObjectSnapshotStore`.
    """

    backend_name = "s3"
    token_prefix = "pai-s3"
    max_snapshot_bytes: ClassVar[int | None] = None

    def __init__(self, bucket: str, prefix: str = "", **options: Any) -> None:
        service = {k: options.pop(k) for k in S3_OPTIONS if k in options}
        for name, value in service.items():
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"option {name} must be a non-empty string")
        if not bucket:
            raise ConfigurationError("an s3:// URL names its bucket: s3://bucket/prefix")
        config: S3Config = {}
        for name, value in service.items():
            config[name] = value  # type: ignore[literal-required]
        endpoint = service.get("endpoint", "")
        client = {"allow_http": True} if endpoint.startswith("http://") else {}
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        try:
            store = S3Store(
                bucket,
                prefix=self.prefix or None,
                config=config,
                client_options=client,  # type: ignore[arg-type]
            )
        except BaseError as exc:
            raise ConfigurationError(
                f"cannot configure S3 for bucket {bucket!r}: {str(exc).splitlines()[0][:200]}"
            ) from None
        super().__init__(S3Blobs(store, f"s3://{bucket}/{self.prefix}"), **options)

    def __repr__(self) -> str:
        return f"S3SnapshotStore('s3://{self.bucket}/{self.prefix}')"
