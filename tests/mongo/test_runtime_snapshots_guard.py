"""MongoDB snapshot store and execution guard: conformance, layout, EXPLAIN, faults.

The conformance topics run here on the stores themselves (one collection
prefix per test, dropped afterwards); the rest checks what only MongoDB shows:
the server clock (``$$NOW``), the documents and indexes an operator sees, that
every query is an index scan without an in-memory sort, the 15 MiB limit, and
faults through a loopback proxy (see ``docs/mongodb.md``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from bson import Int64
from pai_storage_conformance.suite.guard import ExecutionGuardTests
from pai_storage_conformance.suite.snapshots import SnapshotStoreTests
from pai_storage_mongo.guard import COUNTER_ID, MongoExecutionGuard
from pai_storage_mongo.harness import TEST_DB, MongoHarness
from pai_storage_mongo.snapshots import MAX_SNAPSHOT_BYTES, MongoSnapshotStore
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError
from support.proxy import FaultProxy

from pai_storage import ManualClock
from pai_storage.errors import (
    ConfigurationError,
    CorruptSnapshotError,
    OutcomeUnknownError,
    StorageError,
    UnavailableError,
)
from pai_storage.events import StoreWarning
from pai_storage.guard import Lock
from pai_storage.snapshots import MAX_METADATA_BYTES

from .helpers import proxied_url

_SORT = [("createdAt", -1), ("_id.snapshotId", -1)]


def _prefix() -> str:
    return f"pai_test_{uuid.uuid4().hex[:12]}_"


async def _drop(url: str, store: MongoSnapshotStore | MongoExecutionGuard) -> None:
    """Drop the test store's collection (the store itself may be closed by then)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        await client[TEST_DB].drop_collection(store._holder.name(store.component))
    finally:
        await client.close()


class TestMongoSnapshotConformance(SnapshotStoreTests):
    @pytest_asyncio.fixture
    async def snapshot_store(
        self, mongo_url: str, clock: ManualClock
    ) -> AsyncIterator[MongoSnapshotStore]:
        store = MongoSnapshotStore(
            mongo_url, clock=clock, db_name=TEST_DB, collection_prefix=_prefix()
        )
        await store.initialize()
        try:
            yield store
        finally:
            await _drop(mongo_url, store)
            await store.close()


class TestMongoGuardConformance(ExecutionGuardTests):
    @pytest_asyncio.fixture
    async def guard(self, mongo_url: str, clock: ManualClock) -> AsyncIterator[MongoExecutionGuard]:
        guard = MongoExecutionGuard(
            mongo_url, clock=clock, db_name=TEST_DB, collection_prefix=_prefix()
        )
        await guard.initialize()
        try:
            yield guard
        finally:
            await _drop(mongo_url, guard)
            await guard.close()


# --------------------------------------------------------------------------- helpers


def _open_snapshots(url: str, prefix: str, **options: Any) -> MongoSnapshotStore:
    return MongoSnapshotStore(url, db_name=TEST_DB, collection_prefix=prefix, **options)


def _open_guard(url: str, prefix: str, **options: Any) -> MongoExecutionGuard:
    return MongoExecutionGuard(url, db_name=TEST_DB, collection_prefix=prefix, **options)


