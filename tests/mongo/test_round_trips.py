"""Round trips per commit and read, counted by PyMongo's command monitoring.

An append inside its transaction is three commands: the hold that stamps the
final root, the insert, and ``commitTransaction``. These tests pin that (and
the read's commands) so it cannot regress, check that the relationship facts
kept on the root always equal the ones the children give, and that the thread
store shares the client of the other stores of one ``connect()`` call.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo import backend as mongo_backend
from pai_storage_mongo.documents import root_facts
from pai_storage_mongo.harness import drop_store_collections
from pai_storage_mongo.kv import MongoKeyValueStore
from pai_storage_mongo.store import MongoThreadStore
from pymongo import AsyncMongoClient, monitoring

from pai_storage import CommittedResult, ConflictResult, ManualClock, ThreadVersion
from pai_storage import builders as b
from pai_storage.backend import MessageRef, make_url
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.root_facts import relevant_messages

pytestmark = pytest.mark.asyncio

DB = "pai_test"
_IGNORED = {"hello", "isMaster", "ismaster", "ping", "endSessions", "buildInfo"}


class Commands(monitoring.CommandListener):
    """The name of every command the client sends (handshakes and heartbeats aside)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in _IGNORED:
            self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return names


@pytest_asyncio.fixture
async def counted(mongo_url: str) -> AsyncIterator[tuple[AsyncMongoClient[Any], Commands]]:
    commands = Commands()
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url, event_listeners=[commands])
    try:
        yield client, commands
    finally:
        await client.close()


def _store(client: AsyncMongoClient[Any], clock: ManualClock | None = None) -> MongoThreadStore:
    return MongoThreadStore(
        client=client, db_name=DB, collection_name=f"pai_test_{uuid.uuid4().hex}", clock=clock
    )


class Thread:
    """Commits to one thread, keeping its version."""

    def __init__(self, store: MongoThreadStore, thread_id: str = "t") -> None:
        self.store = store
        self.thread_id = thread_id
        self.version: ThreadVersion | None = None

    async def commit(self, changes: dict[str, Any] | None = None, **root: Any) -> CommittedResult:
        if self.version is None:
            request = b.create("s", self.thread_id, changes, **root)
        else:
            request = b.update_at("s", self.thread_id, self.version, changes, root=b.root(**root))
        result = await self.store.commit_thread(request)
        assert isinstance(result, CommittedResult), result
        assert result.thread is not None
        self.version = result.thread.version
        return result

    async def open_turn(self, n: int) -> None:
        await self.commit(
            {
                "messages": [{"type": "insert", "record": b.message(f"u{n}", run_id=f"r{n}")}],
                "runs": [{"type": "insert", "record": b.run(f"r{n}", inputs=[f"u{n}"])}],
                "lease": b.acquire(f"r{n}", "w"),
            }
        )

    async def output(self, n: int, i: int, **change: Any) -> CommittedResult:
        record = b.message(f"o{n}.{i}", role="assistant", run_id=f"r{n}", relation="output")
        return await self.commit({"messages": [{"type": "insert", "record": record}], **change})


async def test_an_append_is_three_commands(counted: tuple[AsyncMongoClient[Any], Commands]) -> None:
    client, commands = counted
    store = _store(client)
    try:
        thread = Thread(store)
        await thread.commit()
        commands.take()
        # Opening a turn: the hold, the message, the run, commit (no relationship query).
        await thread.open_turn(1)
        assert commands.take() == ["findAndModify", "insert", "insert", "commitTransaction"]
        await thread.output(1, 1)
        assert commands.take() == ["findAndModify", "insert", "commitTransaction"]
        # A lease renewal, a root change and several messages cost nothing more.
        two = [
            {"type": "insert", "record": b.message(f"o1.{i}", run_id="r1", relation="output")}
            for i in (2, 3)
        ]
        await thread.commit({"messages": two, "lease": b.renew("r1", "w")}, title="new title")
        assert commands.take() == ["findAndModify", "insert", "commitTransaction"]
        # The rules are checked from the facts on the root: a standalone message while
        # the run is open breaks rule 5, and nothing is applied.
        standalone = {"messages": [{"type": "insert", "record": b.message("x1")}]}
        with pytest.raises(ThreadStoreInvariantError, match="rule 5"):
            await thread.commit(standalone)
        assert commands.take() == ["findAndModify", "insert", "abortTransaction"]
        # Closing the turn: the hold, the run's previous record, its replacement, commit.
        await thread.commit(
            {
                "runs": [{"type": "replace", "record": b.run("r1", "completed", inputs=["u1"])}],
                "lease": b.release("r1", "w"),
            }
        )
        assert commands.take() == ["findAndModify", "find", "update", "commitTransaction"]
        await thread.commit(standalone)
        assert commands.take() == ["findAndModify", "insert", "commitTransaction"]
        read = await store.read_thread(
            b.read(
                "s",
                "t",
                messages={"type": "page", "view": "raw", "order": "newest", "page": {"limit": 20}},
            )
        )
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["x1", "o1.3", "o1.2", "o1.1", "u1"]
        cached = store._roots.get(("s", "t"))
        assert cached is not None
        assert read.thread == cached.root
        # A message of a completed run after a standalone one breaks the run's interval.
        with pytest.raises(ThreadStoreInvariantError, match="rule 2"):
            await thread.output(1, 4)
        assert (await store.read_thread(b.read("s", "t"))).thread == read.thread
    finally:
        await drop_store_collections(store)
        await store.close()


