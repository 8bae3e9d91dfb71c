"""Fixtures for the PostgreSQL backend's own tests: a real server, never mocks.

The server comes from ``PAI_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``). Tests fail loudly, not skip,
when it is unreachable.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

pytest.importorskip("asyncpg")

import asyncpg  # type: ignore[import-untyped]
from support.proxy import FaultProxy

from pai_storage import make_url

from .helpers import URL, dsn


@pytest.fixture
def pg_url() -> str:
    return URL


@pytest_asyncio.fixture
async def pg_schema() -> AsyncIterator[str]:
    """A fresh schema name, dropped (with everything in it) afterwards."""
    name = f"pai_pgtest_{uuid.uuid4().hex[:12]}"
    yield name
    conn = await asyncpg.connect(dsn(), timeout=10)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest_asyncio.fixture
async def pg_conn() -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn(), timeout=10)
    yield conn
    await conn.close()


@pytest_asyncio.fixture
async def fault_proxy() -> AsyncIterator[FaultProxy]:
    parsed = make_url(URL)
    proxy = FaultProxy(parsed.port or 5432, parsed.host or "127.0.0.1")
    await proxy.start()
    yield proxy
    await proxy.stop()


@pytest.fixture
def make_message() -> Callable[..., dict[str, object]]:
    def build(message_id: str, *, text: str = "hello", **extra: object) -> dict[str, object]:
        record: dict[str, object] = {
            "messageId": message_id,
            "role": "user",
            "parts": [{"type": "text", "text": text}],
            "producer": {"kind": "user"},
            "association": {"kind": "standalone"},
            "visibility": {"transcript": True, "context": True},
            "status": "complete",
            "metadata": {},
        }
        record.update(extra)
        return record

    return build
