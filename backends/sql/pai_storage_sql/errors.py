"""Every SQLite / MySQL driver failure mapped to the contract's errors, in one place.

=================================================  =====================================
what happened                                      raised
=================================================  =====================================
connection lost while ``COMMIT`` was pending       ``ThreadStoreCommitUnknownError``
SQLite busy or locked past ``busy_timeout``;       ``ThreadStoreUnavailableError``
disk full or I/O error; MySQL connect failure,
connection lost or killed before ``COMMIT``,
server shutting down, too many connections
MySQL deadlock (1213) or lock wait timeout (1205)  :class:`RetryableError` (an
                                                   ``UnavailableError``), retried by
                                                   :meth:`SqlClient.retrying`
bad path, not a database, read-only file,          ``ThreadStoreConfigurationError``
access denied, unknown database, missing table
a value the database cannot hold (beyond           ``ThreadStoreInvariantError``
``max_allowed_packet``, too long, too big)
anything else                                      ``ThreadStoreError``
=================================================  =====================================

The original exception is always chained (``raise mapped from exc``). Messages
carry the error code and the driver's first line, never a password.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from pai_storage.backend import StoreURL, redact
from pai_storage.errors import (
    ThreadStoreCommitUnknownError,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
)

__all__ = [
    "Phase",
    "RetryableError",
    "driver_error",
    "is_driver_exception",
    "is_driver_failure",
    "map_error",
    "mysql_code",
]

Phase = Literal["connect", "read", "write", "commit"]
"""Where a failure happened: ``commit`` makes a lost connection an unknown outcome."""

MYSQL_RETRYABLE = frozenset({1213, 1205})  # deadlock, lock wait timeout
MYSQL_CONNECTION = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1077,  # normal shutdown
        1152,  # aborted connection
        1158,  # error reading communication packets
        1159,  # timeout reading communication packets
        1160,  # error writing communication packets
        1161,  # timeout writing communication packets
        1317,  # query execution was interrupted
        1927,  # connection was killed (MariaDB)
        2002,  # cannot connect through socket
        2003,  # cannot connect to server
        2005,  # unknown host
        2006,  # server has gone away
        2013,  # lost connection during query
        2014,  # commands out of sync
        2055,  # lost connection at reading/writing
        4031,  # disconnected by the server (idle timeout)
    }
)
MYSQL_CONFIGURATION = frozenset(
    {
        1044,  # access denied to database
        1045,  # access denied for user
        1046,  # no database selected
        1049,  # unknown database
        1142,  # command denied
        1143,  # column access denied
        1146,  # table does not exist
        1227,  # needs a privilege
        1054,  # unknown column (a table of another schema)
    }
)
MYSQL_TOO_BIG = frozenset(
    {
        1153,  # packet bigger than max_allowed_packet
        1301,  # result larger than max_allowed_packet
        1406,  # data too long for column
        1118,  # row size too large
        1366,  # incorrect string value
        1071,  # key too long
    }
)

SQLITE_BUSY = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED (with extended codes masked)
SQLITE_UNAVAILABLE = frozenset({10, 13, 15})  # IOERR, FULL, PROTOCOL
SQLITE_CONFIGURATION = frozenset({3, 8, 14, 23, 26})  # PERM, READONLY, CANTOPEN, AUTH, NOTADB
SQLITE_TOO_BIG = frozenset({18})  # TOOBIG


class RetryableError(ThreadStoreUnavailableError):
    """A deadlock or lock-wait timeout: the transaction was rolled back and may be retried.

    :meth:`SqlClient.retrying <pai_storage_sql.client.SqlClient.retrying>` runs
    the operation again; after the last attempt this error reaches the caller
    (it is an ``UnavailableError``: nothing was applied).
    """


def driver_error(exc: BaseException) -> BaseException:
    """The driver's own exception inside a SQLAlchemy wrapper (or ``exc`` itself)."""
    from sqlalchemy.exc import DBAPIError

    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return exc.orig
    return exc


