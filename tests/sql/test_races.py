"""Racing commits inside one process, on both databases: one winner, the others
report the winner's version.

On MariaDB each commit runs on its own pooled connection, so the races are
real: creates meet on the primary key (the losers' inserts wait for the
winner and then see its row), updates on the root's ``SELECT ... FOR UPDATE``.
On SQLite they queue on the writer connection.
"""

from __future__ import annotations

import asyncio

import pytest

from pai_storage import CommittedResult, ConflictResult
from pai_storage import builders as b

from .conftest import Target

pytestmark = pytest.mark.asyncio

RACERS = 8


async def test_racing_creates_and_updates_have_one_winner(target: Target) -> None:
    async with target.store(pool_size=RACERS) as store:
        creates = await asyncio.gather(
            *(
                store.commit_thread(
                    b.create("race", "t", {"messages": [b.insert(b.message(f"m{i}"))]})
                )
                for i in range(RACERS)
            )
        )
        won = [r for r in creates if isinstance(r, CommittedResult)]
        assert len(won) == 1
        assert won[0].thread is not None
        version = won[0].thread.version
        lost = [r for r in creates if isinstance(r, ConflictResult)]
        assert len(lost) == RACERS - 1
        assert all(r.current_version == version for r in lost)

        updates = await asyncio.gather(
            *(
                store.commit_thread(
                    b.update_at(
                        "race",
                        "t",
                        version,
                        {"messages": [b.insert(b.message(f"u{i}"))]},
                        root=b.root(),
                    )
                )
                for i in range(RACERS)
            )
        )
        won = [r for r in updates if isinstance(r, CommittedResult)]
        assert len(won) == 1
        assert won[0].thread is not None
        winner = won[0].thread.version
        assert winner.revision == version.revision + 1
        assert all(
            isinstance(r, ConflictResult) and r.current_version == winner
            for r in updates
            if r is not won[0]
        )
        read = await store.read_thread(
            b.read("race", "t", messages={"type": "page", "view": "raw", "page": {"limit": 50}})
        )
        assert read.messages is not None
        assert len(read.messages.items) == 2  # the winning create's and update's messages
