"""Stored data as PostgreSQL holds it: exact JSON text, bytea identifiers, corrupt rows."""

from __future__ import annotations

import json
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore
from pg_support import URL

from pai_storage import (
    CommittedResult,
    StoreWarning,
    ThreadStoreInvariantError,
)
from pai_storage import builders as b

SCOPE = "sc\x00pe/$.é"
METADATA: dict[str, Any] = {"$set": 1, "a.b": 1.0, "": [0, {"z": 1, "a": "2020-01-01T00:00:00Z"}]}


@pytest.mark.asyncio
async def test_json_text_and_bytea_keys_round_trip_exactly(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        result = await store.commit_thread(b.create(SCOPE, "t\x00🙂", metadata=METADATA))
        assert isinstance(result, CommittedResult)
        read = await store.read_thread(b.read(SCOPE, "t\x00🙂"))
        assert read.thread is not None
        assert json.dumps(read.thread.metadata) == json.dumps(METADATA)
        assert type(read.thread.metadata["a.b"]) is float
    row = await pg_conn.fetchrow(f'SELECT scope_key, thread_id, doc FROM "{pg_schema}".pai_threads')
    assert bytes(row["scope_key"]) == SCOPE.encode()
    assert bytes(row["thread_id"]) == "t\x00🙂".encode()
    assert "\\u0000" in row["doc"]  # text cannot hold U+0000; JSON escapes it
    assert '"metadata":{"$set":1,"a.b":1.0,' in row["doc"]


@pytest.mark.asyncio
async def test_corrupt_root_is_skipped_by_list_and_rejected_by_read(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    warnings: list[StoreWarning] = []
    async with PostgresThreadStore(URL, schema=pg_schema, on_warning=warnings.append) as store:
        for thread in ("a", "b", "c"):
            await store.commit_thread(b.create("s", thread, metadata={"secret": "personal"}))
        await pg_conn.execute(
            f'UPDATE "{pg_schema}".pai_threads SET doc = replace(doc, \'"agent"\', \'"agnt"\') '
            "WHERE thread_id = $1",
            b"b",
        )
        page = await store.list_threads({"scopeKey": "s", "limit": 2})
        assert sorted(t.thread_id for t in page.items) == ["a", "c"]
        assert page.next_page_token is None
        assert [(w.kind, w.scope_key, w.thread_id) for w in warnings] == [
            ("invalid_thread_skipped", "s", "b")
        ]
        assert "personal" not in warnings[0].reason
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.read_thread(b.read("s", "b"))
        assert "personal" not in str(caught.value)
