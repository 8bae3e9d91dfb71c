"""Clocks: the provider's time, and a controllable one for deterministic tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .fields import truncate_ms

__all__ = ["Clock", "ManualClock", "system_clock"]

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
