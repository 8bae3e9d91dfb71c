"""The MongoDB execution guard: one document per held lock, fencing tokens from a counter.

Collection ``pai_locks`` by default (see :mod:`pai_storage_mongo.client`). A
held lock is the document::

    {_id: "<resource>", token: "<uuid4 hex>", owner, fencingToken: Int64,
     acquiredAt: Date, expiresAt: Date}

and the fencing counter is one more document in the same collection,
``{_id: {counter: "fencing"}, value: Int64}`` (a non-string ``_id``, so no
resource name can address it). A TTL index ``{expiresAt: 1}`` with
``expireAfterSeconds: 0``, partial on ``expiresAt`` existing, lets MongoDB
remove expired locks in the background and never touches the counter.

Every primitive is judged on the server's clock (``$$NOW``) or the test clock:

- acquire: one multi-document transaction (committed whole or not at all:
  nobody ever sees a lock without its fencing token). In it, an upserting
  ``findAndModify`` on ``{_id: resource}`` whose pipeline keeps a live lock
  unchanged and replaces an absent or expired one with the caller's (every
  caller value a ``$literal``); the caller holds the lock when the document
  it gets back carries its token, else the transaction is aborted ("busy",
  no token drawn). Then the next value of the counter (``$inc``) is put on
  the lock, and the transaction commits. Two transactions writing the same
  lock or the counter conflict: the server aborts one, which is tried again,
  so of concurrent acquisitions of a free resource exactly one wins, and
  fencing tokens increase in the order acquisitions commit: a holder's is
  greater than that of every earlier holder of the resource, whatever
  expired or was deleted.
- renew and release: an update or delete matched by ``_id``, token and an
  unexpired lease. Release is a plain delete whose count is the answer (an
  expired lock of ours is deleted by a second one and answers ``False``): a
  delete the driver retried after a lost reply is answered from the server's
  record of the first attempt, so the count holds whichever attempt applied.

See ``docs/mongodb.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pymongo
from bson import Int64
from pymongo import ASCENDING, IndexModel, ReadPreference, ReturnDocument
from pymongo.errors import PyMongoError, ServerSelectionTimeoutError
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from pai_storage.errors import ConfigurationError, StorageError, UnavailableError
from pai_storage.guard import ExecutionGuard, LockInfo

from .client import closed_error
from .documents import decoded
from .errors import is_duplicate_key, is_transient, is_write_conflict
from .runtime import MongoRuntimeStore

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession

__all__ = ["COUNTER_ID", "MongoExecutionGuard", "indexes"]

_log = logging.getLogger("pai_storage")

COUNTER_ID: Mapping[str, str] = {"counter": "fencing"}
"""The ``_id`` of the fencing counter document (never a resource: resources are strings)."""

TTL_INDEX = "expiresAt_ttl"

_PENDING = 0
"""The fencing token of a lock inside its acquisition's transaction (never seen outside it)."""

_TXN_OPTIONS: Mapping[str, Any] = {
    "read_concern": ReadConcern("snapshot"),
    "write_concern": WriteConcern("majority"),
    "read_preference": ReadPreference.PRIMARY,
}
_TXN_ATTEMPTS = 20
"""How often an acquisition's transaction is tried when the server aborts it (conflicts)."""
_RETRY_DELAY = 0.002
_MAX_RETRY_DELAY = 0.05
_ABORT_SECONDS = 2.0
"""The bound on aborting a transaction (with the server gone it dies with its session)."""

Doc = dict[str, Any]


def indexes() -> list[IndexModel]:
    """The indexes of the lock collection (``_id`` is the resource: no other key is needed)."""
    return [
        IndexModel(
            [("expiresAt", ASCENDING)],
            name=TTL_INDEX,
            expireAfterSeconds=0,
            partialFilterExpression={"expiresAt": {"$exists": True}},
        )
    ]


