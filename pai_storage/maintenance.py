"""Thread lifecycle algorithms: retention sweep, scope erasure and fork, written once.

A backend supplies four small primitives (``docs/lifecycle.md``) and the core
runs every algorithm, check order and batching loop here:

- :func:`prune_threads` walks the backend's updated-at index
  (:meth:`ThreadStore._thread_heads`) in bounded batches, re-reads each
  candidate, skips one holding an unexpired lease or a ``running``/``waiting``
  run, and deletes it through the ordinary version-checked delete commit: a
  racing commit either lands first (the delete then conflicts and the thread
  survives) or conflicts itself.
- :func:`erase_scope` deletes every thread of a scope the same way, batch by
  batch, until the index holds none; a thread another client's open
  transaction holds is skipped and come back to (for at most
  :data:`HELD_WAIT` seconds); an interrupted erasure is finished by calling
  it again.
- :func:`plan_fork` decides *what* a fork copies from ordinary consistent
  reads (the cut, the runs left out) into a :class:`ForkPlan`; the backend's
  :meth:`ThreadStore._fork_copy` only executes it in one transaction, and
  :func:`fork_aggregate` is the same plan applied to a thread held in memory
  (the reference, and the generic fallback).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .aggregate import Entry, Family, ThreadAggregate
from .errors import ThreadStoreInvariantError, ThreadStoreUnavailableError
from .fields import Id, truncate_ms
from .leases import is_expired
from .models import (
    CommittedResult,
    ConflictResult,
    Message,
    ReadThreadInput,
    RunRecord,
    ThreadReadResult,
    ThreadRecord,
    ThreadVersion,
)
from .parsing import parse
from .pipeline import ReadSnapshot, run_read
from .roots import new_instance_id

if TYPE_CHECKING:
    from .store import ThreadStore

__all__ = [
    "MAX_SWEEP_LIMIT",
    "SWEEP_BATCH",
    "ForkPlan",
    "ForkRequest",
    "PrunedThread",
    "SourceChanged",
    "ThreadIndexEntry",
    "ThreadReader",
    "check_thread_key",
    "erase_scope",
    "fork_aggregate",
    "fork_thread",
    "plan_fork",
    "prune_threads",
]

SWEEP_BATCH = 100
"""How many index entries a sweep asks the backend for at a time."""

MAX_SWEEP_LIMIT = 10_000
"""The largest ``limit`` one :meth:`ThreadStore.prune_threads` call accepts."""

HELD_WAIT = 150.0
"""Seconds :func:`erase_scope` keeps coming back to threads whose delete the
database kept refusing while it answered reads (another client's open
transaction holds them: a process killed in the middle of a write holds its
threads until the server ends its transaction; MongoDB's default
``transactionLifetimeLimitSeconds`` is 60 s, checked about once a minute)."""

HELD_RETRY_INTERVAL = 1.0
"""Seconds between two passes over the threads that were held."""

_OPEN = ("running", "waiting")
_FORK_ATTEMPTS = 8


def check_thread_key(name: str, value: object) -> str:
    """Validate a scope key or thread id like any input (1 to 1,024 characters, valid Unicode)."""
    if not isinstance(value, str):
        raise ThreadStoreInvariantError(f"{name} must be a str, not {type(value).__name__}")
    checked: str = parse(Id, value)
    return checked


@dataclass(frozen=True, slots=True)
class ThreadIndexEntry:
    """One entry of a backend's updated-at index: which thread, at which version, when.

    Returned by :meth:`ThreadStore._thread_heads` in ascending ``updated_at``
    order (then ``scope_key``, then ``thread_id``).
    """

    scope_key: str
    thread_id: str
    version: ThreadVersion
    updated_at: datetime

    @classmethod
    def of(cls, root: ThreadRecord) -> ThreadIndexEntry:
        return cls(root.scope_key, root.thread_id, root.version, root.updated_at)

    def sort_key(self) -> tuple[datetime, str, str]:
        """The index order: ``updated_at``, then scope key, then thread id."""
        return (self.updated_at, self.scope_key, self.thread_id)


@dataclass(frozen=True, slots=True)
class PrunedThread:
    """A thread a retention sweep deleted, and the version it had."""

    scope_key: str
    thread_id: str
    version: ThreadVersion


# ------------------------------------------------------------------ sweeps


def _store_now(store: ThreadStore) -> datetime:
    from .clock import system_clock

    return store.now() or truncate_ms(system_clock())


async def _delete(
    store: ThreadStore, scope_key: str, thread_id: str, version: ThreadVersion
) -> bool:
    result = await store.commit_thread(
        {
            "scopeKey": scope_key,
            "threadId": thread_id,
            "condition": {"type": "version", "version": version.to_json()},
            "mutation": {"type": "delete"},
        }
    )
    return isinstance(result, CommittedResult)


async def _prunable(
    store: ThreadStore, head: ThreadIndexEntry, updated_before: datetime
) -> ThreadRecord | None:
    """The candidate's current root when it may be pruned, else ``None``."""
    read = await store.read_thread(
        {
            "scopeKey": head.scope_key,
            "threadId": head.thread_id,
            "include": {
                "runs": {"type": "page", "statuses": list(_OPEN), "page": {"limit": 1}},
            },
        }
    )
    root = read.thread
    if root is None or root.updated_at >= updated_before:
        return None
    if root.lease is not None and not is_expired(root.lease, _store_now(store)):
        return None
    if read.runs is not None and read.runs.items:
        return None
    return root


