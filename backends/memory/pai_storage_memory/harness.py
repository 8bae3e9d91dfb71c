"""Conformance provisioning for the memory backend: a new in-process store per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pai_storage_conformance.provision import TestHarness

from pai_storage import Clock, ThreadStore

from .store import MemoryThreadStore

__all__ = ["MemoryHarness"]


class MemoryHarness(TestHarness):
    """Each store is a fresh :class:`MemoryThreadStore`; nothing to start or clean up."""

    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        async with MemoryThreadStore(clock=clock) as store:
            yield store

    def describe(self) -> str:
        return "memory (in-process)"
