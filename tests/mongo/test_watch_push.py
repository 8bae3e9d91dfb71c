"""MongoDB watchers are woken by the store's change stream (docs/watch.md):
another process follows 200 chunk commits to the end, a waiting watcher is woken
long before its interval, and a step-down of the primary (a single-node replica
set of its own: stepped down, then re-elected at once) loses no final version."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import suppress

import pytest
from pai_storage_mongo.harness import TEST_DB, MongodProcess, MongoHarness
from pai_storage_mongo.store import MongoThreadStore
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError
from support.watching import check_chain, start_watcher, stream_reply, until_final

from pai_storage import ThreadChange, ThreadVersion
from pai_storage.errors import ThreadStoreUnavailableError

pytestmark = pytest.mark.asyncio

CHUNKS = 200
LONG = 3600.0  # seconds between polls: only the change stream wakes a watcher
WAIT = 30.0  # seconds a pushed change may take on a loaded machine (far below LONG)


@pytest.fixture(scope="module")
def own_replica_set() -> Iterator[MongodProcess]:
    """A single-node replica set for this module alone (the step-down disturbs it)."""
    mongod = MongodProcess()
    mongod.start()
    try:
        yield mongod
    finally:
        mongod.stop()


def _store(url: str, name: str) -> MongoThreadStore:
    return MongoThreadStore(url, db_name=TEST_DB, collection_name=name)


async def _head(store: MongoThreadStore, scope: str, thread: str) -> ThreadVersion:
    root = await store.conversation(scope, thread).get()
    assert root is not None
    return root.version


async def _until(changes: AsyncIterator[ThreadChange], final: ThreadVersion) -> ThreadChange:
    async with asyncio.timeout(WAIT):
        async for change in changes:
            if change.version == final:
                return change
    raise AssertionError("the watch ended")  # pragma: no cover - it is endless


async def _step_down(url: str) -> None:
    """Step the only member down, then let it be elected again at once (``replSetFreeze: 0``)."""
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url, directConnection=True)
    try:
        with suppress(PyMongoError):  # the primary may drop the connection as it steps down
            await client.admin.command("replSetStepDown", 60, force=True)
        await client.admin.command("replSetFreeze", 0)
        async with asyncio.timeout(WAIT):
            while not await _is_primary(client):
                pass
    finally:
        await client.close()


async def _is_primary(client: AsyncMongoClient[dict[str, object]]) -> bool:
    """Whether the member is primary, a moment from now (the election takes its time)."""
    await asyncio.sleep(0.1)
    return bool((await client.admin.command("hello")).get("isWritablePrimary"))


async def _add(store: MongoThreadStore, scope: str, thread: str, text: str) -> None:
    """Add a message, retrying while there is no primary yet."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await store.conversation(scope, thread).add("user", text)
                return
            except ThreadStoreUnavailableError:
                await asyncio.sleep(0.1)


async def test_a_watcher_in_another_process_sees_every_chunk_commit(
    mongo_harness: MongoHarness,
) -> None:
    name = f"pai_test_{uuid.uuid4().hex}"
    assert mongo_harness.url is not None
    store = _store(mongo_harness.url, name)
    async with store:
        chat = store.conversation("tenant", "chat")
        await chat.add("user", "tell me a long story")
        start = await _head(store, "tenant", "chat")
        watcher = await start_watcher(
            MongoThreadStore,
            [mongo_harness.url],
            {"db_name": TEST_DB, "collection_name": name},
            scope="tenant",
            thread="chat",
            after=start,
            interval=LONG,
        )
        try:
            await asyncio.sleep(1.0)  # the watcher process starts and opens its stream
            final = await stream_reply(store, "tenant", "chat", CHUNKS)
            seen = await until_final(watcher, final)
        finally:
            watcher.terminate()
            await watcher.wait()
        for collection in store.collection_names().values():
            await store.database.drop_collection(collection)
    assert final.revision > start.revision + CHUNKS  # every chunk was its own commit
    check_chain(seen, start, final)
    assert len(seen) > 10  # woken by the commits, not once an hour


async def test_a_step_down_loses_no_final_version(own_replica_set: MongodProcess) -> None:
    url = own_replica_set.url
    async with _store(url, f"pai_test_{uuid.uuid4().hex}") as store:
        await _add(store, "s", "t", "first")
        start = await _head(store, "s", "t")
        changes = store.watch("s", "t", after=start, interval=LONG)
        watching = asyncio.create_task(anext(changes))
        await _add(store, "s", "t", "pushed")
        async with asyncio.timeout(WAIT):
            await watching
        await _step_down(url)
        for i in range(3):  # right after the election: the stream is resuming
            await _add(store, "s", "t", f"after the step-down {i}")
        final = await _head(store, "s", "t")
        await _until(changes, final)
        watching = asyncio.create_task(anext(changes))
        await _add(store, "s", "t", "once the stream is back")
        async with asyncio.timeout(WAIT):
            change = await watching
        assert change.commits == 1
        await changes.aclose()


async def test_a_deleted_thread_wakes_its_watcher(mongo_harness: MongoHarness) -> None:
    assert mongo_harness.url is not None
    async with _store(mongo_harness.url, f"pai_test_{uuid.uuid4().hex}") as store:
        chat = store.conversation("s", "t")
        await chat.add("user", "first")
        start = await _head(store, "s", "t")
        changes = store.watch("s", "t", after=start, interval=LONG)
        watching = asyncio.create_task(anext(changes))
        await chat.add("user", "second")  # the stream learns the root's _id
        async with asyncio.timeout(WAIT):
            await watching
        watching = asyncio.create_task(anext(changes))
        assert await chat.delete()
        async with asyncio.timeout(WAIT):
            change = await watching
        assert change.deleted
        await changes.aclose()
        for collection in store.collection_names().values():
            await store.database.drop_collection(collection)