@pytest_asyncio.fixture
async def raw_db(mongo_url: str) -> AsyncIterator[Any]:
    """The test database through a plain client (default codec: BSON types visible)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    try:
        yield client[TEST_DB]
    finally:
        await client.close()


@pytest_asyncio.fixture
async def ttl_monitor_paused(mongo_harness: MongoHarness, mongo_url: str) -> AsyncIterator[None]:
    """MongoDB's TTL monitor paused for the test, on the harness's own mongod only.

    The monitor deletes expired documents once a minute on the server's clock, so
    a pass may land between a document's expiry and the test's ``purge_expired``
    and leave the purge less to count. Someone else's server is left alone.
    """
    if mongo_harness._mongod is None:
        yield
        return
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    try:
        await client.admin.command("setParameter", 1, ttlMonitorEnabled=False)
        yield
    finally:
        await client.admin.command("setParameter", 1, ttlMonitorEnabled=True)
        await client.close()


SHORT_TTL = timedelta(seconds=2)
"""Long enough for a few reads stalled by a busy machine, short enough to wait out once."""


async def _snapshot_store(mongo_url: str, ttl: timedelta) -> AsyncIterator[MongoSnapshotStore]:
    store = _open_snapshots(mongo_url, _prefix(), snapshot_ttl=ttl)
    await store.initialize()
    try:
        yield store
    finally:
        await _drop(mongo_url, store)
        await store.close()


@pytest_asyncio.fixture
async def snapshots(mongo_url: str) -> AsyncIterator[MongoSnapshotStore]:
    """A snapshot store on the server's clock ($$NOW) whose snapshots outlive the test."""
    async for store in _snapshot_store(mongo_url, timedelta(hours=1)):
        yield store


@pytest_asyncio.fixture
async def expiring_snapshots(mongo_url: str) -> AsyncIterator[MongoSnapshotStore]:
    """A snapshot store on the server's clock ($$NOW) whose snapshots live ``SHORT_TTL``."""
    async for store in _snapshot_store(mongo_url, SHORT_TTL):
        yield store


@pytest_asyncio.fixture
async def guard(mongo_url: str) -> AsyncIterator[MongoExecutionGuard]:
    """A guard on the server's clock ($$NOW)."""
    store = _open_guard(mongo_url, _prefix(), retry_interval=timedelta(milliseconds=20))
    await store.initialize()
    try:
        yield store
    finally:
        await _drop(mongo_url, store)
        await store.close()


def _stages(plan: Any) -> list[str]:
    found: list[str] = []
    if isinstance(plan, dict):
        if "stage" in plan:
            found.append(plan["stage"])
        for key in ("inputStage", "queryPlan", "winningPlan"):
            if key in plan:
                found += _stages(plan[key])
        for child in plan.get("inputStages", []):
            found += _stages(child)
    return found


def _assert_indexed(explained: dict[str, Any]) -> list[str]:
    stages = _stages(explained["queryPlanner"]["winningPlan"])
    assert "COLLSCAN" not in stages, stages
    assert "SORT" not in stages, stages
    assert any(s in ("IXSCAN", "IDHACK", "EXPRESS_IXSCAN", "EXPRESS_IDHACK") for s in stages), (
        stages
    )
    return stages


# --------------------------------------------------------------------------- server clock


@pytest.mark.usefixtures("ttl_monitor_paused")
async def test_snapshot_expiry_on_the_server_clock(
    expiring_snapshots: MongoSnapshotStore, raw_db: Any
) -> None:
    snapshots = expiring_snapshots
    hello = await raw_db.command("hello")
    info = await snapshots.put("scope", "s1", b"tar", metadata={"n": 1})
    assert abs((info.created_at - hello["localTime"].replace(tzinfo=UTC)).total_seconds()) < 5
    assert info.expires_at == info.created_at + SHORT_TTL
    got = await snapshots.get("scope", "s1")
    assert got is not None
    assert got.data == b"tar"
    assert got.info == info
    latest = await snapshots.latest("scope")
    assert latest is not None
    assert latest.info.snapshot_id == "s1"
    assert [i.snapshot_id for i in (await snapshots.list("scope")).items] == ["s1"]
    await snapshots.put("scope", "s2", b"x")
    await snapshots.put("scope", "s3", b"y")
    await asyncio.sleep(SHORT_TTL.total_seconds() + 0.15)  # s1, s2 and s3 expire
    assert await snapshots.get("scope", "s1") is None
    assert await snapshots.latest("scope") is None
    assert (await snapshots.list("scope")).items == []
    assert await snapshots.delete("scope", "s1") is False  # expired: not there any more
    await snapshots.put("scope", "s4", b"z")
    assert await snapshots.purge_expired() == 2
    assert await snapshots.delete("scope", "s4") is True
    assert await raw_db[snapshots.collection.name].count_documents({}) == 0


