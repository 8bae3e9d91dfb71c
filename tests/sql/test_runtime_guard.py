"""The SQL execution guard under contention, its fencing counter and its clock.

32 workers on four guards (four clients: separate connections, and on SQLite
separate writer connections racing for the database lock) contend for four
resources; then two processes do the same on one database. Every worker logs
entering and leaving its critical section with its fencing token; from that
log no resource ever has two holders, and on each resource the tokens
strictly increase in the order the locks were held.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pai_storage_sql.client import SqlClient
from pai_storage_sql.guard import SqlExecutionGuard
from sqlalchemy import text

from pai_storage import ManualClock

from .conftest import Target

pytestmark = pytest.mark.asyncio

WORKERS = 32
RESOURCES = 4
GUARDS = 4
ROUNDS = 3


async def test_contending_workers_never_share_a_lock(target: Target) -> None:
    guards = [
        SqlExecutionGuard(
            target.url,
            **target.options,
            lock_timeout=timedelta(minutes=5),
            lease_ttl=timedelta(minutes=5),
            retry_interval=timedelta(milliseconds=5),
        )
        for _ in range(GUARDS)
    ]
    log: list[tuple[str, str, int, int]] = []
    rng = random.Random(7)
    pauses = [[rng.random() / 500 for _ in range(ROUNDS)] for _ in range(WORKERS)]

    async def worker(n: int) -> None:
        guard = guards[n % GUARDS]
        for r in range(ROUNDS):
            resource = f"sandbox-{(n + r) % RESOURCES}"
            async with guard.hold(resource, owner=f"worker-{n}") as lock:
                log.append(("enter", resource, lock.fencing_token, n))
                await asyncio.sleep(pauses[n][r])
                assert not lock.lost.is_set()
                log.append(("leave", resource, lock.fencing_token, n))

    try:
        for guard in guards:
            await guard.initialize()
        await asyncio.gather(*(worker(n) for n in range(WORKERS)))
    finally:
        for guard in guards:
            await guard.close()

    assert len(log) == 2 * WORKERS * ROUNDS
    check_log(log)


def check_log(log: list[tuple[str, str, int, Any]]) -> None:
    """No resource has two holders at once; tokens grow per resource, unique store-wide."""
    holders: dict[str, tuple[int, Any] | None] = {}
    last_token: dict[str, int] = {}
    for event, resource, token, who in log:
        if event == "enter":
            assert holders.get(resource) is None, f"{resource}: two holders at once"
            assert token > last_token.get(resource, 0), f"{resource}: fencing went backwards"
            holders[resource] = (token, who)
            last_token[resource] = token
        else:
            assert holders[resource] == (token, who)
            holders[resource] = None
    assert all(holder is None for holder in holders.values())
    tokens = [token for event, _, token, _ in log if event == "enter"]
    assert len(set(tokens)) == len(tokens)  # one token per acquisition, store-wide


PROCESS = """
import asyncio, json, os, sys
from datetime import timedelta
from pai_storage_sql.guard import SqlExecutionGuard

async def main(url, options, name, log_path, workers, rounds, resources):
    guard = SqlExecutionGuard(
        url, **json.loads(options), busy_timeout=60, lock_timeout=timedelta(minutes=5),
        retry_interval=timedelta(milliseconds=5),
    )
    await guard.initialize()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    print("ready", flush=True)
    sys.stdin.readline()  # every process starts together

    async def worker(n):
        for r in range(rounds):
            resource = f"sandbox-{(n + r) % resources}"
            async with guard.hold(resource, owner=f"{name}-{n}") as lock:
                os.write(fd, f"enter {resource} {lock.fencing_token} {name}-{n}\\n".encode())
                await asyncio.sleep(0.001 * (n % 3))
                os.write(fd, f"leave {resource} {lock.fencing_token} {name}-{n}\\n".encode())

    try:
        await asyncio.gather(*(worker(n) for n in range(workers)))
    finally:
        os.close(fd)
        await guard.close()
    print("done", flush=True)

asyncio.run(main(*sys.argv[1:5], *map(int, sys.argv[5:8])))
"""


async def test_two_processes_never_share_a_lock(target: Target, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(PROCESS)
    log_path = tmp_path / "holders.log"
    log_path.write_text("")
    workers, rounds = 8, 3
    async with SqlExecutionGuard(target.url, **target.options):
        pass  # the tables exist before the processes start
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            target.url,
            json.dumps(target.options),
            name,
            str(log_path),
            str(workers),
            str(rounds),
            str(RESOURCES),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for name in ("p1", "p2")
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stderr is not None
        if (await proc.stdout.readline()).strip() != b"ready":
            pytest.fail((await proc.stderr.read()).decode())
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    outputs = [await proc.communicate() for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    log = []
    for line in log_path.read_text().splitlines():
        event, resource, token, who = line.split(" ")
        log.append((event, resource, int(token), who))
    assert len(log) == 2 * 2 * workers * rounds
    assert {who.split("-")[0] for _, _, _, who in log} == {"p1", "p2"}
    check_log(log)


async def test_fencing_counter_survives_lock_deletion(target: Target) -> None:
    clock = ManualClock()
    guard = SqlExecutionGuard(target.url, **target.options, clock=clock)
    try:
        first = await guard.try_acquire("r", owner="a", lease_ttl=timedelta(seconds=1))
        assert first is not None
        clock.advance(timedelta(seconds=2))
        assert await guard.purge_expired() == 1
        assert await guard.inspect("r") is None
        second = await guard.try_acquire("r", owner="b")
        assert second is not None
        assert second.fencing_token > first.fencing_token
        assert await second.release() is True
        assert await first.release() is False  # its lease ended long ago
    finally:
        await guard.close()
    # A new client on the same tables keeps counting.
    again = SqlExecutionGuard(target.url, **target.options, clock=clock)
    try:
        third = await again.try_acquire("other", owner="c")
        assert third is not None
        assert third.fencing_token > second.fencing_token
        await third.release()
    finally:
        await again.close()


async def test_busy_acquisition_uses_no_token(target: Target) -> None:
    guard = SqlExecutionGuard(target.url, **target.options)
    try:
        held = await guard.try_acquire("r", owner="a")
        assert held is not None
        for _ in range(5):
            assert await guard.try_acquire("r", owner="b") is None
        await held.release()
        after = await guard.try_acquire("r", owner="b")
        assert after is not None
        assert after.fencing_token == held.fencing_token + 1
        await after.release()
    finally:
        await guard.close()


async def test_mysql_leases_run_on_the_server_clock(mysql_target: Target) -> None:
    client = SqlClient.shared(mysql_target.url, **mysql_target.options)
    guard = SqlExecutionGuard(client=client, lease_ttl=timedelta(minutes=10))
    try:
        lock = await guard.try_acquire("r", owner="a")
        assert lock is not None
        engines = await client.ready()
        async with engines.reader.connect() as conn:
            server: Any = (await conn.execute(text("SELECT UTC_TIMESTAMP(3)"))).scalar_one()
        server_now = server.replace(tzinfo=UTC)
        assert abs(lock.acquired_at - server_now) < timedelta(minutes=1)
        assert lock.expires_at - lock.acquired_at == timedelta(minutes=10)
        assert lock.acquired_at.tzinfo is not None
        info = await guard.inspect("r")
        assert info is not None
        assert info.acquired_at == lock.acquired_at
        assert info.expires_at == lock.expires_at
        assert isinstance(info.acquired_at, datetime)
        await lock.release()
    finally:
        await guard.close()
