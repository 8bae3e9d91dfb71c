"""A commit: the core's commit pipeline over MongoDB, in one multi-document transaction.

:class:`MongoCommit` supplies the primitives :func:`~pai_storage.backend.run_commit`
calls (hold, load rows, write families and the root, check relationships,
delete); :func:`commit_once` runs the pipeline in a transaction, a second time
when an assumption may have mattered (ids assumed new, a stamped root that the
pipeline did not produce), and keeps the stored root for the next commit. The
stamped hold and the root cache live in :mod:`.hold`; the relationship queries
in :mod:`.relations`. Every statement is filtered on ``{scopeKey, threadId}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import ReturnDocument
from pymongo.errors import PyMongoError, ServerSelectionTimeoutError
from pymongo.operations import DeleteMany, InsertOne, ReplaceOne

from pai_storage import CommittedResult, CommitThreadInput, ConflictResult, ThreadRecord
from pai_storage.backend import (
    FAMILIES,
    CommitTransaction,
    Entry,
    FamilyName,
    FamilySpec,
    FamilyWrite,
    HeldThread,
    RelationshipContext,
    RelationshipReader,
    duplicate_insert_error,
)
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.models import (
    DeleteChange,
    InsertChange,
    ReplaceChange,
    ThreadChanges,
    TruncateChange,
)
from pai_storage.root_cache import Unsure
from pai_storage.root_facts import NO_FACTS, RootFacts, check_rules, facts_after

from .documents import (
    SCHEMA_VERSION,
    child_document,
    decode_or_invalid,
    parse_root,
    read_root,
    root_document,
    root_facts,
)
from .errors import duplicate_key, is_duplicate_key
from .hold import CachedRoot, Stamp, stamp_ahead
from .indexes import Doc
from .relations import Reader
from .transactions import TXN_OPTIONS, Retry, abort, commit_transaction

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.asynchronous.collection import AsyncCollection

    from .store import MongoThreadStore


__all__ = ["InsertExists", "MongoCommit", "assumed_new", "commit_once"]


class InsertExists(Exception):
    """Internal: a unique index refused an insert the commit assumed new (see ``load_rows``)."""


def assumed_new(spec: FamilySpec, changes: Sequence[Any] | None) -> set[str]:
    """Ids a family's changes only insert, which a commit need not look up first.

    If such an id exists, the insert is the only change that can notice, and
    the unique index refuses it when it is written. With a truncation an insert
    can be cut again in the same commit and never written, so nothing is
    assumed then.
    """
    inserted: set[str] = set()
    named: set[str] = set()
    for change in changes or ():
        if isinstance(change, TruncateChange):
            return set()
        if isinstance(change, InsertChange):
            inserted.add(spec.record_id(change.record))
        elif isinstance(change, ReplaceChange):
            named.add(spec.record_id(change.record))
        elif isinstance(change, DeleteChange):
            named.add(change.id)
    return inserted - named


class MongoCommit(CommitTransaction):
    """The commit primitives inside one multi-document transaction.

    Every statement is filtered on the thread's ``{scopeKey, threadId}``.

    The root is written once per commit, with the thread's relationship
    facts (``_facts``, see :class:`~pai_storage_mongo.documents.RootFacts`):
    after the relationship check, or in the hold itself when the store knows
    the stored root and the commit's facts follow from its writes (it inserts
    messages and inserts or replaces runs; see :meth:`hold`). That makes an
    append three round trips: the hold, the insert and the commit.
    """

    def __init__(
        self,
        store: MongoThreadStore,
        session: AsyncClientSession,
        request: CommitThreadInput,
        *,
        exact: bool,
        write_ahead: bool = True,
    ) -> None:
        self._store = store
        self._session = session
        self._request = request
        self._key: Doc = {"scopeKey": request.scope_key, "threadId": request.thread_id}
        mutation = request.mutation
        self._changes: ThreadChanges | None = getattr(mutation, "changes", None)
        self._exact = exact
        self._write_ahead = write_ahead
        self._held_at: datetime | None = None
        self._root_id: Any = None
        self._previous_facts: RootFacts | None = None
        self._stamp: Stamp | None = None
        self._facts: RootFacts | None = None
        self._root: tuple[ThreadRecord, Mapping[FamilyName, int]] | None = None
        self._stored: RawBSONDocument | None = None
        self.unverified: set[FamilyName] = set()
        """Families with inserts assumed new and not yet written."""

    def stored(self, result: CommittedResult) -> CachedRoot | None:
        """The root this commit stored, for the store's cache (``None`` after a delete)."""
        if self._stored is None or self._root is None or self._facts is None:
            return None
        root, next_positions = self._root
        if result.thread is None or result.thread.version != root.version:
            return None
        return CachedRoot(self._stored, root, next_positions, self._facts)  # put() copies

    async def hold(self) -> HeldThread:
        """Write the root first, so the transaction holds the thread against others.

        When the store knows the stored root at the expected version and the
        commit's facts follow from its writes, the hold stamps the final root
        at once (:func:`~pai_storage_mongo.hold.stamp_ahead`, one
        ``findAndModify``). The pipeline then judges the commit from the known
        root, and :meth:`write_root` and :meth:`check_relationships` check that
        it produced exactly the stamped root (anything else is rolled back and
        judged again without a stamp).

        Otherwise an update or delete marks the stored root (``_heldAt:
        $$NOW``) and gets it back in one round trip, but only when it is at
        the expected version: a stale commit writes nothing (so it never
        causes a write conflict for the real writer) and reads the root once
        to report the conflict. A create reads first and upserts a
        placeholder only when the key is free. The final root replaces either
        after the relationship check.
        """
        threads = self._store._raw("threads")
        session = self._session
        condition = self._request.condition
        if condition.type == "version":
            expected = condition.version
            if self._write_ahead:
                key = (self._request.scope_key, self._request.thread_id)
                stamp = await stamp_ahead(
                    threads,
                    session,
                    self._key,
                    self._request,
                    self._store._roots.get(key),
                    expected,
                    self._store.now(),
                )
                if stamp is not None:
                    self._stamp = stamp
                    self._held_at = stamp.held_at
                    self._root_id = stamp.previous.stored["_id"]
                    self._previous_facts = stamp.previous.facts
                    self._facts = stamp.facts
                    return HeldThread(stamp.previous.root, stamp.previous.next_positions)
            held = await threads.find_one_and_update(
                {
                    **self._key,
                    "version.threadInstanceId": expected.thread_instance_id,
                    "version.revision": expected.revision,
                },
                [{"$set": {"_heldAt": "$$NOW"}}],
                return_document=ReturnDocument.AFTER,
                session=session,
            )
            if held is not None:
                doc = decode_or_invalid(held, "thread")
                self._held_at = doc.pop("_heldAt")
                self._root_id = doc.get("_id")
                result = HeldThread(*parse_root(doc, len(held.raw)))
                self._previous_facts = root_facts(doc)
                return result
            # Missing or at another version: a conflict, nothing written.
            stored = await self._root_of(threads)
            if stored.root is not None and stored.root.version == expected:
                # The filter missed a root whose version matches: not a valid root.
                raise ThreadStoreInvariantError("invalid stored thread: malformed version")
            return stored
        stored = await self._root_of(threads)
        if stored.root is not None:
            return stored
        placeholder = await threads.find_one_and_update(
            self._key,
            [{"$set": {"_schemaVersion": SCHEMA_VERSION, "_heldAt": "$$NOW"}}],
            projection={"_heldAt": 1},
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=session,
        )
        if placeholder is None:  # pragma: no cover - an upsert always returns the document
            raise Retry()
        doc = decode_or_invalid(placeholder, "thread")
        self._held_at = doc["_heldAt"]
        self._root_id = doc.get("_id")
        self._previous_facts = NO_FACTS
        return stored

    async def _root_of(self, threads: AsyncCollection[RawBSONDocument]) -> HeldThread:
        raw = await threads.find_one(self._key, session=self._session)
        if raw is None:
            return HeldThread(None)
        return HeldThread(*read_root(raw))

    async def server_time(self) -> datetime:
        """The primary's ``$$NOW`` when the hold wrote the root."""
        if not isinstance(self._held_at, datetime):  # pragma: no cover - hold() sets it
            raise ThreadStoreInvariantError("invalid stored thread: malformed hold time")
        return self._held_at

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        """The named rows, except (on the first attempt) ids the changes only insert."""
        wanted = ids
        if not self._exact:
            skip = assumed_new(spec, spec.changes(self._changes))
            wanted = [i for i in ids if i not in skip]
            if len(wanted) < len(ids):
                self.unverified.add(spec.name)
        return await self._store._load(self._session, spec, self._key, wanted)

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        """Check a root written ahead in the hold, or keep it for after the relationship check."""
        if self._stamp is not None:
            # The stamped document is exactly this root's, or the prediction was wrong.
            self._stamp.check_root(root, next_positions)
        self._root = (root, next_positions)

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        """One ordered bulk write: truncation, deletes, replacements, inserts."""
        key, session = self._key, self._session
        collection = self._store._col(spec.name)
        truncated: list[str] = []
        ops: list[Any] = []
        if write.truncate_after is not None:
            truncated = await self._truncated_runs(spec, write.truncate_after)
            ops.append(DeleteMany({**key, "_order": {"$gt": write.truncate_after}}))
        if write.deletes:
            ops.append(DeleteMany({**key, spec.id_field: {"$in": list(write.deletes)}}))
        scope, thread = key["scopeKey"], key["threadId"]
        for rid, entry in write.updates.items():
            doc = child_document(spec, scope, thread, entry.position, entry.record)
            ops.append(ReplaceOne({**key, spec.id_field: rid}, doc))
        inserts = [
            child_document(spec, scope, thread, entry.position, entry.record)
            for entry in write.inserts
        ]
        try:
            if not ops and len(inserts) == 1:
                await collection.insert_one(inserts[0], session=session)
            elif not ops and inserts:
                await collection.insert_many(inserts, ordered=True, session=session)
            elif ops or inserts:
                ops.extend(InsertOne(doc) for doc in inserts)
                await collection.bulk_write(ops, ordered=True, session=session)
        except PyMongoError as exc:
            if not is_duplicate_key(exc):
                raise
            refused = duplicate_key(exc)
            if "_order" in refused:  # the root's counter is behind its stored rows
                raise ThreadStoreInvariantError(
                    "invalid stored thread: _nextOrder is behind the stored positions"
                ) from exc
            if spec.name in self.unverified:
                raise InsertExists() from exc
            # The hold keeps other commits out, so this is an id the rows loaded missed.
            named = refused.get(spec.id_field)
            raise duplicate_insert_error(
                spec.name, spec.changes(self._changes), named if isinstance(named, str) else None
            ) from exc
        self.unverified.discard(spec.name)
        return truncated

    async def _truncated_runs(self, spec: FamilySpec, after: int) -> list[str]:
        """The run ids of the stored rows a truncation removes (read before it runs)."""
        above = {**self._key, "_order": {"$gt": after}}
        if spec.name == "messages":
            cursor = await self._store._col("messages").aggregate(
                [
                    {"$match": {**above, "association.kind": "run"}},
                    {"$group": {"_id": "$association.runId"}},
                ],
                session=self._session,
            )
            return [d["_id"] async for d in cursor if isinstance(d["_id"], str)]
        runs = self._store._col(spec.name).find(
            above, projection={"_id": 0, "runId": 1}, session=self._session
        )
        return [d["runId"] async for d in runs]

    async def delete_thread(self) -> None:
        """Scoped deletes only: the thread's own children, then its root."""
        for spec in FAMILIES:
            await self._store._col(spec.name).delete_many(self._key, session=self._session)
        await self._store._col("threads").delete_one(self._key, session=self._session)

    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        return self._reader(context)

    def _reader(self, context: RelationshipContext) -> Reader:
        inserted = context.writes["messages"].inserts
        changes = context.changes
        return Reader(
            self._store,
            self._session,
            self._key,
            prefetch=context.check.run_ids | ({context.lease.run_id} if context.lease else set()),
            tail=inserted[-1] if inserted else None,
            queue_unchanged=not changes.queued_items and not changes.runs,
        )

    async def check_relationships(self, context: RelationshipContext) -> None:
        """Check the rules, then write the root with the thread's facts after the commit.

        When the facts follow from the previous ones and this commit's writes,
        they answer the rules' queries (only runs they do not know are
        queried); otherwise the queries run and the facts are read back. A
        root written ahead in the hold is written already: its facts must be the
        ones derived here (they are, unless the prediction was wrong).
        """
        reader = self._reader(context)
        derived = await check_rules(self._previous_facts, context, reader)
        if self._root is None:  # pragma: no cover - the pipeline writes the root first
            raise RuntimeError("the root was not written before the relationship check")
        root, next_positions = self._root
        facts = await facts_after(self._previous_facts, context, reader, derived)
        if self._stamp is not None:
            self._stamp.check_facts(facts)
            self._stored = self._stamp.written
            return
        document = root_document(root, next_positions, facts)
        await self._store._col("threads").replace_one(self._key, document, session=self._session)
        self._facts = facts
        self._stored = RawBSONDocument(bson.encode({"_id": self._root_id, **document}))


