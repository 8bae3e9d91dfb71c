"""The Redis backend's own rules: what it provides, options, client=, errors, check, expiry."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pai_storage_redis.client import RedisClient, describe_persistence
from pai_storage_redis.kv import RedisKeyValueStore
from redis.asyncio import Redis

from pai_storage import (
    ConfigurationError,
    UnavailableError,
    connect,
    open_kv_store,
    open_snapshot_store,
    open_store,
    sync,
)
from pai_storage.cli import main
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreError


async def test_connect_provides_the_runtime_stores_and_not_threads(
    redis_url: str, prefix: str
) -> None:
    async with connect(redis_url, key_prefix=prefix) as stores:
        assert stores.provided == {"kv", "state", "snapshots", "guard"}
        with pytest.raises(ConfigurationError, match="redis backend does not provide the threads"):
            _ = stores.threads
        await stores.kv.put(("a",), "k", 1)
        assert (await stores.kv.get(("a",), "k")).value == 1  # type: ignore[union-attr]
    # open_store is the thread store's opener: its errors are the thread store's.
    with pytest.raises(ThreadStoreConfigurationError, match="does not provide the threads"):
        open_store(redis_url)
    with pytest.raises(ThreadStoreConfigurationError, match="does not provide the threads"):
        sync.open_store(redis_url)


async def test_threads_from_another_url(redis_url: str, prefix: str) -> None:
    async with connect(redis_url, threads="memory://", key_prefix=prefix) as stores:
        assert stores.provided == {"threads", "kv", "state", "snapshots", "guard"}


async def test_key_prefixes_keep_stores_apart(redis_url: str, prefix: str) -> None:
    async with (
        open_kv_store(redis_url, key_prefix=prefix + "one:") as one,
        open_kv_store(redis_url, key_prefix=prefix + "two:") as two,
    ):
        await one.put(("ns",), "k", "one")
        assert await two.get(("ns",), "k") is None
        assert (await two.search(())).items == []


async def test_an_application_client_is_used_and_never_closed(redis_url: str, prefix: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        async with connect(redis_url, client=client, key_prefix=prefix) as stores:
            await stores.kv.put(("a",), "k", {"x": 1})
        assert await client.ping()  # still open
        keys = [k async for k in client.scan_iter(match="{" + prefix + "*")]
        assert keys, "the stores wrote through the given client"
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"key_prefix": "a{b"}, "key_prefix must be a non-empty str without braces"),
        ({"key_prefix": ""}, "key_prefix"),
        ({"cluster": "yes"}, "cluster must be a bool"),
        ({"connect_timeout": 0}, "connect_timeout must be a positive number"),
        ({"max_connections": 0}, "max_connections must be None or an integer >= 1"),
        ({"pool_size": 3}, "unknown option(s) for redis://: pool_size"),
        ({"client": object()}, "client= must be a redis.asyncio.Redis or RedisCluster"),
    ],
)
def test_bad_options_are_configuration_errors(
    redis_url: str, options: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_kv_store(redis_url, **options)
    assert words in str(info.value)
    assert not isinstance(info.value, ThreadStoreError)  # the thread store's classes are its own


async def test_options_beside_a_shared_client_are_a_general_configuration_error(
    redis_url: str,
) -> None:
    shared = RedisClient(redis_url)
    with pytest.raises(ConfigurationError, match="cannot be combined with a shared client") as info:
        RedisKeyValueStore(client=shared, key_prefix="x")
    assert not isinstance(info.value, ThreadStoreError)


async def test_a_client_decoding_responses_is_refused(redis_url: str) -> None:
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses=False"):
            open_snapshot_store(redis_url, client=client)
    finally:
        await client.aclose()


async def test_an_unreachable_server_is_unavailable_and_the_password_hidden() -> None:
    store = open_kv_store("redis://:s3cret-pw@127.0.0.1:1/0", connect_timeout=2)
    with pytest.raises(UnavailableError, match="unreachable") as info:
        await store.put(("a",), "k", 1)
    assert "s3cret-pw" not in str(info.value)
    await store.close()


def test_check_reports_the_persistence_settings(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", redis_url]) == 0
    out = capsys.readouterr().out
    for word in ("backend       redis", "appendonly", "appendfsync", "durability", "ok"):
        assert word in out


def test_check_of_an_unreachable_server_fails_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "redis://:pw-9@127.0.0.1:1/0"]) == 1
    err = capsys.readouterr().err
    assert "UnavailableError" in err
    assert "pw-9" not in err


@pytest.mark.parametrize(
    ("aof", "fsync", "save", "words"),
    [
        ("1", "always", "", "every acknowledged write survives a crash"),
        ("1", "everysec", "", "may lose the last second"),
        ("0", "everysec", "3600 1", "loses every write since the last RDB snapshot"),
        ("0", "everysec", "", "no persistence"),
    ],
)
def test_what_each_persistence_setting_guarantees(
    aof: str, fsync: str, save: str, words: str
) -> None:
    shown = describe_persistence(
        {"redis_version": "7.0.15"}, {"aof_enabled": aof}, {"appendfsync": fsync, "save": save}
    )
    assert words in shown["durability"]


async def test_redis_expires_items_itself_and_purge_clears_the_index(
    redis_url: str, prefix: str
) -> None:
    client = Redis.from_url(redis_url)
    try:
        async with open_kv_store(redis_url, key_prefix=prefix) as kv:
            await kv.put(("ns",), "brief", "x", ttl=timedelta(milliseconds=300))
            await kv.put(("ns",), "kept", "y")
            item_key = "{" + prefix + "kv}:i:ns\x1f\x00brief"
            assert 0 < await client.pttl(item_key) <= 300
            assert await client.pttl("{" + prefix + "kv}:i:ns\x1f\x00kept") == -1
            for _ in range(200):  # Redis removes it on its own
                if not await client.exists(item_key):
                    break
                await asyncio.sleep(0.05)
            assert not await client.exists(item_key)
            assert [i.key for i in (await kv.search(("ns",))).items] == ["kept"]
            assert await kv.purge_expired() == 1
            assert await client.zcard("{" + prefix + "kv}:idx") == 1
    finally:
        await client.aclose()


@pytest.mark.parametrize("cluster", [False, True])
def test_the_clients_made_never_resend_a_command(cluster: bool) -> None:
    """A script sent again after a lost reply could be applied twice: the clients
    the backend makes (a node's pool, a Cluster's, whose redis-py default is 10
    attempts) retry nothing. Made without connecting."""
    made: Any = RedisClient("redis://127.0.0.1:1/0", cluster=cluster)._make()
    retry = made.retry if cluster else made.connection_pool.connection_kwargs["retry"]
    assert retry.get_retries() == 0
