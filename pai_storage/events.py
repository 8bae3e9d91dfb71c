"""Recoverable integrity warnings and the best-effort callback that receives them."""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "HeldWarnings",
    "StoreWarning",
    "WarningCallback",
    "deliver_held_warnings",
    "emit_warning",
    "holding_warnings",
]

_log = logging.getLogger("pai_storage")


@dataclass(frozen=True, slots=True)
class StoreWarning:
    """A recoverable problem, e.g. a stored root ``list_threads`` had to skip.

    Never carries the stored document's contents (metadata may hold personal
    data): only its kind, identity when known, and a short reason.
    """

    kind: Literal["invalid_thread_skipped", "invalid_record"]
    reason: str
    scope_key: str | None = None
    thread_id: str | None = None
    namespace: tuple[str, ...] | None = None
    """The key-value namespace of an ``invalid_record`` item."""
    key: str | None = None
    """The key of an ``invalid_record`` key-value item."""
    snapshot_id: str | None = None
    """The id of an ``invalid_record`` snapshot (its scope is ``scope_key``)."""


WarningCallback = Callable[[StoreWarning], Awaitable[None] | None]


HeldWarnings = list[tuple["WarningCallback | None", StoreWarning]]
"""Warnings kept by :func:`holding_warnings`, with the callback each was for."""

_held = threading.local()


@contextlib.contextmanager
def holding_warnings(held: HeldWarnings) -> Iterator[None]:
    """Keep the warnings this thread emits inside the block in ``held`` instead of
    delivering them.

    For a backend that runs an operation outside the event loop (in its
    database's own thread): ``on_warning`` may be a coroutine function and
    expects the loop's thread, so the warnings are delivered afterwards, on
    the loop, by :func:`deliver_held_warnings`.
    """
    previous = getattr(_held, "warnings", None)
    _held.warnings = held
    try:
        yield
    finally:
        _held.warnings = previous


async def deliver_held_warnings(held: HeldWarnings) -> None:
    """Deliver what :func:`holding_warnings` kept, in the order it was emitted."""
    while held:
        callback, warning = held.pop(0)
        await emit_warning(callback, warning)


async def emit_warning(callback: WarningCallback | None, warning: StoreWarning) -> None:
    """Deliver ``warning``; a callback that raises (or whose coroutine fails) is ignored.

    Inside :func:`holding_warnings` (in its thread) it is kept for later instead.
    """
    held = getattr(_held, "warnings", None)
    if held is not None:
        held.append((callback, warning))
        return
    if callback is None:
        _log.warning("%s: %s", warning.kind, warning.reason)
        return
    try:
        outcome = callback(warning)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # a logging hook must never break storage reads
        _log.debug("on_warning callback failed", exc_info=True)
