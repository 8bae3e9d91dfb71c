"""The lifecycle primitives: the updated-at index, whole-thread load and restore, fork.

The core's retention sweeps, scope erasure, fork, export and import
(``docs/lifecycle.md``) run over these four, which the store's hooks
(``_thread_heads``, ``_load_thread``, ``_restore_thread``, ``_fork_copy``)
call: :func:`thread_heads` reads bounded ranges of the updated-at indexes;
:func:`load_thread` reads a whole thread from one snapshot;
:func:`restore_thread` and :func:`fork_copy` write one in one transaction, the
children in batches of at most :data:`COPY_BATCH`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bson.raw_bson import RawBSONDocument
from pymongo import ASCENDING, DESCENDING

from pai_storage import ThreadRecord, ThreadVersion
from pai_storage.backend import (
    FAMILIES,
    Entry,
    Family,
    FamilyName,
    ForkRequest,
    SourceChanged,
    ThreadAggregate,
    ThreadConflict,
    ThreadIndexEntry,
)
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.root_facts import read_facts

from .documents import child_document, decode_or_invalid, parse_child, parse_root, root_document
from .indexes import Doc, Keys, key_pattern
from .queries import heads_queries, live_ranges
from .reads import MongoSnapshot
from .relations import Reader
from .transactions import TXN_OPTIONS, abort, guard, in_transaction

_A, _D = ASCENDING, DESCENDING

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession

    from .store import MongoThreadStore


__all__ = ["COPY_BATCH", "fork_copy", "head", "load_thread", "restore_thread", "thread_heads"]

COPY_BATCH = 1000
"""The most documents a fork or a restore inserts with one ``insert_many``."""


def head(doc: Mapping[str, Any]) -> ThreadIndexEntry:
    """One entry of the updated-at index from a root's projection."""
    try:
        version = ThreadVersion.model_validate(doc.get("version"))
    except (ThreadStoreInvariantError, ValueError):
        raise ThreadStoreInvariantError("invalid stored thread: malformed version") from None
    updated = doc.get("updatedAt")
    scope, thread = doc.get("scopeKey"), doc.get("threadId")
    if not isinstance(updated, datetime) or not isinstance(scope, str):
        raise ThreadStoreInvariantError("invalid stored thread: malformed updatedAt")
    if not isinstance(thread, str):
        raise ThreadStoreInvariantError("invalid stored thread: malformed threadId")
    return ThreadIndexEntry(scope, thread, version, updated)


async def thread_heads(
    store: MongoThreadStore,
    scope_key: str | None,
    *,
    updated_before: datetime | None,
    after: ThreadIndexEntry | None,
    limit: int,
) -> Sequence[ThreadIndexEntry]:
    """Up to ``limit`` entries of the updated-at index, ascending, strictly after ``after``.

    One scope: ``scope_updated_asc`` (``{scopeKey, updatedAt, threadId}``),
    every query an equality on ``scopeKey``. Every scope (``None``):
    ``updated_scope_asc``, an administrative sweep sent to every shard
    (:func:`heads_of_every_scope`). The keyset bound is split into index
    ranges read one after the other (the rest of ``after``'s millisecond,
    then the later ones), so no query needs a blocking sort or examines an
    entry it does not return.
    """
    return await guard(
        store,
        "read",
        lambda: (
            heads_of_every_scope(store, updated_before, after, limit)
            if scope_key is None
            else heads_of_scope(store, scope_key, updated_before, after, limit)
        ),
    )


async def heads_of_scope(
    store: MongoThreadStore,
    scope_key: str,
    updated_before: datetime | None,
    after: ThreadIndexEntry | None,
    limit: int,
) -> list[ThreadIndexEntry]:
    heads: list[ThreadIndexEntry] = []
    ranges, sort, hint = heads_queries(scope_key, updated_before, after)
    for query in live_ranges(ranges, updated_before):
        if len(heads) >= limit:
            break
        async for doc in heads_cursor(store, query, sort, hint, limit - len(heads)):
            heads.append(head(doc))
    return heads


