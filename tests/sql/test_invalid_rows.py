"""A page row whose record disagrees with the columns it was chosen by is refused.

Pages are chosen by columns the store derives from each record (the id, the
view, the status, the run); a row whose JSON text says otherwise is invalid
stored data, refused like any other (docs/reads.md), never served. Rows are
edited behind the store's back, on SQLite and MariaDB.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from sqlalchemy import text
from support.pages import EDITED_ROW, MISMATCHES, page_read
from support.threads import check_first_list_batch_invalid

from pai_storage import StoreWarning
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .conftest import Target, mysql_engine

pytestmark = pytest.mark.asyncio


async def _run(target: Target, sql: str, params: dict[str, Any]) -> int:
    """Run one statement on the target's database, behind the store's back; its row count."""
    if target.dialect == "sqlite":
        with sqlite3.connect(target.url.removeprefix("sqlite:///")) as conn:
            return conn.execute(sql, params).rowcount
    engine = mysql_engine()
    try:
        async with engine.begin() as conn:
            return (await conn.execute(text(sql), params)).rowcount
    finally:
        await engine.dispose()


@pytest.mark.parametrize("continued", [False, True], ids=["first page", "continuation"])
@pytest.mark.parametrize(
    ("family", "old", "new", "selection"), MISMATCHES.values(), ids=MISMATCHES.keys()
)
async def test_a_page_row_whose_record_disagrees_with_its_columns_is_refused(
    target: Target,
    family: str,
    old: str,
    new: str,
    selection: dict[str, object],
    continued: bool,
) -> None:
    async with target.store() as store:
        request = await page_read(store, family, selection, continued)
        prefix = target.options.get("table_prefix", "pai_threads")
        id_column, row_id = EDITED_ROW[family]
        sql = (
            f"UPDATE {prefix}_{family} SET doc = replace(doc, :old, :new) "
            f"WHERE {id_column} = :id AND instr(doc, :old) > 0"
        )
        assert await _run(target, sql, {"old": old, "new": new, "id": row_id}) == 1
        # The id column (the backend's check) or a filter column (the plan's).
        with pytest.raises(ThreadStoreInvariantError, match="column"):
            await store.read_thread(request)


async def test_an_id_column_that_is_not_utf8_is_invalid_stored_data(target: Target) -> None:
    async with target.store() as store:
        changes = {"messages": [b.insert(b.message("m1", "hi")), b.insert(b.message("m2"))]}
        await store.commit_thread(b.create("s", "t", changes))
        prefix = target.options.get("table_prefix", "pai_threads")
        sql = f"UPDATE {prefix}_messages SET message_id = :bad WHERE message_id = :id"
        assert await _run(target, sql, {"bad": b"\xff", "id": b"m2"}) == 1
        page = {"type": "page", "view": "raw", "order": "oldest", "page": {"limit": 10}}
        with pytest.raises(ThreadStoreInvariantError, match="id column"):
            await store.read_thread(b.read("s", "t", messages=page))
        # A read by ids does not find the damaged row under its own id (nor fail).
        ids = {"type": "ids", "messageIds": ["m1", "m2"]}
        read = await store.read_thread(b.read("s", "t", messages=ids))
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["m1"]


@pytest.mark.parametrize("long_ids", [False, True], ids=["short ids", "ids past thread_ord"])
@pytest.mark.parametrize("include_hidden", [False, True])
async def test_a_list_batch_of_invalid_roots_only_continues_after_it(
    target: Target, include_hidden: bool, long_ids: bool
) -> None:
    # Long ids share more than the leading bytes MariaDB orders by, so batches
    # read their ties.
    prefix = target.options.get("table_prefix", "pai_threads")
    sql = f"UPDATE {prefix} SET doc = replace(doc, :old, :new) WHERE thread_id = :id"

    async def corrupt(thread_id: str) -> None:
        edit = {"old": '"agent"', "new": '"agnt"', "id": thread_id.encode()}
        assert await _run(target, sql, edit) == 1

    warnings: list[StoreWarning] = []
    async with target.store(on_warning=warnings.append) as store:
        await check_first_list_batch_invalid(
            store,
            warnings,
            corrupt,
            include_hidden=include_hidden,
            stem="\u00e9" * 600 if long_ids else "",  # 1,200 bytes
        )