class MongoExecutionGuard(MongoRuntimeStore, ExecutionGuard):
    """Locks in a MongoDB collection, sharing the client of a ``connect()`` call.

    A lost connection while a write is in flight raises
    :class:`~pai_storage.errors.OutcomeUnknownError`; for an acquisition the
    lock may then be held until its lease ends.

    Takes the parameters of :class:`~pai_storage_mongo.runtime.MongoRuntimeStore`
    (``url``, ``client``, where the collection lives) and the options of
    :class:`~pai_storage.guard.ExecutionGuard` (``lock_timeout``,
    ``lease_ttl``, ``retry_interval``, ``clock``, ``on_warning``,
    ``token_secret``).
    """

    component = "guard"

    def _indexes(self) -> list[IndexModel]:
        return indexes()

    def _unopened_error(self) -> ConfigurationError:
        """The closed-store error of the client holder's operations."""
        return closed_error()

    # ------------------------------------------------------------ queries

    def live_filter(self, resource: str) -> Doc:
        """The filter matching the unexpired lock on ``resource`` (EXPLAIN tests use it)."""
        now = self.now()
        if now is not None:
            return {"_id": resource, "expiresAt": {"$gt": now}}
        return {"_id": resource, "$expr": {"$gt": ["$expiresAt", "$$NOW"]}}

    # ------------------------------------------------------------ primitives

    async def _acquire(
        self, resource: str, owner: str, token: str, lease_ttl: timedelta
    ) -> LockInfo | None:
        now = self._now()
        # Keep a live lock as it is (a no-op write); otherwise, absent or expired,
        # replace it with ours. The caller's values are $literal: never read as
        # field paths, variables or operators, whatever they look like.
        take = [
            {
                "$replaceWith": {
                    "$cond": [
                        {"$gt": ["$expiresAt", now]},
                        "$$ROOT",
                        {
                            "_id": {"$literal": resource},
                            "token": {"$literal": token},
                            "owner": {"$literal": owner},
                            "fencingToken": Int64(_PENDING),
                            "acquiredAt": now,
                            "expiresAt": {"$add": [now, _millis(lease_ttl)]},
                        },
                    ]
                }
            }
        ]
        client = self.collection.database.client
        delay = _RETRY_DELAY
        for attempt in range(1, _TXN_ATTEMPTS + 1):
            try:
                async with client.start_session(causal_consistency=False) as session:
                    return await self._take(session, resource, owner, token, take)
            except _LockConflict as conflict:
                if attempt == _TXN_ATTEMPTS:
                    # Another transaction keeps writing this lock: an acquisition in
                    # flight, or one of a client that died mid-way, which the server
                    # ends within its transaction lifetime. Busy, as far as we know.
                    return None
                _log.debug("an acquisition of %r conflicted; retrying", resource, exc_info=conflict)
            except PyMongoError as exc:
                retry = is_transient(exc) and not isinstance(exc, ServerSelectionTimeoutError)
                if not retry or attempt == _TXN_ATTEMPTS:
                    if is_transient(exc):
                        raise UnavailableError(
                            "MongoDB kept aborting the acquisition's transaction (another "
                            "transaction holds the fencing counter: a client that died in the "
                            "middle of an acquisition holds it until the server ends its "
                            "transaction, within 60 s by default); nothing was acquired"
                        ) from exc
                    with self._holder.errors("write"):
                        raise
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, _MAX_RETRY_DELAY)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _take(
        self,
        session: AsyncClientSession,
        resource: str,
        owner: str,
        token: str,
        take: list[Doc],
    ) -> LockInfo | None:
        """One transaction: take the lock, draw the next fencing token, put it on the lock.

        Committed whole or not at all, so nobody ever sees a lock without its
        token; a busy resource aborts it (no token drawn). Concurrent
        transactions on the lock or the counter conflict and one is retried.
        """
        await session.start_transaction(**_TXN_OPTIONS)
        try:
            try:
                doc = await self._modify.find_one_and_update(
                    {"_id": resource},
                    take,
                    projection={"token": 1, "acquiredAt": 1, "expiresAt": 1},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                    session=session,
                )
            except PyMongoError as exc:
                if is_duplicate_key(exc):
                    return None  # a racing acquisition inserted the lock first
                if is_transient(exc) and is_write_conflict(exc):
                    raise _LockConflict from exc
                raise
            doc = decoded(doc)
            if doc is None or doc.get("token") != token:
                return None  # a live lock holds the resource
            counter = decoded(
                await self._modify.find_one_and_update(
                    {"_id": dict(COUNTER_ID)},
                    {"$inc": {"value": Int64(1)}},
                    projection={"_id": 0, "value": 1},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                    session=session,
                )
            )
            value = (counter or {}).get("value")
            if not isinstance(value, int):
                raise StorageError("the fencing counter document of the lock collection is damaged")
            await self.collection.update_one(
                {"_id": resource, "token": token},
                {"$set": {"fencingToken": Int64(value)}},
                session=session,
            )
            await session.commit_transaction()
        finally:
            if session.in_transaction:  # busy or failed: nothing of it is kept
                with contextlib.suppress(PyMongoError), pymongo.timeout(_ABORT_SECONDS):
                    await session.abort_transaction()
        return LockInfo.model_construct(
            resource=resource,
            owner=owner,
            fencing_token=int(value),
            acquired_at=_date(doc.get("acquiredAt")),
            expires_at=_date(doc.get("expiresAt")),
        )

    async def _renew(self, resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
        query = {**self.live_filter(resource), "token": token}
        renew = [{"$set": {"expiresAt": {"$add": [self._now(), _millis(lease_ttl)]}}}]
        with self._holder.errors("write"):
            doc = decoded(
                await self._modify.find_one_and_update(
                    query,
                    renew,
                    projection={"_id": 0, "expiresAt": 1},
                    return_document=ReturnDocument.AFTER,
                )
            )
        return None if doc is None else _date(doc.get("expiresAt"))

    async def _release(self, resource: str, token: str) -> bool:
        # Liveness is in the filter, never in the answer: a write the driver
        # retries is answered from the server's record of the first attempt
        # (for a delete, the count it deleted), whatever that reply computed.
        with self._holder.errors("write"):
            live = await self.collection.delete_one({**self.live_filter(resource), "token": token})
            if live.deleted_count:
                return True
            # Not live: an expired lock of ours may be left (the token keeps a
            # newer holder's lock out of reach).
            await self.collection.delete_one({"_id": resource, "token": token})
        return False

    async def _inspect(self, resource: str) -> LockInfo | None:
        doc = await self._read_lock(resource)
        if doc is None:
            return None
        owner, fencing = doc.get("owner"), doc.get("fencingToken")
        if type(owner) is not str or not isinstance(fencing, int):
            raise StorageError(f"the stored lock on resource {resource!r} is damaged")
        return LockInfo.model_construct(
            resource=resource,
            owner=owner,
            fencing_token=int(fencing),
            acquired_at=_date(doc.get("acquiredAt")),
            expires_at=_date(doc.get("expiresAt")),
        )

    async def _read_lock(self, resource: str) -> Doc | None:
        with self._holder.errors("read"):
            return await self.collection.find_one(
                self.live_filter(resource),
                projection={"owner": 1, "fencingToken": 1, "acquiredAt": 1, "expiresAt": 1},
            )

    async def _purge_expired(self) -> int:
        now = self.now()
        expired: Doc = (
            {"expiresAt": {"$lte": now}}
            if now is not None
            else {"expiresAt": {"$exists": True}, "$expr": {"$lte": ["$expiresAt", "$$NOW"]}}
        )
        with self._holder.errors("write"):
            result = await self.collection.delete_many(expired)
        return int(result.deleted_count)


class _LockConflict(Exception):
    """Another transaction is writing the lock document (its cause: the server's error)."""


def _millis(duration: timedelta) -> int:
    return duration // timedelta(milliseconds=1)


def _date(value: object) -> datetime:
    if not isinstance(value, datetime):
        raise StorageError("MongoDB returned a lock without its acquisition or expiry time")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
