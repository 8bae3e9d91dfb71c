"""A scenario the optimistic commits of PostgreSQL and SQLite share: it needs
two stores on one database, which the conformance fixtures do not offer."""

from __future__ import annotations

from pai_storage import CommittedResult, ConflictResult, ThreadStore
from pai_storage import builders as b

__all__ = ["append_judged_by_stale_facts"]


async def append_judged_by_stale_facts(
    store: ThreadStore, other: ThreadStore
) -> CommittedResult | ConflictResult:
    """``store`` commits version 2 (run ``r1`` open, owning the tail); ``other``
    finishes the run. ``store`` then appends a standalone message to version 2:
    against the facts it kept the message breaks a rule, but the version is
    gone. Returns that append's result (the held judgement's conflict)."""
    created = await store.commit_thread(b.create("s", "t"))
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    started = await store.commit_thread(
        b.update_at(
            "s",
            "t",
            created.thread.version,
            {
                "messages": [b.insert(b.message("m1", run_id="r1", relation="input"))],
                "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
            },
            root=b.root(),
        )
    )
    assert isinstance(started, CommittedResult)
    assert started.thread is not None
    known = started.thread.version
    finished = await other.commit_thread(
        b.update_at(
            "s",
            "t",
            known,
            {"runs": [b.replace(b.run("r1", "completed", inputs=["m1"]))]},
            root=b.root(),
        )
    )
    assert isinstance(finished, CommittedResult)
    return await store.commit_thread(
        b.update_at("s", "t", known, {"messages": [b.insert(b.message("m2"))]}, root=b.root())
    )
