"""MongoDB enumeration of the agent-state and snapshot stores (a copy of the runtime stores).

``_list_sessions`` walks the ``_id`` index in up to three ranges (the anonymous
user first, then the users below and above its stored key), ``_session_keys``
reads the ``versions`` and ``hashes`` subdocuments of one session, and
``_list_scopes`` probes ``scope_newest`` once per scope. The results are
checked against the interface (order, ``after``, ``limit``, expiry) on the
server, with user ids and keys chosen where BSON, UTF-16 and the stored
anonymous key could disagree; every command they send is then explained
(index only, no collection scan, no in-memory sort) and the scope probe's
execution counted (keys, not documents, whatever the expired entries).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest_asyncio
from bson.int64 import Int64
from pai_storage_mongo import backend as mongo_backend
from pai_storage_mongo.snapshots import MongoSnapshotStore
from pai_storage_mongo.state import MongoAgentStateStore, decode_field, encode_field
from pymongo import AsyncMongoClient, monitoring

from pai_storage import ManualClock
from pai_storage.backend import ENUMERATE, make_url
from pai_storage.state import ANONYMOUS_USER

DB = "pai_test"
TTL = timedelta(hours=1)
_SKIP = ("lsid", "$db", "$clusterTime", "txnNumber", "autocommit", "startTransaction")

# "\x01" sorts below the anonymous user's stored key ("\x1fanonymous"), "\uff61"
# below "\U0001f600" by code point (UTF-16 would put the surrogate pair first).
USERS: list[str | None] = [None, "\x01low", "a", "b", "\uff61", "\U0001f600"]


class Finds(monitoring.CommandListener):
    """Keeps every ``find`` command sent while ``on`` is set."""

    def __init__(self) -> None:
        self.on = False
        self.commands: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on and event.command_name == "find":
            self.commands.append({k: v for k, v in event.command.items() if k not in _SKIP})

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


Opened = tuple[MongoAgentStateStore, MongoSnapshotStore, Finds, AsyncMongoClient[Any]]


@contextlib.asynccontextmanager
async def _open(mongo_url: str, clock: ManualClock | None) -> AsyncIterator[Opened]:
    finds = Finds()
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        mongo_url, event_listeners=[finds], tz_aware=True
    )
    prefix = f"pai_test_{uuid.uuid4().hex}_"
    stores = mongo_backend.open_components(
        make_url("mongodb://"),
        ["state", "snapshots"],
        client=client,
        db_name=DB,
        collection_prefix=prefix,
        clock=clock,
        session_ttl=TTL,
        snapshot_ttl=TTL,
    )
    state, snapshots = stores["state"], stores["snapshots"]
    assert isinstance(state, MongoAgentStateStore)
    assert isinstance(snapshots, MongoSnapshotStore)
    try:
        await state.initialize()
        await snapshots.initialize()
        yield state, snapshots, finds, client
    finally:
        await state.close()
        await snapshots.close()
        for name in await client[DB].list_collection_names():
            if name.startswith(prefix):
                await client[DB].drop_collection(name)
        await client.close()


@pytest_asyncio.fixture
async def opened(mongo_url: str, clock: ManualClock) -> AsyncIterator[Opened]:
    async with _open(mongo_url, clock) as stores:
        yield stores


@pytest_asyncio.fixture
async def real_clock(mongo_url: str) -> AsyncIterator[Opened]:
    """The stores on the server's clock (``$$NOW``, the server's time)."""
    async with _open(mongo_url, None) as stores:
        yield stores


def _order(pair: tuple[str | None, str]) -> tuple[bool, list[int], list[int]]:
    """The interface's order: user ``None`` first, then code points."""
    user, session = pair
    return (user is not None, [ord(c) for c in user or ""], [ord(c) for c in session])


def _stages(plan: Any) -> list[str]:
    found: list[str] = []
    if isinstance(plan, dict):
        if "stage" in plan:
            found.append(plan["stage"])
        for value in plan.values():
            found += _stages(value)
    elif isinstance(plan, list):
        for value in plan:
            found += _stages(value)
    return found


