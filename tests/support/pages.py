"""Pages whose rows disagree with the columns they were chosen by.

A normalized backend chooses a page's rows by columns it derives from each
record (the id, the view, the status, the run). The PostgreSQL and SQL tests
edit one row's JSON text behind the store's back and check that the page
refuses it; this module holds what they share: the edits and the thread and
page they are read through.
"""

from __future__ import annotations

from typing import Any

from pai_storage import builders as b
from pai_storage.store import ThreadStore

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
"""``(family, old text, new text, page selection)``: each edits the second row of
its family (m2 or r2; see :data:`EDITED_ROW`)."""

EDITED_ROW = {"messages": ("message_id", b"m2"), "runs": ("run_id", b"r2")}
"""The id column and the id (as stored) of the row each family's edit changes."""


async def page_read(
    store: ThreadStore, family: str, selection: dict[str, Any], continued: bool
) -> dict[str, Any]:
    """Create thread ``s``/``t`` with two messages and two runs; the read request of
    one page of ``family`` under ``selection`` holding both rows: a first page or,
    when ``continued``, the continuation after a page of one (a first page is
    read with the root in one statement, a continuation on its own)."""
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
    page: dict[str, Any] = {"limit": 10}
    if continued:
        one = {family: {**query, "page": {"limit": 1}}}
        first = getattr(await store.read_thread(b.read("s", "t", **one)), family)
        assert first is not None
        assert first.next_page_token is not None
        page["pageToken"] = first.next_page_token
    return b.read("s", "t", **{family: {**query, "page": page}})
