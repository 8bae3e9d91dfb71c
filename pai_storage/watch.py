"""Watching threads: the changes committed to a thread, as an async iterator.

::

    async for change in store.watch("tenant-42", "chat-1"):
        print(change.version, change.deleted)

The core owns the loop and the coalescing (``docs/watch.md``): it reads the
thread's root, compares its version with the last one it reported, reports a
:class:`ThreadChange` when it moved, and then waits on the backend's
:class:`ChangeSignal` before it looks again. The default signal polls (it
sleeps for the interval); a backend that knows when its threads change
supplies a signal that wakes the watcher sooner (the memory backend's
:class:`ChangeNotifier`). Because every look reads the head, a consumer that is
slow, or a signal that fires late or twice, only coalesces changes: the latest
version is never missed and a version is never reported twice or backwards.

What changed inside the thread (:class:`ChangeSet`) travels beside the wake-up
as a :class:`CommitNote` when the backend knows it (memory in-process,
PostgreSQL in the ``NOTIFY`` payload of the commit). A change carries it only
when the notes of every commit it stands for arrived; otherwise ``changed`` is
``None``, which means "unknown: re-read the thread", never "nothing changed".
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .changes import record_id
from .errors import ThreadStoreInvariantError, ThreadStoreUnavailableError
from .families import FAMILIES
from .models import (
    CommitThreadInput,
    DeleteChange,
    DeleteMutation,
    InsertChange,
    ReplaceChange,
    ThreadRecord,
    ThreadVersion,
    TruncateChange,
)

if TYPE_CHECKING:
    from .store import ThreadStore

__all__ = [
    "DEFAULT_INTERVAL",
    "WATCH_CHANGES",
    "ChangeNotifier",
    "ChangeSet",
    "ChangeSignal",
    "CommitNote",
    "FamilyChanges",
    "ListeningNotifier",
    "ThreadChange",
    "check_interval",
    "check_version",
    "watch_scope",
    "watch_thread",
]

WATCH_CHANGES: Final = "watch_changes"
"""The capability of a store whose signal tells a waiting watcher what each commit changed.

