"""The collection listing of the runtime stores is exactly the documented layout.

A workload through the key-value, agent-state, snapshot and guard stores of
one ``connect()``-style opening (one client, one collection prefix) leaves
collections that are then listed the way an operator would see them: the
collection names, every index with its keys and options, and every field path
of every document with its BSON type. The listing must equal the layout that
``docs/mongodb.md`` writes down ("Key-value and agent-state collections",
"Snapshot and lock collections"): nothing missing, nothing extra (no
leftover helper field of an update pipeline, no index beyond the listed ones).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from bson import Binary, Int64, ObjectId
from pai_storage_mongo import backend as mongo_backend
from pai_storage_mongo.harness import TEST_DB
from pymongo import AsyncMongoClient

from pai_storage.backend import make_url

pytestmark = pytest.mark.asyncio

DAYS_30 = 30 * 24 * 3600

EXPECTED_INDEXES: dict[str, dict[str, tuple[Any, ...]]] = {
    "kv": {
        "_id_": ((("_id", 1),),),
        "ns_key": ((("ns", 1), ("key", 1)), ("unique", True)),
        "expiresAt_ttl": (
            (("expiresAt", 1),),
            ("expireAfterSeconds", 0),
            ("partialFilterExpression", {"expiresAt": {"$exists": True}}),
        ),
    },
    "agent_sessions": {
        "_id_": ((("_id", 1),),),
        "_updated_at_ttl": (
            (("_updated_at", 1),),
            ("expireAfterSeconds", DAYS_30),
            ("sparse", True),
        ),
    },
    "snapshots": {
        "_id_": ((("_id", 1),),),
        "scope_newest": ((("_id.scope", 1), ("createdAt", -1), ("_id.snapshotId", -1)),),
        "createdAt_ttl": ((("createdAt", 1),), ("expireAfterSeconds", DAYS_30)),
        "blob": ((("blob", 1),), ("sparse", True)),
    },
    # The GridFS bucket of snapshots over the document limit (none in this test).
    "snapshots_blobs.files": {
        "_id_": ((("_id", 1),),),
        "uploadDate_1": ((("uploadDate", 1),),),
    },
    "snapshots_blobs.chunks": {
        "_id_": ((("_id", 1),),),
        "files_id_1_n_1": ((("files_id", 1), ("n", 1)), ("unique", True)),
    },
    "locks": {
        "_id_": ((("_id", 1),),),
        "expiresAt_ttl": (
            (("expiresAt", 1),),
            ("expireAfterSeconds", 0),
            ("partialFilterExpression", {"expiresAt": {"$exists": True}}),
        ),
    },
}
"""Each collection's indexes: key, then the options beside ``v``."""

EXPECTED_FIELDS: dict[str, set[tuple[str, str]]] = {
    "snapshots_blobs.files": set(),
    "snapshots_blobs.chunks": set(),
    "kv": {
        ("_id", "objectId"),
        ("ns", "string"),
        ("key", "string"),
        ("value", "string"),
        ("version", "long"),
        ("createdAt", "date"),
        ("updatedAt", "date"),
        ("expiresAt", "date"),
        ("ttlMs", "long"),
        ("_schemaVersion", "int"),
    },
    "agent_sessions": {
        ("_id", "object"),
        ("_id.user", "string"),
        ("_id.session", "string"),
        ("states", "object"),
        ("states.<field>", "string"),
        ("states.<field>", "array"),
        ("states.<field>[]", "string"),
        ("versions", "object"),
        ("versions.<field>", "long"),
        ("hashes", "object"),
        ("hashes.<field>", "string"),
        ("lengths", "object"),
        ("lengths.<field>", "long"),
        ("_updated_at", "date"),
    },
    "snapshots": {
        ("_id", "object"),
        ("_id.scope", "string"),
        ("_id.snapshotId", "string"),
        ("createdAt", "date"),
        ("size", "long"),
        ("sha256", "string"),
        ("metadata", "string"),
        ("data", "binData"),
        ("_schemaVersion", "int"),
    },
    "locks": {
        ("_id", "string"),
        ("token", "string"),
        ("owner", "string"),
        ("fencingToken", "long"),
        ("acquiredAt", "date"),
        ("expiresAt", "date"),
        # the fencing counter
        ("_id", "object"),
        ("_id.counter", "string"),
        ("value", "long"),
    },
}
"""Every (field path, BSON type) found in the documents; ``<field>`` is a state key."""

_DYNAMIC = ("states", "versions", "hashes", "lengths")


