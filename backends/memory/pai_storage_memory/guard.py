"""The in-memory execution guard: locks in a dict, one lock, the store's own clock."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pai_storage.clock import system_clock
from pai_storage.fields import truncate_ms
from pai_storage.guard import ExecutionGuard, LockInfo

__all__ = ["MemoryExecutionGuard"]


@dataclass(slots=True)
class _Entry:
    token: str
    owner: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime

    def info(self, resource: str) -> LockInfo:
        return LockInfo(
            resource=resource,
            owner=self.owner,
            fencing_token=self.fencing_token,
            acquired_at=self.acquired_at,
            expires_at=self.expires_at,
        )


class MemoryExecutionGuard(ExecutionGuard):
    """Locks kept in process memory; the reference execution guard.

    Expiry is judged on the store's clock (the ``clock`` option, else the
    process clock, in whole milliseconds): a lock is free from the instant its
    ``expires_at`` is reached. Fencing tokens come from one counter that purges
    never reset. Nothing survives the process.

    Accepts the options of :class:`~pai_storage.guard.ExecutionGuard`
    (``lock_timeout``, ``lease_ttl``, ``retry_interval``) and the common ones
    (``clock``, ``on_warning``, ``token_secret``).
    """

    backend_name = "memory"
    token_prefix = "pai-memory"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._locks: dict[str, _Entry] = {}
        self._fencing = 0
        # Every critical section is synchronous: safe across event loops and threads.
        self._mutex = threading.Lock()

    def _clock(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    def _live(self, resource: str, now: datetime) -> _Entry | None:
        entry = self._locks.get(resource)
        return entry if entry is not None and _running(now, entry.expires_at) else None

    async def _acquire(
        self, resource: str, owner: str, token: str, lease_ttl: timedelta
    ) -> LockInfo | None:
        with self._mutex:
            now = self._clock()
            if self._live(resource, now) is not None:
                return None
            self._fencing += 1
            entry = _Entry(token, owner, self._fencing, now, truncate_ms(now + lease_ttl))
            self._locks[resource] = entry
            return entry.info(resource)

    async def _renew(self, resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
        with self._mutex:
            now = self._clock()
            entry = self._live(resource, now)
            if entry is None or entry.token != token:
                return None
            entry.expires_at = truncate_ms(now + lease_ttl)
            return entry.expires_at

    async def _release(self, resource: str, token: str) -> bool:
        with self._mutex:
            entry = self._locks.get(resource)
            if entry is None or entry.token != token:
                return False
            del self._locks[resource]
            return _running(self._clock(), entry.expires_at)

    async def _inspect(self, resource: str) -> LockInfo | None:
        with self._mutex:
            entry = self._live(resource, self._clock())
            return None if entry is None else entry.info(resource)

    async def _purge_expired(self) -> int:
        with self._mutex:
            now = self._clock()
            expired = [r for r, e in self._locks.items() if not _running(now, e.expires_at)]
            for resource in expired:
                del self._locks[resource]
            return len(expired)


def _running(now: datetime, expires_at: datetime) -> bool:
    """Whether a lease ending at ``expires_at`` still runs at ``now`` (it ends at that instant)."""
    return now < expires_at
