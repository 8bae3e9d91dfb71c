"""A PostgreSQL write transaction: ``BEGIN``, a body, ``COMMIT``; retried on serialization failures.

Commits, restores and forks run their body through :func:`run_transaction`;
a body returns :class:`_Abort` to roll back (then its error is raised or its
value returned). A serialization failure or deadlock rolls the attempt back
and runs it again, up to :data:`COMMIT_ATTEMPTS` times.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pai_storage.backend import StoreURL, map_errors
from pai_storage.errors import ThreadStoreError, ThreadStoreUnavailableError

from .client import terminate
from .errors import Phase, is_retryable, map_error

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]


COMMIT_ATTEMPTS = 3
"""Attempts for a commit that hits a serialization failure or deadlock."""

T = TypeVar("T")

Lease = Callable[[], contextlib.AbstractAsyncContextManager["asyncpg.Connection"]]
"""Where an attempt takes its pooled connection (the store's ``_connection``)."""


class _Retry(Exception):
    """Internal: a serialization failure or deadlock; the attempt is rolled back and retried."""


@dataclass(frozen=True, slots=True)
class _Abort:
    """What a transaction body returns to roll back: then ``error`` is raised, or
    ``value`` returned."""

    value: Any = None
    error: Exception | None = None


async def run_transaction(
    connection: Lease,
    url: StoreURL,
    body: Callable[[asyncpg.Connection], Awaitable[T | _Abort]],
    what: str,
) -> T:
    """Run ``body`` in one ``READ COMMITTED`` transaction, retried on a
    serialization failure or deadlock (:data:`COMMIT_ATTEMPTS` attempts)."""
    last: BaseException | None = None
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            return await _transaction_once(connection, url, body)
        except _Retry as retry:
            last = retry.__cause__
            await asyncio.sleep(0.005 * (attempt + 1))
    raise ThreadStoreUnavailableError(
        f"the {what} kept hitting serialization failures or deadlocks "
        f"({COMMIT_ATTEMPTS} attempts); nothing was applied"
    ) from last


async def _transaction_once(
    connection: Lease, url: StoreURL, body: Callable[[asyncpg.Connection], Awaitable[T | _Abort]]
) -> T:
    """One attempt: ``BEGIN``, ``body``, ``COMMIT`` (``ROLLBACK`` on :class:`_Abort`)."""
    attempt = _Attempt(url)
    async with connection() as conn:
        try:
            with map_errors(attempt.translate):
                await conn.execute("BEGIN")
                result = await body(conn)
                if isinstance(result, _Abort):
                    await conn.execute("ROLLBACK")
                else:
                    attempt.phase = "commit"
                    await conn.execute("COMMIT")
                    return result
        except _Retry:
            await _rollback(conn)
            raise
        except ThreadStoreError:
            if attempt.driver_failed:
                terminate(conn)  # the connection's state is unknown
            else:
                await _rollback(conn)  # a judgement error: the connection is fine
            raise
        # Cancelled mid-transaction: the lease terminates the connection.
    assert isinstance(result, _Abort)
    if result.error is not None:
        raise result.error
    return cast(T, result.value)


class _Attempt:
    """Error translation for one commit attempt: which phase, and whether the driver failed."""

    def __init__(self, url: StoreURL) -> None:
        self.url = url
        self.phase: Phase = "write"
        self.driver_failed = False

    def translate(self, exc: Exception) -> Exception:
        if is_retryable(exc):
            return _Retry()
        self.driver_failed = True
        return map_error(exc, self.phase, self.url)


async def _rollback(conn: asyncpg.Connection) -> None:
    try:
        if conn.is_closed():
            return
        await conn.execute("ROLLBACK")
    except Exception:
        terminate(conn)
