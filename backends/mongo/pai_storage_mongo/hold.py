"""The stamped hold: a commit's hold that writes its final root at once, and its root cache.

A commit holds its thread by writing the root first (:meth:`.commit.MongoCommit.hold`),
so that any concurrent commit of the thread becomes a write conflict. When
this store knows the stored root, :func:`stamp_ahead` makes that hold write
the root the commit will produce (it *stamps* it): the root's replace after
the relationship check is saved, and an append is three commands (the hold,
the insert, the commit).

Invariants
----------
1. A stamp replaces only the root this store knows: the ``findAndModify``
   filter compares the whole stored document with the cached bytes
   (``$expr`` ``$eq`` on ``$$ROOT``). A stale or foreign cache entry matches
   nothing and writes nothing; the usual hold follows.
2. Only a commit whose facts follow from its writes is stamped
   (:func:`~pai_storage.root_facts.facts_follow`: it inserts messages and
   inserts or replaces runs, with any root or lease change), so the stamped
   ``_facts`` are computed from the cached ones without a query.
3. A stamp is committed only when it is exactly what the pipeline produced:
   the commit checks the root (:meth:`Stamp.check_root`, byte for byte with
   its ``_id`` and facts) and, after the relationship check, the facts
   (:meth:`Stamp.check_facts`). A mismatch raises ``Unsure``; the
   transaction is aborted and the commit judged again without a stamp. A
   refused commit (conflict, invariant error) is aborted too, so nothing
   stamped and wrong is ever committed. Only the commit time differs from the
   usual hold's root: the server sets it (``$max`` of ``$$NOW`` and the last
   commit time; the test clock's time with one).
4. The cache (:class:`~pai_storage.root_cache.RootCache`, in the core, here
   of raw BSON roots) is a hint, never a source of truth: keyed by
   ``(scopeKey, threadId)``, bounded (least recently used out), holding
   immutable roots with counters of their own. :meth:`RootCache.offer` never
   replaces a newer revision of the same incarnation; the store drops an
   entry whenever the stored root becomes unknown (an unknown commit outcome,
   a delete, a restore).

The rest of the backend uses only :class:`RootCache`, :class:`CachedRoot`,
:func:`stamp_ahead`, :class:`Stamp` and the core's ``Unsure``: a different
hold can replace this module behind them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import bson
from bson.errors import BSONError
from bson.raw_bson import RawBSONDocument
from pymongo import ReturnDocument

from pai_storage import CommitThreadInput, ThreadLease, ThreadRecord, ThreadVersion
from pai_storage.backend import (
    FamilyName,
    MessageRef,
    RunRef,
    apply_thread_root_update,
    commit_time,
)
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.models import (
    AcquireLease,
    DeleteMutation,
    InsertChange,
    ReleaseLease,
    RenewLease,
    ReplaceChange,
    ThreadChanges,
)
from pai_storage.root_cache import CachedRoot as _CachedRoot
from pai_storage.root_cache import RootCache as _RootCache
from pai_storage.root_cache import Unsure
from pai_storage.root_facts import RootFacts, facts_follow

from .documents import root_document
from .indexes import Doc

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.asynchronous.collection import AsyncCollection

    pass


__all__ = ["CachedRoot", "RootCache", "Stamp", "lease_shape", "stamp_ahead"]

CachedRoot = _CachedRoot[RawBSONDocument]
"""A root as the server stores it (exact bytes), parsed, with its counters and facts."""
RootCache = _RootCache[RawBSONDocument]


class Stamp(NamedTuple):
    """A root the hold stamped: the document as written, and the known root it replaced."""

    written: RawBSONDocument
    """The stamped root as the server returned it (what the commit will store)."""
    held_at: datetime
    """Its ``updatedAt``: the commit time the server chose."""
    previous: CachedRoot
    """The known root it replaced: the pipeline judges the commit from it."""
    facts: RootFacts
    """The stamped facts: the previous ones after the commit's writes."""

    def check_root(self, root: ThreadRecord, next_positions: Mapping[FamilyName, int]) -> None:
        """Raise ``Unsure`` unless the pipeline's root is, byte for byte, the stamp."""
        expected = {
            "_id": self.previous.stored["_id"],
            **root_document(root, next_positions, self.facts),
        }
        if bson.encode(expected) != self.written.raw:
            raise Unsure()

    def check_facts(self, facts: RootFacts) -> None:
        """Raise ``Unsure`` unless the relationship check found the stamped facts."""
        if facts != self.facts:
            raise Unsure()