@pytest.mark.usefixtures("ttl_monitor_paused")
async def test_guard_primitives_on_the_server_clock(guard: MongoExecutionGuard) -> None:
    # A minute while the checks that need a live lock run (a busy machine may stall
    # them for seconds); 300 ms where the test waits the lease out.
    lease, short = timedelta(minutes=1), timedelta(milliseconds=300)
    first = await guard._acquire("r", "w1", "t1", lease)
    assert first is not None
    assert first.owner == "w1"
    assert first.expires_at - first.acquired_at == lease
    assert await guard._acquire("r", "w2", "t2", lease) is None
    assert await guard._renew("r", "t2", lease) is None  # someone else's token
    renewed = await guard._renew("r", "t1", lease)
    assert renewed is not None
    assert renewed >= first.expires_at
    seen = await guard._inspect("r")
    assert seen is not None
    assert seen.owner == "w1"
    assert seen.fencing_token == first.fencing_token
    shortened = await guard._renew("r", "t1", short)  # a renewal may shorten the lease
    assert shortened is not None
    assert shortened < renewed
    await asyncio.sleep(0.45)
    assert await guard._inspect("r") is None  # expired: free at once, swept or not
    assert await guard._renew("r", "t1", lease) is None
    second = await guard._acquire("r", "w2", "t2", lease)
    assert second is not None
    assert second.fencing_token > first.fencing_token
    assert await guard._release("r", "t1") is False  # the old holder cannot release it
    assert await guard._release("r", "t2") is True
    assert await guard._release("r", "t2") is False
    assert await guard._acquire("a", "w", "t3", short) is not None
    assert await guard._acquire("b", "w", "t4", short) is not None
    await asyncio.sleep(0.45)
    assert await guard.purge_expired() == 2  # the fencing counter is not a lock
    third = await guard._acquire("r", "w3", "t5", lease)
    assert third is not None
    assert third.fencing_token > second.fencing_token + 2


async def test_racing_acquisitions_on_the_server_clock(guard: MongoExecutionGuard) -> None:
    results = await asyncio.gather(*(guard.try_acquire("busy", owner=f"w{i}") for i in range(24)))
    won = [lock for lock in results if lock is not None]
    assert len(won) == 1
    assert await won[0].release() is True
    # Sequential holders of one resource: every fencing token beats the previous one.
    tokens = []
    for i in range(5):
        async with guard.hold("busy", owner=f"w{i}") as lock:
            tokens.append(lock.fencing_token)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 5
    assert tokens[0] > won[0].fencing_token


async def test_concurrent_holders_fencing_log(guard: MongoExecutionGuard) -> None:
    """Workers contending for 2 resources: per resource, holders never overlap and
    each holder's fencing token beats every earlier holder's."""
    log: dict[str, list[int]] = {"r0": [], "r1": []}
    busy: dict[str, bool] = {"r0": False, "r1": False}

    async def worker(i: int) -> None:
        resource = f"r{i % 2}"
        for _ in range(3):
            async with guard.hold(resource, owner=f"w{i}") as lock:
                assert not busy[resource]
                busy[resource] = True
                log[resource].append(lock.fencing_token)
                await asyncio.sleep(0.002)
                busy[resource] = False

    await asyncio.gather(*(worker(i) for i in range(8)))
    for tokens in log.values():
        assert len(tokens) == 12
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == 12


# --------------------------------------------------------------------------- layout


