"""MongoDB key-value and agent-state stores: query plans, the shared client, the stored layout.

Every query form the two stores send is captured from the driver (a command
listener on the application's own client) and explained: none may scan the
collection, sort in memory or use a regex. The layout checks read the raw
documents and indexes an operator sees (``docs/mongodb.md``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from bson.int64 import Int64
from pai_storage_mongo import backend as mongo_backend
from pai_storage_mongo.client import MongoClientHolder
from pai_storage_mongo.kv import MongoKeyValueStore
from pai_storage_mongo.state import SET_APPEND_MAX, MongoAgentStateStore, encode_field
from pymongo import AsyncMongoClient, monitoring

from pai_storage import ConfigurationError, InvalidInputError, ManualClock, UnavailableError
from pai_storage.backend import make_url

pytestmark = pytest.mark.asyncio

DB = "pai_test"


class Recorder(monitoring.CommandListener):
    """Keeps every ``find`` / ``findAndModify`` / ``delete`` / ``update`` command sent."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("find", "findAndModify", "delete", "update"):
            self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest_asyncio.fixture
async def app_client(mongo_url: str) -> AsyncIterator[tuple[AsyncMongoClient[Any], Recorder]]:
    recorder = Recorder()
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        mongo_url, event_listeners=[recorder], tz_aware=True
    )
    try:
        yield client, recorder
    finally:
        await client.close()


@pytest.fixture
def prefix() -> str:
    return f"pai_test_{uuid.uuid4().hex}_"


@pytest_asyncio.fixture
async def stores(
    app_client: tuple[AsyncMongoClient[Any], Recorder], prefix: str, clock: ManualClock
) -> AsyncIterator[tuple[MongoKeyValueStore, MongoAgentStateStore]]:
    client, _ = app_client
    opened = mongo_backend.open_components(
        make_url("mongodb://"),
        ["kv", "state"],
        client=client,
        db_name=DB,
        collection_prefix=prefix,
        clock=clock,
    )
    kv, state = opened["kv"], opened["state"]
    assert isinstance(kv, MongoKeyValueStore)
    assert isinstance(state, MongoAgentStateStore)
    await kv.initialize()
    await state.initialize()
    try:
        yield kv, state
    finally:
        await kv.close()
        await state.close()
        for name in (prefix + "kv", prefix + "agent_sessions"):
            await client[DB].drop_collection(name)


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


def _has_regex(value: Any) -> bool:
    if isinstance(value, dict):
        return "$regex" in value or any(_has_regex(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_regex(v) for v in value)
    return hasattr(value, "pattern") and hasattr(value, "flags")


async def _explain_all(client: AsyncMongoClient[Any], commands: list[tuple[str, Any]]) -> int:
    """Explain each recorded read; fail on a collection scan, an in-memory sort or a regex."""
    checked = 0
    for name, command in commands:
        if name != "find":
            continue
        body = {k: v for k, v in command.items() if k not in ("lsid", "$db", "$clusterTime")}
        assert not _has_regex(body.get("filter")), body
        explained = await client[DB].command({"explain": body, "verbosity": "queryPlanner"})
        stages = _stages(explained["queryPlanner"]["winningPlan"])
        assert "COLLSCAN" not in stages, (body, stages)
        assert "SORT" not in stages, (body, stages)
        assert any(s in ("IXSCAN", "IDHACK", "EXPRESS_IXSCAN") for s in stages), (body, stages)
        checked += 1
    return checked


async def test_every_kv_and_state_query_is_an_index_range_scan(
    app_client: tuple[AsyncMongoClient[Any], Recorder],
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore],
    clock: ManualClock,
) -> None:
    client, recorder = app_client
    kv, state = stores
    for a in ("a", "ab", "b"):
        for b in ("x", "y"):
            for k in range(3):
                await kv.put((a, b), f"key{k}", {"n": k}, ttl=timedelta(hours=1))
    for s in range(5):
        await state.save("u1", f"s{s}", "k", s)
        await state.save("u2", f"s{s}", "k", s)
    recorder.commands.clear()
    await kv.get(("a", "x"), "key1")
    await kv.get_many(("a", "x"), ["key1", "key2"])
    page = await kv.search(("a",), limit=2)
    assert page.next_page_token is not None
    await kv.search(("a",), limit=2, page_token=page.next_page_token)
    page = await kv.search(("a",), key_prefix="key", limit=2)
    await kv.search(("a",), key_prefix="key", limit=2, page_token=page.next_page_token)
    # The empty prefix covers the whole store (a range over every path, not `ns: {}`,
    # which would be an equality with an empty document and match nothing).
    everything = await kv.search((), limit=5)
    assert [(i.namespace, i.key) for i in everything.items] == [
        (("a", "x"), "key0"),
        (("a", "x"), "key1"),
        (("a", "x"), "key2"),
        (("a", "y"), "key0"),
        (("a", "y"), "key1"),
    ]
    assert everything.next_page_token is not None
    rest = await kv.search((), limit=1000, page_token=everything.next_page_token)
    assert len(rest.items) == 13
    keys = await kv.list_keys(("a", "x"), prefix="key", limit=1)
    await kv.list_keys(("a", "x"), prefix="key", limit=1, page_token=keys.next_page_token)
    assert (await kv.list_namespaces(("a",))).items == [("a", "x"), ("a", "y")]
    assert (await kv.list_namespaces((), max_depth=1)).items == [("a",), ("ab",), ("b",)]
    sessions = await state.list_session_ids("u1", limit=2)
    await state.list_session_ids("u1", limit=2, page_token=sessions.next_page_token)
    await state.get("u1", "s1", "k")
    await state.get_list("u1", "s9", "k")
    await state.exists("u1", "s1")
    checked = await _explain_all(client, recorder.commands)
    assert checked >= 17