async def heads_of_every_scope(
    store: MongoThreadStore,
    updated_before: datetime | None,
    after: ThreadIndexEntry | None,
    limit: int,
) -> list[ThreadIndexEntry]:
    """The cross-scope sweep: documented as administrative (it reaches every shard)."""
    heads: list[ThreadIndexEntry] = []
    ranges, sort, hint = heads_queries(None, updated_before, after)
    for query in live_ranges(ranges, updated_before):
        if len(heads) >= limit:
            break
        async for doc in heads_cursor(store, query, sort, hint, limit - len(heads)):
            heads.append(head(doc))
    return heads


def heads_cursor(store: MongoThreadStore, query: Doc, sort: Keys, hint: Keys, limit: int) -> Any:
    projection = {"_id": 0, "scopeKey": 1, "threadId": 1, "version": 1, "updatedAt": 1}
    return store._col("threads").find(
        query, projection=projection, sort=sort, hint=hint, limit=limit
    )


async def load_thread(
    store: MongoThreadStore, scope_key: str, thread_id: str
) -> ThreadAggregate | None:
    """The root and every child, from one snapshot (a snapshot session on 5.0+).

    Each family is one query in ``_order`` order on its
    ``scope_thread_order_unique`` index.
    """
    key = {"scopeKey": scope_key, "threadId": thread_id}

    async def load(session: AsyncClientSession) -> ThreadAggregate | None:
        raw = await store._raw("threads").find_one(key, session=session)
        if raw is None:
            return None
        root, next_positions = parse_root(decode_or_invalid(raw, "thread"))
        families: dict[FamilyName, Family[Any]] = {}
        for spec in FAMILIES:
            what = spec.model.__name__
            entries: dict[str, Entry[Any]] = {}
            cursor = store._raw(spec.name).find(
                key,
                sort=[("_order", _A)],
                hint=key_pattern(spec.name, "scope_thread_order_unique"),
                session=session,
            )
            async for child in cursor:
                order, record = parse_child(spec.model, decode_or_invalid(child, what))
                entries[spec.record_id(record)] = Entry(order, record)
            families[spec.name] = Family(entries, next_positions[spec.name])
        return ThreadAggregate(
            root, families["messages"], families["runs"], families["queuedItems"]
        )

    async def attempt() -> ThreadAggregate | None:
        if store._snapshot_reads:
            async with store._snapshot_session() as session:
                return await load(session)
        async with store._session() as session:
            await session.start_transaction(**TXN_OPTIONS)
            try:
                return await load(session)
            finally:
                await abort(session)

    return await guard(store, "read", attempt)


async def restore_thread(
    store: MongoThreadStore, aggregate: ThreadAggregate
) -> ThreadVersion | None:
    """Write a whole thread in one transaction, only when it does not exist.

    The children first (``insert_many`` of at most :data:`COPY_BATCH`
    documents), then the root with its ``_facts``, read back from the
    children inside the transaction by the same bounded queries a commit
    uses. A concurrent create of the same thread makes one of the two
    transactions conflict; the retry then finds the thread.
    """
    root = aggregate.root
    key: Doc = {"scopeKey": root.scope_key, "threadId": root.thread_id}
    families: dict[FamilyName, Family[Any]] = {
        "messages": aggregate.messages,
        "runs": aggregate.runs,
        "queuedItems": aggregate.queued_items,
    }

    async def write(session: AsyncClientSession) -> ThreadVersion | None:
        existing = await store._raw("threads").find_one(key, session=session)
        if existing is not None:
            return parse_root(decode_or_invalid(existing, "thread"))[0].version
        for spec in FAMILIES:
            batch: list[Doc] = []
            for entry in families[spec.name]:
                batch.append(
                    child_document(
                        spec, root.scope_key, root.thread_id, entry.position, entry.record
                    )
                )
                if len(batch) == COPY_BATCH:
                    await store._col(spec.name).insert_many(batch, session=session)
                    batch = []
            if batch:
                await store._col(spec.name).insert_many(batch, session=session)
        positions = {name: family.next_position for name, family in families.items()}
        await write_new_root(store, session, key, root, positions)
        return None

    result = await in_transaction(store, write)
    store._roots.drop((root.scope_key, root.thread_id))
    return result