async def commit_once(
    store: MongoThreadStore, session: AsyncClientSession, request: CommitThreadInput
) -> CommittedResult | ConflictResult:
    """One transaction; a second, exact one when an assumption may matter.

    The first attempt does not look up ids that the commit only inserts (the
    unique indexes refuse them if they exist). When it ends in anything but
    a commit before those inserts were written — a mechanical error, a lease
    conflict, or the unique index refusing one — it is rolled back and the
    commit is judged again with every named row loaded, so the outcome is
    exactly the reference's. Likewise a root written ahead in the hold that is
    not the one the pipeline judged is rolled back and the commit judged
    again without writing ahead.
    """
    exact = False
    write_ahead = True
    key = (request.scope_key, request.thread_id)
    while True:
        tx = MongoCommit(store, session, request, exact=exact, write_ahead=write_ahead)
        await session.start_transaction(**TXN_OPTIONS)
        try:
            outcome = await store._apply(session, request, tx)
        except BaseException as exc:
            if not isinstance(exc, ServerSelectionTimeoutError):
                await abort(session)
            if isinstance(exc, Unsure):
                write_ahead = False
                continue
            if tx.unverified and isinstance(exc, ThreadStoreInvariantError | InsertExists):
                exact = True
                continue
            raise
        if isinstance(outcome, CommittedResult):
            try:
                await commit_transaction(session, store.url)
            except BaseException:
                store._roots.drop(key)  # applied or not: the stored root is unknown
                raise
            entry = tx.stored(outcome)
            if entry is None:
                store._roots.drop(key)
            else:
                store._roots.put(key, entry)
            return outcome
        await abort(session)
        if not tx.unverified:
            return outcome
        exact = True
