"""Stored data as PostgreSQL holds it: exact JSON text and bytea identifiers."""

from __future__ import annotations

import json
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore

from pai_storage import CommittedResult
from pai_storage import builders as b

from .helpers import URL

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
