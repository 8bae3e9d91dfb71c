"""Fixtures for the SQL backend's own tests: real SQLite files and a real MariaDB.

MariaDB/MySQL comes from ``PAI_TEST_SQL_MYSQL_URL`` (default
``mysql://root@127.0.0.1/test``). Tests fail loudly, not skip, when it is
unreachable. Each test gets a fresh SQLite file (under ``tmp_path``) or a
fresh table prefix (dropped afterwards).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

pytest.importorskip("sqlalchemy")

from pai_storage_sql import SqlThreadStore
from pai_storage_sql.client import SqlClient
from pai_storage_sql.schema import Tables
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from pai_storage import make_url

MYSQL_URL = os.environ.get("PAI_TEST_SQL_MYSQL_URL", "mysql://root@127.0.0.1/test")


@dataclass
class Target:
    """Where one test's stores live: a URL and the options that isolate them."""

    dialect: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def store(self, **extra: Any) -> SqlThreadStore:
        return SqlThreadStore(self.url, **self.options, **extra)

    def client(self, **extra: Any) -> SqlClient:
        client = SqlClient.attached(self.url, **self.options, **extra)
        return client


def mysql_engine() -> AsyncEngine:
    """A plain engine on the test server (no schema preparation)."""
    parsed = make_url(MYSQL_URL)
    return create_async_engine(
        parsed.render(hide_password=False, scheme="mysql+asyncmy"), poolclass=NullPool
    )


async def drop_tables(table_prefix: str) -> None:
    """Drop every table of ``table_prefix`` (thread and runtime tables), whatever
    schema version they record."""
    engine = mysql_engine()
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Tables.define(table_prefix).metadata.drop_all)
    finally:
        await engine.dispose()


@pytest.fixture
def sqlite_target(tmp_path: Any) -> Target:
    return Target("sqlite", f"sqlite:///{tmp_path}/pai.db")


@pytest_asyncio.fixture
async def mysql_target() -> AsyncIterator[Target]:
    prefix = f"pai_sqltest_{uuid.uuid4().hex[:12]}"
    yield Target("mysql", MYSQL_URL, {"table_prefix": prefix})
    await drop_tables(prefix)


@pytest_asyncio.fixture(params=["sqlite", "mysql"])
async def target(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Target]:
    """Each dialect in turn."""
    if request.param == "sqlite":
        yield Target("sqlite", f"sqlite:///{tmp_path}/pai.db")
        return
    prefix = f"pai_sqltest_{uuid.uuid4().hex[:12]}"
    yield Target("mysql", MYSQL_URL, {"table_prefix": prefix})
    await drop_tables(prefix)


@pytest_asyncio.fixture
async def store(target: Target) -> AsyncIterator[SqlThreadStore]:
    async with target.store() as opened:
        yield opened
