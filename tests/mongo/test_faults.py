"""Network faults around a commit, through a loopback TCP proxy in front of mongod.

Whatever the cut, a commit is applied whole or not at all, and the error says
which of the two it can promise: ``ThreadStoreUnavailableError`` (nothing was
applied) before the commit was sent, ``ThreadStoreCommitUnknownError`` once it
may have been.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo.harness import MongoHarness, drop_store_collections
from pai_storage_mongo.store import MongoThreadStore
from support.proxy import FaultProxy

from pai_storage import CommittedResult, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreCommitUnknownError, ThreadStoreUnavailableError

from .helpers import proxied_url

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def proxied(
    mongo_harness: MongoHarness, replica_port: int
) -> AsyncIterator[tuple[FaultProxy, MongoThreadStore, MongoThreadStore]]:
    """A proxy, a store that talks through it, and a direct store on the same collections."""
    proxy = FaultProxy(replica_port)
    await proxy.start()
    direct = mongo_harness.open_store()
    await direct.initialize()
    through = MongoThreadStore(
        proxied_url(proxy.port, serverSelectionTimeoutMS="1000"),
        db_name=direct.db_name,
        collection_name=direct.collection_name,
    )
    await through.initialize()
    try:
        yield proxy, through, direct
    finally:
        await through.close()
        await proxy.stop()
        # A cut leaves the server-side transaction orphaned until its lifetime limit
        # (60 s); end this test's sessions so dropping the collections need not wait.
        await direct.database.client.admin.command("killAllSessions", [])
        await drop_store_collections(direct)
        await direct.close()


async def _seed(store: MongoThreadStore, thread_id: str) -> ThreadVersion:
    created = await store.commit_thread(
        b.create("scope", thread_id, {"messages": [{"type": "insert", "record": b.message("m1")}]})
    )
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    return created.thread.version


def _turn(thread_id: str, version: ThreadVersion) -> dict[str, Any]:
    """An update that touches every family and the lease (so a partial write would show)."""
    return b.update_at(
        "scope",
        thread_id,
        version,
        {
            "messages": [
                {"type": "insert", "record": b.message("m2", run_id="r1")},
                {"type": "replace", "record": b.message("m1", "edited")},
            ],
            "runs": [
                {"type": "insert", "record": b.run("r1", inputs=["m2"])},
                {"type": "insert", "record": b.run("r2", "queued", queue_item_id="q1")},
            ],
            "queuedItems": [{"type": "insert", "record": b.queued_item("q1", "r2")}],
            "lease": b.acquire("r1", "w1"),
        },
        root=b.root(title="after"),
    )


async def _state(store: MongoThreadStore, thread_id: str) -> tuple[int, list[str], list[str], bool]:
    read = await store.read_thread(
        b.read(
            "scope",
            thread_id,
            messages={"type": "page", "view": "raw", "page": {"limit": 10}},
            runs={"type": "page", "page": {"limit": 10}},
            queuedItems={"type": "page", "page": {"limit": 10}},
        )
    )
    assert read.thread is not None
    assert read.messages is not None
    assert read.runs is not None
    assert read.queued_items is not None
    texts = [m.parts[0].text for m in read.messages.items]  # type: ignore[union-attr]
    runs = [r.run_id for r in read.runs.items] + [q.queue_item_id for q in read.queued_items.items]
    return read.thread.version.revision, texts, runs, read.thread.lease is not None


NOTHING = (1, ["m1"], [], False)
WHOLE = (2, ["edited", "m2"], ["r1", "r2", "q1"], True)


async def test_cut_before_the_commit_is_unavailable_and_applies_nothing(
    proxied: tuple[FaultProxy, MongoThreadStore, MongoThreadStore],
) -> None:
    proxy, through, direct = proxied
    version = await _seed(direct, "before")
    proxy.cut()
    with pytest.raises(ThreadStoreUnavailableError) as err:
        await through.commit_thread(_turn("before", version))
    assert err.value.__cause__ is not None
    proxy.restore()
    assert await _state(direct, "before") == NOTHING
    # The store recovers by itself once the server is reachable again.
    assert isinstance(await through.commit_thread(_turn("before", version)), CommittedResult)
    assert await _state(direct, "before") == WHOLE


@pytest.mark.parametrize(
    "marker",
    [b"findAndModify\x00", b"insert\x00", b"update\x00"],
    ids=["holding-the-root", "inserting-children", "replacing-children"],
)
async def test_cut_during_the_transaction_is_unavailable_and_applies_nothing(
    proxied: tuple[FaultProxy, MongoThreadStore, MongoThreadStore], marker: bytes
) -> None:
    proxy, through, direct = proxied
    thread_id = f"during-{marker[:6].decode()}"
    version = await _seed(direct, thread_id)
    proxy.cut_on(marker, forward=True)
    with pytest.raises(ThreadStoreUnavailableError):
        await through.commit_thread(_turn(thread_id, version))
    assert proxy.triggered.is_set()
    proxy.restore()
    assert await _state(direct, thread_id) == NOTHING


@pytest.mark.parametrize("reached_server", [True, False], ids=["applied", "lost"])
async def test_cut_at_commit_is_commit_unknown_and_whole_or_nothing(
    proxied: tuple[FaultProxy, MongoThreadStore, MongoThreadStore], reached_server: bool
) -> None:
    proxy, through, direct = proxied
    thread_id = f"commit-{reached_server}"
    version = await _seed(direct, thread_id)
    proxy.cut_on(b"commitTransaction\x00", forward=reached_server)
    with pytest.raises(ThreadStoreCommitUnknownError) as err:
        await through.commit_thread(_turn(thread_id, version))
    assert "re-read" in str(err.value)
    assert proxy.triggered.is_set()
    proxy.restore()
    state = await _state(direct, thread_id)
    assert state == (WHOLE if reached_server else NOTHING)


async def test_cut_during_a_read_is_unavailable(
    proxied: tuple[FaultProxy, MongoThreadStore, MongoThreadStore],
) -> None:
    proxy, through, direct = proxied
    await _seed(direct, "read")
    proxy.cut_on(b"find\x00", forward=False)
    with pytest.raises(ThreadStoreUnavailableError):
        await through.read_thread(
            b.read("scope", "read", messages={"type": "ids", "messageIds": ["m1"]})
        )
    proxy.restore()
    read = await through.read_thread(b.read("scope", "read"))
    assert read.thread is not None
