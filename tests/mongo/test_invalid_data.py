"""Invalid stored data: lists skip it with a warning, targeted reads reject it."""

from __future__ import annotations

from typing import Any

import pytest
from pai_storage_mongo.harness import MongoHarness

from pai_storage import CommittedResult, StoreWarning
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .helpers import raw_collections

pytestmark = pytest.mark.asyncio

SECRET = "very-personal-value"


async def _create(store: Any, thread_id: str, **root: Any) -> CommittedResult:
    result = await store.commit_thread(
        b.create(
            "scope",
            thread_id,
            {"messages": [{"type": "insert", "record": b.message("m1")}]},
            metadata={"note": SECRET},
            **root,
        )
    )
    assert isinstance(result, CommittedResult)
    return result


@pytest.mark.parametrize(
    "corruption",
    [
        {"$unset": {"_schemaVersion": ""}},
        {"$set": {"_schemaVersion": 99}},
        {"$set": {"metadata": "not an object"}},
        {"$set": {"version.revision": "two"}},
        {"$unset": {"_nextOrder": ""}},
        {"$set": {"unexpected": SECRET}},
        {"$set": {"lease": {"kind": "run"}}},
        {"$set": {"createdAt": "2030-01-01T00:00:00.000Z"}},  # the JSON form, not a BSON date
    ],
    ids=[
        "no-schema",
        "future-schema",
        "metadata",
        "revision",
        "no-counters",
        "extra",
        "lease",
        "date-as-text",
    ],
)
async def test_corrupt_root_is_skipped_by_lists_and_rejected_by_reads(
    mongo_harness: MongoHarness, corruption: dict[str, Any]
) -> None:
    warnings: list[StoreWarning] = []
    store = mongo_harness.open_store(on_warning=warnings.append)
    try:
        await store.initialize()
        for i in range(3):
            await _create(store, f"t{i}")
        await raw_collections(store)["threads"].update_one({"threadId": "t1"}, corruption)

        page = await store.list_threads({"scopeKey": "scope", "limit": 10})
        assert [t.thread_id for t in page.items] == ["t2", "t0"]
        assert len(warnings) == 1
        warning = warnings[0]
        assert warning.kind == "invalid_thread_skipped"
        assert warning.scope_key == "scope"
        assert warning.thread_id == "t1"
        assert SECRET not in repr(warning)

        # A page that would end on the bad row still fills up from the good ones.
        page = await store.list_threads({"scopeKey": "scope", "limit": 1})
        assert [t.thread_id for t in page.items] == ["t2"]
        assert page.next_page_token is not None
        rest = await store.list_threads(
            {"scopeKey": "scope", "limit": 1, "pageToken": page.next_page_token}
        )
        assert [t.thread_id for t in rest.items] == ["t0"]
        assert rest.next_page_token is None

        with pytest.raises(ThreadStoreInvariantError) as err:
            await store.read_thread(b.read("scope", "t1"))
        assert SECRET not in str(err.value)
        with pytest.raises(ThreadStoreInvariantError):
            await store.commit_thread(
                b.update_at("scope", "t1", {"threadInstanceId": "x", "revision": 1}, root=b.root())
            )
    finally:
        from pai_storage_mongo.harness import drop_store_collections

        await drop_store_collections(store)
        await store.close()


async def test_failing_warning_callback_is_ignored(mongo_harness: MongoHarness) -> None:
    def explode(warning: StoreWarning) -> None:
        raise RuntimeError("logging is down")

    async def reject(warning: StoreWarning) -> None:
        raise RuntimeError("logging is down")

    for callback in (explode, reject):
        store = mongo_harness.open_store(on_warning=callback)
        try:
            await _create(store, "t0")
            await _create(store, "t1")
            await raw_collections(store)["threads"].update_one(
                {"threadId": "t0"}, {"$set": {"_schemaVersion": 0}}
            )
            page = await store.list_threads({"scopeKey": "scope", "limit": 10})
            assert [t.thread_id for t in page.items] == ["t1"]
        finally:
            from pai_storage_mongo.harness import drop_store_collections

            await drop_store_collections(store)
            await store.close()


async def test_corrupt_child_is_rejected_by_targeted_reads(mongo_store: Any) -> None:
    await _create(mongo_store, "t0")
    await raw_collections(mongo_store)["messages"].update_one(
        {"messageId": "m1"}, {"$set": {"parts": [], "metadata": {"note": SECRET}}}
    )
    for selection in (
        {"type": "ids", "messageIds": ["m1"]},
        {"type": "page", "view": "raw", "page": {"limit": 5}},
    ):
        with pytest.raises(ThreadStoreInvariantError) as err:
            await mongo_store.read_thread(b.read("scope", "t0", messages=selection))
        assert SECRET not in str(err.value)
    # The root alone is still readable, and listing is unaffected.
    read = await mongo_store.read_thread(b.read("scope", "t0"))
    assert read.thread is not None


