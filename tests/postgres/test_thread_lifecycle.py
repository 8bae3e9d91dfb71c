"""The PostgreSQL lifecycle primitives beyond the conformance suite.

- A fork is copied inside the database: neither the whole-thread load nor the
  restore runs, and the copy holds exactly what the core's in-memory fork of
  the loaded source holds.
- The updated-at walk orders threads committed in the same millisecond by
  scope key, then thread id, in code-point order, across batches.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresThreadStore

from pai_storage import CommittedResult
from pai_storage import builders as b
from pai_storage.backend import (
    AggregateSnapshot,
    ForkRequest,
    ThreadAggregate,
    ThreadIndexEntry,
    fork_aggregate,
    new_instance_id,
)

from .helpers import URL

pytestmark = pytest.mark.asyncio

FIXED = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


@pytest_asyncio.fixture
async def store(pg_schema: str) -> AsyncIterator[PostgresThreadStore]:
    async with PostgresThreadStore(URL, schema=pg_schema) as opened:
        yield opened


def _family(aggregate: ThreadAggregate, name: str) -> tuple[int, list[tuple[int, Any]]]:
    family = getattr(aggregate, name)
    return family.next_position, [(e.position, e.record.to_json()) for e in family]


async def test_fork_is_copied_inside_the_database(
    store: PostgresThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [b.insert(b.message(f"m{i:03}", f"text {i}")) for i in range(300)]
    created = await store.commit_thread(b.create("scope", "source", {"messages": messages}))
    assert isinstance(created, CommittedResult)
    source = await store._load_thread("scope", "source")
    assert source is not None
    request = ForkRequest("scope", "source", "fork", "m149", new_instance_id())
    plan = await request.plan_in(store, AggregateSnapshot(source, FIXED))
    expected = fork_aggregate(source, plan, FIXED)

    async def refuse(*args: object) -> None:
        raise AssertionError("a fork must not pass the thread through Python")

    monkeypatch.setattr(store, "_load_thread", refuse)
    monkeypatch.setattr(store, "_restore_thread", refuse)
    result = await store.fork_thread("scope", "source", "fork", through_message_id="m149")
    monkeypatch.undo()
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    assert result.thread.parent_thread_id == "source"
    fork = await store._load_thread("scope", "fork")
    assert fork is not None
    assert fork.root == result.thread
    for name in ("messages", "runs", "queued_items"):
        assert _family(fork, name) == _family(expected, name), name
    assert len(fork.messages) == 150
    # The source is untouched.
    after = await store._load_thread("scope", "source")
    assert after is not None
    assert _family(after, "messages") == _family(source, "messages")


async def test_thread_heads_break_ties_by_scope_then_thread_in_code_point_order(
    pg_schema: str,
) -> None:
    scopes = ["s", "s\u00e9", "s\U0001f600", "S"]
    threads = ["a", "Z", "\u00e9", "\U0001f600", "a\x00b", "ab"]
    async with PostgresThreadStore(URL, schema=pg_schema, clock=lambda: FIXED) as store:
        for scope, thread in itertools.product(scopes, threads):
            assert isinstance(await store.commit_thread(b.create(scope, thread)), CommittedResult)
        everything = sorted(itertools.product(scopes, threads))

        async def walk(scope: str | None, batch: int) -> list[tuple[str, str]]:
            seen: list[ThreadIndexEntry] = []
            while True:
                heads = await store._thread_heads(
                    scope, updated_before=None, after=seen[-1] if seen else None, limit=batch
                )
                assert len(heads) <= batch
                seen += heads
                if len(heads) < batch:
                    return [(h.scope_key, h.thread_id) for h in seen]

        for batch in (1, 5, 100):
            assert await walk(None, batch) == everything
            assert await walk("s\u00e9", batch) == [p for p in everything if p[0] == "s\u00e9"]
        heads = await store._thread_heads(None, updated_before=None, after=None, limit=1)
        assert heads[0].updated_at == FIXED
        assert await store._thread_heads(None, updated_before=FIXED, after=None, limit=10) == []
