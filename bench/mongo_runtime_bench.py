"""Benchmark of the MongoDB runtime stores against a hand-written PyMongo floor.

One command, prints a table::

    .venv/bin/python bench/mongo_runtime_bench.py [--url mongodb://...] [--quick]

Without ``--url`` it starts a throwaway single-node replica set (the test
harness's ``mongod``). Each operation is timed next to its *floor*: PyMongo
commands written by hand that do the same work on the same collections and
indexes (the same filters, the same number of round trips), so the ratio is
what the store costs beyond the database: argument checks, canonical JSON,
SHA-256 of the data on put and on every read, model building, page tokens,
the guard's watchdog task. Samples of the store and the floor are
interleaved, medians reported; the "cmds" column counts the commands each side
sent per operation (from PyMongo's command monitoring).

- key-value get, put and put_if_version of one small item;
- key-value search, first page of 20, under a namespace prefix holding 100
  and one holding 100,000 items (inserted straight into the collection with
  ``insert_many``; the loading time is printed);
- agent-state save of one value, and append of one item to a list of 10 and
  to a list of 10,000 items (each list grows by one item per sample; the
  store's and the floor's lists are in sessions of their own);
- snapshot put and get of 1 MiB;
- guard acquire + release of a free resource.

Targets: every ratio within 1.5x of the floor, and the size-growth ratios
(search at 100,000 / at 100 items, append at 10,000 / at 10 items) within 1.5x
too; the command exits with status 1 when one is missed. Everything lives in
collections with a throwaway prefix, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bson import Binary, Int64
from pai_storage_mongo.client import MongoClientHolder
from pai_storage_mongo.guard import COUNTER_ID, MongoExecutionGuard
from pai_storage_mongo.harness import MongodProcess
from pai_storage_mongo.kv import MongoKeyValueStore
from pai_storage_mongo.snapshots import MongoSnapshotStore
from pai_storage_mongo.state import MongoAgentStateStore, encode_field
from pymongo import AsyncMongoClient, ReturnDocument, monitoring

from pai_storage.backend import namespace_path, prefix_upper_bound
from pai_storage.runtime import canonical_json, parse_json_text
from pai_storage.state import EMPTY_LIST_HASH, extend_list_hash

TARGET = 1.5
SMALL, LARGE, PAGE = 100, 100_000, 20
DB = "pai_bench"
Doc = dict[str, Any]


class Counter(monitoring.CommandListener):
    """Counts the commands sent (the floor and the store must send the same number)."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def interleaved(
    pairs: dict[str, Callable[[], Awaitable[Any]]], n: int, counter: Counter, warmup: int = 5
) -> dict[str, tuple[float, float]]:
    """Run each callable ``n`` times, round-robin: (median ms, commands per call)."""
    for fn in pairs.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {key: [] for key in pairs}
    commands: dict[str, int] = dict.fromkeys(pairs, 0)
    for _ in range(n):
        for key, fn in pairs.items():
            before = counter.count
            start = time.perf_counter()
            await fn()
            samples[key].append(time.perf_counter() - start)
            commands[key] += counter.count - before
    return {key: (statistics.median(v) * 1000, commands[key] / n) for key, v in samples.items()}


