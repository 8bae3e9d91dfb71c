"""The in-memory store: one aggregate per thread, one lock, copies in and out."""

from __future__ import annotations

import copy
import threading
from datetime import datetime
from typing import TypeVar

from pai_storage import (
    Clock,
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    Page,
    ReadThreadInput,
    SelectionHelpers,
    StoreInfo,
    ThreadAggregate,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    WarningCallback,
    apply_thread_changes,
    system_clock,
    truncate_ms,
)

__all__ = ["MemoryThreadStore"]

T = TypeVar("T")


class MemoryThreadStore(ThreadStore):
    """Threads kept in process memory; the reference backend.

    Commits go through :func:`pai_storage.apply_thread_changes` under one
    per-store lock, so they are atomic and serialized. Inputs are copied before
    they are stored and results are copied before they are returned: callers can
    never mutate stored state. Nothing survives the process.

    Parameters
    ----------
    clock:
        Test-only clock; the process clock otherwise.
    on_warning:
        Accepted for symmetry with other backends (nothing here can be corrupt).
    token_secret:
        Optional key for page-token integrity.
    """

    backend_name = "memory"

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning)
        self._scopes: dict[str, dict[str, ThreadAggregate]] = {}
        # A threading lock: every critical section is synchronous, so the store
        # is also safe when shared by several event loops or threads.
        self._lock = threading.Lock()
        self._selections = SelectionHelpers("pai-memory", secret=token_secret)

    def _time(self, floor: datetime | None = None) -> datetime:
        now = truncate_ms((self.clock or system_clock)())
        # committed_at never goes backwards within a thread, even if the clock does.
        return max(now, floor) if floor is not None else now

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self._selections.plan_read(request)
        with self._lock:
            observed_at = self._time()
            aggregate = self._scopes.get(request.scope_key, {}).get(request.thread_id)
            if aggregate is None:
                return ThreadReadResult(observed_at=observed_at, thread=None)
            pages = plan.select(aggregate)
            result = ThreadReadResult.model_construct(
                observed_at=observed_at,
                thread=aggregate.root,
                messages=pages.get("messages"),
                runs=pages.get("runs"),
                queued_items=pages.get("queued_items"),
            )
            return copy.deepcopy(result)

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self._selections.plan_list(request)
        with self._lock:
            threads = self._scopes.get(request.scope_key, {})
            page = plan.select(agg.root for agg in threads.values())
            return copy.deepcopy(page)

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        request = request.deep_copy()
        with self._lock:
            threads = self._scopes.get(request.scope_key, {})
            current = threads.get(request.thread_id)
            now = self._time(current.root.updated_at if current else None)
            # Every stored aggregate obeys the rules, so only the runs this commit
            # can affect are checked (the conformance suite compares this with the
            # full check of the reference model).
            outcome = apply_thread_changes(current, request, now, bounded=True)
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
