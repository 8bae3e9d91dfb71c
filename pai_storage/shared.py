"""One driver client shared by the stores of a ``connect()`` call, and its users.

A backend whose stores share one connection pool or driver client derives its
holder from :class:`SharedClient`, which runs the whole lifecycle once:

- each store takes the holder shared by its ``connect()`` call or makes its
  own (:meth:`SharedClient.shared_or_made`), counts itself as a user with
  :meth:`SharedClient.attach` when it is made and calls
  :meth:`SharedClient.release` once from its ``_close``; when the last user
  has released the holder, the driver object is closed if the holder made it
  (an application's own pool or client is never closed);
- :meth:`SharedClient._ready` connects on first call: concurrent callers share
  one attempt, a cancelled caller does not cancel it, and a failed attempt is
  forgotten (whatever it made is closed) so the next call retries afresh;
- the last release cancels an attempt still running and waits for it, so once
  ``release()`` returns nothing the holder made is left open; every later call
  raises the "closed" error.

The backend supplies three primitives, the only code that touches its driver:
``_make()`` builds the driver object (or returns the application's own),
``_connect(made)`` connects it and prepares what the stores need (schema,
a server check), and ``_disconnect(made, failed=...)`` closes one the holder
made. See ``docs/backend-authors.md``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Generic, Self, TypeVar

from .errors import ThreadStoreConfigurationError

__all__ = ["SharedClient", "closed_error"]

T = TypeVar("T")


def closed_error() -> ThreadStoreConfigurationError:
    """What an operation that outlived its store's ``close()`` raises."""
    return ThreadStoreConfigurationError("this store is closed; open a new one")


class SharedClient(ABC, Generic[T]):
    """A lazily connected driver object ``T``, counted users, close-when-last.

    Parameters
    ----------
    owned:
        Whether the holder makes the driver object itself (and so closes it);
        ``False`` when the application gave its own, which is never closed.
    """

    def __init__(self, *, owned: bool) -> None:
        self._owned = owned
        self._made: T | None = None
        self._opening: asyncio.Future[T] | None = None
        self._users = 0
        self._closed = False

    # ------------------------------------------------------------ primitives

    @abstractmethod
    def _make(self) -> T:
        """The driver object, not yet connected (the application's own when given).

        Runs inside the shared attempt; nothing awaited here, so whatever is
        built is always handed to :meth:`_connect` or :meth:`_disconnect`.
        """

    @abstractmethod
    async def _connect(self, made: T) -> None:
        """Connect ``made`` and prepare it for the stores; raise a contract error if not."""

    @abstractmethod
    async def _disconnect(self, made: T, *, failed: bool) -> None:
        """Close a driver object the holder made.

        ``failed`` is true when :meth:`_connect` failed or was cancelled part
        way (drop everything at once), false on the last release (close
        cleanly). Called only for an object the holder owns; never raises an
        ``Exception``.
        """

    # ------------------------------------------------------------ users

    @classmethod
    def shared_or_made(
        cls, client: object, options: Mapping[str, Any], make: Callable[..., Self]
    ) -> Self:
        """The holder a store is to use: ``client`` itself when it is one, else ``make(**options)``.

        A store's ``client=`` is the holder the stores of one ``connect()``
        call share, an application's own driver object, or ``None``; with a
        shared holder no client option may be given (it was made with its
        own), so any in ``options`` is a configuration error. The caller
        counts itself with :meth:`attach` once it keeps the holder.
        """
        if isinstance(client, cls):
            if options:
                raise ThreadStoreConfigurationError(
                    f"option(s) {', '.join(sorted(options))} cannot be combined with a shared "
                    "client; give them where the client is made"
                )
            return client
        return make(**options)

    def attach(self) -> None:
        """Count one more store using this holder (each calls :meth:`release` once)."""
        if self._closed:
            raise closed_error()
        self._users += 1

    async def release(self) -> None:
        """One store is done; the last one closes what the holder made.

        A connection attempt still running is cancelled and awaited (it closes
        whatever it made). An application's own driver object is never closed.
        """
        self._users -= 1
        if self._users > 0 or self._closed:
            return
        self._closed = True
        task, self._opening = self._opening, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # never raises: the outcome stays with the task
        made, self._made = self._made, None
        if made is not None and self._owned:
            await self._disconnect(made, failed=False)

    @property
    def closed(self) -> bool:
        """Whether every user has released the holder."""
        return self._closed

    # ------------------------------------------------------------ the connection

    async def _ready(self) -> T:
        """The connected driver object (on first call: create and connect it).

        Concurrent callers share one attempt; a cancelled caller does not
        cancel it; a failed attempt is forgotten so the next call retries.
        """
        if self._closed:
            raise closed_error()
        if self._made is not None:
            return self._made
        task = self._opening
        if task is None:
            task = self._opening = asyncio.ensure_future(self._open())
            task.add_done_callback(self._forget_failed)
        try:
            # Shielded: a cancelled caller does not cancel the attempt others share.
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if self._closed and task.cancelled():
                # The last release stopped the attempt this caller waited for.
                raise closed_error() from None
            raise

    def _forget_failed(self, task: asyncio.Future[Any]) -> None:
        # Whether or not anyone still waits for it (its callers may all have been
        # cancelled), a failed attempt is forgotten and its exception marked seen.
        failed = task.cancelled() or task.exception() is not None
        if failed and self._opening is task:
            self._opening = None

    async def _open(self) -> T:
        made = self._make()
        try:
            await self._connect(made)
        except BaseException:
            if self._owned:
                await self._disconnect(made, failed=True)
            raise
        self._made = made
        return made
