"""Conformance provisioning for the memory backend: a new in-process store per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pai_storage_conformance.provision import TestHarness

from pai_storage import ThreadStore
from pai_storage.backend import Clock, make_url

from .store import MemoryThreadStore

__all__ = ["MemoryHarness"]


class MemoryHarness(TestHarness):
    """Each store is a fresh in-process store; nothing to start or clean up."""

    components = frozenset({"threads", "kv", "state", "snapshots", "guard"})

    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        async with MemoryThreadStore(clock=clock) as store:
            yield store

    def describe(self) -> str:
        return "memory (in-process)"

    @asynccontextmanager
    async def component(self, name: str, clock: Clock | None = None) -> AsyncIterator[Any]:
        from . import backend

        opened = backend.open_components(make_url("memory://"), [name], clock=clock)[name]
        async with opened:
            yield opened
