"""The memory backend end to end through ``open_store("memory://")``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pai_storage import CommitThreadInput, ManualClock, StoreWarning, ThreadStore, open_store
from pai_storage import builders as b
from pai_storage.errors import (
    ThreadStoreConfigurationError,
    ThreadStoreInvariantError,
    ThreadStoreSerializationError,
    ThreadStoreUnavailableError,
)
from pai_storage.strict_json import MAX_JSON_DEPTH

START = datetime(2030, 1, 1, tzinfo=UTC)


def ins(record: dict[str, Any]) -> dict[str, Any]:
    return {"type": "insert", "record": record}


def rep(record: dict[str, Any]) -> dict[str, Any]:
    return {"type": "replace", "record": record}


def page(limit: int = 100, **extra: Any) -> dict[str, Any]:
    return {"type": "page", "page": {"limit": limit}, **extra}


async def read_all(store: ThreadStore, scope: str = "s", thread: str = "t") -> Any:
    return await store.read_thread(
        b.read(
            scope,
            thread,
            messages=page(view="raw"),
            runs=page(),
            queuedItems=page(),
        )
    )


async def test_worked_example_one_turn() -> None:
    clock = ManualClock(START)
    async with open_store("memory://", clock=clock) as store:

        async def commit(version: Any, changes: dict[str, Any]) -> Any:
            clock.advance(ms=10)
            result = await store.commit_thread(
                b.update_at("s", "t", version, changes, root=b.root())
            )
            assert result.type == "committed", result
            assert result.committed_at == clock()
            assert result.thread.updated_at == clock()
            return result.thread

        # 1. create with m1, running r1 and the lease
        created = await store.commit_thread(
            b.create(
                "s",
                "t",
                {
                    "messages": [ins(b.message("m1", run_id="r1"))],
                    "runs": [ins(b.run("r1", "running", inputs=["m1"]))],
                    "lease": b.acquire("r1", "w1", operation="send"),
                },
            )
        )
        assert created.type == "committed"
        root = created.thread
        assert root.version.revision == 1
        assert root.lease.run_id == "r1"
        assert root.lease.owner_id == "w1"
        t1 = clock()

        # 2. a second turn is queued
        root = await commit(
            root.version,
            {
                "runs": [ins(b.run("r2", "queued", queue_item_id="q1"))],
                "queuedItems": [ins(b.queued_item("q1", "r2", {"text": "next"}))],
            },
        )
        assert root.version.revision == 2

        # 3. stream r1's answer, then complete it while renewing the lease
        m2 = b.message("m2", role="assistant", run_id="r1", relation="output", status="streaming")
        root = await commit(root.version, {"messages": [ins(m2)]})
        t3 = clock()
        root = await commit(
            root.version,
            {"messages": [rep({**m2, "status": "complete"})], "lease": b.renew("r1", "w1")},
        )
        assert root.version.revision == 4
        assert root.lease.renewed_at == clock()
        state = await read_all(store)
        m2_stored = state.messages.items[1]
        assert (m2_stored.status, m2_stored.created_at, m2_stored.updated_at) == (
            "complete",
            t3,
            clock(),
        )

        # 4. finish r1 and release; then admit r2 in one commit
        root = await commit(
            root.version,
            {
                "runs": [rep(b.run("r1", "completed", inputs=["m1"]))],
                "lease": b.release("r1", "w1"),
            },
        )
        assert root.version.revision == 5
        assert root.lease is None
        t5 = clock()
        root = await commit(
            root.version,
            {
                "messages": [ins(b.message("m3", run_id="r2"))],
                "runs": [rep(b.run("r2", "running", inputs=["m3"], queue_item_id="q1"))],
                "queuedItems": [{"type": "delete", "id": "q1"}],
                "lease": b.acquire("r2", "w2"),
            },
        )
        assert root.version.revision == 6
        t6 = clock()
        state = await read_all(store)
        assert [m.message_id for m in state.messages.items] == ["m1", "m2", "m3"]
        assert state.queued_items.items == []
        r1, r2 = state.runs.items
        assert r1.finished_at == t5
        assert r1.admission.admitted_at == t1
        assert r2.admission.admitted_at == t6
        assert r2.finished_at is None
        assert state.messages.version == state.runs.version == root.version

        root = await commit(
            root.version,
            {
                "runs": [rep(b.run("r2", "completed", inputs=["m3"]))],
                "lease": b.release("r2", "w2"),
            },
        )
        stale = root.version

        # 5. regenerate the first answer
        regenerate = {
            "messages": [{"type": "truncate", "afterId": "m1"}],
            "runs": [
                {"type": "truncate", "afterId": "r1"},
                rep(b.run("r1", "running", inputs=["m1"], operation="regenerate")),
            ],
            "lease": b.acquire("r1", "w3", operation="regenerate"),
        }
        root = await commit(root.version, regenerate)
        assert root.version.revision == 8
        assert root.lease.operation == "regenerate"
        assert root.lease.owner_id == "w3"
        state = await read_all(store)
        assert [m.message_id for m in state.messages.items] == ["m1"]
        assert [r.run_id for r in state.runs.items] == ["r1"]
        (r1,) = state.runs.items
        assert r1.status == "running"
        assert r1.operation == "regenerate"
        assert r1.finished_at is None
        assert "finishedAt" not in r1.to_json()
        assert r1.admission.admitted_at == t1
        assert r1.created_at == START

        # ... or get a conflict if anyone else committed first
        again = await store.commit_thread(b.update_at("s", "t", stale, regenerate, root=b.root()))
        assert again.type == "conflict"
        assert again.current_version == root.version


async def test_copies_in_read_only_out() -> None:
    async with open_store("memory://") as store:
        metadata: dict[str, Any] = {"tags": ["a"], "n": 1}
        message = b.message("m1", metadata={"k": [1]})
        commit = b.create("s", "t", {"messages": [ins(message)]}, metadata=metadata)
        result = await store.commit_thread(commit)
        metadata["tags"].append("MUTATED")
        message["metadata"]["k"].append("MUTATED")
        message["parts"].append({"type": "text", "text": "MUTATED"})
        with pytest.raises(TypeError):
            result.thread.metadata["tags"].append("MUTATED")

        model = CommitThreadInput.model_validate(b.create("s", "t2", metadata={"x": [1]}))
        await store.commit_thread(model)
        with pytest.raises(TypeError):
            model.mutation.root.metadata["x"].append("MUTATED")

        state = await read_all(store)
        assert state.thread.metadata == {"tags": ["a"], "n": 1}
        assert state.messages.items[0].metadata == {"k": [1]}
        assert len(state.messages.items[0].parts) == 1
        with pytest.raises(TypeError):
            state.thread.metadata["tags"].append("MUTATED")
        with pytest.raises(TypeError):
            state.messages.items[0].metadata["k"].append("MUTATED")
        with pytest.raises(TypeError):
            state.messages.items.clear()

        listed = await store.list_threads({"scopeKey": "s", "limit": 10})
        for item in listed.items:
            with pytest.raises(TypeError):
                item.metadata["MUTATED"] = True

        again = await read_all(store)
        assert again.thread.metadata == {"tags": ["a"], "n": 1}
        assert again.messages.items[0].metadata == {"k": [1]}
        other = await store.read_thread(b.read("s", "t2"))
        assert other.thread.metadata == {"x": [1]}


async def test_lazy_initialize_idempotent_close_and_use_after_close() -> None:
    store = open_store("memory://")
    result = await store.commit_thread(b.create("s", "t"))  # no explicit initialize
    assert result.type == "committed"
    await store.initialize()
    await store.initialize()
    assert (await store.info()).backend == "memory"
    await store.close()
    await store.close()
    for call in (
        store.initialize(),
        store.read_thread(b.read("s", "t")),
        store.list_threads({"scopeKey": "s", "limit": 1}),
        store.commit_thread(b.create("s", "u")),
    ):
        with pytest.raises(ThreadStoreConfigurationError, match="closed"):
            await call


async def test_async_with_closes() -> None:
    store = open_store("memory://")
    async with store as entered:
        assert entered is store
        assert (await entered.read_thread(b.read("s", "t"))).thread is None
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.read_thread(b.read("s", "t"))


async def test_concurrent_commits_on_one_version() -> None:
    async with open_store("memory://") as store:
        creates = await asyncio.gather(
            *(store.commit_thread(b.create("s", "t")) for _ in range(10))
        )
        assert [r.type for r in creates].count("committed") == 1
        root = next(r.thread for r in creates if r.type == "committed")
        assert all(r.current_version == root.version for r in creates if r.type == "conflict")
        results = await asyncio.gather(
            *(
                store.commit_thread(b.update_at("s", "t", root.version, root=b.root(title=f"t{i}")))
                for i in range(20)
            )
        )
        committed = [r for r in results if r.type == "committed"]
        assert len(committed) == 1
        winner = committed[0].thread
        assert winner.version.revision == 2
        assert all(r.current_version == winner.version for r in results if r.type == "conflict")
        assert (await store.read_thread(b.read("s", "t"))).thread.title == winner.title


@pytest.mark.parametrize(
    "url", ["memory://host", "memory:///path", "memory://?a=1", "memory://u:pw@h"]
)
def test_memory_url_takes_nothing(url: str) -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="memory://"):
        open_store(url)


def test_unknown_option_rejected() -> None:
    with pytest.raises(ThreadStoreConfigurationError, match=r"unknown option.*bogus"):
        open_store("memory://", bogus=1)


async def test_known_options_accepted() -> None:
    warnings: list[StoreWarning] = []
    async with open_store(
        "memory://", clock=ManualClock(START), on_warning=warnings.append, token_secret=b"k"
    ) as store:
        result = await store.commit_thread(b.create("s", "t"))
        assert result.committed_at == START
        assert (await store.read_thread(b.read("s", "t"))).observed_at == START


async def test_committed_at_never_goes_backwards() -> None:
    clock = ManualClock(START)
    async with open_store("memory://", clock=clock) as store:
        root = (await store.commit_thread(b.create("s", "t"))).thread
        clock.set(START - timedelta(hours=1))
        result = await store.commit_thread(b.update_at("s", "t", root.version, root=b.root()))
        assert result.committed_at == START
        assert result.thread.version.revision == 2


async def test_scope_isolation_and_missing_thread() -> None:
    async with open_store("memory://") as store:
        root = (await store.commit_thread(b.create("a", "t"))).thread
        missing = await read_all(store, scope="b")
        assert missing.thread is None
        assert missing.messages is None
        assert missing.runs is None
        assert missing.queued_items is None
        assert missing.to_json().keys() == {"observedAt", "thread"}
        assert (await store.list_threads({"scopeKey": "b", "limit": 10})).items == []
        conflict = await store.commit_thread(b.delete("b", "t", root.version))
        assert conflict.type == "conflict"
        assert conflict.current_version is None
        assert (await read_all(store, scope="a")).thread == root


async def test_delete_and_recreate_gives_new_instance() -> None:
    async with open_store("memory://") as store:
        root = (await store.commit_thread(b.create("s", "t"))).thread
        deleted = await store.commit_thread(b.delete("s", "t", root.version))
        assert deleted.type == "committed"
        assert deleted.thread is None
        again = (await store.commit_thread(b.create("s", "t"))).thread
        assert again.version.revision == 1
        assert again.version.thread_instance_id != root.version.thread_instance_id
        stale = await store.commit_thread(b.update_at("s", "t", root.version, root=b.root()))
        assert stale.type == "conflict"
        assert stale.current_version == again.version


async def test_invalid_commit_applies_nothing() -> None:
    async with open_store("memory://") as store:
        root = (await store.commit_thread(b.create("s", "t"))).thread
        bad = b.update_at(
            "s",
            "t",
            root.version,
            {"messages": [ins(b.message("m1")), {"type": "delete", "id": "nope"}]},
            root=b.root(title="changed"),
        )
        with pytest.raises(ThreadStoreInvariantError, match="does not exist"):
            await store.commit_thread(bad)
        with pytest.raises(ThreadStoreInvariantError):
            await store.commit_thread({"scopeKey": "s"})
        state = await read_all(store)
        assert state.thread == root
        assert state.messages.items == []


async def test_lease_on_missing_run_is_an_invariant_error() -> None:
    async with open_store("memory://") as store:
        with pytest.raises(ThreadStoreInvariantError, match="relationship rule 7"):
            await store.commit_thread(b.create("s", "t", {"lease": b.acquire("r9", "w1")}))
        assert (await store.read_thread(b.read("s", "t"))).thread is None


async def test_deep_metadata_round_trips_up_to_the_depth_limit() -> None:
    deep: Any = 1
    for _ in range(MAX_JSON_DEPTH - 1):  # metadata itself is the first level
        deep = {"a": deep}
    async with open_store("memory://") as store:
        result = await store.commit_thread(b.create("s", "t", metadata={"d": deep}))
        assert result.type == "committed"
        state = await store.read_thread(b.read("s", "t"))
        assert state.thread.metadata == {"d": deep}
        too_deep = {"d": {"a": deep}}
        for _ in range(1_000):
            too_deep = {"a": too_deep}
        with pytest.raises(ThreadStoreSerializationError, match="deeper"):
            await store.commit_thread(b.create("s", "u", metadata=too_deep))
        assert (await store.read_thread(b.read("s", "u"))).thread is None


async def test_reads_and_lists_through_the_store() -> None:
    clock = ManualClock(START)
    async with open_store("memory://", clock=clock) as store:
        messages = [
            ins(b.message("m1")),
            ins(b.message("m2", transcript=False)),
            ins(b.message("m3", context=False)),
            ins(b.message("m4")),
        ]
        await store.commit_thread(b.create("s", "t", {"messages": messages}))
        for thread, visibility in (("u", "hidden"), ("v", "visible")):
            clock.advance(ms=1)
            await store.commit_thread(b.create("s", thread, visibility=visibility))

        async def ids(selection: dict[str, Any]) -> list[str]:
            result = await store.read_thread(b.read("s", "t", messages=selection))
            assert result.messages.version == result.thread.version
            return [m.message_id for m in result.messages.items]

        assert await ids({"type": "ids", "messageIds": ["m3", "zz", "m1"]}) == ["m3", "m1"]
        assert await ids(page(view="transcript")) == ["m1", "m3", "m4"]
        assert await ids(page(view="context")) == ["m1", "m2", "m4"]
        assert await ids(page(view="raw", order="newest")) == ["m4", "m3", "m2", "m1"]
        bounded = page(view="raw", afterMessageId="m1", beforeMessageId="m4")
        assert await ids(bounded) == ["m2", "m3"]
        assert await ids(page(view="transcript", afterMessageId="m2")) == ["m3", "m4"]
        with pytest.raises(ThreadStoreInvariantError, match="zz"):
            await ids(page(view="raw", afterMessageId="zz"))
        empty = await store.read_thread(b.read("s", "t", runs=page(), queuedItems=page()))
        assert empty.runs.items == []
        assert empty.queued_items.items == []
        assert empty.messages is None

        listed = await store.list_threads({"scopeKey": "s", "limit": 10})
        assert [r.thread_id for r in listed.items] == ["v", "t"]
        assert listed.next_page_token is None
        hidden = await store.list_threads({"scopeKey": "s", "limit": 10, "includeHidden": True})
        assert [r.thread_id for r in hidden.items] == ["v", "u", "t"]


async def test_concurrent_first_calls_share_one_initialize_attempt() -> None:
    from pai_storage_memory import MemoryThreadStore

    attempts = 0

    class Flaky(MemoryThreadStore):
        async def _initialize(self) -> None:
            nonlocal attempts
            attempts += 1
            await asyncio.sleep(0.01)
            if attempts == 1:
                raise ThreadStoreUnavailableError("first attempt fails")

    store = Flaky()
    outcomes = await asyncio.gather(*(store.initialize() for _ in range(5)), return_exceptions=True)
    assert attempts == 1  # one shared attempt, not one per caller
    assert all(isinstance(o, ThreadStoreUnavailableError) for o in outcomes)
    await asyncio.gather(*(store.initialize() for _ in range(5)))
    assert attempts == 2  # the failure was forgotten; the retry is shared too
    await store.close()
