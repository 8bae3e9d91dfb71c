"""The failover check judges what a witness reads, never what the stores under test answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from failover.load import Load, Report
from pai_storage import connect

pytestmark = pytest.mark.asyncio


class _EmptyWitness:
    """A server that holds none of what the stores acknowledged."""

    def describe(self) -> str:
        return "an empty server"

    async def messages(self, scope_key: str, thread_id: str) -> tuple[int, list[tuple[str, str]]]:
        return 0, []

    async def kv(self, namespace: Sequence[str], key: str) -> tuple[int, Any] | None:
        return None

    async def state_list(self, user_key: str, session_id: str, key: str) -> list[Any]:
        return []


async def test_acknowledged_writes_the_witness_does_not_see_are_lost() -> None:
    """The stores still hold every write; the witness holds none: every acknowledged
    thread, key-value and agent-state write is reported lost."""

    async def no_fault() -> float | None:
        return None

    async with connect("memory://") as stores:
        load = Load(stores)
        await load.setup()
        await load.run(no_fault, before=0.3, hold=0.0, after=0.3)
        report = Report("no fault, an empty witness", "memory")
        await load.verify(report, _EmptyWitness())
    for store in ("threads", "kv", "state"):
        acknowledged = report.acknowledged[store]
        assert acknowledged > 0, report.render()
        assert report.found[store] == 0, report.render()
        lost = [entry for entry in report.lost if entry.startswith(f"{store} ")]
        assert len(lost) == acknowledged, report.render()
    assert not report.ok
    assert "verified with an empty server" in report.notes
