"""Invalid stored data: lists skip it with a warning, targeted reads reject it."""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore

from pai_storage import StoreWarning, ThreadStoreInvariantError
from pai_storage import builders as b

from .helpers import URL


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


@pytest.mark.asyncio
async def test_commit_to_a_corrupt_root_is_an_invariant_error(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        created = await store.commit_thread(b.create("s", "t", metadata={"secret": "personal"}))
        assert created.type == "committed"
        assert created.thread is not None
        version = created.thread.version
        await pg_conn.execute(
            f'UPDATE "{pg_schema}".pai_threads SET doc = replace(doc, \'"agent"\', \'"agnt"\')'
        )
        for commit in (b.update("s", "t", version, title="x"), b.delete("s", "t", version)):
            with pytest.raises(ThreadStoreInvariantError) as caught:
                await store.commit_thread(commit)
            assert "personal" not in str(caught.value)
        # Nothing was applied: the stored row is untouched.
        revision = await pg_conn.fetchval(f'SELECT revision FROM "{pg_schema}".pai_threads')
        assert revision == 1