async def test_session_listing_stays_inside_one_user(
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore],
) -> None:
    _, state = stores
    for user in ("u", "u\x01", "t", "uu"):
        await state.save(user, "s", "k", 1)
    await state.save(None, "anon", "k", 1)
    assert (await state.list_session_ids("u")).items == ["s"]
    assert (await state.list_session_ids(None)).items == ["anon"]


async def test_stores_of_one_call_share_one_client_and_never_close_the_applications(
    app_client: tuple[AsyncMongoClient[Any], Recorder], prefix: str
) -> None:
    client, _ = app_client
    opened = mongo_backend.open_components(
        make_url("mongodb://"),
        ["kv", "state"],
        client=client,
        db_name=DB,
        collection_prefix=prefix,
    )
    kv, state = opened["kv"], opened["state"]
    assert isinstance(kv, MongoKeyValueStore)
    assert isinstance(state, MongoAgentStateStore)
    assert kv._holder is state._holder
    assert not kv._holder.owns_client
    await kv.put(("n",), "k", 1)
    await state.save("u", "s", "k", 1)
    assert await kv._holder.client() is client
    await kv.close()
    assert not state._holder.closed
    assert await state.get("u", "s", "k") == 1
    await state.close()
    assert kv._holder.closed
    # The application's client is still open and usable.
    assert (await client.admin.command("ping"))["ok"] == 1
    for name in (prefix + "kv", prefix + "agent_sessions"):
        await client[DB].drop_collection(name)


async def test_a_created_client_is_closed_by_its_last_user(mongo_url: str, prefix: str) -> None:
    opened = mongo_backend.open_components(
        make_url(mongo_url), ["kv", "state"], db_name=DB, collection_prefix=prefix
    )
    kv, state = opened["kv"], opened["state"]
    assert isinstance(kv, MongoKeyValueStore)
    assert isinstance(state, MongoAgentStateStore)
    await kv.put(("n",), "k", 1)
    holder = kv._holder
    assert holder.owns_client
    await kv.close()
    assert not holder.closed
    await state.close()
    assert holder.closed
    with pytest.raises(ConfigurationError, match="closed"):
        await holder.client()
    cleanup: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url)
    await cleanup[DB].drop_collection(prefix + "kv")
    await cleanup.close()


async def test_unreachable_server_is_unavailable_and_the_next_call_retries() -> None:
    store = MongoKeyValueStore("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=200")
    for _ in range(2):
        with pytest.raises(UnavailableError, match="unreachable"):
            await store.get(("n",), "k")
    await store.close()


async def test_collection_names_in_one_place() -> None:
    holder = MongoClientHolder("mongodb://h/app", names={"kv": "my_kv"}, collection_prefix="x_")
    assert holder.names == {
        "kv": "my_kv",
        "state": "x_agent_sessions",
        "snapshots": "x_snapshots",
        "guard": "x_locks",
    }
    assert holder.db_name == "app"
    assert MongoClientHolder("mongodb://h").names["state"] == "pai_agent_sessions"
    with pytest.raises(ConfigurationError, match="unknown component"):
        MongoClientHolder("mongodb://h", names={"threads_x": "t"})
    with pytest.raises(ConfigurationError, match="AsyncMongoClient"):
        MongoClientHolder(client=object())


async def test_kv_layout_on_real_documents(
    app_client: tuple[AsyncMongoClient[Any], Recorder],
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore],
    prefix: str,
) -> None:
    client, _ = app_client
    kv, _ = stores
    await kv.put(("a", "b"), "k", {"z": 1, "a": 1.0}, ttl=timedelta(seconds=90))
    await kv.put(("a", "b"), "k", {"z": 1, "a": 1.0}, ttl=timedelta(seconds=90))
    await kv.put(("a",), "forever", [1])
    raw = client.get_database(DB)[prefix + "kv"]
    doc = await raw.find_one({"key": "k"})
    assert doc is not None
    assert doc["ns"] == "a\x1fb\x1f"
    assert doc["value"] == '{"z":1,"a":1.0}'
    assert type(doc["version"]) is Int64
    assert doc["version"] == 2
    assert type(doc["ttlMs"]) is Int64
    assert doc["ttlMs"] == 90_000
    for field in ("createdAt", "updatedAt", "expiresAt"):
        assert isinstance(doc[field], datetime)
    assert doc["expiresAt"] - doc["updatedAt"] == timedelta(seconds=90)
    assert doc["_schemaVersion"] == 1
    forever = await raw.find_one({"key": "forever"})
    assert forever is not None
    assert "expiresAt" not in forever
    assert "ttlMs" not in forever
    indexes = await raw.index_information()
    assert indexes["ns_key"]["key"] == [("ns", 1), ("key", 1)]
    assert indexes["ns_key"]["unique"]
    ttl = indexes["expiresAt_ttl"]
    assert ttl["key"] == [("expiresAt", 1)]
    assert ttl["expireAfterSeconds"] == 0
    assert ttl["partialFilterExpression"] == {"expiresAt": {"$exists": True}}