def mysql_code(exc: BaseException) -> int | None:
    """The MySQL error number of a driver exception, or ``None``."""
    exc = driver_error(exc)
    if type(exc).__module__.startswith(("asyncmy", "pymysql", "aiomysql")):
        args = getattr(exc, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


def _sqlite_code(exc: BaseException) -> int | None:
    import sqlite3

    exc = driver_error(exc)
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            return 5
        return 1
    return None


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc``, or the driver exception it was mapped from, is SQLite's
    ``SQLITE_BUSY`` (another connection holds the lock it needs)."""
    cause: BaseException | None = exc
    while cause is not None:
        if _sqlite_code(cause) == 5:
            return True
        cause = cause.__cause__
    return False


def is_driver_exception(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by SQLAlchemy, the driver or the connection."""
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    return isinstance(
        exc,
        SQLAlchemyError
        | sqlite3.Error
        | OSError
        | EOFError
        | asyncio.IncompleteReadError
        | asyncio.TimeoutError,
    ) or type(exc).__module__.startswith(("asyncmy", "pymysql", "aiomysql"))


def is_driver_failure(exc: BaseException) -> bool:
    """Whether the connection that raised ``exc`` is suspect (a driver failure,
    raw or mapped): it is then closed rather than reused."""
    return bool(getattr(exc, "driver_failure", False)) or is_driver_exception(exc)


def _is_connection_loss(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError, TimeoutError

    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    inner = driver_error(exc)
    return isinstance(
        inner,
        OSError | ConnectionError | EOFError | asyncio.IncompleteReadError | asyncio.TimeoutError,
    ) or isinstance(exc, TimeoutError)


def _driver(cls: type[ThreadStoreError]) -> Callable[[str], ThreadStoreError]:
    """Makes ``cls`` errors marked as driver failures (their connection is suspect)."""

    def make(message: str) -> ThreadStoreError:
        error = cls(message)
        error.driver_failure = True  # type: ignore[attr-defined]
        return error

    return make


_Unavailable = _driver(ThreadStoreUnavailableError)
_Unknown = _driver(ThreadStoreCommitUnknownError)
_Configuration = _driver(ThreadStoreConfigurationError)
_Invariant = _driver(ThreadStoreInvariantError)
_Other = _driver(ThreadStoreError)
_Retryable = _driver(RetryableError)


def map_error(exc: BaseException, phase: Phase, url: StoreURL | None) -> ThreadStoreError:
    """The contract error for ``exc``, raised during ``phase`` (chain it yourself)."""
    if isinstance(exc, ThreadStoreError):
        return exc
    inner = driver_error(exc)
    first = str(inner).splitlines()[0] if str(inner) else type(inner).__name__
    text = redact(first, url)
    where = redact(str(url), url) if url is not None else "the database"
    code = mysql_code(inner)
    if code is not None:
        detail = f"MySQL error {code}: {text}"
        if code in MYSQL_RETRYABLE:
            return _Retryable(f"{detail}; the transaction was rolled back, nothing was applied")
        if code in MYSQL_CONNECTION:
            if phase == "commit":
                return _Unknown(
                    f"the connection failed while COMMIT was pending; the commit may or may "
                    f"not have been applied ({detail}); re-read the thread"
                )
            return _Unavailable(f"{detail} (server {where}); nothing was applied")
        if code in MYSQL_CONFIGURATION:
            return _Configuration(f"{detail} (server {where})")
        if code in MYSQL_TOO_BIG:
            return _Invariant(
                f"{detail}; the database cannot store this input as given (see docs/sql.md, "
                "'Limits'); nothing was applied"
            )
        return _Other(detail)
    sqlite = _sqlite_code(inner)
    if sqlite is not None:
        detail = f"SQLite error {sqlite}: {text}"
        if sqlite in SQLITE_BUSY:
            return _Unavailable(
                f"{detail}: the database stayed locked by another connection past busy_timeout "
                f"({where}); nothing was applied"
            )
        if sqlite in SQLITE_UNAVAILABLE:
            if phase == "commit":
                # A failed sync of the write-ahead log can still leave the commit's
                # frames on disk, replayed when the database is next opened.
                return _Unknown(
                    f"{detail} while COMMIT was pending ({where}); the write may or may "
                    "not have been applied: read it back before retrying"
                )
            return _Unavailable(f"{detail} ({where}); nothing was applied")
        if sqlite in SQLITE_CONFIGURATION or "no such table" in first or "no such column" in first:
            return _Configuration(f"{detail} ({where})")
        if sqlite in SQLITE_TOO_BIG:
            return _Invariant(
                f"{detail}; the database cannot store this input as given; nothing was applied"
            )
        return _Other(detail)
    if _is_connection_loss(exc):
        if phase == "commit":
            return _Unknown(
                f"the connection to {where} was lost while COMMIT was pending; the commit "
                f"may or may not have been applied ({type(inner).__name__}: {text}); "
                "re-read the thread"
            )
        return _Unavailable(
            f"cannot reach {where} ({type(inner).__name__}: {text}); nothing was applied"
        )
    return _Other(f"unexpected SQL driver failure ({type(inner).__name__}: {text})")
