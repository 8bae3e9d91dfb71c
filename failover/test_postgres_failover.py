"""PostgreSQL: the primary dies under load and its hot standby is promoted.

The stores are opened once with a multi-host URL
(``postgresql://postgres@primary,standby/test?target_session_attrs=read-write``)
and never reopened: after the primary is stopped with ``immediate`` mode and
the standby promoted, the same stores must find the new primary by themselves.
Every attempt is then checked against what the promoted standby holds, read
with asyncpg (see :mod:`failover.load`, :mod:`failover.witness`).

With a synchronous standby nothing acknowledged may be lost. The mutation test
leaves the standby asynchronous and cuts the replication stream before the
primary dies: the commits acknowledged meanwhile exist nowhere else, and the
check must say so (a check that passed it could not detect a loss).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("asyncpg")

from failover.load import Load, Report, commit_once_more
from failover.pg_cluster import StandbyPair
from failover.reporting import record
from failover.witness import PostgresWitness
from pai_storage import connect

pytestmark = pytest.mark.asyncio

# How long the primary stays dead before the standby is promoted (an
# orchestrator noticing the failure); writers meanwhile find no read-write server.
DETECTION_S = 1.0


@pytest.fixture
def standby_pair() -> Iterator[StandbyPair]:
    pair = StandbyPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.drop()


@pytest.fixture
def asynchronous_pair() -> Iterator[StandbyPair]:
    pair = StandbyPair(synchronous=False)
    try:
        pair.start()
        yield pair
    finally:
        pair.drop()


async def _fail_over(pair: StandbyPair, report: Report, *, cut: bool) -> Report:
    """The load, the fault (``cut``: the replication stream first), the check."""

    async def fault() -> float | None:
        if cut:
            await asyncio.to_thread(pair.cut_replication)
            report.notes.append("replication stream cut 1 s before the primary stopped")
            await asyncio.sleep(1.0)
        await asyncio.to_thread(pair.stop_primary)
        stopped = time.monotonic()
        report.notes.append("primary stopped with pg_ctlcluster stop -m immediate")
        await asyncio.sleep(DETECTION_S)
        await asyncio.to_thread(pair.promote_standby)
        report.notes.append(f"standby promoted {time.monotonic() - stopped:.2f} s after the stop")
        return stopped

    async with connect(pair.url) as stores:
        load = Load(stores)
        await load.setup()
        await load.run(fault)
        # Judged on what the promoted standby holds, read with a client of its own.
        await load.verify(report, PostgresWitness(pair.standby.port))
        # The same store objects, never reopened, work against the promoted standby.
        await commit_once_more(stores, load.thread_ids[0])
    record(report)
    return report


@pytest.mark.parametrize("in_flight", [False, True], ids=["stop-primary", "stop-primary-in-flight"])
async def test_postgres_standby_promotion(standby_pair: StandbyPair, in_flight: bool) -> None:
    """``in_flight``: the replication stream is cut first, so the primary's commits wait
    for the standby; the primary dies with them in flight, and each of those is an
    unknown outcome."""
    report = Report(
        "primary stopped (immediate), standby promoted"
        + (", commits waiting for the cut standby" if in_flight else ""),
        "postgres, primary + synchronous hot standby",
    )
    await _fail_over(standby_pair, report, cut=in_flight)
    assert report.ok, report.render()
    assert sum(report.acknowledged.values()) > 0
    if in_flight:
        assert report.unknown, report.render()  # the commits that waited for the standby


async def test_an_asynchronous_standby_loses_acknowledged_commits_and_the_check_says_so(
    asynchronous_pair: StandbyPair,
) -> None:
    """The mutation: with the standby asynchronous, commits acknowledged after the cut
    exist on the dead primary only; the check must report them lost."""
    report = Report(
        "MUTATION (loss expected): asynchronous standby, replication cut, primary stopped, "
        "standby promoted",
        "postgres, primary + asynchronous hot standby",
    )
    await _fail_over(asynchronous_pair, report, cut=True)
    assert not report.ok
    assert report.lost, report.render()
    assert any(entry.startswith("threads ") for entry in report.lost), report.render()
