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

from pai_storage import ThreadStoreInvariantError
from pai_storage import builders as b

from .conftest import Target, mysql_engine

pytestmark = pytest.mark.asyncio

# The second row of its family (m2 or r2) is edited.
MISMATCHES = {
    "message id": ("messages", '"messageId":"m2"', '"messageId":"zz"', {"view": "raw"}),
    "transcript view": (
        "messages",
        '"transcript":true',
        '"transcript":false',
        {"view": "transcript"},
    ),
    "run id": ("runs", '"runId":"r2"', '"runId":"r9"', {}),
    "run status filter": (
        "runs",
        '"status":"completed"',
        '"status":"failed"',
        {"statuses": ["completed"]},
    ),
}


async def _edit(target: Target, family: str, old: str, new: str) -> None:
    prefix = target.options.get("table_prefix", "pai_threads")
    id_column, row_id = ("message_id", b"m2") if family == "messages" else ("run_id", b"r2")
    sql = (
        f"UPDATE {prefix}_{family} SET doc = replace(doc, :old, :new) "
        f"WHERE {id_column} = :id AND instr(doc, :old) > 0"
    )
    params: dict[str, Any] = {"old": old, "new": new, "id": row_id}
    if target.dialect == "sqlite":
        path = target.url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            changed = conn.execute(sql, params).rowcount
    else:
        engine = mysql_engine()
        try:
            async with engine.begin() as conn:
                changed = (await conn.execute(text(sql), params)).rowcount
        finally:
            await engine.dispose()
    assert changed == 1


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
    # On SQLite a first page is read with the root in one statement, a
    # continuation on its own.
    async with target.store() as store:
        changes = {
            "messages": [
                b.insert(b.message("m1", "hi", run_id="r1")),
                b.insert(b.message("m2", "there")),
            ],
            "runs": [
                b.insert(b.run("r1", "completed", inputs=["m1"])),
                b.insert(b.run("r2", "completed")),
            ],
        }
        await store.commit_thread(b.create("s", "t", changes))
        query = {"type": "page", "order": "oldest", **selection}
        page: dict[str, object] = {"limit": 10}
        if continued:
            one = {family: {**query, "page": {"limit": 1}}}
            first = getattr(await store.read_thread(b.read("s", "t", **one)), family)
            assert first is not None
            assert first.next_page_token is not None
            page["pageToken"] = first.next_page_token
        await _edit(target, family, old, new)
        # The id column (the backend's check) or a filter column (the plan's).
        with pytest.raises(ThreadStoreInvariantError, match="column"):
            await store.read_thread(b.read("s", "t", **{family: {**query, "page": page}}))


async def test_an_id_column_that_is_not_utf8_is_invalid_stored_data(target: Target) -> None:
    async with target.store() as store:
        changes = {"messages": [b.insert(b.message("m1", "hi")), b.insert(b.message("m2"))]}
        await store.commit_thread(b.create("s", "t", changes))
        prefix = target.options.get("table_prefix", "pai_threads")
        sql = f"UPDATE {prefix}_messages SET message_id = :bad WHERE message_id = :id"
        params = {"bad": b"\xff", "id": b"m2"}
        if target.dialect == "sqlite":
            with sqlite3.connect(target.url.removeprefix("sqlite:///")) as conn:
                assert conn.execute(sql, params).rowcount == 1
        else:
            engine = mysql_engine()
            try:
                async with engine.begin() as conn:
                    assert (await conn.execute(text(sql), params)).rowcount == 1
            finally:
                await engine.dispose()
        page = {"type": "page", "view": "raw", "order": "oldest", "page": {"limit": 10}}
        with pytest.raises(ThreadStoreInvariantError, match="id column"):
            await store.read_thread(b.read("s", "t", messages=page))
        # A read by ids does not find the damaged row under its own id (nor fail).
        ids = {"type": "ids", "messageIds": ["m1", "m2"]}
        read = await store.read_thread(b.read("s", "t", messages=ids))
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["m1"]
