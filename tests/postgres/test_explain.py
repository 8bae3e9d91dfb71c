"""Every list form, child page and lifecycle statement is an index range scan with no Sort node.

The tables are filled in bulk (SQL, for speed) with a realistic spread of
agents, visibilities, parents, categories and a thread holding 10,000
messages, analyzed, and then the store's own statements are explained with
both custom and generic plans (asyncpg reuses prepared statements, so
PostgreSQL switches to a generic plan after five executions). The generic plan
of a statement is explained as a prepared statement runs it, ``PREPARE`` and
``EXPLAIN EXECUTE`` under ``plan_cache_mode = force_generic_plan``
(:func:`_custom_and_generic`): an ``EXPLAIN`` given parameter values is
planned with those values.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.statements import (
    hold_statement,
    open_runs_and_tail_statement,
    write_statement,
)
from pai_storage_postgres.store import (
    SESSION_SETTINGS,
    by_keys,
    fork_statements,
    head_statement,
    heads_statement,
    open_runs_statement,
    tail_statement,
    whole_family_statement,
)

from pai_storage.backend import FamilyName

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
               to_timestamp(1700000000 + g), -1700000000000 - g * 1000, '{{}}'
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


def _literal(value: Any) -> str:
    """``value`` as an SQL literal (for ``EXECUTE``, which takes no parameters)."""
    if isinstance(value, list):
        return f"ARRAY[{', '.join(_literal(v) for v in value)}]"
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'::timestamptz"
    if isinstance(value, bytes):
        return f"'\\x{value.hex()}'::bytea"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(int(value))


async def _custom_and_generic(
    conn: asyncpg.Connection, sql: str, args: list[Any]
) -> list[dict[str, Any]]:
    """The custom plan of ``sql`` and its generic plan, the one a prepared
    statement switches to (``PREPARE`` + ``EXPLAIN EXECUTE``: parameters stay
    ``$n`` in it)."""
    raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    plans = [json.loads(raw)[0]["Plan"]]
    await conn.execute(f"PREPARE explained AS {sql}")
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        values = ", ".join(_literal(a) for a in args)
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE explained({values})")
        generic = json.loads(raw)[0]["Plan"]
        conds = [n["Index Cond"] for n in _nodes(generic) if "Index Cond" in n]
        assert not conds or any("$" in c for c in conds), generic  # really generic
        plans.append(generic)
    finally:
        await conn.execute("RESET plan_cache_mode")
        await conn.execute("DEALLOCATE explained")
    return plans


async def _check_plan(conn: asyncpg.Connection, sql: str, args: list[Any]) -> None:
    for plan in await _plans(conn, sql, args):
        types = [n["Node Type"] for n in _nodes(plan)]
        scans = [n for n in _nodes(plan) if "Relation Name" in n]
        assert "Sort" not in types, (sql, types)
        assert "Incremental Sort" not in types, (sql, types)
        assert scans, (sql, types)
        assert all(n["Node Type"] in INDEX_SCANS for n in scans), (sql, types)
        # A range scan: the scope/thread key is an index condition, not a filter.
        assert all("scope_key" in n.get("Index Cond", "") for n in scans), (sql, plan)


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
    await _check_plan(conn, open_runs_statement(t.runs), thread)
    await _check_plan(conn, tail_statement(t.messages), thread)
    await _check_plan(conn, open_runs_and_tail_statement(t.runs, t.messages), thread)
    sql = by_keys(t.messages, "message_id", "t.position, t.doc")
    for plan in await _custom_and_generic(conn, sql, [*thread, [b"m9"]]):
        scans = [n for n in _nodes(plan) if "Relation Name" in n]
        assert all("message_id = k.id" in n.get("Index Cond", "") for n in scans), scans


@pytest.mark.asyncio
async def test_a_commits_hold_and_write_probe_one_key_at_a_time(
    filled: tuple[PostgresThreadStore, asyncpg.Connection],
) -> None:
    """The hold finds the root by its primary key and each named row by its id; the
    write updates the root by its primary key and each replaced row by its key: a
    commit never walks a scope or a thread, custom or generic plan."""
    store, conn = filled
    t = store.tables
    families = store._layout.families
    loads = tuple((name, table.table, table.id_col) for name, table in families.items())
    hold = hold_statement(t.threads, loads)
    write = write_statement(
        t.threads,
        ((families["messages"], False), (families["runs"], True), (families["queuedItems"], False)),
        True,
    )
    now = datetime(2030, 1, 1, tzinfo=UTC)
    root = [2, "visible", None, now, -1, 10, 3, 1, "{}", None, "chan", "{}"]
    message = [[10_001], [b"m-new"], [b"r2"], ["output"], [True], [True], ["{}"]]
    run = [[2], [b"r2"], ["completed"], ["{}"]]
    item = [[1], [b"q-new"], [b"r3"], ["{}"]]
    cases = (
        (hold, [SCOPE, b"t1", [b"m9"], [b"r1", b"r2"], [b"q1"]]),
        (write, [SCOPE, b"t1", *root, *message, *run, *item]),
    )
    for sql, args in cases:
        for plan in await _custom_and_generic(conn, sql, args):
            nodes = list(_nodes(plan))
            types = [n["Node Type"] for n in nodes]
            assert not {"Sort", "Seq Scan", "Bitmap Heap Scan"} & set(types), (sql, types)
            scans = [n for n in nodes if "Relation Name" in n and n["Node Type"] != "ModifyTable"]
            assert scans, (sql, types)
            for scan in scans:
                assert scan["Node Type"] in INDEX_SCANS, (sql, types)
                cond = scan.get("Index Cond", "")
                # The whole key is an index condition, never a filter over a range.
                assert "scope_key =" in cond, (sql, scan)
                assert "thread_id =" in cond, (sql, scan)
                if scan["Relation Name"] == t.threads.rsplit(".", 1)[-1].strip('"'):
                    assert scan["Index Name"].endswith("_pkey"), (sql, scan)
                else:
                    # One probe per key: a named id, or a replaced row (by id or position).
                    assert re.search(r"= [ku](_\d+)?\.(id|position)\)", cond), (sql, scan)


async def _plans(conn: asyncpg.Connection, sql: str, args: list[Any]) -> list[dict[str, Any]]:
    """The plans of ``sql`` explained with its parameters under both plan cache modes."""
    plans = []
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
        plans.append(json.loads(raw)[0]["Plan"])
    await conn.execute("RESET plan_cache_mode")
    return plans


HEAD_FORMS = list(itertools.product((False, True), repeat=3))


@pytest.mark.asyncio
async def test_every_thread_heads_form_is_an_updated_at_index_scan(
    filled: tuple[PostgresThreadStore, asyncpg.Connection],
) -> None:
    """The sweep's index walk: one range of the scope's or the global updated-at index,
    read in index order (no Sort) up to its LIMIT; the start is an index bound.

    One scope of many (1,000 of the 40,000 threads) is a range of the scope's index:
    walking the global one would step over every other scope's threads.
    """
    store, conn = filled
    threads = store.tables.threads
    assert (
        await conn.fetchval(f"SELECT count(*) FROM {threads} WHERE scope_key = 'other4'::bytea")
        == 1000
    )
    for scoped, before, after in HEAD_FORMS:
        sql = heads_statement(threads, scoped, before, after)
        args: list[Any] = [100]
        if scoped:
            args.append(b"other4")
        if before:
            args.append(datetime.fromtimestamp(1700030000, UTC))
        if after:
            args.append(datetime.fromtimestamp(1700020000, UTC))
            if not scoped:
                args.append(b"other4")
            args.append(b"t20004")
        index = f"{store.tables.prefix}_{'scope_updated' if scoped else 'updated'}"
        # One scope's walk is always planned for its scope (the store forces a
        # custom plan); every scope's walk may run on the prepared generic plan.
        plans = await _custom_and_generic(conn, sql, args)
        for plan in plans[:1] if scoped else plans:
            nodes = list(_nodes(plan))
            types = [n["Node Type"] for n in nodes]
            assert types[0] == "Limit", (sql, types)
            assert "Sort" not in types, (sql, types)
            assert "Incremental Sort" not in types, (sql, types)
            scans = [n for n in nodes if "Relation Name" in n]
            assert len(scans) == 1, (sql, types)
            assert scans[0]["Node Type"] in INDEX_SCANS, (sql, types)
            assert scans[0]["Index Name"] == index, (sql, scans)
            cond = scans[0].get("Index Cond", "")
            if scoped:
                assert "scope_key =" in cond, (sql, cond)
            if before:
                assert "updated_at <" in cond, (sql, cond)
            if after:
                assert "ROW(" in cond, (sql, cond)
                assert "thread_id" in cond, (sql, cond)


@pytest.mark.asyncio
async def test_load_and_fork_statements_are_index_range_scans(
    filled: tuple[PostgresThreadStore, asyncpg.Connection],
) -> None:
    """A whole-thread load reads each family by primary-key range; a fork holds the source
    root by key and copies each family with ``INSERT ... SELECT`` over one thread's range
    of its primary key (the messages' range bounded by the cut's position)."""
    store, conn = filled
    t = store.tables
    thread = [SCOPE, b"t1"]
    for table in (t.messages, t.runs, t.queued):
        await _check_plan(conn, whole_family_statement(table), thread)
    sql = fork_statements(t)
    await _check_plan(conn, sql.hold, thread)
    await _check_plan(conn, sql.cut, [*thread, b"m10500"])
    copies = (
        (sql.copy_messages, [*thread, b"fork", 600, [b"r5001", b"r5002"]]),
        (sql.copy_runs, [*thread, b"fork", [b"r5001", b"r5002"]]),
    )
    for statement, args in copies:
        assert statement.startswith("INSERT INTO")
        assert " SELECT " in statement
        for plan in await _custom_and_generic(conn, statement, args):
            nodes = list(_nodes(plan))
            assert plan["Node Type"] == "ModifyTable", plan
            types = [n["Node Type"] for n in nodes]
            assert "Sort" not in types, (statement, types)
            scans = [n for n in nodes[1:] if "Relation Name" in n]
            assert len(scans) == 1, (statement, types)
            # Rows are copied in any order: a bitmap over the same index range will do.
            assert scans[0]["Node Type"] in {*INDEX_SCANS, "Bitmap Heap Scan"}, types
            conds = [n["Index Cond"] for n in nodes[1:] if "Index Cond" in n]
            assert len(conds) == 1, (statement, types)
            cond = conds[0]
            assert "scope_key =" in cond, (statement, cond)
            assert "thread_id =" in cond, (statement, cond)
            if statement == sql.copy_messages:
                assert '"position" <=' in cond, (statement, cond)


HEAD_PAGE_FORMS: list[tuple[FamilyName, str | None, bool, int, list[Any]]] = [
    *[("messages", view, False, 0, []) for view in ("raw", "transcript", "context")],
    ("runs", None, False, 0, []),
    ("runs", None, False, 1, ["running"]),
    ("queuedItems", None, False, 0, []),
    ("queuedItems", None, True, 0, [b"r7"]),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("order", ["oldest", "newest"])
@pytest.mark.parametrize(("family", "view", "run_filter", "statuses", "extra"), HEAD_PAGE_FORMS)
async def test_root_and_page_statement_is_a_key_probe_and_one_range_scan(
    filled: tuple[PostgresThreadStore, asyncpg.Connection],
    order: str,
    family: FamilyName,
    view: str | None,
    run_filter: bool,
    statuses: int,
    extra: list[Any],
) -> None:
    """The one-statement read of the root and a page: the root by its primary key,
    the page one bounded index range scan in page order under a ``Limit``, its
    upper bound both the window's and the root's counter (no Sort, no Seq Scan)."""
    store, conn = filled
    t = store.tables
    sql = store.head_page_statement(family, order, view, run_filter, statuses)
    assert head_statement(t.threads) in sql
    counter = {"messages": "messages_next", "runs": "runs_next", "queuedItems": "queued_next"}
    tables = {"messages": t.messages, "runs": t.runs, "queuedItems": t.queued}
    page_table = tables[family].rsplit(".", 1)[-1].strip('"')
    threads_table = t.threads.rsplit(".", 1)[-1].strip('"')
    for first, upper in ((True, 2**63 - 1), (False, 200)):
        args: list[Any] = [SCOPE, b"t1", 0 if first else 100, upper, 21, *extra]
        for plan in await _custom_and_generic(conn, sql, args):
            nodes = list(_nodes(plan))
            types = [n["Node Type"] for n in nodes]
            assert not {"Sort", "Incremental Sort", "Seq Scan", "Bitmap Heap Scan"} & set(types)
            scans = {n["Relation Name"]: n for n in nodes if "Relation Name" in n}
            assert set(scans) == {threads_table, page_table}, types
            root = scans[threads_table]
            assert root["Node Type"] == "Index Scan", root
            assert root["Index Name"] == f"{threads_table}_pkey", root
            assert "scope_key =" in root["Index Cond"], root
            assert "thread_id =" in root["Index Cond"], root
            page = scans[page_table]
            assert page["Node Type"] in INDEX_SCANS, page
            assert page["Scan Direction"] == ("Forward" if order == "oldest" else "Backward")
            cond = page["Index Cond"]
            assert "scope_key =" in cond, cond
            assert "thread_id =" in cond, cond
            assert '"position" >' in cond, cond
            assert f".{counter[family]})" in cond, cond  # the root's counter bounds the scan
            limits = [n for n in nodes if n["Node Type"] == "Limit"]
            assert len(limits) == 1, types
            assert page in list(_nodes(limits[0])), types
