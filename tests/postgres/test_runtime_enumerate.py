"""PostgreSQL enumeration of the agent-state and snapshot stores (``copy --all``).

- the order across the three key ranges of the session table: the anonymous
  user first, then real user ids below its stored key (U+0001...) and above
  it, every session exactly once whatever the page size;
- expired sessions and scopes whose snapshots all expired are never listed;
- a copy of the runtime stores from one PostgreSQL schema to another
  reproduces every session and scope the enumeration lists;
- EXPLAIN of every enumeration statement on filled, analyzed tables (custom
  and generic plans): index scans only, no Seq Scan, no Sort; and, executed,
  a page reads about as many index entries as it returns, never the table.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresAgentStateStore
from pai_storage_postgres.client import SESSION_SETTINGS
from pai_storage_postgres.snapshots import PostgresSnapshotStore
from pai_storage_postgres.snapshots import Statements as SnapshotStatements

from pai_storage import ManualClock, StoreWarning, connect
from pai_storage.backend import ENUMERATE
from pai_storage.state import ANONYMOUS_USER
from pai_storage.transfer import copy_runtime

from .helpers import URL, dsn

pytestmark = pytest.mark.asyncio

NOW = datetime(2030, 1, 1, tzinfo=UTC)
USERS: list[str | None] = ["b", None, "\x01low", "a", " ", "\x1eedge", "\u00e9", "\U0001f600"]
"""User ids on both sides of the anonymous key (U+001F...), in no particular order."""


def _expected_order(pairs: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
    return sorted(pairs, key=lambda p: (p[0] is not None, p[0] or "", p[1]))


async def _walk_sessions(
    store: PostgresAgentStateStore, limit: int
) -> list[tuple[str | None, str]]:
    found: list[tuple[str | None, str]] = []
    after: tuple[str | None, str] | None = None
    while True:
        page = await store._list_sessions(after, limit)
        assert len(page) <= limit
        found += page
        if len(page) < limit:
            return found
        after = page[-1]


@pytest_asyncio.fixture
async def state(clock: ManualClock, pg_schema: str) -> AsyncIterator[PostgresAgentStateStore]:
    async with PostgresAgentStateStore(
        URL, schema=pg_schema, clock=clock, session_ttl=timedelta(hours=1)
    ) as store:
        yield store


@pytest_asyncio.fixture
async def snapshots(clock: ManualClock, pg_schema: str) -> AsyncIterator[PostgresSnapshotStore]:
    async with PostgresSnapshotStore(URL, schema=pg_schema, clock=clock) as store:
        yield store


async def test_both_stores_declare_enumerate() -> None:
    assert ENUMERATE in PostgresAgentStateStore.capabilities
    assert ENUMERATE in PostgresSnapshotStore.capabilities


async def test_sessions_span_the_three_key_ranges_in_order(
    state: PostgresAgentStateStore,
) -> None:
    assert "\x01low" < ANONYMOUS_USER < " "  # the stored anonymous key sits between them
    pairs = [(user, sid) for user in USERS for sid in ("s2", "s10", "s1")]
    for user, sid in pairs:
        await state.save(user, sid, "v", 1)
    expected = _expected_order(pairs)
    assert expected[0] == (None, "s1")
    for limit in (1, 2, 3, 4, 7, len(pairs), len(pairs) + 1, 1000):
        assert await _walk_sessions(state, limit) == expected, limit
    # Strictly after any position, including one in each range.
    for i, position in enumerate(expected):
        assert await state._list_sessions(position, 5) == expected[i + 1 : i + 6]
    # A position that is no stored session resumes at the next one.
    assert await state._list_sessions(("\x01low", "s1~"), 2) == [
        ("\x01low", "s2"),
        ("\x1eedge", "s1"),
    ]
    assert await state._list_sessions((None, "zzz"), 1) == [("\x01low", "s1")]
    assert await state._list_sessions(("\x1eedge", "s3"), 1) == [(" ", "s1")]
    assert await state._list_sessions(("\U0001f600", "s2"), 10) == []


async def test_expired_sessions_are_not_listed(
    state: PostgresAgentStateStore, clock: ManualClock
) -> None:
    for user in (None, "\x01low", "a"):
        await state.save(user, "old", "v", 1)
    clock.advance(timedelta(minutes=40))
    for user in (None, "\x01low", "a"):
        await state.append_list(user, "new", "l", [1])
    clock.advance(timedelta(minutes=30))  # "old" sessions are 70 minutes past their write
    assert await _walk_sessions(state, 2) == [(None, "new"), ("\x01low", "new"), ("a", "new")]
    assert await state._session_keys("a", "old") == ([], [])
    assert await state._session_keys(None, "new") == ([], ["l"])
    clock.advance(timedelta(minutes=31))
    assert await state._list_sessions(None, 10) == []


async def test_session_keys_split_values_and_lists_in_code_point_order(
    state: PostgresAgentStateStore,
) -> None:
    for key in ("b", "\u00e9", "A", "\x01"):
        await state.save(None, "s", key, {"k": key})
    for key in ("z", "B", "\U0001f600"):
        await state.append_list(None, "s", key, [key])
    assert await state._session_keys(None, "s") == (
        ["\x01", "A", "b", "\u00e9"],
        ["B", "z", "\U0001f600"],
    )
    assert await state._session_keys("someone", "s") == ([], [])  # another user's session
    await state.delete_state(None, "s", "B")
    assert (await state._session_keys(None, "s"))[1] == ["z", "\U0001f600"]


async def test_scopes_skip_expired_ones_and_page_by_code_point(
    snapshots: PostgresSnapshotStore, clock: ManualClock
) -> None:
    scopes = ["b", "a", "\u00e9", "\x01", "A", "\U0001f600", "ab"]
    for scope in scopes:
        await snapshots.put(scope, "one", b"x")
        await snapshots.put(scope, "two", b"y")
    short = PostgresSnapshotStore(
        URL, schema=snapshots.tables.schema, clock=clock, snapshot_ttl=timedelta(minutes=5)
    )
    async with short:
        await short.put("a", "brief", b"z")  # "a" also holds a live snapshot
        await short.put("aa", "brief", b"z")  # "aa" holds only this one
        await short.put("zz", "brief", b"z")
        assert await snapshots._list_scopes(None, 100) == sorted([*scopes, "aa", "zz"])
        clock.advance(timedelta(minutes=6))
        assert await snapshots._list_scopes(None, 100) == sorted(scopes)
    expected = sorted(scopes)
    for limit in (1, 2, 3, len(scopes), 50):
        found: list[str] = []
        after = None
        while True:
            page = await snapshots._list_scopes(after, limit)
            assert len(page) <= limit
            found += page
            if len(page) < limit:
                break
            after = page[-1]
        assert found == expected, limit
    assert await snapshots._list_scopes("a", 2) == ["ab", "b"]
    assert await snapshots._list_scopes("\U0001f600", 2) == []
    await snapshots.delete("b", "one")
    await snapshots.delete("b", "two")
    assert "b" not in await snapshots._list_scopes(None, 100)


async def test_a_scope_that_does_not_decode_is_reported_and_skipped(
    pg_schema: str, pg_conn: asyncpg.Connection, clock: ManualClock
) -> None:
    warnings: list[StoreWarning] = []
    async with PostgresSnapshotStore(
        URL, schema=pg_schema, clock=clock, on_warning=warnings.append
    ) as store:
        await store.put("a", "1", b"x")
        await store.put("c", "1", b"x")
        await pg_conn.execute(
            f"""INSERT INTO {store.tables.snapshots} (scope, snapshot_id, created_at,
                size, sha256, metadata, data) VALUES ('\\x62ff', 'x', $1, 1, 'x', '{{}}', 'x')""",
            clock(),
        )
        assert await store._list_scopes(None, 10) == ["a", "c"]
        assert [w.kind for w in warnings] == ["invalid_record"]
        # The page still fills: only a last page is short.
        assert await store._list_scopes(None, 2) == ["a", "c"]
        assert await store._list_scopes("a", 1) == ["c"]


async def test_copy_between_two_schemas_reproduces_what_is_enumerated(
    pg_schema: str, clock: ManualClock
) -> None:
    other = f"{pg_schema}_copy"
    try:
        async with (
            connect(URL, schema=pg_schema, clock=clock) as source,
            connect(URL, schema=other, clock=clock) as target,
        ):
            for user in USERS:
                await source.state.save(user, "s", "v", {"user": user})
                await source.state.save_list(user, "s", "l", [1, 1.0, "\u00e9"])
            for scope in ("\x01", "a", "\U0001f600"):
                await source.snapshots.put(scope, "one", b"\x00data", metadata={"n": 1})
            report = await copy_runtime(source, target)
            assert report.ok
            assert report.count("state") == len(USERS)
            assert report.count("snapshots") == 3
            assert report.verified == len(USERS) + 3
            sessions = await source.state._list_sessions(None, 100)
            assert await target.state._list_sessions(None, 100) == sessions
            for user, sid in sessions:
                keys = await target.state._session_keys(user, sid)
                assert keys == await source.state._session_keys(user, sid) == (["v"], ["l"])
                assert await target.state.get_list(user, sid, "l") == [1, 1.0, "\u00e9"]
            assert await target.snapshots._list_scopes(None, 100) == ["\x01", "a", "\U0001f600"]
            again = await copy_runtime(source, target)
            assert again.copied == []
            assert len(again.present) == len(USERS) + 3
    finally:
        conn = await asyncpg.connect(dsn())
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{other}" CASCADE')
        finally:
            await conn.close()


# ---------------------------------------------------------------- EXPLAIN


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _assert_indexed(conn: asyncpg.Connection, sql: str, args: list[Any], table: str) -> None:
    """Custom and generic plans: no Seq Scan, no Sort, every scan of ``table`` an index scan."""
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
        nodes = list(_nodes(json.loads(raw)[0]["Plan"]))
        kinds = [n["Node Type"] for n in nodes]
        assert not any("Seq Scan" in k or "Sort" in k for k in kinds), (mode, kinds, sql)
        scans = [n for n in nodes if n.get("Relation Name") == table]
        assert scans, (mode, kinds, sql)
        assert all(n["Node Type"] in {"Index Scan", "Index Only Scan"} for n in scans), kinds
    await conn.execute("RESET plan_cache_mode")


async def _rows_read(conn: asyncpg.Connection, sql: str, args: list[Any], table: str) -> int:
    """Index entries the executed statement visited in ``table`` (returned plus filtered)."""
    raw = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
    total = 0
    for node in _nodes(json.loads(raw)[0]["Plan"]):
        if node.get("Relation Name") == table:
            visited = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            total += visited * node["Actual Loops"]
    return int(total)


def _bare(qualified: str) -> str:
    return qualified.rsplit(".", 1)[-1].strip('"')


@pytest_asyncio.fixture
async def filled(pg_schema: str) -> AsyncIterator[tuple[PostgresAgentStateStore, Any]]:
    """20,000 sessions (one in seven expired) of 50 users below and above the
    anonymous key and the anonymous user; 40,000 snapshots in 2,000 scopes."""
    state = PostgresAgentStateStore(URL, schema=pg_schema)
    snaps = PostgresSnapshotStore(URL, schema=pg_schema)
    await state.initialize()
    await snaps.initialize()
    t = state.tables
    conn = await asyncpg.connect(dsn(), server_settings=dict(SESSION_SETTINGS))
    users = (
        "CASE WHEN g % 50 = 0 THEN $1 WHEN g % 5 = 0 THEN E'\\x01u' || (g % 50) "
        "ELSE 'u' || (g % 50) END"
    )
    await conn.execute(
        f"""INSERT INTO {t.state_sessions} (user_key, session_id, expires_at)
        SELECT {users}, 's' || g,
               now() + CASE WHEN g % 7 = 0 THEN interval '-1 day' ELSE interval '1 day' END
        FROM generate_series(1, 20000) g""",
        ANONYMOUS_USER,
    )
    await conn.execute(
        f"""INSERT INTO {t.state_values} (user_key, session_id, key, is_list, value, version)
        SELECT {users}, 's' || g, 'k' || k, false, '1', 1
        FROM generate_series(1, 20000) g, generate_series(1, 3) k""",
        ANONYMOUS_USER,
    )
    await conn.execute(
        f"""INSERT INTO {t.snapshots} (scope, snapshot_id, created_at, expires_at, size,
            sha256, metadata, data)
        SELECT convert_to('scope' || (g % 2000), 'UTF8'), convert_to('id' || g, 'UTF8'),
               now() - g * interval '1 second',
               CASE WHEN g % 3 = 0 THEN NULL ELSE now() + (g % 50 - 10) * interval '1 hour' END,
               1, 'x', '{{}}', '\\x00'
        FROM generate_series(1, 40000) g"""
    )
    for table in (t.state_sessions, t.state_values, t.snapshots):
        await conn.execute(f"ANALYZE {table}")
    yield state, (snaps, conn)
    await conn.close()
    await state.close()
    await snaps.close()


async def test_every_enumeration_statement_is_an_index_scan(
    filled: tuple[PostgresAgentStateStore, Any],
) -> None:
    state, (snaps, conn) = filled
    q = state.sql
    sessions = _bare(state.tables.state_sessions)
    anon = ANONYMOUS_USER
    forms: list[tuple[str, list[Any], str]] = [
        (q.sessions_first, [NOW, anon, 101], sessions),
        (q.sessions, [NOW, anon, "s100", 101], sessions),
        (q.all_below, [NOW, "", "", anon, 101], sessions),
        (q.all_below, [None, "\x01u5", "s105", anon, 101], sessions),
        (q.all_above_first, [NOW, anon, 101], sessions),
        (q.all_above, [None, "u1", "s101", 101], sessions),
        (q.session_keys, [NOW, "u1", "s1"], sessions),
        (q.session_keys, [None, "u1", "s1"], _bare(state.tables.state_values)),
    ]
    table = _bare(snaps.tables.snapshots)
    sql = SnapshotStatements(snaps.tables.snapshots)
    forms += [(sql.scopes, [NOW, b"", 100], table), (sql.scopes, [None, b"scope7", 100], table)]
    for statement, args, name in forms:
        await _assert_indexed(conn, statement, args, name)


async def test_a_page_reads_about_what_it_returns(
    filled: tuple[PostgresAgentStateStore, Any],
) -> None:
    state, (snaps, conn) = filled
    q = state.sql
    sessions = _bare(state.tables.state_sessions)
    anon = ANONYMOUS_USER
    # 101 live sessions plus the expired ones among them (one in seven).
    for statement, args in [
        (q.sessions_first, [None, anon, 101]),
        (q.all_below, [None, "", "", anon, 101]),
        (q.all_above_first, [None, anon, 101]),
        (q.all_above, [None, "u1", "s101", 101]),
    ]:
        read = await _rows_read(conn, statement, args, sessions)
        assert 101 <= read <= 150, (read, statement)
    keys = await _rows_read(
        conn, q.session_keys, [None, "u1", "s1"], _bare(state.tables.state_values)
    )
    assert keys == 3
    # 100 of 2,000 scopes (20 snapshots each): one probe per scope, a few rows
    # each (expired rows ahead of the first live one), never a scope's every row.
    table = _bare(snaps.tables.snapshots)
    sql = SnapshotStatements(snaps.tables.snapshots)
    for start in (b"", b"scope7"):
        read = await _rows_read(conn, sql.scopes, [None, start, 100], table)
        assert 100 <= read <= 400, (read, start)
    assert len(await snaps._list_scopes(None, 100)) == 100
    page = await state._list_sessions(None, 300)
    assert len(page) == 300
    assert page[0][0] is None
