"""Clocks: the provider's time, and a controllable one for deterministic tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .fields import truncate_ms

__all__ = ["Clock", "ManualClock", "ServerClock", "system_clock"]

Clock = Callable[[], datetime]
"""A callable returning an aware UTC datetime."""


def system_clock() -> datetime:
    """The process clock (the memory backend's authoritative clock)."""
    return datetime.now(UTC)


class ManualClock:
    """A test clock that moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = truncate_ms(start or datetime(2030, 1, 1, tzinfo=UTC))
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta | None = None, *, ms: int = 0) -> datetime:
        """Move forward by ``delta`` (or ``ms`` milliseconds); returns the new time."""
        with self._lock:
            self._now = self._now + (delta or timedelta()) + timedelta(milliseconds=ms)
            return self._now

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = truncate_ms(moment)


class ServerClock:
    """The server's clock as this process last saw it, carried forward on the
    process's monotonic clock (so a step or slew of the local wall clock moves
    nothing).

    A caller that writes with a predicted time reports each write whose
    prediction was too far behind (:meth:`missed`) and each that was not
    (:meth:`hit`); after :data:`MISSES` misses in a row (a slow network)
    :meth:`predict` gives nothing for its next :data:`PAUSE` calls.
    """

    MISSES = 3
    PAUSE = 64

    def __init__(self) -> None:
        self._seen: tuple[datetime, float] | None = None
        self._misses = 0
        self._paused = 0

    def observe(self, server_now: datetime) -> None:
        """Learn from a time the server just returned.

        The reply took a moment to arrive, so every time :meth:`predict` gives
        runs behind the server's clock by at least that moment.
        """
        self._seen = (server_now, time.monotonic())

    def hit(self) -> None:
        self._misses = 0

    def missed(self) -> None:
        self._misses += 1
        if self._misses >= self.MISSES:
            self._misses = 0
            self._paused = self.PAUSE

    def predict(self) -> datetime | None:
        """The server's clock now, to the millisecond; ``None`` before any
        observation and while paused."""
        if self._seen is None:
            return None
        if self._paused:
            self._paused -= 1
            return None
        server, at = self._seen
        return truncate_ms(server + timedelta(seconds=time.monotonic() - at))
