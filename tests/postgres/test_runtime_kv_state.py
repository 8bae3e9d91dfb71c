"""PostgreSQL key-value and agent-state stores: plans, the shared pool, client=, schema versions.

Every query form of both stores is explained (custom and generic plans)
against filled tables: no Seq Scan, no Sort node, no LIKE. One ``connect()``
shares one pool; an application's pool passed as ``client=`` is used and never
closed; a version-1 database is migrated to version 2 in place; a newer
version is refused.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import (
    SCHEMA_VERSION,
    PgClient,
    PostgresAgentStateStore,
    PostgresKeyValueStore,
    PostgresThreadStore,
    backend,
)
from pai_storage_postgres.client import SESSION_SETTINGS

from pai_storage import ConfigurationError, make_url
from pai_storage.backend import namespace_path, prefix_upper_bound

from .helpers import URL, dsn

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _explain(conn: asyncpg.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Every plan node of ``sql`` with a custom plan and with a generic plan."""
    out = []
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
        out += list(_nodes(json.loads(raw)[0]["Plan"]))
    return out


def _assert_indexed(nodes: list[dict[str, Any]], sql: str) -> None:
    types = {n["Node Type"] for n in nodes}
    assert "Seq Scan" not in types, f"sequential scan in {sql}"
    assert "Sort" not in types, f"sort in {sql}"
    assert "Incremental Sort" not in types, f"sort in {sql}"
    assert "LIKE" not in sql.upper()
    assert "~~" not in json.dumps(nodes)


@pytest_asyncio.fixture
async def filled(
    pg_schema: str,
) -> AsyncIterator[tuple[PostgresKeyValueStore, PostgresAgentStateStore, asyncpg.Connection]]:
    stores = backend.open_components(make_url(URL), ["kv", "state"], schema=pg_schema)
    kv = stores["kv"]
    state = stores["state"]
    assert isinstance(kv, PostgresKeyValueStore)
    assert isinstance(state, PostgresAgentStateStore)
    await kv.initialize()
    await state.initialize()
    conn = await asyncpg.connect(dsn(), server_settings=dict(SESSION_SETTINGS))
    t = kv.tables
    await conn.execute(
        f"""INSERT INTO {t.kv} (ns, key, value, version, created_at, updated_at, expires_at)
        SELECT 'ns' || (g % 200) || E'\\x1f' || 'sub' || (g % 7) || E'\\x1f', 'k' || g, '1', 1,
               now(), now(), CASE WHEN g % 5 = 0 THEN now() - interval '1 day' END
        FROM generate_series(1, 50000) g"""
    )
    await conn.execute(
        f"""INSERT INTO {t.state_sessions} (user_key, session_id, expires_at)
        SELECT 'u' || (g % 50), 's' || g, now() + interval '1 day'
        FROM generate_series(1, 20000) g"""
    )
    await conn.execute(
        f"""INSERT INTO {t.state_values} (user_key, session_id, key, is_list, length, hash)
        SELECT 'u' || (g % 50), 's' || g, 'history', true, 10, 'h'
        FROM generate_series(1, 20000) g"""
    )
    await conn.execute(
        f"""INSERT INTO {t.state_items} (user_key, session_id, key, position, value)
        SELECT 'u' || (s % 50), 's' || s, 'history', p, '1'
        FROM generate_series(1, 20000) s, generate_series(0, 9) p"""
    )
    for table in (t.kv, t.state_sessions, t.state_values, t.state_items):
        await conn.execute(f"ANALYZE {table}")
    yield kv, state, conn
    await conn.close()
    await kv.close()
    await state.close()


async def test_every_kv_query_is_an_index_range_scan(
    filled: tuple[PostgresKeyValueStore, PostgresAgentStateStore, asyncpg.Connection],
) -> None:
    kv, _, conn = filled
    q = kv.sql
    ns = namespace_path(("ns1", "sub1"))
    low = namespace_path(("ns1",))
    forms: list[tuple[str, list[Any]]] = [
        (q.get_many, [NOW, ns, ["k1", "k8"]]),
        (q.refresh, [NOW, ns, "k1"]),
        (q.put, [NOW, ns, "k1", "2", 1000]),
        (q.create, [NOW, ns, "k1", "2", None]),
        (q.update, [NOW, ns, "k1", "2", None, 3]),
        (q.delete, [NOW, ns, "k1", None]),
        (q.purge, [NOW]),
    ]
    for high in (prefix_upper_bound(low), None):
        for keys in (("k1", prefix_upper_bound("k1")), None):
            for after in ((ns, "k10"), None):
                sql, args = q.search(low if high else "", high, keys, after, 101)
                forms.append((sql, [NOW, *args]))
    for prefix in ("k1", None):
        for after in ("k10", None):
            high = prefix_upper_bound(prefix) if prefix else None
            sql, args = q.keys(ns, prefix, high, after, 1001)
            forms.append((sql, [NOW, *args]))
    for depth in (1, None):
        for bounded in (True, False):
            sql, args = q.namespaces(
                low if bounded else "", prefix_upper_bound(low) if bounded else None, depth, 101
            )
            forms.append((sql, [NOW, *args]))
    for sql, args in forms:
        _assert_indexed(await _explain(conn, sql, *args), sql)


