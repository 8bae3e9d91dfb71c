"""The MongoDB thread store: split collections, flat documents, one transaction per commit."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import BSONError, InvalidBSON
from bson.raw_bson import RawBSONDocument
from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument
from pymongo import timeout as pymongo_timeout
from pymongo.errors import OperationFailure, PyMongoError, ServerSelectionTimeoutError
from pymongo.operations import DeleteMany, InsertOne, ReplaceOne
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference
from pymongo.write_concern import WriteConcern

from pai_storage import (
    OPEN_STATUSES,
    ChildPagePlan,
    Clock,
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    DeleteChange,
    DeleteMutation,
    Entry,
    FamilyWrite,
    IdsPlan,
    InsertChange,
    LeaseConflict,
    ListPlan,
    ListThreadsInput,
    Message,
    MessageRef,
    Page,
    QueuedItem,
    QueueRef,
    ReadThreadInput,
    ReplaceChange,
    RunFacts,
    RunRecord,
    RunRef,
    SelectionHelpers,
    StoreInfo,
    StoreURL,
    StoreWarning,
    ThreadChanges,
    ThreadPage,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
    ThreadVersion,
    TruncateChange,
    WarningCallback,
    Window,
    apply_family_changes,
    apply_lease_change,
    apply_thread_root_update,
    check_condition,
    make_url,
    plan_relationship_validation,
    record_id,
    redact,
    stamp_message,
    stamp_queued_item,
    stamp_run,
    truncate_ms,
)

from .documents import (
    CHILD_ID_FIELD,
    CODEC_OPTIONS,
    SCHEMA_VERSION,
    child_document,
    parse_child,
    parse_root,
    root_document,
)
from .errors import (
    Phase,
    duplicate_key_value,
    is_duplicate_key,
    is_transient,
    is_unknown_commit,
    is_write_conflict,
    map_error,
)

if TYPE_CHECKING:
    from pymongo import AsyncMongoClient
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

__all__ = ["INDEXES", "LIST_SORT", "MongoThreadStore"]

Doc = dict[str, Any]
T = TypeVar("T")

DEFAULT_SERVER_SELECTION_TIMEOUT_MS = 5000
MAX_TRANSACTION_ATTEMPTS = 25
MAX_TRANSACTION_SECONDS = 15.0
ABORT_TIMEOUT_SECONDS = 2.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_A, _D = ASCENDING, DESCENDING

# The seed's index set plus two child-page indexes (docs/mongodb.md), by collection
# suffix ("" is the thread collection).
INDEXES: dict[str, list[tuple[str, list[tuple[str, int]], bool]]] = {
    "": [
        ("scope_thread_unique", [("scopeKey", _A), ("threadId", _A)], True),
        ("scope_updated", [("scopeKey", _A), ("updatedAt", _D), ("threadId", _A)], False),
        (
            "scope_visibility_updated",
            [("scopeKey", _A), ("listVisibility", _A), ("updatedAt", _D), ("threadId", _A)],
            False,
        ),
        (
            "scope_agent_visibility_updated",
            [
                ("scopeKey", _A),
                ("agent", _A),
                ("listVisibility", _A),
                ("updatedAt", _D),
                ("threadId", _A),
            ],
            False,
        ),
        (
            "scope_agent_visibility_parent_updated",
            [
                ("scopeKey", _A),
                ("agent", _A),
                ("listVisibility", _A),
                ("parentThreadId", _A),
                ("updatedAt", _D),
                ("threadId", _A),
            ],
            False,
        ),
        (
            "scope_agent_visibility_category_updated",
            [
                ("scopeKey", _A),
                ("agent", _A),
                ("listVisibility", _A),
                ("category", _A),
                ("updatedAt", _D),
                ("threadId", _A),
            ],
            False,
        ),
    ],
    "_messages": [
        (
            "scope_thread_message_unique",
            [("scopeKey", _A), ("threadId", _A), ("messageId", _A)],
            True,
        ),
        ("scope_thread_order_unique", [("scopeKey", _A), ("threadId", _A), ("_order", _A)], True),
        (
            "scope_thread_transcript_order",
            [("scopeKey", _A), ("threadId", _A), ("visibility.transcript", _A), ("_order", _A)],
            False,
        ),
        (
            "scope_thread_context_order",
            [("scopeKey", _A), ("threadId", _A), ("visibility.context", _A), ("_order", _A)],
            False,
        ),
        (
            "scope_thread_association_order",
            [
                ("scopeKey", _A),
                ("threadId", _A),
                ("association.kind", _A),
                ("association.runId", _A),
                ("_order", _A),
            ],
            False,
        ),
        (
            "scope_thread_status_order",
            [("scopeKey", _A), ("threadId", _A), ("status", _A), ("_order", _A)],
            False,
        ),
    ],
    "_pending_messages": [
        (
            "scope_thread_queue_item_unique",
            [("scopeKey", _A), ("threadId", _A), ("queueItemId", _A)],
            True,
        ),
        ("scope_thread_order_unique", [("scopeKey", _A), ("threadId", _A), ("_order", _A)], True),
        (
            "scope_thread_run_queue_item",
            [("scopeKey", _A), ("threadId", _A), ("runId", _A), ("queueItemId", _A)],
            False,
        ),
        # Not in the seed: queued-item pages filtered by run, in ``_order`` order.
        (
            "scope_thread_run_order",
            [("scopeKey", _A), ("threadId", _A), ("runId", _A), ("_order", _A)],
            False,
        ),
    ],
    "_runs": [
        ("scope_thread_run_unique", [("scopeKey", _A), ("threadId", _A), ("runId", _A)], True),
        ("scope_thread_order_unique", [("scopeKey", _A), ("threadId", _A), ("_order", _A)], True),
        (
            "scope_thread_status_run",
            [("scopeKey", _A), ("threadId", _A), ("status", _A), ("runId", _A)],
            False,
        ),
        (
            "scope_thread_status_admission_run",
            [
                ("scopeKey", _A),
                ("threadId", _A),
                ("status", _A),
                ("admission.queueItemId", _A),
                ("runId", _A),
            ],
            False,
        ),
        # Not in the seed: run pages filtered by status, in ``_order`` order (one
        # bounded scan per status; the seed's ``{status, runId}`` cannot give it).
        (
            "scope_thread_status_order",
            [("scopeKey", _A), ("threadId", _A), ("status", _A), ("_order", _A)],
            False,
        ),
    ],
}

_FAMILY_SUFFIX = {"messages": "_messages", "runs": "_runs", "queuedItems": "_pending_messages"}
_NOUN = {"messages": "message", "runs": "run", "queuedItems": "queued item"}
_FAMILY_MODEL: dict[str, Any] = {
    "messages": Message,
    "runs": RunRecord,
    "queuedItems": QueuedItem,
}

LIST_SORT = [("updatedAt", _D), ("threadId", _A)]
_HINT_VISIBLE = [("scopeKey", _A), ("listVisibility", _A), ("updatedAt", _D), ("threadId", _A)]
_HINT_ALL = [("scopeKey", _A), ("updatedAt", _D), ("threadId", _A)]
_HINT_AGENT = [
    ("scopeKey", _A),
    ("agent", _A),
    ("listVisibility", _A),
    ("updatedAt", _D),
    ("threadId", _A),
]
_HINT_PARENT = [*_HINT_AGENT[:3], ("parentThreadId", _A), *_HINT_AGENT[3:]]
_HINT_CATEGORY = [*_HINT_AGENT[:3], ("category", _A), *_HINT_AGENT[3:]]

# List rows stay raw BSON until each is decoded inside the skip-and-warn block.
_RAW_CODEC_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)

_TXN_OPTIONS: dict[str, Any] = {
    "read_concern": ReadConcern("snapshot"),
    "write_concern": WriteConcern("majority"),
    "read_preference": ReadPreference.PRIMARY,
}


class _Retry(Exception):
    """Internal: the transaction was aborted by the server and may be retried whole."""


def _ms_to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def _check_name(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ThreadStoreConfigurationError(f"{kind} must be a non-empty string")
    if "\x00" in value or "$" in value or (kind == "db_name" and any(c in value for c in '/\\. "')):
        raise ThreadStoreConfigurationError(f"{kind} {value!r} is not a valid MongoDB name")
    if kind == "collection_name" and value.startswith("system."):
        raise ThreadStoreConfigurationError("collection_name must not start with 'system.'")
    return value


class MongoThreadStore(ThreadStore):
    """Threads in MongoDB: split collections keyed by ``{scopeKey, threadId}``.

    Parameters
    ----------
    url:
        A ``mongodb://`` or ``mongodb+srv://`` connection string (a replica set
        or sharded cluster: commits use multi-document transactions).
    db_name:
        Database name; defaults to the URL's database, then ``"pai"``.
    collection_name:
        The thread collection (default ``"pai_threads"``); children live in
        ``<name>_messages``, ``<name>_pending_messages`` and ``<name>_runs``.
    clock:
        Test-only clock override; production uses the MongoDB primary's time.
    on_warning:
        Receives recoverable integrity warnings (e.g. a root skipped by
        ``list_threads``); failures in it are ignored.
    """

    backend_name = "mongo"

    def __init__(
        self,
        url: str | StoreURL,
        *,
        db_name: str | None = None,
        collection_name: str = "pai_threads",
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
    ) -> None:
        if clock is not None and not callable(clock):
            raise ThreadStoreConfigurationError("clock must be a callable returning a datetime")
        if on_warning is not None and not callable(on_warning):
            raise ThreadStoreConfigurationError("on_warning must be a callable")
        super().__init__(clock=clock, on_warning=on_warning)
        self.url = make_url(url)
        if self.url.scheme != "mongodb" or self.url.driver not in (None, "srv"):
            raise ThreadStoreConfigurationError(
                f"the mongo backend serves mongodb:// and mongodb+srv:// URLs, "
                f"not {self.url.full_scheme}://"
            )
        self.db_name = _check_name("db_name", db_name or self.url.database or "pai")
        self.collection_name = _check_name("collection_name", collection_name)
        self._client: AsyncMongoClient[Doc] | None = None
        self._db: AsyncDatabase[Doc] | None = None
        self._selections = SelectionHelpers("pai-mongo")
        self._server_version: str | None = None
        self._topology = ""

    def __repr__(self) -> str:
        return (
            f"MongoThreadStore({self.url.render()!r}, db_name={self.db_name!r}, "
            f"collection_name={self.collection_name!r})"
        )

    # ------------------------------------------------------------ plumbing

    def collection_names(self) -> dict[str, str]:
        """The four collection names, keyed ``threads``/``messages``/``runs``/``queuedItems``."""
        base = self.collection_name
        names = {"threads": base}
        names.update({family: base + suffix for family, suffix in _FAMILY_SUFFIX.items()})
        return names

    def _col(self, family: str) -> AsyncCollection[Doc]:
        if self._db is None:
            raise ThreadStoreConfigurationError("the store is not initialized")
        return self._db.get_collection(self.collection_names()[family])

    @property
    def database(self) -> AsyncDatabase[Doc]:
        """The PyMongo database (for operators and tests; initialize first)."""
        if self._db is None:
            raise ThreadStoreConfigurationError("the store is not initialized")
        return self._db

    def _session(self) -> AsyncClientSession:
        if self._client is None:
            raise ThreadStoreConfigurationError("the store is not initialized")
        return self._client.start_session(causal_consistency=False)

    def _error(self, exc: BaseException, phase: Phase) -> ThreadStoreError:
        if isinstance(exc, InvalidBSON):
            return ThreadStoreInvariantError(
                "invalid stored data: a stored document cannot be decoded "
                "(e.g. invalid UTF-8 or a corrupt escaped value)"
            )
        if isinstance(exc, BSONError) and not isinstance(exc, PyMongoError):
            return ThreadStoreInvariantError(
                redact(f"a value cannot be stored in MongoDB: {type(exc).__name__}", self.url)
            )
        return map_error(exc, phase, self.url)

    async def _guard(self, phase: Phase, op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op``; retry transient aborts (bounded); map driver errors."""
        deadline = time.monotonic() + MAX_TRANSACTION_SECONDS
        delay = 0.002
        attempt = 0
        while True:
            attempt += 1
            try:
                return await op()
            except ThreadStoreError:
                raise
            except _Retry as retry:
                cause = retry.__cause__ or retry
            except (PyMongoError, BSONError) as exc:
                retryable = is_transient(exc) or (phase == "write" and is_write_conflict(exc))
                if isinstance(exc, ServerSelectionTimeoutError) or not retryable:
                    # No server to retry against: report it now (fast), not after the bound.
                    raise self._error(exc, phase) from exc
                cause = exc
            if attempt >= MAX_TRANSACTION_ATTEMPTS or time.monotonic() + delay > deadline:
                if isinstance(cause, PyMongoError) and not is_transient(cause):
                    raise self._error(cause, phase) from cause
                raise ThreadStoreUnavailableError(
                    "MongoDB kept aborting the transaction (contention or failover); "
                    "nothing was applied"
                ) from cause
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.1)

    # ------------------------------------------------------------ lifecycle

    async def _initialize(self) -> None:
        from pymongo import AsyncMongoClient

        options: dict[str, Any] = {
            "tz_aware": True,
            "document_class": dict,
            "appname": "pai-storage",
        }
        query_keys = {key.lower() for key, _ in self.url.query}
        if "serverselectiontimeoutms" not in query_keys:
            options["serverSelectionTimeoutMS"] = DEFAULT_SERVER_SELECTION_TIMEOUT_MS
        try:
            client: AsyncMongoClient[Doc] = AsyncMongoClient(
                self.url.render(hide_password=False), **options
            )
        except (PyMongoError, ValueError, TypeError) as exc:
            if isinstance(exc, PyMongoError):
                raise self._error(exc, "connect") from exc
            raise ThreadStoreConfigurationError(
                redact(f"invalid MongoDB connection string: {exc}", self.url)
            ) from exc
        try:
            await self._prepare(client)
        except BaseException as exc:
            with suppress(Exception):  # closing a client that failed to prepare
                await client.close()
            if isinstance(exc, PyMongoError | BSONError):
                raise self._error(exc, "connect") from exc
            raise
        self._client = client
        self._db = client.get_database(self.db_name, codec_options=CODEC_OPTIONS)

    async def _prepare(self, client: AsyncMongoClient[Doc]) -> None:
        hello = await client.admin.command("hello")
        if hello.get("msg") == "isdbgrid":
            self._topology = "sharded cluster (mongos)"
        elif hello.get("setName"):
            self._topology = f"replica set {hello['setName']}"
        else:
            raise ThreadStoreConfigurationError(
                "this MongoDB server is a standalone mongod, which cannot run the "
                "multi-document transactions every commit needs: run it as a replica set "
                "(e.g. start mongod with --replSet rs0 and run rs.initiate() once; a "
                "single-node replica set is enough for development)"
            )
        if hello.get("logicalSessionTimeoutMinutes") is None:
            raise ThreadStoreConfigurationError(
                "this MongoDB deployment does not support sessions, so it cannot run "
                "transactions (MongoDB 4.2 or later as a replica set or sharded cluster)"
            )
        build = await client.admin.command("buildInfo")
        self._server_version = str(build.get("version"))
        parts = [int(p) for p in build.get("versionArray", [0, 0])[:2]]
        if parts < [4, 2]:
            raise ThreadStoreConfigurationError(
                f"MongoDB {self._server_version} is too old: 4.2 or later is required"
            )
        db = client.get_database(self.db_name)
        # Strings must compare in code-point order: refuse collections created with a
        # default collation (the indexes would inherit it).
        names = [self.collection_name + suffix for suffix in INDEXES]
        cursor = await db.list_collections(filter={"name": {"$in": names}})
        async for info in cursor:
            collation = (info.get("options") or {}).get("collation")
            if collation and collation.get("locale") != "simple":
                raise ThreadStoreConfigurationError(
                    f"collection {info['name']!r} has a default collation; pai-storage needs "
                    "the simple (binary, code-point) collation for thread ids"
                )
        # Prove it: open a snapshot transaction, read, and abort (no write).
        async with client.start_session(causal_consistency=False) as session:
            await session.start_transaction(**_TXN_OPTIONS)
            try:
                await db.get_collection(self.collection_name).find_one(
                    {"scopeKey": None}, session=session
                )
            except PyMongoError as exc:
                if isinstance(exc, OperationFailure) and not is_transient(exc):
                    raise ThreadStoreConfigurationError(
                        "this MongoDB deployment refused a multi-document transaction "
                        f"({type(exc).__name__}, code {exc.code}); a replica set or sharded "
                        "cluster with transactions enabled is required"
                    ) from exc
                raise
            finally:
                await self._abort(session)
        # Idempotent: creating an index that exists with the same spec is a no-op.
        await asyncio.gather(
            *(
                db.get_collection(self.collection_name + suffix).create_indexes(
                    [
                        IndexModel(keys, name=name, unique=True)
                        if unique
                        else IndexModel(keys, name=name)
                        for name, keys, unique in specs
                    ]
                )
                for suffix, specs in INDEXES.items()
            )
        )

    async def _close(self) -> None:
        client, self._client, self._db = self._client, None, None
        if client is not None:
            await client.close()

    async def _info(self) -> StoreInfo:
        return StoreInfo(
            backend="mongo",
            server_version=self._server_version,
            transactions=True,
            details={
                "topology": self._topology,
                "database": self.db_name,
                "collection": self.collection_name,
            },
        )

    async def server_time(self) -> datetime:
        """The MongoDB primary's current time (ms precision)."""
        hello = await self._guard("read", lambda: self.database.command("hello"))
        return truncate_ms(hello["localTime"])

    # ------------------------------------------------------------ reads

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self._selections.plan_read(request)

        async def attempt() -> ThreadReadResult:
            async with self._session() as session:
                await session.start_transaction(**_TXN_OPTIONS)
                try:
                    result = await self._read_in(session, request, plan)
                except BaseException as exc:
                    if not isinstance(exc, ServerSelectionTimeoutError):
                        await self._abort(session)
                    raise
                # Read-only: aborting ends it like a commit would, and never fails loudly.
                await self._abort(session)
                return result

        return await self._guard("read", attempt)

    async def _read_in(
        self, session: AsyncClientSession, request: ReadThreadInput, plan: Any
    ) -> ThreadReadResult:
        key = {"scopeKey": request.scope_key, "threadId": request.thread_id}
        test_now = self.now()
        pipeline: list[Doc] = [{"$match": key}, {"$limit": 1}]
        if test_now is None:
            pipeline.append({"$addFields": {"_observedAt": "$$NOW"}})
        cursor = await self._col("threads").aggregate(pipeline, session=session)
        docs = await cursor.to_list()
        if not docs:
            if test_now is None:
                hello = await self.database.command("hello")
                test_now = truncate_ms(hello["localTime"])
            return ThreadReadResult(observed_at=test_now, thread=None)
        raw = docs[0]
        observed = raw.pop("_observedAt", None)
        observed_at = test_now if test_now is not None else truncate_ms(observed)
        root, next_order = parse_root(raw)
        version = root.version
        pages: dict[str, ThreadPage[Any]] = {}
        for attr, family, sub in (
            ("messages", "messages", plan.messages),
            ("runs", "runs", plan.runs),
            ("queued_items", "queuedItems", plan.queued_items),
        ):
            if sub is None:
                continue
            if isinstance(sub, IdsPlan):
                found = await self._load_by_ids(session, family, key, sub.ids)
                pages[attr] = sub.finish({i: e.record for i, e in found.items()}, version)
            else:
                pages[attr] = await self._read_page(
                    session, family, key, sub, version, next_order[family] - 1
                )
        return ThreadReadResult.model_construct(
            observed_at=observed_at,
            thread=root,
            messages=pages.get("messages"),
            runs=pages.get("runs"),
            queued_items=pages.get("queued_items"),
        )

    async def _load_by_ids(
        self,
        session: AsyncClientSession,
        family: str,
        key: Doc,
        ids: Iterable[str],
    ) -> dict[str, Entry[Any]]:
        id_field = CHILD_ID_FIELD[family]
        model = _FAMILY_MODEL[family]
        found: dict[str, Entry[Any]] = {}
        wanted = list(ids)
        if not wanted:
            return found
        cursor = self._col(family).find({**key, id_field: {"$in": wanted}}, session=session)
        async for doc in cursor:
            order, record = parse_child(model, doc)
            found[doc[id_field]] = Entry(order, record)
        return found

    async def _read_page(
        self,
        session: AsyncClientSession,
        family: str,
        key: Doc,
        plan: ChildPagePlan,
        version: ThreadVersion,
        high_water: int,
    ) -> ThreadPage[Any]:
        after_id, before_id = plan.bound_ids()
        positions: dict[str, int] = {}
        anchors = [i for i in (after_id, before_id) if i is not None]
        if anchors:
            cursor = self._col("messages").find(
                {**key, "messageId": {"$in": anchors}},
                projection={"_id": 0, "messageId": 1, "_order": 1},
                session=session,
            )
            async for doc in cursor:
                positions[doc["messageId"]] = int(doc["_order"])
            for anchor in anchors:
                if anchor not in positions:
                    raise plan.missing_anchor(anchor)
        window = plan.window(
            version,
            high_water,
            positions.get(after_id) if after_id is not None else None,
            positions.get(before_id) if before_id is not None else None,
        )
        rows: list[tuple[int, Any]] = []
        if window.upper - window.lower > 1:
            model = _FAMILY_MODEL[family]
            scans: list[list[tuple[int, Any]]] = []
            for query, sort, hint in self.page_queries(family, key, plan, window):
                cursor = self._col(family).find(
                    query, sort=sort, limit=window.fetch, hint=hint, session=session
                )
                scans.append([parse_child(model, doc) async for doc in cursor])
            if len(scans) == 1:
                rows = scans[0]
            else:  # one sorted scan per status: merge them in window order
                newest = window.order == "newest"
                merged = heapq.merge(*scans, key=lambda row: row[0], reverse=newest)
                rows = list(itertools.islice(merged, window.fetch))
        return plan.finish(window, rows, version)

    @staticmethod
    def page_queries(
        family: str, key: Doc, plan: ChildPagePlan, window: Window
    ) -> list[tuple[Doc, list[tuple[str, int]], list[tuple[str, int]]]]:
        """The filter, sort and index hint of each scan of one child page.

        Each is a bounded ``_order`` range read in index order (``limit`` page+1).
        A run page filtered by several statuses is one scan per status, merged
        by position; every other page is one scan.
        """
        query: Doc = {**key, "_order": {"$gt": window.lower, "$lt": window.upper}}
        hint = [("scopeKey", _A), ("threadId", _A), ("_order", _A)]
        sort = [("_order", _A if window.order == "oldest" else _D)]
        if family == "messages" and plan.view in ("transcript", "context"):
            field = f"visibility.{plan.view}"
            query[field] = True
            hint = [("scopeKey", _A), ("threadId", _A), (field, _A), ("_order", _A)]
        elif family == "runs" and plan.statuses is not None:
            hint = [("scopeKey", _A), ("threadId", _A), ("status", _A), ("_order", _A)]
            return [({**query, "status": status}, sort, hint) for status in sorted(plan.statuses)]
        elif family == "queuedItems" and plan.run_id is not None:
            query["runId"] = plan.run_id
            hint = [("scopeKey", _A), ("threadId", _A), ("runId", _A), ("_order", _A)]
        return [(query, sort, hint)]

    # ------------------------------------------------------------ lists

    def list_query(self, plan: ListPlan) -> tuple[Doc, list[tuple[str, int]]]:
        """The filter and index hint serving a planned list (sorted by :data:`LIST_SORT`).

        ``listVisibility`` is always bound (``"visible"`` or ``$in`` both values)
        so the ``updatedAt`` order comes from the index; the keyset cursor
        bounds ``updatedAt`` and filters the tie on ``threadId``.
        """
        query: Doc = {
            "scopeKey": plan.scope_key,
            "listVisibility": {"$in": ["visible", "hidden"]} if plan.include_hidden else "visible",
        }
        if plan.agent is not None:
            query["agent"] = plan.agent
            if plan.parent_thread_id is not None:
                hint = _HINT_PARENT
            elif plan.category is not None:
                hint = _HINT_CATEGORY
            else:
                hint = _HINT_AGENT
        else:
            hint = _HINT_ALL if plan.include_hidden else _HINT_VISIBLE
        if plan.parent_thread_id is not None:
            query["parentThreadId"] = plan.parent_thread_id
        if plan.category is not None:
            query["category"] = plan.category
        if plan.cursor is not None:
            updated_ms, thread_id = plan.cursor
            updated = _ms_to_datetime(updated_ms)
            query["updatedAt"] = {"$lte": updated}
            query["$or"] = [{"updatedAt": {"$lt": updated}}, {"threadId": {"$gt": thread_id}}]
        return query, hint

    def plan_list(self, request: ListThreadsInput) -> ListPlan:
        """Validate a list request and decode its page token (see :meth:`list_query`)."""
        return self._selections.plan_list(request)

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self._selections.plan_list(request)
        query, hint = self.list_query(plan)

        raw_threads = self._col("threads").with_options(codec_options=_RAW_CODEC_OPTIONS)

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
                cursor = raw_threads.find(
                    query, sort=LIST_SORT, hint=hint, limit=limit or 0, batch_size=plan.fetch
                )
                try:
                    async for raw in cursor:
                        seen += 1
                        try:
                            record, _ = parse_root(_decode_root(raw))
                        except ThreadStoreInvariantError as exc:
                            skipped.append(_skipped(request.scope_key, raw, exc))
                            continue
                        rows.append(record)
                        if len(rows) >= plan.fetch:
                            break
                finally:
                    await cursor.close()
                if limit is None or not skipped or seen < limit:
                    break
                limit = None
            for warning in skipped:
                await self.warn(warning)
            return plan.finish(rows)

        return await self._guard("read", attempt)

    # ------------------------------------------------------------ commits

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        async def attempt() -> CommittedResult | ConflictResult:
            async with self._session() as session:
                return await self._commit_once(session, request)

        return await self._guard("write", attempt)

    async def _commit_once(
        self, session: AsyncClientSession, request: CommitThreadInput
    ) -> CommittedResult | ConflictResult:
        await session.start_transaction(**_TXN_OPTIONS)
        try:
            outcome = await self._apply(session, request)
        except BaseException as exc:
            if not isinstance(exc, ServerSelectionTimeoutError):
                await self._abort(session)
            raise
        if isinstance(outcome, ConflictResult):
            await self._abort(session)
            return outcome
        await self._commit_transaction(session)
        return outcome

    async def _abort(self, session: AsyncClientSession) -> None:
        if session.in_transaction:
            # Bounded: with the server gone the transaction dies with its session anyway.
            with suppress(PyMongoError), pymongo_timeout(ABORT_TIMEOUT_SECONDS):
                await session.abort_transaction()

    async def _commit_transaction(self, session: AsyncClientSession) -> None:
        """Commit; an unknown outcome is retried briefly, then reported as unknown."""
        attempts = 0
        while True:
            attempts += 1
            try:
                await session.commit_transaction()
                return
            except PyMongoError as exc:
                if is_transient(exc) and not is_unknown_commit(exc):
                    raise _Retry() from exc  # provably not committed: retry it whole
                if not is_unknown_commit(exc) or attempts >= 2:
                    raise self._error(exc, "commit") from exc
                await asyncio.sleep(0.05 * attempts)

    async def _hold(
        self, session: AsyncClientSession, request: CommitThreadInput
    ) -> tuple[Doc | None, datetime | None]:
        """Write the root first (so the transaction holds the thread), then read its time.

        An update or delete marks the stored root in one round trip and gets it
        back, but only when it is at the expected version: a stale commit writes
        nothing (so it never causes a write conflict for the real writer) and
        reads the root once to report the conflict. A create reads first and
        upserts a placeholder only when the key is free; the final root replaces
        it. Returns the stored root (or ``None``) and the server's time at the
        hold (``None`` when nothing was held).
        """
        key = {"scopeKey": request.scope_key, "threadId": request.thread_id}
        threads = self._col("threads")
        if request.condition.type == "version":
            expected = request.condition.version
            held = await threads.find_one_and_update(
                {
                    **key,
                    "version.threadInstanceId": expected.thread_instance_id,
                    "version.revision": expected.revision,
                },
                [{"$set": {"_heldAt": "$$NOW"}}],
                return_document=ReturnDocument.AFTER,
                session=session,
            )
            if held is None:  # missing or at another version: a conflict, nothing written
                return await threads.find_one(key, session=session), None
            return held, held.pop("_heldAt")
        raw = await threads.find_one(key, session=session)
        if raw is not None:
            return raw, None
        placeholder = await threads.find_one_and_update(
            key,
            [{"$set": {"_schemaVersion": SCHEMA_VERSION, "_heldAt": "$$NOW"}}],
            projection={"_heldAt": 1},
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=session,
        )
        if placeholder is None:  # pragma: no cover - an upsert always returns the document
            raise _Retry()
        return None, placeholder["_heldAt"]

    async def _apply(
        self, session: AsyncClientSession, request: CommitThreadInput
    ) -> CommittedResult | ConflictResult:
        key: Doc = {"scopeKey": request.scope_key, "threadId": request.thread_id}
        threads = self._col("threads")
        raw, held_at = await self._hold(session, request)
        current: ThreadRecord | None = None
        next_order = {"messages": 1, "runs": 1, "queuedItems": 1}
        if raw is not None:
            current, next_order = parse_root(raw)
        conflict = check_condition(request, current.version if current else None)
        if conflict is not None:
            return conflict
        if held_at is None:  # the filter missed a root whose version matches: not a valid root
            raise ThreadStoreInvariantError("invalid stored thread: malformed version")
        now = self.now() or truncate_ms(held_at)
        if current is not None and now < current.updated_at:
            now = current.updated_at  # committed_at never goes backwards within a thread

        mutation = request.mutation
        if isinstance(mutation, DeleteMutation):
            assert raw is not None
            for family in ("messages", "runs", "queuedItems"):
                await self._col(family).delete_many(key, session=session)  # scoped
            await threads.delete_one({"_id": raw["_id"]}, session=session)
            return CommittedResult(type="committed", thread=None, committed_at=now)

        changes = mutation.changes or ThreadChanges()
        # Load only the previous rows the changes name as existing (replace, delete,
        # truncation boundary); an insert of an existing id is caught by the unique
        # index when it is written, before the lease is judged.
        prev_messages = await self._load_by_ids(
            session, "messages", key, _existing_ids(changes.messages)
        )
        prev_runs = await self._load_by_ids(session, "runs", key, _existing_ids(changes.runs))
        prev_items = await self._load_by_ids(
            session, "queuedItems", key, _existing_ids(changes.queued_items)
        )
        messages = apply_family_changes(
            "messages",
            changes.messages,
            prev_messages,
            next_order["messages"],
            now,
            stamp_message,
        )
        runs = apply_family_changes(
            "runs", changes.runs, prev_runs, next_order["runs"], now, stamp_run
        )
        queued = apply_family_changes(
            "queuedItems",
            changes.queued_items,
            prev_items,
            next_order["queuedItems"],
            now,
            stamp_queued_item,
        )

        truncated_message_runs: list[str] = []
        if messages.truncate_after is not None:
            cursor = await self._col("messages").aggregate(
                [
                    {
                        "$match": {
                            **key,
                            "_order": {"$gt": messages.truncate_after},
                            "association.kind": "run",
                        }
                    },
                    {"$group": {"_id": "$association.runId"}},
                ],
                session=session,
            )
            truncated_message_runs = [d["_id"] async for d in cursor if isinstance(d["_id"], str)]
        truncated_run_ids: list[str] = []
        if runs.truncate_after is not None:
            run_cursor = self._col("runs").find(
                {**key, "_order": {"$gt": runs.truncate_after}},
                projection={"_id": 0, "runId": 1},
                session=session,
            )
            truncated_run_ids = [d["runId"] async for d in run_cursor]

        for family, write, named in (
            ("messages", messages, changes.messages),
            ("runs", runs, changes.runs),
            ("queuedItems", queued, changes.queued_items),
        ):
            await self._write_family(session, family, key, write, named)

        lease = apply_lease_change(current.lease if current else None, changes.lease, now)
        if isinstance(lease, LeaseConflict):
            return ConflictResult(
                type="conflict", current_version=current.version if current else None
            )
        root = apply_thread_root_update(current, request, now, lease)
        await threads.replace_one(
            key,
            root_document(
                root,
                {
                    "messages": messages.next_position,
                    "runs": runs.next_position,
                    "queuedItems": queued.next_position,
                },
            ),
            session=session,
        )

        plan = plan_relationship_validation(
            changes,
            previous_message_runs={i: e.record.run_id for i, e in prev_messages.items()},
            previous_item_runs={i: e.record.run_id for i, e in prev_items.items()},
            truncated_message_runs=truncated_message_runs,
            truncated_run_ids=truncated_run_ids,
            lease=lease,
        )
        reader = _Reader(
            self,
            session,
            key,
            prefetch=plan.run_ids | ({lease.run_id} if lease is not None else set()),
            tail=messages.inserts[-1] if messages.inserts else None,
            queue_unchanged=not changes.queued_items and not changes.runs,
        )
        await plan.check(reader)
        return CommittedResult(type="committed", thread=root, committed_at=now)

    async def _write_family(
        self,
        session: AsyncClientSession,
        family: str,
        key: Doc,
        write: FamilyWrite[Any],
        changes: Sequence[Any] | None,
    ) -> None:
        id_field = CHILD_ID_FIELD[family]
        ops: list[Any] = []
        if write.truncate_after is not None:
            ops.append(DeleteMany({**key, "_order": {"$gt": write.truncate_after}}))
        if write.deletes:
            ops.append(DeleteMany({**key, id_field: {"$in": list(write.deletes)}}))
        scope, thread = key["scopeKey"], key["threadId"]
        for rid, entry in write.updates.items():
            doc = child_document(family, scope, thread, entry.position, entry.record)
            ops.append(ReplaceOne({**key, id_field: rid}, doc))
        inserts = [
            child_document(family, scope, thread, entry.position, entry.record)
            for entry in write.inserts
        ]
        collection = self._col(family)
        try:
            if not ops and len(inserts) == 1:
                await collection.insert_one(inserts[0], session=session)
            elif not ops and inserts:
                await collection.insert_many(inserts, ordered=True, session=session)
            elif ops or inserts:
                ops.extend(InsertOne(doc) for doc in inserts)
                await collection.bulk_write(ops, ordered=True, session=session)
        except PyMongoError as exc:
            if is_duplicate_key(exc):
                raise _duplicate_insert(
                    family, changes, duplicate_key_value(exc, id_field)
                ) from exc
            raise


