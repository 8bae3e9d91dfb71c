"""The one place PyMongo and BSON exceptions become the contract's typed errors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, overload
from urllib.parse import quote

from bson.errors import BSONError, InvalidBSON
from pymongo import errors as pm
from pymongo.uri_parser import split_options

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

__all__ = [
    "Phase",
    "check_url_options",
    "duplicate_key",
    "is_duplicate_key",
    "is_retryable_read",
    "is_snapshot_unavailable",
    "is_transient",
    "is_unknown_commit",
    "is_write_conflict",
    "map_error",
    "map_option_error",
]

Phase = Literal["connect", "read", "write", "commit"]

_AUTH_CODES = frozenset({13, 18, 8000})  # Unauthorized, AuthenticationFailed, Atlas auth
_WRITE_CONFLICT = 112
_DUPLICATE_KEY = frozenset({11000, 11001})
# BSONObjectTooLarge; "Resulting document after update is larger than ..." (replace/update).
_TOO_LARGE = frozenset({10334, 17419, 17420})
_BAD_VALUE = 2  # also "object to insert too large" (an insert over 16 MiB)
# Options the server judges, not the driver: an unknown write concern mode, one the
# replica set cannot satisfy, an unparsable read or write concern.
_OPTION_CODES = frozenset({_BAD_VALUE, 9, 14, 79, 100})  # BadValue, FailedToParse, TypeMismatch

TOO_LARGE_MESSAGE = "a record is larger than MongoDB's 16 MiB document limit; nothing was applied"


def is_transient(exc: BaseException) -> bool:
    """A transaction error after which the whole transaction may be retried."""
    return isinstance(exc, pm.PyMongoError) and exc.has_error_label("TransientTransactionError")


def is_snapshot_unavailable(exc: BaseException) -> bool:
    """A snapshot read the server cannot serve yet (a collection created just now) or
    any more (history gone); a new snapshot may be tried."""
    return isinstance(exc, pm.OperationFailure) and exc.code in (239, 246)


def is_retryable_read(exc: BaseException) -> bool:
    """A read outside a transaction that may be tried again whole: a snapshot the
    server cannot serve, a lost connection or a primary that stepped down (inside a
    transaction these carry the ``TransientTransactionError`` label instead)."""
    if isinstance(exc, pm.ServerSelectionTimeoutError):
        return False  # no server to try again against
    return is_snapshot_unavailable(exc) or isinstance(
        exc, pm.ConnectionFailure | pm.NotPrimaryError
    )


def is_unknown_commit(exc: BaseException) -> bool:
    return isinstance(exc, pm.PyMongoError) and exc.has_error_label(
        "UnknownTransactionCommitResult"
    )


def _write_errors(exc: pm.BulkWriteError) -> list[Mapping[str, Any]]:
    return list(exc.details.get("writeErrors") or ())


def _codes(exc: BaseException) -> set[int]:
    if isinstance(exc, pm.BulkWriteError):
        return {code for e in _write_errors(exc) if isinstance(code := e.get("code"), int)}
    if isinstance(exc, pm.OperationFailure) and exc.code is not None:
        return {exc.code}
    return set()


def is_duplicate_key(exc: BaseException) -> bool:
    """A unique index refused a write (an id that already exists)."""
    return bool(_codes(exc) & _DUPLICATE_KEY)


def duplicate_key(exc: BaseException) -> Mapping[str, Any]:
    """The key a unique index refused (field to value), when the server says; else empty."""
    details: Mapping[str, Any] = {}
    if isinstance(exc, pm.BulkWriteError):
        details = next((e for e in _write_errors(exc) if e.get("code") in _DUPLICATE_KEY), {})
    elif isinstance(exc, pm.OperationFailure):
        details = exc.details or {}
    key = details.get("keyValue")
    return key if isinstance(key, Mapping) else {}


def is_write_conflict(exc: BaseException) -> bool:
    """A write conflict, or a duplicate key on a unique index (a racing create)."""
    return bool(_codes(exc) & (_DUPLICATE_KEY | {_WRITE_CONFLICT}))


def is_too_large(exc: BaseException) -> bool:
    """A document over the server's BSON size limit, refused by the driver or the server.

    The driver refuses a document only beyond the limit plus its 16 KiB command
    allowance; the server refuses the rest (code 2 for an insert, 17419 for a
    replacement, inside a bulk write too).
    """
    if isinstance(exc, pm.DocumentTooLarge):
        return True
    if isinstance(exc, pm.BulkWriteError):
        errors = _write_errors(exc)
    elif isinstance(exc, pm.OperationFailure):
        errors = [{"code": exc.code, "errmsg": (exc.details or {}).get("errmsg", "")}]
    else:
        return False
    return any(
        e.get("code") in _TOO_LARGE
        or (e.get("code") == _BAD_VALUE and "too large" in str(e.get("errmsg", "")))
        for e in errors
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, pm.OperationFailure):
        name = (exc.details or {}).get("codeName") or type(exc).__name__
        return f"{name} (code {exc.code})"
    return type(exc).__name__


@overload
def map_error(
    exc: BaseException, phase: Phase, url: StoreURL | None, *, runtime: Literal[False] = False
) -> ThreadStoreError: ...
@overload
def map_error(
    exc: BaseException, phase: Phase, url: StoreURL | None, *, runtime: bool
) -> StorageError: ...
def map_error(
    exc: BaseException, phase: Phase, url: StoreURL | None, *, runtime: bool = False
) -> StorageError:
    """The typed error for a PyMongo or BSON exception (chain it: ``raise ... from exc``).

    The thread store always gets the ``ThreadStore...`` classes; a runtime
    store (``runtime=True``, through
    :func:`~pai_storage_mongo.client.runtime_error`) gets the general classes
    (``UnavailableError``, ``OutcomeUnknownError``, ``ConfigurationError``,
    ``InvalidInputError``, ``StorageError``) with neutral wording. Messages
    name the failure class and code only: server messages can quote key
    values, and nothing may echo stored contents or a password.
    """
    invalid = InvalidInputError if runtime else ThreadStoreInvariantError
    unavailable = UnavailableError if runtime else ThreadStoreUnavailableError
    configuration = ConfigurationError if runtime else ThreadStoreConfigurationError
    if is_too_large(exc):
        return invalid(TOO_LARGE_MESSAGE)
    if isinstance(exc, InvalidBSON):
        return invalid(
            "invalid stored data: a stored document cannot be decoded "
            "(e.g. invalid UTF-8 or a corrupt escaped value)"
        )
    if isinstance(exc, BSONError) and not isinstance(exc, pm.PyMongoError):
        return invalid(f"a value cannot be stored in MongoDB: {type(exc).__name__}")
    what = _describe(exc)
    if isinstance(exc, pm.ServerSelectionTimeoutError):
        if phase == "commit":
            return _unknown(f"MongoDB became unreachable while committing ({what})", runtime)
        return unavailable(
            redact(f"MongoDB is unreachable: no suitable server was found in time ({what})", url)
        )
    if isinstance(exc, pm.ConfigurationError | pm.InvalidURI):
        return configuration(redact(f"invalid MongoDB configuration: {exc}", url))
    if isinstance(exc, pm.OperationFailure) and exc.code in _AUTH_CODES:
        return configuration(f"MongoDB refused the credentials or access: {what}")
    if isinstance(exc, pm.OperationFailure) and exc.code in (85, 86):
        # IndexOptionsConflict, IndexKeySpecsConflict: an existing index holds a name
        # or keys this store needs with another definition.
        return configuration(
            f"an existing MongoDB index conflicts with an index this store needs ({what}): "
            "drop or rename it, or use another collection name"
        )
    if phase == "commit":
        return _unknown(
            f"the outcome of the MongoDB transaction commit is unknown ({what})", runtime
        )
    if isinstance(exc, pm.ConnectionFailure | pm.WaitQueueTimeoutError):
        return unavailable(f"lost the connection to MongoDB ({what})")
    if isinstance(exc, pm.OperationFailure) and exc.code in (91, 189, 10107, 11600, 11602, 13435):
        # ShutdownInProgress, PrimarySteppedDown, NotWritablePrimary, Interrupted...
        return unavailable(f"MongoDB is not accepting operations now ({what})")
    if is_transient(exc):
        return unavailable(f"MongoDB kept aborting the transaction ({what}); nothing was applied")
    detail = f"MongoDB operation failed: {what}"
    return StorageError(detail) if runtime else ThreadStoreError(detail)


def _unknown(what: str, runtime: bool) -> OutcomeUnknownError:
    """A lost reply to a commit (or a write) that may have been applied."""
    if runtime:
        return OutcomeUnknownError(
            f"{what}; the write may or may not have been applied: read it back before retrying"
        )
    return ThreadStoreCommitUnknownError(
        f"{what}; the commit was applied whole or not at all: re-read the thread and re-plan"
    )


# --------------------------------------------------------------- URL options


def _named(url: StoreURL, keys: Iterable[str]) -> list[str]:
    """The URL's spelling of the options among ``keys`` (lower case), in URL order."""
    wanted = set(keys)
    return [k for k, _ in url.query if k.lower() in wanted]


