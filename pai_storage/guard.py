"""The execution guard: a distributed lock with leases, a watchdog and fencing tokens.

An :class:`ExecutionGuard` keeps two workers from driving one resource (a
sandbox, say) at once. The user guide is ``docs/guard.md``.

Everything that is the same for every backend lives here, once: argument
checks, the wait loop of :meth:`ExecutionGuard.acquire` (a retry every
``retry_interval`` with jitter, until ``lock_timeout``), the watchdog that
renews each held lock every ``lease_ttl / 3``, lost-lock detection and the
``on_lost`` callback, and releasing everything on :meth:`ExecutionGuard.close`.

Leases are also timed here, on this process's monotonic clock, from when the
request that granted or renewed one was sent (the server granted it no
earlier, so it lasts at least ``lease_ttl`` from then): a grant that comes
back after that is never handed out, and a held lock is marked lost at that
deadline unless a renewal answered first, whatever the server is doing.
A backend supplies five primitives that act atomically on the server, compare
the lock's token there and judge expiry on the server's clock:
:meth:`~ExecutionGuard._acquire`, :meth:`~ExecutionGuard._renew`,
:meth:`~ExecutionGuard._release`, :meth:`~ExecutionGuard._inspect` and
:meth:`~ExecutionGuard._purge_expired`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import random
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Final
from uuid import uuid4

from .clock import Clock
from .errors import (
    InvalidInputError,
    LockTimeoutError,
    StorageError,
)
from .events import WarningCallback
from .models import StoreModel
from .runtime import RuntimeStore, check_duration, check_name, option_duration

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_RETRY_INTERVAL",
    "ExecutionGuard",
    "Lock",
    "LockInfo",
    "LostCallback",
]

_log = logging.getLogger("pai_storage")

DEFAULT_LOCK_TIMEOUT: Final = timedelta(minutes=30)
"""How long :meth:`ExecutionGuard.acquire` waits for a busy resource by default."""
DEFAULT_LEASE_TTL: Final = timedelta(minutes=30)
"""How long a lock lives without renewal by default."""
DEFAULT_RETRY_INTERVAL: Final = timedelta(milliseconds=500)
"""How often a waiting :meth:`ExecutionGuard.acquire` tries again by default."""

_JITTER: Final = 0.2
"""Each wait is ``retry_interval`` times a random factor in [0.8, 1.2]: waiters spread out."""
_MIN_RENEW_SECONDS: Final = 0.001
"""Floor of the watchdog period, so a tiny ``lease_ttl`` cannot make it spin."""

_WATCHDOG_PREFIX: Final = "pai-storage-guard-watchdog"


class _Late(enum.Enum):
    LATE = "late"


_LATE: Final = _Late.LATE
"""What an acquisition attempt gives when its grant came back after its lease ended."""


class LockInfo(StoreModel):
    """What anyone may know about a held lock; never its secret token.

    Attributes
    ----------
    resource:
        The locked resource.
    owner:
        The holder's self-description (a worker id); informational only.
    fencing_token:
        The acquisition's number: strictly greater than that of every earlier
        acquisition in this store, of any resource.
    acquired_at:
        When the lock was acquired (the server's clock, ms precision).
    expires_at:
        When the lease runs out unless renewed.
    """

    resource: str
    owner: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime


LostCallback = Callable[["Lock"], Awaitable[None] | None]
"""``on_lost(lock)``: a plain function or a coroutine function; failures are ignored."""


class Lock:
    """One acquisition of a resource, held until released, lost or the guard closes.

    Attributes
    ----------
    resource, owner:
        As passed to the guard.
    token:
        A random secret (uuid4 hex), fresh for every acquisition. Renewals and
        the release act only while the stored lock carries this token.
    fencing_token:
        Strictly increasing across every acquisition of the store, expiry and
        purges included: hand it to downstream systems so they can refuse
        writes from a holder whose lock was taken over.
    acquired_at:
        When the lock was acquired (the server's clock).
    expires_at:
        The lease deadline on the server's clock; moved forward by each renewal.
    lease_ttl:
        The lease length each renewal grants.
    lost:
        Set when the lock stops being held other than by :meth:`release`: the
        lease ran out, someone else took the resource, the watchdog got no
        answer from the server before the lease ended (counted on this
        process's monotonic clock from when the last successful request was
        sent; set at that instant, not when a stuck call returns), or the
        guard was closed.
    """

    __slots__ = (
        "_done",
        "_granted_at",
        "_guard",
        "_on_lost",
        "_watchdog",
        "acquired_at",
        "expires_at",
        "fencing_token",
        "lease_ttl",
        "lost",
        "owner",
        "resource",
        "token",
    )

    def __init__(
        self,
        guard: ExecutionGuard,
        info: LockInfo,
        token: str,
        lease_ttl: timedelta,
        on_lost: LostCallback | None,
        granted_at: float,
    ) -> None:
        self._guard = guard
        self.resource = info.resource
        self.owner = info.owner
        self.token = token
        self.fencing_token = info.fencing_token
        self.acquired_at = info.acquired_at
        self.expires_at = info.expires_at
        self.lease_ttl = lease_ttl
        self.lost = asyncio.Event()
        self._on_lost = on_lost
        self._watchdog: asyncio.Future[None] | None = None
        self._done = False  # released, lost or closed: this object holds nothing any more
        # When (event-loop clock) the request behind the current lease was sent:
        # the server granted the lease no earlier, so it lasts at least until
        # _granted_at + lease_ttl as seen from here.
        self._granted_at = granted_at

    def __repr__(self) -> str:  # the token is a secret: never shown
        state = "lost" if self.lost.is_set() else "released" if self._done else "held"
        return (
            f"Lock(resource={self.resource!r}, owner={self.owner!r}, "
            f"fencing_token={self.fencing_token}, expires_at={self.expires_at.isoformat()}, "
            f"{state})"
        )

    async def release(self) -> bool:
        """Release the lock; ``False`` when it was no longer held by this acquisition.

        Stops the watchdog first. Idempotent: only the first call can return
        ``True``. Never releases a lock someone else acquired since.

        Raises
        ------
        UnavailableError
            The server could not be reached; the lock expires with its lease.
        """
        if self._done:
            return False
        self._done = True
        await self._guard._forget(self)
        await self._guard._ensure_ready()
        return await self._guard._release(self.resource, self.token)

    async def renew(self) -> bool:
        """Extend the lease by ``lease_ttl`` now; the watchdog does this on its own.

        Returns ``False`` (and marks the lock lost) when the lock is no longer
        held by this acquisition.

        Raises
        ------
        UnavailableError
            The server could not be reached; nothing changed.
        """
        if self._done:
            return False
        await self._guard._ensure_ready()
        sent = asyncio.get_running_loop().time()
        expires_at = await self._guard._renew(self.resource, self.token, self.lease_ttl)
        if expires_at is None:
            await self._guard._mark_lost(self)
            return False
        if self._done:  # lost meanwhile (its lease ended here first) or released
            return False
        self.expires_at = expires_at
        self._granted_at = max(self._granted_at, sent)
        return True


class ExecutionGuard(RuntimeStore):
    """A distributed lock: one holder per resource, leases renewed by a watchdog.

    Invariants every backend keeps (checked by the conformance suite):

    - at most one unexpired lock per resource; of N concurrent
      :meth:`try_acquire` calls on a free resource exactly one succeeds;
    - a lock whose ``expires_at`` has been reached (on the server's clock) is
      free at once, for every operation, whether or not it was purged;
    - renewal and release act only while the stored token is the caller's, so
      a holder whose lock expired never renews or releases its successor's;
    - ``fencing_token`` strictly increases across all acquisitions of the
      store, whatever expired or was purged in between.

    Locks are not re-entrant: a second acquisition of a held resource waits
    (or fails), whatever the owner.

    Parameters
    ----------
    lock_timeout:
        How long :meth:`hold` and :meth:`acquire` wait for a busy resource
        (default 30 minutes).
    lease_ttl:
        A lock's lifetime without renewal (default 30 minutes); the watchdog
        renews every ``lease_ttl / 3``.
    retry_interval:
        How often a waiting acquisition tries again, with ±20% jitter
        (default 0.5 s).
    clock, on_warning, token_secret:
        The common store options.

    Raises
    ------
    ConfigurationError
        A duration option that is not a :class:`timedelta` of 1 ms or more.
    """

    def __init__(
        self,
        *,
        lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
        lease_ttl: timedelta = DEFAULT_LEASE_TTL,
        retry_interval: timedelta = DEFAULT_RETRY_INTERVAL,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning, token_secret=token_secret)
        self.lock_timeout = option_duration("lock_timeout", lock_timeout, optional=False)
        self.lease_ttl = option_duration("lease_ttl", lease_ttl, optional=False)
        self.retry_interval = option_duration("retry_interval", retry_interval, optional=False)
        self._held: dict[str, Lock] = {}  # by token: what close() must release
        self._tasks: set[asyncio.Future[None]] = set()  # watchdogs and orphan releases

    # ------------------------------------------------------------ public API

    @asynccontextmanager
    async def hold(
        self,
        resource: str,
        *,
        owner: str,
        lock_timeout: timedelta | None = None,
        lease_ttl: timedelta | None = None,
        retry_interval: timedelta | None = None,
        on_lost: LostCallback | None = None,
    ) -> AsyncIterator[Lock]:
        """Hold ``resource`` for the ``async with`` block; waits like :meth:`acquire`.

        The lock is released when the block exits, however it exits. Watch
        ``lock.lost`` (or pass ``on_lost``) to stop work whose lock was lost.

        Raises
        ------
        InvalidInputError
            A bad resource, owner, duration or callback; nothing was written.
        LockTimeoutError
            The resource stayed busy for ``lock_timeout``.
        UnavailableError
            The server could not be reached.
        """
        lock = await self.acquire(
            resource,
            owner=owner,
            lock_timeout=lock_timeout,
            lease_ttl=lease_ttl,
            retry_interval=retry_interval,
            on_lost=on_lost,
        )
        body_failed = False
        try:
            yield lock
        except BaseException:
            body_failed = True
            raise
        finally:
            try:
                await lock.release()
            except StorageError:
                if not body_failed:
                    raise
                # The body's own error matters more; the lease runs out anyway.
                _log.debug("releasing %r after an error failed", lock, exc_info=True)

    async def acquire(
        self,
        resource: str,
        *,
        owner: str,
        lock_timeout: timedelta | None = None,
        lease_ttl: timedelta | None = None,
        retry_interval: timedelta | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lock:
        """Acquire ``resource``, waiting up to ``lock_timeout`` while it is busy.

        ``None`` for a duration means the guard's default. The returned lock is
        renewed by a watchdog until :meth:`Lock.release` or :meth:`close`.

        Raises
        ------
        InvalidInputError
            A bad resource, owner, duration or callback; nothing was written.
        LockTimeoutError
            The resource stayed busy for ``lock_timeout``; the message names the
            resource and the timeout.
        UnavailableError
            The server could not be reached.
        """
        resource, owner = _names(resource, owner)
        timeout = check_duration("lock_timeout", lock_timeout) or self.lock_timeout
        lease = check_duration("lease_ttl", lease_ttl) or self.lease_ttl
        retry = check_duration("retry_interval", retry_interval) or self.retry_interval
        _check_callback(on_lost)
        await self._ensure_ready()  # connecting does not count against lock_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout.total_seconds()
        while True:
            lock = await self._attempt(resource, owner, lease, on_lost)
            if isinstance(lock, Lock):
                return lock
            remaining = deadline - loop.time()
            if remaining <= 0:
                why = (
                    f"the last grant came back after its lease_ttl {_seconds(lease)} had run "
                    "out (a lease must outlast a round trip to the server)"
                    if lock is _LATE
                    else "it is held by another acquisition"
                )
                raise LockTimeoutError(
                    f"could not acquire the lock on resource {resource!r} within "
                    f"lock_timeout {_seconds(timeout)}: {why}"
                )
            pause = retry.total_seconds() * random.uniform(1 - _JITTER, 1 + _JITTER)
            await asyncio.sleep(min(pause, remaining))

    async def try_acquire(
        self,
        resource: str,
        *,
        owner: str,
        lease_ttl: timedelta | None = None,
        on_lost: LostCallback | None = None,
    ) -> Lock | None:
        """Acquire ``resource`` if it is free now, else return ``None`` at once.

        Also ``None`` when the server's grant came back after ``lease_ttl`` had
        run out (counted from when the request was sent): such a lock may be
        someone else's by then, so it is given back rather than returned.

        Raises
        ------
        InvalidInputError
            A bad resource, owner, duration or callback; nothing was written.
        UnavailableError
            The server could not be reached.
        """
        resource, owner = _names(resource, owner)
        lease = check_duration("lease_ttl", lease_ttl) or self.lease_ttl
        _check_callback(on_lost)
        lock = await self._attempt(resource, owner, lease, on_lost)
        return lock if isinstance(lock, Lock) else None

    async def inspect(self, resource: str) -> LockInfo | None:
        """Who holds ``resource`` now, or ``None`` when it is free (expired counts as free).

        Raises
        ------
        InvalidInputError
            A bad resource name.
        UnavailableError
            The server could not be reached.
        """
        resource = check_name("resource", resource)
        await self._ensure_ready()
        return await self._inspect(resource)

    async def purge_expired(self) -> int:
        """Delete expired locks; returns how many. Fencing tokens are never reused.

        Raises
        ------
        UnavailableError
            The server could not be reached.
        """
        await self._ensure_ready()
        return await self._purge_expired()

    async def close(self) -> None:
        """Release every lock this guard holds, stop every watchdog, then close.

        Each lock released this way is marked lost (``lost`` set, ``on_lost``
        called): its holder no longer holds it. A release that cannot reach
        the server is skipped; that lock expires with its lease. Idempotent.
        """
        if self.closed:
            return
        locks = list(self._held.values())
        for lock in locks:
            lock._done = True
            await self._forget(lock)
        for lock in locks:
            try:
                await self._release(lock.resource, lock.token)
            except Exception:  # best effort: the lease runs out on its own
                _log.debug("releasing %r on close failed", lock, exc_info=True)
            await self._notify_lost(lock)
        # Whatever still runs (an on_lost callback, an abandoned acquisition's
        # release) is stopped: nothing of the guard outlives close().
        pending = [task for task in self._tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        await super().close()

    # ------------------------------------------------------------ backend primitives

    @abstractmethod
    async def _acquire(
        self, resource: str, owner: str, token: str, lease_ttl: timedelta
    ) -> LockInfo | None:
        """Atomically take ``resource`` if it has no lock or only an expired one.

        On success store ``token`` and ``owner``, stamp ``acquired_at = now``
        and ``expires_at = now + lease_ttl`` on the server's clock (ms
        precision), assign the next fencing token (strictly greater than any
        this store ever assigned, for any resource) and return the new lock's
        :class:`LockInfo`. Return ``None`` when an unexpired lock exists. Of
        concurrent calls on a free resource exactly one may succeed.

        The grant and its fencing token are **one atomic step** (one statement,
        one script or one transaction): no reader ever sees the lock without
        its token, and a crash leaves either both or neither. ``resource``,
        ``owner`` and ``token`` are data, never code: a database that reads
        strings as expressions (MongoDB's ``$field``) must quote them.

        The core times the request itself: a grant that comes back once
        ``lease_ttl`` has passed since the call began (this process's
        monotonic clock) is not handed out but released with
        :meth:`_release`, so the primitive need not check lateness.
        """

    @abstractmethod
    async def _renew(self, resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
        """Set ``expires_at = now + lease_ttl`` if the unexpired lock carries ``token``.

        Return the new ``expires_at``, or ``None`` when the lock is absent,
        expired or holds another token (then change nothing).

        The watchdog does not wait for a renewal past the lease's end as seen
        from this process: it marks the lock lost at that deadline and lets
        the call finish in the background (it need not stop when cancelled),
        releasing a lease it still obtained. So a renewal may land after its
        lock was declared lost, and must therefore match the token.
        """

    @abstractmethod
    async def _release(self, resource: str, token: str) -> bool:
        """Delete the lock if it is unexpired and carries ``token``; ``True`` if deleted.

        An expired lock with this token may be deleted too, but the answer is
        then ``False``: it was no longer held.
        """

    @abstractmethod
    async def _inspect(self, resource: str) -> LockInfo | None:
        """The unexpired lock on ``resource``, or ``None``."""

    @abstractmethod
    async def _purge_expired(self) -> int:
        """Delete every expired lock; return how many were deleted."""

    # ------------------------------------------------------------ internals

    async def _attempt(
        self, resource: str, owner: str, lease: timedelta, on_lost: LostCallback | None
    ) -> Lock | _Late | None:
        """One acquisition request: the lock, ``None`` when busy, or :data:`_LATE`.

        A grant answered once its lease may have ended (``lease`` after the
        request was sent, on this process's monotonic clock) is never returned:
        another worker may hold the resource by now. It is given back (the
        release matches its token, so it never frees a successor's lock).
        """
        await self._ensure_ready()  # also refuses a waiter whose guard was closed meanwhile
        token = uuid4().hex
        loop = asyncio.get_running_loop()
        sent = loop.time()
        request = asyncio.ensure_future(self._acquire(resource, owner, token, lease))
        try:
            # Shielded: a caller cancelled mid-request must not leave behind a
            # lock nobody holds for a whole lease (see _release_orphan).
            info = await asyncio.shield(request)
        except asyncio.CancelledError:
            self._track(asyncio.ensure_future(self._release_orphan(request, resource, token)))
            raise
        if info is None:
            return None
        late = loop.time() >= sent + lease.total_seconds()
        if late or self.closed:  # give the lock straight back
            with contextlib.suppress(Exception):
                await self._release(resource, token)
            await self._ensure_ready()  # closed while the request ran: the "closed" error
            _log.debug("a grant of %r came after its lease had run out here", resource)
            return _LATE
        lock = Lock(self, info, token, lease, on_lost, sent)
        self._held[token] = lock
        lock._watchdog = self._track(
            asyncio.create_task(self._watch(lock), name=f"{_WATCHDOG_PREFIX}:{info.fencing_token}")
        )
        return lock

    async def _release_orphan(
        self, request: asyncio.Future[LockInfo | None], resource: str, token: str
    ) -> None:
        """Release what a cancelled acquisition obtained, once its request ends."""
        try:
            if await request is not None:
                await self._release(resource, token)
        except Exception:  # best effort: the lease runs out on its own
            _log.debug("releasing an abandoned acquisition of %r failed", resource, exc_info=True)

    async def _watch(self, lock: Lock) -> None:
        """Renew ``lock`` every ``lease_ttl / 3`` until it is released or lost.

        Everything is timed on this process's monotonic clock from when the
        request behind the current lease was sent (``lock._granted_at``): a
        renewal is due a third of the lease after it, and the lease surely
        lasts until ``lock._granted_at + lease_ttl``. At that deadline the lock
        is lost, whatever the server is doing: a renewal still in flight is
        not waited for (a database call may not stop when cancelled) but left
        to finish in the background, and a lease it obtained all the same is
        given back. A renewal that fails is retried every ``retry_interval``
        until the deadline.
        """
        loop = asyncio.get_running_loop()
        ttl = lock.lease_ttl.total_seconds()
        period = max(ttl / 3, _MIN_RENEW_SECONDS)
        retry = min(self.retry_interval.total_seconds(), period)
        due = lock._granted_at + period
        while True:
            await asyncio.sleep(max(min(due, lock._granted_at + ttl) - loop.time(), 0.0))
            lease_end = lock._granted_at + ttl  # renew() may have moved it meanwhile
            sent = loop.time()
            if sent >= lease_end:
                break
            renewal = asyncio.ensure_future(self._renew(lock.resource, lock.token, lock.lease_ttl))
            try:
                await asyncio.wait({renewal}, timeout=lease_end - sent)
            except asyncio.CancelledError:  # released or closed: the renewal is not needed
                renewal.cancel()
                self._track(asyncio.ensure_future(self._settle(renewal, lock, give_back=False)))
                raise
            if not renewal.done():
                self._track(asyncio.ensure_future(self._settle(renewal, lock, give_back=True)))
                break
            try:
                expires_at = renewal.result()
            except Exception:  # unreachable or failing server: retry while the lease lasts
                _log.debug("renewing %r failed; retrying", lock, exc_info=True)
                due = loop.time() + retry
                continue
            if expires_at is None:
                break
            lock.expires_at = expires_at
            lock._granted_at = max(lock._granted_at, sent)
            due = sent + period
        await self._mark_lost(lock)

    async def _settle(
        self, renewal: asyncio.Future[datetime | None], lock: Lock, *, give_back: bool
    ) -> None:
        """Wait out a renewal the watchdog stopped waiting for.

        With ``give_back`` (the lock was lost at its deadline), a lease the
        renewal obtained all the same is released; otherwise (released or
        closed) the caller releases it.
        """
        try:
            if await renewal is not None and give_back:
                await self._release(lock.resource, lock.token)
        except asyncio.CancelledError:  # the renewal was cancelled (by close(), say)
            pass
        except Exception:  # best effort: the lease runs out on its own
            _log.debug("a renewal of %r abandoned at its deadline failed", lock, exc_info=True)

    async def _mark_lost(self, lock: Lock) -> None:
        if lock._done:
            return
        lock._done = True
        await self._forget(lock)
        await self._notify_lost(lock)

    async def _notify_lost(self, lock: Lock) -> None:
        lock.lost.set()
        callback = lock._on_lost
        if callback is None:
            return
        try:
            outcome = callback(lock)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:  # the holder's hook must never break the guard
            _log.debug("on_lost callback failed for %r", lock, exc_info=True)

    async def _forget(self, lock: Lock) -> None:
        """Stop tracking ``lock`` and stop its watchdog (unless called from it)."""
        self._held.pop(lock.token, None)
        task = lock._watchdog
        if task is None or task.done() or task is asyncio.current_task():
            return
        task.cancel()
        await asyncio.wait({task})

    def _track(self, task: asyncio.Future[None]) -> asyncio.Future[None]:
        """Keep a background task referenced until it ends, so close() can stop it."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _names(resource: object, owner: object) -> tuple[str, str]:
    return check_name("resource", resource), check_name("owner", owner)


def _check_callback(on_lost: object) -> None:
    if on_lost is not None and not callable(on_lost):
        raise InvalidInputError("on_lost must be a function or a coroutine function")


def _seconds(duration: timedelta) -> str:
    return f"{duration.total_seconds():g} s"
