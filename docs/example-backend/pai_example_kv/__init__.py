"""``kv://``: thread aggregates stored as JSON values in a key-value map.

Everything here uses public names only: records and errors from
``pai_storage``, author helpers from ``pai_storage.backend``, and the test
harness base from ``pai_storage_conformance.provision``. The "server" is a dict
of ``bytes -> bytes`` standing in for any key-value store; each thread is one
value holding :meth:`pai_storage.ThreadAggregate.to_json`, keyed by a digest of
the scope plus the JSON-encoded thread id (opaque ids never leak into key
syntax). Commits read, apply and write back one value under a per-store lock,
so each commit is one atomic compare-and-set of that value.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from pai_storage_conformance.provision import TestHarness  # standard library only: cheap

from pai_storage import (
    Clock,
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
    system_clock,
    truncate_ms,
)
from pai_storage.backend import (
    Backend,
    SelectionHelpers,
    StoreURL,
    ThreadAggregate,
    apply_thread_changes,
    default_scope_digest,
)

__all__ = ["KeyValueThreadStore", "backend"]


class KeyValueThreadStore(ThreadStore):
    backend_name = "examplekv"

    def __init__(self, *, clock: Clock | None = None, on_warning: Any = None) -> None:
        super().__init__(clock=clock, on_warning=on_warning)
        self._kv: dict[bytes, bytes] = {}
        self._lock = asyncio.Lock()
        self._selections = SelectionHelpers("pai-kv")

    @staticmethod
    def _prefix(scope_key: str) -> bytes:
        return f"thread/{default_scope_digest(scope_key)}/".encode()

    def _key(self, scope_key: str, thread_id: str) -> bytes:
        return self._prefix(scope_key) + json.dumps(thread_id).encode()

    def _load(self, key: bytes) -> ThreadAggregate | None:
        raw = self._kv.get(key)
        return None if raw is None else ThreadAggregate.from_json(json.loads(raw))

    def _time(self) -> datetime:
        return truncate_ms((self.clock or system_clock)())

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self._selections.plan_read(request)
        async with self._lock:
            observed_at = self._time()
            aggregate = self._load(self._key(request.scope_key, request.thread_id))
        if aggregate is None:
            return ThreadReadResult(observed_at=observed_at, thread=None)
        pages = plan.select(aggregate)
        return ThreadReadResult.model_construct(
            observed_at=observed_at,
            thread=aggregate.root,
            messages=pages.get("messages"),
            runs=pages.get("runs"),
            queued_items=pages.get("queued_items"),
        )

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self._selections.plan_list(request)
        prefix = self._prefix(request.scope_key)
        async with self._lock:
            values = [v for k, v in self._kv.items() if k.startswith(prefix)]
        roots = [ThreadRecord.model_validate(json.loads(v)["thread"]) for v in values]
        return plan.select(roots)

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        key = self._key(request.scope_key, request.thread_id)
        async with self._lock:
            current = self._load(key)
            now = self._time()
            if current is not None:
                now = max(now, current.root.updated_at)
            outcome = apply_thread_changes(current, request, now)
            if isinstance(outcome.result, CommittedResult):
                if outcome.aggregate is None:
                    self._kv.pop(key, None)
                else:
                    self._kv[key] = json.dumps(outcome.aggregate.to_json()).encode()
        return copy.deepcopy(outcome.result)

    async def _info(self) -> StoreInfo:
        return StoreInfo(backend="examplekv", server_version="dict", transactions=True)


class _Harness(TestHarness):
    """Conformance provisioning: a new store (a new key-value map) per test."""

    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        async with KeyValueThreadStore(clock=clock) as store:
            yield store

    def describe(self) -> str:
        return "examplekv (in-process key-value map)"


class _Backend(Backend):
    name = "examplekv"
    url_schemes = ("kv",)  # declared in pyproject.toml's pai_storage.schemes group too

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, {"clock", "on_warning"})
        return KeyValueThreadStore(**options)

    def test_harness(self, url: str | None = None) -> TestHarness:
        return _Harness()


backend = _Backend()
