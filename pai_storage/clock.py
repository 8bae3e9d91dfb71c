"""Clocks: the provider's time, and a controllable one for deterministic tests."""

from __future__ import annotations

import threading
import time
from collections import deque
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
    """The server's clock as this process has seen it, carried forward on the
    process's monotonic clock (so a step or slew of the local wall clock moves
    nothing).

    Every time the server returns was read before its reply arrived, so each
    observation is a lower bound of the server's clock at arrival; the clock
    keeps the highest (:meth:`observe`) until a prediction proves ahead of the
    server (:meth:`reset`). A caller that writes with a predicted time reports
    each write whose prediction was too far behind (:meth:`missed`) and each
    that was not (:meth:`hit`); :data:`MISSES` misses among the last
    :data:`OF` (a slow network) make :meth:`predict` give nothing for its next
    :data:`PAUSE` calls.
    """

    MISSES = 3
    OF = 8
    PAUSE = 64

    def __init__(self) -> None:
        self._offset: float | None = None  # server epoch seconds - monotonic seconds
        self._recent: deque[bool] = deque(maxlen=self.OF)
        self._paused = 0

    def observe(self, server_now: datetime) -> None:
        """Learn from a time the server just returned (kept if it says the server
        is further on than any time before it)."""
        offset = server_now.timestamp() - time.monotonic()
        if self._offset is None or offset > self._offset:
            self._offset = offset

    def reset(self, server_now: datetime) -> None:
        """Start again from this time (a prediction was ahead of the server)."""
        self._offset = None
        self.observe(server_now)

    def hit(self) -> None:
        self._recent.append(False)

    def missed(self) -> None:
        self._recent.append(True)
        if sum(self._recent) >= self.MISSES:
            self._recent.clear()
            self._paused = self.PAUSE

    def predict(self) -> datetime | None:
        """The server's clock now, to the millisecond; ``None`` before any
        observation and while paused."""
        if self._offset is None:
            return None
        if self._paused:
            self._paused -= 1
            return None
        return truncate_ms(datetime.fromtimestamp(time.monotonic() + self._offset, UTC))
