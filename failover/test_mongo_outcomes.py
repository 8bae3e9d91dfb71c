"""MongoDB: what a failover does to one runtime-store write, made deterministic.

- When the primary steps down while a write waits for replication, the server
  applies the write and answers with a ``writeConcernError`` carrying the
  ``RetryableWriteError`` label. The server's ``failCommand`` fail point
  (``enableTestCommands``) gives exactly that answer on demand. The contract
  allows two outcomes: the write succeeds (the driver retried it) or
  ``OutcomeUnknownError``; never a raw driver exception.
- When the connection dies after the server applied a write, the driver retries
  it once (a retryable write) and the server answers the retry from what it
  recorded for the first attempt. A loopback proxy swallows the first reply and
  lets the retry through; the answer must still be the truth.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import pytest
import pytest_asyncio

pytest.importorskip("pymongo")

from pai_storage_mongo.harness import MongodProcess
from pymongo import MongoClient
from support.proxy import FaultProxy

from pai_storage import (
    Item,
    KeyValueStore,
    KVConflict,
    OutcomeUnknownError,
    open_guard,
    open_kv_store,
    open_snapshot_store,
)

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def test_mongod() -> Iterator[MongodProcess]:
    """A single-node replica set with the server's test commands (fail points) enabled."""
    process = MongodProcess(extra_args=["--setParameter", "enableTestCommands=1"])
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest_asyncio.fixture
async def kv(test_mongod: MongodProcess) -> AsyncIterator[KeyValueStore]:
    store = open_kv_store(test_mongod.url, db_name="failover_outcomes")
    try:
        yield store
    finally:
        await store.close()


def _fail_next(url: str, command: str) -> None:
    """The next ``command`` applies, then answers with a retryable write concern error."""
    client: MongoClient[dict[str, Any]] = MongoClient(url)
    try:
        client.admin.command(
            {
                "configureFailPoint": "failCommand",
                "mode": {"times": 1},
                "data": {
                    "failCommands": [command],
                    "writeConcernError": {
                        "code": 189,
                        "codeName": "PrimarySteppedDown",
                        "errmsg": "Primary stepped down while waiting for replication",
                    },
                    "errorLabels": ["RetryableWriteError"],
                },
            }
        )
    finally:
        client.close()


async def test_kv_write_concern_error_is_retried_or_unknown(
    kv: KeyValueStore, test_mongod: MongodProcess
) -> None:
    """PyMongo leaves a findAndModify reply's ``writeConcernError`` raw BSON when the
    codec has type decoders, and then fails on it with ``AttributeError``: the store must
    decode such replies without decoders (so the driver retries) and never let it escape."""
    first = await kv.put(("ns",), "key", {"n": 1})
    _fail_next(test_mongod.url, "findAndModify")
    result: Item | KVConflict | None = None
    try:
        result = await kv.put_if_version(("ns",), "key", {"n": 2}, first.version)
    except OutcomeUnknownError:
        pass  # truthful: the caller reads it back
    except Exception as exc:  # anything else breaks the contract for an applied write
        pytest.fail(f"a write the server applied raised {exc!r}")
    stored = await kv.get(("ns",), "key")
    assert isinstance(stored, Item)
    assert stored.value == {"n": 2}  # the fail point lets the write apply
    if result is not None:
        assert isinstance(result, Item)
        assert result.version == stored.version


async def _through_a_lost_reply(
    proxy: FaultProxy, marker: bytes, write: Awaitable[bool]
) -> bool | None:
    """``write``'s command (the first one containing ``marker``) reaches the server, its
    reply is lost and the connection cut; connections are let through again at once so
    the driver's retry gets an answer. ``None``: ``OutcomeUnknownError`` (also truthful)."""
    proxy.cut_on(marker, forward=True)

    async def reopen() -> None:
        await proxy.triggered.wait()
        # The cut comes with the server's (swallowed) reply; the proxy has no event for it.
        while not proxy.refusing:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        proxy.restore()

    reopened = asyncio.create_task(reopen())
    try:
        answer: bool | None = await write
    except OutcomeUnknownError:
        answer = None
    await reopened
    assert proxy.triggered.is_set()
    return answer


@pytest_asyncio.fixture
async def proxy(test_mongod: MongodProcess) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(test_mongod.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def _proxied(proxy: FaultProxy) -> str:
    return f"mongodb://127.0.0.1:{proxy.port}/?directConnection=true"


async def test_guard_release_retried_after_a_lost_reply_reports_the_release(
    proxy: FaultProxy,
) -> None:
    """A retried write is answered from the server's record of the first attempt (for a
    findAndModify: the whole document, its projection not applied); the release must not
    depend on anything but that record."""
    guard = open_guard(_proxied(proxy), db_name="failover_outcomes")
    try:
        lock = await guard.try_acquire("resource", owner="me")
        assert lock is not None
        released = await _through_a_lost_reply(proxy, lock.token.encode(), lock.release())
        assert await guard.inspect("resource") is None  # the first attempt deleted it
        assert released is not False, "release said 'not held' about a lock it released"
        assert await lock.release() is False  # released once
    finally:
        await guard.close()


async def test_snapshot_delete_retried_after_a_lost_reply_reports_the_delete(
    proxy: FaultProxy,
) -> None:
    snapshots = open_snapshot_store(_proxied(proxy), db_name="failover_outcomes")
    try:
        assert snapshots.snapshot_ttl is not None  # a delete that judges liveness
        await snapshots.put("scope", "lost-reply", b"data")
        deleted = await _through_a_lost_reply(
            proxy, b"lost-reply", snapshots.delete("scope", "lost-reply")
        )
        assert await snapshots.get("scope", "lost-reply") is None
        assert deleted is not False, "delete said 'absent' about a snapshot it deleted"
        assert await snapshots.delete("scope", "lost-reply") is False  # deleted once
    finally:
        await snapshots.close()