async def test_snapshot_document_and_indexes(mongo_url: str, raw_db: Any) -> None:
    store = _open_snapshots(mongo_url, _prefix(), snapshot_ttl=timedelta(days=2, seconds=1))
    try:
        await store.put("sc", "id.$%", b"\x00\x01", metadata={"b": 1.0, "a": 2**62})
        doc = await raw_db[store.collection.name].find_one({})
        assert doc is not None
        assert set(doc) == {
            "_id",
            "createdAt",
            "size",
            "sha256",
            "metadata",
            "data",
            "_schemaVersion",
        }
        assert list(doc["_id"].items()) == [("scope", "sc"), ("snapshotId", "id.$%")]
        assert isinstance(doc["createdAt"], datetime)
        assert isinstance(doc["size"], Int64)
        assert doc["size"] == 2
        assert doc["metadata"] == '{"b":1.0,"a":4611686018427387904}'
        assert isinstance(doc["data"], bytes)
        assert doc["data"] == b"\x00\x01"
        assert doc["_schemaVersion"] == 1
        got = await store.get("sc", "id.$%")
        assert got is not None
        assert list(got.info.metadata) == ["b", "a"]
        assert type(got.info.metadata["b"]) is float
        info = await raw_db[store.collection.name].index_information()
        assert info["scope_newest"]["key"] == [
            ("_id.scope", 1),
            ("createdAt", -1),
            ("_id.snapshotId", -1),
        ]
        assert info["createdAt_ttl"]["key"] == [("createdAt", 1)]
        assert info["createdAt_ttl"]["expireAfterSeconds"] == 2 * 86400 + 1
    finally:
        await _drop(mongo_url, store)
        await store.close()


async def test_snapshots_kept_forever_have_no_ttl_index(mongo_url: str, raw_db: Any) -> None:
    store = _open_snapshots(mongo_url, _prefix(), snapshot_ttl=None)
    try:
        info = await store.put("sc", "a", b"1")
        assert info.expires_at is None
        assert await store.purge_expired() == 0
        assert "createdAt_ttl" not in await raw_db[store.collection.name].index_information()
        assert await store.delete("sc", "a") is True
    finally:
        await _drop(mongo_url, store)
        await store.close()


async def test_lock_document_counter_and_ttl_index(guard: MongoExecutionGuard, raw_db: Any) -> None:
    lock = await guard.try_acquire("res.$1", owner="worker-7")
    assert lock is not None
    locks = raw_db[guard.collection.name]
    doc = await locks.find_one({"_id": "res.$1"})
    assert doc is not None
    assert set(doc) == {"_id", "token", "owner", "fencingToken", "acquiredAt", "expiresAt"}
    assert doc["token"] == lock.token
    assert doc["owner"] == "worker-7"
    assert isinstance(doc["fencingToken"], Int64)
    assert doc["fencingToken"] == lock.fencing_token
    assert isinstance(doc["acquiredAt"], datetime)
    assert isinstance(doc["expiresAt"], datetime)
    counter = await locks.find_one({"_id": dict(COUNTER_ID)})
    assert counter is not None
    assert counter["value"] == lock.fencing_token
    assert isinstance(counter["value"], Int64)
    assert "expiresAt" not in counter
    ttl = (await locks.index_information())["expiresAt_ttl"]
    assert ttl["key"] == [("expiresAt", 1)]
    assert ttl["expireAfterSeconds"] == 0
    assert ttl["partialFilterExpression"] == {"expiresAt": {"$exists": True}}
    await lock.release()
    assert await locks.count_documents({}) == 1  # only the counter is left


# --------------------------------------------------------------------------- limits


