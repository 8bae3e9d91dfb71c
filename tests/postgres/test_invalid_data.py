"""Invalid stored data: lists skip it with a warning, targeted reads reject it."""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore
from support.pages import EDITED_ROW, MISMATCHES, page_read
from support.threads import check_first_list_batch_invalid

from pai_storage import Message, StoreWarning, codec
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

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
        for commit in (
            b.update_at("s", "t", version, root=b.root(title="x")),
            b.delete("s", "t", version),
        ):
            with pytest.raises(ThreadStoreInvariantError) as caught:
                await store.commit_thread(commit)
            assert "personal" not in str(caught.value)
        # Nothing was applied: the stored row is untouched.
        revision = await pg_conn.fetchval(f'SELECT revision FROM "{pg_schema}".pai_threads')
        assert revision == 1


# Edits of one stored message's JSON text (SQL replace on the doc), each of
# which makes the record invalid: a read of a page holding it must raise the
# error full validation gives, never return a coerced record.
CORRUPTIONS = {
    "NaN in metadata": ('"n":1,', '"n":NaN,'),
    "negative zero in metadata": ('"n":1,', '"n":-0.0,'),
    "integer beyond int64": ('"n":1,', '"n":9223372036854775808,'),
    "escaped lone surrogate": ('"text":"hello"', '"text":"\\ud800"'),
    "empty message id": ('"messageId":"m2"', '"messageId":""'),
    "unknown field": ('"status":"complete"', '"status":"complete","extra":1'),
    "timestamp without offset": ('Z"', '"'),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("corruption", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
async def test_a_page_holding_an_invalid_message_is_rejected(
    pg_schema: str, pg_conn: asyncpg.Connection, corruption: tuple[str, str]
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        messages = [
            b.insert(b.message(f"m{i}", "hello", metadata={"n": 1, "secret": "personal"}))
            for i in range(1, 4)
        ]
        await store.commit_thread(b.create("s", "t", changes={"messages": messages}))
        old, new = corruption
        table = f'"{pg_schema}".pai_threads_messages'
        before = await pg_conn.fetchval(f"SELECT doc FROM {table} WHERE message_id = $1", b"m2")
        assert old in before
        await pg_conn.execute(
            f"UPDATE {table} SET doc = replace(doc, $1, $2) WHERE message_id = $3",
            old,
            new,
            b"m2",
        )
        stored = await pg_conn.fetchval(f"SELECT doc FROM {table} WHERE message_id = $1", b"m2")
        with pytest.raises(ThreadStoreInvariantError) as expected:
            codec.decode(Message, stored)
        page = {"type": "page", "view": "raw", "order": "oldest", "page": {"limit": 10}}
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.read_thread(b.read("s", "t", messages=page))
        assert type(caught.value) is type(expected.value)
        assert str(caught.value) == str(expected.value)
        assert "personal" not in str(caught.value)
        assert "metadata." not in str(caught.value)  # no key of stored metadata is quoted
        # The rows beside it still read.
        others = {"type": "ids", "messageIds": ["m1", "m3"]}
        result = await store.read_thread(b.read("s", "t", messages=others))
        assert result.messages is not None
        assert [m.message_id for m in result.messages.items] == ["m1", "m3"]


@pytest.mark.asyncio
@pytest.mark.parametrize("continued", [False, True], ids=["first page", "continuation"])
@pytest.mark.parametrize(
    ("family", "old", "new", "selection"), MISMATCHES.values(), ids=MISMATCHES.keys()
)
async def test_a_page_row_whose_record_disagrees_with_its_columns_is_rejected(
    pg_schema: str,
    pg_conn: asyncpg.Connection,
    family: str,
    old: str,
    new: str,
    selection: dict[str, object],
    continued: bool,
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        request = await page_read(store, family, selection, continued)
        id_column, row_id = EDITED_ROW[family]
        updated = await pg_conn.execute(
            f'UPDATE "{pg_schema}".pai_threads_{family} SET doc = replace(doc, $1, $2) '
            f"WHERE {id_column} = $3 AND strpos(doc, $1) > 0",
            old,
            new,
            row_id,
        )
        assert updated == "UPDATE 1"
        # The id column (the backend's check) or a filter column (the plan's).
        with pytest.raises(ThreadStoreInvariantError, match="column"):
            await store.read_thread(request)


@pytest.mark.asyncio
@pytest.mark.parametrize("include_hidden", [False, True])
async def test_a_list_batch_of_invalid_roots_only_continues_after_it(
    pg_schema: str, pg_conn: asyncpg.Connection, include_hidden: bool
) -> None:
    async def corrupt(thread_id: str) -> None:
        await pg_conn.execute(
            f'UPDATE "{pg_schema}".pai_threads SET doc = replace(doc, \'"agent"\', '
            "'\"agnt\"') WHERE thread_id = $1",
            thread_id.encode(),
        )

    warnings: list[StoreWarning] = []
    async with PostgresThreadStore(URL, schema=pg_schema, on_warning=warnings.append) as store:
        await check_first_list_batch_invalid(
            store, warnings, corrupt, include_hidden=include_hidden
        )