async def test_every_state_query_is_an_index_scan(
    filled: tuple[PostgresKeyValueStore, PostgresAgentStateStore, asyncpg.Connection],
) -> None:
    _, state, conn = filled
    q = state.sql
    forms: list[tuple[str, list[Any]]] = [
        (q.touch, [NOW, "u1", "s1", 1000]),
        (q.clear, ["u1", "s1"]),
        (q.kind, ["u1", "s1", "history"]),
        (q.save_any, ["u1", "s1", "v", "1"]),
        (q.save_new, ["u1", "s1", "v", "1"]),
        (q.save_at, ["u1", "s1", "v", "1", 2]),
        (q.list_new, ["u1", "s1", "l", 1, "h"]),
        (q.list_at, ["u1", "s1", "history", 11, "h2", 10, "h"]),
        (q.items_clear, ["u1", "s1", "history"]),
        (q.items_add, ["u1", "s1", "history", 10, ["1", "2"]]),
        (q.get, [NOW, "u1", "s1", "history"]),
        (q.get_list, [NOW, "u1", "s1", "history"]),
        (q.exists, [NOW, "u1", "s1"]),
        (q.delete, [NOW, "u1", "s1"]),
        (q.lock, [NOW, "u1", "s1"]),
        (q.delete_key, ["u1", "s1", "history"]),
        (q.drop_empty, ["u1", "s1"]),
        (q.refresh, [NOW, "u1", "s1", 1000]),
        (q.sessions, [NOW, "u1", "s100", 101]),
        (q.sessions_first, [NOW, "u1", 101]),
        (q.purge, [NOW]),
    ]
    for sql, args in forms:
        _assert_indexed(await _explain(conn, sql, *args), sql)


async def test_connect_shares_one_pool_among_components(pg_schema: str) -> None:
    stores = backend.open_components(make_url(URL), ["threads", "kv", "state"], schema=pg_schema)
    clients = {id(s._client) for s in stores.values()}  # type: ignore[attr-defined]
    assert len(clients) == 1
    client: PgClient = stores["kv"]._client  # type: ignore[attr-defined]
    for store in stores.values():
        await store.initialize()
    pool = await client.pool()
    await stores["kv"].close()  # type: ignore[union-attr]
    assert not client.closed  # the others still use it
    assert not pool._closed
    await stores["state"].close()
    assert not pool._closed
    await stores["threads"].close()
    assert client.closed  # the last user closed the pool it created
    assert pool._closed


async def test_application_pool_is_used_and_never_closed(pg_schema: str) -> None:
    pool = await asyncpg.create_pool(dsn(), min_size=1, max_size=4)
    try:
        stores = backend.open_components(
            make_url(URL), ["kv", "state"], client=pool, schema=pg_schema
        )
        kv, state = stores["kv"], stores["state"]
        assert isinstance(kv, PostgresKeyValueStore)
        assert isinstance(state, PostgresAgentStateStore)
        await kv.put(("app",), "k", {"a": 1})
        assert await state.append_list("u", "s", "l", [1, 2]) == 2
        await kv.close()
        await state.close()
        assert not pool._closed
        assert await pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".pai_kv') == 1
    finally:
        await pool.close()


async def test_client_must_be_a_pool() -> None:
    with pytest.raises(ConfigurationError) as caught:
        PostgresKeyValueStore(URL, client="not a pool")
    assert "asyncpg.Pool" in str(caught.value)


async def test_version_1_database_gains_the_runtime_tables(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema):
        pass
    # Make it the version-1 layout: the thread tables only.
    for table in (
        "pai_kv",
        "pai_agent_sessions_items",
        "pai_agent_sessions_values",
        "pai_agent_sessions",
        "pai_snapshots",
        "pai_locks",
    ):
        await pg_conn.execute(f'DROP TABLE IF EXISTS "{pg_schema}".{table} CASCADE')
    await pg_conn.execute(f'UPDATE "{pg_schema}".pai_threads_schema SET version = 1')
    async with PostgresKeyValueStore(URL, schema=pg_schema) as kv:
        item = await kv.put(("a",), "k", [1.0, 2])
        assert item.version == 1
    # Migrated to the current version (2 added the runtime tables) by a runtime store.
    assert (
        await pg_conn.fetchval(f'SELECT version FROM "{pg_schema}".pai_threads_schema')
        == SCHEMA_VERSION
    )
    assert SCHEMA_VERSION == 4
    assert await pg_conn.fetchval(f"SELECT to_regclass('\"{pg_schema}\".pai_agent_sessions')")


async def test_newer_schema_is_refused_by_runtime_stores(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresKeyValueStore(URL, schema=pg_schema):
        pass
    await pg_conn.execute(
        f'UPDATE "{pg_schema}".pai_threads_schema SET version = $1', SCHEMA_VERSION + 1
    )
    state = PostgresAgentStateStore(URL, schema=pg_schema)
    with pytest.raises(ConfigurationError) as caught:
        await state.get("u", "s", "k")
    assert "newer" in str(caught.value)
    assert str(SCHEMA_VERSION + 1) in str(caught.value)
    await state.close()


async def test_names_option_renames_one_component(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    stores = backend.open_components(make_url(URL), ["kv"], schema=pg_schema, names={"kv": "my_kv"})
    kv = stores["kv"]
    assert isinstance(kv, PostgresKeyValueStore)
    async with kv:
        await kv.put(("n",), "k", "v")
    assert await pg_conn.fetchval(f'SELECT count(*) FROM "{pg_schema}".my_kv') == 1
    with pytest.raises(ConfigurationError) as caught:
        backend.open_components(make_url(URL), ["kv"], names={"kvv": "x"})
    assert "kvv" in str(caught.value)


async def test_json_escapes_and_key_order_round_trip(pg_schema: str) -> None:
    async with PostgresKeyValueStore(URL, schema=pg_schema) as kv:
        value = {"z": "nul \u0000 here", "a": 1.0, "big": 2**63 - 1}
        await kv.put(("ns",), "k", value)
        item = await kv.get(("ns",), "k")
        assert item is not None
        assert json.dumps(item.value) == json.dumps(value)
