"""MongoDB: a watcher follows a streamed reply while the primary goes away (issue 38).

A watcher (``store.watch`` on a store of its own, connected to the three-member
replica set, polling only once an hour so that only its change stream wakes it)
follows a thread while a writer streams chunk commits into a reply. Mid-reply
the primary steps down (``replSetStepDown``) or is killed with SIGKILL, the
harness's faults of :mod:`failover.test_mongo_failover`; the writer retries each
chunk until the new primary acknowledges it. The watcher's changes must form an
unbroken chain of strictly increasing versions from where it started to the
final acknowledged version, within a bound: its change stream survived the
election (a stepped-down member keeps the cursor; a killed one makes the stream
resume on the new primary) and no final version was lost.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

pytest.importorskip("pymongo")

from pai_storage_mongo.store import MongoThreadStore

from failover.mongo_cluster import Member, ReplicaSet
from pai_storage import ThreadChange, ThreadVersion
from pai_storage.conversation import Reply
from pai_storage.errors import ThreadStoreCommitUnknownError, ThreadStoreUnavailableError

pytestmark = pytest.mark.asyncio

CHUNKS = 40
FAULT_AT = 10  # the chunk after which the primary goes (the writer keeps going)
LONG = 3600.0  # seconds between polls: only the change stream wakes the watcher
BOUND = 60.0  # seconds the whole scenario may take, election included
DB = "failover_watch"
SCOPE = "tenant"


# A set of this module's own, started as test_mongo_failover starts its set.
@pytest.fixture(scope="module")
def replica_set() -> Iterator[ReplicaSet]:
    cluster = ReplicaSet()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


async def _write(answer: Reply, chunk: str) -> int:
    """Write one chunk and retry its commit until acknowledged; the number of failed tries.

    A failed commit leaves the chunk in the reply's text, so ``flush()`` commits
    the same text again; after an unknown outcome that was applied, the retry
    finds the head moved, re-reads it and commits that text once more.
    """
    failures = 0
    try:
        await answer.write(chunk)
        return 0
    except (ThreadStoreUnavailableError, ThreadStoreCommitUnknownError):
        failures += 1
    while True:
        await asyncio.sleep(0.1)  # no primary yet: the election takes its time
        try:
            await answer.flush()
            return failures
        except (ThreadStoreUnavailableError, ThreadStoreCommitUnknownError):
            failures += 1


async def _collect(
    changes: asyncio.Queue[ThreadChange],
    watcher: MongoThreadStore,
    thread: str,
    start: ThreadVersion,
) -> None:
    async for change in watcher.watch(SCOPE, thread, after=start, interval=LONG):
        changes.put_nowait(change)


async def _fault(cluster: ReplicaSet, scenario: str) -> Member:
    """Take the primary away; the member that was primary."""
    if scenario == "step-down":
        return await asyncio.to_thread(cluster.step_down)
    primary = await asyncio.to_thread(cluster.primary)
    await asyncio.to_thread(primary.kill)  # the next test's repair() starts it again
    return primary


# A step-down leaves the stream's cursor open on the member, now a secondary (since
# MongoDB 4.2 it kills only writes); a killed primary makes the stream resume on the
# member elected in its place.
@pytest.mark.parametrize("scenario", ["step-down", "kill-9-primary"])
async def test_a_watcher_loses_no_final_version(replica_set: ReplicaSet, scenario: str) -> None:
    await asyncio.to_thread(replica_set.repair)
    await asyncio.to_thread(replica_set.wait_healthy)
    writer = MongoThreadStore(replica_set.url, db_name=DB)
    watcher = MongoThreadStore(replica_set.url, db_name=DB)
    thread = f"chat-{scenario}"
    async with writer, watcher, asyncio.timeout(BOUND):
        chat = writer.conversation(SCOPE, thread, flush_every=0)
        await chat.add("user", "tell me a story")
        first = await chat.get()
        assert first is not None
        start = first.version
        queue: asyncio.Queue[ThreadChange] = asyncio.Queue()
        following = asyncio.create_task(_collect(queue, watcher, thread, start))
        faulted: asyncio.Task[Member] | None = None
        old_primary = new_primary = None
        failures = 0
        try:
            async with chat.reply() as answer:
                for i in range(CHUNKS):
                    failures += await _write(answer, f"chunk {i} ")
                    if i == FAULT_AT:  # mid-stream; the writer does not wait for it
                        faulted = asyncio.create_task(_fault(replica_set, scenario))
                    if i == CHUNKS // 2 and faulted is not None:
                        old_primary = await faulted
                        new_primary = await asyncio.to_thread(replica_set.primary)
            # Read on the new primary after the last acknowledged commit (the reply's close).
            root = await writer.conversation(SCOPE, thread).get()
            assert root is not None
            final = root.version
            seen = await _until(queue, final)
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        last = (await chat.messages(last=1))[0]
    # The second half of the reply was written on the member elected in its place.
    assert new_primary is not old_primary
    # What was acknowledged is there: every chunk, the reply closed.
    assert last.text == "".join(f"chunk {i} " for i in range(CHUNKS))
    assert last.status == "complete"
    # Open, CHUNKS chunks and the close; an unknown outcome that was applied adds one.
    assert final.revision >= start.revision + CHUNKS + 2
    _check_chain(seen, start, final)
    assert len(seen) > 3, seen  # woken by the stream, not once an hour
    print(f"{scenario}: {len(seen)} changes, {failures} failed commit attempts")


async def _until(queue: asyncio.Queue[ThreadChange], final: ThreadVersion) -> list[ThreadChange]:
    """The watcher's changes up to the one reporting ``final`` (bounded by the caller)."""
    seen: list[ThreadChange] = []
    while not seen or seen[-1].version != final:
        seen.append(await queue.get())
    return seen


def _check_chain(seen: list[ThreadChange], start: ThreadVersion, final: ThreadVersion) -> None:
    """Strictly increasing versions, each change starting where the last ended, start to final."""
    assert not any(change.deleted for change in seen)
    versions = [change.version for change in seen]
    assert all(v is not None and v.thread_instance_id == start.thread_instance_id for v in versions)
    revisions = [v.revision for v in versions if v is not None]
    assert revisions == sorted(set(revisions)), revisions
    assert seen[0].previous == start
    assert seen[-1].version == final
    for one, two in itertools.pairwise(seen):
        assert two.previous == one.version
    assert sum(change.commits or 0 for change in seen) == final.revision - start.revision
