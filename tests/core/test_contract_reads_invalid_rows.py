"""Invalid stored rows on the SQL backend (SQLite): lists skip, targeted reads refuse.

docs/reads.md#invalid-stored-roots: a list never fails because of one bad root
(it is skipped and reported to ``on_warning``, without its contents), and a
targeted read of invalid stored data raises ``ThreadStoreInvariantError``
instead of coercing it. The PostgreSQL and MongoDB backends have the same tests
in their own directories; these edit a SQLite file's rows directly.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pai_storage import StoreWarning, open_store
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

pytest.importorskip("sqlalchemy")

pytestmark = pytest.mark.asyncio

SECRET = "personal-4242"


def _edit(path: Path, table: str, old: str, new: str, marker: str) -> None:
    """Replace ``old`` by ``new`` in the JSON text of the one row whose doc holds ``marker``."""
    with sqlite3.connect(path) as conn:
        changed = conn.execute(
            f"UPDATE {table} SET doc = replace(doc, ?, ?) WHERE instr(doc, ?) > 0",
            (old, new, marker),
        ).rowcount
    assert changed == 1


async def test_invalid_root_is_skipped_by_lists_and_refused_by_reads(tmp_path: Path) -> None:
    path = tmp_path / "pai.db"
    warnings: list[StoreWarning] = []
    async with open_store(f"sqlite:///{path}", on_warning=warnings.append) as store:
        for thread in ("a", "b", "c"):
            await store.commit_thread(b.create("s", thread, metadata={"secret": SECRET}))
        _edit(path, "pai_threads", '"agent"', '"agnt"', '"threadId":"b"')

        page = await store.list_threads({"scopeKey": "s", "limit": 2})
        assert sorted(t.thread_id for t in page.items) == ["a", "c"]
        assert page.next_page_token is None
        assert [(w.kind, w.scope_key, w.thread_id) for w in warnings] == [
            ("invalid_thread_skipped", "s", "b")
        ]
        assert SECRET not in warnings[0].reason
        assert SECRET not in repr(warnings[0])

        # A walk of one thread per page skips it too, and still ends.
        seen: list[str] = []
        token: str | None = None
        while True:
            request: dict[str, Any] = {"scopeKey": "s", "limit": 1}
            if token is not None:
                request["pageToken"] = token
            page = await store.list_threads(request)
            seen.extend(t.thread_id for t in page.items)
            token = page.next_page_token
            if token is None:
                break
        assert sorted(seen) == ["a", "c"]

        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.read_thread(b.read("s", "b"))
        assert SECRET not in str(caught.value)


async def test_a_failing_warning_callback_does_not_fail_the_list(tmp_path: Path) -> None:
    path = tmp_path / "pai.db"
    calls: list[StoreWarning] = []

    def explode(warning: StoreWarning) -> None:
        calls.append(warning)
        raise RuntimeError("callback failed")

    async def explode_later(warning: StoreWarning) -> None:
        calls.append(warning)
        raise RuntimeError("coroutine failed")

    for callback in (explode, explode_later):
        calls.clear()
        async with open_store(f"sqlite:///{path}", on_warning=callback) as store:
            scope = callback.__name__
            for thread in ("a", "b"):
                await store.commit_thread(b.create(scope, thread))
            _edit(path, "pai_threads", '"agent"', '"agnt"', f'"scopeKey":"{scope}","threadId":"a"')
            page = await store.list_threads({"scopeKey": scope, "limit": 5})
            assert [t.thread_id for t in page.items] == ["b"]
            assert [w.thread_id for w in calls] == ["a"]


CORRUPTIONS = {
    "unknown field": ('"status":"complete"', '"status":"complete","extra":1'),
    "empty message id": ('"messageId":"m2"', '"messageId":""'),
    "timestamp without zone": ('Z"}', '"}'),
    "number too large": ('"n":1', '"n":9223372036854775808'),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
async def test_a_page_or_id_read_of_an_invalid_message_is_refused(
    tmp_path: Path, corruption: tuple[str, str]
) -> None:
    path = tmp_path / "pai.db"
    async with open_store(f"sqlite:///{path}") as store:
        messages = [
            b.insert(b.message(f"m{i}", "hello", metadata={"n": 1, "secret": SECRET}))
            for i in range(1, 4)
        ]
        await store.commit_thread(b.create("s", "t", {"messages": messages}))
        old, new = corruption
        _edit(path, "pai_threads_messages", old, new, '"messageId":"m2"')
        for selection in (
            {"type": "page", "view": "raw", "page": {"limit": 10}},
            {"type": "page", "view": "raw", "order": "newest", "page": {"limit": 10}},
            {"type": "ids", "messageIds": ["m2"]},
        ):
            with pytest.raises(ThreadStoreInvariantError) as caught:
                await store.read_thread(b.read("s", "t", messages=selection))
            assert SECRET not in str(caught.value)
        # The rows beside it still read.
        others = await store.read_thread(
            b.read("s", "t", messages={"type": "ids", "messageIds": ["m3", "m1"]})
        )
        assert others.messages is not None
        assert [m.message_id for m in others.messages.items] == ["m3", "m1"]


# (table, SQL assignment, the read's include, word in the error): a filter column
# that disagrees with the row's record puts the row in a page it does not belong to.
MISMATCHES = {
    "transcript column": (
        "pai_threads_messages",
        "transcript = 1",
        {"messages": {"type": "page", "view": "transcript", "page": {"limit": 10}}},
        "message 'm2'",
    ),
    "context column": (
        "pai_threads_messages",
        "context = 1",
        {"messages": {"type": "page", "view": "context", "order": "newest", "page": {"limit": 1}}},
        "message 'm2'",
    ),
    "status column": (
        "pai_threads_runs",
        "status = 'failed'",
        {"runs": {"type": "page", "statuses": ["failed"], "page": {"limit": 10}}},
        "run 'r1'",
    ),
}


@pytest.mark.parametrize("mismatch", MISMATCHES.values(), ids=MISMATCHES.keys())
async def test_a_row_whose_filter_column_disagrees_with_its_record_is_refused(
    tmp_path: Path, mismatch: tuple[str, str, dict[str, Any], str]
) -> None:
    path = tmp_path / "pai.db"
    table, assignment, include, words = mismatch
    async with open_store(f"sqlite:///{path}") as store:
        hidden = b.message("m2", transcript=False, context=False)
        await store.commit_thread(
            b.create(
                "s",
                "t",
                {
                    "messages": [b.insert(b.message("m1")), b.insert(hidden)],
                    "runs": [b.insert(b.run("r1", "completed", operation=None))],
                },
            )
        )
        with sqlite3.connect(path) as conn:
            conn.execute(f"UPDATE {table} SET {assignment}")
        with pytest.raises(ThreadStoreInvariantError, match=words):
            await store.read_thread({"scopeKey": "s", "threadId": "t", "include": include})
        # The same rows by id are what they say they are.
        by_id = await store.read_thread(
            b.read("s", "t", messages={"type": "ids", "messageIds": ["m2"]})
        )
        assert by_id.messages is not None
        assert by_id.messages.items[0].visibility.transcript is False
