"""Benchmark of the Redis runtime stores against a hand-written redis-py floor.

One command, prints a table::

    .venv/bin/python bench/redis_bench.py [--url redis://127.0.0.1:6379/15] [--quick]

Each operation is timed next to its *floor*: the same Redis commands (the
stores' own Lua scripts, ``EVALSHA`` through redis-py's ``register_script``)
with the same keys and arguments, called directly on a client with the same
pool, plus the work any caller does by hand (``json.dumps`` / ``json.loads``,
the SHA-256 of snapshot data, the list hash of an append). The ratio is what
the store costs beyond that: argument checks, canonical JSON and strict-JSON
decoding, model building, page tokens, the guard's watchdog task. Samples of
the store and the floor are interleaved, medians reported:

- key-value get, put and put_if_version of one small item; search, first page
  of 20 under a namespace holding 100 items;
- agent-state save of one value; append of one item to a growing list (two
  scripts on both sides: the list head, then the conditional write);
- snapshot put and get of 1 MiB;
- guard acquire + release of a free resource.

Target: every ratio within 1.3x of the floor; the command exits with status 1
when one is missed. Everything lives under a throwaway key prefix, deleted at
the end.
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
from datetime import timedelta
from typing import Any

from pai_storage_redis import guard as guard_scripts
from pai_storage_redis import kv as kv_scripts
from pai_storage_redis import snapshots as snapshot_scripts
from pai_storage_redis import state as state_scripts
from pai_storage_redis.harness import drop_prefix
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pai_storage import connect, make_url
from pai_storage.backend import namespace_path, prefix_upper_bound
from pai_storage.state import EMPTY_LIST_HASH, extend_list_hash

DEFAULT_URL = os.environ.get("PAI_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TARGET = 1.3
SMALL, PAGE = 100, 20
LEASE_MS = 1_800_000


async def interleaved(
    pairs: dict[str, Callable[[], Awaitable[Any]]], n: int, warmup: int = 20
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
    return {key: statistics.median(values) * 1000 for key, values in samples.items()}


async def main(url: str, quick: bool) -> None:
    n = 200 if quick else 2000
    prefix = f"pai-bench-{uuid.uuid4().hex[:8]}:"
    floor_prefix = prefix + "floor:"
    pool = BlockingConnectionPool.from_url(url, retry=Retry(NoBackoff(), 0), max_connections=50)
    raw = Redis(connection_pool=pool)
    scripts: dict[str, Any] = {}

    async def run(script: str, keys: list[str], *args: Any) -> Any:
        if script not in scripts:
            scripts[script] = raw.register_script(script)
        return await scripts[script](keys=keys, args=["", *args])

    def root(component: str) -> str:
        return "{" + floor_prefix + component + "}"

    rows: list[tuple[str, float, float]] = []
    stores = connect(url, key_prefix=prefix, lease_ttl=timedelta(milliseconds=LEASE_MS))
    try:
        async with stores:
            kv, state, snaps, guard = stores.kv, stores.state, stores.snapshots, stores.guard
            value = {"theme": "dark", "count": 3, "tags": ["a", "b"]}

            # ---------------------------------------------------------- key-value
            ns, path = ("bench", "kv"), namespace_path(("bench", "kv"))
            kr = root("kv")
            member = f"{path}\x00item"
            item_keys = [f"{kr}:i:{member}", f"{kr}:idx", f"{kr}:exp"]
            await kv.put(ns, "item", value)
            await run(kv_scripts.WRITE, item_keys, member, json.dumps(value), "", "put", "", "1")

            async def floor_get() -> Any:
                found = await run(kv_scripts.GET_MANY, [item_keys[0]])
                return json.loads(found[0][0])

            got = await interleaved({"store": lambda: kv.get(ns, "item"), "floor": floor_get}, n)
            rows.append(("kv get", got["store"], got["floor"]))

            async def floor_put() -> Any:
                text = json.dumps(value, separators=(",", ":"))
                return await run(kv_scripts.WRITE, item_keys, member, text, "", "put", "", "1")

            put = await interleaved(
                {"store": lambda: kv.put(ns, "item", value), "floor": floor_put}, n
            )
            rows.append(("kv put", put["store"], put["floor"]))

            versions = {"store": (await kv.put(ns, "cas", value)).version, "floor": 0}
            cas_member = f"{path}\x00cas"
            cas_keys = [f"{kr}:i:{cas_member}", f"{kr}:idx", f"{kr}:exp"]
            _, row = await run(kv_scripts.WRITE, cas_keys, cas_member, "1", "", "put", "", "1")
            versions["floor"] = int(row[1])

            async def store_cas() -> None:
                written = await kv.put_if_version(ns, "cas", value, versions["store"])
                versions["store"] = written.version  # type: ignore[union-attr]

            async def floor_cas() -> None:
                text = json.dumps(value, separators=(",", ":"))
                expected = str(versions["floor"])
                _, row = await run(
                    kv_scripts.WRITE, cas_keys, cas_member, text, "", "update", expected, "1"
                )
                versions["floor"] = int(row[1])

            cas = await interleaved({"store": store_cas, "floor": floor_cas}, n)
            rows.append(("kv put_if_version", cas["store"], cas["floor"]))

            page_ns = ("bench", "page")
            page_path = namespace_path(page_ns)
            for i in range(SMALL):
                await kv.put(page_ns, f"k{i:04d}", value)
                m = f"{page_path}\x00k{i:04d}"
                keys = [f"{kr}:i:{m}", f"{kr}:idx", f"{kr}:exp"]
                await run(kv_scripts.WRITE, keys, m, json.dumps(value), "", "put", "", "1")
            stop = "(" + str(prefix_upper_bound(page_path))

            async def floor_search() -> Any:
                found = await run(
                    kv_scripts.SCAN, [f"{kr}:idx"], f"{kr}:i:", "[" + page_path, stop, "", "",
                    PAGE + 1, "0",
                )  # fmt: skip
                return [json.loads(r[1]) for r in found[:PAGE]]

            search = await interleaved(
                {"store": lambda: kv.search(page_ns, limit=PAGE), "floor": floor_search}, n
            )
            rows.append((f"kv search (page {PAGE} of {SMALL})", search["store"], search["floor"]))

            # ---------------------------------------------------------- agent state
            sr = root("state")
            s_member = "user\x00session"
            s_hash, s_users, s_exp = f"{sr}:s:{s_member}", f"{sr}:u:user", f"{sr}:exp"
            s_all = f"{sr}:all"
            list_base = f"{sr}:l:{s_member}\x00"
            ttl = str(30 * 24 * 3600 * 1000)

            async def floor_save() -> Any:
                return await run(
                    state_scripts.SAVE, [s_hash, s_users, s_exp, s_all], "value",
                    json.dumps(value, separators=(",", ":")), "", ttl, "1", list_base, s_member,
                    "session",
                )  # fmt: skip

            save = await interleaved(
                {
                    "store": lambda: state.save("user", "session", "value", value),
                    "floor": floor_save,
                },
                n,
            )
            rows.append(("state save", save["store"], save["floor"]))

            item = {"role": "user", "text": "hello"}

            async def floor_append() -> Any:
                head = await run(state_scripts.LIST_HEAD, [s_hash], "log")
                length, digest = (
                    (0, EMPTY_LIST_HASH) if not head else (int(head[1]), head[2].decode())
                )
                text = json.dumps(item, separators=(",", ":"))
                return await run(
                    state_scripts.WRITE_LIST, [s_hash, list_base + "log", s_users, s_exp, s_all],
                    "log",
                    "" if not head else str(length), "" if not head else digest, "0",
                    str(length + 1), extend_list_hash(digest, [text]), ttl, "1", list_base,
                    s_member, "session", text,
                )  # fmt: skip

            append = await interleaved(
                {
                    "store": lambda: state.append_list("user", "session", "log", [item]),
                    "floor": floor_append,
                },
                n,
            )
            rows.append(("state append_list (1 item)", append["store"], append["floor"]))

            # ---------------------------------------------------------- snapshots
            data = os.urandom(1024 * 1024)
            dr = root("snapshots")
            d_keys = [f"{dr}:d:scope\x00snap", f"{dr}:o:scope", f"{dr}:exp", f"{dr}:scopes"]
            m = n // 10

            async def floor_snap_put() -> Any:
                sha = hashlib.sha256(data).hexdigest()
                return await run(
                    snapshot_scripts.PUT, d_keys, "snap", data, "{}", len(data), sha, ttl, "1",
                    "scope",
                )  # fmt: skip

            snap_put = await interleaved(
                {"store": lambda: snaps.put("scope", "snap", data), "floor": floor_snap_put}, m, 3
            )
            rows.append(("snapshot put 1 MiB", snap_put["store"], snap_put["floor"]))

            async def floor_snap_get() -> Any:
                r = await run(snapshot_scripts.GET, [d_keys[0]])
                assert hashlib.sha256(r[2]).hexdigest() == r[5].decode()
                return r

            snap_get = await interleaved(
                {"store": lambda: snaps.get("scope", "snap"), "floor": floor_snap_get}, m, 3
            )
            rows.append(("snapshot get 1 MiB", snap_get["store"], snap_get["floor"]))

            # ---------------------------------------------------------- guard
            gr = root("guard")

            async def store_lock() -> None:
                lock = await guard.try_acquire("free", owner="w")
                assert lock is not None
                await lock.release()

            async def floor_lock() -> None:
                token = uuid.uuid4().hex
                keys = [f"{gr}:k:free", f"{gr}:fence", f"{gr}:exp"]
                got = await run(guard_scripts.ACQUIRE, keys, "free", token, "w", LEASE_MS, "1")
                assert got
                await run(guard_scripts.RELEASE, [keys[0], keys[2]], "free", token)

            lock = await interleaved({"store": store_lock, "floor": floor_lock}, n)
            rows.append(("guard acquire + release", lock["store"], lock["floor"]))
    finally:
        await raw.aclose(close_connection_pool=True)
        await drop_prefix(make_url(url), prefix)

    print(f"\nRedis runtime stores vs hand-written redis-py floor (median of {n})\n")
    print(f"| {'operation':<30} | {'store':>10} | {'floor':>10} | {'ratio':>6} | target |")
    print(f"|{'-' * 32}|{'-' * 12}|{'-' * 12}|{'-' * 8}|--------|")
    failed = False
    for name, store, floor in rows:
        ratio = store / floor
        ok = ratio <= TARGET
        failed |= not ok
        print(
            f"| {name:<30} | {store:>7.3f} ms | {floor:>7.3f} ms | {ratio:>5.2f}x | "
            f"{'ok' if ok else 'MISSED':>6} |"
        )
    print(f"\nratio: store / floor latency; target <= {TARGET}x")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.quick))
