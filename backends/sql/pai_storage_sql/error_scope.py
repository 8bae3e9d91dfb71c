"""Where a :class:`~pai_storage_sql.client.SqlClient` turns driver exceptions into the contract's.

Invariants: only an exception that comes from the driver or the connection
(:func:`~pai_storage_sql.errors.is_driver_exception`) is replaced, by the
error :func:`~pai_storage_sql.errors.map_error` gives for the phase, raised
``from`` the original; the contract's own errors, a store's signals and
anything that is not an ``Exception`` (cancellation) pass through as raised.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pai_storage import StorageError
from pai_storage.backend import StoreURL

from .errors import Phase, is_driver_exception, map_error

__all__ = ["MappedErrors", "is_unique_violation", "mapped_error"]


class MappedErrors(contextlib.AbstractContextManager[None]):
    """:meth:`SqlClient.errors`, as a plain class (it wraps every operation: no
    generator per use)."""

    __slots__ = ("_phase", "_url")

    def __init__(self, phase: Phase, url: StoreURL) -> None:
        self._phase = phase
        self._url = url

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            error = mapped_error(exc, self._phase, self._url)
            if error is not exc:
                raise error from exc


def mapped_error(exc: BaseException, phase: Phase, url: StoreURL) -> BaseException:
    """The contract's error for a driver exception; any other exception itself."""
    if not isinstance(exc, Exception) or isinstance(exc, StorageError):
        return exc
    return map_error(exc, phase, url) if is_driver_exception(exc) else exc


def is_unique_violation(exc: BaseException) -> bool:
    """Whether ``exc`` (raw or wrapped by SQLAlchemy) is a constraint violation."""
    import sqlite3

    from sqlalchemy.exc import IntegrityError

    if isinstance(exc, IntegrityError | sqlite3.IntegrityError):
        return True
    return type(exc).__name__ == "IntegrityError" and type(exc).__module__.startswith(
        ("asyncmy", "pymysql", "aiomysql")
    )