async def stamp_ahead(
    threads: AsyncCollection[RawBSONDocument],
    session: AsyncClientSession,
    key: Doc,
    request: CommitThreadInput,
    cached: CachedRoot | None,
    expected: ThreadVersion,
    test_now: datetime | None,
) -> Stamp | None:
    """Hold the thread by writing the root the commit will produce, when that is possible.

    Possible when ``cached`` is the stored root at the ``expected`` version,
    the commit does not delete the thread, and its facts follow from its
    writes (:func:`~pai_storage.root_facts.facts_follow`). One
    ``findAndModify`` filtered on the whole cached document, whose update
    pipeline replaces it with the commit's root — the commit time is
    ``$$NOW`` (never before the last commit; ``test_now`` instead with a test
    clock) and the lease times follow from it on the server — returns the
    stamped root. ``None``: nothing was written (no cache entry, the stored
    root is not the cached one, or the commit is not of that kind); hold the
    usual way.
    """
    commit_changes: ThreadChanges | None = getattr(request.mutation, "changes", None)
    if (
        cached is None
        or cached.root.version != expected
        or isinstance(request.mutation, DeleteMutation)
        or not facts_follow(commit_changes)
    ):
        return None
    previous = cached.root
    changes = commit_changes or ThreadChanges()
    if isinstance(changes.lease, RenewLease) and previous.lease is None:
        return None  # a conflict: nothing to write ahead
    inserted = [
        MessageRef.of(cached.next_positions["messages"] + i, cast(Any, c.record))
        for i, c in enumerate(changes.messages or ())
        if isinstance(c, InsertChange)
    ]
    runs = [
        (RunRef.of(cast(Any, c.record)), isinstance(c, InsertChange))
        for c in changes.runs or ()
        if isinstance(c, InsertChange | ReplaceChange)
    ]
    after = cached.facts.after(runs, inserted)
    if after is None:  # a run that was not open is replaced: its facts need queries
        return None
    facts = after[0]
    # Any time stands in for the commit time; the pipeline sets the real one.
    placeholder = previous.updated_at
    lease = lease_shape(previous.lease, changes.lease, placeholder)
    root = apply_thread_root_update(previous, request, placeholder, lease)
    counters = {**cached.next_positions}
    counters["messages"] += len(inserted)
    counters["runs"] += sum(1 for _, is_insert in runs if is_insert)
    base = {"_id": cached.stored["_id"], **root_document(root, counters, facts)}
    now: Any = (
        {"$literal": commit_time(test_now, previous)}
        if test_now is not None
        else {"$max": ["$$NOW", {"$literal": previous.updated_at}]}
    )
    pipeline: list[Doc] = [{"$replaceWith": {"$literal": base}}, {"$set": {"updatedAt": now}}]
    change = changes.lease
    if isinstance(change, AcquireLease | RenewLease):
        at = "lease.acquiredAt" if isinstance(change, AcquireLease) else "lease.renewedAt"
        pipeline.append(
            {
                "$set": {
                    at: "$updatedAt",
                    "lease.expiresAt": {"$add": ["$updatedAt", change.duration_ms]},
                }
            }
        )
    written_ahead = await threads.find_one_and_update(
        {**key, "$expr": {"$eq": ["$$ROOT", {"$literal": cached.stored}]}},
        pipeline,
        return_document=ReturnDocument.AFTER,
        session=session,
    )
    if written_ahead is None:  # the stored root is not the one this store knew
        return None
    try:
        written = written_ahead["updatedAt"]
    except (BSONError, ValueError, KeyError):  # pragma: no cover - the stamp wrote it
        written = None
    if not isinstance(written, datetime):  # pragma: no cover - $max of two dates
        raise ThreadStoreInvariantError("invalid stored thread: malformed updatedAt")
    held_at = written if written.tzinfo else written.replace(tzinfo=UTC)
    return Stamp(written_ahead, held_at, cached, facts)


def lease_shape(
    current: ThreadLease | None,
    change: AcquireLease | RenewLease | ReleaseLease | None,
    at: datetime,
) -> ThreadLease | None:
    """The lease a commit leaves when its lease change applies, its times all ``at``.

    Stamping ahead writes this shape and sets the times from the commit time
    on the server; whether the change applies at all is the pipeline's call.
    """
    if change is None:
        return current
    if isinstance(change, AcquireLease):
        return ThreadLease(
            kind="run",
            run_id=change.lease.run_id,
            owner_id=change.lease_owner_id,
            operation=change.operation,
            acquired_at=at,
            expires_at=at,
        )
    if isinstance(change, RenewLease) and current is not None:
        return current.model_copy(update={"renewed_at": at, "expires_at": at})
    return None
