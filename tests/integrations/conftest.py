"""Backends for the framework adapters' tests: every test runs on each of them.

Each test gets its own namespace: a fresh SQLite file, PostgreSQL schema,
MariaDB table prefix or MongoDB database (dropped afterwards). MongoDB is the
conformance harness's throwaway replica set (one per test process), or
``PAI_TEST_MONGO_URL``; PostgreSQL and MariaDB are ``PAI_TEST_POSTGRES_URL``
and ``PAI_TEST_SQL_MYSQL_URL`` (defaults: the local test servers).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import pai_storage

POSTGRES_URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("PAI_TEST_SQL_MYSQL_URL", "mysql://root@127.0.0.1/test")
BACKENDS = ["memory", "sqlite", "postgres", "mongo", "mariadb"]
DURABLE = [b for b in BACKENDS if b != "memory"]  # shared by two processes


@dataclass
class Target:
    """Where one test's stores live: a URL and the options that isolate them."""

    backend: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def connect(self, **extra: Any) -> pai_storage.Stores:
        return pai_storage.connect(self.url, **self.options, **extra)


@pytest.fixture(scope="session")
def mongo_url() -> Iterator[str]:
    """A replica set for this test process (started on first use)."""
    from pai_storage_mongo.harness import MongoHarness

    harness = MongoHarness(os.environ.get("PAI_TEST_MONGO_URL") or None)
    asyncio.run(harness.start())
    try:
        assert harness.url is not None
        yield harness.url
    finally:
        asyncio.run(harness.aclose())


async def _drop_schema(schema: str) -> None:
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(POSTGRES_URL, timeout=10)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _mysql_engine() -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    url = pai_storage.make_url(MYSQL_URL).render(hide_password=False, scheme="mysql+asyncmy")
    return create_async_engine(url, poolclass=NullPool)


async def _mysql_tables(table_prefix: str, drop: bool) -> None:
    """Drop a prefix's tables, or empty them for the next test (DDL costs MariaDB seconds)."""
    from pai_storage_sql.schema import Tables
    from sqlalchemy import delete

    metadata = Tables.define(table_prefix).metadata
    engine = _mysql_engine()
    try:
        async with engine.begin() as conn:
            if drop:
                await conn.run_sync(metadata.drop_all)
            else:
                for table in reversed(metadata.sorted_tables):
                    await conn.execute(delete(table))
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
def mariadb_prefixes() -> Iterator[list[str]]:
    """Table prefixes emptied after their test, ready for the next one; dropped at the end."""
    free: list[str] = []
    yield free
    for prefix in free:
        asyncio.run(_mysql_tables(prefix, drop=True))


async def _drop_database(url: str, name: str) -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        await client.drop_database(name)
    finally:
        await client.close()


def _server(backend: str, request: pytest.FixtureRequest) -> str:
    """The server URL of a backend (synchronous: it may start the replica set)."""
    if backend == "mongo":
        return str(request.getfixturevalue("mongo_url"))
    if backend == "mariadb":
        request.getfixturevalue("mariadb_prefixes")
    return {"postgres": POSTGRES_URL, "mariadb": MYSQL_URL}.get(backend, "")


async def make_target(
    backend: str, server: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Target]:
    fresh = uuid.uuid4().hex[:12]
    if backend == "memory":
        yield Target(backend, "memory://")
    elif backend == "sqlite":
        yield Target(backend, f"sqlite:///{tmp_path}/pai.db")
    elif backend == "postgres":
        yield Target(backend, server, {"schema": f"pai_int_{fresh}"})
        await _drop_schema(f"pai_int_{fresh}")
    elif backend == "mariadb":
        free: list[str] = request.getfixturevalue("mariadb_prefixes")
        prefix = free.pop() if free else f"i{fresh}"
        yield Target(backend, server, {"table_prefix": prefix})
        await _mysql_tables(prefix, drop=False)
        free.append(prefix)
    else:
        yield Target(backend, server, {"db_name": f"pai_int_{fresh}"})
        await _drop_database(server, f"pai_int_{fresh}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, _server(request.param, request)


@pytest.fixture(params=DURABLE)
def durable_backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, _server(request.param, request)


@pytest_asyncio.fixture
async def target(
    backend: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Target]:
    """Each backend in turn, in a namespace of this test's own."""
    async for made in make_target(*backend, tmp_path, request):
        yield made


@pytest_asyncio.fixture
async def durable_target(
    durable_backend: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Target]:
    """Each backend another process can open too."""
    async for made in make_target(*durable_backend, tmp_path, request):
        yield made


@pytest_asyncio.fixture
async def stores(target: Target) -> AsyncIterator[pai_storage.Stores]:
    async with target.connect() as opened:
        yield opened