def _duplicate_insert(
    family: str, changes: Sequence[Any] | None, rid: str | None
) -> ThreadStoreInvariantError:
    """The same error the reference model gives for an insert of an existing id."""
    noun = _NOUN[family]
    for index, change in enumerate(changes or ()):
        if isinstance(change, InsertChange) and (rid is None or record_id(change.record) == rid):
            return ThreadStoreInvariantError(
                f"changes.{family}[{index}]: insert of {noun} "
                f"{record_id(change.record)!r}, which already exists"
            )
    return ThreadStoreInvariantError(f"changes.{family}: insert of a {noun} that already exists")


_UNDECODABLE = "invalid stored thread: the stored document cannot be decoded"


def _decode_root(raw: RawBSONDocument) -> Doc:
    """Decode one raw list row with the store's codec; undecodable bytes are invalid."""
    try:
        return bson.decode(raw.raw, codec_options=CODEC_OPTIONS)
    except (BSONError, ValueError) as exc:  # ValueError: UnicodeDecodeError and the like
        raise ThreadStoreInvariantError(f"{_UNDECODABLE} ({type(exc).__name__})") from None


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


def _existing_ids(changes: Sequence[Any] | None) -> set[str]:
    """Ids the changes require to exist: replaced, deleted, or a truncation boundary."""
    ids: set[str] = set()
    for change in changes or ():
        if isinstance(change, ReplaceChange):
            ids.add(record_id(change.record))
        elif isinstance(change, DeleteChange):
            ids.add(change.id)
        elif isinstance(change, TruncateChange) and change.after_id is not None:
            ids.add(change.after_id)
    return ids


