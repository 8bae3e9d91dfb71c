"""PostgreSQL snapshot store and execution guard: conformance, EXPLAIN, faults, fencing.

- the snapshot and guard conformance topics, run on a fresh schema per test;
- EXPLAIN of every statement form: index scans only, no Seq Scan, no Sort;
- connection faults through the loopback proxy: a typed error, nothing
  half-written, and the pool serves the next call;
- 32 workers contending for 4 locks through separate guards: no two holders
  at once, checked from a log of fencing tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_conformance.suite.guard import ExecutionGuardTests
from pai_storage_conformance.suite.snapshots import SnapshotStoreTests
from pai_storage_postgres.client import SESSION_SETTINGS, PgClient
from pai_storage_postgres.guard import PostgresExecutionGuard
from pai_storage_postgres.guard import Statements as GuardStatements
from pai_storage_postgres.snapshots import MAX_SNAPSHOT_BYTES, PostgresSnapshotStore
from pai_storage_postgres.snapshots import Statements as SnapshotStatements
from support.proxy import FaultProxy

from pai_storage import ManualClock
from pai_storage.errors import (
    InvalidInputError,
    OutcomeUnknownError,
    SnapshotTooLargeError,
    StorageError,
    UnavailableError,
)

from .helpers import URL, dsn, proxied_url

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def snapshot_store(
    clock: ManualClock, pg_schema: str
) -> AsyncIterator[PostgresSnapshotStore]:
    async with PostgresSnapshotStore(URL, schema=pg_schema, clock=clock) as store:
        yield store


@pytest_asyncio.fixture
async def guard(clock: ManualClock, pg_schema: str) -> AsyncIterator[PostgresExecutionGuard]:
    async with PostgresExecutionGuard(URL, schema=pg_schema, clock=clock) as store:
        yield store


class TestPostgresSnapshotStore(SnapshotStoreTests):
    """The snapshot topic on PostgreSQL, the test clock driving expiry."""


class TestPostgresExecutionGuard(ExecutionGuardTests):
    """The guard topic on PostgreSQL, the test clock driving expiry."""


# ---------------------------------------------------------------- server clock and sizes


async def test_guard_on_the_server_clock(pg_schema: str) -> None:
    async with (
        PostgresExecutionGuard(URL, schema=pg_schema) as one,
        PostgresExecutionGuard(URL, schema=pg_schema) as two,
    ):
        # Held for a minute while the checks that need a live lock run (a busy machine
        # may stall them for seconds); then stopped and renewed once for 300 ms, which
        # the test waits out.
        lease, short = timedelta(minutes=1), timedelta(milliseconds=300)
        first = await one.try_acquire("clocked", owner="w1", lease_ttl=lease)
        assert first is not None
        assert first.expires_at - first.acquired_at == lease
        assert first.acquired_at.microsecond % 1000 == 0  # whole milliseconds
        assert await two.try_acquire("clocked", owner="w2", lease_ttl=lease) is None
        await first._guard._forget(first)  # stop its watchdog: let the lease run out
        assert await one._renew("clocked", first.token, short) is not None
        await asyncio.sleep(0.45)
        assert await two.inspect("clocked") is None  # expired: free at once, unpurged
        second = await two.try_acquire("clocked", owner="w2", lease_ttl=lease)
        assert second is not None
        assert second.fencing_token > first.fencing_token
        assert not await first.release()  # its token is gone: never the successor's lock
        info = await one.inspect("clocked")
        assert info is not None
        assert info.owner == "w2"
        await second._guard._forget(second)
        assert await two._renew("clocked", second.token, short) is not None
        await asyncio.sleep(0.45)
        assert await one.purge_expired() == 1
        third = await one.try_acquire("clocked", owner="w3")
        assert third is not None
        assert third.fencing_token > second.fencing_token  # purges never reset the sequence
        assert await third.release()


async def test_snapshots_on_the_server_clock(pg_schema: str, pg_conn: asyncpg.Connection) -> None:
    # Two seconds: the read right after the write must find it live on a busy machine.
    ttl = timedelta(seconds=2)
    async with PostgresSnapshotStore(URL, schema=pg_schema, snapshot_ttl=ttl) as store:
        server_now = await pg_conn.fetchval("SELECT clock_timestamp()")
        info = await store.put("s", "a", b"data", metadata={"n": 1})
        assert abs((info.created_at - server_now).total_seconds()) < 5
        assert info.created_at.microsecond % 1000 == 0
        assert info.expires_at == info.created_at + ttl
        assert (await store.get("s", "a")) is not None
        await asyncio.sleep(ttl.total_seconds() + 0.15)
        assert await store.get("s", "a") is None
        assert await store.latest("s") is None
        assert (await store.list("s")).items == []
        assert await store.purge_expired() == 1


async def test_snapshot_limit_is_stated_and_large_ones_round_trip(pg_schema: str) -> None:
    assert PostgresSnapshotStore.max_snapshot_bytes == MAX_SNAPSHOT_BYTES == 256 * 1024 * 1024
    big = hashlib.sha256(b"seed").digest() * (40 * 1024 * 1024 // 32)  # 40 MiB
    async with PostgresSnapshotStore(URL, schema=pg_schema) as store:
        info = await store.put("s", "big", big)
        assert info.size == len(big)
        got = await store.get("s", "big")
        assert got is not None
        assert got.data == big
        with pytest.raises(SnapshotTooLargeError, match=r"268,435,457 bytes.*268,435,456 bytes"):
            await store.put("s", "huge", bytes(MAX_SNAPSHOT_BYTES + 1))
        assert await store.get("s", "huge") is None


async def test_names_over_the_index_entry_limit_are_invalid_input(pg_schema: str) -> None:
    # 1,024 four-byte characters that do not compress: over PostgreSQL's b-tree entry limit.
    name = "".join(chr(0x10000 + (i * 7919) % 0xFFFF) for i in range(1024))
    async with PostgresSnapshotStore(URL, schema=pg_schema) as store:
        with pytest.raises(InvalidInputError, match="PostgreSQL cannot store this input"):
            await store.put(name, name, b"x")
        assert (await store.list(name)).items == []
        await store.put("s", "ok", b"x")  # the pool recovered


# ---------------------------------------------------------------- EXPLAIN

INDEX_SCANS = {"Index Scan", "Index Only Scan"}


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


async def _check_plan(conn: asyncpg.Connection, sql: str, args: list[Any], table: str) -> None:
    for mode in ("force_custom_plan", "force_generic_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
        nodes = _nodes(json.loads(raw)[0]["Plan"])
        kinds = [n["Node Type"] for n in nodes]
        assert not any("Seq Scan" in k or "Sort" in k for k in kinds), (mode, kinds, sql)
        scans = [n for n in nodes if n.get("Relation Name") == table and "Scan" in n["Node Type"]]
        assert all(n["Node Type"] in INDEX_SCANS for n in scans), (mode, kinds, sql)
    await conn.execute("RESET plan_cache_mode")


@pytest_asyncio.fixture
async def explain_conn(pg_schema: str) -> AsyncIterator[tuple[PgClient, asyncpg.Connection]]:
    client = PgClient(URL, schema=pg_schema)
    client.attach()
    await client.pool()
    t = client.tables
    conn = await asyncpg.connect(dsn(), server_settings=dict(SESSION_SETTINGS))
    await conn.execute(
        f"""INSERT INTO {t.snapshots} (scope, snapshot_id, created_at, expires_at, size,
            sha256, metadata, data)
        SELECT convert_to('scope' || (g % 20), 'UTF8'), convert_to('id' || g, 'UTF8'),
               now() - g * interval '1 second',
               CASE WHEN g % 3 = 0 THEN NULL ELSE now() + (g % 50 - 10) * interval '1 hour' END,
               1, 'x', '{{}}', '\\x00'
        FROM generate_series(1, 40000) g"""
    )
    await conn.execute(
        f"""INSERT INTO {t.locks} (resource, token, owner, fencing_token, acquired_at,
            expires_at)
        SELECT convert_to('r' || g, 'UTF8'), 't', 'o', g, now(),
               now() + (g % 50 - 10) * interval '1 minute'
        FROM generate_series(1, 40000) g"""
    )
    await conn.execute(f"ANALYZE {t.snapshots}; ANALYZE {t.locks}")
    yield client, conn
    await conn.close()
    await client.release()


async def test_every_snapshot_statement_uses_an_index(
    explain_conn: tuple[PgClient, asyncpg.Connection],
) -> None:
    client, conn = explain_conn
    table = client.tables.snapshots.rsplit(".", 1)[-1].strip('"')
    sql = SnapshotStatements(client.tables.snapshots)
    now = datetime.now(UTC)
    scope, sid = b"scope7", b"id7"
    await _check_plan(conn, sql.get, [now, scope, sid], table)
    await _check_plan(conn, sql.get, [None, scope, sid], table)
    await _check_plan(conn, sql.latest, [None, scope], table)
    await _check_plan(conn, sql.list_first, [now, scope, 100], table)
    await _check_plan(conn, sql.list_after, [None, scope, now, sid, 100], table)
    await _check_plan(conn, sql.delete, [None, scope, sid], table)
    await _check_plan(conn, sql.purge, [None], table)
    await _check_plan(conn, sql.put, [None, scope, sid, 1000, 1, "x", "{}", b"data"], table)


async def test_every_guard_statement_uses_an_index(
    explain_conn: tuple[PgClient, asyncpg.Connection],
) -> None:
    client, conn = explain_conn
    table = client.tables.locks.rsplit(".", 1)[-1].strip('"')
    sql = GuardStatements(client.tables)
    now = datetime.now(UTC)
    await _check_plan(conn, sql.acquire, [now, 1000, b"r7", "tok", "owner", 7], table)
    await _check_plan(conn, sql.renew, [None, 1000, b"r7", "tok"], table)
    await _check_plan(conn, sql.release, [None, b"r7", "tok"], table)
    await _check_plan(conn, sql.inspect, [now, b"r7"], table)
    await _check_plan(conn, sql.purge, [None], table)


# ---------------------------------------------------------------- faults


def _faulty(kind: type[Any], proxy: FaultProxy, schema: str) -> Any:
    # One connection, no statement cache: every statement's text crosses the proxy.
    return kind(
        proxied_url(proxy.port),
        schema=schema,
        min_pool_size=1,
        max_pool_size=1,
        statement_cache_size=0,
    )


async def _recovers(proxy: FaultProxy, call: Any) -> None:
    """After the proxy lets connections through again the same store works."""
    proxy.restore()
    await call()


@pytest.mark.parametrize(
    ("marker", "forward", "error", "applied"),
    [
        (b"INSERT INTO", False, UnavailableError, False),  # the statement never arrives
        (b"INSERT INTO", True, UnavailableError, False),  # it ran; COMMIT never sent
        (b"COMMIT", False, OutcomeUnknownError, False),  # COMMIT lost on the way
        (b"COMMIT", True, OutcomeUnknownError, True),  # committed; the reply lost
    ],
)
async def test_snapshot_put_cut_mid_operation(
    fault_proxy: FaultProxy,
    pg_schema: str,
    marker: bytes,
    forward: bool,
    error: type[StorageError],
    applied: bool,
) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    async with (
        _faulty(PostgresSnapshotStore, fault_proxy, pg_schema) as faulty,
        PostgresSnapshotStore(URL, schema=pg_schema) as direct,
    ):
        await faulty.put("s", "snap", b"old", metadata={"v": 1})
        fault_proxy.cut_on(marker, forward=forward)
        with pytest.raises(error) as caught:
            await faulty.put("s", "snap", data, metadata={"v": 2})
        assert fault_proxy.triggered.is_set()
        text = str(caught.value)
        assert "nothing was applied" in text if error is UnavailableError else "may" in text
        got = await direct.get("s", "snap")  # whole old or whole new: never a mix
        assert got is not None
        if applied:
            assert (got.data, got.info.metadata) == (data, {"v": 2})
        else:
            assert (got.data, got.info.metadata) == (b"old", {"v": 1})
        await _recovers(fault_proxy, lambda: faulty.put("s", "after", b"ok"))
        assert (await direct.get("s", "after")) is not None


async def test_snapshot_get_cut_mid_operation(fault_proxy: FaultProxy, pg_schema: str) -> None:
    async with _faulty(PostgresSnapshotStore, fault_proxy, pg_schema) as faulty:
        await faulty.put("s", "snap", b"bytes")
        fault_proxy.cut_on(b"SELECT snapshot_id", forward=True)
        with pytest.raises(UnavailableError, match="nothing was applied"):
            await faulty.get("s", "snap")
        fault_proxy.restore()
        got = await faulty.get("s", "snap")
        assert got is not None
        assert got.data == b"bytes"


@pytest.mark.parametrize(
    ("marker", "applied"),
    [
        (b"INSERT INTO", False),  # the statement text never reaches the server
        (b"res-cut-marker", True),  # its parameters do: it runs, the reply is lost
    ],
)
async def test_guard_acquire_cut_mid_operation(
    fault_proxy: FaultProxy, pg_schema: str, marker: bytes, applied: bool
) -> None:
    async with (
        _faulty(PostgresExecutionGuard, fault_proxy, pg_schema) as faulty,
        PostgresExecutionGuard(URL, schema=pg_schema) as direct,
    ):
        await faulty.inspect("warm-up")  # connected and schema ready
        fault_proxy.cut_on(marker, forward=applied)
        with pytest.raises(OutcomeUnknownError, match="may or may not"):
            await faulty.try_acquire("res-cut-marker", owner="w1")
        assert fault_proxy.triggered.is_set()
        held = await direct.inspect("res-cut-marker")
        assert (held is not None) is applied  # the statement ran whole or not at all
        if held is not None:
            assert held.owner == "w1"
        fault_proxy.restore()
        lock = await faulty.try_acquire("other", owner="w1")  # the pool recovered
        assert lock is not None
        assert await lock.release()


async def test_guard_release_cut_leaves_the_lock_or_removes_it_whole(
    fault_proxy: FaultProxy, pg_schema: str
) -> None:
    async with (
        _faulty(PostgresExecutionGuard, fault_proxy, pg_schema) as faulty,
        PostgresExecutionGuard(URL, schema=pg_schema) as direct,
    ):
        lock = await faulty.try_acquire("res", owner="w1")
        assert lock is not None
        fault_proxy.cut_on(b"DELETE FROM", forward=False)
        with pytest.raises(OutcomeUnknownError):
            await lock.release()
        info = await direct.inspect("res")
        assert info is not None
        assert info.fencing_token == lock.fencing_token
        fault_proxy.restore()
        assert await faulty.inspect("res") is not None


# ---------------------------------------------------------------- contention


async def test_32_workers_4_locks_never_two_holders(pg_schema: str) -> None:
    """Workers on four guards (four pools) take turns; a log of fencing tokens proves it."""
    resources = [f"sandbox-{i}" for i in range(4)]
    log: list[tuple[str, str, int]] = []  # (event, resource, fencing token), in real order
    guards = [
        PostgresExecutionGuard(
            URL,
            schema=pg_schema,
            max_pool_size=8,
            retry_interval=timedelta(milliseconds=5),
            lock_timeout=timedelta(seconds=60),
        )
        for _ in range(4)
    ]

    async def worker(n: int) -> None:
        guard = guards[n % 4]
        for round_ in range(5):
            resource = resources[(n + round_) % 4]
            async with guard.hold(resource, owner=f"w{n}") as lock:
                log.append(("enter", resource, lock.fencing_token))
                await asyncio.sleep(0.002)
                log.append(("exit", resource, lock.fencing_token))

    try:
        await asyncio.gather(*(worker(n) for n in range(32)))
    finally:
        for guard in guards:
            await guard.close()
    assert len(log) == 32 * 5 * 2
    holder: dict[str, int | None] = dict.fromkeys(resources)
    last: dict[str, int] = dict.fromkeys(resources, 0)
    tokens = []
    for event, resource, token in log:
        if event == "enter":
            assert holder[resource] is None, f"{resource}: {token} entered while {holder[resource]}"
            assert token > last[resource], "fencing tokens must increase per resource"
            holder[resource] = last[resource] = token
            tokens.append(token)
        else:
            assert holder[resource] == token
            holder[resource] = None
    assert len(set(tokens)) == len(tokens)  # no token was ever handed out twice
