"""The exceptions every pai-storage operation can raise.

Every error of every store derives from one root, :class:`StorageError`, so
``except StorageError`` catches all of them and nothing else. The general
classes say *what kind* of failure it is; the thread store raises its own
subclasses of them, so code written against either set keeps working::

    StorageError
    ├── InvalidInputError (ValueError)     bad argument; nothing was written
    │   ├── SerializationError             a value that is not strict JSON
    │   └── SnapshotTooLargeError          a snapshot over the backend's size limit
    ├── UnavailableError                   cannot reach the server (retryable)
    ├── OutcomeUnknownError                a write whose outcome cannot be known
    ├── ConfigurationError                 bad URL or options, missing driver, topology, closed
    ├── PageTokenError                     invalid, tampered or mismatched page token
    ├── CorruptSnapshotError               a stored snapshot failed its integrity check
    ├── LockTimeoutError                   a lock was not acquired within its timeout
    ├── ConflictError                      a conflict, raised on request (raise_on_conflict)
    └── ThreadStoreError                   root of the thread store's errors
        ├── ThreadStorePageTokenError          (also a PageTokenError)
        ├── ThreadStoreInvariantError          (also an InvalidInputError)
        │   └── ThreadStoreSerializationError  (also a SerializationError)
        ├── ThreadStoreCommitUnknownError      (also an OutcomeUnknownError)
        ├── ThreadStoreUnavailableError        (also an UnavailableError)
        ├── ThreadStoreConfigurationError      (also a ConfigurationError)
        ├── ThreadExistsError                  an import met a thread that exists
        └── ConversationConflictError          another writer changed what a conversation needs

``except ThreadStoreError`` still catches exactly the thread store's errors.

A conflict (stale version, lease precondition false, unexpected list length)
is *not* an error: every conditional write *returns* a
:class:`~pai_storage.Conflict` (``ConflictResult``, ``KVConflict``,
``StateConflict``, ``ListConflict``). :func:`~pai_storage.raise_on_conflict`
turns one into a :class:`ConflictError` for code that prefers exceptions.

Backends map every driver exception to one of these in one place and chain the
original (``raise ... from exc``); it stays reachable as ``err.__cause__``.
Messages name what is wrong and where, and never contain a password or the
contents of stored metadata.

:class:`InvalidInputError` (and so :class:`ThreadStoreInvariantError`) also
derives from :class:`ValueError`, because it is what a malformed input raises,
wherever that input is validated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from .conflicts import Conflict

__all__ = [
    "ConfigurationError",
    "ConflictError",
    "ConversationConflictError",
    "CorruptSnapshotError",
    "InvalidInputError",
    "LockTimeoutError",
    "OutcomeUnknownError",
    "PageTokenError",
    "SerializationError",
    "SnapshotTooLargeError",
    "StorageError",
    "ThreadExistsError",
    "ThreadStoreCommitUnknownError",
    "ThreadStoreConfigurationError",
    "ThreadStoreError",
    "ThreadStoreInvariantError",
    "ThreadStorePageTokenError",
    "ThreadStoreSerializationError",
    "ThreadStoreUnavailableError",
    "UnavailableError",
]


# ---------------------------------------------------------------- general classes


class StorageError(Exception):
    """Root of every error raised by any pai-storage store."""


class InvalidInputError(StorageError, ValueError):
    """An argument is malformed or breaks a rule. Nothing was written."""


class SerializationError(InvalidInputError):
    """A value that must be strict JSON is not; the message names its path.

    ``path`` is the location of the first bad value (``metadata.items[3].score``)
    and ``reason`` says what is wrong with it (``NaN is not JSON``).
    """

    path: str
    reason: str

    @classmethod
    def at(cls, path: str, reason: str) -> Self:
        """The error for the bad value at ``path`` (``""``: the value itself)."""
        err = cls(f"{path or '<value>'}: {reason}")
        err.path = path
        err.reason = reason
        return err


class UnavailableError(StorageError):
    """The backend cannot be reached. Retryable; a write raising it wrote nothing."""


class OutcomeUnknownError(StorageError):
    """The backend cannot tell whether a write was applied.

    Re-read and re-plan; do not blindly repeat the write.
    """


class ConfigurationError(StorageError):
    """A bad URL or option, a missing driver, or a server that cannot honour the contract."""


class PageTokenError(StorageError):
    """A page token is malformed, tampered with, or used with another query."""


class CorruptSnapshotError(StorageError):
    """A stored snapshot failed its integrity check; its damaged bytes were not returned."""


class SnapshotTooLargeError(InvalidInputError):
    """A snapshot is larger than the backend can store; the message names both sizes."""


class LockTimeoutError(StorageError):
    """A lock was not acquired within its timeout: another holder kept it."""


class ConflictError(StorageError):
    """A conditional write found something else current and wrote nothing.

    Raised only on request, by :func:`~pai_storage.raise_on_conflict` or
    :meth:`Conflict.error() <pai_storage.Conflict.error>`; the stores return
    the conflict instead. ``conflict`` is that result (what is current).
    """

    conflict: Conflict


# ---------------------------------------------------------------- thread store


class ThreadStoreError(StorageError):
    """Root of every error raised through the thread store's contract."""


