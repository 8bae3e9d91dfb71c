"""MongoDB key-value and agent-state stores when the server goes away.

The stores talk to the replica set through a loopback proxy
(``tests/support/proxy.py``) that cuts every connection, or lets one command
reach the server and swallows its answer. Every failure must surface as the
contract's ``UnavailableError`` (nothing was written) or
``OutcomeUnknownError`` (a write may have been applied), never as a PyMongo
exception, and the same store object must work again once the server is back.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo.harness import TEST_DB
from pai_storage_mongo.kv import MongoKeyValueStore
from pai_storage_mongo.state import MongoAgentStateStore
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError
from support.proxy import FaultProxy

from pai_storage.errors import OutcomeUnknownError, StorageError, UnavailableError

from .helpers import proxied_url

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def proxy(replica_port: int) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(replica_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest_asyncio.fixture
async def stores(
    mongo_url: str, proxy: FaultProxy
) -> AsyncIterator[tuple[MongoKeyValueStore, MongoAgentStateStore, MongoAgentStateStore]]:
    """The key-value and state stores through the proxy, and a state store reading directly."""
    prefix = f"pai_test_{uuid.uuid4().hex[:12]}_"
    url = proxied_url(proxy.port, serverSelectionTimeoutMS="800")
    kv = MongoKeyValueStore(url, db_name=TEST_DB, collection_prefix=prefix)
    state = MongoAgentStateStore(url, db_name=TEST_DB, collection_prefix=prefix)
    direct = MongoAgentStateStore(mongo_url, db_name=TEST_DB, collection_prefix=prefix)
    try:
        yield kv, state, direct
    finally:
        for store in (kv, state, direct):
            await store.close()
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
        try:
            for name in ("kv", "agent_sessions"):
                await client[TEST_DB].drop_collection(prefix + name)
        finally:
            await client.close()


def _typed(exc: BaseException) -> None:
    assert isinstance(exc, UnavailableError | OutcomeUnknownError), repr(exc)
    assert not isinstance(exc, PyMongoError)
    assert "mongo" in str(exc).lower()


async def test_every_operation_when_the_server_is_gone(
    proxy: FaultProxy,
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore, MongoAgentStateStore],
) -> None:
    kv, state, _ = stores
    await kv.put(("n",), "k", 1)
    await state.save("u", "s", "v", 1)
    await state.save_list("u", "s", "log", [1])
    proxy.cut()
    reads: dict[str, Callable[[], Awaitable[Any]]] = {
        "kv.get": lambda: kv.get(("n",), "k"),
        "kv.search": lambda: kv.search(("n",)),
        "kv.list_keys": lambda: kv.list_keys(("n",)),
        "kv.list_namespaces": lambda: kv.list_namespaces(()),
        "state.get": lambda: state.get("u", "s", "v"),
        "state.get_list": lambda: state.get_list("u", "s", "log"),
        "state.exists": lambda: state.exists("u", "s"),
        "state.list_session_ids": lambda: state.list_session_ids("u"),
    }
    writes: dict[str, Callable[[], Awaitable[Any]]] = {
        "kv.put": lambda: kv.put(("n",), "k", 2),
        "kv.put_if_version": lambda: kv.put_if_version(("n",), "k", 2, 1),
        "kv.delete": lambda: kv.delete(("n",), "k"),
        "kv.purge_expired": kv.purge_expired,
        "state.save": lambda: state.save("u", "s", "v", 2),
        "state.append_list": lambda: state.append_list("u", "s", "log", [2]),
        "state.save_list": lambda: state.save_list("u", "s", "log", [3]),
        "state.delete_state": lambda: state.delete_state("u", "s", "v"),
        "state.delete": lambda: state.delete("u", "s"),
        "state.purge_expired": state.purge_expired,
    }
    for name, operation in {**reads, **writes}.items():
        with pytest.raises(StorageError) as caught:
            await operation()
        _typed(caught.value)
        if name in reads:  # nothing to be unsure about: it never ran
            assert isinstance(caught.value, UnavailableError), (name, caught.value)
    proxy.restore()
    # The same stores recover, without being reopened; nothing above was applied.
    item = await kv.get(("n",), "k")
    assert item is not None
    assert (item.value, item.version) == (1, 1)
    assert await state.get("u", "s", "v") == 1
    assert await state.get_list("u", "s", "log") == [1]


@pytest.mark.parametrize("forward", [True, False], ids=["applied", "never-sent"])
async def test_kv_put_whose_answer_is_lost(
    proxy: FaultProxy,
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore, MongoAgentStateStore],
    forward: bool,
) -> None:
    kv, _, _ = stores
    await kv.put(("n",), "k", 1)
    proxy.cut_on(b"findAndModify\x00", forward=forward)
    with pytest.raises(StorageError) as caught:
        await kv.put(("n",), "k", 2)
    assert proxy.triggered.is_set()
    _typed(caught.value)
    proxy.restore()
    item = await kv.get(("n",), "k")
    assert item is not None
    if forward:  # the server applied it; the client never heard back
        assert isinstance(caught.value, OutcomeUnknownError)
        assert (item.value, item.version) == (2, 2)
    else:
        assert item.value in (1, 2)  # unknown outcome: either, never anything else
        assert item.version == item.value


@pytest.mark.parametrize("items", [1, 40], ids=["short", "long"])
async def test_state_append_whose_answer_is_lost_is_applied_once(
    proxy: FaultProxy,
    stores: tuple[MongoKeyValueStore, MongoAgentStateStore, MongoAgentStateStore],
    items: int,
) -> None:
    _, state, direct = stores
    await state.save_list("u", "s", "log", ["a", "b"])
    new = [f"n{i}" for i in range(items)]
    proxy.cut_on(b"update\x00", forward=True)
    with pytest.raises(OutcomeUnknownError):
        await state.append_list("u", "s", "log", new)
    assert proxy.triggered.is_set()
    assert await direct.get_list("u", "s", "log") == ["a", "b", *new]
    proxy.restore()
    # Re-reading resolves it; the next append goes after it, exactly once.
    assert await state.get_list("u", "s", "log") == ["a", "b", *new]
    assert await state.append_list("u", "s", "log", ["c"], expected_length=2 + items) == 3 + items
    assert await direct.get_list("u", "s", "log") == ["a", "b", *new, "c"]