async def _explain(client: AsyncMongoClient[Any], command: dict[str, Any]) -> dict[str, Any]:
    explained: dict[str, Any] = await client[DB].command(
        {"explain": command, "verbosity": "executionStats"}
    )
    stages = _stages(explained["queryPlanner"]["winningPlan"])
    assert "COLLSCAN" not in stages, (command, stages)
    assert "SORT" not in stages, (command, stages)
    assert "IXSCAN" in stages, (command, stages)
    return explained


def test_both_stores_declare_the_capability() -> None:
    assert ENUMERATE in MongoAgentStateStore.capabilities
    assert ENUMERATE in MongoSnapshotStore.capabilities


def test_field_names_decode_to_the_keys() -> None:
    for key in ("plain", "a.b", "$x", "%", "%2E", "%25.%24$", "%%2E.", "\x01é😀"):
        assert decode_field(encode_field(key)) == key


async def test_sessions_come_anonymous_first_then_by_code_point(
    opened: Opened,
    clock: ManualClock,
) -> None:
    state, _, finds, client = opened
    await state.save("a", "expired", "v", 1)
    await state.save(None, "expired", "v", 1)
    clock.advance(TTL - timedelta(seconds=1))
    expected: list[tuple[str | None, str]] = []
    for user in reversed(USERS):
        for session in ("s2", "\U0001f600", "\uff61", "s1"):
            await state.save(user, session, "v", 1)
            expected.append((user, session))
    clock.advance(timedelta(seconds=2))  # the first two sessions expire
    expected.sort(key=_order)
    assert expected[:4] == [(None, s) for s in ("s1", "s2", "\uff61", "\U0001f600")]

    assert await state._list_sessions(None, 1000) == expected
    for limit in (1, 2, 3, 4, 5, 7):
        pages: list[tuple[str | None, str]] = []
        after: tuple[str | None, str] | None = None
        while True:
            page = await state._list_sessions(after, limit)
            assert len(page) <= limit
            pages += page
            if len(page) < limit:
                break
            after = page[-1]
        assert pages == expected, limit
    # Strictly after any position, including ones that are not stored.
    for after in [*expected, (None, "s"), ("\x01", "z"), ("\x1f", "z"), ("zz", "")]:
        assert await state._list_sessions(after, 1000) == [
            p for p in expected if _order(p) > _order(after)
        ], after

    finds.on = True
    await state._list_sessions(None, 6)  # the anonymous range, then the users below it
    await state._list_sessions(("\x01low", "s2"), 3)  # below, then above the anonymous key
    await state._list_sessions(("b", "s1"), 2)  # above it only
    finds.on = False
    assert len(finds.commands) == 5
    for command in finds.commands:
        explained = await _explain(client, command)
        stats = explained["executionStats"]
        assert stats["nReturned"] <= command["limit"], command
        # No expired entry lies in these ranges: the scan stops at the limit.
        assert stats["totalKeysExamined"] <= command["limit"] + 1, (command, stats)


async def test_session_keys_split_values_from_lists(
    opened: Opened,
    clock: ManualClock,
) -> None:
    state, _, finds, client = opened
    values = ["b", "a.b", "$x", "%2E", "\U0001f600", "\uff61"]
    lists = ["log", "%", "l.2", "$"]
    for key in values:
        await state.save(None, "s", key, {"k": key})
    for key in lists:
        await state.save_list(None, "s", key, [1, key])
    await state.save_list(None, "s", "empty", [])
    await state.save("u", "other", "x", 1)

    def by_code_point(keys: list[str]) -> list[str]:
        return sorted(keys, key=lambda k: [ord(c) for c in k])

    finds.on = True
    assert await state._session_keys(None, "s") == (
        by_code_point(values),
        by_code_point([*lists, "empty"]),
    )
    finds.on = False
    assert await state._session_keys("u", "other") == (["x"], [])
    assert await state._session_keys("u", "s") == ([], [])
    assert await state._session_keys(None, "missing") == ([], [])
    await state.delete_state(None, "s", "b")
    assert "b" not in (await state._session_keys(None, "s"))[0]
    clock.advance(TTL + timedelta(seconds=1))
    assert await state._session_keys(None, "s") == ([], [])
    assert await state._session_keys("u", "other") == ([], [])

    (command,) = finds.commands
    assert command["projection"] == {"_id": 0, "versions": 1, "hashes": 1}  # no value read
    explained: dict[str, Any] = await client[DB].command(
        {"explain": command, "verbosity": "queryPlanner"}
    )
    stages = _stages(explained["queryPlanner"]["winningPlan"])
    assert "COLLSCAN" not in stages, stages
    assert {"IXSCAN", "IDHACK", "EXPRESS_IXSCAN", "EXPRESS_CLUSTERED_IXSCAN"} & set(stages), stages


