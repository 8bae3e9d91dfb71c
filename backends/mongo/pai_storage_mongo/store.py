"""The MongoDB thread store: split collections, flat documents, one transaction per commit.

The judgement of every commit and read is the core's (:func:`run_commit`,
:func:`run_read`, ``docs/commits.md``); the backend supplies its primitives
over MongoDB. This module is the store itself: its options, its connection
(on a :class:`~pai_storage_mongo.client.MongoClientHolder`, its own or the
one ``connect()`` shares among every store it opens), the deployment checks
and indexes of ``initialize()``, its collections and sessions, and the
routing of each :class:`~pai_storage.ThreadStore` hook to the module that
does the work:

- :mod:`.commit`: a commit, the core's pipeline over
  :class:`~.commit.MongoCommit` in one multi-document transaction; its
  stamped hold and root cache in :mod:`.hold`, its relationship queries in
  :mod:`.relations`;
- :mod:`.reads`: ``read_thread`` in one snapshot
  (:class:`~.reads.MongoSnapshot`) and ``list_threads``;
- :mod:`.lifecycle`: the lifecycle primitives (the updated-at index, whole
  thread load and restore, fork);
- :mod:`.queries` and :mod:`.indexes`: each query's filter, sort and index
  hint, and the indexes they use;
- :mod:`.transactions`: one transaction, the bounded retry loop and the error
  mapping around it.

Round trips are what a commit or read costs here, so the common ones are few:
an append is three commands (a hold that writes the final root, the insert,
the commit; see :mod:`.hold`), and a read of a thread with the
first page of a family is one aggregation (:class:`~.reads.MongoSnapshot`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, cast

from bson.raw_bson import RawBSONDocument
from pymongo import IndexModel
from pymongo.errors import OperationFailure
from pymongo.read_preferences import ReadPreference

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    Page,
    ReadThreadInput,
    StorageError,
    StoreInfo,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ThreadVersion,
)
from pai_storage.backend import (
    LIFECYCLE,
    Clock,
    Entry,
    FamilySpec,
    ForkRequest,
    ListPlan,
    StoreURL,
    ThreadAggregate,
    ThreadIndexEntry,
    WarningCallback,
    map_errors,
    redact,
    run_commit,
    truncate_ms,
)
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreError
from pai_storage.watch import ChangeSignal

from .client import MongoClientHolder
from .commit import MongoCommit, commit_once
from .documents import CODEC_OPTIONS, RAW_CODEC_OPTIONS, read_child
from .errors import is_transient, map_error, map_option_error
from .hold import RootCache
from .indexes import INDEXES, LIST_SORT, SUFFIXES, Doc
from .lifecycle import COPY_BATCH, fork_copy, load_thread, restore_thread, thread_heads
from .queries import heads_queries, list_query, page_queries
from .reads import list_threads, read_thread
from .transactions import TXN_OPTIONS, abort, guard
from .watch import MongoNotifier

if TYPE_CHECKING:
    from pymongo import AsyncMongoClient
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase


__all__ = ["COPY_BATCH", "INDEXES", "LIST_SORT", "MongoThreadStore"]

DEFAULT_SERVER_SELECTION_TIMEOUT_MS = 5000
# The URL options that shape the statements using the URL's own concerns.
_WRITE_CONCERN_OPTIONS = ("w", "wtimeoutms", "journal")
_READ_CONCERN_OPTIONS = ("readconcernlevel",)


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
        self._roots: RootCache = RootCache()
        self._collections: dict[tuple[str, str], Any] = {}
        self._watchers = MongoNotifier(self)  # one change stream for every watcher

    def __repr__(self) -> str:
        return (
            f"MongoThreadStore({self.url.render()!r}, db_name={self.db_name!r}, "
            f"collection_name={self.collection_name!r})"
        )

    # ------------------------------------------------------------ plumbing

    def collection_names(self) -> dict[str, str]:
        """The four collection names, keyed ``threads``/``messages``/``runs``/``queuedItems``."""
        return {key: self.collection_name + suffix for key, suffix in SUFFIXES.items()}

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
                await session.start_transaction(**TXN_OPTIONS)
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
                    await abort(session)

        await guard(self, "connect", probe)
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
        await self._watchers.close()
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
        hello = await guard(self, "read", self._hello)
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

    # ------------------------------------------------------------ queries (see .queries)

    page_queries = staticmethod(page_queries)
    list_query = staticmethod(list_query)
    heads_queries = staticmethod(heads_queries)

    # ------------------------------------------------------------ reads and lists (.reads)

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        return await read_thread(self, request)

    def plan_list(self, request: ListThreadsInput) -> ListPlan:
        """Validate a list request and decode its page token (see :meth:`list_query`)."""
        return self.selections.plan_list(request)

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        return await list_threads(self, request)

    # ------------------------------------------------------------ lifecycle primitives (.lifecycle)

    async def _thread_heads(
        self,
        scope_key: str | None,
        *,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> Sequence[ThreadIndexEntry]:
        return await thread_heads(
            self, scope_key, updated_before=updated_before, after=after, limit=limit
        )

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        return await load_thread(self, scope_key, thread_id)

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        return await restore_thread(self, aggregate)

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        return await fork_copy(self, fork)

    # ------------------------------------------------------------ commits (.commit)

    def _change_signal(self, scope_key: str, thread_id: str | None) -> ChangeSignal:
        return self._watchers.signal(scope_key, thread_id)  # woken by the change stream

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        async def attempt() -> CommittedResult | ConflictResult:
            async with self._session() as session:
                return await commit_once(self, session, request)

        return await guard(self, "write", attempt)

    async def _apply(
        self,
        session: AsyncClientSession,
        request: CommitThreadInput,
        tx: MongoCommit | None = None,
    ) -> CommittedResult | ConflictResult:
        """Judge and write one commit in the session's open transaction (not ended here)."""
        tx = tx or MongoCommit(self, session, request, exact=False)
        return await run_commit(tx, request, clock=self.now)
