"""Conformance provisioning for Redis: each store under its own throwaway key prefix.

Tests share one server (and, under pytest-xdist, one database): every store
gets the key prefix ``pai-test-<random>:`` and its keys are deleted when the
store's context exits.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from pai_storage_conformance.provision import TestHarness

from pai_storage import ThreadStore, UnavailableError
from pai_storage.backend import Clock, StoreURL, make_url, redact

from . import backend as redis_backend

__all__ = ["DEFAULT_TEST_URL", "RedisHarness", "drop_prefix"]

DEFAULT_TEST_URL = "redis://127.0.0.1:6379/15"
"""Where the conformance harness looks when no URL is given."""


async def drop_prefix(url: StoreURL, key_prefix: str) -> None:
    """Delete every key the stores with ``key_prefix`` made (test clean-up)."""
    from redis.asyncio import Redis

    client = Redis.from_url(url.render(hide_password=False))
    try:
        batch = []
        async for key in client.scan_iter(match="{" + key_prefix + "*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                await client.unlink(*batch)
                batch = []
        if batch:
            await client.unlink(*batch)
    finally:
        await client.aclose()


class RedisHarness(TestHarness):
    """Conformance stores of the runtime components, each under a fresh key prefix.

    The thread store is not provided, so the suite reports its topics as not
    provided.
    """

    components = redis_backend.components

    def __init__(self, url: str | None = None) -> None:
        self.url: StoreURL = make_url(url or DEFAULT_TEST_URL)
        self._server: str | None = None

    async def start(self) -> None:
        from redis.asyncio import Redis

        client = Redis.from_url(self.url.render(hide_password=False), socket_connect_timeout=5)
        try:
            info = await client.info("server")
        except Exception as exc:
            raise UnavailableError(
                f"cannot reach Redis at {self.url} ({type(exc).__name__}: "
                f"{redact(str(exc), self.url)}); start the server or pass --pai-url / "
                "PAI_TEST_REDIS_URL"
            ) from None
        finally:
            await client.aclose()
        self._server = str(info.get("redis_version", "?"))

    def describe(self) -> str:
        return f"Redis {self._server or '?'} at {self.url} (threads not provided)"

    def store(self, clock: Clock | None = None) -> AbstractAsyncContextManager[ThreadStore]:
        raise LookupError("the redis backend does not provide the threads component")

    @asynccontextmanager
    async def component(self, name: str, clock: Clock | None = None) -> AsyncIterator[Any]:
        prefix = f"pai-test-{uuid.uuid4().hex[:16]}:"
        opened = redis_backend.open_components(self.url, [name], clock=clock, key_prefix=prefix)[
            name
        ]
        try:
            async with opened:
                yield opened
        finally:
            await drop_prefix(self.url, prefix)