def _bson_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, datetime):
        return "date"
    if isinstance(value, ObjectId):
        return "objectId"
    if isinstance(value, bytes | Binary):
        if isinstance(value, Binary):
            assert value.subtype == 0, value.subtype
        return "binData"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _fields(doc: dict[str, Any], path: str = "") -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for key, value in doc.items():
        name = "<field>" if path in _DYNAMIC else key
        full = f"{path}.{name}" if path else name
        found.add((full, _bson_type(value)))
        if isinstance(value, dict) and full not in ("metadata",):
            found |= _fields(value, full)
        elif isinstance(value, list):
            found |= {(f"{full}[]", _bson_type(item)) for item in value}
    return found


def _index_listing(info: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    out: dict[str, tuple[Any, ...]] = {}
    for name, spec in info.items():
        options = sorted((k, v) for k, v in spec.items() if k not in ("v", "key", "ns"))
        out[name] = (tuple(tuple(k) for k in spec["key"]), *options)
    return out


@pytest_asyncio.fixture
async def listed(mongo_url: str) -> AsyncIterator[tuple[str, Any]]:
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url, tz_aware=True)
    prefix = f"pai_test_{uuid.uuid4().hex}_"
    try:
        yield prefix, client[TEST_DB]
    finally:
        for name in await client[TEST_DB].list_collection_names():
            if name.startswith(prefix):
                await client[TEST_DB].drop_collection(name)
        await client.close()


async def test_the_collection_listing_is_the_documented_layout(
    mongo_url: str, listed: tuple[str, Any]
) -> None:
    prefix, db = listed
    stores = mongo_backend.open_components(
        make_url(mongo_url),
        ["kv", "state", "snapshots", "guard"],
        db_name=TEST_DB,
        collection_prefix=prefix,
    )
    kv, state, snapshots, guard = (stores[c] for c in ("kv", "state", "snapshots", "guard"))
    try:
        first = await kv.put(("a", "b"), "k", {"x": 1}, ttl=timedelta(minutes=5))
        await kv.put(("a",), "forever", [1, 2])
        await kv.put_if_version(("a", "b"), "k", 2, first.version)
        await kv.put_if_version(("a",), "new", 3, None)
        await kv.put(("a", "c"), "ttl", 1, ttl=timedelta(minutes=5))
        await kv.get(("a", "c"), "ttl", refresh_ttl=True)
        await state.save("u", "s", "a.b$c", {"x": 1})
        await state.save_if_version("u", "s", "a.b$c", 2, 1)
        await state.save_if_version("u", "s", "fresh", 1, 0)
        await state.save_list("u", "s", "log", [1, 2])
        await state.append_list("u", "s", "log", [3])
        await state.append_list("u", "s", "log", list(range(20)))
        await state.save_list(None, "anon", "log", ["x"])
        await state.save("u", "gone", "v", 1)
        await state.delete_state("u", "gone", "v")
        await snapshots.put("scope", "one", b"\x00\x01", metadata={"m": 1})
        await snapshots.put("scope", "one", b"\x02")
        await snapshots.put("scope", "two", b"")
        lock = await guard.try_acquire("resource", owner="worker")
        assert lock is not None
        assert await lock.renew()
        held = await guard.try_acquire("held", owner="worker")
        assert held is not None
        assert await lock.release()

        names = {n for n in await db.list_collection_names() if n.startswith(prefix)}
        assert names == {prefix + c for c in EXPECTED_INDEXES}
        for suffix, expected in EXPECTED_INDEXES.items():
            collection = db[prefix + suffix]
            indexes = _index_listing(await collection.index_information())
            assert indexes == {k: (v[0], *sorted(v[1:])) for k, v in expected.items()}, suffix
            options = await collection.options()
            assert "collation" not in options, suffix
            found: set[tuple[str, str]] = set()
            async for doc in collection.find():
                found |= _fields(doc)
            assert found == EXPECTED_FIELDS[suffix], (suffix, sorted(found))
        # _id field order as documented ({user, session}, {scope, snapshotId}).
        session = await db[prefix + "agent_sessions"].find_one({"_id.user": "u"})
        assert session is not None
        assert list(session["_id"]) == ["user", "session"]
        snap = await db[prefix + "snapshots"].find_one({})
        assert snap is not None
        assert list(snap["_id"]) == ["scope", "snapshotId"]
        # The session emptied by its last delete_state is gone; the held lock and
        # the counter remain, the released lock does not.
        assert await db[prefix + "agent_sessions"].count_documents({}) == 2
        assert await db[prefix + "locks"].count_documents({}) == 2
    finally:
        await guard.close()
        for store in (kv, state, snapshots):
            await store.close()
