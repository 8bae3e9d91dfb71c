"""Conformance provisioning for PostgreSQL: each store in its own throwaway schema."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pai_storage_conformance.provision import TestHarness

from pai_storage import ThreadStore
from pai_storage.backend import Clock, StoreURL, make_url, redact
from pai_storage.errors import ThreadStoreUnavailableError

from . import backend as postgres_backend
from .schema import quote_ident
from .store import PostgresThreadStore

__all__ = ["DEFAULT_TEST_URL", "PostgresHarness"]

DEFAULT_TEST_URL = "postgresql://postgres@127.0.0.1:5432/test"
"""Where the conformance harness looks when no URL is given."""


class PostgresHarness(TestHarness):
    """Conformance stores, each in its own throwaway PostgreSQL schema."""

    components = postgres_backend.components
    """Every component this installation ships."""

    def __init__(self, url: str | None = None) -> None:
        self.url: StoreURL = make_url(url or DEFAULT_TEST_URL)
        self._server: str | None = None

    def _dsn(self) -> str:
        return self.url.render(hide_password=False, scheme="postgresql")

    async def start(self) -> None:
        import asyncpg  # type: ignore[import-untyped]

        try:
            conn = await asyncpg.connect(self._dsn(), timeout=10)
        except Exception as exc:
            raise ThreadStoreUnavailableError(
                f"cannot reach PostgreSQL at {self.url} "
                f"({type(exc).__name__}: {redact(str(exc), self.url)}); start the server or "
                "pass --pai-url / PAI_TEST_POSTGRES_URL"
            ) from None
        try:
            self._server = str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()

    def describe(self) -> str:
        return f"PostgreSQL {self._server or '?'} at {self.url}"

    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        schema = f"pai_test_{uuid.uuid4().hex[:16]}"
        store = PostgresThreadStore(self.url, schema=schema, clock=clock, max_pool_size=20)
        try:
            async with store:
                yield store
        finally:
            await self._drop(schema)

    @asynccontextmanager
    async def component(self, name: str, clock: Clock | None = None) -> AsyncIterator[Any]:
        if name == "threads":
            async with self.store(clock) as store:
                yield store
            return
        schema = f"pai_test_{uuid.uuid4().hex[:16]}"
        opened = postgres_backend.open_components(
            self.url, [name], clock=clock, schema=schema, max_pool_size=20
        )[name]
        try:
            async with opened:
                yield opened
        finally:
            await self._drop(schema)

    async def _drop(self, schema: str) -> None:
        import asyncpg

        conn = await asyncpg.connect(self._dsn(), timeout=10)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        finally:
            await conn.close()