async def test_an_append_after_a_read_is_three_commands(
    counted: tuple[AsyncMongoClient[Any], Commands],
) -> None:
    client, commands = counted
    writer = _store(client)
    reader = MongoThreadStore(
        client=client, db_name=DB, collection_name=writer.collection_name
    )  # another process, say: it knows the thread only by reading it
    try:
        thread = Thread(writer)
        await thread.commit()
        await thread.open_turn(1)
        read = await reader.read_thread(b.read("s", "t"))
        assert read.thread is not None
        commands.take()
        other = Thread(reader)
        other.version = read.thread.version
        await other.output(1, 1)
        assert commands.take() == ["findAndModify", "insert", "commitTransaction"]
        # The writer's knowledge is stale now: its next commit is a conflict, found by
        # the usual hold (the stamping hold matched nothing and wrote nothing).
        stale = await writer.commit_thread(
            b.update_at(
                "s",
                "t",
                thread.version,
                {"messages": [{"type": "insert", "record": b.message("late")}]},
                root=b.root(),
            )
        )
        assert isinstance(stale, ConflictResult)
        assert stale.current_version == other.version
    finally:
        await drop_store_collections(writer)
        await writer.close()
        await reader.close()


async def test_a_lease_conflict_stamped_ahead_applies_nothing(
    counted: tuple[AsyncMongoClient[Any], Commands], clock: ManualClock
) -> None:
    client, _ = counted
    store = _store(client, clock)
    try:
        thread = Thread(store)
        await thread.commit()
        await thread.open_turn(1)
        before = await store.read_thread(b.read("s", "t"))
        clock.advance(
            timedelta(seconds=60)
        )  # the lease (30 s) has expired: a renewal is a conflict
        result = await store.commit_thread(
            b.update_at(
                "s",
                "t",
                thread.version,
                {
                    "messages": [{"type": "insert", "record": b.message("o", run_id="r1")}],
                    "lease": b.renew("r1", "w"),
                },
                root=b.root(),
            )
        )
        assert isinstance(result, ConflictResult)
        after = await store.read_thread(
            b.read("s", "t", messages={"type": "ids", "messageIds": ["o"]})
        )
        assert after.thread == before.thread
        assert after.messages is not None
        assert after.messages.items == []
        # Acquired again at the test clock's time, stamped ahead.
        thread.version = after.thread.version if after.thread else None
        done = await thread.output(1, 1, lease=b.acquire("r1", "w2", 5_000))
        assert done.thread is not None
        assert done.thread.lease is not None
        assert done.thread.lease.acquired_at == done.committed_at
        assert (done.thread.lease.expires_at - done.committed_at).total_seconds() == 5
        assert (await store.read_thread(b.read("s", "t"))).thread == done.thread
    finally:
        await drop_store_collections(store)
        await store.close()


async def test_a_read_of_the_root_and_a_first_page_is_one_aggregate(
    counted: tuple[AsyncMongoClient[Any], Commands],
) -> None:
    client, commands = counted
    store = _store(client)
    try:
        thread = Thread(store)
        await thread.commit()
        await thread.open_turn(1)
        commands.take()
        await store.read_thread(
            b.read(
                "s",
                "t",
                messages={"type": "page", "view": "raw", "order": "newest", "page": {"limit": 20}},
            )
        )
        assert commands.take() == ["aggregate"]
    finally:
        await drop_store_collections(store)
        await store.close()


