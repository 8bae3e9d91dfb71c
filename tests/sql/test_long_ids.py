"""Ids longer than the ordered index columns keep (1,024 bytes on MariaDB).

Threads whose ids share their first 1,024 bytes and were updated in the same
millisecond tie on ``thread_ord``; list pages and the updated-at sweep still
return them in exact code-point order, each once, across page boundaries.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pai_storage_sql import SqlThreadStore

from pai_storage import CommittedResult, ManualClock
from pai_storage import builders as b

from .conftest import Target

pytestmark = pytest.mark.asyncio

PREFIX = "\U0001f9f5" * 300  # 1,200 bytes of UTF-8: more than thread_ord keeps on MariaDB
IDS = [PREFIX + tail for tail in ("b", "a", "c", "\u00e9", "A", "a ", "ab", "\U0001f600", "0")]


async def test_long_ids_tied_on_their_prefix_list_and_sweep_in_order(target: Target) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    async with SqlThreadStore(target.url, clock=clock, **target.options) as store:
        for thread_id in IDS:
            created = await store.commit_thread(b.create("long", thread_id))
            assert isinstance(created, CommittedResult)
        expected = sorted(IDS)
        for limit in (1, 2, 4, 20):
            seen: list[str] = []
            token = None
            while True:
                query = {"scopeKey": "long", "limit": limit}
                if token is not None:
                    query["pageToken"] = token
                page = await store.list_threads(query)
                seen += [t.thread_id for t in page.items]
                token = page.next_page_token
                if token is None:
                    break
            assert seen == expected, limit
        for scope in ("long", None):
            heads = await store._thread_heads(scope, updated_before=None, after=None, limit=3)
            walked = list(heads)
            while heads:
                heads = await store._thread_heads(
                    scope, updated_before=None, after=walked[-1], limit=3
                )
                walked += heads
            assert [h.thread_id for h in walked] == expected
