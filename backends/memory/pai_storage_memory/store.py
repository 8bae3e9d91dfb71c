"""The in-memory store: one indexed thread per id, an ordered index per scope, one lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from itertools import islice
from typing import Any

from sortedcontainers import SortedList  # type: ignore[import-untyped]

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
    LIFECYCLE,
    AggregateSnapshot,
    ForkRequest,
    IndexedThread,
    IndexedTransaction,
    ListPlan,
    ThreadAggregate,
    ThreadConflict,
    ThreadIndexEntry,
    fork_aggregate,
    read_aggregate,
    run_commit,
    run_sync,
    system_clock,
    truncate_ms,
)
from pai_storage.watch import WATCH_CHANGES, ChangeNotifier, ChangeSignal, CommitNote

__all__ = ["MemoryThreadStore"]


class _Scope:
    """The threads of one scope, plus their roots in list order and in update order.

    ``order`` holds ``(-updated_at ms, thread_id)`` for every thread (the list
    order of :meth:`ListPlan.sort_key`), so a list page starts at its cursor in
    O(log n) instead of sorting the scope. ``updates`` holds ``(updated_at,
    thread_id)`` ascending: the retention index a sweep walks from its oldest
    end.
    """

    __slots__ = ("order", "threads", "updates")

    def __init__(self) -> None:
        self.threads: dict[str, IndexedThread] = {}
        self.order: Any = SortedList()
        self.updates: Any = SortedList()

    def __len__(self) -> int:
        return len(self.threads)

    def store(
        self, thread_id: str, before: ThreadRecord | None, after: IndexedThread | None
    ) -> None:
        """Record a committed thread (``None``: deleted) whose root was ``before``."""
        if before is not None:
            self.order.remove(ListPlan.sort_key(before))
            self.updates.remove((before.updated_at, thread_id))
        if after is None:
            self.threads.pop(thread_id, None)
        else:
            self.threads[thread_id] = after
            self.order.add(ListPlan.sort_key(after.root))
            self.updates.add((after.root.updated_at, thread_id))

    def roots_after(self, key: tuple[int, str] | None) -> Iterator[ThreadRecord]:
        """The roots in list order whose sort key is greater than ``key``."""
        keys = self.order if key is None else self.order.irange(key, None, inclusive=(False, True))
        for _, thread_id in keys:
            yield self.threads[thread_id].root


class MemoryThreadStore(ThreadStore):
    """Threads kept in process memory; the reference backend.

    Reads and commits run the core's pipelines (:func:`~pai_storage.backend.run_commit`,
    :func:`~pai_storage.backend.read_aggregate`) over indexed threads under one
    per-store lock, so they are atomic and serialized. A commit stages its
    writes and applies them only once it is judged, and costs the size of the
    change; a page costs the size of the page (see ``docs/performance.md``).
    Inputs are copied before they are stored and results are copied before
    they are returned: callers can never mutate stored state. Nothing survives
    the process.

    Accepts the common options of :class:`~pai_storage.ThreadStore`
    (``clock``, ``on_warning``, ``token_secret``).
    """

    backend_name = "memory"
    token_prefix = "pai-memory"
    capabilities = frozenset({LIFECYCLE, WATCH_CHANGES})

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self._scopes: dict[str, _Scope] = {}
        # (updated_at, scope_key, thread_id) of every thread: the cross-scope
        # retention index.
        self._updates: Any = SortedList()
        # A threading lock: every critical section is synchronous, so the store
        # is also safe when shared by several event loops or threads.
        self._lock = threading.Lock()
        self._watchers = ChangeNotifier()  # wakes watch() at once after a commit

    def _clock(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    def _thread(self, scope_key: str, thread_id: str) -> IndexedThread | None:
        scope = self._scopes.get(scope_key)
        return scope.threads.get(thread_id) if scope is not None else None

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self.selections.plan_read(request)
        with self._lock:
            thread = self._thread(request.scope_key, request.thread_id)
            return read_aggregate(thread, plan, self._clock())

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self.selections.plan_list(request)
        with self._lock:
            scope = self._scopes.get(request.scope_key)
            if scope is None:
                return plan.finish([])
            return plan.select_sorted(scope.roots_after)

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        # The request is the store's own copy already: ThreadStore.commit_thread
        # validates a mapping or a model (nested models too) into a fresh model.
        with self._lock:
            thread = self._thread(request.scope_key, request.thread_id)
            before = thread.root if thread is not None else None
            tx = IndexedTransaction(thread, self._clock())
            # Every stored thread obeys the rules, so only the runs this commit
            # can affect are checked (the conformance suite compares this with
            # the full check of the reference model).
            result = run_sync(run_commit(tx, request))
            if isinstance(result, CommittedResult):
                note = CommitNote.of_commit(request, result.thread)
                self._store(request.scope_key, request.thread_id, before, tx.apply(), note)
            return result

    def _store(
        self,
        scope_key: str,
        thread_id: str,
        before: ThreadRecord | None,
        after: IndexedThread | None,
        note: CommitNote | None = None,
    ) -> None:
        """Record a committed thread (``None``: deleted) in its scope and both indexes."""
        scope = self._scopes.setdefault(scope_key, _Scope())
        scope.store(thread_id, before, after)
        if before is not None:
            self._updates.remove((before.updated_at, scope_key, thread_id))
        if after is not None:
            self._updates.add((after.root.updated_at, scope_key, thread_id))
        if not scope:
            del self._scopes[scope_key]
        self._watchers.notify(scope_key, thread_id, note)

    def _change_signal(self, scope_key: str, thread_id: str | None) -> ChangeSignal:
        return self._watchers.signal(scope_key, thread_id)

    # ------------------------------------------------------------ lifecycle primitives

    async def _thread_heads(
        self,
        scope_key: str | None,
        *,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> Sequence[ThreadIndexEntry]:
        with self._lock:
            if scope_key is None:
                low: Any = None if after is None else after.sort_key()
                high: Any = None if updated_before is None else (updated_before, "", "")
                keys = self._updates.irange(low, high, inclusive=(False, False))
                found = [(s, t) for _, s, t in islice(keys, limit)]
            else:
                scope = self._scopes.get(scope_key)
                if scope is None:
                    return []
                low = None if after is None else (after.updated_at, after.thread_id)
                high = None if updated_before is None else (updated_before, "")
                keys = scope.updates.irange(low, high, inclusive=(False, False))
                found = [(scope_key, t) for _, t in islice(keys, limit)]
            return [ThreadIndexEntry.of(self._scopes[s].threads[t].root) for s, t in found]

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        # Stored records are never changed in place (a commit replaces them),
        # so the aggregate shares them; the core only reads it.
        with self._lock:
            thread = self._thread(scope_key, thread_id)
            return None if thread is None else thread.to_aggregate()

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        root = aggregate.root
        with self._lock:
            existing = self._thread(root.scope_key, root.thread_id)
            if existing is not None:
                return existing.root.version
            thread = IndexedThread.from_aggregate(aggregate)
            self._store(root.scope_key, root.thread_id, None, thread)
            return None

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        with self._lock:  # the plan made and copied under one lock: one version
            source = self._thread(fork.scope_key, fork.source_thread_id)
            now = self._clock()
            plan = run_sync(fork.plan_in(self, AggregateSnapshot(source, now)))
            target = self._thread(plan.scope_key, plan.thread_id)
            if target is not None:
                raise ThreadConflict(target.root.version)
            assert source is not None  # planning raised for a missing source
            copied = fork_aggregate(source.to_aggregate(), plan, now)
            self._store(plan.scope_key, plan.thread_id, None, IndexedThread.from_aggregate(copied))
            return copied.root

    async def _info(self) -> StoreInfo:
        return StoreInfo(
            backend="memory",
            server_version="in-process",
            transactions=True,
            details={"durability": "none (process memory)"},
        )