async def test_scopes_with_a_live_snapshot_by_code_point(
    opened: Opened,
    clock: ManualClock,
) -> None:
    _, snapshots, finds, client = opened
    # Scope "gone" has only expired snapshots; "mixed" has many expired and one live.
    await snapshots.put("gone", "old", b"x")
    for i in range(30):
        await snapshots.put("mixed", f"old{i:02}", b"x")
    clock.advance(TTL - timedelta(seconds=1))
    scopes = ["\x01", "a", "b", "mixed", "\uff61", "\U0001f600"]
    for scope in reversed(scopes):
        await snapshots.put(scope, "one", b"1")
        await snapshots.put(scope, "two", b"2")
    clock.advance(timedelta(seconds=2))

    assert await snapshots._list_scopes(None, 1000) == scopes
    for limit in (1, 2, 4, 6):
        found: list[str] = []
        after: str | None = None
        while True:
            page = await snapshots._list_scopes(after, limit)
            assert len(page) <= limit
            found += page
            if len(page) < limit:
                break
            after = page[-1]
        assert found == scopes, limit
    assert await snapshots._list_scopes("b", 1000) == ["mixed", "\uff61", "\U0001f600"]
    assert await snapshots._list_scopes("gone", 2) == ["mixed", "\uff61"]
    assert await snapshots._list_scopes("\U0001f600", 10) == []
    now = clock()
    clock.advance(TTL)
    assert await snapshots._list_scopes(None, 10) == []
    clock.set(now)

    finds.on = True
    assert await snapshots._list_scopes("b", 2) == ["mixed", "\uff61"]
    finds.on = False
    assert len(finds.commands) == 2
    for command in finds.commands:
        explained = await _explain(client, command)
        stats = explained["executionStats"]
        # A covered probe: the live bound skips the 30 expired entries of
        # "mixed" in the index, and no document is read.
        assert stats["totalDocsExamined"] == 0, stats
        assert stats["totalKeysExamined"] <= 3, stats
        assert stats["nReturned"] == 1, stats


async def test_on_the_server_clock_expired_documents_are_not_enumerated(
    real_clock: Opened,
) -> None:
    # Documents written an hour and a second ago (the TTL is an hour), as a
    # store would have left them, stand beside live ones: only the live count.
    state, snapshots, _, _ = real_clock
    await state.save("u", "live", "v", 1)
    await snapshots.put("live", "one", b"1")
    hello = await state.collection.database.command("hello")
    old = hello["localTime"].astimezone(UTC) - TTL - timedelta(seconds=1)
    assert isinstance(old, datetime)
    for user in (ANONYMOUS_USER, "u", "\x01"):
        await state.collection.insert_one(
            {
                "_id": {"user": user, "session": "old"},
                "states": {"v": "1"},
                "versions": {"v": Int64(1)},
                "hashes": {},
                "lengths": {},
                "_updated_at": old,
            }
        )
    for scope in ("a", "live", "z"):
        await snapshots.collection.insert_one(
            {
                "_id": {"scope": scope, "snapshotId": "old"},
                "createdAt": old,
                "size": Int64(1),
                "sha256": "0" * 64,
                "metadata": "{}",
                "data": b"1",
                "_schemaVersion": 1,
            }
        )
    assert await state._list_sessions(None, 10) == [("u", "live")]
    assert await state._session_keys("u", "old") == ([], [])
    assert await state._session_keys(None, "old") == ([], [])
    assert await state._session_keys("u", "live") == (["v"], [])
    assert await snapshots._list_scopes(None, 10) == ["live"]
