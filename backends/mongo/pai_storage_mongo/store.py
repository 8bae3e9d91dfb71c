"""The MongoDB thread store: split collections, flat documents, one transaction per commit.

The judgement of every commit and read is the core's (:func:`run_commit`,
:func:`run_read`, ``docs/commits.md``); this module supplies its primitives
over MongoDB — a :class:`_MongoCommit` inside one multi-document transaction
and a :class:`_MongoSnapshot` inside one snapshot (a snapshot session on
MongoDB 5.0+, else a read-only snapshot transaction) — plus the collections,
indexes, sessions, retries and error mapping. The store runs on a
:class:`~pai_storage_mongo.client.MongoClientHolder`, its own or the one
``connect()`` shares among every store it opens.

Round trips are what a commit or read costs here, so the common ones are few:
an append is three commands (a hold that writes the final root, the insert,
the commit; see :meth:`_MongoCommit.hold`), and a read of a thread with the
first page of a family is one aggregation (:class:`_MongoSnapshot`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar, cast

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import BSONError
from bson.raw_bson import RawBSONDocument
from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument
from pymongo import timeout as pymongo_timeout
from pymongo.errors import OperationFailure, PyMongoError, ServerSelectionTimeoutError
from pymongo.operations import DeleteMany, InsertOne, ReplaceOne
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference
from pymongo.write_concern import WriteConcern

from pai_storage import (
    AcquireLease,
    Clock,
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    DeleteChange,
    DeleteMutation,
    InsertChange,
    ListThreadsInput,
    Page,
    ReadThreadInput,
    ReleaseLease,
    RenewLease,
    ReplaceChange,
    StorageError,
    StoreInfo,
    StoreWarning,
    ThreadChanges,
    ThreadLease,
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
)
from pai_storage.backend import (
    FAMILIES,
    LIFECYCLE,
    OPEN_STATUSES,
    ChildPagePlan,
    CommitTransaction,
    Entry,
    Family,
    FamilyName,
    FamilySpec,
    FamilyWrite,
    ForkRequest,
    HeldThread,
    ListPlan,
    MessageRef,
    QueueRef,
    ReadPlan,
    ReadSnapshot,
    RelationshipContext,
    RelationshipReader,
    RunRef,
    RunRelations,
    SnapshotRoot,
    SourceChanged,
    StoreURL,
    ThreadAggregate,
    ThreadConflict,
    ThreadIndexEntry,
    Window,
    apply_thread_root_update,
    commit_time,
    duplicate_insert_error,
    map_errors,
    redact,
    run_commit,
    run_read,
    truncate_ms,
)

from .client import MongoClientHolder
from .documents import (
    CODEC_OPTIONS,
    RAW_CODEC_OPTIONS,
    SCHEMA_VERSION,
    OpenRunSummary,
    RootSummary,
    child_document,
    decode_or_invalid,
    parse_child,
    parse_root,
    read_child,
    read_root,
    root_document,
    root_facts,
)
from .errors import (
    Phase,
    duplicate_key,
    is_duplicate_key,
    is_retryable_read,
    is_transient,
    is_unknown_commit,
    is_write_conflict,
    map_error,
    map_option_error,
)

if TYPE_CHECKING:
    from pymongo import AsyncMongoClient
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

__all__ = ["INDEXES", "LIST_SORT", "MongoThreadStore"]

Doc = dict[str, Any]
Keys = list[tuple[str, int]]
T = TypeVar("T")

DEFAULT_SERVER_SELECTION_TIMEOUT_MS = 5000
MAX_TRANSACTION_ATTEMPTS = 25
MAX_TRANSACTION_SECONDS = 15.0
ABORT_TIMEOUT_SECONDS = 2.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NO_UPPER = 2**63 - 1  # a first page's speculative window: every stored position

_A, _D = ASCENDING, DESCENDING

# The physical name of each collection: the thread collection's name plus a suffix.
_SUFFIX: dict[str, str] = {
    "threads": "",
    "messages": "_messages",
    "runs": "_runs",
    "queuedItems": "_pending_messages",
}


class Index(NamedTuple):
    """One index: its key pattern and whether it is unique."""

    keys: Keys
    unique: bool = False


_SCOPE_THREAD: Keys = [("scopeKey", _A), ("threadId", _A)]
_UPDATED: Keys = [("updatedAt", _D), ("threadId", _A)]


def _thread_child(*fields: str) -> Keys:
    return [*_SCOPE_THREAD, *((f, _A) for f in fields)]


# The documented index set plus two child-page indexes (docs/mongodb.md), by collection
# and index name. The query hints below are looked up here by name.
INDEXES: dict[str, dict[str, Index]] = {
    "threads": {
        "scope_thread_unique": Index(_SCOPE_THREAD, unique=True),
        "scope_updated": Index([("scopeKey", _A), *_UPDATED]),
        "scope_visibility_updated": Index([("scopeKey", _A), ("listVisibility", _A), *_UPDATED]),
        "scope_agent_visibility_updated": Index(
            [("scopeKey", _A), ("agent", _A), ("listVisibility", _A), *_UPDATED]
        ),
        "scope_agent_visibility_parent_updated": Index(
            [
                ("scopeKey", _A),
                ("agent", _A),
                ("listVisibility", _A),
                ("parentThreadId", _A),
                *_UPDATED,
            ]
        ),
        "scope_agent_visibility_category_updated": Index(
            [("scopeKey", _A), ("agent", _A), ("listVisibility", _A), ("category", _A), *_UPDATED]
        ),
        # Beyond the reference layout: the updated-at index of the lifecycle sweeps
        # (``_thread_heads``), one scope's and every scope's, in ascending order.
        "scope_updated_asc": Index([("scopeKey", _A), ("updatedAt", _A), ("threadId", _A)]),
        "updated_scope_asc": Index([("updatedAt", _A), ("scopeKey", _A), ("threadId", _A)]),
    },
    "messages": {
        "scope_thread_message_unique": Index(_thread_child("messageId"), unique=True),
        "scope_thread_order_unique": Index(_thread_child("_order"), unique=True),
        "scope_thread_transcript_order": Index(_thread_child("visibility.transcript", "_order")),
        "scope_thread_context_order": Index(_thread_child("visibility.context", "_order")),
        "scope_thread_association_order": Index(
            _thread_child("association.kind", "association.runId", "_order")
        ),
        "scope_thread_status_order": Index(_thread_child("status", "_order")),
    },
    "queuedItems": {
        "scope_thread_queue_item_unique": Index(_thread_child("queueItemId"), unique=True),
        "scope_thread_order_unique": Index(_thread_child("_order"), unique=True),
        "scope_thread_run_queue_item": Index(_thread_child("runId", "queueItemId")),
        # Beyond the reference layout: queued-item pages filtered by run, in ``_order`` order.
        "scope_thread_run_order": Index(_thread_child("runId", "_order")),
    },
    "runs": {
        "scope_thread_run_unique": Index(_thread_child("runId"), unique=True),
        "scope_thread_order_unique": Index(_thread_child("_order"), unique=True),
        "scope_thread_status_run": Index(_thread_child("status", "runId")),
        "scope_thread_status_admission_run": Index(
            _thread_child("status", "admission.queueItemId", "runId")
        ),
        # Beyond the reference layout: run pages filtered by status, in ``_order`` order (one
        # bounded scan per status; the reference ``{status, runId}`` index cannot give it).
        "scope_thread_status_order": Index(_thread_child("status", "_order")),
    },
}


def _hint(collection: str, name: str) -> Keys:
    """The key pattern of one of :data:`INDEXES` (a query hint)."""
    return INDEXES[collection][name].keys


LIST_SORT: Keys = [("updatedAt", _D), ("threadId", _A)]

_TXN_OPTIONS: dict[str, Any] = {
    "read_concern": ReadConcern("snapshot"),
    "write_concern": WriteConcern("majority"),
    "read_preference": ReadPreference.PRIMARY,
}
# The URL options that shape the statements using the URL's own concerns.
_WRITE_CONCERN_OPTIONS = ("w", "wtimeoutms", "journal")
_READ_CONCERN_OPTIONS = ("readconcernlevel",)


class _Retry(Exception):
    """Internal: the transaction was aborted by the server and may be retried whole."""


class _InsertExists(Exception):
    """Internal: a unique index refused an insert the commit assumed new (see ``load_rows``)."""


class _Mispredicted(Exception):
    """Internal: a root written ahead in the hold is not the one the pipeline judged."""


_EMPTY_FACTS = RootSummary(None, ())

COPY_BATCH = 1000
"""The most documents a fork or a restore inserts with one ``insert_many``."""


class _Cached(NamedTuple):
    """A root as stored (exact bytes), parsed, with its counters and facts."""

    raw: RawBSONDocument
    root: ThreadRecord
    next_positions: Mapping[FamilyName, int]
    facts: RootSummary


class _RootCache:
    """The last stored root this store saw per thread (bounded, least recently used).

    Only a hint: a commit uses an entry only when the stored root still equals
    it byte for byte in meaning (the hold's filter compares the whole
    document), so a stale or foreign entry just costs the usual hold.
    """

    LIMIT = 4096

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str], _Cached] = OrderedDict()

    def get(self, key: tuple[str, str]) -> _Cached | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple[str, str], entry: _Cached) -> None:
        # Its own next positions (roots are immutable, shared as they are).
        self._entries[key] = entry._replace(next_positions=dict(entry.next_positions))
        self._entries.move_to_end(key)
        while len(self._entries) > self.LIMIT:
            self._entries.popitem(last=False)

    def offer(self, key: tuple[str, str], entry: _Cached) -> None:
        """Keep ``entry`` unless a newer revision of the same thread is known."""
        known = self._entries.get(key)
        if known is not None and (
            known.root.version.thread_instance_id == entry.root.version.thread_instance_id
            and known.root.version.revision > entry.root.version.revision
        ):
            return
        self.put(key, entry)

    def drop(self, key: tuple[str, str]) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


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
        or sharded cluster: commits use multi-document transactions). An option
        the driver would reject is a :class:`ThreadStoreConfigurationError`
        here; one only the server can judge (``w=banana``), at ``initialize()``.
        Not needed with ``client=``.
    client:
        An application's own ``AsyncMongoClient`` (never closed by
        pai-storage), or the :class:`~pai_storage_mongo.client.MongoClientHolder`
        that ``connect()`` shares among the stores it opens. Without it the
        store makes its own client and closes it in ``close()``.
    db_name:
        Database name; defaults to the URL's database, then ``"pai"`` (not
        with a shared holder, which has its own).
    collection_name:
        The thread collection (default: the client's collection prefix and
        ``threads``, i.e. ``"pai_threads"``); children live in
        ``<name>_messages``, ``<name>_pending_messages`` and ``<name>_runs``.
    collection_prefix:
        The prefix of the default collection name (default ``"pai_"``; not
        with a shared holder).
    clock:
        Test-only clock override; production uses the MongoDB primary's time.
    on_warning:
        Receives recoverable integrity warnings (e.g. a root skipped by
        ``list_threads``); failures in it are ignored.
    token_secret:
        Key (bytes) that makes page tokens unforgeable (``docs/reads.md``).
    """

    backend_name = "mongo"
    token_prefix = "pai-mongo"
    capabilities: ClassVar[frozenset[str]] = frozenset({LIFECYCLE})

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        db_name: str | None = None,
        collection_name: str | None = None,
        collection_prefix: str | None = None,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning, token_secret=token_secret)
        if db_name is not None:
            _check_name("db_name", db_name)
        if collection_name is not None:
            _check_name("collection_name", collection_name)
        # Everything that can be refused is checked before the holder counts this store.
        self._holder = MongoClientHolder.attached(
            url,
            client,
            thread_collection=collection_name,
            db_name=db_name,
            collection_prefix=collection_prefix,
        )
        self.url = self._holder.url
        self.db_name = self._holder.db_name
        self.collection_name = collection_name or self._holder.collection_prefix + "threads"
        self._client: AsyncMongoClient[Doc] | None = None
        self._db: AsyncDatabase[Doc] | None = None
        self._server_version: str | None = None
        self._topology = ""
        self._snapshot_reads = False
        self._first_pages_with_root = True
        self._roots: _RootCache = _RootCache()
        self._collections: dict[tuple[str, str], Any] = {}

    def __repr__(self) -> str:
        return (
            f"MongoThreadStore({self.url.render()!r}, db_name={self.db_name!r}, "
            f"collection_name={self.collection_name!r})"
        )

    # ------------------------------------------------------------ plumbing

    def collection_names(self) -> dict[str, str]:
        """The four collection names, keyed ``threads``/``messages``/``runs``/``queuedItems``."""
        return {key: self.collection_name + suffix for key, suffix in _SUFFIX.items()}

    def _unready(self) -> ThreadStoreConfigurationError:
        if self.closed:
            return ThreadStoreConfigurationError("this store is closed; open a new one")
        return ThreadStoreConfigurationError("the store is not initialized")

    @property
    def database(self) -> AsyncDatabase[Doc]:
        """The PyMongo database (for operators and tests; initialize first)."""
        if self._db is None:
            raise self._unready()
        return self._db

    def _col(self, collection: str) -> AsyncCollection[Doc]:
        """A collection whose results are plain dicts (projections of known fields).

        Reads of commits and of ``read_thread`` go to the primary, whatever the
        URL's read preference.
        """
        key = (collection, "dict")
        found = self._collections.get(key)
        if found is None:
            found = self._collections[key] = self.database.get_collection(
                self.collection_names()[collection], read_preference=ReadPreference.PRIMARY
            )
        return cast("AsyncCollection[Doc]", found)

    def _raw(self, collection: str, *, primary: bool = True) -> AsyncCollection[RawBSONDocument]:
        """A collection whose results stay raw BSON (whole documents; see ``documents``)."""
        key = (collection, "raw" if primary else "raw, any member")
        found = self._collections.get(key)
        if found is None:
            found = self._collections[key] = self.database.get_collection(
                self.collection_names()[collection],
                codec_options=RAW_CODEC_OPTIONS,
                read_preference=ReadPreference.PRIMARY if primary else None,
            )
        return cast("AsyncCollection[RawBSONDocument]", found)

    def _session(self) -> AsyncClientSession:
        if self._client is None:
            raise self._unready()
        return self._client.start_session(causal_consistency=False)

    def _snapshot_session(self) -> AsyncClientSession:
        if self._client is None:
            raise self._unready()
        return self._client.start_session(snapshot=True)

    async def _guard(self, phase: Phase, op: Callable[[], Awaitable[T]]) -> T:
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
            except _Retry as retry:
                cause = retry.__cause__ or retry
            except (PyMongoError, BSONError) as exc:
                if self.closed:
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
                    raise map_error(exc, phase, self.url) from exc
                cause = exc
            if attempt >= MAX_TRANSACTION_ATTEMPTS or time.monotonic() + delay > deadline:
                if isinstance(cause, PyMongoError) and not is_transient(cause):
                    raise map_error(cause, phase, self.url) from cause
                raise ThreadStoreUnavailableError(
                    "MongoDB kept aborting the transaction (contention or failover); "
                    "nothing was applied"
                ) from cause
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.1)

    # ------------------------------------------------------------ lifecycle

    def _connect_error(self, exc: Exception) -> ThreadStoreError:
        if isinstance(exc, ValueError | TypeError):  # the driver's own option checks
            return ThreadStoreConfigurationError(
                redact(f"invalid MongoDB connection string: {exc}", self.url)
            )
        return map_error(exc, "connect", self.url)

    def _option_error(
        self, options: Sequence[str], what: str
    ) -> Callable[[Exception], ThreadStoreError]:
        def translate(exc: Exception) -> ThreadStoreError:
            return map_option_error(exc, self.url, options, what) or self._connect_error(exc)

        return translate

    async def _initialize(self) -> None:
        """Connect (through the client holder), check the deployment, create the indexes.

        The store keeps the client only once everything succeeded. When a step
        fails, a client this store's holder made for it alone is closed and
        forgotten, so the next attempt starts clean; a shared or given client
        stays with its holder. A ``close()`` during a lazy initialize cancels
        this at any await, and the holder's release closes what it made.
        """
        try:
            client = await self._holder.client()
        except StorageError as exc:
            # The holder speaks for every store sharing it (the general classes);
            # the thread store raises its own.
            cause = exc.__cause__
            if isinstance(exc, ThreadStoreError) or not isinstance(cause, Exception):
                raise
            raise self._connect_error(cause) from cause
        try:
            with map_errors(self._connect_error):
                await self._prepare(client)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                await self._holder.discard()
            raise
        self._client = client
        self._db = client.get_database(self.db_name, codec_options=CODEC_OPTIONS)
        self._collections.clear()

    async def _prepare(self, client: AsyncMongoClient[Doc]) -> None:
        hello = await client.admin.command("hello")
        if hello.get("msg") == "isdbgrid":
            self._topology = "sharded cluster (mongos)"
            # A $lookup of a sharded collection is not served everywhere a snapshot is.
            self._first_pages_with_root = False
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
        self._snapshot_reads = parts >= [5, 0]
        if parts < [4, 2]:
            raise ThreadStoreConfigurationError(
                f"MongoDB {self._server_version} is too old: 4.2 or later is required"
            )
        db = client.get_database(self.db_name)
        names = self.collection_names()
        # Strings must compare in code-point order: refuse collections created with a
        # default collation (the indexes would inherit it).
        cursor = await db.list_collections(filter={"name": {"$in": list(names.values())}})
        async for info in cursor:
            collation = (info.get("options") or {}).get("collation")
            if collation and collation.get("locale") != "simple":
                raise ThreadStoreConfigurationError(
                    f"collection {info['name']!r} has a default collation; pai-storage needs "
                    "the simple (binary, code-point) collation for thread ids"
                )
        threads = db.get_collection(names["threads"])

        # Prove it: open a snapshot transaction, read, and abort (no write). Right after
        # the collections were created a snapshot may be briefly unavailable: retried.
        async def probe() -> None:
            async with client.start_session(causal_consistency=False) as session:
                await session.start_transaction(**_TXN_OPTIONS)
                try:
                    await threads.find_one({"scopeKey": None}, session=session)
                except OperationFailure as exc:
                    if is_transient(exc):
                        raise
                    raise ThreadStoreConfigurationError(
                        "this MongoDB deployment refused a multi-document transaction "
                        f"({type(exc).__name__}, code {exc.code}); a replica set or sharded "
                        "cluster with transactions enabled is required"
                    ) from exc
                finally:
                    await self._abort(session)

        await self._guard("connect", probe)
        # Lists read outside transactions with the URL's read concern: judge it now.
        with map_errors(self._option_error(_READ_CONCERN_OPTIONS, "read concern")):
            await threads.find_one({"scopeKey": None}, projection={"_id": 1})
        # Idempotent: creating an index that exists with the same spec is a no-op. The
        # only statements that use the URL's write concern: judge it here too.
        with map_errors(self._option_error(_WRITE_CONCERN_OPTIONS, "write concern")):
            await asyncio.gather(
                *(
                    db.get_collection(names[collection]).create_indexes(
                        [
                            IndexModel(index.keys, name=name, unique=True)
                            if index.unique
                            else IndexModel(index.keys, name=name)
                            for name, index in specs.items()
                        ]
                    )
                    for collection, specs in INDEXES.items()
                )
            )

    async def _close(self) -> None:
        self._client, self._db = None, None
        self._collections.clear()
        self._roots.clear()
        await self._holder.release()

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
        hello = await self._guard("read", self._hello)
        return truncate_ms(hello["localTime"])

    async def _hello(self, session: AsyncClientSession | None = None) -> Doc:
        """``hello`` decoded with timezone-aware dates, whatever the client's own options."""
        return await self.database.command("hello", codec_options=CODEC_OPTIONS, session=session)

    # ------------------------------------------------------------ rows

    async def _load(
        self, session: AsyncClientSession, spec: FamilySpec, key: Doc, ids: Sequence[str]
    ) -> dict[str, Entry[Any]]:
        """The stored rows of one family with these ids (missing ids omitted)."""
        found: dict[str, Entry[Any]] = {}
        if not ids:
            return found
        cursor = self._raw(spec.name).find(
            {**key, spec.id_field: {"$in": list(ids)}}, session=session
        )
        for raw in await cursor.to_list():
            order, record = read_child(spec.model, raw)
            found[spec.record_id(record)] = Entry(order, record)
        return found

    @staticmethod
    def page_queries(
        family: str, key: Doc, plan: ChildPagePlan, window: Window
    ) -> list[tuple[Doc, Keys, Keys]]:
        """The filter, sort and index hint of each scan of one child page.

        Each is a bounded ``_order`` range read in index order (``limit`` page+1).
        A run page filtered by several statuses is one scan per status, merged
        by position; every other page is one scan.
        """
        query: Doc = {**key, "_order": {"$gt": window.lower, "$lt": window.upper}}
        hint = _hint(family, "scope_thread_order_unique")
        sort = [("_order", _A if window.order == "oldest" else _D)]
        if family == "messages" and plan.view in ("transcript", "context"):
            query[f"visibility.{plan.view}"] = True
            hint = _hint(family, f"scope_thread_{plan.view}_order")
        elif family == "runs" and plan.statuses is not None:
            hint = _hint(family, "scope_thread_status_order")
            return [({**query, "status": status}, sort, hint) for status in sorted(plan.statuses)]
        elif family == "queuedItems" and plan.run_id is not None:
            query["runId"] = plan.run_id
            hint = _hint(family, "scope_thread_run_order")
        return [(query, sort, hint)]

    # ------------------------------------------------------------ reads

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self.selections.plan_read(request)
        key = {"scopeKey": request.scope_key, "threadId": request.thread_id}

        async def attempt() -> ThreadReadResult:
            if self._snapshot_reads:
                # MongoDB 5.0+: every read of the session sees one snapshot, with no
                # transaction to end; the first page usually comes with the root.
                async with self._snapshot_session() as session:
                    snapshot = _MongoSnapshot(self, session, key, self.now(), plan)
                    return await run_read(snapshot, plan, clock_now=snapshot.test_now)
            async with self._session() as session:
                await session.start_transaction(**_TXN_OPTIONS)
                try:
                    snapshot = _MongoSnapshot(self, session, key, self.now(), plan)
                    result = await run_read(snapshot, plan, clock_now=snapshot.test_now)
                except BaseException as exc:
                    if not isinstance(exc, ServerSelectionTimeoutError):
                        await self._abort(session)
                    raise
                # Read-only: aborting ends it like a commit would, and never fails loudly.
                await self._abort(session)
                return result

        return await self._guard("read", attempt)

    # ------------------------------------------------------------ lists

    def list_query(self, plan: ListPlan) -> tuple[Doc, Keys]:
        """The filter and index hint serving a list plan (sorted by :data:`LIST_SORT`).

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
                index = "scope_agent_visibility_parent_updated"
            elif plan.category is not None:
                index = "scope_agent_visibility_category_updated"
            else:
                index = "scope_agent_visibility_updated"
        else:
            index = "scope_updated" if plan.include_hidden else "scope_visibility_updated"
        if plan.parent_thread_id is not None:
            query["parentThreadId"] = plan.parent_thread_id
        if plan.category is not None:
            query["category"] = plan.category
        if plan.cursor is not None:
            updated_ms, thread_id = plan.cursor
            updated = _ms_to_datetime(updated_ms)
            query["updatedAt"] = {"$lte": updated}
            query["$or"] = [{"updatedAt": {"$lt": updated}}, {"threadId": {"$gt": thread_id}}]
        return query, _hint("threads", index)

    def plan_list(self, request: ListThreadsInput) -> ListPlan:
        """Validate a list request and decode its page token (see :meth:`list_query`)."""
        return self.selections.plan_list(request)

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self.selections.plan_list(request)
        query, hint = self.list_query(plan)
        threads = self._raw("threads", primary=False)  # the URL's read preference

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
                await self.warn(warning)
            return plan.finish(rows)

        return await self._guard("read", attempt)

    # ------------------------------------------------------------ lifecycle primitives

    async def _thread_heads(
        self,
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
        (:meth:`_heads_of_every_scope`). The keyset bound is split into index
        ranges read one after the other (the rest of ``after``'s millisecond,
        then the later ones), so no query needs a blocking sort or examines an
        entry it does not return.
        """
        return await self._guard(
            "read",
            lambda: (
                self._heads_of_every_scope(updated_before, after, limit)
                if scope_key is None
                else self._heads_of_scope(scope_key, updated_before, after, limit)
            ),
        )

    @staticmethod
    def heads_queries(
        scope_key: str | None, updated_before: datetime | None, after: ThreadIndexEntry | None
    ) -> tuple[list[Doc], Keys, Keys]:
        """The filters (read in turn), sort and index hint of one ``_thread_heads`` call.

        The keyset bound "strictly after ``after``" is split into index ranges:
        the rest of ``after``'s millisecond (its scope's later thread ids, then,
        across scopes, the later scopes), then the later milliseconds up to the
        cutoff. Each is one bounded range of the hinted index in its order.
        """
        ranges: list[Doc] = []
        later: Doc = {}
        if after is not None:
            later["$gt"] = after.updated_at
        if updated_before is not None:
            later["$lt"] = updated_before
        if scope_key is not None:
            if after is not None:
                ranges.append(
                    {
                        "scopeKey": scope_key,
                        "updatedAt": after.updated_at,
                        "threadId": {"$gt": after.thread_id},
                    }
                )
            ranges.append({"scopeKey": scope_key, **({"updatedAt": later} if later else {})})
            sort: Keys = [("updatedAt", _A), ("threadId", _A)]
            return ranges, sort, _hint("threads", "scope_updated_asc")
        if after is not None:
            at = after.updated_at
            ranges.append(
                {"updatedAt": at, "scopeKey": after.scope_key, "threadId": {"$gt": after.thread_id}}
            )
            ranges.append({"updatedAt": at, "scopeKey": {"$gt": after.scope_key}})
        ranges.append({"updatedAt": later} if later else {})
        sort = [("updatedAt", _A), ("scopeKey", _A), ("threadId", _A)]
        return ranges, sort, _hint("threads", "updated_scope_asc")

    async def _heads_of_scope(
        self,
        scope_key: str,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> list[ThreadIndexEntry]:
        heads: list[ThreadIndexEntry] = []
        ranges, sort, hint = self.heads_queries(scope_key, updated_before, after)
        for query in _live_ranges(ranges, updated_before):
            if len(heads) >= limit:
                break
            async for doc in self._heads_cursor(query, sort, hint, limit - len(heads)):
                heads.append(_head(doc))
        return heads

    async def _heads_of_every_scope(
        self, updated_before: datetime | None, after: ThreadIndexEntry | None, limit: int
    ) -> list[ThreadIndexEntry]:
        """The cross-scope sweep: documented as administrative (it reaches every shard)."""
        heads: list[ThreadIndexEntry] = []
        ranges, sort, hint = self.heads_queries(None, updated_before, after)
        for query in _live_ranges(ranges, updated_before):
            if len(heads) >= limit:
                break
            async for doc in self._heads_cursor(query, sort, hint, limit - len(heads)):
                heads.append(_head(doc))
        return heads

    def _heads_cursor(self, query: Doc, sort: Keys, hint: Keys, limit: int) -> Any:
        projection = {"_id": 0, "scopeKey": 1, "threadId": 1, "version": 1, "updatedAt": 1}
        return self._col("threads").find(
            query, projection=projection, sort=sort, hint=hint, limit=limit
        )

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        """The root and every child, from one snapshot (a snapshot session on 5.0+).

        Each family is one query in ``_order`` order on its
        ``scope_thread_order_unique`` index.
        """
        key = {"scopeKey": scope_key, "threadId": thread_id}

        async def load(session: AsyncClientSession) -> ThreadAggregate | None:
            raw = await self._raw("threads").find_one(key, session=session)
            if raw is None:
                return None
            root, next_positions = parse_root(decode_or_invalid(raw, "thread"))
            families: dict[FamilyName, Family[Any]] = {}
            for spec in FAMILIES:
                what = spec.model.__name__
                entries: dict[str, Entry[Any]] = {}
                cursor = self._raw(spec.name).find(
                    key,
                    sort=[("_order", _A)],
                    hint=_hint(spec.name, "scope_thread_order_unique"),
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
            if self._snapshot_reads:
                async with self._snapshot_session() as session:
                    return await load(session)
            async with self._session() as session:
                await session.start_transaction(**_TXN_OPTIONS)
                try:
                    return await load(session)
                finally:
                    await self._abort(session)

        return await self._guard("read", attempt)

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
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
            existing = await self._raw("threads").find_one(key, session=session)
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
                        await self._col(spec.name).insert_many(batch, session=session)
                        batch = []
                if batch:
                    await self._col(spec.name).insert_many(batch, session=session)
            positions = {name: family.next_position for name, family in families.items()}
            await self._write_new_root(session, key, root, positions)
            return None

        result = await self._in_transaction(write)
        self._roots.drop((root.scope_key, root.thread_id))
        return result

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
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
            threads = self._raw("threads")
            snapshot = _MongoSnapshot(self, session, source_key, None)
            plan = await fork.plan_in(self, snapshot)  # a missing source raises
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
                cut = await self._col("messages").find_one(
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
                await self._copy_children(session, family, kept, plan.thread_id)
            await self._write_new_root(session, fork_key, root, next_positions)
            return root

        return await self._in_transaction(copy)

    async def _copy_children(
        self, session: AsyncClientSession, family: str, kept: Doc, thread_id: str
    ) -> None:
        """Copy the kept children of one family to ``thread_id``, a batch at a time."""
        source = self._raw(family)
        target = self._raw(family)
        cursor = await source.aggregate(
            [
                {"$match": kept},
                {"$sort": {"_order": 1}},
                {"$set": {"threadId": {"$literal": thread_id}}},
                {"$unset": "_id"},
            ],
            hint=dict(_hint(family, "scope_thread_order_unique")),
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

    async def _write_new_root(
        self,
        session: AsyncClientSession,
        key: Doc,
        root: ThreadRecord,
        next_positions: Mapping[FamilyName, int],
    ) -> None:
        """Insert a new thread's root, its ``_facts`` read from its children (same transaction)."""
        reader = _Reader(self, session, key, prefetch=set(), tail=None, queue_unchanged=False)
        facts = await _read_facts(reader)
        await self._col("threads").insert_one(
            root_document(root, next_positions, facts), session=session
        )

    async def _in_transaction(self, op: Callable[[AsyncClientSession], Awaitable[T]]) -> T:
        """``op`` in one transaction, committed when it returns (retried like a commit)."""

        async def attempt() -> T:
            async with self._session() as session:
                await session.start_transaction(**_TXN_OPTIONS)
                try:
                    result = await op(session)
                except BaseException as exc:
                    if not isinstance(exc, ServerSelectionTimeoutError):
                        await self._abort(session)
                    raise
                await self._commit_transaction(session)
                return result

        return await self._guard("write", attempt)

    # ------------------------------------------------------------ commits

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        async def attempt() -> CommittedResult | ConflictResult:
            async with self._session() as session:
                return await self._commit_once(session, request)

        return await self._guard("write", attempt)

    async def _apply(
        self,
        session: AsyncClientSession,
        request: CommitThreadInput,
        tx: _MongoCommit | None = None,
    ) -> CommittedResult | ConflictResult:
        """Judge and write one commit in the session's open transaction (not ended here)."""
        tx = tx or _MongoCommit(self, session, request, exact=False)
        return await run_commit(tx, request, clock=self.now)

    async def _commit_once(
        self, session: AsyncClientSession, request: CommitThreadInput
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
            tx = _MongoCommit(self, session, request, exact=exact, write_ahead=write_ahead)
            await session.start_transaction(**_TXN_OPTIONS)
            try:
                outcome = await self._apply(session, request, tx)
            except BaseException as exc:
                if not isinstance(exc, ServerSelectionTimeoutError):
                    await self._abort(session)
                if isinstance(exc, _Mispredicted):
                    write_ahead = False
                    continue
                if tx.unverified and isinstance(exc, ThreadStoreInvariantError | _InsertExists):
                    exact = True
                    continue
                raise
            if isinstance(outcome, CommittedResult):
                try:
                    await self._commit_transaction(session)
                except BaseException:
                    self._roots.drop(key)  # applied or not: the stored root is unknown
                    raise
                entry = tx.stored(outcome)
                if entry is None:
                    self._roots.drop(key)
                else:
                    self._roots.put(key, entry)
                return outcome
            await self._abort(session)
            if not tx.unverified:
                return outcome
            exact = True

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
                    raise map_error(exc, "commit", self.url) from exc
                await asyncio.sleep(0.05 * attempts)


# ------------------------------------------------------------------ commit primitives


def _live_ranges(ranges: Sequence[Doc], updated_before: datetime | None) -> list[Doc]:
    """The ranges of ``_thread_heads`` left once the rest of a millisecond at or after
    the cutoff is dropped."""
    return [
        query
        for query in ranges
        if updated_before is None
        or not isinstance(query.get("updatedAt"), datetime)
        or query["updatedAt"] < updated_before
    ]


def _head(doc: Mapping[str, Any]) -> ThreadIndexEntry:
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


def _assumed_new(spec: FamilySpec, changes: Sequence[Any] | None) -> set[str]:
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


def _lease_shape(
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


def _facts_follow(changes: ThreadChanges | None) -> bool:
    """Whether a commit's facts follow from its writes (see ``RootSummary.after``).

    True when it only inserts messages and inserts or replaces runs, with any
    root or lease change.
    """
    if changes is None:
        return True
    if changes.queued_items:
        return False
    if not all(isinstance(c, InsertChange | ReplaceChange) for c in changes.runs or ()):
        return False
    return all(isinstance(c, InsertChange) for c in changes.messages or ())


class _MongoCommit(CommitTransaction):
    """The commit primitives inside one multi-document transaction.

    Every statement is filtered on the thread's ``{scopeKey, threadId}``.

    The root is written once per commit, with the thread's relationship
    facts (``_facts``, see :class:`~pai_storage_mongo.documents.RootSummary`):
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
        self._previous_facts: RootSummary | None = None
        self._written_ahead: RawBSONDocument | None = None
        self._facts: RootSummary | None = None
        self._root: tuple[ThreadRecord, Mapping[FamilyName, int]] | None = None
        self._stored: RawBSONDocument | None = None
        self.unverified: set[FamilyName] = set()
        """Families with inserts assumed new and not yet written."""

    def stored(self, result: CommittedResult) -> _Cached | None:
        """The root this commit stored, for the store's cache (``None`` after a delete)."""
        if self._stored is None or self._root is None or self._facts is None:
            return None
        root, next_positions = self._root
        if result.thread is None or result.thread.version != root.version:
            return None
        return _Cached(self._stored, root, next_positions, self._facts)  # put() copies

    async def hold(self) -> HeldThread:
        """Write the root first, so the transaction holds the thread against others.

        When the store knows the stored root at the expected version and the
        commit's facts follow from its writes (:func:`_facts_follow`), the
        hold writes the final root at once:
        one ``findAndModify`` filtered on the whole known document, whose
        update pipeline replaces it with the root the commit will produce —
        the commit time is ``$$NOW`` (never before the last commit) and the
        lease times follow from it on the server — and returns it. The
        pipeline then judges the commit from the known root, and
        :meth:`write_root` checks that it produced exactly the bytes written ahead
        (anything else is rolled back and judged again without writing ahead).

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
            written_ahead = await self._write_root_ahead(threads, expected)
            if written_ahead is not None:
                return written_ahead
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
            raise _Retry()
        doc = decode_or_invalid(placeholder, "thread")
        self._held_at = doc["_heldAt"]
        self._root_id = doc.get("_id")
        self._previous_facts = _EMPTY_FACTS
        return stored

    async def _write_root_ahead(
        self, threads: AsyncCollection[RawBSONDocument], expected: ThreadVersion
    ) -> HeldThread | None:
        """The hold that writes the final root (see :meth:`hold`), when it applies."""
        cached = self._store._roots.get((self._request.scope_key, self._request.thread_id))
        mutation = self._request.mutation
        if (
            not self._write_ahead
            or cached is None
            or cached.root.version != expected
            or isinstance(mutation, DeleteMutation)
            or not _facts_follow(self._changes)
        ):
            return None
        previous = cached.root
        changes = self._changes or ThreadChanges()
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
        lease = _lease_shape(previous.lease, changes.lease, placeholder)
        root = apply_thread_root_update(previous, self._request, placeholder, lease)
        counters = {**cached.next_positions}
        counters["messages"] += len(inserted)
        counters["runs"] += sum(1 for _, is_insert in runs if is_insert)
        base = {"_id": cached.raw["_id"], **root_document(root, counters, facts)}
        test_now = self._store.now()
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
            {**self._key, "$expr": {"$eq": ["$$ROOT", {"$literal": cached.raw}]}},
            pipeline,
            return_document=ReturnDocument.AFTER,
            session=self._session,
        )
        if written_ahead is None:  # the stored root is not the one this store knew
            return None
        try:
            written = written_ahead["updatedAt"]
        except (BSONError, ValueError, KeyError):  # pragma: no cover - the write ahead wrote it
            written = None
        if not isinstance(written, datetime):  # pragma: no cover - $max of two dates
            raise ThreadStoreInvariantError("invalid stored thread: malformed updatedAt")
        self._held_at = written if written.tzinfo else written.replace(tzinfo=UTC)
        self._root_id = cached.raw["_id"]
        self._previous_facts = cached.facts
        self._written_ahead = written_ahead
        self._facts = facts
        return HeldThread(previous, cached.next_positions)

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
            skip = _assumed_new(spec, spec.changes(self._changes))
            wanted = [i for i in ids if i not in skip]
            if len(wanted) < len(ids):
                self.unverified.add(spec.name)
        return await self._store._load(self._session, spec, self._key, wanted)

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        """Check a root written ahead in the hold, or keep it for after the relationship check."""
        if self._written_ahead is not None:
            # The document written ahead is exactly this root's, or the prediction was wrong.
            expected = {"_id": self._root_id, **root_document(root, next_positions, self._facts)}
            if bson.encode(expected) != self._written_ahead.raw:
                raise _Mispredicted()
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
                raise _InsertExists() from exc
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
        reader = self._reader(context)
        derived = self._derive(context)
        return _SummaryReader(*derived, reader) if derived is not None else reader

    def _reader(self, context: RelationshipContext) -> _Reader:
        inserted = context.writes["messages"].inserts
        changes = context.changes
        return _Reader(
            self._store,
            self._session,
            self._key,
            prefetch=context.check.run_ids | ({context.lease.run_id} if context.lease else set()),
            tail=inserted[-1] if inserted else None,
            queue_unchanged=not changes.queued_items and not changes.runs,
        )

    def _derive(
        self, context: RelationshipContext
    ) -> tuple[RootSummary, dict[str, OpenRunSummary]] | None:
        """The facts after this commit from the previous ones and its writes, when they follow."""
        previous = self._previous_facts
        if previous is None or not _facts_follow(context.changes):
            return None
        final = context.writes["runs"].final
        runs: list[tuple[RunRef, bool]] = []
        for change in context.changes.runs or ():
            if isinstance(change, InsertChange | ReplaceChange):
                entry = final.get(change.record.run_id)
                if entry is None:  # pragma: no cover - inserted or replaced runs exist
                    return None
                runs.append((RunRef.of(entry.record), isinstance(change, InsertChange)))
        inserted = [MessageRef.of(e.position, e.record) for e in context.writes["messages"].inserts]
        return previous.after(runs, inserted)

    async def check_relationships(self, context: RelationshipContext) -> None:
        """Check the rules, then write the root with the thread's facts after the commit.

        When the facts follow from the previous ones and this commit's writes,
        they answer the rules' queries (only runs they do not know are
        queried); otherwise the queries run and the facts are read back. A
        root written ahead in the hold is written already: its facts must be the
        ones derived here (they are, unless the prediction was wrong).
        """
        reader = self._reader(context)
        derived = self._derive(context)
        await context.check.check(
            _SummaryReader(*derived, reader) if derived is not None else reader
        )
        if self._root is None:  # pragma: no cover - the pipeline writes the root first
            raise RuntimeError("the root was not written before the relationship check")
        root, next_positions = self._root
        if derived is not None:
            facts = derived[0]
        elif self._previous_facts is not None and not context.check.check_tail:
            facts = self._previous_facts  # no message or run changed: nor did the facts
        else:
            facts = await _read_facts(reader)
        if self._written_ahead is not None:
            if facts != self._facts:
                raise _Mispredicted()
            self._stored = self._written_ahead
            return
        document = root_document(root, next_positions, facts)
        await self._store._col("threads").replace_one(self._key, document, session=self._session)
        self._facts = facts
        self._stored = RawBSONDocument(bson.encode({"_id": self._root_id, **document}))


async def _read_facts(reader: _Reader) -> RootSummary:
    """The thread's facts after the commit, through the (memoizing) relationship reader."""
    open_runs = await reader.open_runs()
    tail = await reader.tail()
    facts = await reader.run_facts([r.run_id for r in open_runs]) if open_runs else {}
    return RootSummary(
        tail,
        tuple(
            OpenRunSummary(run, tuple(facts[run.run_id].messages), facts[run.run_id].foreign_inside)
            for run in open_runs
        ),
    )


class _SummaryReader:
    """The relationship queries of a commit whose facts follow from its writes.

    The open runs, the tail and the facts of every run the facts know (open
    before or after the commit, or inserted by it) need no query; other runs
    (which such a commit rarely names) are queried.
    """

    def __init__(
        self, facts: RootSummary, known: Mapping[str, OpenRunSummary], reader: _Reader
    ) -> None:
        self._facts = facts
        self._known = known
        self._reader = reader

    async def open_runs(self) -> Sequence[RunRef]:
        return [o.run for o in self._facts.open]

    async def tail(self) -> MessageRef | None:
        return self._facts.tail

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        ids = list(dict.fromkeys(run_ids))
        others = [i for i in ids if i not in self._known]
        found: dict[str, RunRelations] = (
            dict(await self._reader.run_facts(others)) if others else {}
        )
        for run_id in ids:
            if run_id in self._known:
                known = self._known[run_id]
                # No queued item names it: an open run is admitted (a valid thread has
                # none of its items), an inserted run is new, and the commit changes
                # no queued item.
                found[run_id] = RunRelations(known.run, list(known.messages), known.foreign, [])
        return found


# ------------------------------------------------------------------ read primitives


class _MongoSnapshot(ReadSnapshot):
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
        # What a commit of this thread will most likely hold next (see _RootCache),
        # unless the cache holds these very bytes already (a commit's or a read's).
        roots, key = self._store._roots, (root.scope_key, root.thread_id)
        known = roots.get(key)
        if known is None or known.raw.raw != stored.raw:
            facts = root_facts(decode_or_invalid(stored, "thread"))
            if facts is not None:
                roots.offer(key, _Cached(stored, root, next_positions, facts))
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


# ------------------------------------------------------------------ lists


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


# ------------------------------------------------------------------ relationship reader


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
    commit already knows the answer: runs are fetched once for the ids the check names
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
        self._facts: dict[str, RunRelations] = {}

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

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        """Facts for each id, each loaded once per commit."""
        ids = list(dict.fromkeys(run_ids))
        missing = [i for i in ids if i not in self._facts]
        if missing:
            self._facts.update(await self._load_facts(missing))
        return {i: self._facts[i] for i in ids}

    async def _load_facts(self, ids: list[str]) -> dict[str, RunRelations]:
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
        facts: dict[str, RunRelations] = {}
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
            facts[run_id] = RunRelations(
                run=runs.get(run_id),
                messages=owned,
                foreign_inside=foreign,
                queued_items=[ref for _, ref in sorted(items[run_id], key=lambda p: p[0])],
            )
        return facts
