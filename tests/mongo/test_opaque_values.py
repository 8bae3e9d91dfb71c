"""Opaque JSON that looks like a BSON or Extended JSON type round-trips exactly.

PyMongo decodes any embedded document with a string ``$ref`` and an ``$id``
as a ``DBRef`` (reordering its keys, dropping a null ``$db``); such a value
must neither poison its thread nor come back changed. ``$regex``, ``$binary``
and the other Extended JSON shapes mean nothing to BSON itself and are checked
alongside.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from bson.dbref import DBRef
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import CommittedResult, ManualClock, ThreadReadResult, ThreadVersion
from pai_storage import builders as b

from .helpers import raw_collections

SHAPES: dict[str, Any] = {
    "dbref": {"$ref": "users", "$id": 1},
    "dbref-reordered": {"$id": {"n": 1.0}, "keep": [1, "x"], "$ref": "users", "$db": None},
    "dbref-nested": {
        "list": [{"$ref": "a", "$id": "b", "$db": "c", "z": True}],
        "inner": {"$ref": "x", "$id": None},
    },
    "regex": {"$regex": "^a", "$options": "i"},
    "binary": {"$binary": {"base64": "AAAA", "subType": "00"}},
    "binary-legacy": {"$binary": "AAAA", "$type": "00"},
    "extended-json": {
        "$oid": "5f0000000000000000000000",
        "$date": {"$numberLong": "1"},
        "$numberDecimal": "1.5",
        "$timestamp": {"t": 1, "i": 2},
        "$minKey": 1,
        "$code": "x",
        "$symbol": "s",
        "$undefined": True,
        "$dbPointer": {"$ref": "a", "$id": {"$oid": "5f0000000000000000000000"}},
    },
}


def _exact(value: Any) -> str:
    """A comparison key that sees key order and ``1`` vs ``1.0``."""
    return json.dumps(value)


def _message(message_id: str, value: Any) -> dict[str, Any]:
    draft = b.message(message_id, run_id="r1", metadata=value)
    draft["parts"] = [
        {"type": "text", "text": "hi", "providerMetadata": value},
        {
            "type": "tool-call",
            "toolCallId": "c1",
            "toolName": "lookup",
            "input": value,
            "state": "output-available",
            "output": [value],
            "callProviderMetadata": value,
            "resultProviderMetadata": value,
        },
        {"type": "data", "name": "d", "data": {"wrapped": value}},
    ]
    return draft


def _run(run_id: str, value: Any, **kwargs: Any) -> dict[str, Any]:
    draft = b.run(run_id, metadata=value, **kwargs)
    draft["privateMetadata"] = value
    return draft


def _create(value: Any, thread_id: str = "t1") -> dict[str, Any]:
    return b.create(
        "scope",
        thread_id,
        {
            "messages": [b.insert(_message("m1", value))],
            "runs": [
                b.insert(_run("r1", value, inputs=["m1"])),
                b.insert(_run("r2", value, status="queued", queue_item_id="q1")),
            ],
            "queuedItems": [
                b.insert({**b.queued_item("q1", "r2", payload=value), "metadata": value})
            ],
        },
        metadata=value,
        privateMetadata=value,
    )


def _opaque_values(read: ThreadReadResult) -> list[Any]:
    """Every opaque value of the thread as read, in a fixed order."""
    assert read.thread is not None
    assert read.messages is not None
    assert read.runs is not None
    assert read.queued_items is not None
    (message,) = read.messages.items
    text, tool, data = message.parts
    values: list[Any] = [read.thread.metadata, read.thread.private_metadata, message.metadata]
    values += [text.provider_metadata]  # type: ignore[union-attr]
    values += [tool.input, tool.output[0], tool.call_provider_metadata]  # type: ignore[union-attr]
    values += [tool.result_provider_metadata, data.data["wrapped"]]  # type: ignore[union-attr]
    for run in read.runs.items:
        values += [run.metadata, run.private_metadata]
    (item,) = read.queued_items.items
    values += [item.input, item.metadata]
    return values


async def _read_all(store: MongoThreadStore, *, by_ids: bool) -> ThreadReadResult:
    if by_ids:
        include: dict[str, Any] = {
            "messages": {"type": "ids", "messageIds": ["m1"]},
            "runs": {"type": "ids", "runIds": ["r1", "r2"]},
            "queuedItems": {"type": "ids", "queueItemIds": ["q1"]},
        }
    else:
        page = {"type": "page", "page": {"limit": 10}}
        include = {"messages": {**page, "view": "raw"}, "runs": page, "queuedItems": page}
    return await store.read_thread(b.read("scope", "t1", **include))


async def _assert_exact(store: MongoThreadStore, value: Any) -> ThreadVersion:
    for by_ids in (True, False):
        read = await _read_all(store, by_ids=by_ids)
        values = _opaque_values(read)
        assert len(values) == 15
        for found in values:
            assert _exact(found) == _exact(value)
    listed = await store.list_threads({"scopeKey": "scope", "limit": 10})
    assert [t.thread_id for t in listed.items] == ["t1"]
    assert _exact(listed.items[0].metadata) == _exact(value)
    assert read.thread is not None
    return read.thread.version


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_special_looking_values_round_trip_through_every_operation(
    mongo_store: MongoThreadStore, shape: str
) -> None:
    value = SHAPES[shape]
    created = await mongo_store.commit_thread(_create(value))
    assert isinstance(created, CommittedResult)
    version = await _assert_exact(mongo_store, value)

    # Stored as is (no escape): the seed's layout. Raw PyMongo sees what it always sees.
    root = await raw_collections(mongo_store)["threads"].find_one({"threadId": "t1"})
    assert type(root["metadata"]) is (DBRef if "$ref" in value else dict)

    updated = await mongo_store.commit_thread(
        b.update_at(
            "scope",
            "t1",
            version,
            {
                "messages": [b.replace(_message("m1", value))],
                "runs": [b.replace(_run("r1", value, inputs=["m1"]))],
            },
            root=b.root(metadata=value, privateMetadata=value),
        )
    )
    assert isinstance(updated, CommittedResult)
    version = await _assert_exact(mongo_store, value)

    deleted = await mongo_store.commit_thread(b.delete("scope", "t1", version))
    assert isinstance(deleted, CommittedResult)
    assert (await mongo_store.read_thread(b.read("scope", "t1"))).thread is None

    again = await mongo_store.commit_thread(_create(value))
    assert isinstance(again, CommittedResult)
    await _assert_exact(mongo_store, value)


async def test_a_dbref_shaped_value_does_not_disturb_other_threads_or_pages(
    mongo_store: MongoThreadStore, clock: ManualClock
) -> None:
    value = SHAPES["dbref-reordered"]
    for thread_id, metadata in (("t0", {}), ("t1", value), ("t2", {"a": 1})):
        clock.advance(ms=1)
        done = await mongo_store.commit_thread(
            b.create(
                "scope",
                thread_id,
                {"messages": [b.insert(b.message(f"m{i}", metadata=metadata)) for i in range(3)]},
                metadata=metadata,
            )
        )
        assert isinstance(done, CommittedResult)
    listed = await mongo_store.list_threads({"scopeKey": "scope", "limit": 2})
    assert [t.thread_id for t in listed.items] == ["t2", "t1"]
    assert listed.next_page_token is not None
    rest = await mongo_store.list_threads(
        {"scopeKey": "scope", "limit": 2, "pageToken": listed.next_page_token}
    )
    assert [t.thread_id for t in rest.items] == ["t0"]
    page = await mongo_store.read_thread(
        b.read(
            "scope",
            "t1",
            messages={"type": "page", "view": "raw", "order": "newest", "page": {"limit": 2}},
        )
    )
    assert page.messages is not None
    assert [m.message_id for m in page.messages.items] == ["m2", "m1"]
    assert all(_exact(m.metadata) == _exact(value) for m in page.messages.items)


def test_decoding_is_exact_for_dbref_shapes_and_fast_otherwise() -> None:
    import bson
    from pai_storage_mongo.documents import decode_document

    for value in SHAPES.values():
        doc = {"_schemaVersion": 1, "metadata": value, "n": 2**40}
        decoded = decode_document(bson.encode(doc))
        assert _exact(decoded["metadata"]) == _exact(value)
        assert type(decoded["n"]) is int
    plain = decode_document(bson.encode({"a": {"$ref": 1, "$id": 2}}))
    assert plain == {"a": {"$ref": 1, "$id": 2}}  # not a DBRef to PyMongo either
