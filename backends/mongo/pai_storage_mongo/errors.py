"""The one place PyMongo exceptions become the contract's typed errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pymongo import errors as pm

from pai_storage import (
    StoreURL,
    ThreadStoreCommitUnknownError,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
    redact,
)

__all__ = [
    "Phase",
    "duplicate_key_value",
    "is_duplicate_key",
    "is_transient",
    "is_unknown_commit",
    "is_write_conflict",
    "map_error",
]

Phase = Literal["connect", "read", "write", "commit"]

_AUTH_CODES = frozenset({13, 18, 8000})  # Unauthorized, AuthenticationFailed, Atlas auth
_WRITE_CONFLICT = 112
_DUPLICATE_KEY = frozenset({11000, 11001})


def is_transient(exc: BaseException) -> bool:
    """A transaction error after which the whole transaction may be retried."""
    return isinstance(exc, pm.PyMongoError) and exc.has_error_label("TransientTransactionError")


def is_unknown_commit(exc: BaseException) -> bool:
    return isinstance(exc, pm.PyMongoError) and exc.has_error_label(
        "UnknownTransactionCommitResult"
    )


def is_duplicate_key(exc: BaseException) -> bool:
    """A unique index refused a write (an id that already exists)."""
    if isinstance(exc, pm.BulkWriteError):
        codes = {e.get("code") for e in exc.details.get("writeErrors", ())}
        return bool(codes & _DUPLICATE_KEY)
    return isinstance(exc, pm.OperationFailure) and exc.code in _DUPLICATE_KEY


def duplicate_key_value(exc: BaseException, field: str) -> str | None:
    """The value of ``field`` in the key a unique index refused, when the server says."""
    details: Mapping[str, Any] = {}
    if isinstance(exc, pm.BulkWriteError):
        errors = exc.details.get("writeErrors") or [{}]
        details = errors[0]
    elif isinstance(exc, pm.OperationFailure):
        details = exc.details or {}
    key = details.get("keyValue")
    value = key.get(field) if isinstance(key, dict) else None
    return value if isinstance(value, str) else None


def is_write_conflict(exc: BaseException) -> bool:
    """A write conflict, or a duplicate key on a unique index (a racing create)."""
    if isinstance(exc, pm.BulkWriteError):
        codes = {e.get("code") for e in exc.details.get("writeErrors", ())}
        return bool(codes & (_DUPLICATE_KEY | {_WRITE_CONFLICT}))
    return isinstance(exc, pm.OperationFailure) and (
        exc.code == _WRITE_CONFLICT or exc.code in _DUPLICATE_KEY
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, pm.OperationFailure):
        name = (exc.details or {}).get("codeName") or "OperationFailure"
        return f"{name} (code {exc.code})"
    return type(exc).__name__


def map_error(exc: BaseException, phase: Phase, url: StoreURL | None) -> ThreadStoreError:
    """The typed error for a PyMongo exception (chain it: ``raise ... from exc``).

    Messages name the failure class and code only: server messages can quote
    key values, and nothing may echo stored contents or a password.
    """
    what = _describe(exc)
    if isinstance(exc, pm.ServerSelectionTimeoutError):
        if phase == "commit":
            return ThreadStoreCommitUnknownError(
                f"MongoDB became unreachable while committing ({what}); the commit was "
                "applied whole or not at all: re-read the thread and re-plan"
            )
        return ThreadStoreUnavailableError(
            redact(f"MongoDB is unreachable: no suitable server was found in time ({what})", url)
        )
    if isinstance(exc, pm.ConfigurationError | pm.InvalidURI):
        return ThreadStoreConfigurationError(redact(f"invalid MongoDB configuration: {exc}", url))
    if isinstance(exc, pm.OperationFailure) and exc.code in _AUTH_CODES:
        return ThreadStoreConfigurationError(f"MongoDB refused the credentials or access: {what}")
    if phase == "commit":
        return ThreadStoreCommitUnknownError(
            f"the outcome of the MongoDB transaction commit is unknown ({what}); it was "
            "applied whole or not at all: re-read the thread and re-plan"
        )
    if isinstance(exc, pm.DocumentTooLarge):
        return ThreadStoreInvariantError(
            "a record is larger than MongoDB's 16 MB document limit; nothing was applied"
        )
    if isinstance(exc, pm.ConnectionFailure | pm.WaitQueueTimeoutError):
        return ThreadStoreUnavailableError(f"lost the connection to MongoDB ({what})")
    if isinstance(exc, pm.OperationFailure) and exc.code in (91, 189, 10107, 11600, 11602, 13435):
        # ShutdownInProgress, PrimarySteppedDown, NotWritablePrimary, Interrupted...
        return ThreadStoreUnavailableError(f"MongoDB is not accepting operations now ({what})")
    if is_transient(exc):
        return ThreadStoreUnavailableError(
            f"MongoDB kept aborting the transaction ({what}); nothing was applied"
        )
    return ThreadStoreError(f"MongoDB operation failed: {what}")
