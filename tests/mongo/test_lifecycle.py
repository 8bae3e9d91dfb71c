"""The lifecycle primitives on MongoDB: the updated-at index, the fork's batched copy, the facts.

The conformance suite's lifecycle topic checks what the primitives do; these
tests check how MongoDB serves them: every ``_thread_heads`` query is a bounded
index range with no blocking sort, a fork streams the kept transcript through
the client in ``insert_many`` batches of at most 1,000 documents (no
``$out``/``$merge``, which a transaction refuses) without changing the source,
and restored and forked roots carry the facts a commit would store.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo.store import COPY_BATCH, MongoThreadStore
from pymongo import AsyncMongoClient, monitoring

from pai_storage import CommittedResult, ManualClock, ThreadVersion
from pai_storage import builders as b
from pai_storage.backend import ThreadIndexEntry

from .helpers import raw_collections

pytestmark = pytest.mark.asyncio


class Sent(monitoring.CommandListener):
    """Every command the client sends, as (name, command document)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands.append((event.command_name, event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest_asyncio.fixture
async def monitored(
    mongo_url: str, clock: ManualClock
) -> AsyncIterator[tuple[MongoThreadStore, Sent]]:
    sent = Sent()
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url, event_listeners=[sent])
    db_name = f"pai_test_lifecycle_{uuid.uuid4().hex[:12]}"
    store = MongoThreadStore(client=client, db_name=db_name, clock=clock)
    try:
        await store.initialize()
        yield store, sent
    finally:
        await store.close()
        await client.drop_database(db_name)
        await client.close()


async def _commit(store: MongoThreadStore, request: dict[str, Any]) -> ThreadVersion:
    result = await store.commit_thread(request)
    assert isinstance(result, CommittedResult), result
    assert result.thread is not None
    return result.thread.version


def _stages(plan: Any) -> list[str]:
    found: list[str] = []
    if isinstance(plan, dict):
        if "stage" in plan:
            found.append(plan["stage"])
        for key in ("inputStage", "queryPlan", "winningPlan"):
            if key in plan:
                found += _stages(plan[key])
        for child in plan.get("inputStages", []):
            found += _stages(child)
    return found


async def test_thread_heads_are_index_ranges_without_a_sort(
    monitored: tuple[MongoThreadStore, Sent], clock: ManualClock
) -> None:
    store, _ = monitored
    for i in range(24):
        if i % 3 == 0:
            clock.advance(ms=1)  # three threads share each millisecond
        await _commit(store, b.create(f"s{i % 2}", f"t{i:02d}"))
    every = await store._thread_heads(None, updated_before=None, after=None, limit=100)
    assert [h.sort_key() for h in every] == sorted(h.sort_key() for h in every)
    assert len(every) == 24
    middle: ThreadIndexEntry = every[10]
    scoped = next(h for h in every[10:] if h.scope_key == "s0")
    cutoff = every[20].updated_at
    threads = raw_collections(store)["threads"]
    for scope in (None, "s0"):
        for after in (None, middle if scope is None else scoped):
            for before in (None, cutoff):
                queries, sort, hint = store.heads_queries(scope, before, after)
                for query in queries:
                    explained = await threads.find(query, sort=sort, hint=hint).limit(3).explain()
                    stages = _stages(explained["queryPlanner"]["winningPlan"])
                    assert "IXSCAN" in stages, (query, stages)
                    assert "COLLSCAN" not in stages, (query, stages)
                    assert "SORT" not in stages, (query, stages)
                    assert explained["executionStats"]["totalDocsExamined"] <= 3, query
                # Paging three at a time returns exactly the index order.
                expected = [
                    h
                    for h in every
                    if (scope is None or h.scope_key == scope)
                    and (before is None or h.updated_at < before)
                    and (after is None or h.sort_key() > after.sort_key())
                ]
                got: list[ThreadIndexEntry] = []
                cursor = after
                while True:
                    batch = await store._thread_heads(
                        scope, updated_before=before, after=cursor, limit=3
                    )
                    got += batch
                    if len(batch) < 3:
                        break
                    cursor = batch[-1]
                assert got == expected


async def test_a_fork_streams_the_kept_transcript_in_batches(
    monitored: tuple[MongoThreadStore, Sent], clock: ManualClock
) -> None:
    store, sent = monitored
    total = 2 * COPY_BATCH + 345
    version = await _commit(store, b.create("scope", "source"))
    odd = {"$ref": "users", "$id": 1, "a.b": {"$k": 1.0}}
    for start in range(0, total, 500):
        clock.advance(ms=1)
        messages = [
            b.insert(b.message(f"m{i:05d}", metadata=odd if i % 7 == 0 else None))
            for i in range(start, min(start + 500, total))
        ]
        version = await _commit(
            store, b.update_at("scope", "source", version, {"messages": messages}, root=b.root())
        )
    raw = raw_collections(store)
    root_before = await raw["threads"].find_one({"threadId": "source"})
    sent.commands.clear()
    forked = await store.fork_thread("scope", "source", "fork")
    assert isinstance(forked, CommittedResult)
    names = store.collection_names()
    inserts = [
        len(command["documents"])
        for name, command in sent.commands
        if name == "insert" and command["insert"] == names["messages"]
    ]
    assert inserts == [COPY_BATCH, COPY_BATCH, 345]
    for _, command in sent.commands:
        for stage in command.get("pipeline") or ():
            assert "$out" not in stage
            assert "$merge" not in stage
    assert await raw["threads"].find_one({"threadId": "source"}) == root_before
    source = await store._load_thread("scope", "source")
    fork = await store._load_thread("scope", "fork")
    assert source is not None
    assert fork is not None
    assert fork.messages.entries == source.messages.entries
    assert fork.messages.next_position == source.messages.next_position
    assert fork.root.parent_thread_id == "source"


async def test_restored_and_forked_roots_carry_the_facts_a_commit_stores(
    monitored: tuple[MongoThreadStore, Sent], clock: ManualClock
) -> None:
    store, _ = monitored
    version = await _commit(
        store,
        b.create(
            "scope",
            "source",
            {
                "messages": [b.insert(b.message("q1", run_id="r1"))],
                "runs": [b.insert(b.run("r1", "completed", inputs=["q1"]))],
            },
        ),
    )
    clock.advance(ms=5)
    version = await _commit(
        store,
        b.update_at(
            "scope",
            "source",
            version,
            {
                "messages": [
                    b.insert(b.message("q2", run_id="r2")),
                    b.insert(b.message("a2", role="assistant", run_id="r2", relation="output")),
                ],
                "runs": [b.insert(b.run("r2", "running", inputs=["q2"]))],
            },
            root=b.root(),
        ),
    )
    threads = raw_collections(store)["threads"]
    stored = await threads.find_one({"threadId": "source"})
    assert stored is not None
    assert stored["_facts"]["open"]

    aggregate = await store._load_thread("scope", "source")
    assert aggregate is not None
    aggregate.root = aggregate.root.model_copy(update={"thread_id": "restored"})
    assert await store._restore_thread(aggregate) is None
    restored = await threads.find_one({"threadId": "restored"})
    assert restored is not None
    assert restored["_schemaVersion"] == 1
    assert restored["_facts"] == stored["_facts"]
    assert restored["_nextOrder"] == stored["_nextOrder"]
    assert await store._restore_thread(aggregate) == aggregate.root.version

    clock.advance(timedelta(seconds=1))
    forked = await store.fork_thread("scope", "source", "fork", through_message_id="q1")
    assert isinstance(forked, CommittedResult)
    fork = await threads.find_one({"threadId": "fork"})
    assert fork is not None
    assert fork["_schemaVersion"] == 1
    assert fork["_facts"]["open"] == []
    assert fork["_facts"]["tail"]["messageId"] == "q1"
    # The next commit of the fork judges from these facts and keeps the thread valid.
    fork_version = forked.thread.version if forked.thread else None
    clock.advance(ms=1)
    await _commit(
        store,
        b.update_at(
            "scope",
            "fork",
            fork_version,
            {
                "messages": [b.insert(b.message("q3", run_id="r3"))],
                "runs": [b.insert(b.run("r3", "running", inputs=["q3"]))],
            },
            root=b.root(),
        ),
    )