def _check_limit(limit: object) -> int:
    if type(limit) is not int or not 1 <= limit <= MAX_SWEEP_LIMIT:
        raise ThreadStoreInvariantError(f"limit must be an integer from 1 to {MAX_SWEEP_LIMIT}")
    return limit


def _check_cutoff(updated_before: object) -> datetime:
    if not isinstance(updated_before, datetime) or updated_before.tzinfo is None:
        raise ThreadStoreInvariantError("updated_before must be an aware datetime")
    cutoff = truncate_ms(updated_before)
    # Timestamps are whole milliseconds: "before 12:00:00.0005" includes 12:00:00.000.
    return cutoff if cutoff == updated_before else cutoff + timedelta(milliseconds=1)


async def prune_threads(
    store: ThreadStore,
    scope_key: str | None,
    *,
    updated_before: datetime,
    limit: int,
) -> list[PrunedThread]:
    """The retention sweep (see :meth:`ThreadStore.prune_threads`)."""
    scope = None if scope_key is None else check_thread_key("scope_key", scope_key)
    cutoff = _check_cutoff(updated_before)
    limit = _check_limit(limit)
    deleted: list[PrunedThread] = []
    after: ThreadIndexEntry | None = None
    while len(deleted) < limit:
        batch = await store._thread_heads(
            scope, updated_before=cutoff, after=after, limit=SWEEP_BATCH
        )
        for head in batch:
            after = head
            root = await _prunable(store, head, cutoff)
            if root is not None and await _delete(
                store, root.scope_key, root.thread_id, root.version
            ):
                deleted.append(PrunedThread(root.scope_key, root.thread_id, root.version))
                if len(deleted) == limit:
                    break
        if len(batch) < SWEEP_BATCH:
            break
    return deleted


async def erase_scope(store: ThreadStore, scope_key: str) -> int:
    """Delete every thread of the scope (see :meth:`ThreadStore.erase_scope`).

    Passes over the scope's index until one deletes everything it finds. A
    thread whose delete fails as unavailable while a read of it succeeds is
    held by another client's open transaction: it is skipped, the pass goes
    on, and the next pass (after :data:`HELD_RETRY_INTERVAL` seconds) tries it
    again, for at most :data:`HELD_WAIT` seconds from the first refusal.

    Raises
    ------
    UnavailableError
        Threads were still held after :data:`HELD_WAIT` seconds (every other
        thread of the scope is erased; the message says when to call again),
        or the database is unavailable.
    """
    from .errors import ThreadStoreUnavailableError

    scope = check_thread_key("scope_key", scope_key)
    erased, deadline = 0, None
    loop = asyncio.get_running_loop()
    while True:
        deleted, held = await _erase_pass(store, scope)
        erased += deleted
        if not held:
            left = await store._thread_heads(scope, updated_before=None, after=None, limit=1)
            if not left:
                return erased
            continue  # a thread that changed during the pass: another pass
        if deadline is None:
            deadline = loop.time() + HELD_WAIT
        if loop.time() >= deadline:
            raise ThreadStoreUnavailableError(
                f"erase_scope: {len(held)} thread(s) of the scope could not be deleted for "
                f"{HELD_WAIT:.0f} s: another client's open transaction holds them (a process "
                "stopped in the middle of a write holds its threads until the server ends its "
                "transaction; MongoDB: after transactionLifetimeLimitSeconds, 60 s by default, "
                "checked about once a minute). Every other thread of the scope is erased; call "
                "erase_scope again in two minutes"
            ) from held[-1]
        await asyncio.sleep(HELD_RETRY_INTERVAL)


