"""The stored documents and indexes follow ``docs/mongodb.md#data-model`` to the letter.

That is the document and index layout ``@pai/storage-mongo`` uses.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from bson import ObjectId
from bson.int64 import Int64
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import CommittedResult, ManualClock
from pai_storage import builders as b

from .helpers import raw_collections

pytestmark = pytest.mark.asyncio

OPAQUE: dict[str, Any] = {
    "iso": "2030-01-01T00:00:00.000Z",
    "$set": {"a.b": 1, "$in": [1, 2]},
    "": "empty key",
    "int": 1,
    "float": 1.0,
    "big": 2**40,
    "min": -(2**63),
    "nested": {"z": 1, "a": 2, "m": [{"when": "2030-01-01T00:00:00Z"}]},
}
WITH_NUL_KEY: dict[str, Any] = {**OPAQUE, "nul\x00key": {"x": True}}

BASE_INDEXES: dict[str, list[tuple[list[tuple[str, int]], bool]]] = {
    "threads": [
        ([("scopeKey", 1), ("threadId", 1)], True),
        ([("scopeKey", 1), ("updatedAt", -1), ("threadId", 1)], False),
        ([("scopeKey", 1), ("listVisibility", 1), ("updatedAt", -1), ("threadId", 1)], False),
        (
            [
                ("scopeKey", 1),
                ("agent", 1),
                ("listVisibility", 1),
                ("updatedAt", -1),
                ("threadId", 1),
            ],
            False,
        ),
        (
            [
                ("scopeKey", 1),
                ("agent", 1),
                ("listVisibility", 1),
                ("parentThreadId", 1),
                ("updatedAt", -1),
                ("threadId", 1),
            ],
            False,
        ),
        (
            [
                ("scopeKey", 1),
                ("agent", 1),
                ("listVisibility", 1),
                ("category", 1),
                ("updatedAt", -1),
                ("threadId", 1),
            ],
            False,
        ),
    ],
    "messages": [
        ([("scopeKey", 1), ("threadId", 1), ("messageId", 1)], True),
        ([("scopeKey", 1), ("threadId", 1), ("_order", 1)], True),
        ([("scopeKey", 1), ("threadId", 1), ("visibility.transcript", 1), ("_order", 1)], False),
        ([("scopeKey", 1), ("threadId", 1), ("visibility.context", 1), ("_order", 1)], False),
        (
            [
                ("scopeKey", 1),
                ("threadId", 1),
                ("association.kind", 1),
                ("association.runId", 1),
                ("_order", 1),
            ],
            False,
        ),
        ([("scopeKey", 1), ("threadId", 1), ("status", 1), ("_order", 1)], False),
    ],
    "queuedItems": [
        ([("scopeKey", 1), ("threadId", 1), ("queueItemId", 1)], True),
        ([("scopeKey", 1), ("threadId", 1), ("_order", 1)], True),
        ([("scopeKey", 1), ("threadId", 1), ("runId", 1), ("queueItemId", 1)], False),
    ],
    "runs": [
        ([("scopeKey", 1), ("threadId", 1), ("runId", 1)], True),
        ([("scopeKey", 1), ("threadId", 1), ("_order", 1)], True),
        ([("scopeKey", 1), ("threadId", 1), ("status", 1), ("runId", 1)], False),
        (
            [
                ("scopeKey", 1),
                ("threadId", 1),
                ("status", 1),
                ("admission.queueItemId", 1),
                ("runId", 1),
            ],
            False,
        ),
    ],
}


async def _turn(store: MongoThreadStore, opaque: dict[str, Any] = OPAQUE) -> CommittedResult:
    """A thread with one running turn (m1 + r1 + lease) and one queued turn (r2 + q1)."""
    created = await store.commit_thread(
        b.create(
            "scope",
            "t1",
            {
                "messages": [
                    {
                        "type": "insert",
                        "record": b.message("m1", run_id="r1", metadata=dict(opaque)),
                    }
                ],
                "runs": [{"type": "insert", "record": b.run("r1", inputs=["m1"])}],
                "lease": b.acquire("r1", "w1"),
            },
            title="hello",
            metadata=dict(opaque),
        )
    )
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    queued = await store.commit_thread(
        b.update_at(
            "scope",
            "t1",
            created.thread.version,
            {
                "runs": [{"type": "insert", "record": b.run("r2", "queued", queue_item_id="q1")}],
                "queuedItems": [
                    {"type": "insert", "record": b.queued_item("q1", "r2", payload=opaque)}
                ],
                "lease": b.renew("r1", "w1"),
            },
            root=b.root(title="hello", metadata=dict(opaque)),
        )
    )
    assert isinstance(queued, CommittedResult)
    return queued


def _assert_opaque(value: Any) -> None:
    assert list(value) == list(OPAQUE)  # key order kept
    assert value["iso"] == OPAQUE["iso"]
    assert isinstance(value["iso"], str)
    assert value["$set"] == {"a.b": 1, "$in": [1, 2]}
    assert type(value["int"]) is int
    assert type(value["float"]) is float
    assert isinstance(value["big"], Int64)
    assert isinstance(value["min"], Int64)
    assert list(value["nested"]) == ["z", "a", "m"]
    assert value["nested"]["m"][0]["when"] == "2030-01-01T00:00:00Z"


async def test_collections_follow_the_collection_name(mongo_harness: Any) -> None:
    store = mongo_harness.open_store(collection_name="agent_threads_x")
    assert store.collection_names() == {
        "threads": "agent_threads_x",
        "messages": "agent_threads_x_messages",
        "runs": "agent_threads_x_runs",
        "queuedItems": "agent_threads_x_pending_messages",
    }
    default = MongoThreadStore("mongodb://127.0.0.1:1/")
    assert default.collection_name == "pai_threads"
    assert default.db_name == "pai"
    assert MongoThreadStore("mongodb://127.0.0.1:1/app").db_name == "app"
    assert MongoThreadStore("mongodb://127.0.0.1:1/app", db_name="other").db_name == "other"


async def test_root_document_is_flat_and_typed(mongo_store: MongoThreadStore) -> None:
    await _turn(mongo_store)
    cols = raw_collections(mongo_store)
    roots = await cols["threads"].find({}).to_list()
    assert len(roots) == 1
    root = roots[0]
    assert isinstance(root["_id"], ObjectId)
    assert root["_schemaVersion"] == 1
    assert set(root) == {
        "_id",
        "_schemaVersion",
        "_nextOrder",
        "_facts",
        "scopeKey",
        "threadId",
        "version",
        "agent",
        "directExecutionAllowed",
        "listVisibility",
        "title",
        "metadata",
        "privateMetadata",
        "lease",
        "createdAt",
        "updatedAt",
    }
    assert root["scopeKey"] == "scope"
    assert root["threadId"] == "t1"
    assert root["version"]["revision"] == 2
    assert root["_nextOrder"] == {"messages": 2, "runs": 3, "queuedItems": 2}
    for when in ("createdAt", "updatedAt"):
        assert isinstance(root[when], datetime)
    for when in ("acquiredAt", "renewedAt", "expiresAt"):
        assert isinstance(root["lease"][when], datetime)
    _assert_opaque(root["metadata"])
    assert "payload" not in root
    assert "record" not in root
    # The relationship facts: the last message and the open run with its messages.
    m1 = {"messageId": "m1", "order": 1, "runId": "r1", "relation": "input"}
    assert root["_facts"] == {
        "tail": m1,
        "open": [
            {
                "runId": "r1",
                "status": "running",
                "admitted": True,
                "queueItemId": None,
                "inputMessageIds": ["m1"],
                "messages": [m1],
                "foreign": False,
            }
        ],
    }


async def test_a_nul_key_is_escaped_as_json_text(mongo_store: MongoThreadStore) -> None:
    from bson.binary import Binary

    await _turn(mongo_store, WITH_NUL_KEY)
    root = await raw_collections(mongo_store)["threads"].find_one({})
    assert isinstance(root["metadata"], Binary)
    assert root["metadata"].subtype == 0x80
    assert root["privateMetadata"] == {}


async def test_child_documents_are_flat_and_typed(mongo_store: MongoThreadStore) -> None:
    await _turn(mongo_store)
    cols = raw_collections(mongo_store)
    (message,) = await cols["messages"].find({}).to_list()
    assert isinstance(message["_id"], ObjectId)
    assert set(message) == {
        "_id",
        "_schemaVersion",
        "_order",
        "scopeKey",
        "threadId",
        "messageId",
        "role",
        "parts",
        "producer",
        "association",
        "visibility",
        "status",
        "metadata",
        "createdAt",
        "updatedAt",
    }
    assert message["_schemaVersion"] == 1
    assert message["_order"] == 1
    assert isinstance(message["createdAt"], datetime)
    _assert_opaque(message["metadata"])
    runs = await cols["runs"].find({}, sort=[("_order", 1)]).to_list()
    assert [r["runId"] for r in runs] == ["r1", "r2"]
    assert [r["_order"] for r in runs] == [1, 2]
    assert isinstance(runs[0]["admission"]["admittedAt"], datetime)
    assert "admittedAt" not in runs[1]["admission"]
    assert "finishedAt" not in runs[0]
    (item,) = await cols["queuedItems"].find({}).to_list()
    assert item["queueItemId"] == "q1"
    assert item["runId"] == "r2"
    assert item["_order"] == 1
    assert isinstance(item["createdAt"], datetime)
    _assert_opaque(item["input"])


@pytest.mark.parametrize("opaque", [OPAQUE, WITH_NUL_KEY], ids=["plain", "nul-key"])
async def test_records_round_trip_exactly(
    mongo_store: MongoThreadStore, opaque: dict[str, Any]
) -> None:
    await _turn(mongo_store, opaque)
    read = await mongo_store.read_thread(
        b.read(
            "scope",
            "t1",
            messages={"type": "ids", "messageIds": ["m1"]},
            queuedItems={"type": "ids", "queueItemIds": ["q1"]},
        )
    )
    assert read.thread is not None
    assert read.messages is not None
    assert read.queued_items is not None
    for value in (
        read.thread.metadata,
        read.messages.items[0].metadata,
        read.queued_items.items[0].input,
    ):
        assert value == opaque
        assert list(value) == list(opaque)
        assert type(value["int"]) is int
        assert type(value["float"]) is float
        assert type(value["big"]) is int


# Beyond the @pai/storage-mongo set (docs/mongodb.md): status- and run-filtered child
# pages need ``_order`` order after the filter key, which its ``{status, runId}`` and
# ``{runId, queueItemId}`` indexes cannot give; the lifecycle sweeps read the roots in
# ascending ``updatedAt`` order, of one scope and of every scope.
EXTRA_INDEXES: dict[str, list[tuple[list[tuple[str, int]], bool]]] = {
    "threads": [
        ([("scopeKey", 1), ("updatedAt", 1), ("threadId", 1)], False),
        ([("updatedAt", 1), ("scopeKey", 1), ("threadId", 1)], False),
    ],
    "runs": [([("scopeKey", 1), ("threadId", 1), ("status", 1), ("_order", 1)], False)],
    "queuedItems": [([("scopeKey", 1), ("threadId", 1), ("runId", 1), ("_order", 1)], False)],
}


async def test_index_set_matches_the_documented_one(mongo_store: MongoThreadStore) -> None:
    cols = raw_collections(mongo_store)
    for family, base in BASE_INDEXES.items():
        expected = base + EXTRA_INDEXES.get(family, [])
        info = await cols[family].index_information()
        found = sorted(
            (list(spec["key"]), bool(spec.get("unique")))
            for name, spec in info.items()
            if name != "_id_"
        )
        want = sorted(([(k, d) for k, d in keys], unique) for keys, unique in expected)
        assert [(list(map(tuple, k)), u) for k, u in found] == want, family
        for spec in info.values():
            assert "collation" not in spec  # code-point (binary) string order
        unique_names = {n for n, s in info.items() if s.get("unique")}
        assert all(n.startswith("scope_thread_") and n.endswith("_unique") for n in unique_names)


async def test_initialize_is_idempotent_on_existing_indexes(
    mongo_store: MongoThreadStore, mongo_url: str
) -> None:
    again = MongoThreadStore(
        mongo_url, db_name=mongo_store.db_name, collection_name=mongo_store.collection_name
    )
    async with again:
        info = await again.info()
        assert info.transactions is True
        assert info.server_version
    cols = raw_collections(mongo_store)
    assert len(await cols["threads"].index_information()) == 9


async def test_delete_is_scoped(mongo_store: MongoThreadStore, clock: ManualClock) -> None:
    result = await _turn(mongo_store)
    other = await mongo_store.commit_thread(
        b.create("scope", "t2", {"messages": [{"type": "insert", "record": b.message("m1")}]})
    )
    other_scope = await mongo_store.commit_thread(
        b.create("scope2", "t1", {"messages": [{"type": "insert", "record": b.message("m1")}]})
    )
    assert isinstance(other, CommittedResult)
    assert isinstance(other_scope, CommittedResult)
    assert result.thread is not None
    deleted = await mongo_store.commit_thread(b.delete("scope", "t1", result.thread.version))
    assert isinstance(deleted, CommittedResult)
    assert deleted.thread is None
    cols = raw_collections(mongo_store)
    for family in ("threads", "messages"):
        left = {(d["scopeKey"], d["threadId"]) for d in await cols[family].find({}).to_list()}
        assert left == {("scope", "t2"), ("scope2", "t1")}
    for family in ("runs", "queuedItems"):
        assert await cols[family].count_documents({}) == 0