@pytest.mark.parametrize(
    ("family", "key", "field"),
    [
        ("messages", {"messageId": "m1"}, "createdAt"),
        ("runs", {"runId": "r1"}, "finishedAt"),
        ("runs", {"runId": "r1"}, "admission.admittedAt"),
    ],
)
async def test_a_stored_timestamp_that_is_not_a_bson_date_is_refused(
    mongo_store: Any, family: str, key: dict[str, str], field: str
) -> None:
    # Timestamps are BSON dates at every depth; a string there is invalid stored
    # data, even one spelling the JSON form, and is never converted.
    changes = {
        "messages": [b.insert(b.message("m1", run_id="r1"))],
        "runs": [b.insert(b.run("r1", "completed", inputs=["m1"]))],
    }
    result = await mongo_store.commit_thread(b.create("scope", "t0", changes))
    assert isinstance(result, CommittedResult)
    await raw_collections(mongo_store)[family].update_one(
        key, {"$set": {field: "2030-01-01T00:00:00.000Z"}}
    )
    selection = (
        {"type": "ids", "messageIds": ["m1"]}
        if family == "messages"
        else {"type": "ids", "runIds": ["r1"]}
    )
    with pytest.raises(ThreadStoreInvariantError, match="must be a date"):
        await mongo_store.read_thread(b.read("scope", "t0", **{family: selection}))


async def _corrupt_utf8(store: Any, thread_id: str) -> None:
    """Rewrite a root so one string's stored bytes are not valid UTF-8 (raw BSON)."""
    from bson.codec_options import CodecOptions
    from bson.raw_bson import RawBSONDocument

    threads = raw_collections(store)["threads"].with_options(
        codec_options=CodecOptions(document_class=RawBSONDocument)
    )
    stored = await threads.find_one({"threadId": thread_id})
    assert stored is not None
    raw = stored.raw
    assert raw.count(SECRET.encode()) == 1
    broken = raw.replace(SECRET.encode(), b"\xff" + SECRET.encode()[1:])
    await threads.delete_one({"threadId": thread_id})
    await threads.insert_one(RawBSONDocument(broken))


async def _corrupt_escaped_json(store: Any, thread_id: str) -> None:
    """Store an escaped-opaque-JSON binary (subtype 0x80) that is not JSON."""
    from bson.binary import Binary

    await raw_collections(store)["threads"].update_one(
        {"threadId": thread_id}, {"$set": {"metadata": Binary(b"\xff{" + SECRET.encode(), 0x80)}}
    )


@pytest.mark.parametrize("corrupt", [_corrupt_utf8, _corrupt_escaped_json], ids=["utf8", "json"])
async def test_undecodable_root_is_skipped_by_lists_and_rejected_by_reads(
    mongo_harness: MongoHarness, corrupt: Any
) -> None:
    warnings: list[StoreWarning] = []
    store = mongo_harness.open_store(on_warning=warnings.append)
    try:
        await store.initialize()
        for i in range(3):
            await _create(store, f"t{i}")
        await corrupt(store, "t1")

        page = await store.list_threads({"scopeKey": "scope", "limit": 10})
        assert [t.thread_id for t in page.items] == ["t2", "t0"]
        assert len(warnings) == 1
        warning = warnings[0]
        assert warning.kind == "invalid_thread_skipped"
        assert warning.scope_key == "scope"
        assert warning.thread_id == "t1"
        assert SECRET[1:] not in repr(warning)

        # A page that would end on the bad row still fills up from the good ones.
        page = await store.list_threads({"scopeKey": "scope", "limit": 1})
        assert [t.thread_id for t in page.items] == ["t2"]
        rest = await store.list_threads(
            {"scopeKey": "scope", "limit": 1, "pageToken": page.next_page_token}
        )
        assert [t.thread_id for t in rest.items] == ["t0"]
        assert rest.next_page_token is None

        with pytest.raises(ThreadStoreInvariantError) as err:
            await store.read_thread(b.read("scope", "t1"))
        assert SECRET[1:] not in str(err.value)
        with pytest.raises(ThreadStoreInvariantError):
            await store.commit_thread(
                b.update_at("scope", "t1", {"threadInstanceId": "x", "revision": 1}, root=b.root())
            )
    finally:
        from pai_storage_mongo.harness import drop_store_collections

        await drop_store_collections(store)
        await store.close()
