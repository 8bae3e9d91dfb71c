"""A SQLite read of the root and one page (one ``UNION ALL`` statement) finds the
page's rows with one bounded scan of the page's index and one lookup by rowid
per row: the rows of the page are never searched for again by position.

The statement the store sends is recorded (the engine's listeners see it) and
explained on the same file with ``sqlite3``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from sqlalchemy import event

from pai_storage import CommittedResult
from pai_storage import builders as b

from .conftest import Target

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("family", "selection", "table", "index"),
    [
        (
            "messages",
            {"type": "page", "view": "transcript", "order": "newest", "page": {"limit": 3}},
            "pai_threads_messages",
            "pai_threads_messages_transcript",
        ),
        (
            "messages",
            {"type": "page", "view": "raw", "order": "oldest", "page": {"limit": 3}},
            "pai_threads_messages",
            "sqlite_autoindex_pai_threads_messages_1",
        ),
        (
            "runs",
            {"type": "page", "order": "newest", "page": {"limit": 2}},
            "pai_threads_runs",
            "sqlite_autoindex_pai_threads_runs_1",
        ),
    ],
)
async def test_a_pages_rows_are_read_by_rowid(
    sqlite_target: Target, family: str, selection: dict[str, Any], table: str, index: str
) -> None:
    async with sqlite_target.store() as store:
        messages = [b.insert(b.message(f"m{i}", "hello", transcript=i % 2 == 0)) for i in range(10)]
        changes = {
            "messages": messages,
            "runs": [b.insert(b.run(f"r{i}", "completed")) for i in range(4)],
        }
        created = await store.commit_thread(b.create("s", "t", changes))
        assert isinstance(created, CommittedResult), created
        seen: list[tuple[str, Any]] = []

        def before(*args: Any) -> None:
            seen.append((args[2], args[3]))

        reader = (await store.client.ready()).reader.sync_engine
        event.listen(reader, "before_cursor_execute", before)
        try:
            result = await store.read_thread(b.read("s", "t", **{family: selection}))
        finally:
            event.remove(reader, "before_cursor_execute", before)
        page = getattr(result, family)
        assert page is not None
        assert len(page.items) == selection["page"]["limit"]
        assert page.next_page_token is not None
        (sql, params), *_ = [s for s in seen if " UNION ALL " in " ".join(s[0].split())]
        with sqlite3.connect(sqlite_target.url.removeprefix("sqlite:///")) as conn:
            plan = [str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        searches = [d for d in plan if d.startswith("SEARCH") and "pai_threads " not in d]
        assert len(searches) == 2, plan
        scan, lookup = sorted(searches, key=lambda d: "rowid" in d)
        assert f"USING COVERING INDEX {index} " in scan, plan
        assert lookup == f"SEARCH {table} USING INTEGER PRIMARY KEY (rowid=?)", plan
