"""Reads: ``read_thread`` in one snapshot, ``list_threads`` in one index-ordered query.

:func:`read_thread` runs the core's read pipeline
(:func:`~pai_storage.backend.run_read`) over :class:`MongoSnapshot`, the read
primitives inside one snapshot (a snapshot session on MongoDB 5.0+, else a
read-only snapshot transaction): the root, ``$$NOW`` and the first page of
each family come in one aggregation. :func:`list_threads` reads one page of
roots, skipping (with a warning) those that cannot be decoded.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import BSONError
from bson.raw_bson import RawBSONDocument
from pymongo import ASCENDING, DESCENDING
from pymongo.errors import ServerSelectionTimeoutError

from pai_storage import (
    ListThreadsInput,
    Page,
    ReadThreadInput,
    StoreWarning,
    ThreadReadResult,
    ThreadRecord,
)
from pai_storage.backend import (
    FAMILIES,
    ChildPagePlan,
    Entry,
    FamilyName,
    FamilySpec,
    ReadPlan,
    ReadSnapshot,
    SnapshotRoot,
    Window,
    run_read,
)
from pai_storage.errors import ThreadStoreInvariantError

from .documents import decode_or_invalid, read_child, read_root, root_facts
from .hold import CachedRoot
from .indexes import LIST_SORT, Doc
from .transactions import TXN_OPTIONS, abort, guard

_A, _D = ASCENDING, DESCENDING

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession

    from .store import MongoThreadStore


__all__ = ["MongoSnapshot", "list_threads", "read_thread"]

_NO_UPPER = 2**63 - 1  # a first page's speculative window: every stored position


async def read_thread(store: MongoThreadStore, request: ReadThreadInput) -> ThreadReadResult:
    plan = store.selections.plan_read(request)
    key = {"scopeKey": request.scope_key, "threadId": request.thread_id}

    async def attempt() -> ThreadReadResult:
        if store._snapshot_reads:
            # MongoDB 5.0+: every read of the session sees one snapshot, with no
            # transaction to end; the first page usually comes with the root.
            async with store._snapshot_session() as session:
                snapshot = MongoSnapshot(store, session, key, store.now(), plan)
                return await run_read(snapshot, plan, clock_now=snapshot.test_now)
        async with store._session() as session:
            await session.start_transaction(**TXN_OPTIONS)
            try:
                snapshot = MongoSnapshot(store, session, key, store.now(), plan)
                result = await run_read(snapshot, plan, clock_now=snapshot.test_now)
            except BaseException as exc:
                if not isinstance(exc, ServerSelectionTimeoutError):
                    await abort(session)
                raise
            # Read-only: aborting ends it like a commit would, and never fails loudly.
            await abort(session)
            return result

    return await guard(store, "read", attempt)


async def list_threads(store: MongoThreadStore, request: ListThreadsInput) -> Page[ThreadRecord]:
    plan = store.selections.plan_list(request)
    query, hint = store.list_query(plan)
    threads = store._raw("threads", primary=False)  # the URL's read preference

    async def attempt() -> Page[ThreadRecord]:
        rows: list[ThreadRecord] = []
        skipped: list[StoreWarning] = []
        # Fast path: exactly ``fetch`` rows, so the server closes the cursor itself.
        # Only when invalid roots were skipped from a full batch is the rest read.
        limit: int | None = plan.fetch
        while True:
            seen = 0
            rows.clear()
            skipped.clear()
            # Raw rows, decoded one by one: a row whose bytes cannot be decoded
            # is skipped like any other invalid root, not fatal to the batch.
            cursor = threads.find(
                query, sort=LIST_SORT, hint=hint, limit=limit or 0, batch_size=plan.fetch
            )
            try:
                # A batch at a time (one await per batch, not per row).
                while len(rows) < plan.fetch:
                    batch = await cursor.to_list(plan.fetch - len(rows))
                    if not batch:
                        break
                    seen += len(batch)
                    for raw in batch:
                        try:
                            record, _ = read_root(raw)
                        except ThreadStoreInvariantError as exc:
                            skipped.append(_skipped(request.scope_key, raw, exc))
                            continue
                        rows.append(record)
            finally:
                await cursor.close()
            if limit is None or not skipped or seen < limit:
                break
            limit = None
        for warning in skipped:
            await store.warn(warning)
        return plan.finish(rows)

    return await guard(store, "read", attempt)


class MongoSnapshot(ReadSnapshot):
    """The read primitives inside one snapshot (a snapshot session, or a read-only
    snapshot transaction before MongoDB 5.0).

    The first page of each family the read asks for (no page token, no bound
    ids: a range that starts at either end) comes with the root in one
    aggregation; :meth:`scan` uses it when the window the pipeline computes
    holds every row it fetched, which it always does for valid data.
    """

    def __init__(
        self,
        store: MongoThreadStore,
        session: AsyncClientSession,
        key: Doc,
        test_now: datetime | None,
        plan: ReadPlan | None = None,
    ) -> None:
        self._store = store
        self._session = session
        self._key = key
        self.test_now = test_now
        self._plan = plan
        self._prefetched: dict[FamilyName, list[RawBSONDocument]] = {}

    def _first_pages(self) -> tuple[list[Doc], list[FamilyName]]:
        """``$lookup`` stages reading each first page the plan asks for."""
        stages: list[Doc] = []
        families: list[FamilyName] = []
        if self._plan is None or not self._store._first_pages_with_root:
            return stages, families
        names = self._store.collection_names()
        for spec in FAMILIES:
            selection = getattr(self._plan, spec.attr)
            if (
                not isinstance(selection, ChildPagePlan)
                or selection.is_continuation
                or selection.bound_ids() != (None, None)
            ):
                continue
            window = Window(0, _NO_UPPER, selection.order, selection.limit + 1, 0, 0, None)
            queries = self._store.page_queries(spec.name, self._key, selection, window)
            if len(queries) != 1:
                continue
            query, sort, _ = queries[0]
            stages.append(
                {
                    "$lookup": {
                        "from": names[spec.name],
                        "pipeline": [
                            {"$match": query},
                            {"$sort": dict(sort)},
                            {"$limit": window.fetch},
                        ],
                        "as": f"page_{spec.name}",
                    }
                }
            )
            families.append(spec.name)
        return stages, families

    async def head(self) -> SnapshotRoot:
        """The root, ``$$NOW`` and the first pages in one aggregation (``hello`` for a
        missing thread)."""
        pipeline: list[Doc] = [
            {"$match": self._key},
            {"$limit": 1},
            {"$replaceWith": {"root": "$$ROOT", "now": "$$NOW"}},
        ]
        stages, families = self._first_pages()
        pipeline += stages
        cursor = await self._store._raw("threads").aggregate(pipeline, session=self._session)
        docs = await cursor.to_list()
        if not docs:
            observed = self.test_now
            if observed is None:
                hello = await self._store._hello()
                observed = hello["localTime"]
            return SnapshotRoot(observed, None)
        try:
            stored, now = docs[0]["root"], docs[0]["now"]
            for name in families:
                self._prefetched[name] = list(docs[0][f"page_{name}"])
        except (BSONError, ValueError, KeyError, TypeError):
            raise ThreadStoreInvariantError(
                "invalid stored thread: the stored document cannot be decoded"
            ) from None
        observed = self.test_now or now
        if not isinstance(observed, datetime):  # pragma: no cover - $$NOW is a date
            raise ThreadStoreInvariantError("invalid stored thread: no observation time")
        if observed.tzinfo is None:
            observed = observed.replace(tzinfo=UTC)
        root, next_positions = read_root(stored)
        # What a commit of this thread will most likely hold next (see RootCache),
        # unless the cache holds these very bytes already (a commit's or a read's).
        roots, key = self._store._roots, (root.scope_key, root.thread_id)
        known = roots.get(key)
        if known is None or known.stored.raw != stored.raw:
            facts = root_facts(decode_or_invalid(stored, "thread"))
            if facts is not None:
                roots.offer(key, CachedRoot(stored, root, next_positions, facts))
        return SnapshotRoot(observed, root, next_positions)

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        return await self._store._load(self._session, spec, self._key, ids)

    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        cursor = self._store._col("messages").find(
            {**self._key, "messageId": {"$in": list(message_ids)}},
            projection={"_id": 0, "messageId": 1, "_order": 1},
            session=self._session,
        )
        positions: dict[str, int] = {}
        async for doc in cursor:
            try:
                positions[str(doc["messageId"])] = int(doc["_order"])
            except (KeyError, TypeError, ValueError):
                raise ThreadStoreInvariantError(
                    "invalid stored message: malformed fields"
                ) from None
        return positions

    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        """One index-ordered range scan (one per status, merged, for a status filter)."""
        prefetched = self._prefetched.pop(spec.name, None)
        if prefetched is not None and window.lower == 0:
            rows = [read_child(spec.model, raw) for raw in prefetched]
            if all(window.contains(position) for position, _ in rows):
                return rows
        collection = self._store._raw(spec.name)
        scans: list[list[tuple[int, Any]]] = []
        for query, sort, hint in self._store.page_queries(spec.name, self._key, plan, window):
            cursor = collection.find(
                query, sort=sort, limit=window.fetch, hint=hint, session=self._session
            )
            scans.append([read_child(spec.model, raw) for raw in await cursor.to_list()])
        if len(scans) == 1:
            return scans[0]
        merged = heapq.merge(*scans, key=lambda row: row[0], reverse=window.order == "newest")
        return list(itertools.islice(merged, window.fetch))


def _raw_thread_id(raw: RawBSONDocument) -> str | None:
    """The ``threadId`` of a raw row, or ``None`` when it cannot be read faithfully."""
    for handler in ("strict", "replace"):
        options: CodecOptions[Doc] = CodecOptions(
            unicode_decode_error_handler=handler,
            datetime_conversion=DatetimeConversion.DATETIME_AUTO,
        )
        try:
            thread_id = bson.decode(raw.raw, codec_options=options).get("threadId")
        except (BSONError, ValueError):
            continue
        if not isinstance(thread_id, str) or (handler == "replace" and "\ufffd" in thread_id):
            return None
        return thread_id
    return None


def _skipped(scope_key: str, raw: RawBSONDocument, exc: Exception) -> StoreWarning:
    return StoreWarning(
        kind="invalid_thread_skipped",
        reason=str(exc)[:300],
        scope_key=scope_key,
        thread_id=_raw_thread_id(raw),
    )