async def _facts_from_children(store: MongoThreadStore) -> dict[str, Any]:
    """The relationship facts recomputed from every stored child (the slow way)."""
    db = store.database
    names = store.collection_names()
    messages = await db[names["messages"]].find({}, sort=[("_order", 1)]).to_list()
    runs = await db[names["runs"]].find({"status": {"$in": ["running", "waiting"]}}).to_list()
    refs = [
        MessageRef(
            m["messageId"],
            m["_order"],
            m["association"].get("runId"),
            m["association"].get("relation"),
        )
        for m in messages
    ]
    open_runs = []
    for run in sorted(runs, key=lambda r: r["_order"]):
        owned = [i for i, r in enumerate(refs) if r.run_id == run["runId"]]
        open_runs.append(
            {
                "runId": run["runId"],
                "status": run["status"],
                "admitted": run["admission"]["admitted"],
                "queueItemId": run["admission"].get("queueItemId"),
                "inputMessageIds": run["inputMessageIds"],
                "messages": relevant_messages([refs[i] for i in owned]),
                "foreign": bool(owned) and owned[-1] - owned[0] + 1 != len(owned),
            }
        )
    return {"tail": refs[-1] if refs else None, "open": open_runs}


async def _assert_facts(store: MongoThreadStore) -> None:
    root = await store.database[store.collection_name].find_one({})
    assert root is not None
    facts = root_facts(root)
    assert facts is not None
    expected = await _facts_from_children(store)
    assert facts.tail == expected["tail"]
    assert [
        {
            "runId": o.run.run_id,
            "status": o.run.status,
            "admitted": o.run.admitted,
            "queueItemId": o.run.queue_item_id,
            "inputMessageIds": list(o.run.input_message_ids),
            "messages": list(o.messages),
            "foreign": o.foreign,
        }
        for o in facts.open
    ] == expected["open"]


async def test_the_facts_on_the_root_match_the_children(mongo_store: MongoThreadStore) -> None:
    thread = Thread(mongo_store)
    await thread.commit()
    await _assert_facts(mongo_store)
    for n in (1, 2):
        await thread.open_turn(n)
        await _assert_facts(mongo_store)
        for i in range(3):
            await thread.output(n, i, lease=b.renew(f"r{n}", "w"))
            await _assert_facts(mongo_store)
        await thread.commit({"messages": [{"type": "delete", "id": f"o{n}.0"}]})
        await _assert_facts(mongo_store)
        replaced = b.message(f"o{n}.1", "edited", run_id=f"r{n}", relation="output")
        await thread.commit({"messages": [{"type": "replace", "record": replaced}]})
        await _assert_facts(mongo_store)
        await thread.commit(
            {
                "runs": [
                    {"type": "replace", "record": b.run(f"r{n}", "waiting", inputs=[f"u{n}"])}
                ],
            }
        )
        await _assert_facts(mongo_store)
        await thread.commit(
            {
                "runs": [
                    {"type": "replace", "record": b.run(f"r{n}", "completed", inputs=[f"u{n}"])}
                ],
                "lease": b.release(f"r{n}", "w"),
            }
        )
        await _assert_facts(mongo_store)
        await thread.commit({"messages": [{"type": "insert", "record": b.message(f"s{n}")}]})
        await _assert_facts(mongo_store)


async def test_a_root_without_facts_is_read_and_given_them_by_its_next_commit(
    mongo_store: MongoThreadStore,
) -> None:
    thread = Thread(mongo_store)
    await thread.commit()
    await thread.open_turn(1)
    threads = mongo_store.database[mongo_store.collection_name]
    await threads.update_one({}, {"$unset": {"_facts": ""}})
    mongo_store._roots.clear()
    read = await mongo_store.read_thread(b.read("s", "t"))
    assert read.thread is not None
    assert read.thread.version == thread.version
    listed = await mongo_store.list_threads({"scopeKey": "s", "limit": 5})
    assert [t.thread_id for t in listed.items] == ["t"]
    await thread.output(1, 1)
    root = await threads.find_one({})
    assert root is not None
    assert root["_schemaVersion"] == 1
    assert "_facts" in root
    await _assert_facts(mongo_store)
    # A root of development builds (version 2, the same layout) reads the same.
    await threads.update_one({}, {"$set": {"_schemaVersion": 2}})
    mongo_store._roots.clear()
    await thread.output(1, 2)
    # Malformed facts, or a version that is not the integer 1 or 2, are invalid.
    for corruption in (
        {"$set": {"_facts": "nope"}},
        {"$set": {"_facts.tail": "nope"}},
        {"$set": {"_schemaVersion": 3}},
        {"$set": {"_schemaVersion": True}},
        {"$set": {"_schemaVersion": 1.0}},
    ):
        mongo_store._roots.clear()
        stored = await threads.find_one({})
        await threads.update_one({}, corruption)
        with pytest.raises(ThreadStoreInvariantError, match="invalid stored thread"):
            await thread.output(1, 3)
        await threads.replace_one({}, stored)  # type: ignore[arg-type]