async def _erase_pass(store: ThreadStore, scope: str) -> tuple[int, list[Exception]]:
    """One pass over the scope's index: how many threads it deleted, and the
    errors of those another client's transaction held (skipped)."""
    from .errors import UnavailableError

    erased, after = 0, None
    held: list[Exception] = []
    while True:
        batch = await store._thread_heads(
            scope, updated_before=None, after=after, limit=SWEEP_BATCH
        )
        if not batch:
            return erased, held
        for head in batch:
            try:
                erased += await _erase_thread(store, scope, head)
            except UnavailableError as exc:
                # A read still works (else the database is down: raised), so the
                # delete was refused because a transaction holds the thread.
                await store.read_thread({"scopeKey": scope, "threadId": head.thread_id})
                held.append(exc)
        after = batch[-1]


async def _erase_thread(store: ThreadStore, scope: str, head: ThreadIndexEntry) -> int:
    """Delete one thread of the index; 1 when this call deleted it."""
    if await _delete(store, scope, head.thread_id, head.version):
        return 1
    # The thread changed since the index was read: delete it at its current
    # version; if it changes again, it moved on in the index and is met again.
    read = await store.read_thread({"scopeKey": scope, "threadId": head.thread_id})
    current = read.thread
    if current is not None and await _delete(store, scope, current.thread_id, current.version):
        return 1
    return 0


# ------------------------------------------------------------------ fork


class SourceChanged(Exception):
    """Raised by :meth:`ThreadStore._fork_copy` when its reads of the source were not
    one version (a snapshot that was not one).

    The core then runs the fork again; a fork that keeps meeting it ends in
    :class:`~pai_storage.errors.ThreadStoreUnavailableError` (transient: retry).
    """


