"""MongoDB TTL indexes: a store opened with another TTL than its collection's index is refused.

MongoDB keeps an existing index's ``expireAfterSeconds`` when ``createIndexes``
asks for the same index with another value, so a store opened with
``session_ttl`` of 30 days on a collection indexed for 5 s would have its
acknowledged sessions deleted by the server after 5 s. Every runtime store
whose TTL follows an option (sessions, snapshots) compares the index with its
option in ``initialize()`` and raises :class:`ConfigurationError` naming the
collection, the index and both values. (A process creates a collection's
indexes once per client, so the second store of these tests finds the first
one's index as it is; an index another process made is refused by the server
itself, ``IndexOptionsConflict``, also a :class:`ConfigurationError`.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pai_storage_mongo.runtime import MongoRuntimeStore
from pai_storage_mongo.snapshots import MongoSnapshotStore
from pai_storage_mongo.state import MongoAgentStateStore
from pymongo import AsyncMongoClient

from pai_storage import ConfigurationError

pytestmark = pytest.mark.asyncio

DB = "pai_test"
OPENERS: dict[str, tuple[Callable[..., MongoRuntimeStore], str, str]] = {
    "state": (MongoAgentStateStore, "session_ttl", "_updated_at_ttl"),
    "snapshots": (MongoSnapshotStore, "snapshot_ttl", "createdAt_ttl"),
}
CHANGES = [
    (timedelta(seconds=5), timedelta(days=30)),
    (timedelta(days=30), timedelta(seconds=5)),
    (timedelta(seconds=5), None),
]


async def _drop(url: str, prefix: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        for name in await client[DB].list_collection_names(
            filter={"name": {"$regex": f"^{prefix}"}}
        ):
            await client[DB].drop_collection(name)
    finally:
        await client.close()


@pytest.mark.parametrize(("before", "after"), CHANGES, ids=str)
@pytest.mark.parametrize("component", sorted(OPENERS))
async def test_another_ttl_than_the_collections_index_is_refused(
    mongo_url: str, component: str, before: timedelta | None, after: timedelta | None
) -> None:
    opener, option, index = OPENERS[component]
    prefix = f"pai_test_{uuid.uuid4().hex[:12]}_"
    first = opener(mongo_url, db_name=DB, collection_prefix=prefix, **{option: before})
    second = opener(mongo_url, db_name=DB, collection_prefix=prefix, **{option: after})
    same = opener(mongo_url, db_name=DB, collection_prefix=prefix, **{option: before})
    try:
        await first.initialize()
        with pytest.raises(ConfigurationError) as caught:
            await second.initialize()
        message = str(caught.value)
        assert repr(first.collection_name) in message
        assert index in message
        assert option in message
        index_says, store_says = (
            "no expiry" if t is None else f"{int(t.total_seconds())} s" for t in (before, after)
        )
        assert f"{index} says {index_says} but this store's {option} says {store_says}" in message
        await same.initialize()  # the same TTL opens
    finally:
        for store in (first, second, same):
            await store.close()
        await _drop(mongo_url, prefix)


@pytest.mark.parametrize("component", sorted(OPENERS))
async def test_another_processs_ttl_index_is_refused_too(mongo_url: str, component: str) -> None:
    opener, option, index = OPENERS[component]
    prefix = f"pai_test_{uuid.uuid4().hex[:12]}_"
    store = opener(mongo_url, db_name=DB, collection_prefix=prefix, **{option: timedelta(days=30)})
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    try:
        field = "_updated_at" if component == "state" else "createdAt"
        await client[DB][store.collection_name].create_index(
            field, name=index, expireAfterSeconds=5, sparse=component == "state"
        )
        with pytest.raises(ConfigurationError) as caught:
            await store.initialize()
        assert repr(store.collection_name) in str(caught.value)
        assert "index" in str(caught.value)
    finally:
        await store.close()
        await client.close()
        await _drop(mongo_url, prefix)