async def test_connect_opens_the_thread_store_on_the_shared_client(
    counted: tuple[AsyncMongoClient[Any], Commands], mongo_url: str
) -> None:
    client, _ = counted
    prefix = f"pai_test_{uuid.uuid4().hex}_"
    opened = mongo_backend.open_components(
        make_url("mongodb://"),
        ["threads", "kv"],
        client=client,
        db_name=DB,
        collection_prefix=prefix,
    )
    threads, kv = opened["threads"], opened["kv"]
    assert isinstance(threads, MongoThreadStore)
    assert isinstance(kv, MongoKeyValueStore)
    assert threads._holder is kv._holder
    assert threads.collection_name == prefix + "threads"
    try:
        await Thread(threads).commit()
        await kv.put(("n",), "k", 1)
        assert threads._client is client
        await threads.close()
        assert (await kv.get(("n",), "k")).value == 1  # type: ignore[union-attr]
    finally:
        await kv.close()
    assert (await client.admin.command("ping"))["ok"] == 1  # never closed by pai-storage
    for name in await client[DB].list_collection_names(filter={"name": {"$regex": f"^{prefix}"}}):
        await client[DB].drop_collection(name)

    # Without client=, the stores of one call share the client they made; the last closes it.
    opened = mongo_backend.open_components(
        make_url(mongo_url), ["threads", "kv"], db_name=DB, collection_prefix=prefix
    )
    threads, kv = opened["threads"], opened["kv"]
    assert isinstance(threads, MongoThreadStore)
    assert isinstance(kv, MongoKeyValueStore)
    await Thread(threads).commit()
    made = threads._client
    assert made is not None
    assert await kv._holder.client() is made
    await kv.close()
    assert await threads.read_thread(b.read("s", "t")) is not None
    await drop_store_collections(threads)
    await threads.close()
    assert threads._holder.closed
    await client[DB].drop_collection(prefix + "kv")


async def test_a_store_opened_alone_closes_its_client_but_never_a_given_one(
    counted: tuple[AsyncMongoClient[Any], Commands], mongo_url: str
) -> None:
    client, _ = counted
    given = _store(client)
    await given.initialize()
    await given.close()
    assert (await client.admin.command("ping"))["ok"] == 1
    alone = MongoThreadStore(mongo_url, db_name=DB, collection_name="pai_test_unused_alone")
    await alone.initialize()
    made = alone._client
    assert made is not None
    assert made is not client
    await alone.close()
    from pymongo.errors import InvalidOperation

    with pytest.raises(InvalidOperation):
        await made.admin.command("ping")


async def test_connect_with_an_application_client_serves_every_store_on_it(
    counted: tuple[AsyncMongoClient[Any], Commands],
) -> None:
    from pai_storage import connect

    client, commands = counted
    prefix = f"pai_test_{uuid.uuid4().hex}_"
    stores = connect("mongodb://", client=client, db_name=DB, collection_prefix=prefix)
    try:
        async with stores:
            threads = stores.threads
            assert isinstance(threads, MongoThreadStore)
            assert threads._client is client
            commands.take()
            await Thread(threads).commit()
            await stores.kv.put(("n",), "k", 1)
            # Both went through the application's client (its listener saw them).
            assert "commitTransaction" in commands.names
            assert "findAndModify" in commands.names
        assert (await client.admin.command("ping"))["ok"] == 1  # never closed by pai-storage
    finally:
        names = await client[DB].list_collection_names(filter={"name": {"$regex": f"^{prefix}"}})
        for name in names:
            await client[DB].drop_collection(name)


async def test_the_root_cache_shares_only_what_nobody_can_change(
    mongo_store: MongoThreadStore,
) -> None:
    # The cache a commit writes ahead from may share roots with callers: roots are
    # immutable, so no caller can change the cache or what is written next.
    thread = Thread(mongo_store)
    created = await thread.commit(metadata={"k": [1]}, privateMetadata={"p": {}})
    assert created.thread is not None
    with pytest.raises(TypeError):
        created.thread.metadata["k"].append("changed")
    cached = mongo_store._roots.get(("s", "t"))
    assert cached is not None
    assert cached.root.metadata == {"k": [1]}
    read = await mongo_store.read_thread(b.read("s", "t"))
    assert read.thread is not None
    with pytest.raises(TypeError):
        read.thread.metadata["k"].append("changed")
    with pytest.raises(TypeError):
        read.thread.private_metadata["p"]["new"] = 1
    cached = mongo_store._roots.get(("s", "t"))
    assert cached is not None
    assert cached.root.metadata == {"k": [1]}
    assert cached.root.private_metadata == {"p": {}}
    await thread.commit(
        {"messages": [b.insert(b.message("m1"))]}, metadata={"k": [1]}, privateMetadata={"p": {}}
    )
    again = await mongo_store.read_thread(b.read("s", "t"))
    assert again.thread is not None
    assert again.thread.metadata == {"k": [1]}
    assert again.thread.private_metadata == {"p": {}}
