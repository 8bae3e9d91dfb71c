"""Every statement the four runtime stores run is an index lookup or a bounded index range.

A workload drives every operation of the key-value store, the agent-state
store, the snapshot store and the execution guard (pages, prefixes, conditional
writes, expiry, purges) over enough rows that a table scan would show; every
``SELECT``/``UPDATE``/``DELETE`` sent is recorded and then explained on the
same database. SQLite (``EXPLAIN QUERY PLAN``): a ``SEARCH`` through an index
or the primary key, never a ``SCAN`` of a table nor a temporary b-tree for
``ORDER BY``. MariaDB (``EXPLAIN``): access ``const``/``eq_ref``/``ref``/
``range`` through a named key, never ``ALL`` or a full ``index`` walk, never a
filesort or temporary table, so a ``LIMIT`` stops the scan.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from pai_storage_sql.client import SqlClient
from pai_storage_sql.guard import SqlExecutionGuard
from pai_storage_sql.kv import SqlKeyValueStore
from pai_storage_sql.snapshots import SqlSnapshotStore
from pai_storage_sql.state import SqlAgentStateStore
from sqlalchemy import event

from pai_storage import ManualClock

from .conftest import Target

pytestmark = pytest.mark.asyncio

LONG = "\U0001f642" * 900
"""3,600 bytes of UTF-8: longer than an index head on MariaDB."""


@contextmanager
def recorded(client: SqlClient, engines: Any) -> Iterator[list[tuple[str, Any]]]:
    """Every single statement (not ``executemany``) sent while the block runs."""
    seen: list[tuple[str, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool):  # type: ignore[no-untyped-def]
        if not many and statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
            seen.append((statement, params))

    targets = {id(e): e for e in (engines.writer, engines.reader)}.values()
    for engine in targets:
        event.listen(engine.sync_engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        for engine in targets:
            event.remove(engine.sync_engine, "before_cursor_execute", before)


def sqlite_problems(plan: Sequence[Any]) -> list[str]:
    problems = []
    for row in plan:
        detail = str(row[-1])
        if detail.startswith("SCAN") and "CONSTANT ROW" not in detail:
            problems.append(detail)
        if "TEMP B-TREE" in detail:
            problems.append(detail)
    return problems


def mysql_problems(plan: Sequence[Any]) -> list[str]:
    problems = []
    for row in plan:
        info = dict(row._mapping)
        access, extra = info.get("type"), str(info.get("Extra") or "")
        if info.get("table") is None or "No tables used" in extra or "Impossible" in extra:
            continue
        if "Select tables optimized away" in extra or access == "system":
            continue
        if access in ("ALL", "index") or info.get("key") is None:
            problems.append(f"{info.get('table')}: type={access} key={info.get('key')}")
        if "filesort" in extra or "temporary" in extra:
            problems.append(f"{info.get('table')}: {extra}")
    return problems


async def explain_all(
    target: Target, client: SqlClient, seen: list[tuple[str, Any]], minimum: int = 40
) -> None:
    """Explain every recorded statement of the runtime tables; none may scan or sort."""
    names = {t.name for t in client.tables.runtime.all()}
    statements = {
        (sql, tuple(params) if isinstance(params, list) else params)
        for sql, params in seen
        if any(name in sql for name in names)
    }
    assert len(statements) >= minimum, "the workload ran the stores' statements"
    problems: dict[str, list[str]] = {}
    engines = await client.ready()
    async with engines.reader.connect() as conn:
        for sql, params in sorted(statements, key=lambda s: s[0]):
            if target.dialect == "sqlite":
                plan = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)).all()
                found = sqlite_problems(plan)
            else:
                plan = (await conn.exec_driver_sql(f"EXPLAIN {sql}", params)).all()
                found = mysql_problems(plan)
            if found:
                problems[sql] = found
        await conn.rollback()
    assert problems == {}


async def test_runtime_statements_use_indexes(target: Target) -> None:
    clock = ManualClock()
    client = SqlClient.shared(target.url, **target.options)
    kv = SqlKeyValueStore(client=client, clock=clock)
    state = SqlAgentStateStore(client=client, clock=clock, session_ttl=timedelta(hours=1))
    snapshots = SqlSnapshotStore(client=client, clock=clock, snapshot_ttl=timedelta(hours=1))
    guard = SqlExecutionGuard(client=client, clock=clock, lease_ttl=timedelta(minutes=5))
    try:
        for store in (kv, state, snapshots, guard):
            await store.initialize()
        # A few rows that will have expired when the workload runs...
        for i in range(4):
            await kv.put(("old", f"o{i}"), "k", i, ttl=timedelta(minutes=1))
            await state.save(f"old{i}", "s", "k", i)
            await snapshots.put("old", f"o{i}", b"x")
            assert await guard.try_acquire(f"old{i}", owner="w") is not None
        clock.advance(timedelta(minutes=61))
        # ... among many live ones, as in a store in use.
        for i in range(40):
            for j in range(5):
                ttl = timedelta(hours=1) if i == 7 else None
                await kv.put(("ws", f"n{i:02}", f"s{j % 2}"), f"k{j}", {"i": i}, ttl=ttl)
        # Names longer than an index head (MariaDB: 3,000 bytes; snapshot ids 2,900)
        # that share it: the stores read such a group whole.
        for k in range(3):
            await kv.put(("long",), LONG + "ABC"[k] * 100, k)
            await state.save("long-user", LONG + "ABC"[k], "k", k)
            await snapshots.put("long", LONG + "ABC"[k], b"x")
            await snapshots.put(LONG + "ABC"[k], "s", b"x")
        for name in ("a0", "a1", "a2"):
            await state.save(None, name, "k", name)
            await state.save("\x01low", name, "k", name)
        for i in range(40):
            await state.save(f"u{i % 4}", f"s{i:02}", "cursor", i)
            await state.append_list(f"u{i % 4}", f"s{i:02}", "log", [i, i + 1])
            await snapshots.put(f"scope{i % 4}", f"snap{i:02}", b"x" * 64)
            clock.advance(ms=1)
            lock = await guard.try_acquire(f"res{i:02}", owner="w")
            assert lock is not None
            if i % 2:
                await lock.release()
        engines = await client.ready()
        with recorded(client, engines) as seen:
            await kv_workload(kv)
            await state_workload(state)
            await snapshot_workload(snapshots, clock)
            await guard_workload(guard, clock)
            assert await kv.purge_expired() > 0
            assert await state.purge_expired() > 0
            assert await snapshots.purge_expired() > 0
            assert await guard.purge_expired() > 0
        await explain_all(target, client, seen)
    finally:
        for store in (kv, state, snapshots, guard):
            await store.close()


async def kv_workload(kv: SqlKeyValueStore) -> None:
    ns = ("ws", "n07", "s1")
    item = await kv.get(ns, "k1")
    assert item is not None
    await kv.get(ns, "k1", refresh_ttl=True)
    await kv.get_many(ns, ["k1", "k2", "absent"])
    await kv.put(ns, "k1", {"again": True})
    await kv.put_if_version(ns, "k1", 1, item.version + 1)
    await kv.put_if_version(ns, "k1", 1, 99)
    await kv.put_if_version(ns, "fresh", 1, None)
    await kv.put_if_version(ns, "fresh", 1, None)
    await kv.delete(ns, "fresh", expected_version=1)
    await kv.delete(ns, "absent")
    for prefix, key_prefix in ((("ws",), ""), (("ws", "n1"), ""), (("ws",), "k3"), ((), "")):
        page = await kv.search(prefix, key_prefix=key_prefix, limit=7)
        if page.next_page_token is not None:
            await kv.search(prefix, key_prefix=key_prefix, limit=7, page_token=page.next_page_token)
    token = None
    for _ in range(3):
        long_keys = await kv.list_keys(("long",), limit=1, page_token=token)
        token = long_keys.next_page_token
    assert token is None
    for _ in range(3):
        long_items = await kv.search(("long",), limit=1, page_token=token)
        token = long_items.next_page_token
    assert token is None
    keys = await kv.list_keys(ns, limit=1)
    assert keys.next_page_token is not None
    await kv.list_keys(ns, limit=1, page_token=keys.next_page_token)
    await kv.list_keys(ns, prefix="k")
    for depth in (None, 2):
        page_ns = await kv.list_namespaces(("ws",), max_depth=depth, limit=5)
        assert page_ns.next_page_token is not None
        await kv.list_namespaces(
            ("ws",), max_depth=depth, limit=5, page_token=page_ns.next_page_token
        )


async def state_workload(state: SqlAgentStateStore) -> None:
    await state.get("u1", "s01", "cursor")
    version = await state.save("u1", "s01", "cursor", 100)
    await state.save_if_version("u1", "s01", "cursor", 101, version)
    await state.save_if_version("u1", "s01", "cursor", 102, version)
    await state.save_if_version("u1", "s01", "new", 1, 0)
    await state.append_list("u1", "s01", "log", [3])
    await state.append_list("u1", "s01", "log", [4], expected_length=0)
    await state.save_list("u1", "s01", "log", [1, 2, 3, 4])
    await state.save_list("u1", "s01", "log", [9])
    await state.get_list("u1", "s01", "log")
    await state.exists("u1", "s01")
    await state.delete_state("u1", "s01", "new")
    await state.delete_state("u1", "s01", "absent")
    await state.delete("u2", "s02")
    token = None
    for _ in range(3):
        long_page = await state.list_session_ids("long-user", limit=1, page_token=token)
        token = long_page.next_page_token
    assert token is None
    page = await state.list_session_ids("u3", limit=3)
    assert page.next_page_token is not None
    await state.list_session_ids("u3", limit=3, page_token=page.next_page_token)
    # The enumeration of a copy: pages of every session (the anonymous user's,
    # users below and above its stored key), one session's keys.
    for after in (None, (None, "a0"), ("\x01low", "s"), ("u1", "s05"), ("long-user", LONG)):
        assert await state._list_sessions(after, 3)
    assert await state._session_keys("u1", "s01") != ([], [])
    assert await state._session_keys(None, "a1") != ([], [])


async def snapshot_workload(snapshots: SqlSnapshotStore, clock: ManualClock) -> None:
    token = None
    for _ in range(3):
        long_page = await snapshots.list("long", limit=1, page_token=token)
        token = long_page.next_page_token
    assert token is None
    await snapshots.latest("long")
    await snapshots.get("scope1", "snap01")
    await snapshots.latest("scope1")
    page = await snapshots.list("scope1", limit=3)
    assert page.next_page_token is not None
    await snapshots.list("scope1", limit=3, page_token=page.next_page_token)
    await snapshots.put("scope1", "snap01", b"replaced")
    # The scopes in order for a copy: first pages, a page after a scope, a
    # page cut inside the group of long scopes that share an index head.
    assert await snapshots._list_scopes(None, 2)
    assert await snapshots._list_scopes("long", 2)
    assert await snapshots._list_scopes(LONG + "A", 1)
    await snapshots.delete("scope2", "snap02")
    await snapshots.delete("scope2", "absent")


async def guard_workload(guard: SqlExecutionGuard, clock: ManualClock) -> None:
    lock = await guard.try_acquire("res-x", owner="a")
    assert lock is not None
    assert await guard.try_acquire("res-x", owner="b") is None
    await guard.inspect("res-x")
    await lock.renew()
    await lock.release()
    await guard.inspect("res00")


async def test_reads_on_the_store_clock_use_indexes(target: Target) -> None:
    """Without a test clock, reads compare with the clock inside the statement
    (MariaDB's ``UTC_TIMESTAMP(6)``): the same index ranges."""
    client = SqlClient.shared(target.url, **target.options)
    kv = SqlKeyValueStore(client=client)
    state = SqlAgentStateStore(client=client)
    snapshots = SqlSnapshotStore(client=client)
    guard = SqlExecutionGuard(client=client)
    try:
        for i in range(30):
            await kv.put(("ws", f"n{i % 5}"), f"k{i}", i, ttl=timedelta(hours=1))
            await state.save("u", f"s{i:02}", "k", i)
            await snapshots.put("scope", f"id{i:02}", b"x")
        lock = await guard.try_acquire("r", owner="w")
        assert lock is not None
        engines = await client.ready()
        with recorded(client, engines) as seen:
            await kv.get(("ws", "n1"), "k1")
            await kv.get_many(("ws", "n1"), ["k1", "k6"])
            page = await kv.search(("ws",), limit=4)
            await kv.search(("ws",), limit=4, page_token=page.next_page_token)
            await kv.search(("ws",), key_prefix="k1", limit=4)
            await kv.list_keys(("ws", "n2"), prefix="k")
            await kv.list_namespaces(("ws",), limit=2)
            await state.get("u", "s01", "k")
            await state.get_list("u", "s02", "absent")
            await state.exists("u", "s03")
            await state.list_session_ids("u", limit=5)
            await snapshots.get("scope", "id01")
            await snapshots.latest("scope")
            await snapshots.list("scope", limit=5)
            await guard.inspect("r")
        await explain_all(target, client, seen, minimum=12)
        await lock.release()
    finally:
        for store in (kv, state, snapshots, guard):
            await store.close()
