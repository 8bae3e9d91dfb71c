"""MongoDB: a three-member replica set loses its primary (or a secondary) under load.

Each scenario runs racing writers on every store of one ``connect()`` bundle
(see :mod:`failover.load`), injects the fault, waits for the first commit
after it, heals the set and checks every attempt against what the primary
holds, read over a direct connection of its own
(:class:`failover.witness.MongoWitness`): nothing acknowledged is lost, every
unknown outcome resolves to applied-once or not-applied, and no version is
acknowledged twice.
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
from failover.witness import MongoWitness
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


def _faults(
    cluster: ReplicaSet, scenario: str, notes: list[str], former_primaries: list[Member]
) -> tuple[Fault, Fault | None]:
    """The fault of ``scenario`` and its healing; killed primaries go to ``former_primaries``."""
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
            former_primaries.append(member)
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

    if scenario.startswith("kill-9-primary-in-flight"):
        killed: list[Member] = []

        async def kill_in_flight() -> float | None:
            primary = await asyncio.to_thread(cluster.primary)
            others = [m for m in cluster.members if m is not primary]
            for member in others:
                member.pause()
            # Majority writes now wait on the primary; kill it before it steps down
            # (it would after electionTimeoutMillis without a majority).
            await asyncio.sleep(0.8)
            await asyncio.to_thread(primary.kill)
            killed_at = time.monotonic()
            killed.append(primary)
            former_primaries.append(primary)
            # The secondaries crash too, losing whatever oplog they had received but not
            # applied; they restart and elect one of them. Only what a majority journaled
            # survives; the old primary rolls back the rest when it returns.
            for member in others:
                await asyncio.to_thread(member.kill)
                member.start()
            for member in others:
                await asyncio.to_thread(member.wait_up)
            notes.append(
                f"both secondaries stopped (SIGSTOP) for 0.8 s, then member {primary.index} "
                "(primary) killed with SIGKILL with writes waiting for a majority, then both "
                "secondaries killed with SIGKILL and restarted"
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
    [
        "step-down",
        "kill-9-primary",
        "lagging-secondary",
        "kill-9-primary-in-flight",
        # w=1 in the URL must not weaken any store: every one writes with majority.
        "kill-9-primary-in-flight-w1",
    ],
)
async def test_mongo_failover(replica_set: ReplicaSet, scenario: str) -> None:
    await asyncio.to_thread(replica_set.repair)
    await asyncio.to_thread(replica_set.wait_healthy)
    report = Report(scenario, "mongo, 3-member replica set")
    former_primaries: list[Member] = []
    fault, heal = _faults(replica_set, scenario, report.notes, former_primaries)
    # The last scenario sets w=1 in the URL: the thread store must ignore it (its
    # commits are always majority); every store must keep what it acknowledged.
    url = replica_set.url + ("&w=1" if scenario.endswith("-w1") else "")
    db_name = f"failover_{scenario.replace('-', '_')}"
    witness = MongoWitness([member.host for member in replica_set.members], db_name)
    async with connect(url, db_name=db_name) as stores:
        load = Load(stores)
        await load.setup()
        await load.run(fault, heal=heal)
        await load.verify(report, witness)
        # The same store objects, never reopened, work against the current primary.
        await commit_once_more(stores, load.thread_ids[0])
    await asyncio.to_thread(replica_set.wait_healthy)
    states = await asyncio.to_thread(replica_set.states)
    report.notes.append(f"afterwards: {sorted(states.values())}")
    record(report)
    for member in former_primaries:  # a killed primary came back as a secondary
        assert states[member.index] == "SECONDARY", states
    assert report.ok, report.render()
    assert sum(report.acknowledged.values()) > 0
