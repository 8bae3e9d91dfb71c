"""The MongoDB layout and its safety model, checked on the commands and documents themselves.

``docs/mongodb.md`` (Data model, Indexes, Deployment, Errors): every commit is one
multi-document transaction; a delete touches only its ``{scopeKey, threadId}``
and nothing is ever dropped; a list always binds ``listVisibility`` (``"visible"``
or ``{"$in": ["visible", "hidden"]}``); documents are flat with an ObjectId
``_id``, ``_schemaVersion`` and, on children, ``_order``; every timestamp is a
BSON date; the ``scope_thread_*_unique`` indexes enforce identity; a stored
document missing a required field is invalid.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from bson import ObjectId
from pai_storage_mongo.harness import drop_store_collections, find_mongod
from pai_storage_mongo.store import MongoThreadStore
from pymongo import AsyncMongoClient, monitoring
from pymongo.errors import DuplicateKeyError
from support.threads import every_family_create

from pai_storage import CommittedResult, ManualClock, StoreWarning, ThreadVersion, open_store
from pai_storage import builders as b
from pai_storage.errors import (
    ThreadStoreConfigurationError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
)

from .helpers import raw_collections

pytestmark = pytest.mark.asyncio

DB = "pai_test"
_HANDSHAKE = {"hello", "isMaster", "ismaster", "ping", "endSessions", "buildInfo"}
_WRITES = {"insert", "update", "delete", "findAndModify"}
BOTH: dict[str, Any] = {"$in": ["visible", "hidden"]}


class Recorder(monitoring.CommandListener):
    """Every command the client sends (handshakes and heartbeats aside), whole."""

    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in _HANDSHAKE:
            self.commands.append({"name": event.command_name, **dict(event.command)})

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> list[dict[str, Any]]:
        taken, self.commands = self.commands, []
        return taken


@pytest_asyncio.fixture
async def recorded(mongo_url: str) -> AsyncIterator[tuple[MongoThreadStore, Recorder]]:
    recorder = Recorder()
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url, event_listeners=[recorder])
    store = MongoThreadStore(
        client=client, db_name=DB, collection_name=f"pai_test_{uuid.uuid4().hex}"
    )
    try:
        await store.initialize()
        yield store, recorder
    finally:
        await drop_store_collections(store)
        await store.close()
        await client.close()


async def _committed(store: MongoThreadStore, request: dict[str, Any]) -> ThreadVersion | None:
    result = await store.commit_thread(request)
    assert isinstance(result, CommittedResult), result
    return None if result.thread is None else result.thread.version


def _assert_one_transaction(commands: list[dict[str, Any]]) -> None:
    """Every command of one commit runs in one transaction that the last command commits."""
    assert commands, "the commit sent nothing"
    assert commands[-1]["name"] == "commitTransaction", [c["name"] for c in commands]
    assert commands[0].get("startTransaction") is True
    numbers = {int(c["txnNumber"]) for c in commands if "txnNumber" in c}
    sessions = {c["lsid"]["id"] for c in commands}
    assert len(numbers) == 1, [c["name"] for c in commands]
    assert len(sessions) == 1
    for command in commands:
        assert "txnNumber" in command, command["name"]
        assert command.get("autocommit") is False, command["name"]
    assert any(c["name"] in _WRITES for c in commands)


async def test_every_commit_is_one_multi_document_transaction(
    recorded: tuple[MongoThreadStore, Recorder],
) -> None:
    store, recorder = recorded
    recorder.take()
    version = await _committed(store, every_family_create())
    created = recorder.take()
    _assert_one_transaction(created)
    written = {c[c["name"]] for c in created if c["name"] in _WRITES}
    assert written == set(store.collection_names().values())
    # An update replacing a run, inserting a message and dropping a queued item.
    version = await _committed(
        store,
        b.update_at(
            "scope",
            "t1",
            version,
            {
                "messages": [
                    {"type": "insert", "record": b.message("m2", run_id="r1", relation="output")}
                ],
                "runs": [
                    {"type": "replace", "record": b.run("r1", "completed", inputs=["m1"])},
                    {"type": "delete", "id": "r2"},
                ],
                "queuedItems": [{"type": "delete", "id": "q1"}],
                "lease": b.release("r1", "w1"),
            },
            root=b.root(),
        ),
    )
    _assert_one_transaction(recorder.take())
    assert await _committed(store, b.delete("scope", "t1", version)) is None
    _assert_one_transaction(recorder.take())


async def test_a_delete_is_scoped_and_nothing_is_ever_dropped(
    recorded: tuple[MongoThreadStore, Recorder],
) -> None:
    store, recorder = recorded
    version = await _committed(store, every_family_create())
    await _committed(store, every_family_create("t2"))
    recorder.take()
    await _committed(store, b.delete("scope", "t1", version))
    commands = recorder.take()
    deletes = [c for c in commands if c["name"] == "delete"]
    assert {c["delete"] for c in deletes} == set(store.collection_names().values())
    for command in deletes:
        for statement in command["deletes"]:
            assert statement["q"]["scopeKey"] == "scope", statement
            assert statement["q"]["threadId"] == "t1", statement
    for command in commands:
        assert command["name"] not in {"drop", "dropDatabase", "dropIndexes"}
    # The other thread of the scope is untouched in every collection.
    cols = raw_collections(store)
    for family in cols:
        stored = {(d["scopeKey"], d["threadId"]) for d in await cols[family].find({}).to_list()}
        assert stored == {("scope", "t2")}, family


@pytest.mark.parametrize(
    ("request_extra", "predicate"),
    [
        ({}, "visible"),
        ({"includeHidden": True}, BOTH),
        ({"agent": "assistant"}, "visible"),
        ({"agent": "assistant", "includeHidden": True}, BOTH),
        ({"agent": "assistant", "parentThreadId": "p"}, "visible"),
        ({"agent": "assistant", "category": "c", "includeHidden": True}, BOTH),
    ],
    ids=["visible", "hidden", "agent", "agent-hidden", "agent-parent", "agent-category-hidden"],
)
async def test_a_list_always_binds_list_visibility_exactly(
    recorded: tuple[MongoThreadStore, Recorder],
    request_extra: dict[str, Any],
    predicate: Any,
) -> None:
    store, recorder = recorded
    for i in range(3):
        await _committed(store, b.create("scope", f"t{i}", parentThreadId="p", category="c"))
    await _committed(
        store, b.create("scope", "h", visibility="hidden", parentThreadId="p", category="c")
    )
    request = {"scopeKey": "scope", "limit": 2, **request_extra}
    recorder.take()
    first = await store.list_threads(request)
    assert first.next_page_token is not None
    await store.list_threads({**request, "pageToken": first.next_page_token})
    finds = [c for c in recorder.take() if c["name"] in {"find", "aggregate"}]
    assert len(finds) == 2
    for command in finds:
        assert command["name"] == "find"
        assert command["find"] == store.collection_name
        query = command["filter"]
        assert query["scopeKey"] == "scope"
        assert query["listVisibility"] == predicate
        assert "$ne" not in repr(query)


async def test_every_document_has_an_object_id_and_a_schema_version(
    mongo_store: MongoThreadStore,
) -> None:
    await _committed(mongo_store, every_family_create())
    cols = raw_collections(mongo_store)
    (root,) = await cols["threads"].find({}).to_list()
    assert isinstance(root["_id"], ObjectId)
    assert type(root["_schemaVersion"]) is int
    assert "_order" not in root  # children only
    for family in ("messages", "runs", "queuedItems"):
        documents = await cols[family].find({}).to_list()
        assert documents, family
        for document in documents:
            assert isinstance(document["_id"], ObjectId), family
            assert type(document["_schemaVersion"]) is int, family
            assert document["_schemaVersion"] == 1, family
            assert type(document["_order"]) is int, family
            # Flat: the record's fields at the top level, no wrapper.
            assert document["scopeKey"] == "scope"
            assert document["threadId"] == "t1"
            assert "payload" not in document
            assert "record" not in document
    runs = await cols["runs"].find({}, sort=[("_order", 1)]).to_list()
    assert [(r["runId"], r["_order"]) for r in runs] == [("r1", 1), ("r2", 2)]
    for run in runs:
        assert run["metadata"] == {}
        assert run["privateMetadata"] == {}


async def test_every_timestamp_is_a_bson_date_and_reads_back_exactly(
    mongo_store: MongoThreadStore, clock: ManualClock
) -> None:
    version = await _committed(mongo_store, every_family_create())
    clock.advance(ms=1500)
    await _committed(
        mongo_store,
        b.update_at(
            "scope",
            "t1",
            version,
            {
                "runs": [{"type": "replace", "record": b.run("r1", "completed", inputs=["m1"])}],
                "lease": b.release("r1", "w1"),
            },
            root=b.root(),
        ),
    )
    cols = raw_collections(mongo_store)
    (root,) = await cols["threads"].find({}).to_list()
    (message,) = await cols["messages"].find({}).to_list()
    (item,) = await cols["queuedItems"].find({}).to_list()
    r1 = await cols["runs"].find_one({"runId": "r1"})
    assert r1 is not None
    dates = {
        "root.createdAt": root["createdAt"],
        "root.updatedAt": root["updatedAt"],
        "message.createdAt": message["createdAt"],
        "message.updatedAt": message["updatedAt"],
        "queued.createdAt": item["createdAt"],
        "run.createdAt": r1["createdAt"],
        "run.updatedAt": r1["updatedAt"],
        "run.finishedAt": r1["finishedAt"],
        "run.admission.admittedAt": r1["admission"]["admittedAt"],
    }
    for where, value in dates.items():
        assert isinstance(value, datetime), where
    assert root["updatedAt"] > root["createdAt"]
    read = await mongo_store.read_thread(
        b.read(
            "scope",
            "t1",
            messages={"type": "ids", "messageIds": ["m1"]},
            runs={"type": "ids", "runIds": ["r1"]},
            queuedItems={"type": "ids", "queueItemIds": ["q1"]},
        )
    )
    assert read.thread is not None
    assert read.messages is not None
    assert read.runs is not None
    assert read.queued_items is not None

    def utc(value: datetime) -> datetime:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value

    assert read.thread.created_at == utc(root["createdAt"])
    assert read.thread.updated_at == utc(root["updatedAt"])
    assert read.messages.items[0].created_at == utc(message["createdAt"])
    assert read.queued_items.items[0].created_at == utc(item["createdAt"])
    run = read.runs.items[0]
    assert run.finished_at == utc(r1["finishedAt"])
    # The JSON form carries them as ISO-8601 strings.
    form = run.to_json()
    assert isinstance(form["finishedAt"], str)
    assert form["finishedAt"].endswith("Z")


async def test_a_lease_is_stored_with_bson_dates(
    mongo_store: MongoThreadStore, clock: ManualClock
) -> None:
    version = await _committed(mongo_store, every_family_create())
    clock.advance(ms=1000)
    await _committed(
        mongo_store,
        b.update_at("scope", "t1", version, {"lease": b.renew("r1", "w1")}, root=b.root()),
    )
    root = await raw_collections(mongo_store)["threads"].find_one({})
    assert root is not None
    lease = root["lease"]
    for when in ("acquiredAt", "renewedAt", "expiresAt"):
        assert isinstance(lease[when], datetime), when
    assert lease["acquiredAt"] < lease["renewedAt"] < lease["expiresAt"]


async def test_a_custom_collection_name_holds_every_document(mongo_harness: Any) -> None:
    base = f"agent_threads_{uuid.uuid4().hex[:12]}"
    store = mongo_harness.open_store(collection_name=base)
    try:
        await _committed(store, every_family_create())
        names = await store.database.list_collection_names()
        expected = {base, f"{base}_messages", f"{base}_pending_messages", f"{base}_runs"}
        assert expected <= set(names)
        db = store.database
        assert await db[base].count_documents({"threadId": "t1"}) == 1
        assert await db[f"{base}_messages"].count_documents({"messageId": "m1"}) == 1
        assert await db[f"{base}_runs"].count_documents({}) == 2
        assert await db[f"{base}_pending_messages"].count_documents({"queueItemId": "q1"}) == 1
    finally:
        await drop_store_collections(store)
        await store.close()


async def test_open_store_takes_the_documented_options() -> None:
    warnings: list[Any] = []
    clock = ManualClock()
    store = open_store(
        "mongodb://127.0.0.1:1/from_uri",
        collection_name="custom_threads",
        clock=clock,
        on_warning=warnings.append,
    )
    assert isinstance(store, MongoThreadStore)
    assert store.db_name == "from_uri"
    assert store.collection_name == "custom_threads"
    assert store.collection_names()["queuedItems"] == "custom_threads_pending_messages"
    explicit = open_store("mongodb://127.0.0.1:1/from_uri", db_name="explicit")
    assert isinstance(explicit, MongoThreadStore)
    assert explicit.db_name == "explicit"
    default = open_store("mongodb://127.0.0.1:1")
    assert isinstance(default, MongoThreadStore)
    assert default.db_name == "pai"
    assert default.collection_name == "pai_threads"
    assert default.collection_names() == {
        "threads": "pai_threads",
        "messages": "pai_threads_messages",
        "queuedItems": "pai_threads_pending_messages",
        "runs": "pai_threads_runs",
    }
    for opened in (store, explicit, default):
        await opened.close()  # never connected: nothing to release, and no error


@pytest.mark.parametrize(
    ("family", "document"),
    [
        ("messages", {"scopeKey": "scope", "threadId": "t1", "messageId": "m1", "_order": 99}),
        ("messages", {"scopeKey": "scope", "threadId": "t1", "messageId": "mx", "_order": 1}),
        ("runs", {"scopeKey": "scope", "threadId": "t1", "runId": "r1", "_order": 99}),
        ("runs", {"scopeKey": "scope", "threadId": "t1", "runId": "rx", "_order": 1}),
        ("queuedItems", {"scopeKey": "scope", "threadId": "t1", "queueItemId": "q1", "_order": 9}),
        ("queuedItems", {"scopeKey": "scope", "threadId": "t1", "queueItemId": "qx", "_order": 1}),
        ("threads", {"scopeKey": "scope", "threadId": "t1"}),
    ],
    ids=["message-id", "message-order", "run-id", "run-order", "queue-id", "queue-order", "root"],
)
async def test_the_unique_indexes_enforce_identity(
    mongo_store: MongoThreadStore, family: str, document: dict[str, Any]
) -> None:
    await _committed(mongo_store, every_family_create())
    collection = raw_collections(mongo_store)[family]
    with pytest.raises(DuplicateKeyError) as caught:
        await collection.insert_one(dict(document))
    assert "scope_thread_" in str(caught.value)
    # The same ids in another thread are free.
    await collection.insert_one({**document, "threadId": "other"})


@pytest.mark.parametrize(
    ("family", "corruption"),
    [
        ("runs", {"$unset": {"privateMetadata": ""}}),
        ("runs", {"$unset": {"metadata": ""}}),
        ("runs", {"$unset": {"_schemaVersion": ""}}),
        ("runs", {"$set": {"_schemaVersion": 2}}),
        ("runs", {"$unset": {"_order": ""}}),
        ("queuedItems", {"$unset": {"_schemaVersion": ""}}),
        ("queuedItems", {"$unset": {"metadata": ""}}),
        ("messages", {"$set": {"_schemaVersion": 2}}),
    ],
    ids=[
        "run-no-private-metadata",
        "run-no-metadata",
        "run-no-schema",
        "run-future-schema",
        "run-no-order",
        "queued-no-schema",
        "queued-no-metadata",
        "message-future-schema",
    ],
)
async def test_a_child_missing_a_required_field_is_invalid(
    mongo_store: MongoThreadStore, family: str, corruption: dict[str, Any]
) -> None:
    await _committed(mongo_store, every_family_create())
    ids = {"messages": "m1", "runs": "r1", "queuedItems": "q1"}
    id_field = {"messages": "messageId", "runs": "runId", "queuedItems": "queueItemId"}
    updated = await raw_collections(mongo_store)[family].update_one(
        {id_field[family]: ids[family]}, corruption
    )
    assert updated.modified_count == 1
    selection = {
        "messages": {"type": "ids", "messageIds": ["m1"]},
        "runs": {"type": "ids", "runIds": ["r1"]},
        "queuedItems": {"type": "ids", "queueItemIds": ["q1"]},
    }[family]
    with pytest.raises(ThreadStoreInvariantError):
        await mongo_store.read_thread(b.read("scope", "t1", **{family: selection}))


async def test_no_password_in_log_lines_errors_or_repr(caplog: pytest.LogCaptureFixture) -> None:
    secret = "pw-Secr3t-mongo"
    caplog.set_level(logging.DEBUG)
    store = open_store(f"mongodb://app:{secret}@127.0.0.1:1/db?serverSelectionTimeoutMS=500")
    assert secret not in repr(store)
    assert secret not in str(store)
    with pytest.raises(ThreadStoreUnavailableError) as caught:
        await store.initialize()
    await store.close()
    error = caught.value
    for text in (str(error), repr(error), str(error.__cause__), repr(error.__cause__)):
        assert secret not in text
    assert secret not in caplog.text


async def test_lazy_initialize_idempotent_initialize_and_close(mongo_harness: Any) -> None:
    store = mongo_harness.open_store()
    try:
        # The first operation initializes the store: collections and indexes appear.
        await _committed(store, b.create("scope", "t1"))
        indexes = await raw_collections(store)["threads"].index_information()
        await store.initialize()
        await store.initialize()
        assert await raw_collections(store)["threads"].index_information() == indexes
        assert (await store.read_thread(b.read("scope", "t1"))).thread is not None
    finally:
        await drop_store_collections(store)
        await store.close()
    await store.close()
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.read_thread(b.read("scope", "t1"))
    async with mongo_harness.open_store() as scoped:
        await _committed(scoped, b.create("scope", "t1"))
        await drop_store_collections(scoped)
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await scoped.read_thread(b.read("scope", "t1"))


async def test_order_is_kept_by_replace_and_never_reused(mongo_store: MongoThreadStore) -> None:
    version = await _committed(mongo_store, every_family_create())
    await _committed(
        mongo_store,
        b.update_at(
            "scope",
            "t1",
            version,
            {
                "runs": [
                    {"type": "replace", "record": b.run("r1", "completed", inputs=["m1"])},
                    {"type": "delete", "id": "r2"},
                    {"type": "insert", "record": b.run("r3", "completed")},
                ],
                "queuedItems": [{"type": "delete", "id": "q1"}],
                "lease": b.release("r1", "w1"),
            },
            root=b.root(),
        ),
    )
    cols = raw_collections(mongo_store)
    runs = await cols["runs"].find({}, sort=[("_order", 1)]).to_list()
    assert [(r["runId"], r["status"], r["_order"]) for r in runs] == [
        ("r1", "completed", 1),
        ("r3", "completed", 3),
    ]
    root = await cols["threads"].find_one({})
    assert root is not None
    assert root["_nextOrder"]["runs"] == 4


@pytest.mark.parametrize(
    "corruption",
    [
        {"$unset": {"privateMetadata": ""}},
        {"$unset": {"metadata": ""}},
        {"$set": {"privateMetadata": [1, 2]}},
        {"$unset": {"version": ""}},
        {"$unset": {"createdAt": ""}},
    ],
    ids=["no-private-metadata", "no-metadata", "private-metadata-list", "no-version", "no-date"],
)
async def test_a_root_missing_a_required_field_is_skipped_by_lists_and_rejected_by_reads(
    mongo_harness: Any, corruption: dict[str, Any]
) -> None:
    warnings: list[StoreWarning] = []
    store = mongo_harness.open_store(on_warning=warnings.append)
    try:
        await _committed(store, b.create("scope", "bad", metadata={"note": "personal"}))
        await _committed(store, b.create("scope", "good"))
        updated = await raw_collections(store)["threads"].update_one(
            {"threadId": "bad"}, corruption
        )
        assert updated.modified_count == 1
        page = await store.list_threads({"scopeKey": "scope", "limit": 10})
        assert [t.thread_id for t in page.items] == ["good"]
        (warning,) = warnings
        assert warning.kind == "invalid_thread_skipped"
        assert (warning.scope_key, warning.thread_id) == ("scope", "bad")
        assert "personal" not in repr(warning)
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.read_thread(b.read("scope", "bad"))
        assert "personal" not in str(caught.value)
    finally:
        await drop_store_collections(store)
        await store.close()


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


async def test_the_harness_finds_mongod_by_variable_then_path_then_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = tmp_path / "bin"
    on_path.mkdir()
    _executable(on_path / "mongod")
    explicit = _executable(tmp_path / "my-mongod")
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setenv("PAI_MONGOD", str(explicit))
    assert find_mongod() == str(explicit)
    monkeypatch.delenv("PAI_MONGOD")
    assert find_mongod() == str(on_path / "mongod")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    wheel = find_mongod()
    if wheel is not None:  # the test-only wheel, when installed
        assert Path(wheel).parts[-4:] == ("fiftyone", "db", "bin", "mongod")
    # Without the wheel on the import path, nothing is found.
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert find_mongod() is None


async def test_the_harness_server_is_a_replica_set_with_transactions(
    mongo_harness: Any, mongo_url: str
) -> None:
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_url)
    try:
        hello = await client.admin.command("hello")
        assert hello.get("setName"), "not a replica set"
        if mongo_harness._mongod is not None:  # the throwaway one the harness started
            assert hello["setName"] == "rs0"
        store = mongo_harness.open_store()
        try:
            await store.initialize()
            assert isinstance(store.database.client, AsyncMongoClient)
            info = await store.info()
            assert info.transactions is True
        finally:
            await drop_store_collections(store)
            await store.close()
    finally:
        await client.close()
    assert "motor" not in sys.modules


@pytest.mark.parametrize("url", ["mongodb+motor://u:pw-9z@127.0.0.1/app", "mongo://u:pw-9z@h/app"])
async def test_another_mongodb_driver_or_scheme_is_refused_without_the_password(url: str) -> None:
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        open_store(url)
    assert "pw-9z" not in str(caught.value)
    if url.startswith("mongodb+"):
        assert "mongodb://" in str(caught.value)
        assert "mongodb+srv://" in str(caught.value)


async def test_without_on_warning_a_skipped_root_is_logged_without_its_contents(
    mongo_harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = mongo_harness.open_store()
    try:
        await _committed(store, b.create("scope", "bad", metadata={"note": "personal"}))
        await raw_collections(store)["threads"].update_one(
            {"threadId": "bad"}, {"$unset": {"privateMetadata": ""}}
        )
        with caplog.at_level(logging.WARNING, logger="pai_storage"):
            page = await store.list_threads({"scopeKey": "scope", "limit": 10})
        assert page.items == []
        logged = [r for r in caplog.records if r.name == "pai_storage"]
        assert len(logged) == 1
        assert logged[0].levelno == logging.WARNING
        assert "invalid_thread_skipped" in logged[0].getMessage()
        assert "personal" not in caplog.text
    finally:
        await drop_store_collections(store)
        await store.close()


async def test_a_coroutine_on_warning_is_awaited(mongo_harness: Any) -> None:
    received: list[StoreWarning] = []

    async def on_warning(warning: StoreWarning) -> None:
        await asyncio.sleep(0)
        received.append(warning)

    store = mongo_harness.open_store(on_warning=on_warning)
    try:
        await _committed(store, b.create("scope", "bad"))
        await raw_collections(store)["threads"].update_one(
            {"threadId": "bad"}, {"$set": {"_schemaVersion": 0}}
        )
        page = await store.list_threads({"scopeKey": "scope", "limit": 10})
        assert page.items == []
        assert [(w.kind, w.thread_id) for w in received] == [("invalid_thread_skipped", "bad")]
    finally:
        await drop_store_collections(store)
        await store.close()


async def test_no_command_ever_drops_or_deletes_beyond_one_thread(
    recorded: tuple[MongoThreadStore, Recorder],
) -> None:
    store, recorder = recorded  # the commands of initialize() are recorded too
    version = await _committed(store, every_family_create())
    await _committed(store, every_family_create("t2"))
    await _committed(store, b.create("other", "t1"))
    await store.read_thread(
        b.read("scope", "t1", messages={"type": "page", "view": "raw", "page": {"limit": 5}})
    )
    await store.list_threads({"scopeKey": "scope", "limit": 5, "includeHidden": True})
    await _committed(store, b.delete("scope", "t1", version))
    pruned = await store.prune_threads(
        "other", updated_before=datetime.now(UTC) + timedelta(days=1)
    )
    assert [(p.scope_key, p.thread_id) for p in pruned] == [("other", "t1")]
    await store.erase_scope("scope")
    commands = recorder.take()
    names = {c["name"] for c in commands}
    assert not names & {"drop", "dropDatabase", "dropIndexes", "deleteIndexes"}, names
    deletes = [s for c in commands if c["name"] == "delete" for s in c["deletes"]]
    assert deletes
    for statement in deletes:
        assert isinstance(statement["q"].get("scopeKey"), str), statement
        assert isinstance(statement["q"].get("threadId"), str), statement
    remaining = raw_collections(store)
    for family in remaining:
        assert await remaining[family].count_documents({}) == 0, family
