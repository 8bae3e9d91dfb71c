"""Thread lifecycle in the core: export/import round trips and fork cuts (Hypothesis),
the generic fork fallback, the capability check, and the bundle's scope erasure."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pai_storage_conformance.suite.lifecycle import read_all
from pai_storage_memory import MemoryThreadStore

from pai_storage import (
    CommittedResult,
    ManualClock,
    ReadThreadInput,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    connect,
)
from pai_storage import builders as b
from pai_storage.backend import (
    LIFECYCLE,
    ForkRequest,
    SourceChanged,
    ThreadAggregate,
    assert_relationships,
    new_instance_id,
    relations_from_aggregate,
    thread_digest,
)
from pai_storage.errors import (
    ThreadStoreConfigurationError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
)
from pai_storage.maintenance import plan_fork
from pai_storage.transfer import EXPORT_FORMAT, copy_threads, decode_threads

_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# ---------------------------------------------------------------- random valid threads

# One turn: (final status, number of output messages, standalone note after it).
_turns = st.lists(
    st.tuples(
        st.sampled_from(["completed", "failed", "cancelled"]),
        st.integers(0, 3),
        st.booleans(),
    ),
    max_size=6,
)
_tails = st.sampled_from(["none", "running", "waiting", "queued", "open+queued"])
_metadata = st.dictionaries(
    st.text(max_size=4),
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(-1e9, 1e9).map(lambda x: x + 0.0)  # strict JSON has no -0.0
    | st.text(max_size=5),
    max_size=3,
)


async def _commit(store: ThreadStore, commit: dict[str, Any]) -> Any:
    result = await store.commit_thread(commit)
    assert isinstance(result, CommittedResult), result
    return result.thread


async def _random_thread(
    store: ThreadStore,
    clock: ManualClock,
    scope: str,
    thread_id: str,
    turns: list[tuple[str, int, bool]],
    tail: str,
    metadata: dict[str, Any],
) -> Any:
    """Commit a thread the runtime could have written: turns, then an open or queued tail."""
    root = await _commit(store, b.create(scope, thread_id, metadata=metadata))
    for i, (status, outputs, note) in enumerate(turns):
        clock.advance(ms=1 + i % 2)  # some commits share a millisecond
        run_id = f"r{i}"
        messages = [b.insert(b.message(f"m{i}", run_id=run_id))]
        for j in range(outputs):
            out = b.message(f"a{i}.{j}", role="assistant", run_id=run_id, metadata=metadata)
            out["association"]["relation"] = "output"
            messages.append(b.insert(out))
        if note:
            messages.append(b.insert(b.message(f"note{i}")))
        changes = {
            "messages": messages,
            "runs": [b.insert(b.run(run_id, status, inputs=[f"m{i}"], metadata=metadata))],
        }
        root = await _commit(
            store,
            b.update_at(scope, thread_id, root.version, changes, root=b.root(metadata=metadata)),
        )
    clock.advance(ms=1)
    if tail in ("running", "waiting", "open+queued"):
        status = "waiting" if tail == "waiting" else "running"
        changes = {
            "messages": [b.insert(b.message("m-open", run_id="r-open"))],
            "runs": [b.insert(b.run("r-open", status, inputs=["m-open"]))],
            "lease": b.acquire("r-open", "worker"),
        }
        root = await _commit(
            store,
            b.update_at(scope, thread_id, root.version, changes, root=b.root(metadata=metadata)),
        )
    if tail in ("queued", "open+queued"):
        changes = {
            "runs": [b.insert(b.run("r-q", "queued", queue_item_id="q"))],
            "queuedItems": [b.insert(b.queued_item("q", "r-q", metadata))],
        }
        root = await _commit(
            store,
            b.update_at(scope, thread_id, root.version, changes, root=b.root(metadata=metadata)),
        )
    return root


async def _aggregate(store: MemoryThreadStore, scope: str, thread_id: str) -> ThreadAggregate:
    found = await store._load_thread(scope, thread_id)
    assert found is not None
    return found


# ---------------------------------------------------------------- export / import


@_SETTINGS
@given(threads=st.lists(st.tuples(_turns, _tails, _metadata), min_size=1, max_size=3))
async def test_export_import_round_trip_is_exact(
    threads: list[tuple[list[tuple[str, int, bool]], str, dict[str, Any]]],
) -> None:
    clock = ManualClock()
    async with MemoryThreadStore(clock=clock) as source, MemoryThreadStore(clock=clock) as target:
        for i, (turns, tail, metadata) in enumerate(threads):
            await _random_thread(source, clock, "s", f"t{i}", turns, tail, metadata)
        lines = [line async for line in source.export_threads("s")]
        clock.advance(timedelta(days=1))  # the import keeps the original timestamps
        report = await target.import_threads(lines)
        assert len(report.imported) == len(threads)
        for i in range(len(threads)):
            assert await read_all(target, "s", f"t{i}") == await read_all(source, "s", f"t{i}")
            assert await target.thread_digest("s", f"t{i}") == await source.thread_digest(
                "s", f"t{i}"
            )
            mine, theirs = (
                await _aggregate(source, "s", f"t{i}"),
                await _aggregate(target, "s", f"t{i}"),
            )
            assert theirs.to_json() == mine.to_json()  # positions and counters too
        # A second export of the target is the same text.
        assert [line async for line in target.export_threads("s")] == lines


async def test_export_lines_are_bytes_or_text_alike_on_import() -> None:
    clock = ManualClock()
    async with MemoryThreadStore(clock=clock) as source, MemoryThreadStore() as target:
        await _random_thread(
            source, clock, "s", "t", [("completed", 1, True)], "queued", {"é": "ü"}
        )
        lines = [line async for line in source.export_threads("s")]

        async def as_bytes() -> Any:
            for line in lines:
                yield line.encode("utf-8")

        await target.import_threads(as_bytes())
        assert await target.thread_digest("s", "t") == await source.thread_digest("s", "t")


async def test_export_refuses_ids_that_are_not_strings() -> None:
    async with MemoryThreadStore() as store:
        with pytest.raises(ThreadStoreInvariantError):
            async for _ in store.export_threads("s", thread_ids=[["a"]]):  # type: ignore[list-item]
                pass


@pytest.mark.parametrize("version", ["true", "1.0", '"1"'])
async def test_import_refuses_a_header_version_that_is_not_the_integer(version: str) -> None:
    header = '{"format": "%s", "version": %s}' % (EXPORT_FORMAT, version)  # noqa: UP031
    async with MemoryThreadStore() as store:
        with pytest.raises(ThreadStoreInvariantError, match="version"):
            await store.import_threads([header])


# ---------------------------------------------------------------- fork


def _expected_fork(source: ThreadAggregate, cut: str | None) -> tuple[list[str], list[str]]:
    """The messages and runs a fork keeps, computed from the whole thread (the rules' view)."""
    messages = list(source.messages)
    cut_at = (
        len(messages)
        if cut is None
        else next(i + 1 for i, e in enumerate(messages) if e.record.message_id == cut)
    )
    cut_created = None if cut is None else messages[cut_at - 1].record.created_at
    dropped = {
        e.record.run_id for e in source.runs if e.record.status in ("running", "waiting", "queued")
    }
    dropped |= {rid for e in messages[cut_at:] if (rid := e.record.run_id) is not None}
    if cut_created is not None:
        dropped |= {e.record.run_id for e in source.runs if e.record.created_at > cut_created}
    kept_messages = [
        e.record.message_id for e in messages[:cut_at] if e.record.run_id not in dropped
    ]
    kept_runs = [e.record.run_id for e in source.runs if e.record.run_id not in dropped]
    return kept_messages, kept_runs


@_SETTINGS
@given(turns=_turns, tail=_tails, metadata=_metadata, data=st.data())
async def test_a_fork_at_any_cut_obeys_every_rule(
    turns: list[tuple[str, int, bool]], tail: str, metadata: dict[str, Any], data: st.DataObject
) -> None:
    clock = ManualClock()
    async with MemoryThreadStore(clock=clock) as store:
        root = await _random_thread(store, clock, "s", "src", turns, tail, metadata)
        source = await _aggregate(store, "s", "src")
        ids = [e.record.message_id for e in source.messages]
        cut = data.draw(st.none() | st.sampled_from(ids)) if ids else None
        clock.advance(ms=10)
        result = await store.fork_thread("s", "src", "fork", through_message_id=cut)
        assert isinstance(result, CommittedResult)
        fork = await _aggregate(store, "s", "fork")
        assert_relationships(relations_from_aggregate(fork))
        messages, runs = _expected_fork(source, cut)
        assert [e.record.message_id for e in fork.messages] == messages
        assert [e.record.run_id for e in fork.runs] == runs
        assert len(fork.queued_items) == 0
        assert fork.root.lease is None
        assert fork.root.parent_thread_id == "src"
        assert fork.root.version.revision == 1
        assert fork.root.version.thread_instance_id != root.version.thread_instance_id
        # Copied records are the source's, at the same positions.
        for entry in fork.messages:
            assert source.messages.get(entry.record.message_id) == entry
        for entry in fork.runs:
            assert source.runs.get(entry.record.run_id) == entry
        assert await _aggregate(store, "s", "src") == source  # the source is untouched


class _FallbackMemory(MemoryThreadStore):
    """A store that keeps the generic fork (load, plan in memory, restore)."""

    _fork_copy = ThreadStore._fork_copy  # type: ignore[assignment]


async def test_the_generic_fork_fallback_matches_the_memory_fork() -> None:
    clocks = ManualClock(), ManualClock()
    turns = [("completed", 2, True), ("failed", 1, False), ("cancelled", 0, True)]
    async with MemoryThreadStore(clock=clocks[0]) as fast, _FallbackMemory(clock=clocks[1]) as slow:
        for store, clock in zip((fast, slow), clocks, strict=True):
            await _random_thread(store, clock, "s", "src", turns, "open+queued", {"a": 1})
        for cut in (None, "a0.1", "m1", "note2"):
            results = [
                await store.fork_thread("s", "src", f"fork-{cut}", through_message_id=cut)
                for store in (fast, slow)
            ]
            assert all(isinstance(r, CommittedResult) for r in results)
            forks = [await _aggregate(store, "s", f"fork-{cut}") for store in (fast, slow)]
            assert forks[0].to_json()["messages"] == forks[1].to_json()["messages"]
            assert forks[0].to_json()["runs"] == forks[1].to_json()["runs"]
        conflict = await slow.fork_thread("s", "src", "fork-None")
        assert conflict.type == "conflict"


async def test_plan_fork_refuses_reads_that_are_not_one_version() -> None:
    clock = ManualClock()
    async with MemoryThreadStore(clock=clock) as store:
        turns = [("completed", 1, False)] * 120  # more runs than one page
        root = await _random_thread(store, clock, "s", "src", turns, "none", {})
        request = ForkRequest("s", "src", "fork", None, new_instance_id(), clock())
        reads = 0

        async def moving(read: ReadThreadInput) -> ThreadReadResult:
            nonlocal reads
            reads += 1
            if reads == 2:  # a commit lands between the first and the second page
                update = b.update_at("s", "src", root.version, root=b.root(title="moved"))
                await _commit(store, update)
            return await store.read_thread(read)

        with pytest.raises(SourceChanged):
            await plan_fork(moving, request)
        assert reads >= 3
        assert (await store.read_thread(b.read("s", "fork"))).thread is None


class _NeverOneVersion(MemoryThreadStore):
    """A store whose reads of the source are never one version."""

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        raise SourceChanged


async def test_a_fork_that_cannot_read_one_version_is_transient_not_a_caller_bug() -> None:
    async with _NeverOneVersion() as store:
        await _commit(store, b.create("s", "src"))
        with pytest.raises(ThreadStoreUnavailableError, match="retry") as raised:
            await store.fork_thread("s", "src", "fork")
        assert not isinstance(raised.value, ThreadStoreInvariantError)
        assert (await store.read_thread(b.read("s", "fork"))).thread is None


# ---------------------------------------------------------------- capability, copy


class _NoLifecycle(MemoryThreadStore):
    capabilities = frozenset()


async def test_a_store_without_the_capability_says_so() -> None:
    async with _NoLifecycle() as store:
        assert LIFECYCLE not in store.capabilities
        with pytest.raises(ThreadStoreConfigurationError, match="lifecycle capability"):
            await store.prune_threads(updated_before=datetime.now(UTC))
        with pytest.raises(ThreadStoreConfigurationError, match="lifecycle capability"):
            await store.fork_thread("s", "a", "b")
        with pytest.raises(ThreadStoreConfigurationError, match="lifecycle capability"):
            [line async for line in store.export_threads("s")]


class _PrimitivesLeftOut(MemoryThreadStore):
    """Declares the capability but keeps the base class's primitives."""

    _thread_heads = ThreadStore._thread_heads  # type: ignore[assignment]
    _load_thread = ThreadStore._load_thread  # type: ignore[assignment]
    _restore_thread = ThreadStore._restore_thread  # type: ignore[assignment]


async def test_a_primitive_left_out_fails_with_the_contracts_error() -> None:
    async with _PrimitivesLeftOut() as store:
        assert LIFECYCLE in store.capabilities
        with pytest.raises(ThreadStoreConfigurationError, match="needed by _thread_heads"):
            await store.prune_threads(updated_before=datetime.now(UTC))
        with pytest.raises(ThreadStoreConfigurationError, match="needed by _load_thread"):
            await store.thread_digest("s", "a")


async def test_copy_of_many_long_threads_reads_back_identically() -> None:
    clock = ManualClock()
    async with MemoryThreadStore(clock=clock) as source, MemoryThreadStore() as target:
        for t in range(40):
            root = await _commit(source, b.create(f"s{t % 3}", f"t{t}"))
            for turn in range(10):
                clock.advance(ms=1)
                run_id = f"r{turn}"
                changes: dict[str, Any] = {
                    "messages": [
                        b.insert(b.message(f"m{turn}.{k}", run_id=run_id)) for k in range(10)
                    ],
                    "runs": [b.insert(b.run(run_id, "completed", inputs=[f"m{turn}.0"]))],
                }
                for k in range(1, 10):
                    changes["messages"][k]["record"]["association"]["relation"] = "output"
                root = await _commit(
                    source, b.update_at(f"s{t % 3}", f"t{t}", root.version, changes, root=b.root())
                )
        report = await copy_threads(source, target)
        assert len(report.copied) == 40
        assert report.verified == 40
        assert report.ok
        for t in range(40):
            scope = f"s{t % 3}"
            assert await target.thread_digest(scope, f"t{t}") == await source.thread_digest(
                scope, f"t{t}"
            )
            found = await target._load_thread(scope, f"t{t}")
            assert found is not None
            assert len(found.messages) == 100
        lines = [line async for line in target.export_threads(None)]
        decoded = [a async for _, a in decode_threads(lines)]
        assert sorted(thread_digest(a) for a in decoded) == sorted(
            [d for t in range(40) if (d := await source.thread_digest(f"s{t % 3}", f"t{t}"))]
        )


# ---------------------------------------------------------------- bundle


async def test_bundle_erase_scope_erases_the_tenant_everywhere() -> None:
    clock = ManualClock()
    async with connect("memory://", clock=clock) as stores:
        for scope in ("acme", "acme2"):
            await _random_thread(
                stores.threads, clock, scope, "t", [("completed", 1, False)], "queued", {}
            )
            await stores.kv.put((scope,), "k", 1)
            await stores.kv.put((scope, "deep", "er"), "k", 2)
            await stores.state.save(scope, "session-1", "x", {"v": 1})
            await stores.state.save(scope, "session-2", "x", {"v": 2})
            await stores.snapshots.put(scope, "snap", b"data")
        for i in range(1_005):
            await stores.kv.put(("acme", "many"), f"k{i}", i)
        erased = await stores.erase_scope("acme")
        assert (erased.threads, erased.kv_items, erased.sessions, erased.snapshots) == (
            1,
            1_007,
            2,
            1,
        )
        assert (await stores.threads.read_thread(b.read("acme", "t"))).thread is None
        assert (await stores.kv.search(("acme",))).items == []
        assert (await stores.state.list_session_ids("acme")).items == []
        assert (await stores.snapshots.list("acme")).items == []
        # The other tenant (a longer name with the same beginning) is untouched.
        assert (await stores.threads.read_thread(b.read("acme2", "t"))).thread is not None
        assert len((await stores.kv.search(("acme2",))).items) == 2
        assert len((await stores.state.list_session_ids("acme2")).items) == 2
        assert len((await stores.snapshots.list("acme2")).items) == 1
        again = await stores.erase_scope("acme")
        assert (again.threads, again.kv_items, again.sessions, again.snapshots) == (0, 0, 0, 0)


async def test_bundle_erase_of_a_scope_no_runtime_store_can_name() -> None:
    async with connect("memory://") as stores:
        await _commit(stores.threads, b.create("a\x00b", "t"))
        erased = await stores.erase_scope("a\x00b")
        assert erased.threads == 1
        assert erased.kv_items == erased.sessions == erased.snapshots == 0


async def test_a_thousand_threads_of_a_hundred_messages_copy_through_a_chain_of_stores() -> None:
    """source -> middle -> target, each hop resumable and digest-verified; the other
    backends join this chain once they declare the lifecycle capability."""
    clock = ManualClock()
    stores = [MemoryThreadStore(clock=clock) for _ in range(3)]
    source = stores[0]
    turns = [("completed", 9, False)] * 10  # 10 runs of 10 messages
    await _random_thread(source, clock, "s", "template", turns, "none", {"n": 1})
    template = await _aggregate(source, "s", "template")
    assert len(template.messages) == 100
    for i in range(1_000):
        root = template.root.model_copy(update={"scope_key": f"s{i % 7}", "thread_id": f"t{i}"})
        copy = ThreadAggregate(root, template.messages, template.runs, template.queued_items)
        assert await source._restore_thread(copy) is None
    for before, after in itertools.pairwise(stores):
        report = await copy_threads(before, after)
        assert len(report.copied) == 1_001
        assert report.verified == 1_001
        assert report.ok
    for i in range(0, 1_000, 97):
        digests = {await s.thread_digest(f"s{i % 7}", f"t{i}") for s in stores}
        assert len(digests) == 1
        assert None not in digests


async def test_import_of_one_string_keeps_line_separators_inside_values() -> None:
    clock = ManualClock()
    odd = {"text": "a\u2028b\u2029c\x85d\re\nf\x1cg"}
    async with MemoryThreadStore(clock=clock) as source, MemoryThreadStore() as target:
        await _random_thread(source, clock, "s", "t", [("completed", 1, True)], "none", odd)
        text = "".join([line async for line in source.export_threads("s")])
        assert "\u2028" in text  # written as is, not escaped
        await target.import_threads(text)
        await target.import_threads(text.encode("utf-8"))  # skipped: it exists
        assert await target.thread_digest("s", "t") == await source.thread_digest("s", "t")


@pytest.mark.parametrize("name", ["memory", "postgres", "mongo", "sql"])
def test_built_in_backends_with_the_lifecycle_copy_forks_in_their_database(name: str) -> None:
    """The generic fork loads the whole thread into Python; a built-in backend that
    declares the lifecycle capability must override it with an in-database copy."""
    import importlib

    module = importlib.import_module(f"pai_storage_{name}.store")
    stores = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, ThreadStore) and value is not ThreadStore
    ]
    assert stores, f"no thread store class in pai_storage_{name}.store"
    for store in stores:
        if LIFECYCLE in store.capabilities:
            assert store._fork_copy is not ThreadStore._fork_copy, store.__name__


async def test_a_cutoff_between_milliseconds_includes_the_millisecond_before() -> None:
    clock = ManualClock(datetime(2020, 1, 1, 12, tzinfo=UTC))
    async with MemoryThreadStore(clock=clock) as store:
        await _commit(store, b.create("s", "t"))
        assert await store.prune_threads(updated_before=clock()) == []
        cutoff = clock() + timedelta(microseconds=500)
        assert [p.thread_id for p in await store.prune_threads(updated_before=cutoff)] == ["t"]
