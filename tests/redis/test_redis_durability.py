"""Durability on a throwaway server: SIGKILL under load, restart, count acknowledged writes.

With ``appendonly yes`` and ``appendfsync always`` Redis fsyncs the AOF before
it answers a write, so every write a store call returned from must be there
after ``kill -9`` and a restart. Fencing tokens must keep increasing across a
restart too -- even one that lost everything (no persistence at all), because
a new token is never below the server's time in microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import pytest
from redis_servers import RedisServer

from pai_storage import OutcomeUnknownError, StorageError, UnavailableError, connect

LOST = (UnavailableError, OutcomeUnknownError)
"""What a call in flight when the server dies raises."""


async def _load(
    stores: object, acked: dict[str, list[object]], enough: asyncio.Event, workers: int = 8
) -> None:
    """Write until the server dies; record every acknowledged write."""
    kv = stores.kv  # type: ignore[attr-defined]
    state = stores.state  # type: ignore[attr-defined]
    guard = stores.guard  # type: ignore[attr-defined]

    async def put(worker: int) -> None:
        for i in range(1_000_000):
            key = f"w{worker}-{i}"
            await kv.put(("load",), key, {"worker": worker, "i": i})
            acked["kv"].append(key)
            if len(acked["kv"]) >= 600:
                enough.set()

    async def append(worker: int) -> None:
        for i in range(1_000_000):
            item = f"a{worker}-{i}"
            await state.append_list("user", "session", "log", [item])
            acked["list"].append(item)

    async def lock(worker: int) -> None:
        for i in range(1_000_000):
            held = await guard.try_acquire(f"res-{worker}-{i % 3}", owner=f"w{worker}")
            if held is not None:
                acked["fence"].append(held.fencing_token)
                await held.release()

    tasks = [asyncio.create_task(f(w)) for w in range(workers) for f in (put, append, lock)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        assert isinstance(result, LOST), f"unexpected failure under load: {result!r}"


async def test_sigkill_under_load_loses_no_acknowledged_write(
    redis_server_factory: type[RedisServer],
) -> None:
    server = redis_server_factory("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    acked: dict[str, list[object]] = {"kv": [], "list": [], "fence": []}
    enough = asyncio.Event()
    stores = connect(server.url, key_prefix="durable:", lease_ttl=timedelta(seconds=30))
    async with stores:
        load = asyncio.create_task(_load(stores, acked, enough))
        await asyncio.wait_for(enough.wait(), timeout=120)
        server.kill()  # mid-flight: some calls are still waiting for their answer
        await asyncio.wait_for(load, timeout=120)
        with contextlib.suppress(StorageError):
            await stores.close()
    assert len(acked["kv"]) >= 600
    assert acked["list"]
    assert acked["fence"]

    server.start()  # the same directory: Redis replays its AOF
    async with connect(server.url, key_prefix="durable:") as after:
        keys = [str(k) for k in acked["kv"]]
        found: set[str] = set()
        for start in range(0, len(keys), 1000):
            found.update(await after.kv.get_many(("load",), keys[start : start + 1000]))
        lost = [k for k in keys if k not in found]
        assert lost == [], f"{len(lost)} of {len(keys)} acknowledged puts lost"
        items = await after.state.get_list("user", "session", "log")
        missing = set(map(str, acked["list"])) - set(items)
        assert not missing, f"{len(missing)} acknowledged appends lost"
        assert len(items) == len(set(items)), "an append was applied twice"
        lock = await after.guard.try_acquire("res-after-restart", owner="checker")
        assert lock is not None
        assert lock.fencing_token > max(int(str(f)) for f in acked["fence"])
        await lock.release()


@pytest.mark.parametrize(
    "config",
    [
        ("--appendonly", "yes", "--appendfsync", "always"),
        ("--appendonly", "no"),  # no persistence: the restarted server is empty
    ],
    ids=["aof-always", "no-persistence"],
)
async def test_fencing_tokens_increase_across_a_restart(
    redis_server_factory: type[RedisServer], config: tuple[str, ...]
) -> None:
    server = redis_server_factory(*config)
    server.start()
    fences = []
    async with connect(server.url, key_prefix="fence:") as stores:
        for i in range(20):
            lock = await stores.guard.try_acquire(f"r{i % 3}", owner="before")
            assert lock is not None
            fences.append(lock.fencing_token)
            await lock.release()
        server.kill()
        with contextlib.suppress(StorageError):
            await stores.close()
    assert fences == sorted(fences)
    assert len(set(fences)) == len(fences)
    server.start()
    async with connect(server.url, key_prefix="fence:") as stores:
        for i in range(3):
            lock = await stores.guard.try_acquire(f"r{i}", owner="after")
            assert lock is not None
            assert lock.fencing_token > fences[-1]
            fences.append(lock.fencing_token)
            await lock.release()
