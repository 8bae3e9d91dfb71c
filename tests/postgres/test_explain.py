"""Every list form and child page is an index range scan with no Sort node.

The tables are filled in bulk (SQL, for speed) with a realistic spread of
agents, visibilities, parents, categories and a thread holding 10,000
messages, analyzed, and then the store's own statements are explained with
both custom and generic plans (asyncpg reuses prepared statements, so
PostgreSQL switches to a generic plan after five executions).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.store import (
    SESSION_SETTINGS,
    by_keys,
    open_runs_statement,
    tail_statement,
)

from .helpers import URL

SCOPE = b"explain-scope"
INDEX_SCANS = {"Index Scan", "Index Only Scan"}


@pytest_asyncio.fixture
async def filled(pg_schema: str) -> AsyncIterator[tuple[PostgresThreadStore, asyncpg.Connection]]:
    store = PostgresThreadStore(URL, schema=pg_schema)
    await store.initialize()
    t = store.tables
    conn = await asyncpg.connect(
        store.url.render(hide_password=False, scheme="postgresql"),
        server_settings=dict(SESSION_SETTINGS),  # what the store's pool sets
    )
    await conn.execute(
        f"""INSERT INTO {t.threads} (scope_key, thread_id, instance_id, revision, agent,
            list_visibility, parent_thread_id, category, updated_at, sort_key, doc)
        SELECT CASE WHEN g % 4 = 0 THEN convert_to('other' || (g % 40), 'UTF8')
                    ELSE $1::bytea END,
               convert_to('t' || g, 'UTF8'), 'x', 1, convert_to('agent' || (g % 5), 'UTF8'),
               CASE WHEN g % 6 = 0 THEN 'hidden' ELSE 'visible' END,
               CASE WHEN g % 3 = 0 THEN convert_to('p' || (g % 40), 'UTF8') END,
               CASE WHEN g % 7 = 0 THEN convert_to('c' || (g % 9), 'UTF8') END,
               now(), -1700000000000 - g * 1000, '{{}}'
        FROM generate_series(1, 40000) g""",
        SCOPE,
    )
    await conn.execute(
        f"""INSERT INTO {t.messages} (scope_key, thread_id, position, message_id, run_id,
            relation, transcript, context, doc)
        SELECT $1::bytea, convert_to('t' || (g / 10000), 'UTF8'), g % 10000 + 1,
               convert_to('m' || g, 'UTF8'),
               convert_to('r' || (g / 2), 'UTF8'), 'output', g % 3 <> 0, g % 5 <> 0, '{{}}'
        FROM generate_series(0, 59999) g""",
        SCOPE,
    )
    await conn.execute(
        f"""INSERT INTO {t.runs} (scope_key, thread_id, position, run_id, status, doc)
        SELECT $1::bytea, convert_to('t' || (g / 5000), 'UTF8'), g % 5000 + 1,
               convert_to('r' || g, 'UTF8'),
               (ARRAY['completed','failed','cancelled','queued','running','waiting'])[g % 6 + 1],
               '{{}}'
        FROM generate_series(0, 29999) g""",
        SCOPE,
    )
    await conn.execute(
        f"""INSERT INTO {t.queued} (scope_key, thread_id, position, queue_item_id, run_id, doc)
        SELECT $1::bytea, convert_to('t' || (g / 2000), 'UTF8'), g % 2000 + 1,
               convert_to('q' || g, 'UTF8'), convert_to('r' || (g % 300), 'UTF8'), '{{}}'
        FROM generate_series(0, 11999) g""",
        SCOPE,
    )
    for table in (t.threads, t.messages, t.runs, t.queued):
        await conn.execute(f"ANALYZE {table}")
    try:
        yield store, conn
    finally:
        await conn.close()
        await store.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def _check_plan(conn: asyncpg.Connection, sql: str, args: list[Any]) -> None:
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
        plan = json.loads(raw)[0]["Plan"]
        types = [n["Node Type"] for n in _nodes(plan)]
        scans = [n for n in _nodes(plan) if "Relation Name" in n]
        assert "Sort" not in types, (mode, sql, types)
        assert "Incremental Sort" not in types, (mode, sql, types)
        assert scans, (mode, sql, types)
        assert all(n["Node Type"] in INDEX_SCANS for n in scans), (mode, sql, types)
        # A range scan: the scope/thread key is an index condition, not a filter.
        assert all("scope_key" in n.get("Index Cond", "") for n in scans), (mode, sql, plan)
    await conn.execute("RESET plan_cache_mode")


LIST_FORMS = list(itertools.product((False, True), repeat=5))


@pytest.mark.asyncio
async def test_every_list_form_is_an_index_range_scan(
    filled: tuple[PostgresThreadStore, asyncpg.Connection],
) -> None:
    store, conn = filled
    for agent, parent, category, hidden, cursor in LIST_FORMS:
        sql = store.list_statement(agent, parent, category, "all" if hidden else "visible", cursor)
        args: list[Any] = [SCOPE, 21]
        if agent:
            args.append(b"agent3")
        if parent:
            args.append(b"p3")
        if category:
            args.append(b"c3")
        if cursor:
            args.extend([-1700000000000 - 5000 * 1000, b"t5000"])
        await _check_plan(conn, sql, args)


@pytest.mark.asyncio
@pytest.mark.parametrize("view", ["raw", "transcript", "context"])
@pytest.mark.parametrize("order", ["oldest", "newest"])
async def test_message_pages_are_index_range_scans(
    filled: tuple[PostgresThreadStore, asyncpg.Connection], view: str, order: str
) -> None:
    store, conn = filled
    sql = store.page_statement("messages", order, view)
    for lower, upper in ((0, 10001), (5000, 10001), (0, 200)):
        await _check_plan(conn, sql, [SCOPE, b"t1", lower, upper, 21])


@pytest.mark.asyncio
@pytest.mark.parametrize("order", ["oldest", "newest"])
async def test_run_and_queued_pages_are_index_range_scans(
    filled: tuple[PostgresThreadStore, asyncpg.Connection], order: str
) -> None:
    store, conn = filled
    page = [SCOPE, b"t1", 0, 5001, 21]
    await _check_plan(conn, store.page_statement("runs", order), page)
    await _check_plan(conn, store.page_statement("runs", order, statuses=1), [*page, "running"])
    await _check_plan(
        conn, store.page_statement("runs", order, statuses=2), [*page, "running", "waiting"]
    )
    await _check_plan(conn, store.page_statement("queuedItems", order), page)
    await _check_plan(
        conn, store.page_statement("queuedItems", order, run_filter=True), [*page, b"r7"]
    )


@pytest.mark.asyncio
async def test_commit_lookups_probe_one_key_at_a_time(
    filled: tuple[PostgresThreadStore, asyncpg.Connection],
) -> None:
    """The rows a commit loads by id, and its relationship queries, never walk a thread."""
    store, conn = filled
    t = store.tables
    thread = [SCOPE, b"t1"]
    await _check_plan(
        conn, by_keys(t.messages, "message_id", "t.position, t.doc"), [*thread, [b"m9"]]
    )
    await _check_plan(conn, by_keys(t.runs, "run_id", "t.run_id, t.doc"), [*thread, [b"r1", b"r2"]])
    await _check_plan(
        conn, by_keys(t.messages, "run_id", "t.run_id, t.position"), [*thread, [b"r5"]]
    )
    await _check_plan(conn, by_keys(t.queued, "run_id", "t.run_id, t.position"), [*thread, [b"r7"]])
    await _check_plan(conn, open_runs_statement(t), thread)
    await _check_plan(conn, tail_statement(t), thread)
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        raw = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + by_keys(t.messages, "message_id", "t.position, t.doc"),
            *thread,
            [b"m9"],
        )
        scans = [n for n in _nodes(json.loads(raw)[0]["Plan"]) if "Relation Name" in n]
        assert all("message_id = k.id" in n.get("Index Cond", "") for n in scans), scans
    await conn.execute("RESET plan_cache_mode")
