"""The enumeration a copy of the runtime stores reads, on SQLite and MariaDB.

Sessions in (user, session) order with the anonymous user first (its stored
key sorts after real user ids below U+001F), each session's keys split into
values and lists, the scopes that hold a live snapshot in code-point order;
expired rows never listed. Names longer than an index head (MariaDB: 3,000
bytes) that share it are ordered by their full bytes. A database of schema
version 1 gains the scope column and index on its first connect. The
statements' plans are checked in ``test_runtime_explain``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pai_storage_sql.client import SqlClient
from pai_storage_sql.schema import SCHEMA_VERSION
from pai_storage_sql.snapshots import SqlSnapshotStore
from pai_storage_sql.state import SqlAgentStateStore
from sqlalchemy import inspect, select, update

from pai_storage import ManualClock
from pai_storage.backend import ENUMERATE

from .conftest import Target

pytestmark = pytest.mark.asyncio

LONG = "\U0001f642" * 800
"""3,200 bytes of UTF-8: longer than an index head on MariaDB."""

NAMES = ["a", "B", "b", "é", "\uffff", "\U0001f600", "\x01low", "a b", "a\x7f"]
"""Names whose code-point order differs from a case-folded, UTF-16 or padded order."""


def code_points(name: str | None) -> tuple[bool, str]:
    return (name is not None, name or "")


async def walk_sessions(store: SqlAgentStateStore, limit: int) -> list[tuple[str | None, str]]:
    found: list[tuple[str | None, str]] = []
    after: tuple[str | None, str] | None = None
    while True:
        page = await store._list_sessions(after, limit)
        assert len(page) <= limit
        found += page
        if len(page) < limit:
            return found
        after = page[-1]


async def walk_scopes(store: SqlSnapshotStore, limit: int) -> list[str]:
    found: list[str] = []
    after: str | None = None
    while True:
        page = await store._list_scopes(after, limit)
        assert len(page) <= limit
        found += page
        if len(page) < limit:
            return found
        after = page[-1]


async def test_both_stores_declare_the_capability(target: Target) -> None:
    assert ENUMERATE in SqlAgentStateStore.capabilities
    assert ENUMERATE in SqlSnapshotStore.capabilities


async def test_sessions_in_order_anonymous_first(target: Target) -> None:
    clock = ManualClock()
    client = SqlClient.shared(target.url, **target.options)
    store = SqlAgentStateStore(client=client, clock=clock, session_ttl=timedelta(hours=1))
    try:
        await store.initialize()
        for user in NAMES[:4]:
            await store.save(user, "gone", "k", 1)  # expires below
        clock.advance(timedelta(minutes=90))
        users: list[str | None] = [None, *NAMES, LONG + "A", LONG + "B"]
        sessions = [*NAMES, LONG + "x", LONG + "y"]
        expected = []
        for user in users:
            for session in sessions[:4] if user not in (None, "a") else sessions:
                await store.save(user, session, "k", 1)
                expected.append((user, session))
        expected.sort(key=lambda pair: (code_points(pair[0]), pair[1]))
        assert expected[0][0] is None
        for limit in (1, 3, 7, 1000):
            assert await walk_sessions(store, limit) == expected
        # Strictly after any position, also one that is not stored.
        for position in [(None, "zz"), ("\x01", "a"), ("a", "a\x00"), ("zzz", "a")]:
            rest = [p for p in expected if (code_points(p[0]), p[1]) > code_points_of(position)]
            assert await store._list_sessions(position, 1000) == rest
        # A deleted or expired session is not listed.
        await store.delete("a", "b")
        assert ("a", "b") not in await walk_sessions(store, 5)
        clock.advance(timedelta(hours=2))
        assert await store._list_sessions(None, 10) == []
    finally:
        await store.close()


def code_points_of(position: tuple[str | None, str]) -> tuple[tuple[bool, str], str]:
    return code_points(position[0]), position[1]


async def test_session_keys_split_and_sorted(target: Target) -> None:
    clock = ManualClock()
    client = SqlClient.shared(target.url, **target.options)
    store = SqlAgentStateStore(client=client, clock=clock, session_ttl=timedelta(hours=1))
    try:
        await store.initialize()
        for user in (None, "u"):
            for key in NAMES:
                await store.save(user, "s", key, key)
                await store.append_list(user, "s", key + "-list", [1, 2])
            values, lists = await store._session_keys(user, "s")
            assert values == sorted(NAMES)
            assert lists == sorted(key + "-list" for key in NAMES)
        assert await store._session_keys("u", "absent") == ([], [])
        assert await store._session_keys("absent", "s") == ([], [])
        clock.advance(timedelta(hours=2))
        assert await store._session_keys("u", "s") == ([], [])
    finally:
        await store.close()


async def test_scopes_in_order_live_only(target: Target) -> None:
    clock = ManualClock()
    client = SqlClient.shared(target.url, **target.options)
    store = SqlSnapshotStore(client=client, clock=clock, snapshot_ttl=timedelta(hours=1))
    try:
        await store.initialize()
        await store.put("expired-only", "x", b"x")
        await store.put("a", "old", b"x")
        clock.advance(timedelta(minutes=90))
        scopes = [*NAMES, LONG + "B", LONG + "A", LONG + "C" * 100, LONG]
        for scope in scopes:
            for i in range(3):
                await store.put(scope, f"id{i}", b"x")
        expected = sorted(scopes)
        for limit in (1, 2, 5, 1000):
            assert await walk_scopes(store, limit) == expected
        for position in ("", "a", "a\x00", LONG + "A", LONG + "Bz", "\U0010ffff"):
            rest = [s for s in expected if s > position]
            assert await store._list_scopes(position, 1000) == rest
        # A scope is listed while one of its snapshots lives.
        for i in range(3):
            await store.delete("b", f"id{i}")
        await store.delete(LONG + "A", "id0")
        listed = await walk_scopes(store, 2)
        assert listed == [s for s in expected if s != "b"]
        clock.advance(timedelta(hours=2))
        assert await store._list_scopes(None, 10) == []
    finally:
        await store.close()


async def test_schema_version_1_gains_the_scope_index(target: Target) -> None:
    client = SqlClient.shared(target.url, **target.options)
    store = SqlSnapshotStore(client=client)
    scopes = ["b", "a", LONG + "B", LONG + "A"]
    try:
        await store.initialize()
        for scope in scopes:
            await store.put(scope, "id", b"x")
        engines = await client.ready()
        table = client.tables.runtime.snapshots
        version = client.tables.version
        # Back to what schema version 1 created: no scope column, no index.
        async with engines.writer.begin() as conn:
            await conn.exec_driver_sql(
                f"DROP INDEX {table.name}_scopes ON {table.name}"
                if target.dialect == "mysql"
                else f"DROP INDEX {table.name}_scopes"
            )
            await conn.exec_driver_sql(f"ALTER TABLE {table.name} DROP COLUMN scope_head")
            await conn.execute(update(version).values(version=1))
    finally:
        await store.close()
        await client.close()

    client = SqlClient.shared(target.url, **target.options)
    store = SqlSnapshotStore(client=client)
    try:
        await store.initialize()
        assert await store._list_scopes(None, 10) == sorted(scopes)
        engines = await client.ready()
        table = client.tables.runtime.snapshots

        def indexes(sync: Any) -> list[str]:
            return [i["name"] for i in inspect(sync).get_indexes(table.name)]

        async with engines.reader.connect() as conn:
            assert f"{table.name}_scopes" in await conn.run_sync(indexes)
            stored = (await conn.execute(select(client.tables.version.c.version))).scalar_one()
        assert stored == SCHEMA_VERSION
        await store.put("c", "id", b"x")
        assert await store._list_scopes("b", 10) == ["c", *sorted(scopes)[2:]]
    finally:
        await store.close()
        await client.close()