def _run_ref(doc: Mapping[str, Any]) -> RunRef:
    try:
        admission = doc["admission"]
        queue_item_id = admission.get("queueItemId")
        return RunRef(
            str(doc["runId"]),
            str(doc["status"]),
            bool(admission["admitted"]),
            queue_item_id if isinstance(queue_item_id, str) else None,
            tuple(str(i) for i in doc["inputMessageIds"]),
        )
    except (KeyError, TypeError, AttributeError):
        raise ThreadStoreInvariantError("invalid stored run: malformed fields") from None


def _message_ref(doc: Mapping[str, Any]) -> MessageRef:
    try:
        assoc = doc["association"]
        run_id = assoc.get("runId") if assoc.get("kind") == "run" else None
        relation = assoc.get("relation") if run_id is not None else None
        return MessageRef(str(doc["messageId"]), int(doc["_order"]), run_id, relation)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise ThreadStoreInvariantError("invalid stored message: malformed fields") from None


class _Reader:
    """The relationship planner's post-commit queries, inside the commit's transaction.

    It sees the transaction's own writes. Round trips are saved where the
    commit already knows the answer: runs are fetched once for the planned ids
    and the open runs together; the tail is the last inserted message when the
    commit inserted any; and when the commit changes no run and no queued item,
    each run's queued items are unchanged from the (valid) previous state, so
    they follow from the run itself.
    """

    def __init__(
        self,
        store: MongoThreadStore,
        session: AsyncClientSession,
        key: Doc,
        *,
        prefetch: set[str],
        tail: Entry[Any] | None,
        queue_unchanged: bool,
    ) -> None:
        self._store = store
        self._session = session
        self._key = key
        self._prefetch = prefetch
        self._tail = tail
        self._queue_unchanged = queue_unchanged
        self._runs: dict[str, RunRef] | None = None
        self._open: list[RunRef] | None = None

    async def _load_runs(self, ids: Iterable[str], with_open: bool) -> None:
        wanted = sorted(set(ids))
        query: Doc = {**self._key, "runId": {"$in": wanted}}
        if with_open:
            query = {
                **self._key,
                "$or": [
                    {"runId": {"$in": wanted}},
                    {"status": {"$in": ["running", "waiting"]}},
                ],
            }
        cursor = self._store._col("runs").find(
            query,
            projection={"_id": 0, "runId": 1, "status": 1, "admission": 1, "inputMessageIds": 1},
            session=self._session,
        )
        runs = self._runs if self._runs is not None else {}
        async for doc in cursor:
            ref = _run_ref(doc)
            runs[ref.run_id] = ref
        self._runs = runs

    async def open_runs(self) -> Sequence[RunRef]:
        if self._open is None:
            await self._load_runs(self._prefetch, with_open=True)
            assert self._runs is not None
            self._open = [r for r in self._runs.values() if r.status in OPEN_STATUSES]
        return self._open

    async def tail(self) -> MessageRef | None:
        if self._tail is not None:
            return MessageRef.of(self._tail.position, self._tail.record)
        doc = await self._store._col("messages").find_one(
            self._key,
            projection={"_id": 0, "messageId": 1, "_order": 1, "association": 1},
            sort=[("_order", _D)],
            session=self._session,
        )
        return _message_ref(doc) if doc is not None else None

    async def _run_messages(
        self, ids: list[str]
    ) -> tuple[dict[str, list[MessageRef]], dict[str, tuple[int, int, int]]]:
        """Each run's rule-relevant messages and its span ``(first, last, count)``.

        The rules look at a run's input-relation messages, whether anything
        precedes them, and its last message; so one grouped query returns, per
        run, the input messages, the first other message and the last one (in
        position order) instead of every message the run owns. That subset
        breaks rules 1 to 5 exactly when the full list does.
        """

        def ref(field: str) -> Doc:
            # ``o`` (the position) comes first: MongoDB compares embedded documents field
            # by field in stored order, so ``$min`` below picks the first by position.
            return {"o": "$_order", "m": "$messageId", "r": f"${field}"}

        is_input = {"$eq": ["$association.relation", "input"]}
        cursor = await self._store._col("messages").aggregate(
            [
                {
                    "$match": {
                        **self._key,
                        "association.kind": "run",
                        "association.runId": {"$in": ids},
                    }
                },
                {"$sort": {"_order": 1}},
                {
                    "$group": {
                        "_id": "$association.runId",
                        "n": {"$sum": 1},
                        "first": {"$first": "$_order"},
                        "last": {"$last": ref("association.relation")},
                        "inputs": {
                            "$push": {"$cond": [is_input, ref("association.relation"), "$$REMOVE"]}
                        },
                        "other": {"$min": {"$cond": [is_input, None, ref("association.relation")]}},
                    }
                },
            ],
            session=self._session,
        )
        messages: dict[str, list[MessageRef]] = {i: [] for i in ids}
        spans: dict[str, tuple[int, int, int]] = {}
        async for group in cursor:
            run_id = group["_id"]
            if run_id not in messages:
                continue
            try:
                picked = {
                    int(d["o"]): MessageRef(str(d["m"]), int(d["o"]), run_id, d.get("r"))
                    for d in (*group["inputs"], group["other"], group["last"])
                    if isinstance(d, dict)
                }
                last = int(group["last"]["o"])
                spans[run_id] = (int(group["first"]), last, int(group["n"]))
            except (KeyError, TypeError, ValueError):
                raise ThreadStoreInvariantError(
                    "invalid stored message: malformed fields"
                ) from None
            messages[run_id] = [picked[o] for o in sorted(picked)]
        return messages, spans

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunFacts]:
        ids = list(run_ids)
        key, session = self._key, self._session
        missing = [i for i in ids if self._runs is None or i not in self._runs]
        known_absent = self._runs is not None and set(missing) <= self._prefetch
        if missing and not known_absent:
            await self._load_runs(missing, with_open=False)
        runs = self._runs or {}
        messages, spans = await self._run_messages(ids)
        items: dict[str, list[tuple[int, QueueRef]]] = {i: [] for i in ids}
        if self._queue_unchanged:
            for run_id in ids:
                run = runs.get(run_id)
                if run is not None and run.status == "queued" and run.queue_item_id is not None:
                    items[run_id].append((0, QueueRef(run.queue_item_id, run_id)))
        else:
            item_cursor = self._store._col("queuedItems").find(
                {**key, "runId": {"$in": ids}},
                projection={"_id": 0, "queueItemId": 1, "runId": 1, "_order": 1},
                session=session,
            )
            async for doc in item_cursor:
                try:
                    run_id, item_id = str(doc["runId"]), str(doc["queueItemId"])
                    order = int(doc["_order"])
                except (KeyError, TypeError, ValueError):
                    raise ThreadStoreInvariantError("invalid stored queued item") from None
                if run_id in items:
                    items[run_id].append((order, QueueRef(item_id, run_id)))
        facts: dict[str, RunFacts] = {}
        for run_id in ids:
            owned = messages[run_id]
            foreign = False
            if run_id in spans:
                first, last, count = spans[run_id]
                if last - first + 1 != count:  # gaps: count what lies in between
                    between = await self._store._col("messages").count_documents(
                        {**key, "_order": {"$gte": first, "$lte": last}}, session=session
                    )
                    foreign = between != count
            facts[run_id] = RunFacts(
                run=runs.get(run_id),
                messages=owned,
                foreign_inside=foreign,
                queued_items=[ref for _, ref in sorted(items[run_id], key=lambda p: p[0])],
            )
        return facts