ThreadReader = Callable[[ReadThreadInput], Awaitable[ThreadReadResult]]
"""Reads of one thread, all at one version (one snapshot, or under a hold)."""


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """A fork the caller asked for; the backend plans it (:meth:`plan`) inside the
    transaction that copies it, so the plan and the copy see one version.

    Copy from the source thread ``(scope_key, source_thread_id)`` to the new
    thread ``(scope_key, thread_id)``, through ``through_message_id`` (every
    message the rules allow when ``None``).
    """

    scope_key: str
    source_thread_id: str
    thread_id: str
    through_message_id: str | None
    instance_id: str
    test_now: datetime | None = None

    async def plan(self, read: ThreadReader) -> ForkPlan:
        """Plan the fork from reads of the source at one version (see :func:`plan_fork`)."""
        return await plan_fork(read, self)

    async def plan_in(self, store: ThreadStore, snapshot: ReadSnapshot) -> ForkPlan:
        """Plan the fork from a backend's read primitives over the source, inside the
        copy's transaction after the source is held (or in one snapshot)."""

        async def read(request: ReadThreadInput) -> ThreadReadResult:
            plan = store.selections.plan_read(request)
            return await run_read(snapshot, plan, clock_now=store.now())

        return await plan_fork(read, self)


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork copies, decided by the core at the version the backend holds.

    Copy, in the transaction the plan was made in, from the source thread
    ``(scope_key, source_thread_id)`` — at ``source_version`` — to the new
    thread ``(scope_key, thread_id)``, which must not exist (else raise
    :class:`~pai_storage.backend.ThreadConflict` with its version):

    - every message at or before the cut (:attr:`through_message_id`'s
      position; every message when it is ``None``) whose run id is not in
      :attr:`dropped_run_ids`, with its position and record unchanged;
    - every run whose id is not in :attr:`dropped_run_ids`, unchanged;
    - no queued item and no lease;
    - the source's three position counters, unchanged;
    - the root :meth:`root` returns for the provider's time.
    """

    scope_key: str
    source_thread_id: str
    thread_id: str
    source: ThreadRecord
    through_message_id: str | None
    dropped_run_ids: frozenset[str]
    instance_id: str
    test_now: datetime | None = None

    @property
    def source_version(self) -> ThreadVersion:
        return self.source.version

    def copies_message(self, message: Message, cut_position: int | None, position: int) -> bool:
        """Whether a source message at ``position`` is copied (``cut_position``: the cut)."""
        if cut_position is not None and position > cut_position:
            return False
        return message.run_id is None or message.run_id not in self.dropped_run_ids

    def copies_run(self, run: RunRecord) -> bool:
        """Whether a source run is copied."""
        return run.run_id not in self.dropped_run_ids

    def root(self, server_time: datetime | None) -> ThreadRecord:
        """The fork's root, created at the provider's ``server_time`` (or the test clock).

        Revision 1, a new instance id, ``parentThreadId`` the source, no lease;
        the creation time is never before the source's last commit.
        """
        moment = self.test_now if self.test_now is not None else server_time
        if moment is None:
            raise ValueError("a fork needs the provider's time")
        now = truncate_ms(moment)
        if now < self.source.updated_at:
            now = self.source.updated_at
        return self.source.model_copy(
            update={
                "thread_id": self.thread_id,
                "version": ThreadVersion.model_construct(
                    thread_instance_id=self.instance_id, revision=1
                ),
                "parent_thread_id": self.source_thread_id,
                "lease": None,
                "created_at": now,
                "updated_at": now,
            }
        )


async def _all_pages(
    read: ThreadReader,
    request: ForkRequest,
    family: str,
    selection: dict[str, Any],
    keep: Callable[[Any], Any] = lambda item: item,
) -> tuple[ThreadVersion, list[Any]]:
    """``keep`` of every item of one family's page selection, and the version all
    pages carry (a page at a time: only what ``keep`` returns stays in memory).

    Raises :class:`SourceChanged` when the thread is missing or pages disagree
    (the reads were not at one version).
    """
    items: list[Any] = []
    version: ThreadVersion | None = None
    token: str | None = None
    while True:
        page_request = {"limit": 100, **({"pageToken": token} if token else {})}
        result = await read(
            ReadThreadInput.model_validate(
                {
                    "scopeKey": request.scope_key,
                    "threadId": request.source_thread_id,
                    "include": {family: {**selection, "page": page_request}},
                }
            )
        )
        page = getattr(result, "queued_items" if family == "queuedItems" else family)
        if result.thread is None or page is None:
            raise SourceChanged
        if version is not None and page.version != version:
            raise SourceChanged
        version = page.version
        items.extend(map(keep, page.items))
        token = page.next_page_token
        if token is None:
            return version, items


async def plan_fork(read: ThreadReader, request: ForkRequest) -> ForkPlan:
    """Plan a fork from reads of the source that all see one version.

    Reads the root and the cut message, every run, and (with a cut) the run
    ids of the messages after the cut: O(runs + messages after the cut),
    never the copied transcript. Runs left out: open ones (``running``,
    ``waiting``), ``queued`` ones (the queue is not copied), those with a
    message after the cut, and those created after the cut message. The
    messages of a run left out are not copied either (relationship rule 1),
    with or without a cut: so the input of an open run stays behind.

    Raises
    ------
    ThreadStoreInvariantError
        The source or the cut message does not exist.
    SourceChanged
        The reads did not see one version.
    """
    include: dict[str, Any] = {}
    through = request.through_message_id
    if through is not None:
        include["messages"] = {"type": "ids", "messageIds": [through]}
    head = await read(
        ReadThreadInput.model_validate(
            {
                "scopeKey": request.scope_key,
                "threadId": request.source_thread_id,
                "include": include,
            }
        )
    )
    source = head.thread
    if source is None:
        raise ThreadStoreInvariantError(
            f"cannot fork thread {request.source_thread_id!r}: it does not exist"
        )
    version, runs = await _all_pages(read, request, "runs", {"type": "page"})
    if version != source.version:
        raise SourceChanged
    dropped = {run.run_id for run in runs if run.status in (*_OPEN, "queued")}
    if through is not None:
        found = head.messages.items if head.messages is not None else []
        if not found:
            raise ThreadStoreInvariantError(
                f"cannot fork through message {through!r}: it does not exist"
            )
        cut: Message = found[0]
        version, tail = await _all_pages(
            read,
            request,
            "messages",
            {"type": "page", "view": "raw", "afterMessageId": through},
            keep=lambda message: message.run_id,
        )
        if version != source.version:
            raise SourceChanged
        dropped.update(run_id for run_id in tail if run_id is not None)
        dropped.update(run.run_id for run in runs if run.created_at > cut.created_at)
    return ForkPlan(
        scope_key=request.scope_key,
        source_thread_id=request.source_thread_id,
        thread_id=request.thread_id,
        source=source,
        through_message_id=through,
        dropped_run_ids=frozenset(dropped),
        instance_id=request.instance_id,
        test_now=request.test_now,
    )


def fork_aggregate(
    source: ThreadAggregate, plan: ForkPlan, server_time: datetime
) -> ThreadAggregate:
    """The fork of a thread held in memory: ``plan`` applied to ``source``.

    Raises :class:`SourceChanged` when ``source`` is not at the plan's version.
    """
    if source.root.version != plan.source_version:
        raise SourceChanged
    cut: int | None = None
    if plan.through_message_id is not None:
        entry = source.messages.get(plan.through_message_id)
        if entry is None:
            raise SourceChanged
        cut = entry.position
    messages: Family[Message] = Family(next_position=source.messages.next_position)
    for entry in source.messages:
        if plan.copies_message(entry.record, cut, entry.position):
            messages.entries[entry.record.message_id] = Entry(entry.position, entry.record)
    runs: Family[RunRecord] = Family(next_position=source.runs.next_position)
    for run in source.runs:
        if plan.copies_run(run.record):
            runs.entries[run.record.run_id] = Entry(run.position, run.record)
    return ThreadAggregate(
        root=plan.root(server_time),
        messages=messages,
        runs=runs,
        queued_items=Family(next_position=source.queued_items.next_position),
    )


async def fork_thread(
    store: ThreadStore,
    scope_key: str,
    thread_id: str,
    new_thread_id: str,
    through_message_id: str | None,
) -> CommittedResult | ConflictResult:
    """Fork a thread (see :meth:`ThreadStore.fork_thread`)."""
    from .pipeline import ThreadConflict

    scope = check_thread_key("scope_key", scope_key)
    source_id = check_thread_key("thread_id", thread_id)
    target_id = check_thread_key("new_thread_id", new_thread_id)
    through = (
        None
        if through_message_id is None
        else check_thread_key("through_message_id", through_message_id)
    )
    if source_id == target_id:
        raise ThreadStoreInvariantError("new_thread_id must differ from thread_id")
    request = ForkRequest(
        scope_key=scope,
        source_thread_id=source_id,
        thread_id=target_id,
        through_message_id=through,
        instance_id=new_instance_id(),
        test_now=store.now(),
    )
    for _ in range(_FORK_ATTEMPTS):
        try:
            root = await store._fork_copy(request)
        except SourceChanged:
            continue
        except ThreadConflict as conflict:
            return ConflictResult(type="conflict", current_version=conflict.current)
        return CommittedResult(type="committed", thread=root, committed_at=root.created_at)
    raise ThreadStoreUnavailableError(
        f"cannot fork thread {source_id!r}: its reads were not one version "
        f"in {_FORK_ATTEMPTS} attempts; nothing was written, retry"
    )
