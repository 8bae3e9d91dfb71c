"""Connecting: topology checks, timeouts, memoized initialization, no secrets in errors."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pai_storage_mongo.harness import MongodProcess, _free_port
from pai_storage_mongo.store import MongoThreadStore
from support.proxy import FaultProxy

from pai_storage import builders as b
from pai_storage import open_store
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreUnavailableError

from .helpers import proxied_url

pytestmark = pytest.mark.asyncio


async def test_standalone_mongod_is_a_configuration_error(
    standalone_mongod: MongodProcess,
) -> None:
    store = MongoThreadStore(standalone_mongod.url, collection_name="never_created")
    with pytest.raises(ThreadStoreConfigurationError, match="replica set"):
        await store.initialize()
    with pytest.raises(ThreadStoreConfigurationError, match="replica set"):
        await store.read_thread(b.read("s", "t"))  # lazy init retries and fails the same way
    await store.close()


async def test_unreachable_server_is_unavailable_fast_without_the_password() -> None:
    port = _free_port()  # nothing listens there
    url = f"mongodb://app:s3cr3t%2Fpw@127.0.0.1:{port}/agents?serverSelectionTimeoutMS=300"
    store = open_store(url)
    assert "s3cr3t" not in repr(store)
    started = time.monotonic()
    with pytest.raises(ThreadStoreUnavailableError) as err:
        await store.initialize()
    assert time.monotonic() - started < 3
    assert "s3cr3t" not in str(err.value)
    assert err.value.__cause__ is not None
    assert type(err.value.__cause__).__module__.startswith("pymongo")
    await store.close()


async def test_default_server_selection_timeout_is_short(mongo_url: str) -> None:
    store = MongoThreadStore(mongo_url, collection_name="pai_unused")
    await store.initialize()
    assert store._client is not None
    assert store._client.options.server_selection_timeout == 5
    await store.close()
    store = MongoThreadStore(mongo_url + "&serverSelectionTimeoutMS=1500", collection_name="x")
    await store.initialize()
    assert store._client is not None
    assert store._client.options.server_selection_timeout == 1.5
    await store.close()


async def test_options_are_checked() -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="unknown option"):
        open_store("mongodb://127.0.0.1/", dbName="x")
    with pytest.raises(ThreadStoreConfigurationError):
        open_store("mongodb://127.0.0.1/", collection_name="")
    with pytest.raises(ThreadStoreConfigurationError):
        open_store("mongodb://127.0.0.1/", db_name="a.b")
    with pytest.raises(ThreadStoreConfigurationError):
        open_store("mongodb://127.0.0.1/", clock="not callable")
    srv = open_store("mongodb+srv://u:pw-123@cluster0.example.net/app", collection_name="c")
    assert isinstance(srv, MongoThreadStore)
    assert srv.db_name == "app"
    assert repr(srv).startswith("MongoThreadStore('mongodb+srv://u:***@cluster0.example.net")
    assert "pw-123" not in repr(srv)


class CountingStore(MongoThreadStore):
    prepared = 0

    async def _prepare(self, client: Any) -> None:
        type(self).prepared += 1
        await asyncio.sleep(0.05)
        await super()._prepare(client)


async def test_concurrent_first_calls_share_one_initialization(mongo_url: str) -> None:
    store = CountingStore(mongo_url, db_name="pai_test", collection_name="pai_test_shared_init")
    try:
        results = await asyncio.gather(
            *(store.read_thread(b.read("s", f"t{i}")) for i in range(8)), store.initialize()
        )
        assert all(r is None or r.thread is None for r in results)
        assert CountingStore.prepared == 1
    finally:
        for name in store.collection_names().values():
            await store.database.drop_collection(name)
        await store.close()


async def test_failed_initialization_is_forgotten(replica_port: int) -> None:
    proxy = FaultProxy(replica_port)
    await proxy.start()
    proxy.cut()  # refuse everything
    store = MongoThreadStore(
        proxied_url(proxy.port, serverSelectionTimeoutMS="300"),
        db_name="pai_test",
        collection_name="pai_test_forgotten_init",
    )
    try:
        with pytest.raises(ThreadStoreUnavailableError):
            await store.initialize()
        assert store._client is None  # the dead client was closed, not kept
        proxy.restore()
        await store.initialize()
        read = await store.read_thread(b.read("s", "t"))
        assert read.thread is None
    finally:
        if store._db is not None:
            for name in store.collection_names().values():
                await store.database.drop_collection(name)
        await store.close()
        await proxy.stop()


async def test_a_collection_with_a_collation_is_refused(mongo_harness: Any) -> None:
    store = mongo_harness.open_store()
    client: Any = __import__("pymongo").AsyncMongoClient(mongo_harness.url)
    try:
        await client[store.db_name].create_collection(
            store.collection_name, collation={"locale": "en", "strength": 2}
        )
        with pytest.raises(ThreadStoreConfigurationError, match="collation"):
            await store.initialize()
    finally:
        await client[store.db_name].drop_collection(store.collection_name)
        await client.close()
        await store.close()


@pytest.mark.parametrize(
    ("keys", "options"),
    [
        ([("threadId", 1)], {"name": "scope_updated"}),  # the name, other keys (code 86)
        ([("scopeKey", 1), ("threadId", 1)], {"name": "mine", "unique": True}),  # code 85
    ],
)
async def test_a_conflicting_existing_index_is_a_configuration_error(
    mongo_harness: Any, keys: list[tuple[str, int]], options: dict[str, Any]
) -> None:
    store = mongo_harness.open_store()
    client: Any = __import__("pymongo").AsyncMongoClient(mongo_harness.url)
    try:
        await client[store.db_name][store.collection_name].create_index(keys, **options)
        with pytest.raises(ThreadStoreConfigurationError, match="conflicts with an index"):
            await store.initialize()
    finally:
        await client[store.db_name].drop_collection(store.collection_name)
        await client.close()
        await store.close()


async def test_token_secret_is_a_common_option_of_open_store() -> None:
    store = open_store("mongodb://127.0.0.1:9/app", token_secret=b"k" * 32)
    assert store.selections.codec is not None
    with pytest.raises(ThreadStoreConfigurationError, match="token_secret"):
        open_store("mongodb://127.0.0.1:9/app", token_secret="not-bytes")