async def fork_copy(store: MongoThreadStore, fork: ForkRequest) -> ThreadRecord:
    """Plan and execute a fork in one transaction, the transcript streamed in batches.

    MongoDB cannot copy documents server-side inside a transaction
    (``$out`` and ``$merge`` are refused there), so the kept children pass
    through the client: one aggregation per family reads the source's
    kept documents in ``_order`` order with their ``threadId`` rewritten
    and no ``_id``, as raw BSON (never decoded), and they are inserted in
    batches of at most :data:`COPY_BATCH` (``insert_many``), so the
    client holds one batch at a time, never the transcript.

    The transaction reads one snapshot (read concern ``snapshot``): the
    fork's plan is made from reads in it, and it copies the source as it was
    then, so commits to the source go on meanwhile and neither waits for
    nor conflicts with the other. The fork's root, with its ``_facts``
    read back from the copied children, is inserted last; an existing
    thread of the fork's id is a :class:`ThreadConflict`.
    """
    source_key: Doc = {"scopeKey": fork.scope_key, "threadId": fork.source_thread_id}
    fork_key: Doc = {"scopeKey": fork.scope_key, "threadId": fork.thread_id}

    async def copy(session: AsyncClientSession) -> ThreadRecord:
        threads = store._raw("threads")
        snapshot = MongoSnapshot(store, session, source_key, None)
        plan = await fork.plan_in(store, snapshot)  # a missing source raises
        head = await snapshot.head()  # the snapshot's time, and its version again
        if head.root is None or head.root.version != plan.source_version:
            raise SourceChanged
        next_positions = head.next_positions
        existing = await threads.find_one(fork_key, session=session)
        if existing is not None:
            raise ThreadConflict(parse_root(decode_or_invalid(existing, "thread"))[0].version)
        root = plan.root(head.observed_at)
        dropped = sorted(plan.dropped_run_ids)
        kept_messages: Doc = {**source_key}
        if plan.through_message_id is not None:
            cut = await store._col("messages").find_one(
                {**source_key, "messageId": plan.through_message_id},
                projection={"_id": 0, "_order": 1},
                session=session,
            )
            if cut is None:  # the plan was made from this very version
                raise SourceChanged
            kept_messages["_order"] = {"$lte": cut["_order"]}
        kept_runs: Doc = {**source_key}
        if dropped:
            kept_messages["association.runId"] = {"$nin": dropped}
            kept_runs["runId"] = {"$nin": dropped}
        for family, kept in (("messages", kept_messages), ("runs", kept_runs)):
            await copy_children(store, session, family, kept, plan.thread_id)
        await write_new_root(store, session, fork_key, root, next_positions)
        return root

    return await in_transaction(store, copy)


async def copy_children(
    store: MongoThreadStore, session: AsyncClientSession, family: str, kept: Doc, thread_id: str
) -> None:
    """Copy the kept children of one family to ``thread_id``, a batch at a time."""
    source = store._raw(family)
    target = store._raw(family)
    cursor = await source.aggregate(
        [
            {"$match": kept},
            {"$sort": {"_order": 1}},
            {"$set": {"threadId": {"$literal": thread_id}}},
            {"$unset": "_id"},
        ],
        hint=dict(key_pattern(family, "scope_thread_order_unique")),
        batchSize=COPY_BATCH,
        session=session,
    )
    batch: list[RawBSONDocument] = []
    async for doc in cursor:
        batch.append(doc)
        if len(batch) == COPY_BATCH:
            await target.insert_many(batch, session=session)
            batch = []
    if batch:
        await target.insert_many(batch, session=session)


async def write_new_root(
    store: MongoThreadStore,
    session: AsyncClientSession,
    key: Doc,
    root: ThreadRecord,
    next_positions: Mapping[FamilyName, int],
) -> None:
    """Insert a new thread's root, its ``_facts`` read from its children (same transaction)."""
    reader = Reader(store, session, key, prefetch=set(), tail=None, queue_unchanged=False)
    facts = await read_facts(reader)
    await store._col("threads").insert_one(
        root_document(root, next_positions, facts), session=session
    )
