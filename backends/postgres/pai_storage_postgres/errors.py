"""Every asyncpg / socket failure mapped to the contract's errors, in one place.

============================================  =====================================
what happened                                 raised
============================================  =====================================
connection lost while ``COMMIT`` was pending  ``ThreadStoreCommitUnknownError``
connect failure, connection lost before       ``ThreadStoreUnavailableError``
``COMMIT`` was sent, server shutting down,
out of resources, timeout
bad password / role / database, missing       ``ThreadStoreConfigurationError``
tables (schema dropped), no privilege
serialization failure / deadlock              retried by the store, then
                                              ``ThreadStoreUnavailableError``
anything else from the server                 ``ThreadStoreError``
============================================  =====================================

A write statement outside an explicit transaction (autocommit) has no separate
``COMMIT``: its lost reply is mapped under phase ``"commit"`` too, since the
server may have applied it.

The runtime stores (key-value, agent state, snapshots, execution guard) pass
``runtime=True`` and get the general classes with neutral wording
(``OutcomeUnknownError`` "the write may or may not have been applied",
``UnavailableError``, ``ConfigurationError``, ``InvalidInputError``,
``StorageError``); the thread store always gets the ``ThreadStore...`` classes.

The original exception is always chained (``raise mapped from exc``). Messages
carry the SQLSTATE and the server's primary message, never its ``DETAIL``
(which may quote stored values) and never a password.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from pai_storage import (
    ConfigurationError,
    InvalidInputError,
    OutcomeUnknownError,
    StorageError,
    UnavailableError,
)
from pai_storage.backend import StoreURL, redact
from pai_storage.errors import (
    ThreadStoreCommitUnknownError,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
)

__all__ = ["Phase", "general_error", "is_retryable", "map_error", "sqlstate"]

Phase = Literal["connect", "read", "write", "commit"]

RETRYABLE_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
_CONFIG_CLASSES = ("28", "3D", "42", "3F")  # auth, database, undefined object/privilege, schema
_UNAVAILABLE_CLASSES = ("08", "53", "57", "58", "40")


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a server error, or ``None`` for anything else."""
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else None


def is_retryable(exc: BaseException) -> bool:
    return sqlstate(exc) in RETRYABLE_STATES


def _is_client_configuration(exc: BaseException) -> bool:
    import asyncpg  # type: ignore[import-untyped]

    return isinstance(exc, asyncpg.exceptions.ClientConfigurationError)


def _is_connection_loss(exc: BaseException) -> bool:
    import asyncpg

    return isinstance(
        exc,
        asyncpg.exceptions.ConnectionDoesNotExistError
        | asyncpg.exceptions.InterfaceError
        | asyncpg.exceptions.InternalClientError
        | asyncpg.exceptions.ProtocolError
        | OSError
        | ConnectionError
        | EOFError
        | asyncio.TimeoutError,
    ) and not isinstance(exc, asyncpg.exceptions.InterfaceWarning)


def map_error(
    exc: BaseException, phase: Phase, url: StoreURL | None, *, runtime: bool = False
) -> StorageError:
    """The contract error for ``exc``, raised during ``phase`` (chain it yourself).

    ``phase="commit"`` marks a statement whose effect may have reached the
    server: an explicit transaction's ``COMMIT`` or an autocommit write. With
    ``runtime=True`` (a runtime store) the general classes are raised.
    """
    if isinstance(exc, StorageError):
        return exc
    state = sqlstate(exc)
    text = redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, url)
    where = redact(str(url), url) if url is not None else "PostgreSQL"
    if state is not None:
        detail = f"PostgreSQL error {state}: {text}"
        if state.startswith(("22", "54")):
            # Data exception or program limit (e.g. ids whose combined UTF-8 size exceeds
            # the 2,704-byte b-tree entry limit): the input cannot be stored as given.
            invalid = InvalidInputError if runtime else ThreadStoreInvariantError
            return invalid(
                f"{detail}; PostgreSQL cannot store this input as given (see "
                "docs/postgres.md, 'Limits'); nothing was applied"
            )
        if state.startswith(_CONFIG_CLASSES):
            configuration = ConfigurationError if runtime else ThreadStoreConfigurationError
            return configuration(f"{detail} (server {where})")
        if state.startswith(_UNAVAILABLE_CLASSES):
            if phase == "commit" and state.startswith(("08", "57")):
                return _unknown(f"the connection failed ({detail})", runtime)
            unavailable = UnavailableError if runtime else ThreadStoreUnavailableError
            return unavailable(f"{detail}; nothing was applied")
        return StorageError(detail) if runtime else ThreadStoreError(detail)
    if _is_client_configuration(exc):
        configuration = ConfigurationError if runtime else ThreadStoreConfigurationError
        return configuration(f"invalid connection settings for {where}: {text}")
    if _is_connection_loss(exc):
        if phase == "commit":
            return _unknown(
                f"the connection to {where} was lost ({type(exc).__name__}: {text})", runtime
            )
        unavailable = UnavailableError if runtime else ThreadStoreUnavailableError
        return unavailable(
            f"cannot reach {where} ({type(exc).__name__}: {text}); nothing was applied"
        )
    detail = f"unexpected PostgreSQL driver failure ({type(exc).__name__}: {text})"
    return StorageError(detail) if runtime else ThreadStoreError(detail)


def _unknown(what: str, runtime: bool) -> OutcomeUnknownError:
    """A lost reply to a statement that may have been applied."""
    if runtime:
        return OutcomeUnknownError(
            f"{what} before the reply to a write arrived; the write may or may not "
            "have been applied; read the value again to find out"
        )
    return ThreadStoreCommitUnknownError(
        f"{what} while COMMIT was pending; the commit may or may not have been "
        "applied; re-read the thread"
    )


def general_error(exc: StorageError) -> StorageError:
    """The general class of a thread-store error, for a runtime store sharing the
    client (a failed connect or schema set-up is raised to every store waiting)."""
    if not isinstance(exc, ThreadStoreError):
        return exc
    for special, general in (
        (ThreadStoreCommitUnknownError, OutcomeUnknownError),
        (ThreadStoreUnavailableError, UnavailableError),
        (ThreadStoreConfigurationError, ConfigurationError),
        (ThreadStoreInvariantError, InvalidInputError),
    ):
        if isinstance(exc, special):
            return general(str(exc))
    return StorageError(str(exc))
