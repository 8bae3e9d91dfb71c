"""Threads as normalized rows in a key-value map, through the core's pipelines.

The "server" is a dict of ``bytes -> bytes`` standing in for any key-value
store with transactions. A thread is one root value plus one value per child
record; this module supplies only the primitives that touch that map
(:class:`~pai_storage.backend.CommitTransaction` and
:class:`~pai_storage.backend.ReadSnapshot`), and the core runs the whole
commit judgement and read loop over them. Keys never embed raw ids: the scope
is a digest and ids are JSON-encoded, so a ``/`` or any other character in an
id cannot reach into another thread's keys.

The thread lifecycle (prune, erase, fork, export, import) runs in the core
over four primitives at the end of :class:`KeyValueThreadStore`: an
updated-at index the server keeps sorted, a whole-thread load, an atomic
only-if-missing restore, and a fork copied inside one server transaction.

For brevity it scans a thread's rows where a real database would use an index
(a page here costs O(thread), not O(page)); everything else is what a
production backend does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    Page,
    ReadThreadInput,
    StoreInfo,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ThreadVersion,
)
from pai_storage.backend import (
    FAMILIES,
    LIFECYCLE,
    OPEN_STATUSES,
    ChildPagePlan,
    CommitTransaction,
    Entry,
    Family,
    FamilyName,
    FamilySpec,
    FamilyWrite,
    ForkRequest,
    HeldThread,
    MessageRef,
    QueueRef,
    ReadSnapshot,
    RelationshipContext,
    RelationshipReader,
    RunRef,
    RunRelations,
    SnapshotRoot,
    SourceChanged,
    ThreadAggregate,
    ThreadConflict,
    ThreadIndexEntry,
    Window,
    default_scope_digest,
    run_commit,
    run_read,
    system_clock,
    truncate_ms,
)

from .server import Server

__all__ = ["KeyValueThreadStore"]


def _thread(scope_key: str, thread_id: str) -> str:
    return f"{default_scope_digest(scope_key)}/{json.dumps(thread_id)}"


def _entry(spec: FamilySpec, raw: bytes) -> Entry[Any]:
    value = json.loads(raw)
    record: Any = spec.model.model_validate(value["record"])
    return Entry(value["position"], record)


class _View:
    """One thread's values, read through the transaction's staged writes."""

    def __init__(self, server: Server, scope_key: str, thread_id: str) -> None:
        self._data = server.data
        self._staged: dict[bytes, bytes | None] = {}
        self._root = f"root/{_thread(scope_key, thread_id)}".encode()
        self._rows = f"row/{_thread(scope_key, thread_id)}/"

    def _get(self, key: bytes) -> bytes | None:
        return self._staged[key] if key in self._staged else self._data.get(key)

    def _key(self, spec: FamilySpec, record_id: str) -> bytes:
        return f"{self._rows}{spec.name}/{json.dumps(record_id)}".encode()

    def root(self) -> tuple[ThreadRecord | None, dict[FamilyName, int]]:
        raw = self._get(self._root)
        if raw is None:
            return None, {"messages": 1, "runs": 1, "queuedItems": 1}
        value = json.loads(raw)
        return ThreadRecord.model_validate(value["thread"]), value["next"]

    def row(self, spec: FamilySpec, record_id: str) -> Entry[Any] | None:
        raw = self._get(self._key(spec, record_id))
        return None if raw is None else _entry(spec, raw)

    def rows(self, spec: FamilySpec) -> list[Entry[Any]]:
        """Every row of one family, in position order."""
        prefix = f"{self._rows}{spec.name}/".encode()
        keys = {k for k in (*self._data, *self._staged) if k.startswith(prefix)}
        found = [_entry(spec, raw) for key in keys if (raw := self._get(key)) is not None]
        return sorted(found, key=lambda e: e.position)

    def put_root(self, root: ThreadRecord | None, positions: Mapping[FamilyName, int]) -> None:
        value = None if root is None else {"thread": root.to_json(), "next": dict(positions)}
        self._staged[self._root] = None if value is None else json.dumps(value).encode()

    def put_row(self, spec: FamilySpec, record_id: str, entry: Entry[Any] | None) -> None:
        value = None
        if entry is not None:
            value = json.dumps({"position": entry.position, "record": entry.record.to_json()})
        self._staged[self._key(spec, record_id)] = None if value is None else value.encode()

    def commit(self) -> None:
        for key, value in self._staged.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value


class _Transaction(CommitTransaction, RelationshipReader):
    """The commit primitives; also answers the relationship check by scanning rows."""

    def __init__(self, view: _View) -> None:
        self.view = view
        self.held: ThreadRecord | None = None  # the root before the commit

    async def hold(self) -> HeldThread:  # the server lock is already held
        self.held, positions = self.view.root()
        return HeldThread(self.held, positions)

    async def server_time(self) -> datetime:
        return truncate_ms(system_clock())

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        return {i: entry for i in ids if (entry := self.view.row(spec, i)) is not None}

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        self.view.put_root(root, next_positions)

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        removed: set[str] = set()
        if write.truncate_after is not None:
            for entry in self.view.rows(spec):
                if entry.position > write.truncate_after:
                    self.view.put_row(spec, spec.record_id(entry.record), None)
                    if entry.record.run_id is not None:
                        removed.add(entry.record.run_id)
        for record_id in write.deletes:
            self.view.put_row(spec, record_id, None)
        for entry in (*write.updates.values(), *write.inserts):
            self.view.put_row(spec, spec.record_id(entry.record), entry)
        return removed

    async def delete_thread(self) -> None:
        for spec in FAMILIES:
            for entry in self.view.rows(spec):
                self.view.put_row(spec, spec.record_id(entry.record), None)
        self.view.put_root(None, {})

    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        return self

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        messages, runs, queued = (self.view.rows(spec) for spec in FAMILIES)
        facts = {}
        for run_id in run_ids:
            run = next((e.record for e in runs if e.record.run_id == run_id), None)
            owned = [i for i, e in enumerate(messages) if e.record.run_id == run_id]
            facts[run_id] = RunRelations(
                run=RunRef.of(run) if run is not None else None,
                messages=[MessageRef.of(messages[i].position, messages[i].record) for i in owned],
                foreign_inside=bool(owned) and owned[-1] - owned[0] + 1 != len(owned),
                queued_items=[QueueRef.of(e.record) for e in queued if e.record.run_id == run_id],
            )
        return facts

    async def open_runs(self) -> Sequence[RunRef]:
        runs = self.view.rows(FAMILIES[1])
        return [RunRef.of(e.record) for e in runs if e.record.status in OPEN_STATUSES]

    async def tail(self) -> MessageRef | None:
        messages = self.view.rows(FAMILIES[0])
        return MessageRef.of(messages[-1].position, messages[-1].record) if messages else None


class _Snapshot(ReadSnapshot):
    """The read primitives; the server lock makes the view one consistent snapshot."""

    def __init__(self, view: _View) -> None:
        self.view = view

    async def head(self) -> SnapshotRoot:
        root, positions = self.view.root()
        return SnapshotRoot(truncate_ms(system_clock()), root, positions)

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        return {i: entry for i in ids if (entry := self.view.row(spec, i)) is not None}

    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        rows = await self.load_rows(FAMILIES[0], message_ids)
        return {i: entry.position for i, entry in rows.items()}

    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        rows = self.view.rows(spec)
        if window.order == "newest":
            rows.reverse()
        chosen = [
            (e.position, e.record)
            for e in rows
            if window.contains(e.position) and plan.matches(e.record)
        ]
        return chosen[: window.fetch]


class KeyValueThreadStore(ThreadStore):
    """Threads in a key-value map; accepts the common options (``clock``, ``on_warning``,
    ``token_secret``) and the ``server`` to share with other components."""

    backend_name = "examplekv"
    token_prefix = "pai-kv"
    capabilities = frozenset({LIFECYCLE})

    def __init__(self, *, server: Server | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.server = server or Server()

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self.selections.plan_read(request)
        async with self.server.lock:
            view = _View(self.server, request.scope_key, request.thread_id)
            return await run_read(_Snapshot(view), plan, clock_now=self.now())

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self.selections.plan_list(request)
        prefix = f"root/{default_scope_digest(request.scope_key)}/".encode()
        async with self.server.lock:
            values = [v for k, v in self.server.data.items() if k.startswith(prefix)]
        roots = [ThreadRecord.model_validate(json.loads(v)["thread"]) for v in values]
        return plan.select(roots)

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        async with self.server.lock:
            tx = _Transaction(_View(self.server, request.scope_key, request.thread_id))
            result = await run_commit(tx, request, clock=self.now)
            if isinstance(result, CommittedResult):
                tx.view.commit()  # nothing staged reaches the map unless the commit holds
                self.server.updated.move(tx.held, result.thread)  # same transaction
            return result

    # ------------------------------------------------------------ lifecycle primitives

    async def _thread_heads(
        self,
        scope_key: str | None,
        *,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> Sequence[ThreadIndexEntry]:
        low = None if after is None else after.sort_key()
        async with self.server.lock:  # a range read of the index, then each entry's root
            found = self.server.updated.range(scope_key, low, updated_before, limit)
            roots = [_View(self.server, s, t).root()[0] for _, s, t in found]
        return [ThreadIndexEntry.of(root) for root in roots if root is not None]

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        async with self.server.lock:  # one consistent view of the root and every row
            view = _View(self.server, scope_key, thread_id)
            root, positions = view.root()
            if root is None:
                return None
            messages, runs, queued = (
                Family({spec.record_id(e.record): e for e in view.rows(spec)}, positions[spec.name])
                for spec in FAMILIES
            )
        return ThreadAggregate(root, messages, runs, queued)

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        root = aggregate.root
        async with self.server.lock:  # check and write in one transaction: only if missing
            view = _View(self.server, root.scope_key, root.thread_id)
            existing, _ = view.root()
            if existing is not None:
                return existing.version
            families = [(spec, getattr(aggregate, spec.attr)) for spec in FAMILIES]
            view.put_root(root, {spec.name: family.next_position for spec, family in families})
            for spec, family in families:
                for entry in family:
                    view.put_row(spec, spec.record_id(entry.record), entry)
            view.commit()
            self.server.updated.move(None, root)
            return None

    async def _fork_copy(self, request: ForkRequest) -> ThreadRecord:
        messages, runs, _ = FAMILIES
        # One transaction: plan the fork from reads of the source, then copy its
        # rows; no commit can come between. A real key-value database does the
        # same in one transaction (or one server-side script); the core never
        # sees the rows.
        async with self.server.lock:
            source = _View(self.server, request.scope_key, request.source_thread_id)
            plan = await request.plan_in(self, _Snapshot(source))  # a missing source raises
            held, positions = source.root()
            if held is None or held.version != plan.source_version:
                raise SourceChanged  # not one version: the core tries again
            fork = _View(self.server, plan.scope_key, plan.thread_id)
            existing, _ = fork.root()
            if existing is not None:
                raise ThreadConflict(existing.version)
            cut = None
            if plan.through_message_id is not None:
                through = source.row(messages, plan.through_message_id)
                if through is None:
                    raise SourceChanged
                cut = through.position
            root = plan.root(truncate_ms(system_clock()))  # the server's time
            fork.put_root(root, positions)  # the source's counters, unchanged
            for entry in source.rows(messages):
                if plan.copies_message(entry.record, cut, entry.position):
                    fork.put_row(messages, entry.record.message_id, entry)
            for entry in source.rows(runs):
                if plan.copies_run(entry.record):
                    fork.put_row(runs, entry.record.run_id, entry)
            fork.commit()  # queued items are never copied; the plan's root holds no lease
            self.server.updated.move(None, root)
            return root

    async def _info(self) -> StoreInfo:
        return StoreInfo(backend="examplekv", server_version="dict", transactions=True)
