"""Recoverable integrity warnings and the best-effort callback that receives them."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["StoreWarning", "WarningCallback", "emit_warning"]

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


async def emit_warning(callback: WarningCallback | None, warning: StoreWarning) -> None:
    """Deliver ``warning``; a callback that raises (or whose coroutine fails) is ignored."""
    if callback is None:
        _log.warning("%s: %s", warning.kind, warning.reason)
        return
    try:
        outcome = callback(warning)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # a logging hook must never break storage reads
        _log.debug("on_warning callback failed", exc_info=True)
