"""The embedded in-memory backend (``memory://``): the reference model, for tests and demos."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pai_storage import ThreadStore, ThreadStoreConfigurationError
from pai_storage.backend import Backend, StoreURL

from .store import MemoryThreadStore

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

__all__ = ["MemoryBackend", "MemoryThreadStore", "backend"]

_OPTIONS = frozenset({"clock", "on_warning", "token_secret"})


class MemoryBackend(Backend):
    name = "memory"
    url_schemes = ("memory",)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, _OPTIONS)
        if url.host or url.path.strip("/") or url.query:
            raise ThreadStoreConfigurationError("memory:// takes no host, path or query")
        return MemoryThreadStore(**options)

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import MemoryHarness  # test provisioning, imported only by the suite

        return MemoryHarness()


backend = MemoryBackend()