class ThreadStorePageTokenError(ThreadStoreError, PageTokenError):
    """A page token is malformed, tampered with, or used with another query.

    Also raised when a child-family token outlives its thread incarnation (the
    thread was deleted and re-created between pages).
    """


class ThreadStoreInvariantError(ThreadStoreError, InvalidInputError):
    """An input is malformed or breaks a rule, or persisted state is impossible.

    Nothing was written when a commit raises it.
    """


class ThreadStoreSerializationError(ThreadStoreInvariantError, SerializationError):
    """A value that must be strict JSON is not; the message names its path.

    ``path`` is the location of the first bad value (``metadata.items[3].score``)
    and ``reason`` says what is wrong with it (``NaN is not JSON``).
    """


class ThreadStoreCommitUnknownError(ThreadStoreError, OutcomeUnknownError):
    """The backend cannot tell whether a commit was applied.

    The store never leaves a partial commit: the commit was applied whole or not
    at all. Re-read the thread and re-plan; do not blindly repeat the write.
    """


class ThreadStoreUnavailableError(ThreadStoreError, UnavailableError):
    """The backend cannot be reached. Retryable; a commit raising it applied nothing."""


class ThreadStoreConfigurationError(ThreadStoreError, ConfigurationError):
    """A bad URL or option, a missing driver, or a server that cannot honour the contract."""


class ConversationConflictError(ThreadStoreError):
    """Another writer changed a conversation in a way its handle cannot retry safely.

    Raised by :class:`~pai_storage.Conversation` (a conflict caused by another
    writer's append is retried there, never raised): the thread was deleted or
    deleted and re-created, an open reply's run or lease was taken over, or a
    reply was opened while another run is open. The message says which.
    Nothing of the failed write was applied.
    """


class ThreadExistsError(ThreadStoreError):
    """An import with ``on_conflict="fail"`` met a thread that already exists.

    Threads before it in the stream were imported; nothing of this one was.
    """

    def __init__(self, scope_key: str, thread_id: str, line: int) -> None:
        super().__init__(f"line {line}: thread {thread_id!r} already exists in its scope")
        self.scope_key = scope_key
        self.thread_id = thread_id
        self.line = line


# ---------------------------------------------------------------- general equivalents

_GENERAL: tuple[tuple[type[ThreadStoreError], type[StorageError]], ...] = (
    (ThreadStorePageTokenError, PageTokenError),
    (ThreadStoreCommitUnknownError, OutcomeUnknownError),
    (ThreadStoreUnavailableError, UnavailableError),
    (ThreadStoreConfigurationError, ConfigurationError),
    (ThreadStoreInvariantError, InvalidInputError),
)


def general_error(error: StorageError) -> StorageError:
    """The general class of a thread-store error (its message kept); other errors as they are.

    What the runtime stores and :func:`~pai_storage.connect` raise where they
    share code with the thread store (URL parsing, the registry, a shared
    client): their callers see the general classes only.
    """
    if not isinstance(error, ThreadStoreError):
        return error
    if isinstance(error, ThreadStoreSerializationError):
        return SerializationError.at(error.path, error.reason)
    for special, general in _GENERAL:
        if isinstance(error, special):
            return general(str(error))
    return StorageError(str(error))


@contextmanager
def general_errors() -> Iterator[None]:
    """Raise the general class of any thread-store error raised in the block.

    The driver's exception stays reachable as ``err.__cause__`` when there was
    one (else the thread-store error is).
    """
    try:
        yield
    except ThreadStoreError as exc:
        raise general_error(exc) from (exc.__cause__ or exc)
