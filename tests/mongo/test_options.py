"""Options: every URL option the driver or the server rejects is an error naming it.

The driver judges most URL options when the store is opened (PyMongo alone
would only warn and ignore them); the server judges a write concern mode or a
read concern level, which ``initialize()`` uses once. No message holds a
password. ``token_secret`` signs the store's page tokens.
"""

from __future__ import annotations

import pytest
from pai_storage_mongo.harness import MongoHarness, drop_store_collections
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import builders as b
from pai_storage import open_store
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStorePageTokenError

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("w=-1", "w"),
        ("journal=banana", "journal"),
        ("readPreference=banana", "readPreference"),
        ("maxPoolSize=-1", "maxPoolSize"),
        ("zlibCompressionLevel=99", "zlibCompressionLevel"),
        ("retryWrites=maybe", "retryWrites"),
        ("authSource=", "authSource"),
        ("replicaSet=rs0&unknownOption=1", "unknownOption"),
        ("connectTimeoutMS=-5", "connectTimeoutMS"),
    ],
)
def test_an_option_the_driver_rejects_fails_at_open(option: str, name: str) -> None:
    url = f"mongodb://app:{SECRET}@127.0.0.1:1/agents?{option}"
    with pytest.raises(ThreadStoreConfigurationError) as err:
        open_store(url)
    message = str(err.value)
    assert f"option {name!r}" in message
    assert "invalid" in message
    assert SECRET not in message
    assert err.value.__cause__ is None  # nothing of the driver's message beyond the reason


def test_a_credential_option_is_named_but_never_quoted() -> None:
    url = f"mongodb://127.0.0.1:1/?authMechanismProperties=NOT_A_PROPERTY:{SECRET}"
    with pytest.raises(ThreadStoreConfigurationError) as err:
        MongoThreadStore(url)
    assert "'authMechanismProperties'" in str(err.value)
    assert SECRET not in str(err.value)
    assert "NOT_A_PROPERTY" not in str(err.value)


def test_valid_options_open_without_a_server() -> None:
    store = MongoThreadStore(
        "mongodb://127.0.0.1:1/?replicaSet=rs0&w=majority&readPreference=primaryPreferred"
        "&readConcernLevel=majority&retryWrites=false&maxPoolSize=5&appname=x"
    )
    assert store.url.query[1] == ("w", "majority")


@pytest.mark.parametrize(
    ("option", "name", "code"),
    [
        ("w=banana", "w", "UnknownReplWriteConcern"),
        ("w=3", "w", "UnsatisfiableWriteConcern"),
        ("readConcernLevel=banana", "readConcernLevel", "FailedToParse"),
    ],
)
async def test_an_option_the_server_rejects_fails_at_initialize(
    mongo_harness: MongoHarness, option: str, name: str, code: str
) -> None:
    named = mongo_harness.open_store()
    assert mongo_harness.url is not None
    store = MongoThreadStore(
        f"{mongo_harness.url}&{option}",
        db_name=named.db_name,
        collection_name=named.collection_name,
    )
    try:
        with pytest.raises(ThreadStoreConfigurationError) as err:
            await store.initialize()
        assert f"URL option {name}" in str(err.value)
        assert code in str(err.value)
        assert store._client is None  # the refused client was closed
        with pytest.raises(ThreadStoreConfigurationError, match=f"URL option {name}"):
            await store.read_thread(b.read("s", "t"))  # the lazy initialize says the same
    finally:
        await store.close()
        async with named:
            await drop_store_collections(named)


async def test_an_option_combination_the_driver_rejects_fails_at_initialize() -> None:
    store = MongoThreadStore(
        f"mongodb://app:{SECRET}@127.0.0.1:1/?readPreference=primary&maxStalenessSeconds=120"
    )
    with pytest.raises(ThreadStoreConfigurationError) as err:
        await store.initialize()
    assert "maxStalenessSeconds" in str(err.value)
    assert SECRET not in str(err.value)
    await store.close()


async def test_token_secret_signs_page_tokens(mongo_harness: MongoHarness) -> None:
    signed = mongo_harness.open_store(token_secret=b"key-one")
    other = mongo_harness.open_store(
        db_name=signed.db_name, collection_name=signed.collection_name, token_secret=b"key-two"
    )
    async with signed, other:
        try:
            for thread_id in ("t1", "t2", "t3"):
                await signed.commit_thread(b.create("s", thread_id))
            first = await signed.list_threads({"scopeKey": "s", "limit": 1})
            assert first.next_page_token is not None
            request = {"scopeKey": "s", "limit": 1, "pageToken": first.next_page_token}
            assert len((await signed.list_threads(request)).items) == 1
            with pytest.raises(ThreadStorePageTokenError):
                await other.list_threads(request)
        finally:
            await drop_store_collections(signed)


def test_a_bad_token_secret_is_refused_at_open() -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="token_secret"):
        MongoThreadStore("mongodb://127.0.0.1:1/", token_secret="not bytes")  # type: ignore[arg-type]
