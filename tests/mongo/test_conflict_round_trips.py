"""Commands of the commits the stamped hold cannot serve, by PyMongo's command monitoring.

``test_round_trips.py`` pins the common commits (an append is three commands:
the hold that stamps the final root, the insert, ``commitTransaction``; a run
started or finished, four). These pin the other paths of an append, so that
the cost of a conflict and of the fallback stays known: a conflict on a
version the store knows is old, a conflict after another process committed
(the stamped hold matches nothing, then the usual hold), and a commit whose
store knows the version but not the root (no stamp: the root is replaced
after the relationship check).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo.harness import drop_store_collections
from pai_storage_mongo.store import MongoThreadStore
from pymongo import AsyncMongoClient, monitoring

from pai_storage import CommittedResult, ConflictResult, ThreadVersion
from pai_storage import builders as b

pytestmark = pytest.mark.asyncio

_IGNORED = {"hello", "isMaster", "ismaster", "ping", "endSessions", "buildInfo"}


class Commands(monitoring.CommandListener):
    """The name of every command the client sends (handshakes and heartbeats aside)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in _IGNORED:
            self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return names


@pytest_asyncio.fixture
async def two_stores(
    mongo_url: str,
) -> AsyncIterator[tuple[MongoThreadStore, MongoThreadStore, Commands]]:
    """Two stores of one collection (two processes, say) on one monitored client."""
    commands = Commands()
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url, event_listeners=[commands])
    name = f"pai_test_{uuid.uuid4().hex}"
    writer = MongoThreadStore(client=client, db_name="pai_test", collection_name=name)
    other = MongoThreadStore(client=client, db_name="pai_test", collection_name=name)
    try:
        await writer.initialize()
        await other.initialize()
        yield writer, other, commands
    finally:
        await drop_store_collections(writer)
        await writer.close()
        await other.close()
        await client.close()


async def _append(
    store: MongoThreadStore, version: ThreadVersion, message_id: str
) -> CommittedResult | ConflictResult:
    result = await store.commit_thread(
        b.update_at(
            "s", "t", version, {"messages": [b.insert(b.message(message_id))]}, root=b.root()
        )
    )
    assert isinstance(result, CommittedResult | ConflictResult), result
    return result


async def _create(store: MongoThreadStore) -> ThreadVersion:
    result = await store.commit_thread(b.create("s", "t"))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread.version


def _version(result: CommittedResult | ConflictResult) -> ThreadVersion:
    if isinstance(result, ConflictResult):
        assert result.current_version is not None
        return result.current_version
    assert result.thread is not None
    return result.thread.version


async def test_a_conflict_on_a_version_known_to_be_old_is_three_commands(
    two_stores: tuple[MongoThreadStore, MongoThreadStore, Commands],
) -> None:
    writer, _, commands = two_stores
    old = await _create(writer)
    await _append(writer, old, "m1")
    commands.take()
    result = await _append(writer, old, "late")
    assert isinstance(result, ConflictResult)
    # The hold (guarded by the named version; not stamped: the store knows
    # another) matches nothing; the stored root is read for the conflict's
    # current version; the transaction is aborted, nothing written.
    assert commands.take() == ["findAndModify", "find", "abortTransaction"]


async def test_a_conflict_after_another_process_committed_is_four_commands(
    two_stores: tuple[MongoThreadStore, MongoThreadStore, Commands],
) -> None:
    writer, other, commands = two_stores
    created = await _create(writer)
    known = _version(await _append(writer, created, "m1"))
    ahead = await _append(other, known, "m2")  # the writer's cache is behind now
    assert isinstance(ahead, CommittedResult)
    commands.take()
    result = await _append(writer, known, "late")
    assert isinstance(result, ConflictResult)
    assert result.current_version == _version(ahead)
    assert commands.take() == [
        # The stamped hold: guarded by the whole cached root, it matches nothing
        # and writes nothing.
        "findAndModify",
        # The usual hold, guarded by the named version: nothing either.
        "findAndModify",
        # The stored root, for the conflict's current version; abort.
        "find",
        "abortTransaction",
    ]


async def test_an_append_at_a_version_known_without_its_root_is_four_commands(
    two_stores: tuple[MongoThreadStore, MongoThreadStore, Commands],
) -> None:
    writer, other, commands = two_stores
    created = await _create(writer)
    known = _version(await _append(writer, created, "m1"))
    current = _version(await _append(other, known, "m2"))
    commands.take()
    # The writer names the current version, but its cache holds an older root:
    # no stamp. The usual hold, the insert, the root replaced after the
    # relationship check, commit.
    result = await _append(writer, current, "m3")
    assert isinstance(result, CommittedResult)
    assert commands.take() == ["findAndModify", "insert", "update", "commitTransaction"]
    # The commit taught the cache the root: the next append is stamped again.
    await _append(writer, _version(result), "m4")
    assert commands.take() == ["findAndModify", "insert", "commitTransaction"]
