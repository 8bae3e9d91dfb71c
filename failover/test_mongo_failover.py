"""MongoDB: a three-member replica set loses its primary (or a secondary) under load.

Each scenario runs racing writers on every store of one ``connect()`` bundle
(see :mod:`failover.load`), injects the fault, waits for the first commit
after it, heals the set and checks every attempt against a re-read through the
same stores: nothing acknowledged is lost, every unknown outcome resolves to
applied-once or not-applied, and no version is acknowledged twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

pytest.importorskip("pymongo")

from failover.load import Load, Report, commit_once_more
from failover.mongo_cluster import Member, ReplicaSet
from failover.reporting import record
from pai_storage import connect

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def replica_set() -> Iterator[ReplicaSet]:
    cluster = ReplicaSet()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


Fault = Callable[[], Awaitable[float | None]]


def _faults(cluster: ReplicaSet, scenario: str, notes: list[str]) -> tuple[Fault, Fault | None]:
    if scenario == "step-down":

        async def step_down() -> float | None:
            member = await asyncio.to_thread(cluster.step_down)
            notes.append(f"member {member.index} stepped down")
            return None

        return step_down, None

    if scenario == "kill-9-primary":
        victim: list[Member] = []

        async def kill() -> float | None:
            member = await asyncio.to_thread(cluster.primary)
            victim.append(member)
            await asyncio.to_thread(member.kill)
            notes.append(f"member {member.index} (primary) killed with SIGKILL")
            return None

        async def restart() -> float | None:
            member = victim[0]
            member.start()
            await asyncio.to_thread(member.wait_up)
            notes.append(f"member {member.index} restarted")
            return None

        return kill, restart

    if scenario == "kill-9-primary-in-flight":
        killed: list[Member] = []

        async def kill_in_flight() -> float | None:
            primary = await asyncio.to_thread(cluster.primary)
            others = [m for m in cluster.members if m is not primary]
            for member in others:
                member.pause()
            # Majority commits now wait on the primary; kill it before it steps down
            # (it would after electionTimeoutMillis without a majority).
            await asyncio.sleep(0.8)
            await asyncio.to_thread(primary.kill)
            killed_at = time.monotonic()
            killed.append(primary)
            for member in others:
                member.resume()
            notes.append(
                f"both secondaries stopped (SIGSTOP) for 0.8 s, then member {primary.index} "
                "(primary) killed with SIGKILL with the writes waiting for a majority, then "
                "the secondaries continued"
            )
            return killed_at

        async def restart_killed() -> float | None:
            member = killed[0]
            member.start()
            await asyncio.to_thread(member.wait_up)
            notes.append(f"member {member.index} restarted")
            return None

        return kill_in_flight, restart_killed

    paused: list[Member] = []

    async def pause() -> float | None:
        member = await asyncio.to_thread(cluster.secondary)
        paused.append(member)
        member.pause()
        notes.append(f"member {member.index} (secondary) stopped with SIGSTOP")
        return None

    async def resume() -> float | None:
        paused[0].resume()
        notes.append(f"member {paused[0].index} continued with SIGCONT")
        return None

    return pause, resume


@pytest.mark.parametrize(
    "scenario",
    ["step-down", "kill-9-primary", "lagging-secondary", "kill-9-primary-in-flight"],
)
async def test_mongo_failover(replica_set: ReplicaSet, scenario: str) -> None:
    await asyncio.to_thread(replica_set.wait_healthy)
    report = Report(scenario, "mongo, 3-member replica set")
    fault, heal = _faults(replica_set, scenario, report.notes)
    async with connect(replica_set.url, db_name=f"failover_{scenario.replace('-', '_')}") as stores:
        load = Load(stores)
        await load.setup()
        await load.run(fault, heal=heal)
        await load.verify(report)
        # A write concern error in a findAndModify reply (a primary stepping down while a
        # key-value or guard write waits for a majority) escapes as a raw AttributeError:
        # reproduced deterministically (strict xfail) by failover/test_mongo_outcomes.py;
        # listed in the report, not judged here.
        report.set_aside(
            lambda entry: "AttributeError: 'RawBSONDocument' object has no attribute" in entry,
            "test_kv_write_concern_error_is_retried_or_unknown",
        )
        # The same store objects, never reopened, work against the current primary.
        await commit_once_more(stores, load.thread_ids[0])
    await asyncio.to_thread(replica_set.wait_healthy)
    states = await asyncio.to_thread(replica_set.states)
    report.notes.append(f"afterwards: {sorted(states.values())}")
    record(report)
    assert report.ok, report.render()
    assert sum(report.acknowledged.values()) > 0
