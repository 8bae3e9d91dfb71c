"""SQLite optimistic commits that must be judged again, held: in the same
transaction (so no other commit gets in between), and with the held
commit's outcome."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pai_storage_sql import SqlThreadStore
from support.optimistic import append_judged_by_stale_facts

from pai_storage import CommittedResult, ConflictResult, ThreadVersion
from pai_storage import builders as b

pytestmark = pytest.mark.asyncio

_START = {
    "messages": [b.insert(b.message("m1", run_id="r1", relation="input"))],
    "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
}


async def _commit(store: SqlThreadStore, version: ThreadVersion, changes: dict) -> ThreadVersion:  # type: ignore[type-arg]
    result = await store.commit_thread(b.update_at("s", "t", version, changes, root=b.root()))
    assert isinstance(result, CommittedResult), result
    assert result.thread is not None
    return result.thread.version


def _next(version: ThreadVersion) -> ThreadVersion:
    return ThreadVersion(
        thread_instance_id=version.thread_instance_id, revision=version.revision + 1
    )


async def test_a_commit_judged_again_keeps_its_place_before_the_next(tmp_path: Path) -> None:
    """A client pipelines two commits: the first falls back from its optimistic
    judgement (a message of a finished run: the facts on the root know open runs
    only), the second names the version the first writes. The second still
    finds it."""
    async with SqlThreadStore(f"sqlite:///{tmp_path}/t.db") as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = await _commit(store, created.thread.version, _START)
        version = await _commit(
            store, version, {"runs": [b.replace(b.run("r1", "completed", inputs=["m1"]))]}
        )
        late = b.message("late", run_id="r1", relation="output")
        first, second = await asyncio.gather(
            store.commit_thread(
                b.update_at("s", "t", version, {"messages": [b.insert(late)]}, root=b.root())
            ),
            store.commit_thread(
                b.update_at(
                    "s",
                    "t",
                    _next(version),
                    {"messages": [b.insert(b.message("m3"))]},
                    root=b.root(),
                )
            ),
        )
        assert isinstance(first, CommittedResult), first
        assert isinstance(second, CommittedResult), second


async def test_a_rule_broken_only_by_the_known_facts_is_the_held_commits_conflict(
    tmp_path: Path,
) -> None:
    """The store knows version 2 (run ``r1`` open, owning the tail); another store
    finished the run since. Against the known facts a standalone message breaks
    a rule, but the commit names a version that is gone: the held judgement's
    conflict, not the optimistic judgement's error."""
    url = f"sqlite:///{tmp_path}/t.db"
    async with SqlThreadStore(url) as store, SqlThreadStore(url) as other:
        result = await append_judged_by_stale_facts(store, other)
        assert isinstance(result, ConflictResult), result
