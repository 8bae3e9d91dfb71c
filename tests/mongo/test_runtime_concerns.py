"""MongoDB runtime stores: write concern, read concern, and a write the server did not confirm.

- Every runtime write carries ``writeConcern: {w: "majority"}`` and every
  runtime read ``readConcern: {level: "majority"}`` and goes to the primary,
  whatever the URL says (checked from the commands the driver sends, with
  ``w=1``, ``journal=false``, ``readConcernLevel=local`` and
  ``readPreference=secondaryPreferred`` in the URL).
- A primary stepping down while a write waits for a majority applies the write
  and answers with a ``writeConcernError`` labelled ``RetryableWriteError``.
  The server's ``failCommand`` fail point (a mongod started with
  ``enableTestCommands``) gives exactly that answer to the next command. The
  store then either succeeds through the driver's retry, the write applied
  once, or raises ``OutcomeUnknownError``; never a driver exception. With a
  short heartbeat the driver finds the primary again in time and the retry
  must succeed.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pai_storage_mongo.client import runtime_error
from pai_storage_mongo.errors import Phase
from pai_storage_mongo.guard import MongoExecutionGuard
from pai_storage_mongo.harness import MongodProcess
from pai_storage_mongo.kv import MongoKeyValueStore
from pai_storage_mongo.snapshots import MongoSnapshotStore
from pai_storage_mongo.state import MongoAgentStateStore
from pymongo import AsyncMongoClient, MongoClient, monitoring
from pymongo import errors as pm

from pai_storage import (
    ConfigurationError,
    InvalidInputError,
    Item,
    KVConflict,
    ManualClock,
    OutcomeUnknownError,
    StateConflict,
    StorageError,
    UnavailableError,
)
from pai_storage.errors import ThreadStoreError

pytestmark = pytest.mark.asyncio

DB = "pai_test_concerns"
WRITES = ("findAndModify", "update", "delete", "insert")
READS = ("find", "aggregate", "count", "distinct")


class Recorder(monitoring.CommandListener):
    """Every command sent to the stores' collections, and every retried one."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in (*WRITES, *READS, "commitTransaction"):
            self.commands.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def sent(self, name: str) -> list[dict[str, Any]]:
        return [command for n, command in self.commands if n == name]


@pytest.fixture(scope="module")
def test_mongod() -> Iterator[MongodProcess]:
    """A single-node replica set with the server's test commands (fail points) enabled."""
    process = MongodProcess(extra_args=["--setParameter", "enableTestCommands=1"])
    process.start()
    try:
        yield process
    finally:
        process.stop()


