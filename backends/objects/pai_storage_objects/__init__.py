"""Snapshot stores for large snapshots: a directory (``file://``) and S3 (``s3://``).

Two backends that provide one component, ``snapshots``, for a hybrid bundle::

    pai_storage.connect("mongodb://db/app", snapshots="s3://bucket/snapshots")
    pai_storage.connect("postgresql://db/app", snapshots="file:///var/lib/app/snapshots")

Both stream snapshots in chunks (memory bounded by the chunk size, not the
snapshot size) and share one algorithm (:mod:`pai_storage_objects.store`).
``file://`` needs nothing more; ``s3://`` needs the ``s3`` extra
(``pip install 'pai-storage[s3]'``, the ``obstore`` client). See
``docs/snapshots.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pai_storage import ThreadStore
from pai_storage.backend import Backend, ManagedStore, StoreURL
from pai_storage.errors import ThreadStoreConfigurationError

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

__all__ = ["FilesBackend", "S3Backend", "files_backend", "s3_backend"]

_COMMON = ("clock", "on_warning", "token_secret", "snapshot_ttl", "orphan_grace")
_S3 = ("endpoint", "region", "access_key_id", "secret_access_key", "session_token")


class _SnapshotsOnly(Backend):
    components = frozenset({"snapshots"})

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        raise ThreadStoreConfigurationError(
            f"the {self.name} backend provides snapshots only; open it for them: "
            f"connect(url, snapshots='{url.scheme}://...')"
        )


class FilesBackend(_SnapshotsOnly):
    """``file:///path/to/dir``: snapshots as files in a directory."""

    name = "files"
    url_schemes = ("file",)

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        from .files import DirectorySnapshotStore

        if url.host not in (None, "", "localhost") or url.query or not url.path.strip("/"):
            raise ThreadStoreConfigurationError(
                "a directory URL is file:///absolute/path (no host, no query)"
            )
        self.check_options(url, options, _COMMON)
        return {"snapshots": DirectorySnapshotStore(unquote(url.path), **options)}

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import FilesHarness

        return FilesHarness(url)


class S3Backend(_SnapshotsOnly):
    """``s3://bucket/prefix``: snapshots as objects in S3-compatible storage."""

    name = "s3"
    url_schemes = ("s3",)
    extra = "s3"
    requires = ("obstore",)

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        from .s3 import S3SnapshotStore

        if not url.host or url.username or url.password or url.port or url.query:
            raise ThreadStoreConfigurationError(
                "an S3 URL is s3://bucket/prefix; give the endpoint, region and credentials "
                "as options or environment variables, never in the URL"
            )
        self.check_options(url, options, (*_COMMON, *_S3))
        prefix = unquote(url.path).strip("/")
        return {"snapshots": S3SnapshotStore(url.host, prefix, **options)}

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import S3Harness

        return S3Harness(url)


files_backend = FilesBackend()
s3_backend = S3Backend()
