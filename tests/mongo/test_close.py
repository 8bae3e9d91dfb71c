"""``close()`` leaves nothing open, even during a lazy initialize or an operation in flight."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pai_storage_mongo.harness import MongoHarness, drop_store_collections
from pai_storage_mongo.store import MongoThreadStore
from pymongo.errors import InvalidOperation

from pai_storage import CommittedResult, CommitThreadInput
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreConfigurationError


class PausingStore(MongoThreadStore):
    """Pauses ``_initialize`` at a chosen point, or a commit after it began its transaction."""

    def __init__(self, *args: Any, pause: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pause = pause
        self.clients: list[Any] = []
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    async def _hold_here(self, point: str) -> None:
        if self.pause == point:
            self.paused.set()
            await self.resume.wait()

    async def _prepare(self, client: Any) -> None:
        self.clients.append(client)
        await self._hold_here("before-checks")
        await super()._prepare(client)
        await self._hold_here("after-indexes")

    async def _apply(self, session: Any, request: CommitThreadInput, tx: Any = None) -> Any:
        await self._hold_here("commit")
        return await super()._apply(session, request, tx)


def _open(harness: MongoHarness, pause: str | None) -> PausingStore:
    assert harness.url is not None
    return PausingStore(harness.url, collection_name=f"pai_test_{uuid.uuid4().hex}", pause=pause)


async def _drop(harness: MongoHarness, store: MongoThreadStore) -> MongoThreadStore:
    """A fresh store on the same collections (the closed one can do nothing)."""
    return harness.open_store(db_name=store.db_name, collection_name=store.collection_name)


async def _assert_closed_for_good(store: MongoThreadStore) -> None:
    calls = (
        store.initialize(),
        store.read_thread(b.read("s", "t")),
        store.list_threads({"scopeKey": "s", "limit": 5}),
        store.commit_thread(b.create("s", "t")),
        store.info(),
    )
    for call in calls:
        with pytest.raises(ThreadStoreConfigurationError, match="closed"):
            await call


@pytest.mark.parametrize("pause", ["before-checks", "after-indexes"])
async def test_close_during_a_lazy_initialize_releases_the_client(
    mongo_harness: MongoHarness, pause: str
) -> None:
    store = _open(mongo_harness, pause)
    reader = asyncio.ensure_future(store.read_thread(b.read("s", "t")))  # initializes lazily
    await asyncio.wait_for(store.paused.wait(), timeout=10)
    await store.close()
    (client,) = store.clients
    # The client the cancelled attempt made is closed, and the store kept nothing.
    with pytest.raises(InvalidOperation, match="after close"):
        await client.admin.command("ping")
    assert store._client is None
    assert store._db is None
    # The operation that was waiting for the initialize fails: it never runs on a closed store.
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await reader
    await _assert_closed_for_good(store)
    async with await _drop(mongo_harness, store) as cleanup:
        await drop_store_collections(cleanup)


async def test_a_commit_in_flight_at_close_fails_typed_and_applies_nothing(
    mongo_harness: MongoHarness,
) -> None:
    store = _open(mongo_harness, "commit")
    await store.initialize()
    committing = asyncio.ensure_future(store.commit_thread(b.create("s", "t")))
    await asyncio.wait_for(store.paused.wait(), timeout=10)
    await store.close()
    store.resume.set()
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await committing
    await _assert_closed_for_good(store)
    async with await _drop(mongo_harness, store) as check:
        assert (await check.read_thread(b.read("s", "t"))).thread is None
        assert isinstance(await check.commit_thread(b.create("s", "t")), CommittedResult)
        await drop_store_collections(check)
