"""Clocks: the provider's time, and a controllable one for deterministic tests."""

from __future__ import annotations

import threading
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
    """The server's clock as this process last saw it: the local clock's offset."""

    def __init__(self) -> None:
        self._offset: timedelta | None = None

    def observe(self, server_now: datetime) -> None:
        """Learn the offset from a time the server just returned.

        The reply took a moment to arrive, so the offset (and every time
        :meth:`predict` gives) runs behind the server's clock by about that
        moment, never ahead of it.
        """
        self._offset = server_now - datetime.now(UTC)

    def predict(self) -> datetime | None:
        """The server's clock now, to the millisecond (``None`` before any observation)."""
        if self._offset is None:
            return None
        return truncate_ms(datetime.now(UTC) + self._offset)