class Stores:
    """The four runtime stores on one application client whose commands are recorded."""

    def __init__(
        self, client: AsyncMongoClient[Any], recorder: Recorder, clock: Any, prefix: str
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.prefix = prefix
        options: dict[str, Any] = {"client": client, "db_name": DB, "collection_prefix": prefix}
        self.kv = MongoKeyValueStore(**options, clock=clock)
        self.state = MongoAgentStateStore(**options, clock=clock)
        self.snapshots = MongoSnapshotStore(**options, clock=clock)
        self.guard = MongoExecutionGuard(**options, clock=clock)

    async def open(self) -> None:
        for store in (self.kv, self.state, self.snapshots, self.guard):
            await store.initialize()
        self.recorder.commands.clear()

    async def close(self) -> None:
        for store in (self.kv, self.state, self.snapshots, self.guard):
            await store.close()


@contextlib.asynccontextmanager
async def stores(url: str, clock: Any = None, prefix: str | None = None) -> AsyncIterator[Stores]:
    """The four stores on a new client; their collections are dropped after (unless
    ``prefix`` names those of stores opened before)."""
    recorder = Recorder()
    client: AsyncMongoClient[Any] = AsyncMongoClient(url, event_listeners=[recorder])
    opened = Stores(client, recorder, clock, prefix or f"t{uuid.uuid4().hex[:12]}_")
    try:
        await opened.open()
        yield opened
    finally:
        await opened.close()
        await client.close()
        if prefix is None:  # on a new client: this one may not know the primary now
            _drop_prefixed(url, opened.prefix)


def _drop_prefixed(url: str, prefix: str) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(url)
    try:
        for name in client[DB].list_collection_names():
            if name.startswith(prefix):
                client[DB].drop_collection(name)
    finally:
        client.close()


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


# --------------------------------------------------------------- write and read concern


async def _every_operation(s: Stores, clock: ManualClock) -> None:
    """Every operation of the four stores, each write path at least once."""
    kv, state, snapshots, guard = s.kv, s.state, s.snapshots, s.guard
    first = await kv.put(("a",), "k", 1)
    await kv.put(("a",), "t", 1, ttl=timedelta(seconds=1))
    await kv.put_if_version(("a",), "k", 2, first.version)
    await kv.put_if_version(("a",), "new", 1, None)
    await kv.get(("a",), "t", refresh_ttl=True)
    await kv.get(("a",), "t")
    await kv.get_many(("a",), ["k", "new"])
    await kv.search(("a",))
    await kv.list_keys(("a",))
    await kv.list_namespaces(())
    await kv.delete(("a",), "new")
    await state.save("u", "s", "v", 1)
    await state.save_if_version("u", "s", "v", 2, 1)
    await state.save_if_version("u", "s", "w", 1, 0)
    await state.save_list("u", "s", "log", [1, 2])
    await state.append_list("u", "s", "log", [3])
    await state.append_list("u", "s", "log", [4, 5, 6, 7, 8, 9])
    await state.get("u", "s", "v")
    await state.get_versioned("u", "s", "v")
    await state.get_list("u", "s", "log")
    await state.exists("u", "s")
    await state.list_session_ids("u")
    await state.delete_state("u", "s", "w")
    await state.delete("u", "s")
    await snapshots.put("scope", "one", b"data", metadata={"m": 1})
    await snapshots.get("scope", "one")
    await snapshots.latest("scope")
    await snapshots.list("scope")
    await snapshots.delete("scope", "one")
    lock = await guard.try_acquire("r", owner="me")
    assert lock is not None
    await guard.inspect("r")
    assert await lock.renew()
    assert await lock.release()
    clock.advance(timedelta(days=400))
    for store in (kv, state, snapshots, guard):
        await store.purge_expired()


async def test_every_runtime_command_uses_majority_whatever_the_url_says(
    test_mongod: MongodProcess,
) -> None:
    clock = ManualClock()
    url = test_mongod.url + (
        "&w=1&journal=false&readConcernLevel=local&readPreference=secondaryPreferred"
    )
    async with stores(url, clock) as s:
        await _every_operation(s, clock)
        sent = s.recorder.commands
    names = {name for name, _ in sent}
    assert {"findAndModify", "update", "delete", "find", "commitTransaction"} <= names, names
    for name, command in sent:
        if command.get("autocommit") is False:  # in a transaction (the guard's acquisition)
            if name == "commitTransaction":
                assert command.get("writeConcern") == {"w": "majority"}, (name, command)
            elif "readConcern" in command:  # the transaction's first command
                assert command["readConcern"].get("level") == "snapshot", (name, command)
            continue
        if name in WRITES:
            assert command.get("writeConcern") == {"w": "majority"}, (name, command)
        else:
            assert command.get("readConcern") == {"level": "majority"}, (name, command)
            preference = command.get("$readPreference", {"mode": "primary"})
            assert preference["mode"] == "primary", (name, command)


# --------------------------------------------------------------- unconfirmed writes

Check = Callable[[Stores], Awaitable[None]]


async def _kv_put_if_version(s: Stores, url: str) -> Check:
    first = await s.kv.put(("ns",), "key", {"n": 1})
    _fail_next(url, "findAndModify")
    try:
        result: Item | KVConflict | None = await s.kv.put_if_version(
            ("ns",), "key", {"n": 2}, first.version
        )
    except OutcomeUnknownError:
        result = None

    async def check(s: Stores) -> None:
        stored = await s.kv.get(("ns",), "key")
        assert isinstance(stored, Item)
        assert stored.value == {"n": 2}
        assert stored.version == first.version + 1  # applied once
        if result is not None:
            assert isinstance(result, Item)
            assert (result.version, result.value) == (stored.version, stored.value)

    return check


async def _kv_put(s: Stores, url: str) -> Check:
    await s.kv.put(("ns",), "key", "one")
    _fail_next(url, "findAndModify")
    try:
        result: Item | None = await s.kv.put(("ns",), "key", "two")
    except OutcomeUnknownError:
        result = None

    async def check(s: Stores) -> None:
        stored = await s.kv.get(("ns",), "key")
        assert isinstance(stored, Item)
        assert (stored.value, stored.version) == ("two", 2)
        if result is not None:
            assert result.version == 2

    return check


async def _guard_try_acquire(s: Stores, url: str) -> Check:
    _fail_next(url, "commitTransaction")  # an acquisition is one transaction
    try:
        lock = await s.guard.try_acquire("resource", owner="me")
    except OutcomeUnknownError:
        lock = None
        held = False
    else:
        assert lock is not None, "the lock was free: an acquisition the driver retried must win"
        held = True

    async def check(s: Stores) -> None:
        info = await s.guard.inspect("resource")
        assert info is not None
        assert info.owner == "me"  # acquired, whatever was answered
        if held:
            assert lock is not None
            assert info.fencing_token == lock.fencing_token == 1  # one acquisition, one token
            assert await lock.release()
            assert await s.guard.inspect("resource") is None

    return check


async def _state_save_if_version(s: Stores, url: str) -> Check:
    await s.state.save("u", "s", "key", "one")
    _fail_next(url, "findAndModify")
    try:
        result: int | StateConflict | None = await s.state.save_if_version(
            "u", "s", "key", "two", 1
        )
    except OutcomeUnknownError:
        result = None

    async def check(s: Stores) -> None:
        stored = await s.state.get_versioned("u", "s", "key")
        assert stored is not None
        assert (stored.value, stored.version) == ("two", 2)
        if result is not None:
            assert result == 2

    return check


async def _state_append_list(s: Stores, url: str) -> Check:
    await s.state.save_list("u", "s", "log", [1])
    _fail_next(url, "update")
    with contextlib.suppress(OutcomeUnknownError):
        await s.state.append_list("u", "s", "log", [2])

    async def check(s: Stores) -> None:
        assert await s.state.get_list("u", "s", "log") == [1, 2]  # appended once

    return check


async def _snapshot_put(s: Stores, url: str) -> Check:
    _fail_next(url, "findAndModify")
    try:
        info = await s.snapshots.put("scope", "one", b"data")
    except OutcomeUnknownError:
        info = None

    async def check(s: Stores) -> None:
        stored = await s.snapshots.get("scope", "one")
        assert stored is not None
        assert stored.data == b"data"
        if info is not None:
            assert stored.info.created_at == info.created_at

    return check


async def _kv_refresh_ttl(s: Stores, url: str) -> Check:
    put = await s.kv.put(("ns",), "key", "one", ttl=timedelta(hours=1))
    _fail_next(url, "findAndModify")
    try:
        result: Item | None = await s.kv.get(("ns",), "key", refresh_ttl=True)
    except OutcomeUnknownError:
        result = None

    async def check(s: Stores) -> None:
        stored = await s.kv.get(("ns",), "key")
        assert isinstance(stored, Item)
        assert stored.expires_at is not None
        assert put.expires_at is not None
        assert stored.expires_at >= put.expires_at  # refreshed (or at least not lost)
        assert (stored.value, stored.version) == ("one", 1)
        if result is not None:
            assert (result.value, result.version) == ("one", 1)
            assert result.expires_at == stored.expires_at

    return check


async def _state_save(s: Stores, url: str) -> Check:
    await s.state.save("u", "s", "key", "one")
    _fail_next(url, "findAndModify")
    try:
        result: int | None = await s.state.save("u", "s", "key", "two")
    except OutcomeUnknownError:
        result = None

    async def check(s: Stores) -> None:
        stored = await s.state.get_versioned("u", "s", "key")
        assert stored is not None
        assert (stored.value, stored.version) == ("two", 2)  # applied once
        if result is not None:
            assert result == 2

    return check


async def _guard_renew(s: Stores, url: str) -> Check:
    lock = await s.guard.try_acquire("resource", owner="me", lease_ttl=timedelta(seconds=30))
    assert lock is not None
    before = lock.expires_at
    _fail_next(url, "findAndModify")
    try:
        renewed: bool | None = await lock.renew()
    except OutcomeUnknownError:
        renewed = None
    assert renewed is not False, "a renewal the server applied answered 'not held'"

    async def check(s: Stores) -> None:
        info = await s.guard.inspect("resource")
        assert info is not None
        assert info.owner == "me"
        assert info.expires_at > before  # renewed
        if renewed:
            assert lock.expires_at == info.expires_at

    return check


async def _guard_release(s: Stores, url: str) -> Check:
    lock = await s.guard.try_acquire("resource", owner="me")
    assert lock is not None
    _fail_next(url, "delete")
    try:
        released: bool | None = await lock.release()
    except OutcomeUnknownError:
        released = None
    # The server deleted the live lock: "not held" would be a lie.
    assert released is not False, "a release the server applied answered 'not held'"

    async def check(s: Stores) -> None:
        assert await s.guard.inspect("resource") is None
        assert await s.guard.collection.count_documents({"_id": "resource"}) == 0
        # Released once: the same acquisition is not held any more.
        assert await s.guard._release("resource", lock.token) is False

    return check


async def _snapshot_delete(s: Stores, url: str) -> Check:
    assert s.snapshots.snapshot_ttl is not None  # the path that judges liveness
    await s.snapshots.put("scope", "one", b"data")
    _fail_next(url, "findAndModify")
    try:
        deleted: bool | None = await s.snapshots.delete("scope", "one")
    except OutcomeUnknownError:
        deleted = None
    # The server deleted the live snapshot: "absent" would be a lie.
    assert deleted is not False, "a delete the server applied answered 'absent'"

    async def check(s: Stores) -> None:
        assert await s.snapshots.get("scope", "one") is None
        assert await s.snapshots.collection.count_documents({}) == 0
        assert await s.snapshots.delete("scope", "one") is False  # deleted once

    return check


OPERATIONS: dict[str, Callable[[Stores, str], Awaitable[Check]]] = {
    "kv.put_if_version": _kv_put_if_version,
    "kv.put": _kv_put,
    "kv.get_refresh_ttl": _kv_refresh_ttl,
    "guard.try_acquire": _guard_try_acquire,
    "guard.renew": _guard_renew,
    "guard.release": _guard_release,
    "state.save_if_version": _state_save_if_version,
    "state.save": _state_save,
    "state.append_list": _state_append_list,
    "snapshots.put": _snapshot_put,
    "snapshots.delete": _snapshot_delete,
}
RETRIED = {
    "state.append_list": "update",
    "guard.release": "delete",
    "guard.try_acquire": "commitTransaction",
}
"""The command each operation's fail point hits (``findAndModify`` unless named here)."""


@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_a_write_concern_error_is_retried_or_unknown(
    test_mongod: MongodProcess, operation: str
) -> None:
    """The driver cannot find the primary again within the selection timeout here
    (its monitor waits up to 10 s): either outcome is allowed, the write applied once."""
    url = test_mongod.url + "&serverSelectionTimeoutMS=1000"
    async with stores(url) as s:
        check = await OPERATIONS[operation](s, url)
        # Judged on a new client: this one has not found the primary again yet.
        async with stores(test_mongod.url, prefix=s.prefix) as fresh:
            await check(fresh)


@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_a_write_concern_error_is_retried_by_the_driver(
    test_mongod: MongodProcess, operation: str
) -> None:
    """With a short heartbeat the driver finds the primary again and retries: the
    operation succeeds, the server answering the retry from its record of the write."""
    url = test_mongod.url + "&heartbeatFrequencyMS=500"
    async with stores(url) as s:
        check = await OPERATIONS[operation](s, url)
        name = RETRIED.get(operation, "findAndModify")
        numbers = [command.get("txnNumber") for command in s.recorder.sent(name)]
        assert any(n is not None and numbers.count(n) == 2 for n in numbers), "no retry"
        await check(s)


def _one_retried(commands: list[dict[str, Any]]) -> None:
    """Exactly one command, sent twice (the driver's retry: the same transaction number)."""
    numbers = [command.get("txnNumber") for command in commands]
    assert len(numbers) == 2, commands
    assert numbers[0] is not None
    assert numbers[0] == numbers[1], commands


async def test_a_release_the_driver_retried_answers_released_once(
    test_mongod: MongodProcess,
) -> None:
    """The retry is answered from the server's record of the first attempt, which
    deleted the live lock: the release is reported, once, and the lock is gone."""
    url = test_mongod.url + "&heartbeatFrequencyMS=500"
    async with stores(url) as s:
        lock = await s.guard.try_acquire("resource", owner="me")
        assert lock is not None
        s.recorder.commands.clear()
        _fail_next(url, "delete")
        assert await lock.release() is True
        _one_retried(s.recorder.sent("delete"))
        assert await lock.release() is False
        assert await s.guard._release("resource", lock.token) is False
        assert await s.guard.inspect("resource") is None
        assert await s.guard.collection.count_documents({"_id": "resource"}) == 0
        again = await s.guard.try_acquire("resource", owner="next")
        assert again is not None  # free
        assert again.fencing_token > lock.fencing_token
        assert await again.release() is True


async def test_a_snapshot_delete_the_driver_retried_answers_deleted_once(
    test_mongod: MongodProcess,
) -> None:
    url = test_mongod.url + "&heartbeatFrequencyMS=500"
    async with stores(url) as s:
        assert s.snapshots.snapshot_ttl is not None
        await s.snapshots.put("scope", "one", b"data")
        await s.snapshots.put("scope", "two", b"kept")
        s.recorder.commands.clear()
        _fail_next(url, "findAndModify")  # find_one_and_delete: the GridFS file goes after it
        assert await s.snapshots.delete("scope", "one") is True
        _one_retried(s.recorder.sent("findAndModify"))
        assert await s.snapshots.delete("scope", "one") is False
        assert await s.snapshots.get("scope", "one") is None
        kept = await s.snapshots.get("scope", "two")
        assert kept is not None
        assert kept.data == b"kept"
        assert await s.snapshots.collection.count_documents({}) == 1


async def test_an_expired_lock_or_snapshot_is_deleted_and_answers_false(
    test_mongod: MongodProcess,
) -> None:
    """Not live: ``False``, and the leftover document goes (only ours: a newer
    holder's lock, a snapshot put again, stay)."""
    clock = ManualClock()
    async with stores(test_mongod.url, clock) as s:
        lock = await s.guard.try_acquire("resource", owner="me", lease_ttl=timedelta(seconds=5))
        other = await s.guard.try_acquire("other", owner="me", lease_ttl=timedelta(seconds=5))
        assert lock is not None
        assert other is not None
        clock.advance(timedelta(seconds=6))
        newer = await s.guard.try_acquire("other", owner="next", lease_ttl=timedelta(hours=1))
        assert newer is not None
        assert await lock.release() is False
        assert await s.guard.collection.count_documents({"_id": "resource"}) == 0
        assert await other.release() is False
        info = await s.guard.inspect("other")
        assert info is not None
        assert info.owner == "next"  # the expired holder's release left it alone
        ttl = s.snapshots.snapshot_ttl
        assert ttl is not None
        await s.snapshots.put("scope", "old", b"old")
        clock.advance(ttl + timedelta(seconds=1))
        assert await s.snapshots.delete("scope", "old") is False
        assert await s.snapshots.collection.count_documents({}) == 0


async def test_an_unconfirmed_write_never_says_nothing_was_applied(
    test_mongod: MongodProcess,
) -> None:
    """The write concern error itself (no retry possible) is an unknown outcome."""
    url = test_mongod.url + "&retryWrites=false"
    async with stores(url) as s:
        await s.kv.put(("ns",), "key", 1)
        _fail_next(url, "findAndModify")
        with pytest.raises(OutcomeUnknownError, match="may or may not"):
            await s.kv.put(("ns",), "key", 2)
        stored = await s.kv.get(("ns",), "key")
        assert stored is not None
        assert stored.value == 2


async def test_an_unexpected_error_inside_an_operation_is_a_storage_error(
    test_mongod: MongodProcess,
) -> None:
    async with stores(test_mongod.url) as s:
        holder = s.kv._holder
        with (
            pytest.raises(OutcomeUnknownError, match="may or may not") as raised,
            holder.errors("write"),
        ):
            raise AttributeError("'RawBSONDocument' object has no attribute 'update'")
        assert isinstance(raised.value.__cause__, AttributeError)
        with pytest.raises(StorageError) as read, holder.errors("read"):
            raise KeyError("x")
        assert not isinstance(read.value, OutcomeUnknownError)


async def test_a_findandmodify_result_is_decoded_like_every_other_result(
    test_mongod: MongodProcess,
) -> None:
    """Int64 comes back as ``int``; a stored object shaped like a DBRef is refused alike
    by a read and by a write that returns the document (``get(refresh_ttl=True)``)."""
    async with stores(test_mongod.url) as s:
        item = await s.kv.put(("ns",), "key", 1, ttl=timedelta(hours=1))
        assert type(item.version) is int
        refreshed = await s.kv.get(("ns",), "key", refresh_ttl=True)
        assert refreshed is not None
        assert type(refreshed.version) is int
        raw = s.client[DB][s.kv.collection_name]
        await raw.update_one({"key": "key"}, {"$set": {"value": {"$ref": "c", "$id": 1}}})
        with pytest.raises(InvalidInputError, match="cannot be decoded") as read:
            await s.kv.get(("ns",), "key")
        with pytest.raises(InvalidInputError, match="cannot be decoded") as written:
            await s.kv.get(("ns",), "key", refresh_ttl=True)
        assert type(read.value) is type(written.value)


@pytest.mark.parametrize(
    ("exc", "phase", "expected"),
    [
        (pm.ServerSelectionTimeoutError("no server"), "read", UnavailableError),
        (pm.ServerSelectionTimeoutError("no server"), "write", UnavailableError),
        (pm.ServerSelectionTimeoutError("no server"), "connect", UnavailableError),
        (pm.AutoReconnect("lost"), "read", UnavailableError),
        (pm.AutoReconnect("lost"), "write", OutcomeUnknownError),
        (pm.WriteConcernError("no majority", 64, {}), "write", OutcomeUnknownError),
        (pm.OperationFailure("refused", 18), "connect", ConfigurationError),
        (pm.OperationFailure("odd", 9999), "read", StorageError),
        (pm.DocumentTooLarge("big"), "write", InvalidInputError),
    ],
)
async def test_runtime_errors_are_the_general_classes(
    exc: pm.PyMongoError, phase: Phase, expected: type[StorageError]
) -> None:
    """A runtime store's error is the general class, worded for a value, not a thread."""
    mapped = runtime_error(exc, phase, None)
    assert isinstance(mapped, expected)
    assert not isinstance(mapped, ThreadStoreError)
    assert "thread" not in str(mapped)


async def test_an_unreachable_server_is_unavailable_for_every_runtime_store() -> None:
    url = "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=200&directConnection=true"
    store = MongoKeyValueStore(url)
    try:
        with pytest.raises(UnavailableError) as raised:
            await store.get(("ns",), "key")
        assert not isinstance(raised.value, ThreadStoreError)
    finally:
        await store.close()
