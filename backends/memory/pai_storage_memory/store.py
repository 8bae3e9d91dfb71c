"""The in-memory store: one aggregate per thread, one lock, copies in and out."""

from __future__ import annotations

import copy
import threading
from datetime import datetime

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
    truncate_ms,
)
from pai_storage.backend import ThreadAggregate, apply_thread_changes, read_aggregate, system_clock

__all__ = ["MemoryThreadStore"]


class MemoryThreadStore(ThreadStore):
    """Threads kept in process memory; the reference backend.

    Reads and commits run the core's pipelines over the stored aggregate
    (:func:`~pai_storage.backend.read_aggregate`,
    :func:`~pai_storage.backend.apply_thread_changes`) under one per-store
    lock, so they are atomic and serialized. Inputs are copied before they are
    stored and results are copied before they are returned: callers can never
    mutate stored state. Nothing survives the process.

    Accepts the common options of :class:`~pai_storage.ThreadStore`
    (``clock``, ``on_warning``, ``token_secret``).
    """

    backend_name = "memory"
    token_prefix = "pai-memory"

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self._scopes: dict[str, dict[str, ThreadAggregate]] = {}
        # A threading lock: every critical section is synchronous, so the store
        # is also safe when shared by several event loops or threads.
        self._lock = threading.Lock()

    def _clock(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self.selections.plan_read(request)
        with self._lock:
            aggregate = self._scopes.get(request.scope_key, {}).get(request.thread_id)
            return copy.deepcopy(read_aggregate(aggregate, plan, self._clock()))

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self.selections.plan_list(request)
        with self._lock:
            threads = self._scopes.get(request.scope_key, {})
            page = plan.select(agg.root for agg in threads.values())
            return copy.deepcopy(page)

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        request = request.deep_copy()
        with self._lock:
            threads = self._scopes.get(request.scope_key, {})
            # Every stored aggregate obeys the rules, so only the runs this commit
            # can affect are checked (the conformance suite compares this with the
            # full check of the reference model).
            outcome = apply_thread_changes(
                threads.get(request.thread_id), request, self._clock(), bounded=True
            )
            if isinstance(outcome.result, CommittedResult):
                if outcome.aggregate is None:
                    threads.pop(request.thread_id, None)
                else:
                    self._scopes.setdefault(request.scope_key, threads)[request.thread_id] = (
                        outcome.aggregate
                    )
            return copy.deepcopy(outcome.result)

    async def _info(self) -> StoreInfo:
        return StoreInfo(
            backend="memory",
            server_version="in-process",
            transactions=True,
            details={"durability": "none (process memory)"},
        )
