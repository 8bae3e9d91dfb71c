"""How a SQLite operation runs whole in one call on its ``sqlite3`` connection.

On SQLite engines the client made, :meth:`SqlClient.run_write
<pai_storage_sql.client.SqlClient.run_write>` hands a whole write (``BEGIN
IMMEDIATE``, the body's statements, ``COMMIT``) to :func:`in_thread`, which
runs it in one call in a thread of the client's executor, on the
connection's ``sqlite3`` connection through :class:`InlineDriver`.
``run_read`` runs a whole read (:func:`at_once`) the same way but on the
event loop, where it never waits for a lock: a held reader connection's
``busy_timeout`` is 0 between operations (:data:`BUSY_KEY`), and a read that
finds the database locked (:class:`Busy`) runs again in the thread, where it
waits (as do the reads that run statement by statement).

Invariants: the ``sqlite3`` connection is found once per connection, through
aiosqlite's public ``Cursor.connection``, and kept in SQLAlchemy's pool
``info`` (so it lives and dies with the pooled connection); the executor has
one thread per held connection, so each connection is used by one thread at
a time, and its aiosqlite thread is idle meanwhile; an operation whose caller
was cancelled is not begun, or (not yet committing) is rolled back, and the
caller waits (:func:`settled`) until the thread has let go of the connection;
a failed ``COMMIT`` is told apart (:class:`CommitFailed`) so it is mapped as
a commit's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pai_storage.backend import HeldWarnings, holding_warnings, run_sync

from .errors import is_busy, is_driver_failure

if TYPE_CHECKING:
    from .operation import Operation

__all__ = [
    "BUSY_KEY",
    "SQLITE3_KEY",
    "Abandoned",
    "Busy",
    "CommitFailed",
    "InlineDriver",
    "at_once",
    "call_failure",
    "find_sqlite3",
    "in_thread",
    "pool_info",
    "settled",
    "sqlite3_of",
    "thread_executor",
]

T = TypeVar("T")


class InlineDriver:
    """aiosqlite's connection as :class:`Operation` and :class:`CoreConnection`
    use it, over its ``sqlite3`` connection, in the call that runs a whole
    operation (:func:`in_thread`, :func:`at_once`).

    Every method is a coroutine that runs its statement at once and never
    suspends.
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    @property
    def in_transaction(self) -> bool:
        return self._raw.in_transaction

    async def execute_fetchall(self, sql: str, args: Any) -> list[Any]:
        return self._raw.execute(sql, args).fetchall()

    async def execute(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        return self._raw.execute(sql, args)

    async def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self._raw.executemany(sql, rows)

    async def commit(self) -> None:
        self._raw.commit()

    async def rollback(self) -> None:
        self._raw.rollback()


class CommitFailed(Exception):
    """The ``COMMIT`` of an inline write failed with ``error`` (mapped as a commit's)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def thread_executor(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pai-sqlite")


SQLITE3_KEY = "pai_storage_sql.sqlite3"
"""Key of a connection's ``sqlite3`` connection in its pool entry's ``info``."""


def pool_info(op: Operation) -> dict[Any, Any]:
    """The ``info`` of ``op``'s connection in SQLAlchemy's pool (kept with the
    connection between checkouts, cleared when it is closed)."""
    return op.conn.sync_connection.connection.info  # type: ignore[union-attr]


BUSY_KEY = "pai_storage_sql.busy_timeout"
"""Key of a held reader connection's ``busy_timeout`` (milliseconds) in its pool
entry's ``info``: 0 between operations, so a read on the event loop never
waits for a lock; an operation that may wait sets the client's for its
duration (:meth:`SqlClient._checkin <pai_storage_sql.client.SqlClient._checkin>`
sets 0 again)."""


async def find_sqlite3(op: Operation, *, reader: bool) -> None:
    """Keep the ``sqlite3`` connection under ``op``'s aiosqlite connection in its
    pool ``info`` (aiosqlite's ``Cursor.connection``), once per connection; a
    ``reader``'s ``busy_timeout`` is then 0 (:data:`BUSY_KEY`)."""
    async with op.driver.cursor() as cursor:
        if reader:
            await cursor.execute("PRAGMA busy_timeout=0")
            pool_info(op)[BUSY_KEY] = 0
        pool_info(op)[SQLITE3_KEY] = cursor.connection


def sqlite3_of(op: Operation) -> sqlite3.Connection:
    """The ``sqlite3`` connection of a held connection (see :func:`find_sqlite3`)."""
    return cast(sqlite3.Connection, pool_info(op)[SQLITE3_KEY])


async def settled(call: asyncio.Future[Any]) -> None:
    """Wait until ``call`` has ended, however often the waiter is cancelled
    meanwhile: its connection is touched again only once the thread running it
    has let go of it."""
    while not call.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({call})


class Abandoned(Exception):
    """The caller of an operation was cancelled before it committed: roll back."""


def call_failure(call: asyncio.Future[Any]) -> BaseException:
    """What a cancelled caller's call into the database thread (ended) left its
    connection with, for :meth:`SqlClient._failed`: its driver failure or a
    clean end (:class:`Abandoned`)."""
    if call.cancelled():  # never started
        return Abandoned()
    failure = call.exception()
    if isinstance(failure, CommitFailed):
        failure = failure.error
    return failure if failure is not None and is_driver_failure(failure) else Abandoned()


class Busy(Exception):
    """A read on the event loop found the database locked by another
    connection (SQLite recovering its write-ahead log, or a connection in
    exclusive locking mode): it is run again in the thread, where it waits."""


def at_once(
    op: Operation, begin: bool, body: Callable[[Operation], Awaitable[T]], held: HeldWarnings
) -> T:
    """A read around ``body`` in one call on the event loop (see
    :meth:`SqlClient.run_read`), its warnings kept in ``held``; :class:`Busy`
    if the database is locked (the connection's ``busy_timeout`` is 0).

    In WAL mode a reader does not wait for writers, and a bounded read's
    statements cost what decoding its rows on the loop does, so the trip to a
    thread and back (about 0.1 ms) would cost more than the statements.
    """
    try:
        with holding_warnings(held):
            return run_sync(_transaction(op, False, begin, body, _NOT_ABANDONED))
    except Exception as exc:
        if is_busy(exc):
            raise Busy from exc
        raise


_NOT_ABANDONED = threading.Event()
"""Never set: a call on the event loop cannot be abandoned half-way."""


def in_thread(
    op: Operation,
    write: bool,
    begin: bool,
    body: Callable[[Operation], Awaitable[T]],
    held: HeldWarnings,
    abandoned: threading.Event,
    busy_ms: int | None = None,
) -> T:
    """One operation around ``body``, run in the database thread (see
    :meth:`SqlClient.run_write`): its warnings are kept in ``held``; once
    ``abandoned`` is set (its caller was cancelled) it is not begun, and a
    write not yet committing is rolled back. ``busy_ms``: a read that found
    the database locked on the event loop waits up to that long for the lock
    here (the connection's ``busy_timeout`` is 0 again afterwards)."""
    if abandoned.is_set():
        raise Abandoned
    with holding_warnings(held):
        if busy_ms is None:
            return run_sync(_transaction(op, write, begin, body, abandoned))
        raw = sqlite3_of(op)
        raw.execute(f"PRAGMA busy_timeout={busy_ms}")
        try:
            return run_sync(_transaction(op, write, begin, body, abandoned))
        finally:
            raw.execute("PRAGMA busy_timeout=0")


async def _transaction(
    op: Operation,
    write: bool,
    begin: bool,
    body: Callable[[Operation], Awaitable[T]],
    abandoned: threading.Event,
) -> T:
    if write:
        await op.run_text("BEGIN IMMEDIATE")  # may wait up to busy_timeout
    elif begin:
        await op.run_text("BEGIN")
    try:
        result = await body(op)
        if abandoned.is_set():
            raise Abandoned
    except BaseException:
        with contextlib.suppress(Exception):
            await op.rollback()
        raise
    if not write:
        await op.rollback()  # ends the snapshot
        return result
    try:
        await op.commit()
    except Exception as exc:
        raise CommitFailed(exc) from exc
    return result