async def test_state_layout_on_real_documents(
    app_client: tuple[AsyncMongoClient[Any], Recorder],
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore],
    prefix: str,
) -> None:
    client, _ = app_client
    _, state = stores
    hostile = "a.b$c%2E"
    assert await state.save("u", "s", hostile, {"x": 1}) == 1
    assert await state.save("u", "s", hostile, {"x": 2}) == 2
    await state.save_list("u", "s", "log", [1, "two"])
    assert await state.append_list("u", "s", "log", [3.0]) == 3
    raw = client.get_database(DB)[prefix + "agent_sessions"]
    doc = await raw.find_one({"_id": {"user": "u", "session": "s"}})
    assert doc is not None
    assert list(doc["_id"]) == ["user", "session"]
    field = encode_field(hostile)
    assert field == "a%2Eb%24c%252E"
    assert doc["states"][field] == '{"x":2}'
    assert type(doc["versions"][field]) is Int64
    assert doc["versions"][field] == 2
    assert doc["states"]["log"] == ["1", '"two"', "3.0"]
    assert isinstance(doc["hashes"]["log"], str)
    assert len(doc["hashes"]["log"]) == 64
    assert type(doc["lengths"]["log"]) is Int64
    assert doc["lengths"]["log"] == 3
    assert isinstance(doc["_updated_at"], datetime)
    assert await state.get("u", "s", hostile) == {"x": 2}
    assert await state.get("u", "s", "a.b$c%2e") is None  # one key, exactly
    indexes = await raw.index_information()
    ttl = indexes["_updated_at_ttl"]
    assert ttl["key"] == [("_updated_at", 1)]
    assert ttl["expireAfterSeconds"] == 30 * 24 * 3600
    assert ttl["sparse"] is True


async def test_append_sends_only_the_new_items(
    app_client: tuple[AsyncMongoClient[Any], Recorder],
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore],
) -> None:
    _, recorder = app_client
    _, state = stores
    await state.save_list("u", "s", "log", [f"item-{i}" for i in range(200)])
    recorder.commands.clear()
    await state.append_list("u", "s", "log", ["new"])
    updates = [c for name, c in recorder.commands if name == "update"]
    assert len(updates) == 1
    (statement,) = updates[0]["updates"]
    # A short append sets the positions after the guarded length.
    assert statement["q"]["lengths.log"] == 200
    assert "$push" not in statement["u"]
    assert statement["u"]["$set"]["states.log.200"] == '"new"'
    assert not [
        k for k in statement["u"]["$set"] if k.startswith("states.") and k != "states.log.200"
    ]
    # A longer one is one $push of the new items.
    recorder.commands.clear()
    more = [f"more-{i}" for i in range(SET_APPEND_MAX + 1)]
    await state.append_list("u", "s", "log", more)
    updates = [c for name, c in recorder.commands if name == "update"]
    assert len(updates) == 1
    (statement,) = updates[0]["updates"]
    assert statement["u"]["$push"] == {"states.log": {"$each": [f'"{m}"' for m in more]}}
    stored = await state.get_list("u", "s", "log")
    assert stored == [f"item-{i}" for i in range(200)] + ["new", *more]
    raw = await state.collection.find_one({"_id": {"user": "u", "session": "s"}})
    assert raw is not None
    assert isinstance(raw["states"]["log"], list)
    assert raw["lengths"]["log"] == len(stored)


async def test_session_over_16_mib_is_refused_whole(
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore],
) -> None:
    _, state = stores
    chunk = "x" * (4 * 1024 * 1024 - 16)
    await state.append_list("u", "big", "blob", [chunk, chunk, chunk])
    await state.save("u", "big", "small", 1)
    with pytest.raises(InvalidInputError, match="16 MiB") as caught:
        await state.append_list("u", "big", "blob", [chunk])
    assert chunk not in str(caught.value)
    assert len(await state.get_list("u", "big", "blob")) == 3
    assert await state.get("u", "big", "small") == 1
    with pytest.raises(InvalidInputError, match="16 MiB"):
        await state.save("u", "big", "other", chunk)
    assert await state.get("u", "big", "other") is None