async def main(url: str, quick: bool) -> int:
    n = 40 if quick else 200
    large = 20_000 if quick else LARGE
    counter = Counter()
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        url, tz_aware=True, event_listeners=[counter], serverSelectionTimeoutMS=5000
    )
    prefix = f"bench_{uuid.uuid4().hex[:8]}_"
    holder = MongoClientHolder(url, client=client, db_name=DB, collection_prefix=prefix)
    kv = MongoKeyValueStore(client=holder)
    state = MongoAgentStateStore(client=holder)
    snaps = MongoSnapshotStore(client=holder)
    guard = MongoExecutionGuard(client=holder)
    for store in (kv, state, snaps, guard):
        await store.initialize()
    db = client[DB]
    kv_col, state_col = db[holder.name("kv")], db[holder.name("state")]
    snap_col, lock_col = db[holder.name("snapshots")], db[holder.name("guard")]
    rows: list[tuple[str, float, float, float, float]] = []
    failures: list[str] = []

    def record(name: str, result: dict[str, tuple[float, float]]) -> float:
        (s_ms, s_cmds), (f_ms, f_cmds) = result["store"], result["floor"]
        rows.append((name, s_ms, f_ms, s_cmds, f_cmds))
        if s_ms > TARGET * f_ms:
            failures.append(f"{name}: {s_ms / f_ms:.2f}x the floor")
        return s_ms

    now_live = {"$expr": {"$gt": [{"$ifNull": ["$expiresAt", datetime.max]}, "$$NOW"]}}
    fields = {"_id": 0, "ns": 1, "key": 1, "value": 1, "version": 1, "createdAt": 1}
    fields |= {"updatedAt": 1, "expiresAt": 1, "ttlMs": 1}
    try:
        # ---------------------------------------------------------------- key-value
        ns = ("bench", "kv")
        path = namespace_path(ns)
        await kv.put(ns, "k", {"a": 1, "b": [1, 2, 3]})
        await kv.put(ns, "f", {"a": 1, "b": [1, 2, 3]})

        async def floor_get() -> Any:
            doc = await kv_col.find_one({"ns": path, "key": "f", **now_live}, fields)
            return parse_json_text(doc["value"]) if doc else None

        record(
            "kv get",
            await interleaved({"store": lambda: kv.get(ns, "k"), "floor": floor_get}, n, counter),
        )

        def write_stages(text: str) -> list[Doc]:
            return [
                {
                    "$set": {
                        "value": {"$literal": text},
                        "version": {"$add": [{"$ifNull": ["$version", Int64(0)]}, Int64(1)]},
                        "createdAt": {"$ifNull": ["$createdAt", "$$NOW"]},
                        "updatedAt": "$$NOW",
                        "_schemaVersion": 1,
                    }
                },
                {"$unset": ["expiresAt", "ttlMs"]},
            ]

        async def floor_put() -> Any:
            text = canonical_json({"a": 1, "b": [1, 2, 3]})
            return await kv_col.find_one_and_update(
                {"ns": path, "key": "f"},
                write_stages(text),
                fields,
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )

        record(
            "kv put",
            await interleaved(
                {"store": lambda: kv.put(ns, "k", {"a": 1, "b": [1, 2, 3]}), "floor": floor_put},
                n,
                counter,
            ),
        )

        async def store_piv() -> Any:
            current = await kv.get(ns, "k")
            assert current is not None
            return await kv.put_if_version(ns, "k", {"a": 2}, current.version)

        async def floor_piv() -> Any:
            doc = await kv_col.find_one({"ns": path, "key": "f", **now_live}, fields)
            assert doc is not None
            return await kv_col.find_one_and_update(
                {"ns": path, "key": "f", "version": doc["version"], **now_live},
                write_stages(canonical_json({"a": 2})),
                fields,
                return_document=ReturnDocument.AFTER,
            )

        record(
            "kv get + put_if_version",
            await interleaved({"store": store_piv, "floor": floor_piv}, n, counter),
        )

        started = time.perf_counter()
        for size in (SMALL, large):
            docs = []
            stamp = datetime.now(UTC)
            for i in range(size):
                docs.append(
                    {
                        "ns": namespace_path(("search", str(size), f"n{i % 10}")),
                        "key": f"key{i:06d}",
                        "value": canonical_json({"i": i}),
                        "version": Int64(1),
                        "createdAt": stamp,
                        "updatedAt": stamp,
                        "_schemaVersion": 1,
                    }
                )
            for at in range(0, len(docs), 10_000):
                await kv_col.insert_many(docs[at : at + 10_000], ordered=False)
        print(f"loaded {SMALL + large:,} key-value items in {time.perf_counter() - started:.1f} s")
        search_ms = {}
        for size in (SMALL, large):
            low = namespace_path(("search", str(size)))
            high = prefix_upper_bound(low)

            async def floor_search(low: str = low, high: str | None = high) -> Any:
                query = {"$and": [{"ns": {"$gte": low, "$lt": high}}, now_live]}
                cursor = kv_col.find(query, fields, sort=[("ns", 1), ("key", 1)], limit=PAGE + 1)
                return [parse_json_text(d["value"]) for d in await cursor.to_list(None)]

            async def store_search(size: int = size) -> Any:
                return await kv.search(("search", str(size)), limit=PAGE)

            search_ms[size] = record(
                f"kv search page of {PAGE} in {size:,}",
                await interleaved({"store": store_search, "floor": floor_search}, n, counter),
            )

        # ---------------------------------------------------------------- agent state
        await state.save("u", "s", "k", {"x": 1})

        async def floor_save() -> Any:
            f = encode_field("k2")
            return await state_col.find_one_and_update(
                {"_id": {"user": "u", "session": "s"}},
                [
                    {
                        "$set": {
                            f"states.{f}": {"$literal": canonical_json({"x": 1})},
                            f"versions.{f}": {
                                "$add": [{"$ifNull": [f"$versions.{f}", Int64(0)]}, Int64(1)]
                            },
                            "_updated_at": "$$NOW",
                        }
                    }
                ],
                {f"versions.{f}": 1, f"hashes.{f}": 1},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )

        record(
            "state save",
            await interleaved(
                {"store": lambda: state.save("u", "s", "k", {"x": 1}), "floor": floor_save},
                n,
                counter,
            ),
        )
        append_ms = {}
        for length in (10, 10_000):
            items = [{"i": i} for i in range(length)]
            await state.save_list("u", f"s{length}", "list", items)
            f = encode_field("floor")
            texts = [canonical_json(item) for item in items]
            digest = extend_list_hash(EMPTY_LIST_HASH, texts)
            # The floor's list lives in a session of its own: each side appends to a
            # document holding one list of `length` items (a second long list in
            # the same document would make both sides' appends cost more).
            await state_col.update_one(
                {"_id": {"user": "u", "session": f"f{length}"}},
                {
                    "$set": {
                        f"states.{f}": texts,
                        f"hashes.{f}": digest,
                        f"lengths.{f}": Int64(length),
                    },
                    "$currentDate": {"_updated_at": True},
                },
                upsert=True,
            )

            async def floor_append(length: int = length, f: str = f) -> Any:
                key = {"user": "u", "session": f"f{length}"}
                doc = await state_col.find_one(
                    {"_id": key, "_updated_at": {"$exists": True}},
                    {f"hashes.{f}": 1, f"lengths.{f}": 1},
                )
                assert doc is not None
                text = canonical_json({"i": -1})
                stored_hash, stored_length = doc["hashes"][f], doc["lengths"][f]
                return await state_col.update_one(
                    {"_id": key, f"hashes.{f}": stored_hash, f"lengths.{f}": stored_length},
                    {
                        "$set": {
                            f"states.{f}.{stored_length}": text,
                            f"hashes.{f}": extend_list_hash(stored_hash, [text]),
                            f"lengths.{f}": Int64(stored_length + 1),
                        },
                        "$currentDate": {"_updated_at": True},
                    },
                )

            async def store_append(length: int = length) -> Any:
                return await state.append_list("u", f"s{length}", "list", [{"i": -1}])

            append_ms[length] = record(
                f"state append 1 to {length:,}",
                await interleaved({"store": store_append, "floor": floor_append}, n, counter),
            )

        # ---------------------------------------------------------------- snapshots
        blob = bytes(range(256)) * 4096  # 1 MiB
        digest = hashlib.sha256(blob).hexdigest()

        async def floor_snap_put() -> Any:
            key = {"scope": "bench", "snapshotId": "floor"}
            document = {
                "_id": key,
                "size": Int64(len(blob)),
                "sha256": hashlib.sha256(blob).hexdigest(),
                "metadata": "{}",
                "data": Binary(blob),
                "_schemaVersion": 1,
            }
            return await snap_col.find_one_and_update(
                {"_id": key},
                [{"$replaceWith": {"$literal": document}}, {"$set": {"createdAt": "$$NOW"}}],
                projection={"_id": 0, "createdAt": 1},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )

        record(
            "snapshot put 1 MiB",
            await interleaved(
                {"store": lambda: snaps.put("bench", "store", blob), "floor": floor_snap_put},
                n // 2,
                counter,
            ),
        )
        ttl_ms = snaps._ttl_ms or 0

        async def floor_snap_get() -> Any:
            key = {"scope": "bench", "snapshotId": "floor"}
            live = {"$expr": {"$gt": ["$createdAt", {"$subtract": ["$$NOW", ttl_ms]}]}}
            doc = await snap_col.find_one({"_id": key, **live})
            assert doc is not None
            assert hashlib.sha256(doc["data"]).hexdigest() == digest
            return doc

        record(
            "snapshot get 1 MiB",
            await interleaved(
                {"store": lambda: snaps.get("bench", "store"), "floor": floor_snap_get},
                n // 2,
                counter,
            ),
        )

        # ---------------------------------------------------------------- guard
        async def store_lock() -> Any:
            lock = await guard.try_acquire("store-res", owner="bench")
            assert lock is not None
            await lock.release()

        async def floor_lock() -> Any:
            token = uuid.uuid4().hex
            doc = await lock_col.find_one_and_update(
                {"_id": "floor-res"},
                [
                    {
                        "$replaceWith": {
                            "$cond": [
                                {"$gt": ["$expiresAt", "$$NOW"]},
                                "$$ROOT",
                                {
                                    "_id": "floor-res",
                                    "token": token,
                                    "owner": "bench",
                                    "fencingToken": Int64(0),
                                    "acquiredAt": "$$NOW",
                                    "expiresAt": {"$add": ["$$NOW", 1_800_000]},
                                },
                            ]
                        }
                    }
                ],
                projection={"token": 1, "acquiredAt": 1, "expiresAt": 1},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
            assert doc is not None
            assert doc["token"] == token
            counter_doc = await lock_col.find_one_and_update(
                {"_id": dict(COUNTER_ID)},
                {"$inc": {"value": Int64(1)}},
                projection={"_id": 0, "value": 1},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
            assert counter_doc is not None
            await lock_col.update_one(
                {"_id": "floor-res", "token": token},
                {"$set": {"fencingToken": counter_doc["value"]}},
            )
            await lock_col.find_one_and_delete(
                {"_id": "floor-res", "token": token},
                projection={"_id": 0, "live": {"$gt": ["$expiresAt", "$$NOW"]}},
            )

        record(
            "guard try_acquire + release",
            await interleaved({"store": store_lock, "floor": floor_lock}, n, counter),
        )
    finally:
        for store in (kv, state, snaps, guard):
            await store.close()
        for name in holder.names.values():
            await db.drop_collection(name)
        await client.close()

    print()
    print(f"{'operation':34} {'store ms':>9} {'floor ms':>9} {'ratio':>6} {'cmds':>9}")
    for name, s_ms, f_ms, s_cmds, f_cmds in rows:
        cmds = f"{s_cmds:g}/{f_cmds:g}"
        print(f"{name:34} {s_ms:9.3f} {f_ms:9.3f} {s_ms / f_ms:6.2f} {cmds:>9}")
    growth = {
        f"search page at {large:,} / at {SMALL}": search_ms[large] / search_ms[SMALL],
        "append at 10,000 / at 10": append_ms[10_000] / append_ms[10],
    }
    print()
    for name, ratio in growth.items():
        print(f"{name:34} {ratio:6.2f}")
        if ratio > TARGET:
            failures.append(f"{name}: {ratio:.2f}")
    print()
    if failures:
        print("MISSED TARGETS: " + "; ".join(failures))
        return 1
    print(f"all targets met (within {TARGET}x)")
    return 0


def append_experiment(url: str, n: int) -> None:
    """Why an append to a long list costs more: raw PyMongo, one session document.

    Each variant updates its own document holding ``states.k`` as an array of
    10 and of 10,000 item texts; the variants run round-robin and report the
    client's median and the server's own median time per update (the
    ``opLatencies`` counter around the command), for both sizes, and their
    ratio.
    """
    from pymongo import MongoClient, WriteConcern

    client: MongoClient[Doc] = MongoClient(url)
    db = client[DB]
    prefix = f"bench_{uuid.uuid4().hex[:8]}_"
    small = canonical_json({"i": 1234})
    large = canonical_json({"i": 1234, "pad": "x" * 100})
    guard_state: dict[str, tuple[str, int]] = {}

    def make(name: str, length: int, item: str, *, beside: str = "", w1: bool = False) -> Any:
        concern = WriteConcern(w=1, j=False) if w1 else None
        col = db.get_collection(f"{prefix}{name}_{length}", write_concern=concern)
        col.drop()
        texts = [item] * length
        doc: Doc = {"_id": {"user": "u", "session": "s"}}
        # beside: the list appended to has 10 items and a `length`-item list
        # comes before or after it in the document
        own = 10 if beside else length
        if beside == "before":
            doc["states"] = {"big": texts, "k": [item] * own}
        elif beside == "after":
            doc["states"] = {"k": [item] * own, "big": texts}
        else:
            doc["states"] = {"k": texts}
        doc["hashes"] = {"k": EMPTY_LIST_HASH}
        doc["lengths"] = {"k": Int64(own)}
        doc["_updated_at"] = datetime.now(UTC)
        col.insert_one(doc)
        guard_state[col.name] = (EMPTY_LIST_HASH, own)
        return col

    key = {"user": "u", "session": "s"}
    push = {"$push": {"states.k": {"$each": [small]}}}
    concat = [{"$set": {"states.k": {"$concatArrays": ["$states.k", {"$literal": [small]}]}}}]

    def append(col: Any, how: str) -> Any:
        stored_hash, length = guard_state[col.name]
        if how == "push":
            return col.update_one({"_id": key}, push)
        if how == "push-large":
            return col.update_one({"_id": key}, {"$push": {"states.k": {"$each": [large]}}})
        if how == "pipeline":
            return col.update_one({"_id": key}, concat)
        if how == "read":
            return col.find_one({"_id": key}, {"hashes.k": 1, "lengths.k": 1})
        if how == "set":
            guard_state[col.name] = (stored_hash, length + 1)
            return col.update_one({"_id": key}, {"$set": {f"states.k.{length}": small}})
        if how == "push16":
            guard_state[col.name] = (stored_hash, length + 16)
            return col.update_one({"_id": key}, {"$push": {"states.k": {"$each": [small] * 16}}})
        if how == "set16":
            guard_state[col.name] = (stored_hash, length + 16)
            paths = {f"states.k.{length + i}": small for i in range(16)}
            return col.update_one({"_id": key}, {"$set": paths})
        # guarded, as the store does it: filter on the head, write the new head
        new_hash = extend_list_hash(stored_hash, [small])
        head = {"hashes.k": new_hash, "lengths.k": Int64(length + 1)}
        update: Doc = (
            {"$set": {f"states.k.{length}": small, **head}}
            if how == "guarded-set"
            else {"$push": {"states.k": {"$each": [small]}}, "$set": head}
        )
        update["$currentDate"] = {"_updated_at": True}
        query = {"_id": key, "hashes.k": stored_hash, "lengths.k": Int64(length)}
        assert col.update_one(query, update).matched_count == 1
        guard_state[col.name] = (new_hash, length + 1)
        return None

    # name: (how, item text, where the long list is beside a 10-item one, no journal wait)
    variants: dict[str, tuple[str, str, str, bool]] = {
        "$push": ("push", small, "", False),
        "$set at the next position": ("set", small, "", False),
        "guarded $push (store, > 4 items)": ("guarded-push", small, "", False),
        "guarded $set (store, <= 4 items)": ("guarded-set", small, "", False),
        "pipeline $concatArrays": ("pipeline", small, "", False),
        "$push, w:1 no journal wait": ("push", small, "", True),
        "$set at the position, w:1": ("set", small, "", True),
        "$push, 110-byte items": ("push-large", large, "", False),
        "$push to 10 items, long list before": ("push", small, "before", False),
        "$push to 10 items, long list after": ("push", small, "after", False),
        "as above, w:1": ("push", small, "after", True),
        "read the list head (projection)": ("read", small, "", False),
        "16 items: $push, w:1": ("push16", small, "", True),
        "16 items: $set of 16 positions, w:1": ("set16", small, "", True),
    }
    fns: dict[tuple[str, int], Callable[[], Any]] = {}
    for number, (name, (how, item, beside, w1)) in enumerate(variants.items()):
        for size in (10, 10_000):
            col = make(f"v{number}", size, item, beside=beside, w1=w1)
            fns[(name, size)] = functools.partial(append, col, how)
    for fn in fns.values():
        for _ in range(5):
            fn()
    client_s: dict[tuple[str, int], list[float]] = {k: [] for k in fns}
    server_us: dict[tuple[str, int], list[float]] = {k: [] for k in fns}

    def latency() -> float:
        ops = db.command("serverStatus", opLatencies={"histograms": False})["opLatencies"]
        return float(ops["writes"]["latency"] + ops["reads"]["latency"])

    try:
        for i in range(n):
            for k, fn in fns.items():
                before = latency() if i % 4 == 0 else None
                start = time.perf_counter()
                fn()
                client_s[k].append(time.perf_counter() - start)
                if before is not None:
                    server_us[k].append(latency() - before)
    finally:
        for name in db.list_collection_names():
            if name.startswith(prefix):
                db.drop_collection(name)
        client.close()
    print(
        f"{'one-item append, raw PyMongo':38} {'10 ms':>7} {'10k ms':>7} {'ratio':>6}"
        f" {'srv 10':>7} {'srv 10k':>7}"
    )
    for name in variants:
        a, z = (statistics.median(client_s[(name, s)]) * 1000 for s in (10, 10_000))
        sa, sz = (statistics.median(server_us[(name, s)]) / 1000 for s in (10, 10_000))
        print(f"{name:38} {a:7.3f} {z:7.3f} {z / a:6.2f} {sa:7.3f} {sz:7.3f}")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a MongoDB replica set (default: a throwaway mongod)")
    parser.add_argument("--quick", action="store_true", help="fewer samples and 20,000 items")
    parser.add_argument(
        "--append-experiment",
        action="store_true",
        help="instead: raw PyMongo appends to a 10- and a 10,000-item list, variant by variant",
    )
    args = parser.parse_args()
    mongod = None
    url = args.url
    if url is None:
        mongod = MongodProcess()
        mongod.start()
        url = mongod.url
    try:
        if args.append_experiment:
            append_experiment(url, 40 if args.quick else 200)
            code = 0
        else:
            code = asyncio.run(main(url, args.quick))
    finally:
        if mongod is not None:
            mongod.stop()
    sys.exit(code)


if __name__ == "__main__":
    run()
