"""The embedded in-memory backend (``memory://``): the reference model, for tests and demos."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pai_storage import (
    Backend,
    Clock,
    StoreURL,
    TestHarness,
    ThreadStore,
    ThreadStoreConfigurationError,
)

from .store import MemoryThreadStore

__all__ = ["MemoryBackend", "MemoryThreadStore", "backend"]

_OPTIONS = frozenset({"clock", "on_warning", "token_secret"})


class MemoryHarness(TestHarness):
    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        async with MemoryThreadStore(clock=clock) as store:
            yield store

    def describe(self) -> str:
        return "memory (in-process)"


class MemoryBackend(Backend):
    name = "memory"
    url_schemes = ("memory",)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, _OPTIONS)
        if url.host or url.path.strip("/") or url.query:
            raise ThreadStoreConfigurationError("memory:// takes no host, path or query")
        return MemoryThreadStore(**options)

    def test_harness(self, url: str | None = None) -> TestHarness:
        return MemoryHarness()


backend = MemoryBackend()