With it, a watcher that was waiting when one commit happened reports it with
``changed`` filled (unless the interval ran out before the signal arrived).
"""
DEFAULT_INTERVAL: Final = 0.2
"""Seconds between two looks at a watched thread when the backend only polls."""
MAX_FAILURES: Final = 10
"""Consecutive unavailable reads a watcher retries (one interval apart) before it raises."""
_LIST_PAGE: Final = 100
_LOOKBACK: Final = 1.0
"""Seconds of looks a scope's watcher lists again: a commit is stamped before it is
visible, so one stamped before an update already seen can appear after it."""
_MAX_NOTES: Final = 1024
"""Commit notes a watcher keeps for versions it has not read yet (older ones are dropped)."""
T = TypeVar("T")


# ---------------------------------------------------------------- what changed


@dataclass(frozen=True, slots=True)
class FamilyChanges:
    """The record ids one family's changes named, by kind of change.

    When several commits are folded together an id can be in more than one
    tuple (inserted, then updated): read the record to learn its state at the
    change's version (it may be gone). ``truncated``: records after some point
    were removed (their ids are not known): re-read the family's tail.
    """

    inserted: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    truncated: bool = False

    def __bool__(self) -> bool:
        return bool(self.inserted or self.updated or self.deleted or self.truncated)

    @classmethod
    def of(cls, changes: Sequence[Any] | None) -> FamilyChanges:
        """The ids named by one family's list of changes (in list order)."""
        inserted: list[str] = []
        updated: list[str] = []
        deleted: list[str] = []
        truncated = False
        for change in changes or ():
            if isinstance(change, InsertChange):
                inserted.append(record_id(change.record))
            elif isinstance(change, ReplaceChange):
                updated.append(record_id(change.record))
            elif isinstance(change, DeleteChange):
                deleted.append(change.id)
            elif isinstance(change, TruncateChange):
                truncated = True
        return cls(tuple(inserted), tuple(updated), tuple(deleted), truncated)

    def merge(self, later: FamilyChanges) -> FamilyChanges:
        """This family's changes followed by ``later``'s (ids kept once, first seen first)."""
        return FamilyChanges(
            _union(self.inserted, later.inserted),
            _union(self.updated, later.updated),
            _union(self.deleted, later.deleted),
            self.truncated or later.truncated,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "inserted": list(self.inserted),
            "updated": list(self.updated),
            "deleted": list(self.deleted),
            "truncated": self.truncated,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FamilyChanges:
        return cls(
            _ids(doc.get("inserted")),
            _ids(doc.get("updated")),
            _ids(doc.get("deleted")),
            doc.get("truncated") is True,
        )


def _union(first: tuple[str, ...], second: tuple[str, ...]) -> tuple[str, ...]:
    if not second:
        return first
    return tuple(dict.fromkeys(first + second))


def _ids(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise ValueError("a list of ids expected")
    return tuple(value)


_NO_CHANGES: Final = FamilyChanges()


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """What one commit (or several, folded) changed inside a thread.

    Built from the commit's own changes (:meth:`of_commit`), so it names what
    the commit wrote, not what the thread looks like: ``messages``, ``runs``
    and ``queued_items`` are the ids inserted, updated (replaced) and deleted;
    ``lease`` is true when the commit acquired, renewed or released the lease.
    The root's own fields (title, metadata, visibility) are in
    :attr:`ThreadChange.thread`.
    """

    messages: FamilyChanges = _NO_CHANGES
    runs: FamilyChanges = _NO_CHANGES
    queued_items: FamilyChanges = _NO_CHANGES
    lease: bool = False

    @classmethod
    def of_commit(cls, commit: CommitThreadInput) -> ChangeSet | None:
        """What a committed create or update changed (``None`` for a delete)."""
        mutation = commit.mutation
        if isinstance(mutation, DeleteMutation):
            return None
        changes = mutation.changes
        if changes is None:
            return cls()
        families = [FamilyChanges.of(spec.changes(changes)) for spec in FAMILIES]
        messages, runs, queued = families  # FAMILIES' order: messages, runs, queued items
        return cls(messages, runs, queued, changes.lease is not None)

    def merge(self, later: ChangeSet) -> ChangeSet:
        """This change set followed by ``later``'s."""
        return ChangeSet(
            self.messages.merge(later.messages),
            self.runs.merge(later.runs),
            self.queued_items.merge(later.queued_items),
            self.lease or later.lease,
        )

    def to_json(self) -> dict[str, Any]:
        """``{"messages": {...}, "runs": {...}, "queuedItems": {...}, "lease": bool}``."""
        return {
            "messages": self.messages.to_json(),
            "runs": self.runs.to_json(),
            "queuedItems": self.queued_items.to_json(),
            "lease": self.lease,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ChangeSet:
        """The inverse of :meth:`to_json` (raises ``ValueError`` on another shape)."""
        return cls(
            FamilyChanges.from_json(doc["messages"]),
            FamilyChanges.from_json(doc["runs"]),
            FamilyChanges.from_json(doc["queuedItems"]),
            doc["lease"] is True,
        )


@dataclass(frozen=True, slots=True)
class CommitNote:
    """A commit made ``version`` and changed ``changes`` (what a push signal carries)."""

    version: ThreadVersion
    changes: ChangeSet

    @classmethod
    def of_commit(cls, commit: CommitThreadInput, thread: ThreadRecord | None) -> CommitNote | None:
        """The note of a committed create or update (``None`` for a delete)."""
        changes = ChangeSet.of_commit(commit)
        if thread is None or changes is None:
            return None
        return cls(thread.version, changes)


@dataclass(frozen=True, slots=True)
class ThreadChange:
    """A thread moved from ``previous`` to ``version`` (one commit or several coalesced).

    ``version`` is ``None`` (and ``deleted`` true) when the thread was deleted;
    ``committed_at`` is then ``None`` too. ``thread`` is the root as read at
    ``version``. ``commits`` is how many commits the change stands for when
    that is known (same incarnation on both sides), else ``None``.
    ``changed`` is what the commits changed inside the thread when the
    backend's signal told the watcher for every one of them, else ``None``
    (unknown: re-read the thread; always ``None`` for a deletion).
    """

    scope_key: str
    thread_id: str
    version: ThreadVersion | None
    previous: ThreadVersion | None
    deleted: bool
    committed_at: datetime | None
    thread: ThreadRecord | None
    changed: ChangeSet | None = None

    @property
    def commits(self) -> int | None:
        """Commits folded into this change (``None``: unknown, e.g. a new incarnation)."""
        old, new = self.previous, self.version
        if old is None or new is None or old.thread_instance_id != new.thread_instance_id:
            return None
        return new.revision - old.revision

    def to_json(self) -> dict[str, Any]:
        """The JSON form (camelCase, without the root's ``privateMetadata``)."""
        return {
            "scopeKey": self.scope_key,
            "threadId": self.thread_id,
            "version": None if self.version is None else self.version.to_json(),
            "previous": None if self.previous is None else self.previous.to_json(),
            "deleted": self.deleted,
            "committedAt": None if self.committed_at is None else _iso(self.committed_at),
            "commits": self.commits,
            "thread": None if self.thread is None else self.thread.public_json(),
            "changed": None if self.changed is None else self.changed.to_json(),
        }


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- signals


class ChangeSignal:
    """When a watcher looks at its thread again. This default polls.

    The watcher calls :meth:`start` once, then :meth:`arm` right before each
    read of the root and :meth:`wait` after it; a signal that knows of
    commits must make the next :meth:`wait` return early when one happens
    after :meth:`arm`. Returning early without a change is harmless (the
    watcher just reads again), and so is a wake-up that never comes (the
    watcher looks again after ``interval``): a signal decides the latency,
    never what is reported. After each read the watcher calls :meth:`take`
    for the notes of the commits the signal heard of.
    """

    async def start(self) -> None:
        """Before the first read: get ready to hear of commits (a push signal's listener)."""

    def arm(self) -> None:
        """A read of the root follows: forget the commits it will see."""

    async def wait(self, interval: float) -> None:
        """Return when the thread may have changed; at the latest after ``interval`` seconds."""
        await asyncio.sleep(interval)

    def take(self) -> Sequence[CommitNote]:
        """The notes heard since the last call, oldest first (this default hears none)."""
        return ()

    def close(self) -> None:
        """The watcher is done (release what :meth:`wait` needs)."""


class _EventSignal(ChangeSignal):
    def __init__(self, notifier: ChangeNotifier, key: Hashable) -> None:
        self._notifier = notifier
        self._key = key
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._notes: list[CommitNote] = []  # appended by any thread, taken by the watcher

    async def start(self) -> None:
        await self._notifier.ready()

    def arm(self) -> None:
        self._event.clear()

    async def wait(self, interval: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), interval)

    def take(self) -> Sequence[CommitNote]:
        with self._notifier.lock:
            notes, self._notes = self._notes, []
        return notes

    def close(self) -> None:
        self._notifier.forget(self._key, self)

    def fire(self, note: CommitNote | None) -> None:
        # Called by a commit, possibly on another thread or event loop; the
        # note is kept before the wake-up, so the read it causes finds it.
        if note is not None:
            with self._notifier.lock:
                self._notes.append(note)
                del self._notes[:-_MAX_NOTES]
        with contextlib.suppress(RuntimeError):  # the watcher's loop is closed
            self._loop.call_soon_threadsafe(self._event.set)


class ChangeNotifier:
    """Wakes the watchers of a thread, or of a scope, when told of a commit.

    A backend whose commits all pass through this process (the memory backend)
    keeps one, returns :meth:`signal` from ``ThreadStore._change_signal`` and
    calls :meth:`notify` after each commit, with the commit's
    :class:`CommitNote`. A push backend subclasses it: its listener calls
    :meth:`notify_key` for each message, :meth:`notify_all` when it (re)connects
    or loses its connection (the commits in between were not heard), and
    overrides :meth:`ready` (connect the listener) and :meth:`idle` (the last
    watcher left), and :meth:`key` when its messages name threads by another
    key. Safe across threads and event loops.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._signals: dict[Hashable, set[_EventSignal]] = {}

    def key(self, scope_key: str, thread_id: str | None) -> Hashable:
        """How a watcher of a thread (``thread_id=None``: of the scope) is found."""
        return (scope_key, thread_id)

    def signal(self, scope_key: str, thread_id: str | None) -> ChangeSignal:
        """A signal for one watcher (inside its event loop); ``thread_id=None``: the scope's."""
        key = self.key(scope_key, thread_id)
        signal = _EventSignal(self, key)
        with self.lock:
            self._signals.setdefault(key, set()).add(signal)
        return signal

    def notify(self, scope_key: str, thread_id: str, note: CommitNote | None = None) -> None:
        """A commit changed ``(scope_key, thread_id)``: wake its watchers and the scope's."""
        self.notify_key(self.key(scope_key, thread_id), note)
        self.notify_key(self.key(scope_key, None))

    def notify_key(self, key: Hashable, note: CommitNote | None = None) -> None:
        """Wake the watchers found by ``key``, handing them ``note``."""
        with self.lock:
            signals = list(self._signals.get(key, ()))
        for signal in signals:
            signal.fire(note)

    def notify_all(self) -> None:
        """Wake every watcher: commits may have gone unheard."""
        with self.lock:
            signals = [s for group in self._signals.values() for s in group]
        for signal in signals:
            signal.fire(None)

    @property
    def watched(self) -> bool:
        """Whether any watcher is listening."""
        with self.lock:
            return bool(self._signals)

    async def ready(self) -> None:
        """A watcher starts: be ready to hear of commits (push backends connect here)."""

    def idle(self) -> None:
        """The last watcher left (push backends may let their listener go)."""

    def forget(self, key: Hashable, signal: _EventSignal) -> None:
        with self.lock:
            signals = self._signals.get(key)
            if signals is not None:
                signals.discard(signal)
                if not signals:
                    del self._signals[key]
            left = bool(self._signals)
        if not left:
            self.idle()


class ListeningNotifier(ChangeNotifier):
    """A push backend's notifier whose listener is one task, started by :meth:`ready`.

    The subclass writes :meth:`_listen`, which follows the database until
    ``stop`` is set and sets ``listening`` once it hears every commit (and
    clears it when it loses that), or returns at once when it will not listen
    (the watchers poll). :meth:`ready` starts it when none runs (none yet, it
    ended, or it was told to stop), each start with new events, so a listener
    told to stop never sees a later start's; then it waits at most
    :attr:`ready_wait` seconds for ``listening`` or the listener's end: a
    server that is down must not hold the watcher, which polls meanwhile.
    :meth:`idle` and ``close`` stay the subclass's (``self._stop``,
    ``self._task``).
    """

    ready_wait: float = 1.0
    """Seconds a starting watcher waits for the listener before it reads (then it polls)."""

    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._listening = asyncio.Event()

    @property
    def listener_name(self) -> str:
        """The listener task's name."""
        return "pai-storage listener"

    async def ready(self) -> None:
        """Start the listener if nobody listens yet; wait (briefly) until it listens
        (or ends: it will not listen)."""
        if self._task is None or self._task.done() or self._stop.is_set():
            self._stop = asyncio.Event()
            self._listening = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(
                self._listen(self._stop, self._listening), name=self.listener_name
            )
        listening = asyncio.ensure_future(self._listening.wait())
        try:
            ended = {listening, self._task}
            await asyncio.wait(ended, timeout=self.ready_wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            listening.cancel()

    async def _listen(self, stop: asyncio.Event, listening: asyncio.Event) -> None:
        """Follow the database's changes until ``stop`` is set (reconnecting as needed)."""
        raise NotImplementedError


# ---------------------------------------------------------------- validation


def check_interval(interval: object) -> float:
    """Validate a watch interval: seconds, a finite number > 0."""
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        raise ThreadStoreInvariantError(f"interval must be seconds (a number), not {interval!r}")
    if not (math.isfinite(interval) and interval > 0):
        raise ThreadStoreInvariantError(f"interval must be finite seconds > 0, not {interval!r}")
    return float(interval)


def check_version(after: object) -> ThreadVersion | None:
    """Validate ``after``: ``None``, a :class:`ThreadVersion` or its JSON form."""
    if after is None:
        return None
    if isinstance(after, ThreadVersion | Mapping):
        return ThreadVersion.model_validate(after)
    raise ThreadStoreInvariantError(
        f"after must be a ThreadVersion, its JSON form or None, not {type(after).__name__}"
    )


# ---------------------------------------------------------------- the loops


def _change(
    scope_key: str,
    thread_id: str,
    last: ThreadVersion | None,
    root: ThreadRecord | None,
    notes: _Notes | None = None,
) -> ThreadChange | None:
    """The change from ``last`` to ``root`` (``None``: nothing new to report)."""
    if root is None:
        if last is None:
            return None
        return ThreadChange(scope_key, thread_id, None, last, True, None, None)
    new = root.version
    if (
        last is not None
        and last.thread_instance_id == new.thread_instance_id
        and new.revision <= last.revision
    ):
        return None  # the same version, or an older one: never report backwards
    changed = None if notes is None else notes.covering(last, new)
    return ThreadChange(scope_key, thread_id, new, last, False, root.updated_at, root, changed)


class _Notes:
    """The commit notes a watcher heard, by version, until a change covers them."""

    def __init__(self) -> None:
        self._heard: dict[tuple[str, int], ChangeSet] = {}

    def add(self, notes: Sequence[CommitNote]) -> None:
        for note in notes:
            self._heard[(note.version.thread_instance_id, note.version.revision)] = note.changes
        if len(self._heard) > _MAX_NOTES:  # notes of versions never read: keep the newest
            for key in sorted(self._heard, key=lambda k: k[1])[: -_MAX_NOTES // 2]:
                del self._heard[key]

    def covering(self, last: ThreadVersion | None, new: ThreadVersion) -> ChangeSet | None:
        """The notes from ``last`` (exclusive) to ``new`` folded, if every one was heard.

        ``None`` across incarnations: the change folds a deletion, which has no
        note (a thread that did not exist, ``last=None``, is described from its
        creation). Forgets the notes up to ``new``: the next change starts after it.
        """
        instance = new.thread_instance_id
        same = last is not None and last.thread_instance_id == instance
        first = last.revision + 1 if last is not None and same else 1  # a create is revision 1
        merged: ChangeSet | None = None
        if (last is None or same) and new.revision - first < len(self._heard):
            for revision in range(first, new.revision + 1):
                heard = self._heard.get((instance, revision))
                if heard is None:
                    merged = None
                    break
                merged = heard if merged is None else merged.merge(heard)
        self._heard = {
            k: v for k, v in self._heard.items() if k[0] == instance and k[1] > new.revision
        }
        return merged


async def _retrying(signal: ChangeSignal, interval: float, look: Callable[[], Awaitable[T]]) -> T:
    """``await look()``, retrying an unavailable backend up to :data:`MAX_FAILURES` times."""
    failures = 0
    while True:
        try:
            return await look()
        except ThreadStoreUnavailableError:
            failures += 1
            if failures >= MAX_FAILURES:
                raise
            await signal.wait(interval)
            signal.arm()


async def watch_thread(
    store: ThreadStore,
    scope_key: str,
    thread_id: str,
    after: ThreadVersion | None,
    interval: float,
) -> AsyncGenerator[ThreadChange, None]:
    """The loop behind :meth:`ThreadStore.watch` (arguments validated by it)."""
    request = {"scopeKey": scope_key, "threadId": thread_id}
    notes = _Notes()

    async def look() -> ThreadRecord | None:
        thread = (await store.read_thread(request)).thread
        notes.add(signal.take())  # every note of a commit this read can see is here now
        return thread

    signal = store._change_signal(scope_key, thread_id)
    try:
        await signal.start()
        signal.arm()
        root = await _retrying(signal, interval, look)
        last = after if after is not None else (None if root is None else root.version)
        while True:
            change = _change(scope_key, thread_id, last, root, notes)
            if change is not None:
                last = change.version
                yield change
            await signal.wait(interval)
            signal.arm()
            root = await _retrying(signal, interval, look)
    finally:
        signal.close()


async def watch_scope(
    store: ThreadStore, scope_key: str, interval: float, include_hidden: bool
) -> AsyncGenerator[ThreadChange, None]:
    """The loop behind :meth:`ThreadStore.watch_scope` (arguments validated by it)."""
    seen: dict[str, ThreadVersion] = {}
    since: datetime | None = None
    # The newest update seen after each look of the last _LOOKBACK seconds (and
    # the one before them): a look lists down to the oldest, not to ``since``.
    marks: deque[tuple[float, datetime]] = deque()
    signal = store._change_signal(scope_key, None)
    first = True
    try:
        await signal.start()
        while True:
            signal.arm()
            down_to = marks[0][1] if marks else None
            roots = await _retrying(
                signal, interval, partial(_updated_since, store, scope_key, down_to, include_hidden)
            )
            signal.take()  # a scope's watcher gets no notes; keep none
            changes = []
            for root in reversed(roots):  # oldest update first
                previous = seen.get(root.thread_id)
                change = _change(scope_key, root.thread_id, previous, root)
                if change is not None:
                    seen[root.thread_id] = root.version
                    changes.append(change)
            if roots:
                # Only the threads of this window can be listed again unchanged.
                since = roots[0].updated_at if since is None else max(since, roots[0].updated_at)
                seen = {root.thread_id: root.version for root in roots}
                now = time.monotonic()
                marks.append((now, since))
                while len(marks) > 1 and marks[1][0] <= now - _LOOKBACK:
                    marks.popleft()
            if not first:
                for change in changes:
                    yield change
            first = False
            await signal.wait(interval)
    finally:
        signal.close()


async def _updated_since(
    store: ThreadStore, scope_key: str, since: datetime | None, include_hidden: bool
) -> list[ThreadRecord]:
    """Roots of the scope updated at or after ``since``, newest first (the first page: ``None``)."""
    request: dict[str, Any] = {"scopeKey": scope_key, "limit": _LIST_PAGE}
    if include_hidden:
        request["includeHidden"] = True
    found: list[ThreadRecord] = []
    while True:
        page = await store.list_threads(request)
        for root in page.items:
            if since is not None and root.updated_at < since:
                return found
            found.append(root)
        if since is None or page.next_page_token is None:
            return found
        request["pageToken"] = page.next_page_token