async def test_the_largest_snapshot_in_a_document(snapshots: MongoSnapshotStore) -> None:
    """15 MiB with the largest metadata fits in one document (larger ones: GridFS,
    ``test_snapshot_gridfs.py``)."""
    assert MAX_SNAPSHOT_BYTES == 15 * 1024 * 1024
    assert snapshots.max_snapshot_bytes is None
    metadata = {"k": "m" * (MAX_METADATA_BYTES - 16)}
    data = bytes(range(256)) * (MAX_SNAPSHOT_BYTES // 256)
    info = await snapshots.put("sc", "max", data, metadata=metadata)
    assert info.size == MAX_SNAPSHOT_BYTES
    got = await snapshots.get("sc", "max")
    assert got is not None
    assert got.data == data
    assert got.info.metadata == metadata
    stored = await snapshots.collection.find_one({"_id.snapshotId": "max"})
    assert stored is not None
    assert "data" in stored
    assert "blob" not in stored


async def test_damaged_snapshot_is_never_returned(
    snapshots: MongoSnapshotStore, raw_db: Any
) -> None:
    warnings: list[StoreWarning] = []
    snapshots.on_warning = warnings.append
    await snapshots.put("sc", "a", b"good bytes")
    await raw_db[snapshots.collection.name].update_one({}, {"$set": {"data": b"evil bytes"}})
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await snapshots.get("sc", "a")
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await snapshots.latest("sc")
    await raw_db[snapshots.collection.name].update_one({}, {"$set": {"metadata": "{oops"}})
    with pytest.raises(CorruptSnapshotError, match="does not decode"):
        await snapshots.get("sc", "a")
    assert (await snapshots.list("sc")).items == []  # reported and skipped
    assert warnings
    assert all(w.kind == "invalid_record" for w in warnings)
    assert all("evil" not in w.reason for w in warnings)


# --------------------------------------------------------------------------- EXPLAIN


@pytest.mark.parametrize("server_clock", [True, False], ids=["now", "test-clock"])
async def test_snapshot_queries_use_the_index(
    mongo_url: str, raw_db: Any, server_clock: bool
) -> None:
    clock = None if server_clock else ManualClock()
    store = _open_snapshots(mongo_url, _prefix(), clock=clock)
    try:
        for i in range(30):
            await store.put(f"scope{i % 3}", f"s{i:02d}", b"d")
        col = raw_db[store.collection.name]
        first = (await store.list("scope1")).items[0]
        forms = {
            "list": store.list_query("scope1", None),
            "list-after": store.list_query("scope1", (first.created_at, first.snapshot_id)),
        }
        for name, query in forms.items():
            cursor = col.find(query, projection={"data": 0}).sort(_SORT).hint("scope_newest")
            stages = _assert_indexed(await cursor.limit(3).explain())
            assert "FETCH" in stages, (name, stages)
        # Without the hint the planner must choose the same index (no in-memory sort).
        _assert_indexed(await col.find(forms["list"]).sort(_SORT).limit(1).explain())
        key = store.key("scope1", first.snapshot_id)
        _assert_indexed(await col.find({"_id": key, **store.live_filter()}).explain())
        # list-after really starts after the position (bounds on createdAt).
        explained = await col.find(forms["list-after"]).sort(_SORT).hint("scope_newest").explain()
        assert "createdAt" in str(explained["queryPlanner"]["winningPlan"])
    finally:
        await _drop(mongo_url, store)
        await store.close()


async def test_lock_lookups_use_the_id_index(guard: MongoExecutionGuard, raw_db: Any) -> None:
    await guard.try_acquire("r", owner="w")
    col = raw_db[guard.collection.name]
    for query in ({"_id": "r"}, guard.live_filter("r"), {"_id": "r", "token": "t"}):
        _assert_indexed(await col.find(query).explain())


# --------------------------------------------------------------------------- faults


@pytest_asyncio.fixture
async def proxy(replica_port: int) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(replica_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def _through(port: int) -> str:
    return proxied_url(port, serverSelectionTimeoutMS="800")


def _typed(exc: BaseException) -> None:
    """A fault surfaces as a contract error, never a raw PyMongo exception."""
    assert isinstance(exc, UnavailableError | OutcomeUnknownError), repr(exc)
    assert not isinstance(exc, PyMongoError)
    assert "mongo" in str(exc).lower()


async def test_snapshot_store_when_the_server_is_gone(mongo_url: str, proxy: FaultProxy) -> None:
    prefix = _prefix()
    store = _open_snapshots(_through(proxy.port), prefix)
    try:
        await store.put("sc", "a", b"1")
        proxy.cut()
        operations: dict[str, Callable[[], Awaitable[Any]]] = {
            "put": lambda: store.put("sc", "b", b"2"),
            "get": lambda: store.get("sc", "a"),
            "latest": lambda: store.latest("sc"),
            "list": lambda: store.list("sc"),
            "delete": lambda: store.delete("sc", "a"),
            "purge": store.purge_expired,
        }
        for name, operation in operations.items():
            with pytest.raises(StorageError) as caught:
                await operation()
            _typed(caught.value)
            if name in ("get", "latest", "list"):
                # A read on a dead connection is retryable: unavailable. (A write may
                # already have been sent on a pooled connection the cut killed: then
                # its outcome is unknown, which _typed allows.)
                assert isinstance(caught.value, UnavailableError), (name, caught.value)
        proxy.restore()
        got = await store.get("sc", "a")  # the same store recovers, not reopened
        assert got is not None
        assert got.data == b"1"
    finally:
        await _drop(mongo_url, store)
        await store.close()


@pytest.mark.parametrize("forward", [True, False], ids=["applied", "never-sent"])
async def test_snapshot_put_cut_mid_command(
    mongo_url: str, proxy: FaultProxy, forward: bool
) -> None:
    prefix = _prefix()
    store = _open_snapshots(_through(proxy.port), prefix)
    direct = _open_snapshots(mongo_url, prefix)
    try:
        await store.initialize()
        proxy.cut_on(b"findAndModify\x00", forward=forward)
        with pytest.raises(StorageError) as caught:
            await store.put("sc", "a", b"payload")
        assert proxy.triggered.is_set()
        _typed(caught.value)
        proxy.restore()
        stored = await direct.get("sc", "a")
        if forward:  # the server acted; the client never heard: outcome unknown
            assert isinstance(caught.value, OutcomeUnknownError)
            assert "read it back" in str(caught.value)
            assert stored is not None
            assert stored.data == b"payload"
        info = await store.put("sc", "a", b"again")
        assert info.size == 5
    finally:
        await _drop(mongo_url, direct)
        await direct.close()
        await store.close()


async def test_guard_when_the_server_is_gone(mongo_url: str, proxy: FaultProxy) -> None:
    guard = _open_guard(_through(proxy.port), _prefix())
    try:
        await guard.initialize()
        proxy.cut()
        for operation in (
            lambda: guard.try_acquire("r", owner="w"),
            lambda: guard.inspect("r"),
            guard.purge_expired,
        ):
            with pytest.raises(StorageError) as caught:
                await operation()
            _typed(caught.value)
        with pytest.raises(UnavailableError):
            await guard.acquire("r", owner="w", lock_timeout=timedelta(seconds=5))
        proxy.restore()
        lock = await guard.try_acquire("r", owner="w")  # recovers without reopening
        assert lock is not None
        assert await lock.release() is True
    finally:
        await _drop(mongo_url, guard)
        await guard.close()


@pytest.mark.parametrize("how", ["gone", "paused"])
async def test_lock_lost_before_its_lease_runs_out(
    mongo_url: str, proxy: FaultProxy, how: str
) -> None:
    guard = _open_guard(_through(proxy.port), _prefix())
    lost: list[Lock] = []
    try:
        lease = timedelta(milliseconds=1500)
        lock = await guard.try_acquire("r", owner="w", lease_ttl=lease, on_lost=lost.append)
        assert lock is not None
        loop = asyncio.get_running_loop()
        granted = loop.time()
        if how == "gone":
            proxy.cut()
        else:  # the next renewal reaches the server, whose answer never comes back
            proxy.cut_on(b"findAndModify\x00", forward=True)
        await asyncio.wait_for(lock.lost.wait(), timeout=5)
        # Given up when the lease ended here: 0.3 s leaves room for a late wake-up on a
        # busy machine and stays below the 0.8 s a renewal left to the driver's server
        # selection would take.
        assert loop.time() < granted + lease.total_seconds() + 0.3
        assert lost == [lock]
        proxy.restore()
    finally:
        await _drop(mongo_url, guard)
        await guard.close()


async def test_another_snapshot_ttl_than_the_index_is_refused(mongo_url: str) -> None:
    prefix = _prefix()
    first = _open_snapshots(mongo_url, prefix, snapshot_ttl=timedelta(days=1))
    second = _open_snapshots(mongo_url, prefix, snapshot_ttl=timedelta(days=2))
    try:
        await first.initialize()
        with pytest.raises(ConfigurationError) as caught:
            await second.initialize()
        assert "index" in str(caught.value)
        assert prefix + "snapshots" in str(caught.value)
    finally:
        await _drop(mongo_url, first)
        await first.close()
        await second.close()
