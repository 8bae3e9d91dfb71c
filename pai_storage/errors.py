"""The exceptions every pai-storage operation can raise.

Every error derives from one root, so ``except ThreadStoreError`` catches all of
them and nothing else::

    ThreadStoreError
    ├── ThreadStorePageTokenError       invalid, tampered or mismatched page token
    ├── ThreadStoreInvariantError       invalid input or impossible persisted state
    │   └── ThreadStoreSerializationError   a value that is not strict JSON
    ├── ThreadStoreCommitUnknownError   the outcome of a commit cannot be known
    ├── ThreadStoreUnavailableError     the backend cannot be reached (retryable)
    └── ThreadStoreConfigurationError   bad URL or options, missing driver, topology

A conflict (stale version, lease precondition false) is *not* an error: it is the
``CommitConflict`` result of :meth:`ThreadStore.commit_thread`.

Backends map every driver exception to one of these in one place and chain the
original (``raise ... from exc``); it stays reachable as ``err.__cause__``.
Messages name what is wrong and where, and never contain a password or the
contents of stored metadata.

``ThreadStoreInvariantError`` also derives from :class:`ValueError`, because it
is what a malformed input raises, wherever that input is validated.
"""

from __future__ import annotations

__all__ = [
    "ThreadStoreCommitUnknownError",
    "ThreadStoreConfigurationError",
    "ThreadStoreError",
    "ThreadStoreInvariantError",
    "ThreadStorePageTokenError",
    "ThreadStoreSerializationError",
    "ThreadStoreUnavailableError",
]


class ThreadStoreError(Exception):
    """Root of every error raised through the pai-storage contract."""


class ThreadStorePageTokenError(ThreadStoreError):
    """A page token is malformed, tampered with, or used with another query.

    Also raised when a child-family token outlives its thread incarnation (the
    thread was deleted and re-created between pages).
    """


class ThreadStoreInvariantError(ThreadStoreError, ValueError):
    """An input is malformed or breaks a rule, or persisted state is impossible.

    Nothing was written when a commit raises it.
    """


class ThreadStoreSerializationError(ThreadStoreInvariantError):
    """A value that must be strict JSON is not; the message names its path.

    ``path`` is the location of the first bad value (``metadata.items[3].score``)
    and ``reason`` says what is wrong with it (``NaN is not JSON``).
    """

    path: str
    reason: str

    @classmethod
    def at(cls, path: str, reason: str) -> ThreadStoreSerializationError:
        err = cls(f"{path or '<value>'}: {reason}")
        err.path = path
        err.reason = reason
        return err


class ThreadStoreCommitUnknownError(ThreadStoreError):
    """The backend cannot tell whether a commit was applied.

    The store never leaves a partial commit: the commit was applied whole or not
    at all. Re-read the thread and re-plan; do not blindly repeat the write.
    """


class ThreadStoreUnavailableError(ThreadStoreError):
    """The backend cannot be reached. Retryable; a commit raising it applied nothing."""


class ThreadStoreConfigurationError(ThreadStoreError):
    """A bad URL or option, a missing driver, or a server that cannot honour the contract."""
