"""MongoDB key-value and agent-state documents that were damaged after they were written.

A document edited by hand or written by another program may miss a field or
hold one of the wrong type. What the stores promise for it: a key-value item
or a state value that no longer reads is reported through ``on_warning`` (kind
``invalid_record``, names only) and treated as absent; a list whose stored
length or hash is damaged is refused with a :class:`StorageError` saying so.
No other exception escapes.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo import backend as mongo_backend
from pai_storage_mongo.kv import MongoKeyValueStore
from pai_storage_mongo.state import MongoAgentStateStore
from pymongo import AsyncMongoClient

from pai_storage import StorageError, StoreWarning
from pai_storage.backend import make_url
from pai_storage.kv import KVConflict

pytestmark = pytest.mark.asyncio

DB = "pai_test"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest_asyncio.fixture
async def opened(
    mongo_url: str,
) -> AsyncIterator[tuple[MongoKeyValueStore, MongoAgentStateStore, list[StoreWarning]]]:
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url, tz_aware=True)
    prefix = f"pai_test_{uuid.uuid4().hex}_"
    warnings: list[StoreWarning] = []
    stores = mongo_backend.open_components(
        make_url("mongodb://"),
        ["kv", "state"],
        client=client,
        db_name=DB,
        collection_prefix=prefix,
        on_warning=warnings.append,
    )
    kv, state = stores["kv"], stores["state"]
    assert isinstance(kv, MongoKeyValueStore)
    assert isinstance(state, MongoAgentStateStore)
    await kv.initialize()
    await state.initialize()
    try:
        yield kv, state, warnings
    finally:
        await kv.close()
        await state.close()
        for name in (prefix + "kv", prefix + "agent_sessions"):
            await client[DB].drop_collection(name)
        await client.close()


@pytest.mark.parametrize(
    "fields",
    [
        {"value": 5},
        {"value": '["x", NaN]'},
        {"version": "1"},
        {"version": True},
        {"createdAt": "2030-01-01"},
        {"updatedAt": None},
        {"ttlMs": "1000"},
        {"expiresAt": "never"},  # not a date: never after now, so expired (not reported)
    ],
    ids=repr,
)
async def test_a_damaged_kv_document_is_absent(
    opened: tuple[MongoKeyValueStore, MongoAgentStateStore, list[StoreWarning]],
    fields: dict[str, Any],
) -> None:
    kv, _, warnings = opened
    await kv.put(("n",), "bad", {"secret": "hunter2"})
    await kv.put(("n",), "good", 1)
    await kv.collection.update_one({"key": "bad"}, {"$set": fields})
    assert await kv.get(("n",), "bad") is None
    assert list(await kv.get_many(("n",), ["bad", "good"])) == ["good"]
    assert [item.key for item in (await kv.search(("n",))).items] == ["good"]
    assert await kv.put_if_version(("n",), "bad", 2, None) == KVConflict(current=None)
    assert bool(warnings) is ("expiresAt" not in fields)
    for warning in warnings:
        assert (warning.kind, warning.namespace, warning.key) == ("invalid_record", ("n",), "bad")
        assert "hunter2" not in repr(warning)
    await kv.delete(("n",), "bad")  # a delete repairs it
    assert (await kv.put(("n",), "bad", "repaired")).version == 1


async def test_a_kv_document_missing_its_fields_is_reported_and_absent(
    opened: tuple[MongoKeyValueStore, MongoAgentStateStore, list[StoreWarning]],
) -> None:
    kv, _, warnings = opened
    await kv.put(("n",), "good", 1)
    await kv.collection.insert_one({"ns": "n\x1f", "key": "bare", "value": "1"})
    assert await kv.get(("n",), "bare") is None
    assert [item.key for item in (await kv.search(("n",))).items] == ["good"]
    assert [w.key for w in warnings] == ["bare", "bare"]


@pytest.mark.parametrize("version", [{"a": 1}, None, "1", 0, True], ids=repr)
async def test_a_state_value_with_a_damaged_version_is_reported_and_absent(
    opened: tuple[MongoKeyValueStore, MongoAgentStateStore, list[StoreWarning]],
    version: object,
) -> None:
    _, state, warnings = opened
    await state.save("u", "s", "v", "x")
    await state.collection.update_one({}, {"$set": {"versions.v": version}})
    assert await state.get_versioned("u", "s", "v") is None
    assert await state.get("u", "s", "v") is None
    assert [(w.kind, w.key) for w in warnings] == [("invalid_record", "v")] * 2
    assert await state.delete_state("u", "s", "v")
    assert await state.save("u", "s", "v", "again") == 1


@pytest.mark.parametrize(
    "fields", [{"lengths.l": "2"}, {"lengths.l": -1}, {"hashes.l": 5}, {"hashes.l": "x"}], ids=repr
)
async def test_a_list_with_a_damaged_head_is_refused_by_writes(
    opened: tuple[MongoKeyValueStore, MongoAgentStateStore, list[StoreWarning]],
    fields: dict[str, Any],
) -> None:
    _, state, _ = opened
    await state.save_list("u", "s", "l", ["a", "b"])
    await state.collection.update_one({}, {"$set": fields})
    assert await state.get_list("u", "s", "l") == ["a", "b"]
    for write in (
        state.save_list("u", "s", "l", ["a", "b", "c"]),
        state.append_list("u", "s", "l", ["c"]),
        state.append_list("u", "s", "l", ["c"], expected_length=2),
    ):
        with pytest.raises(StorageError, match="damaged"):
            await write
    assert await state.delete_state("u", "s", "l")
    assert await state.append_list("u", "s", "l", ["fresh"]) == 1