def map_option_error(
    exc: BaseException, url: StoreURL, options: Iterable[str], what: str
) -> ThreadStoreConfigurationError | None:
    """A configuration error when the server refused ``what`` the URL options set.

    For the first statements that use the URL's own read or write concern
    (``initialize()`` runs them): an unknown write concern mode such as
    ``w=banana``, one the deployment cannot satisfy, or an unparsable read
    concern level. ``options`` are the option names (lower case) that shape it.
    """
    if not isinstance(exc, pm.OperationFailure) or exc.code not in _OPTION_CODES:
        return None
    named = _named(url, options)
    subject = f"URL option {', '.join(named)}" if named else f"default {what}"
    return ThreadStoreConfigurationError(
        f"MongoDB refused the {what} set by the {subject} ({_describe(exc)}); "
        "fix the connection string"
    )


def check_url_options(url: StoreURL) -> None:
    """Refuse the URL options the driver would reject, naming the option, never its value.

    The driver itself only warns about an unknown option or a malformed value
    and then ignores it; here either is a :class:`ThreadStoreConfigurationError`
    when the store is opened. Options only the server can judge (a write
    concern mode such as ``w=banana``) are judged by ``initialize()``.
    """
    for key, value in url.query:
        try:
            split_options(f"{quote(key, safe='')}={quote(value, safe='')}", warn=False)
        except (pm.PyMongoError, ValueError, TypeError) as exc:
            reason = str(exc).split(" Did you mean", 1)[0].rstrip(".")
            if value and redact(value, url) != value:  # a credential: say nothing of it
                reason = "malformed value"
            raise ThreadStoreConfigurationError(
                redact(f"the MongoDB URL option {key!r} is invalid: {reason}", url)
            ) from None
