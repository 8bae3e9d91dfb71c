"""PostgreSQL: the primary dies under load and its synchronous hot standby is promoted.

The stores are opened once with a multi-host URL
(``postgresql://postgres@primary,standby/test?target_session_attrs=read-write``)
and never reopened: after the primary is stopped with ``immediate`` mode and
the standby promoted, the same stores must find the new primary by themselves.
Every attempt is then checked against a re-read (see :mod:`failover.load`).
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


@pytest.mark.parametrize("in_flight", [False, True], ids=["stop-primary", "stop-primary-in-flight"])
async def test_postgres_standby_promotion(standby_pair: StandbyPair, in_flight: bool) -> None:
    """``in_flight``: the standby is stopped (SIGSTOP) first, so the primary's commits wait
    for it; the primary dies with them in flight, and each of those is an unknown outcome."""
    report = Report(
        "primary stopped (immediate), standby promoted"
        + (", commits waiting for the standby" if in_flight else ""),
        "postgres, primary + synchronous hot standby",
    )

    async def fault() -> float | None:
        if in_flight:
            standby_pair.pause_standby()
            await asyncio.sleep(1.0)
        await asyncio.to_thread(standby_pair.stop_primary)
        stopped = time.monotonic()
        report.notes.append("primary stopped with pg_ctlcluster stop -m immediate")
        if in_flight:
            standby_pair.resume_standby()
            report.notes.append("the standby was stopped (SIGSTOP) 1 s before, continued now")
        await asyncio.sleep(DETECTION_S)
        await asyncio.to_thread(standby_pair.promote_standby)
        report.notes.append(f"standby promoted {time.monotonic() - stopped:.2f} s after the stop")
        return stopped

    async with connect(standby_pair.url) as stores:
        load = Load(stores)
        await load.setup()
        await load.run(fault)
        await load.verify(report)
        # The same store objects, never reopened, work against the promoted standby.
        await commit_once_more(stores, load.thread_ids[0])
    record(report)
    assert report.ok, report.render()
    assert sum(report.acknowledged.values()) > 0
