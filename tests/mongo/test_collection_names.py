"""MongoDB collection names: a bad one, or one another store uses, is refused when opened.

``names=`` and ``collection_prefix`` choose the runtime collections,
``collection_name`` the thread store's four. A store pointed at another
store's collection would put its indexes there (the snapshot store's TTL index
on thread roots deletes them; the key-value store's unique index breaks thread
creates), so every pair of collections a bundle uses must differ; and a name
MongoDB cannot use must be a :class:`ConfigurationError` at once, never a
driver exception on first use. None of these checks needs a server.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pai_storage_mongo.client import DEFAULT_COLLECTIONS, MongoClientHolder
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import (
    ConfigurationError,
    connect,
    open_guard,
    open_kv_store,
    open_snapshot_store,
    open_state_store,
)

URL = "mongodb://127.0.0.1:1/?replicaSet=rs0"  # never contacted: every check is local
THREAD_FAMILIES = {
    "threads": "",
    "messages": "_messages",
    "runs": "_runs",
    "queuedItems": "_pending_messages",
}
RUNTIME = sorted(DEFAULT_COLLECTIONS)


def test_the_holder_knows_the_thread_stores_collections() -> None:
    store = MongoThreadStore(URL, collection_name="t")
    assert store.collection_names() == {k: "t" + s for k, s in THREAD_FAMILIES.items()}
    holder = MongoClientHolder(URL)
    assert holder.thread_collections("t") == store.collection_names()
    assert holder.thread_collections() == MongoThreadStore(URL).collection_names()


@pytest.mark.parametrize("family", sorted(THREAD_FAMILIES))
@pytest.mark.parametrize("component", RUNTIME)
def test_a_runtime_store_on_a_default_thread_collection_is_refused(
    component: str, family: str
) -> None:
    taken = "pai_threads" + THREAD_FAMILIES[family]
    with pytest.raises(ConfigurationError) as err:
        connect(URL, names={component: taken})
    message = str(err.value)
    assert repr(taken) in message
    assert component in message
    assert "thread" in message


@pytest.mark.parametrize("family", sorted(THREAD_FAMILIES))
@pytest.mark.parametrize("component", RUNTIME)
def test_a_runtime_store_on_the_bundles_thread_collection_is_refused(
    component: str, family: str
) -> None:
    taken = "chats" + THREAD_FAMILIES[family]
    with pytest.raises(ConfigurationError) as err:
        connect(URL, collection_name="chats", names={component: taken})
    assert repr(taken) in str(err.value)
    assert component in str(err.value)


@pytest.mark.parametrize("component", RUNTIME)
def test_a_thread_collection_on_a_runtime_collection_is_refused(component: str) -> None:
    taken = "pai_" + DEFAULT_COLLECTIONS[component]
    with pytest.raises(ConfigurationError) as err:
        connect(URL, collection_name=taken)
    assert repr(taken) in str(err.value)
    assert component in str(err.value)
    # The same through a prefix: the thread store's default under the prefix.
    with pytest.raises(ConfigurationError, match="x_threads_runs"):
        connect(URL, collection_prefix="x_", names={component: "x_threads_runs"})


def test_a_thread_store_on_a_shared_holders_collection_is_refused_before_it_counts() -> None:
    holder = MongoClientHolder(URL, names={"kv": "chats_messages"})
    with pytest.raises(ConfigurationError, match="'chats_messages'"):
        MongoThreadStore(client=holder, collection_name="chats")
    assert holder._users == 0  # nothing to release: the refused store holds no client


@pytest.mark.parametrize(("first", "second"), [(a, b) for a in RUNTIME for b in RUNTIME if a < b])
def test_two_runtime_stores_on_one_collection_are_refused(first: str, second: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        connect(URL, names={first: "shared", second: "shared"})
    message = str(err.value)
    assert "'shared'" in message
    assert first in message
    assert second in message
    # A name given for one component may not be another's default either.
    with pytest.raises(ConfigurationError, match=second):
        connect(URL, names={first: "pai_" + DEFAULT_COLLECTIONS[second]})


def test_distinct_names_open() -> None:
    stores = connect(
        URL,
        collection_name="chats",
        names={"kv": "my.kv", "state": "sessions", "snapshots": "snaps", "guard": "locks"},
    )
    assert stores.kv.collection_name == "my.kv"  # type: ignore[attr-defined]
    assert stores.threads.collection_names()["threads"] == "chats"  # type: ignore[attr-defined]


BAD_NAMES: list[Any] = [
    "",
    ".",
    "..",
    ".kv",
    "kv.",
    "a..b",
    "a$b",
    "$cmd",
    "a\x00b",
    "system.kv",
    "\ud800",  # not encodable as UTF-8
    "n" * 300,  # over MongoDB's 255 bytes for database and collection together
    "é" * 126,  # 252 bytes after the database's name and the dot: too long too
    5,
    None,
    b"kv",
]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
def test_every_bad_collection_name_is_refused_when_opened(bad: Any) -> None:
    for opener in (connect, open_kv_store):
        with pytest.raises(ConfigurationError, match=r"names\['kv'\]"):
            opener(URL, names={"kv": bad})


@pytest.mark.parametrize("bad", ["kv", ["kv"], [("kv", "x")], 5, {"kv"}], ids=repr)
def test_names_that_are_not_a_mapping_are_refused(bad: Any) -> None:
    for opener in (connect, open_state_store, open_snapshot_store, open_guard):
        with pytest.raises(ConfigurationError, match="option names must be a mapping"):
            opener(URL, names=bad)


@pytest.mark.parametrize("component", [5, None, "threads", "KV"], ids=repr)
def test_an_unknown_component_is_refused(component: Any) -> None:
    with pytest.raises(ConfigurationError, match="unknown component"):
        connect(URL, names={component: "x"})


@pytest.mark.parametrize("prefix", [".", "a..", "$", "system.", "n" * 300, 5], ids=repr)
def test_a_prefix_that_makes_a_bad_name_is_refused(prefix: Any) -> None:
    with pytest.raises(ConfigurationError, match="collection_prefix"):
        connect(URL, collection_prefix=prefix)


def test_a_database_name_mongodb_refuses_is_refused() -> None:
    for bad in ("a.b", "a b", "a$b", "a/b", "a\x00b", "d" * 64, "\ud800"):
        with pytest.raises(ConfigurationError, match="db_name"):
            connect(URL, db_name=bad)


def test_a_long_database_name_leaves_less_room_for_collections() -> None:
    db = "d" * 63
    MongoClientHolder(URL, db_name=db, names={"kv": "k" * (255 - 64)})
    with pytest.raises(ConfigurationError, match="255 bytes"):
        MongoClientHolder(URL, db_name=db, names={"kv": "k" * (256 - 64)})


async def test_an_unusual_valid_name_works(mongo_url: str) -> None:
    name = f"my.kv-{uuid.uuid4().hex}é"
    async with connect(mongo_url, db_name="pai_test", names={"kv": name}) as stores:
        await stores.kv.put(("t",), "k", 1)
        item = await stores.kv.get(("t",), "k")
        assert item is not None
        assert item.value == 1
        await stores.kv.collection.drop()  # type: ignore[attr-defined]
