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
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .errors import ThreadStoreInvariantError, ThreadStoreUnavailableError
from .models import ThreadRecord, ThreadVersion

if TYPE_CHECKING:
    from .store import ThreadStore

__all__ = [
    "DEFAULT_INTERVAL",
    "ChangeNotifier",
    "ChangeSignal",
    "ThreadChange",
    "check_interval",
    "check_version",
    "watch_scope",
    "watch_thread",
]

DEFAULT_INTERVAL: Final = 0.2
"""Seconds between two looks at a watched thread when the backend only polls."""
MAX_FAILURES: Final = 10
"""Consecutive unavailable reads a watcher retries (one interval apart) before it raises."""
_LIST_PAGE: Final = 100
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ThreadChange:
    """A thread moved from ``previous`` to ``version`` (one commit or several coalesced).

    ``version`` is ``None`` (and ``deleted`` true) when the thread was deleted;
    ``committed_at`` is then ``None`` too. ``thread`` is the root as read at
    ``version``. ``commits`` is how many commits the change stands for when
    that is known (same incarnation on both sides), else ``None``.
    """

    scope_key: str
    thread_id: str
    version: ThreadVersion | None
    previous: ThreadVersion | None
    deleted: bool
    committed_at: datetime | None
    thread: ThreadRecord | None

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
        }


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- signals


class ChangeSignal:
    """When a watcher looks at its thread again. This default polls.

    The watcher calls :meth:`arm` right before each read of the root and then
    :meth:`wait`; a signal that knows of commits must make the next
    :meth:`wait` return early when one happens after :meth:`arm`. Returning
    early without a change is harmless (the watcher just reads again).
    """

    def arm(self) -> None:
        """A read of the root follows: forget the commits it will see."""

    async def wait(self, interval: float) -> None:
        """Return when the thread may have changed; at the latest after ``interval`` seconds."""
        await asyncio.sleep(interval)

    def close(self) -> None:
        """The watcher is done (release what :meth:`wait` needs)."""


class _EventSignal(ChangeSignal):
    def __init__(self, notifier: ChangeNotifier, key: tuple[str, str]) -> None:
        self._notifier = notifier
        self._key = key
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def arm(self) -> None:
        self._event.clear()

    async def wait(self, interval: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), interval)

    def close(self) -> None:
        self._notifier.forget(self._key, self)

    def fire(self) -> None:
        # Called by a commit, possibly on another thread or event loop.
        with contextlib.suppress(RuntimeError):  # the watcher's loop is closed
            self._loop.call_soon_threadsafe(self._event.set)


class ChangeNotifier:
    """Wakes the watchers of a thread when a commit in this process changes it.

    A backend whose commits all pass through this process (the memory backend)
    keeps one, returns :meth:`signal` from ``ThreadStore._change_signal`` and
    calls :meth:`notify` after each commit. Safe across threads and event loops.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signals: dict[tuple[str, str], set[_EventSignal]] = {}

    def signal(self, scope_key: str, thread_id: str) -> ChangeSignal:
        """A signal for one watcher of ``(scope_key, thread_id)`` (call inside its event loop)."""
        key = (scope_key, thread_id)
        signal = _EventSignal(self, key)
        with self._lock:
            self._signals.setdefault(key, set()).add(signal)
        return signal

    def notify(self, scope_key: str, thread_id: str) -> None:
        """A commit changed ``(scope_key, thread_id)``: wake its watchers."""
        with self._lock:
            signals = list(self._signals.get((scope_key, thread_id), ()))
        for signal in signals:
            signal.fire()

    def forget(self, key: tuple[str, str], signal: _EventSignal) -> None:
        with self._lock:
            signals = self._signals.get(key)
            if signals is not None:
                signals.discard(signal)
                if not signals:
                    del self._signals[key]


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
    scope_key: str, thread_id: str, last: ThreadVersion | None, root: ThreadRecord | None
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
    return ThreadChange(scope_key, thread_id, new, last, False, root.updated_at, root)


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

    async def look() -> ThreadRecord | None:
        return (await store.read_thread(request)).thread

    signal = store._change_signal(scope_key, thread_id)
    try:
        signal.arm()
        root = await _retrying(signal, interval, look)
        last = after if after is not None else (None if root is None else root.version)
        while True:
            change = _change(scope_key, thread_id, last, root)
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
    signal = ChangeSignal()
    first = True
    while True:
        roots = await _retrying(
            signal, interval, partial(_updated_since, store, scope_key, since, include_hidden)
        )
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
        if not first:
            for change in changes:
                yield change
        first = False
        await signal.wait(interval)


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
