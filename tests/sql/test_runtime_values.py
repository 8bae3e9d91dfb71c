"""Values round-trip exactly, and a value the server cannot take is a typed error.

Stored JSON is UTF-8 bytes of the canonical text, so key order, ``1`` versus
``1.0``, 64-bit integers, escapes and every code point come back as written,
through every read path of the key-value, agent-state and snapshot stores.

MariaDB/MySQL take one statement of at most ``max_allowed_packet`` bytes, and
the drivers send a byte string as an escaped literal (seven byte values take
two bytes). A value or snapshot that would not fit is refused before anything
is sent, with an ``InvalidInputError`` (``SnapshotTooLargeError`` for a
snapshot) naming the server's limit; nothing is written and the store goes on
working. SQLite has no such bound: the same sizes round-trip there.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_sql.client import SqlClient
from pai_storage_sql.kv import SqlKeyValueStore
from pai_storage_sql.snapshots import SqlSnapshotStore
from pai_storage_sql.state import SqlAgentStateStore
from sqlalchemy import text

from pai_storage import InvalidInputError, SnapshotTooLargeError

from .conftest import Target

pytestmark = pytest.mark.asyncio

MIB = 1024 * 1024

VALUE: dict[str, Any] = {
    "z": 1,
    "a": 1.0,
    "m": [9223372036854775807, -9223372036854775808, 1.5e300, 5e-324, 0.1, 0, -1],
    "s": "\u0000\u001f\"\\/\n\t\u2028\U0001f642\u00e9e\u0301'%_ trailing ",
    "n": None,
    "t": True,
    "f": False,
    "e": {},
    "l": [],
    "nested": {"b": [{"y": 2, "x": 1}], "a": "\uffff\U0010ffff"},
}
"""Key order, int versus float, the 64-bit range, escapes and edge code points."""


def same(got: Any, expected: Any) -> None:
    """Equal, with the same JSON text and the same types all the way down."""
    assert json.dumps(got, ensure_ascii=False) == json.dumps(expected, ensure_ascii=False)
    assert type(got) is type(expected)
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            same(got[key], expected[key])
    elif isinstance(expected, list):
        assert len(got) == len(expected)
        for left, right in zip(got, expected, strict=True):
            same(left, right)


@pytest_asyncio.fixture
async def stores(target: Target) -> AsyncIterator[dict[str, Any]]:
    client = SqlClient.shared(target.url, **target.options)
    opened: dict[str, Any] = {
        "kv": SqlKeyValueStore(client=client, max_value_bytes=64 * MIB),
        "state": SqlAgentStateStore(client=client, max_value_bytes=64 * MIB),
        "snapshots": SqlSnapshotStore(client=client),
        "client": client,
    }
    try:
        for name in ("kv", "state", "snapshots"):
            await opened[name].initialize()
        yield opened
    finally:
        for name in ("kv", "state", "snapshots"):
            await opened[name].close()


async def test_values_round_trip_exactly(stores: dict[str, Any]) -> None:
    kv: SqlKeyValueStore = stores["kv"]
    state: SqlAgentStateStore = stores["state"]
    snapshots: SqlSnapshotStore = stores["snapshots"]
    ns = ("values",)
    same((await kv.put(ns, "k", VALUE)).value, VALUE)
    item = await kv.get(ns, "k")
    assert item is not None
    same(item.value, VALUE)
    same((await kv.get_many(ns, ["k"]))["k"].value, VALUE)
    same((await kv.search(ns)).items[0].value, VALUE)
    written = await kv.put_if_version(ns, "k", VALUE["m"], 1)
    assert not hasattr(written, "current")
    refreshed = await kv.get(ns, "k")
    assert refreshed is not None
    same(refreshed.value, VALUE["m"])
    await state.save("u", "s", "v", VALUE)
    same(await state.get("u", "s", "v"), VALUE)
    await state.append_list("u", "s", "l", [VALUE, 1, 1.0, "1"])
    await state.append_list("u", "s", "l", [None, VALUE["nested"]])
    same(await state.get_list("u", "s", "l"), [VALUE, 1, 1.0, "1", None, VALUE["nested"]])
    data = bytes(range(256)) * 64 + b"'\"\\\x00\n\r\x1a"
    info = await snapshots.put("scope", "id", data, metadata=VALUE)
    same(info.metadata, VALUE)
    got = await snapshots.get("scope", "id")
    assert got is not None
    assert got.data == data
    same(got.info.metadata, VALUE)


async def server_packet(client: SqlClient) -> int:
    engines = await client.ready()
    async with engines.reader.connect() as conn:
        value = (await conn.execute(text("SELECT @@global.max_allowed_packet"))).scalar_one()
    return int(value)


async def test_mysql_max_allowed_packet_is_a_typed_error(mysql_target: Target) -> None:
    client = SqlClient.shared(mysql_target.url, **mysql_target.options)
    kv = SqlKeyValueStore(client=client, max_value_bytes=256 * MIB)
    state = SqlAgentStateStore(client=client, max_value_bytes=256 * MIB)
    snapshots = SqlSnapshotStore(client=client)
    try:
        for store in (kv, state, snapshots):
            await store.initialize()
        packet = await server_packet(client)
        assert packet < 200 * MIB, "the test server keeps a max_allowed_packet below the limits"
        limit = f"{packet:,}"
        over = "x" * packet
        with pytest.raises(InvalidInputError, match=f"max_allowed_packet of {limit}"):
            await kv.put(("big",), "k", over)
        with pytest.raises(InvalidInputError, match="max_allowed_packet"):
            await kv.put_if_version(("big",), "k", over, None)
        assert await kv.get(("big",), "k") is None
        # Escaping counts: a quote takes two bytes on the wire.
        quotes = "'" * (packet // 2 + 1)
        with pytest.raises(InvalidInputError, match="max_allowed_packet"):
            await kv.put(("big",), "k", quotes)
        with pytest.raises(InvalidInputError, match="max_allowed_packet"):
            await state.save("u", "s", "v", over)
        with pytest.raises(InvalidInputError, match="max_allowed_packet"):
            await state.append_list("u", "s", "l", [1, over])
        assert not await state.exists("u", "s")
        with pytest.raises(
            SnapshotTooLargeError, match=rf"max_allowed_packet of {limit}.*snapshots="
        ):
            await snapshots.put("scope", "big", b"\x00" * (packet // 2 + 1))
        assert await snapshots.get("scope", "big") is None
        # The stores go on working, and what fits goes through whole.
        fits = os.urandom(packet - MIB)
        await snapshots.put("scope", "fits", fits)
        got = await snapshots.get("scope", "fits")
        assert got is not None
        assert got.data == fits
        value = "x" * (packet // 2)
        await kv.put(("big",), "k", value)
        item = await kv.get(("big",), "k")
        assert item is not None
        assert item.value == value
        await state.append_list("u", "s", "l", [value])
        assert await state.get_list("u", "s", "l") == [value]
    finally:
        for store in (kv, state, snapshots):
            await store.close()


async def test_sqlite_takes_values_beyond_a_mysql_packet(sqlite_target: Target) -> None:
    client = SqlClient.shared(sqlite_target.url)
    kv = SqlKeyValueStore(client=client, max_value_bytes=64 * MIB)
    snapshots = SqlSnapshotStore(client=client)
    try:
        value = "'" * (24 * MIB)
        await kv.put(("big",), "k", value)
        item = await kv.get(("big",), "k")
        assert item is not None
        assert item.value == value
        data = os.urandom(40 * MIB)
        await snapshots.put("scope", "big", data)
        got = await snapshots.get("scope", "big")
        assert got is not None
        assert got.data == data
    finally:
        await kv.close()
        await snapshots.close()


async def test_expiry_on_the_store_clock(target: Target) -> None:
    """Without a test clock, reads compare with the server's clock (MariaDB) or the
    process clock (SQLite), the same clock writes stamp with."""
    client = SqlClient.shared(target.url, **target.options)
    kv = SqlKeyValueStore(client=client)
    state = SqlAgentStateStore(client=client, session_ttl=timedelta(milliseconds=50))
    try:
        kept = await kv.put(("clock",), "kept", 1, ttl=timedelta(hours=1))
        await kv.put(("clock",), "gone", 1, ttl=timedelta(milliseconds=50))
        await state.save("u", "s", "k", 1)
        assert kept.expires_at is not None
        assert kept.expires_at - kept.updated_at == timedelta(hours=1)
        for _ in range(500):  # bounded: the 50 ms pass long before
            if await kv.get(("clock",), "gone") is None and not await state.exists("u", "s"):
                break
            await asyncio.sleep(0.01)
        assert await kv.get(("clock",), "gone") is None
        assert await state.get("u", "s", "k") is None
        assert await kv.get(("clock",), "kept") is not None
        assert (await kv.list_keys(("clock",))).items == ["kept"]
        assert await kv.purge_expired() == 1
        assert await state.purge_expired() == 1
    finally:
        await kv.close()
        await state.close()
