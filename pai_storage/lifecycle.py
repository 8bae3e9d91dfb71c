"""What every store shares: common options, lazy initialize, close, clock, warnings.

The thread store and the runtime stores (key-value, agent state, snapshots,
execution guard) all derive from :class:`ManagedStore`:

- the common options ``clock`` and ``on_warning`` are checked here, once, and
  a bad value raises :class:`~pai_storage.ConfigurationError` when
  the store is made;
- ``initialize()`` is idempotent and also runs lazily on first use; concurrent
  first calls share one attempt, a cancelled caller does not cancel it, and a
  failed attempt is forgotten so the next call retries from scratch;
- ``close()`` is idempotent; a lazy initialize still running is cancelled and
  awaited first, so once ``close()`` returns nothing of the store is open and
  every later call raises a typed error;
- ``now()`` is the test clock's time, or ``None`` to use the provider's clock.

:func:`to_the_end` runs a write to its end whatever cancels its caller (the
conversation handles and the framework adapters use it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio

from .clock import Clock
from .errors import ConfigurationError
from .events import StoreWarning, WarningCallback, emit_warning
from .fields import truncate_ms

__all__ = ["ManagedStore", "to_the_end"]

T = TypeVar("T")


class ManagedStore:
    """Lifecycle and common options of every pai-storage store.

    Parameters
    ----------
    clock:
        Test-only clock override (a callable returning an aware UTC datetime);
        production uses the provider's clock.
    on_warning:
        Receives recoverable integrity warnings (:class:`StoreWarning`); a
        plain function or a coroutine function. Failures in it are ignored.
    """

    backend_name: str = "custom"
    configuration_error: type[ConfigurationError] = ConfigurationError
    """The error class for bad options and use after close (the thread store
    raises its own subclass, :class:`ThreadStoreConfigurationError`)."""

    def __init__(
        self, *, clock: Clock | None = None, on_warning: WarningCallback | None = None
    ) -> None:
        if clock is not None and not callable(clock):
            raise self.configuration_error(
                "option clock must be a callable returning an aware UTC datetime"
            )
        if on_warning is not None and not callable(on_warning):
            raise self.configuration_error(
                "option on_warning must be a function or a coroutine function"
            )
        self.clock = clock
        self.on_warning = on_warning
        self._init_task: asyncio.Future[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._initialized = False
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    async def initialize(self) -> None:
        """Connect and prepare the backend. Idempotent; also run lazily on first use.

        Concurrent first calls share one attempt; a failed attempt is forgotten,
        so the next call retries from scratch.
        """
        if self._closed:
            raise self._closed_error()
        if self._initialized:
            return
        task = self._init_task
        if task is None:
            task = self._init_task = asyncio.ensure_future(self._initialize_once())
            task.add_done_callback(self._forget_failed_attempt)
        try:
            # Shielded: a cancelled caller does not cancel the attempt others share.
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if self._closed and task.cancelled():
                # close() stopped the attempt this caller was waiting for.
                raise self._closed_error() from None
            raise

    def _forget_failed_attempt(self, task: asyncio.Future[None]) -> None:
        # Whether or not anyone still waits for it (its callers may all have been
        # cancelled), a failed attempt is forgotten: the next call retries afresh.
        failed = task.cancelled() or task.exception() is not None
        if failed and self._init_task is task:
            self._init_task = None

    async def _initialize_once(self) -> None:
        await self._initialize()
        if self._closed:  # closed while the last step ran: release what it made
            await self._close()
            raise self._closed_error()
        self._initialized = True

    async def close(self) -> None:
        """Release connections. Idempotent; the store cannot be used afterwards.

        A lazy initialize still running is cancelled and awaited first (a
        backend's ``_initialize`` releases whatever it created when
        cancelled), so once ``close()`` returns nothing of the store is open
        and every later call raises :class:`ConfigurationError`.
        """
        if self._closing is None:
            self._closed = True
            self._closing = asyncio.ensure_future(self._close_once())
        # Every caller (a second close() too) returns only once everything is
        # released; a cancelled caller does not stop the release.
        await asyncio.shield(self._closing)

    async def _close_once(self) -> None:
        task = self._init_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # never raises: the outcome stays with the task
        await self._close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def __aenter__(self) -> Self:
        await self.initialize()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ for backends

    def now(self) -> datetime | None:
        """The test clock's time (ms precision), or ``None`` to use the provider's."""
        if self.clock is None:
            return None
        value = self.clock()
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise self.configuration_error(
                "the clock option returned something other than an aware datetime"
            )
        return truncate_ms(value)

    def _closed_error(self) -> ConfigurationError:
        return self.configuration_error("this store is closed; open a new one")

    async def warn(self, warning: StoreWarning) -> None:
        """Report a recoverable problem through ``on_warning`` (best effort)."""
        await emit_warning(self.on_warning, warning)

    async def _ensure_ready(self) -> None:
        if not self._initialized or self._closed:
            await self.initialize()

    async def _initialize(self) -> None:
        """Connect and create or verify the schema. Default: nothing to do."""

    async def _close(self) -> None:
        """Release resources. Default: nothing to do."""


async def to_the_end(
    work: Coroutine[Any, Any, T],
) -> tuple[asyncio.Task[T], asyncio.CancelledError | None]:
    """Run ``work`` in a task of its own and wait until it has ended, whatever
    cancels the caller meanwhile: a write once begun is never cut short.

    Returns the ended task and the caller's cancellation that came meanwhile
    (``None``: none), for the caller to raise once it has dealt with the
    outcome. It holds off both kinds of cancellation: anyio's (a cancel scope,
    e.g. a web server's request timeout), by a shielded scope, which then
    cancels the caller at its next ``await``; and asyncio's own
    ``Task.cancel()`` (a task group, a server shutting down, a second cancel),
    which a shielded scope does not stop, by waiting again.

    A write that never ends (no statement timeout, a lost network) holds its
    caller, cancelled or not: bound writes with the backend's timeouts.
    """
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError as err:
                cancelled = err
    return task, cancelled
