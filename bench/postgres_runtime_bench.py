"""Benchmark of the PostgreSQL runtime stores against an asyncpg floor.

One command, prints a table::

    .venv/bin/python bench/postgres_runtime_bench.py [--url postgresql://...] [--quick]

Each operation is timed next to its *floor*: the same SQL statements (the
stores' own ``Statements``) issued directly through asyncpg on a pool with the
same settings, so the ratio is what the store costs beyond the database
(argument checks, canonical JSON, SHA-256 of the data on put and on every
read, model building, page tokens, the guard's watchdog task). Samples of the
store and the floor are interleaved, medians reported:

- key-value get, put and put_if_version of one small item;
- key-value search, first page of 20, under a namespace prefix holding 100
  and one holding 100,000 items (loaded with one ``COPY`` straight into the
  table, not through the store; the loading time is printed);
- agent-state save of one value, and append of one item to a list of 10 and
  to a list of 10,000 items (each list grows by one item per sample);
- snapshot put and get of 1 MiB;
- guard acquire + release of a free resource;
- 32 workers contending for 4 locks (retry every 5 ms): acquisitions per
  second in five alternating store/floor rounds (the median of each side),
  each holder checked against a log of fencing tokens.

Targets: every ratio within 1.5x of the floor, and the size-growth ratios
(search at 100,000 / at 100 items, append at 10,000 / at 10 items) within
1.5x too; the command exits with status 1 when one is missed.

Everything lives in a throwaway schema that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from pai_storage_postgres.client import SESSION_SETTINGS, PgClient, keep_session
from pai_storage_postgres.guard import PostgresExecutionGuard
from pai_storage_postgres.guard import Statements as GuardStatements
from pai_storage_postgres.kv import COLUMNS as KV_COLUMN_LIST
from pai_storage_postgres.kv import PostgresKeyValueStore
from pai_storage_postgres.kv import Statements as KVStatements
from pai_storage_postgres.snapshots import PostgresSnapshotStore
from pai_storage_postgres.snapshots import Statements as SnapshotStatements
from pai_storage_postgres.state import PostgresAgentStateStore
from pai_storage_postgres.state import Statements as StateStatements

from pai_storage import Item
from pai_storage.backend import namespace_path, prefix_upper_bound
from pai_storage.runtime import canonical_json
from pai_storage.state import extend_list_hash

DEFAULT_URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
TARGET = 1.5
RETRY = timedelta(milliseconds=5)
ROUNDS = 5
"""Alternating store/floor rounds of the contention run (median rate per side)."""
SMALL, LARGE, PAGE = 100, 100_000, 20
KV_COLUMNS = KV_COLUMN_LIST.split(", ")


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def interleaved(
    pairs: dict[str, Callable[[], Awaitable[Any]]], n: int, warmup: int = 5
) -> dict[str, float]:
    """Run each callable ``n`` times, round-robin, and return median milliseconds."""
    for fn in pairs.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {key: [] for key in pairs}
    for _ in range(n):
        for key, fn in pairs.items():
            start = time.perf_counter()
            await fn()
            samples[key].append(time.perf_counter() - start)
    return {key: median_ms(values) for key, values in samples.items()}


def check_log(log: list[tuple[str, str, int]]) -> None:
    """No two holders of a resource at once; fencing tokens increase per resource."""
    holder: dict[str, int | None] = {}
    last: dict[str, int] = {}
    for event, resource, token in log:
        if event == "enter":
            if holder.get(resource) is not None or token <= last.get(resource, 0):
                raise SystemExit(f"two holders or a stale token on {resource}: {token}")
            holder[resource] = last[resource] = token
        else:
            holder[resource] = None


async def contention(
    acquire: Callable[[str], Awaitable[tuple[int, Callable[[], Awaitable[Any]]] | None]],
    seconds: float,
) -> float:
    """32 workers on 4 resources for ``seconds``: acquisitions per second."""
    log: list[tuple[str, str, int]] = []
    deadline = time.perf_counter() + seconds
    count = 0

    async def worker(n: int) -> None:
        nonlocal count
        i = 0
        while time.perf_counter() < deadline:
            resource = f"contended-{(n + i) % 4}"
            got = await acquire(resource)
            if got is None:
                await asyncio.sleep(RETRY.total_seconds())
                continue
            token, release = got
            log.append(("enter", resource, token))
            log.append(("exit", resource, token))
            await release()
            count += 1
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(32)))
    elapsed = time.perf_counter() - started
    check_log(log)
    return count / elapsed


async def kv_state_rows(
    client: PgClient, pool: Any, n: int
) -> tuple[list[tuple[str, float, float, str]], list[tuple[str, float, float]], float]:
    """Key-value and agent-state operations: store/floor rows, growth rows, load seconds."""
    kv = PostgresKeyValueStore(client=client)
    state = PostgresAgentStateStore(client=client)
    rows: list[tuple[str, float, float, str]] = []
    growth: list[tuple[str, float, float]] = []
    try:
        await kv.initialize()
        await state.initialize()
        t = client.tables
        kv_sql = KVStatements(t.kv)
        st_sql = StateStatements(t)
        value = {"title": "a benchmark item", "tags": ["x", "y"], "score": 1.5}
        text = canonical_json(value)

        # --- load: the searched prefixes, straight into the table (not through the store)
        now = datetime.now(UTC)
        started = time.perf_counter()
        async with pool.acquire() as conn:
            for prefix, count in (("small", SMALL), ("big", LARGE)):
                path = namespace_path((prefix, "docs"))
                await conn.copy_records_to_table(
                    t.base("kv"),
                    schema_name=t.schema,
                    columns=KV_COLUMNS,
                    records=(
                        (path, f"k{i:06d}", text, 1, now, now, None, None) for i in range(count)
                    ),
                )
            await conn.execute(f"ANALYZE {t.kv}")
        load_seconds = time.perf_counter() - started

        # --- KV get, put, put_if_version
        ns = ("bench", "kv")
        path = namespace_path(ns)
        await kv.put(ns, "store", value)
        await kv.put(ns, "floor", value)

        async def floor_get() -> None:
            async with pool.acquire() as conn:
                rows = await conn.fetch(kv_sql.get_many, None, path, ["floor"])
            # A hand-written store returns the value, so it decodes the JSON too.
            assert [json.loads(r["value"]) for r in rows]

        got = await interleaved({"store": lambda: kv.get(ns, "store"), "floor": floor_get}, n)
        rows.append(("kv get", got["store"], got["floor"], "ms"))

        async def floor_put() -> None:
            async with pool.acquire() as conn:
                await conn.fetch(kv_sql.put, None, path, "floor", text, None)

        put = await interleaved(
            {"store": lambda: kv.put(ns, "store", value), "floor": floor_put}, n
        )
        rows.append(("kv put", put["store"], put["floor"], "ms"))

        versions = {"store": (await kv.put(ns, "store", value)).version, "floor": 0}
        async with pool.acquire() as conn:
            versions["floor"] = (await conn.fetch(kv_sql.put, None, path, "floor", text, None))[0][
                "version"
            ]

        async def store_cas() -> None:
            item = await kv.put_if_version(ns, "store", value, versions["store"])
            assert isinstance(item, Item)
            versions["store"] = item.version

        async def floor_cas() -> None:
            async with pool.acquire() as conn:
                found = await conn.fetch(
                    kv_sql.update, None, path, "floor", text, None, versions["floor"]
                )
            assert found
            versions["floor"] = found[0]["version"]

        cas = await interleaved({"store": store_cas, "floor": floor_cas}, n)
        rows.append(("kv put_if_version", cas["store"], cas["floor"], "ms"))

        # --- KV search: the first page (limit 20) under a prefix of 100 and of 100,000 items
        pages: dict[int, float] = {}
        for prefix, count in (("small", SMALL), ("big", LARGE)):
            low = namespace_path((prefix,))
            sql, args = kv_sql.search(low, prefix_upper_bound(low), None, None, PAGE + 1)

            async def store_search(prefix: str = prefix) -> None:
                page = await kv.search((prefix,), limit=PAGE)
                assert len(page.items) == PAGE
                assert page.next_page_token

            async def floor_search(sql: str = sql, args: list[Any] = args) -> None:
                async with pool.acquire() as conn:
                    found = await conn.fetch(sql, None, *args)
                assert len(found) == PAGE + 1
                assert len([json.loads(r["value"]) for r in found[:PAGE]]) == PAGE

            found = await interleaved({"store": store_search, "floor": floor_search}, n)
            rows.append((f"kv search page at {count:,}", found["store"], found["floor"], "ms"))
            pages[count] = found["store"]
        growth.append(("kv search page: 100,000 / 100 items", pages[LARGE], pages[SMALL]))

        # --- agent state: save, and append one item to a 10- and a 10,000-item list
        user, sid = "bench-user", "bench-session"
        ttl_ms = state._ttl_ms

        async def floor_save() -> None:
            async with pool.acquire() as conn, conn.transaction():
                stale = await conn.fetchval(st_sql.touch, None, user, sid, ttl_ms)
                assert not stale
                await conn.fetchval(st_sql.save_any, user, sid, "floor-value", text)

        saved = await interleaved(
            {"store": lambda: state.save(user, sid, "store-value", value), "floor": floor_save}, n
        )
        rows.append(("state save", saved["store"], saved["floor"], "ms"))

        appends: dict[int, float] = {}
        for size in (10, 10_000):
            items = [{"i": i, "text": "an item of the list"} for i in range(size)]
            await state.save_list(user, sid, f"store-{size}", items)
            await state.save_list(user, sid, f"floor-{size}", items)
            item = {"i": -1, "text": "an appended item"}
            item_text = canonical_json(item)

            async def store_append(size: int = size, item: Any = item) -> None:
                await state.append_list(user, sid, f"store-{size}", [item])

            async def floor_append(size: int = size, item_text: str = item_text) -> None:
                key = f"floor-{size}"
                async with pool.acquire() as conn:
                    head = await conn.fetchrow(st_sql.get, None, user, sid, key)
                async with pool.acquire() as conn, conn.transaction():
                    await conn.fetchval(st_sql.touch, None, user, sid, ttl_ms)
                    length, digest = int(head["length"]), str(head["hash"])
                    done = await conn.fetchval(
                        st_sql.list_at,
                        user,
                        sid,
                        key,
                        length + 1,
                        extend_list_hash(digest, (item_text,)),
                        length,
                        digest,
                    )
                    assert done is not None
                    await conn.execute(st_sql.items_add, user, sid, key, length, [item_text])

            appended = await interleaved({"store": store_append, "floor": floor_append}, n)
            rows.append(
                (f"state append to {size:,} items", appended["store"], appended["floor"], "ms")
            )
            appends[size] = appended["store"]
        growth.append(("state append: 10,000 / 10 items", appends[10_000], appends[10]))
    finally:
        await kv.close()
        await state.close()
    return rows, growth, load_seconds


async def main(url: str, quick: bool) -> None:
    schema = f"pai_rtbench_{uuid.uuid4().hex[:8]}"
    n = 40 if quick else 200
    seconds = 2.0 if quick else 5.0
    client = PgClient(url, schema=schema, max_pool_size=10)
    snapshots = PostgresSnapshotStore(client=client)
    guard = PostgresExecutionGuard(client=client, retry_interval=RETRY)
    dsn = client.url.render(hide_password=False, scheme="postgresql")
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=10, server_settings=dict(SESSION_SETTINGS), reset=keep_session
    )
    rows: list[tuple[str, float, float, str]] = []
    growth: list[tuple[str, float, float]] = []
    load_seconds = 0.0
    try:
        rows, growth, load_seconds = await kv_state_rows(client, pool, n)
        await snapshots.initialize()
        await guard.initialize()
        t = client.tables
        snap_sql = SnapshotStatements(t.snapshots)
        guard_sql = GuardStatements(t)
        data = os.urandom(1024 * 1024)
        ttl_us = 30 * 86_400 * 1_000_000
        await snapshots.put("bench", "store-1mib", data)

        # Like the MongoDB floor, the hand-written snapshot put and get do the integrity
        # work the contract asks of any snapshot store: SHA-256 on put, checked on get.
        async def floor_put() -> None:
            digest = hashlib.sha256(data).hexdigest()
            async with pool.acquire() as conn, conn.transaction():
                await conn.fetchval(
                    snap_sql.put,
                    None,
                    b"bench",
                    b"floor-1mib",
                    ttl_us,
                    len(data),
                    digest,
                    "{}",
                    data,
                )

        async def floor_get() -> None:
            async with pool.acquire() as conn:
                row = await conn.fetchrow(snap_sql.get, None, b"bench", b"floor-1mib")
            assert hashlib.sha256(row["data"]).hexdigest() == row["sha256"]

        async def store_get() -> None:
            await snapshots.get("bench", "store-1mib")

        put = await interleaved(
            {
                "store": lambda: snapshots.put("bench", "store-1mib", data),
                "floor": floor_put,
            },
            n,
        )
        rows.append(("snapshot put 1 MiB", put["store"], put["floor"], "ms"))
        got = await interleaved({"store": store_get, "floor": floor_get}, n)
        rows.append(("snapshot get 1 MiB", got["store"], got["floor"], "ms"))

        free_key = guard._lock_key(b"free-floor")
        lock_keys = {
            f"contended-{i}-floor".encode(): guard._lock_key(f"contended-{i}-floor".encode())
            for i in range(4)
        }

        async def store_lock() -> None:
            lock = await guard.try_acquire("free", owner="bench")
            assert lock is not None
            await lock.release()

        async def floor_lock() -> None:
            token = uuid.uuid4().hex
            async with pool.acquire() as conn:
                row = await conn.fetchrow(
                    guard_sql.acquire, None, 1_800_000_000, b"free-floor", token, "bench", free_key
                )
                assert row is not None
            async with pool.acquire() as conn:
                await conn.fetchrow(guard_sql.release, None, b"free-floor", token)

        lock = await interleaved({"store": store_lock, "floor": floor_lock}, n)
        rows.append(("guard acquire + release", lock["store"], lock["floor"], "ms"))

        async def store_acquire(resource: str) -> tuple[int, Callable[[], Awaitable[Any]]] | None:
            held = await guard.try_acquire(resource, owner="w")
            return None if held is None else (held.fencing_token, held.release)

        async def floor_acquire(resource: str) -> tuple[int, Callable[[], Awaitable[Any]]] | None:
            token = uuid.uuid4().hex
            key = (resource + "-floor").encode()
            async with pool.acquire() as conn:
                row = await conn.fetchrow(
                    guard_sql.acquire, None, 1_800_000_000, key, token, "w", lock_keys[key]
                )
            if row is None:
                return None

            async def release() -> None:
                async with pool.acquire() as conn:
                    await conn.fetchrow(guard_sql.release, None, key, token)

            return int(row["fencing_token"]), release

        # Alternating rounds (store, floor, store, ...), the median of each side:
        # background load drifts over seconds and must hit both alike.
        rates: dict[str, list[float]] = {"store": [], "floor": []}
        for _ in range(ROUNDS):
            rates["store"].append(await contention(store_acquire, seconds / ROUNDS))
            rates["floor"].append(await contention(floor_acquire, seconds / ROUNDS))
        store_rate = statistics.median(rates["store"])
        floor_rate = statistics.median(rates["floor"])
        rows.append(("32 workers / 4 locks", store_rate, floor_rate, "acq/s"))
    finally:
        await snapshots.close()
        await guard.close()
        async with pool.acquire() as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await pool.close()

    print(
        f"\nPostgreSQL runtime stores vs asyncpg floor (median of {n}; throughput {seconds:g} s)\n"
    )
    print(f"| {'operation':<30} | {'store':>10} | {'floor':>10} | {'ratio':>6} | target |")
    print(f"|{'-' * 32}|{'-' * 12}|{'-' * 12}|{'-' * 8}|--------|")
    failed = False
    for name, store, floor, unit in rows:
        ratio = floor / store if unit == "acq/s" else store / floor
        ok = ratio <= TARGET
        failed |= not ok
        shown = f"{store:.0f} {unit}" if unit == "acq/s" else f"{store:.3f} ms"
        base = f"{floor:.0f} {unit}" if unit == "acq/s" else f"{floor:.3f} ms"
        print(
            f"| {name:<30} | {shown:>10} | {base:>10} | {ratio:>5.2f}x | "
            f"{'ok' if ok else 'MISSED':>6} |"
        )
    print("\nratio: store / floor latency (floor / store for throughput); target <= 1.5x")
    print(
        f"\n| {'size growth (store)':<36} | {'large':>9} | {'small':>9} | {'ratio':>6} | target |"
    )
    print(f"|{'-' * 38}|{'-' * 11}|{'-' * 11}|{'-' * 8}|--------|")
    for name, large, small in growth:
        ratio = large / small
        ok = ratio <= TARGET
        failed |= not ok
        print(
            f"| {name:<36} | {large:>6.3f} ms | {small:>6.3f} ms | {ratio:>5.2f}x | "
            f"{'ok' if ok else 'MISSED':>6} |"
        )
    print(
        f"\nloaded {SMALL + LARGE:,} key-value rows with COPY in {load_seconds:.2f} s "
        "(straight into the table, not through the store)"
    )
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter runs")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.quick))
