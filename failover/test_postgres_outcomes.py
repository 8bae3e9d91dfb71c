"""PostgreSQL: a runtime-store write whose reply is lost must be an unknown outcome.

What a failover does to an autocommit write in flight, made deterministic: a
loopback proxy forwards the statement, the server applies it, and the reply
never arrives. The store cannot know whether the write applied, so the
contract requires ``OutcomeUnknownError``; ``UnavailableError`` would promise
that nothing was written, which the re-read disproves.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

pytest.importorskip("asyncpg")

import asyncpg  # type: ignore[import-untyped]
from support.proxy import FaultProxy

from pai_storage import Item, OutcomeUnknownError, StorageError, make_url, open_kv_store
from pai_storage.errors import ThreadStoreError

pytestmark = pytest.mark.asyncio

URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest_asyncio.fixture
async def schema() -> AsyncIterator[str]:
    name = f"pai_failover_{uuid.uuid4().hex[:12]}"
    yield name
    conn = await asyncpg.connect(make_url(URL).render(hide_password=False, scheme="postgresql"))
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def test_kv_write_with_lost_reply_is_outcome_unknown(schema: str) -> None:
    parsed = make_url(URL)
    proxy = FaultProxy(parsed.port or 5432, parsed.host or "127.0.0.1")
    await proxy.start()
    user = f"{parsed.username}@" if parsed.username else ""
    # One connection and no statement cache: every statement's SQL text crosses the proxy.
    kv = open_kv_store(
        f"postgresql://{user}127.0.0.1:{proxy.port}{parsed.path}",
        schema=schema,
        min_pool_size=1,
        max_pool_size=1,
        statement_cache_size=0,
    )
    direct = open_kv_store(URL, schema=schema)
    try:
        first = await kv.put(("ns",), "key", {"n": 1})
        # The statement's parameters (its Bind message) carry the value: the server
        # receives and applies the write, its reply is lost.
        proxy.cut_on(b"second-value", forward=True)
        with pytest.raises(StorageError) as caught:
            await kv.put_if_version(("ns",), "key", {"n": "second-value"}, first.version)
        assert proxy.triggered.is_set()
        proxy.restore()
        stored = await direct.get(("ns",), "key")
        assert isinstance(stored, Item)
        assert stored.value == {"n": "second-value"}  # applied: only an unknown outcome is truthful
        assert isinstance(caught.value, OutcomeUnknownError), repr(caught.value)
        # A runtime store raises the general class, in words that fit a key-value write.
        assert not isinstance(caught.value, ThreadStoreError), repr(caught.value)
        assert "may or may not have been applied" in str(caught.value)
        assert "thread" not in str(caught.value)
    finally:
        await kv.close()
        await direct.close()
        await proxy.stop()
