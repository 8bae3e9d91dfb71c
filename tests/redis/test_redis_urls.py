"""What a Redis URL may say: its database, its query parameters, and the topology it names.

A URL's problems are ``ConfigurationError``s, never a driver's exception, and
never show the password: a query parameter redis-py does not take (or one that
cannot come from a URL) or a bad value is refused when the store is opened, as
a bad option is; a database path that is not one non-negative integer is
refused there too; a database number the server does not have, and
``cluster=True`` against a server that is not a cluster node, are refused on
first use (only the server can tell).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from pai_storage import (
    ConfigurationError,
    UnavailableError,
    connect,
    make_url,
    open_guard,
    open_kv_store,
    open_snapshot_store,
    open_state_store,
)
from pai_storage.cli import main

SECRET = "S3cret-pw-71"
"""The password of every URL here: the server has none, and AUTH default <any> is accepted."""

OPENERS: dict[str, Callable[..., Any]] = {
    "kv": open_kv_store,
    "state": open_state_store,
    "snapshots": open_snapshot_store,
    "guard": open_guard,
}


@pytest.fixture
def server(redis_url: str) -> str:
    """``default:<SECRET>@host:port`` of the test server."""
    parsed = make_url(redis_url)
    return f"default:{SECRET}@{parsed.host or '127.0.0.1'}:{parsed.port or 6379}"


def _refused(info: pytest.ExceptionInfo[ConfigurationError], *words: str) -> str:
    text = str(info.value)
    assert SECRET not in text
    assert SECRET not in repr(info.value)
    for word in words:
        assert word in text
    return text


# ---------------------------------------------------------------- query parameters


@pytest.mark.parametrize("component", sorted(OPENERS))
def test_an_unknown_query_parameter_is_refused_at_open(server: str, component: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        OPENERS[component](f"redis://{server}/15?bogus=1")
    text = _refused(info, "bogus")
    assert "health_check_interval" in text  # the message lists the valid ones


async def test_connect_refuses_an_unknown_query_parameter(server: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        async with connect(f"redis://{server}/15?bogus=1&other=2") as stores:
            await stores.kv.put(("a",), "k", 1)
    _refused(info, "bogus", "other")


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("db=abc", ("database", "abc")),
        ("health_check_interval=soon", ("health_check_interval",)),
        # Only a TLS connection takes TLS options.
        ("ssl_cert_reqs=none", ("ssl_cert_reqs", "rediss://")),
        # Text, so always true: redis-py would decode every reply, snapshots included.
        ("decode_responses=false", ("decode_responses",)),
        # An object, not text.
        ("retry=3", ("retry",)),
        # The stores read and write UTF-8 of their own: another would hide what they stored.
        ("encoding=latin-1", ("encoding",)),
        ("encoding_errors=ignore", ("encoding_errors",)),
        # The store's keyword options: a URL would override them, unchecked.
        ("socket_timeout=-1", ("socket_timeout", "keyword arguments")),
        ("socket_connect_timeout=1", ("socket_connect_timeout", "keyword arguments")),
        ("max_connections=2", ("max_connections", "keyword arguments")),
    ],
)
def test_a_bad_query_parameter_is_refused_at_open(
    server: str, query: str, words: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_kv_store(f"redis://{server}/15?{query}")
    _refused(info, *words)


async def test_valid_query_parameters_still_reach_redis_py(server: str, prefix: str) -> None:
    url = f"redis://{server}/15?client_name=pai-url-test&health_check_interval=5"
    async with open_kv_store(url, key_prefix=prefix) as kv:
        await kv.put(("a",), "k", 1)
        assert (await kv.get(("a",), "k")).value == 1  # type: ignore[union-attr]
        async with Redis.from_url(f"redis://{server}/15") as admin:
            clients = await admin.client_list()
        assert "pai-url-test" in [c["name"] for c in clients]  # it reached redis-py
    # TLS options are taken with rediss:// (opening connects to nothing yet).
    store = open_kv_store(f"rediss://{server}/15?ssl_cert_reqs=none&ssl_check_hostname=false")
    await store.close()


def test_a_cluster_refuses_what_redis_cluster_does_not_take(server: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_kv_store(f"redis://{server}/0?timeout=3", cluster=True)
    _refused(info, "timeout")


def test_check_refuses_an_unknown_query_parameter(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", f"redis://{server}/15?bogus=1"]) == 1
    err = capsys.readouterr().err
    assert "ConfigurationError" in err
    assert "bogus" in err
    assert "Traceback" not in err
    assert SECRET not in err


# ---------------------------------------------------------------- the database


@pytest.mark.parametrize(
    "tail",
    ["/abc", "/1/extra", "/1/2", "/-1", "/+1", "/1%20", "?db=-1", "/3?db=4", "?db="],
)
def test_a_database_that_is_not_one_number_is_refused_at_open(server: str, tail: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_kv_store(f"redis://{server}{tail}")
    _refused(info, "database", "redis://[[user]:password@]host[:port][/db]")


@pytest.mark.parametrize("tail", ["", "/", "/15", "?db=15", "/15?db=15", "/015"])
async def test_a_database_number_is_accepted(server: str, prefix: str, tail: str) -> None:
    async with open_kv_store(f"redis://{server}{tail}", key_prefix=prefix) as kv:
        await kv.put(("a",), "k", 1)
        assert (await kv.get(("a",), "k")).value == 1  # type: ignore[union-attr]
        await kv.delete(("a",), "k")


@pytest.mark.parametrize("tail", ["/99", "?db=99"])
async def test_a_database_the_server_does_not_have_is_a_configuration_error(
    server: str, tail: str
) -> None:
    store = open_kv_store(f"redis://{server}{tail}")
    with pytest.raises(ConfigurationError) as info:
        await store.put(("a",), "k", 1)
    _refused(info, "database", "out of range")
    await store.close()


def test_check_of_a_database_the_server_does_not_have(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", f"redis://{server}/99"]) == 1
    err = capsys.readouterr().err
    assert "ConfigurationError" in err
    assert "out of range" in err
    assert SECRET not in err


# ---------------------------------------------------------------- cluster


async def test_cluster_against_a_server_that_is_not_a_cluster_node(server: str) -> None:
    store = open_kv_store(f"redis://{server}/0", cluster=True)
    with pytest.raises(ConfigurationError) as info:
        await store.put(("a",), "k", 1)
    _refused(info, "cluster")
    await store.close()
    with pytest.raises(ConfigurationError) as info:
        async with connect(f"redis://{server}/0", cluster=True) as stores:
            await stores.kv.put(("a",), "k", 1)
    _refused(info, "cluster")


def test_a_cluster_has_only_database_0(server: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_kv_store(f"redis://{server}/3", cluster=True)
    _refused(info, "database 0")


async def test_an_unreachable_cluster_is_unavailable() -> None:
    store = open_kv_store(f"redis://:{SECRET}@127.0.0.1:1/0", cluster=True, connect_timeout=2)
    with pytest.raises(UnavailableError) as info:
        await store.put(("a",), "k", 1)
    assert SECRET not in str(info.value)
    await store.close()
