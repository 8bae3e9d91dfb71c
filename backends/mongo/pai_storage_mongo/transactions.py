"""One multi-document transaction, its bounded retries and its end.

Every write of the thread store (a commit, a restore, a fork) runs in one
transaction with :data:`TXN_OPTIONS` (snapshot read concern, majority write
concern, the primary), inside :func:`guard`: the one retry loop, which
retries transient aborts whole (bounded: :data:`MAX_TRANSACTION_ATTEMPTS` or
:data:`MAX_TRANSACTION_SECONDS`) and maps every driver error
(:func:`~pai_storage_mongo.errors.map_error`). An aborted transaction wrote
nothing, so a retry starts from scratch.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

from bson.errors import BSONError
from pymongo import timeout as pymongo_timeout
from pymongo.errors import PyMongoError, ServerSelectionTimeoutError
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference
from pymongo.write_concern import WriteConcern

from pai_storage.backend import StoreURL
from pai_storage.errors import (
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreUnavailableError,
)

from .errors import (
    Phase,
    is_retryable_read,
    is_transient,
    is_unknown_commit,
    is_write_conflict,
    map_error,
)

T = TypeVar("T")

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession

    from .store import MongoThreadStore


__all__ = [
    "ABORT_TIMEOUT_SECONDS",
    "MAX_TRANSACTION_ATTEMPTS",
    "MAX_TRANSACTION_SECONDS",
    "TXN_OPTIONS",
    "Retry",
    "abort",
    "commit_transaction",
    "guard",
    "in_transaction",
]

MAX_TRANSACTION_ATTEMPTS = 25
MAX_TRANSACTION_SECONDS = 15.0
ABORT_TIMEOUT_SECONDS = 2.0

TXN_OPTIONS: dict[str, Any] = {
    "read_concern": ReadConcern("snapshot"),
    "write_concern": WriteConcern("majority"),
    "read_preference": ReadPreference.PRIMARY,
}


class Retry(Exception):
    """Internal: the transaction was aborted by the server and may be retried whole."""


async def guard(store: MongoThreadStore, phase: Phase, op: Callable[[], Awaitable[T]]) -> T:
    """Run ``op``; retry transient aborts (bounded); map every driver error."""
    deadline = time.monotonic() + MAX_TRANSACTION_SECONDS
    delay = 0.002
    attempt = 0
    while True:
        attempt += 1
        try:
            return await op()
        except ThreadStoreError:
            raise
        except Retry as retry:
            cause = retry.__cause__ or retry
        except (PyMongoError, BSONError) as exc:
            if store.closed:
                raise ThreadStoreConfigurationError(
                    "this store was closed while the operation ran; nothing more was done"
                ) from exc
            retryable = (
                is_transient(exc)
                or (phase == "write" and is_write_conflict(exc))
                or (phase == "read" and is_retryable_read(exc))
            )
            if isinstance(exc, ServerSelectionTimeoutError) or not retryable:
                # No server to retry against: report it now (fast), not after the bound.
                raise map_error(exc, phase, store.url) from exc
            cause = exc
        if attempt >= MAX_TRANSACTION_ATTEMPTS or time.monotonic() + delay > deadline:
            if isinstance(cause, PyMongoError) and not is_transient(cause):
                raise map_error(cause, phase, store.url) from cause
            raise ThreadStoreUnavailableError(
                "MongoDB kept aborting the transaction (contention or failover); "
                "nothing was applied"
            ) from cause
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 0.1)


async def in_transaction(
    store: MongoThreadStore, op: Callable[[AsyncClientSession], Awaitable[T]]
) -> T:
    """``op`` in one transaction, committed when it returns (retried like a commit)."""

    async def attempt() -> T:
        async with store._session() as session:
            await session.start_transaction(**TXN_OPTIONS)
            try:
                result = await op(session)
            except BaseException as exc:
                if not isinstance(exc, ServerSelectionTimeoutError):
                    await abort(session)
                raise
            await commit_transaction(session, store.url)
            return result

    return await guard(store, "write", attempt)


async def abort(session: AsyncClientSession) -> None:
    if session.in_transaction:
        # Bounded: with the server gone the transaction dies with its session anyway.
        with suppress(PyMongoError), pymongo_timeout(ABORT_TIMEOUT_SECONDS):
            await session.abort_transaction()


async def commit_transaction(session: AsyncClientSession, url: StoreURL) -> None:
    """Commit; an unknown outcome is retried briefly, then reported as unknown."""
    attempts = 0
    while True:
        attempts += 1
        try:
            await session.commit_transaction()
            return
        except PyMongoError as exc:
            if is_transient(exc) and not is_unknown_commit(exc):
                raise Retry() from exc  # provably not committed: retry it whole
            if not is_unknown_commit(exc) or attempts >= 2:
                raise map_error(exc, "commit", url) from exc
            await asyncio.sleep(0.05 * attempts)
