"""The one ``AsyncMongoClient`` every MongoDB store of a ``connect()`` call shares.

:class:`MongoClientHolder` owns (or borrows) the client, names every
collection of the runtime stores, creates their indexes once, and counts the
stores using it:

- a store takes its holder in its constructor with
  :meth:`MongoClientHolder.attached` (a new holder from the URL and options,
  an application's own ``AsyncMongoClient`` wrapped, or the shared holder the
  backend's opener gives every component), which counts it as a user;
- ``await holder.collection(component, indexes)`` connects on first call (one
  ``hello`` proves a server is selectable), creates the component's indexes
  once and returns the collection as every runtime store uses it: majority
  write and read concern and primary reads, whatever the URL says;
  concurrent callers share one attempt, a cancelled caller does not cancel
  it, and a failed attempt is forgotten (the client it made is closed) so the
  next call retries with a fresh client;
- a store calls ``await holder.release()`` from its ``_close``; when the last
  user has released it the holder closes the client it created (an
  application's client is never closed) and cancels a connection attempt still
  running;
- ``with holder.errors(phase):`` maps every exception of a runtime store's
  operation to the contract's general errors (:func:`runtime_error`; in a
  write, anything after which the write may have been applied is
  :class:`~pai_storage.errors.OutcomeUnknownError`). It is the one error
  mapping of the runtime stores.

The counting, the shared connect and the close are
:class:`pai_storage.backend.SharedClient`'s; this module supplies only what
touches MongoDB: making the client, proving a server answers, closing it.

Collection names live here and nowhere else: ``<prefix><default>`` with the
prefix ``pai_`` (``pai_kv``, ``pai_agent_sessions``, ``pai_snapshots``,
``pai_locks``), or a full name per component through ``names={"kv": ...}``.
See ``docs/mongodb.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import Mapping, Sequence
from contextlib import suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, cast

from bson.errors import BSONError
from pymongo import IndexModel, ReadPreference
from pymongo import errors as pm
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from pai_storage import ConfigurationError, OutcomeUnknownError, StorageError, UnavailableError
from pai_storage.backend import (
    SharedClient,
    StoreURL,
    make_url,
    map_errors,
    redact,
    truncate_ms,
)
from pai_storage.errors import ThreadStoreConfigurationError
from pai_storage.shared import closed_error as closed_error

from .documents import CODEC_OPTIONS, PLAIN_CODEC_OPTIONS
from .errors import Phase, check_url_options, is_too_large, map_error

if TYPE_CHECKING:
    from pymongo import AsyncMongoClient
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

__all__ = [
    "CLIENT_OPTIONS",
    "DEFAULT_COLLECTIONS",
    "DEFAULT_PREFIX",
    "Doc",
    "MongoClientHolder",
    "plain",
    "runtime_error",
]

Doc = dict[str, Any]

DEFAULT_PREFIX: Final = "pai_"
"""The common prefix of every runtime collection name."""

DEFAULT_COLLECTIONS: Final[Mapping[str, str]] = {
    "kv": "kv",
    "state": "agent_sessions",
    "snapshots": "snapshots",
    "guard": "locks",
}
"""Each runtime component's collection name, after the prefix."""

THREAD_SUFFIXES: Final[Mapping[str, str]] = {
    "threads": "",
    "messages": "_messages",
    "runs": "_runs",
    "queuedItems": "_pending_messages",
}
"""The thread store's collections: its collection name followed by each suffix."""

MAX_NAMESPACE_BYTES: Final = 255
"""MongoDB's limit on a database name, a dot and a collection name together (UTF-8)."""

MAX_DB_NAME_BYTES: Final = 63
"""MongoDB's limit on a database name (UTF-8)."""

CLIENT_OPTIONS: Final = frozenset({"db_name", "collection_prefix", "names"})
"""The options that shape a :class:`MongoClientHolder` (every runtime store takes them)."""

DEFAULT_SERVER_SELECTION_TIMEOUT_MS: Final = 5000

# Indexes made per client and collection: a collection's indexes are created
# once per process for each client using it (one AsyncMongoClient per process
# is the usual case). Keyed by the client object, not its URL, so a new client
# after a dropped database creates them again.
_INDEXED: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], asyncio.Future[None]]] = (
    weakref.WeakKeyDictionary()
)


def runtime_error(exc: BaseException, phase: Phase, url: StoreURL | None) -> StorageError:
    """The contract error of a runtime store for a PyMongo or BSON exception.

    The general classes (``UnavailableError``, ``OutcomeUnknownError``,
    ``ConfigurationError``, ``InvalidInputError``, ``StorageError``) with
    neutral wording, never the thread store's. ``phase`` ``"write"`` marks a
    single-document write. Every runtime write is a retryable write: PyMongo
    sends it again once after a lost connection or a ``RetryableWriteError``
    and raises the last attempt's error. So in a write:

    - a server that could not be selected means the write was never sent
      (PyMongo raises the error of the attempt before when selecting a server
      for the retry fails): :class:`~pai_storage.errors.UnavailableError`;
    - a ``writeConcernError`` (the write was applied on a primary that could
      not confirm a majority: a failover may roll it back), a lost connection
      and any error labelled ``RetryableWriteError`` (an earlier attempt may
      have been applied) are :class:`~pai_storage.errors.OutcomeUnknownError`,
      never "nothing was applied".

    Everything else is :func:`~pai_storage_mongo.errors.map_error`'s mapping;
    its messages name the failure class and code only, never a stored value
    or a password.
    """
    if isinstance(exc, StorageError):
        return exc
    if phase == "write" and not is_too_large(exc):
        if isinstance(exc, pm.ServerSelectionTimeoutError):
            return UnavailableError(
                "MongoDB is unreachable: no suitable server was found in time "
                "(ServerSelectionTimeoutError); nothing was written"
            )
        if isinstance(exc, pm.WriteConcernError) or (
            isinstance(exc, pm.PyMongoError) and exc.has_error_label("RetryableWriteError")
        ):
            return OutcomeUnknownError(
                f"MongoDB did not confirm a write ({_name(exc)}); it may or may not have "
                "been applied: read it back before retrying"
            )
        if isinstance(exc, pm.ConnectionFailure):
            return OutcomeUnknownError(
                f"the connection to MongoDB was lost during a write ({type(exc).__name__}); "
                "it may or may not have been applied: read it back before retrying"
            )
    return map_error(exc, "read" if phase == "write" else phase, url, runtime=True)


def _name(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return type(exc).__name__ if code is None else f"{type(exc).__name__}, code {code}"


_MAJORITY_WRITES: Final = WriteConcern("majority")
_MAJORITY_READS: Final = ReadConcern("majority")


def plain(collection: AsyncCollection[Doc]) -> AsyncCollection[Doc]:
    """The same collection for ``findAndModify``: replies decoded without type decoders.

    See :data:`~pai_storage_mongo.documents.PLAIN_CODEC_OPTIONS`; decode the
    returned document with :func:`~pai_storage_mongo.documents.decoded`.
    """
    return collection.with_options(codec_options=PLAIN_CODEC_OPTIONS)


class MongoClientHolder(SharedClient["AsyncMongoClient[Doc]"]):
    """One ``AsyncMongoClient``, the runtime collections it serves, and their users.

    The users, the shared lazy connect and the close are
    :class:`~pai_storage.backend.SharedClient`'s; this class makes the client,
    proves a server answers, and closes it.

    Parameters
    ----------
    url:
        ``mongodb://`` or ``mongodb+srv://`` connection string; its options go
        to PyMongo (an option PyMongo would reject is a configuration error
        here). Not needed with ``client=`` (then ``mongodb://`` is assumed for
        messages only).
    client:
        An application's own ``AsyncMongoClient``; pai-storage never closes
        it. Its codec options are not used: every collection is read with
        timezone-aware UTC dates.
    db_name:
        The database; defaults to the URL's, then ``"pai"``.
    collection_prefix:
        Put before every default collection name (default ``"pai_"``).
    names:
        A full collection name per component (``{"kv": "my_kv"}``); the
        prefix does not apply to these. Components: ``kv``, ``state``,
        ``snapshots``, ``guard``.

    Every collection must be one MongoDB accepts and have one user: two
    components never share one, and none is one of the thread store's
    (``<collection_prefix>threads`` and its suffixed collections, or the
    ``collection_name`` a thread store attaching to this holder names; see
    :meth:`thread_collections`). Anything else is a
    :class:`~pai_storage.errors.ConfigurationError` here, before any server
    is contacted.
    """

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        db_name: str | None = None,
        collection_prefix: str = DEFAULT_PREFIX,
        names: Mapping[str, str] | None = None,
    ) -> None:
        if client is not None:
            _check_client(client)
        if url is None:
            if client is None:
                raise ThreadStoreConfigurationError(
                    "a MongoDB store needs a mongodb:// URL or client= an AsyncMongoClient"
                )
            url = "mongodb://"
        self.url: StoreURL = make_url(url)
        if self.url.scheme != "mongodb" or self.url.driver not in (None, "srv"):
            raise ThreadStoreConfigurationError(
                f"the mongo backend serves mongodb:// and mongodb+srv:// URLs, "
                f"not {self.url.full_scheme}://"
            )
        check_url_options(self.url)
        self.db_name: str = _check_db_name(db_name or self.url.database or "pai")
        if type(collection_prefix) is not str:
            raise ThreadStoreConfigurationError("option collection_prefix must be a string")
        self.collection_prefix = collection_prefix
        given = _check_names(names)
        self.names: dict[str, str] = {
            component: _check_collection(
                f"names[{component!r}]" if component in given else "collection_prefix",
                given.get(component, collection_prefix + default),
                self.db_name,
            )
            for component, default in DEFAULT_COLLECTIONS.items()
        }
        self.thread_collections()  # the default thread collections are never a component's
        super().__init__(owned=client is None)
        self._given = cast("AsyncMongoClient[Doc] | None", client)
        self._db: AsyncDatabase[Doc] | None = None

    @classmethod
    def attached(
        cls,
        url: str | StoreURL | None,
        client: object = None,
        *,
        thread_collection: str | None = None,
        **options: Any,
    ) -> MongoClientHolder:
        """The holder a store uses, counted as one more user of it.

        ``client`` is a shared :class:`MongoClientHolder` (then no client
        option may be given: the holder already has them), an application's
        ``AsyncMongoClient``, or ``None`` for a new client from ``url``. A
        thread store gives its ``collection_name`` as ``thread_collection``:
        its collections are checked against the holder's
        (:meth:`thread_collections`) before it is counted.
        """
        given = {k: v for k, v in options.items() if v is not None}
        holder = cls.shared_or_made(client, given, lambda **o: cls(url, client=client, **o))
        if thread_collection is not None:
            holder.thread_collections(thread_collection)
        holder.attach()
        return holder

    def __repr__(self) -> str:
        return (
            f"MongoClientHolder({self.url.render()!r}, db_name={self.db_name!r}, "
            f"names={self.names!r}, own_client={self.owns_client})"
        )

    @property
    def owns_client(self) -> bool:
        """Whether the holder created its client (and so closes it)."""
        return self._owned

    # ------------------------------------------------------------ the client

    async def client(self) -> AsyncMongoClient[Doc]:
        """The client, with a server proven selectable (on first call: connect).

        Concurrent callers share one attempt; a cancelled caller does not
        cancel it; a failed attempt is forgotten, and the client it made
        closed, so the next call retries with a fresh one.

        Raises
        ------
        UnavailableError
            No server could be selected in time.
        ConfigurationError
            Bad credentials or connection settings, or the holder is closed.
        """
        return await self._ready()

    def _make(self) -> AsyncMongoClient[Doc]:
        from pymongo import AsyncMongoClient

        if self._given is not None:
            return self._given
        options: dict[str, Any] = {
            "tz_aware": True,
            "document_class": dict,
            "appname": "pai-storage",
        }
        if "serverselectiontimeoutms" not in {k.lower() for k, _ in self.url.query}:
            options["serverSelectionTimeoutMS"] = DEFAULT_SERVER_SELECTION_TIMEOUT_MS
        with map_errors(self._connect_error):
            return AsyncMongoClient(self.url.render(hide_password=False), **options)

    async def _connect(self, made: AsyncMongoClient[Doc]) -> None:
        with map_errors(self._connect_error):
            await made.admin.command("hello")
        self._db = made.get_database(self.db_name, codec_options=CODEC_OPTIONS)

    async def _disconnect(self, made: AsyncMongoClient[Doc], *, failed: bool) -> None:
        with suppress(Exception):
            await made.close()

    async def discard(self) -> None:
        """Close and forget a client that proved unusable, when nothing else can use it.

        Only a client this holder made, used by one store alone: the next call
        of :meth:`client` starts with a fresh one. A shared holder keeps its
        client for its other stores; an application's client is never closed.
        """
        if not self._owned or self._users > 1 or self._closed:
            return
        if self._opening is not None and not self._opening.done():
            return  # another caller's attempt is still connecting: it is not this client
        made, self._made, self._opening = self._made, None, None
        if made is not None:
            await self._disconnect(made, failed=True)

    def _connect_error(self, exc: Exception) -> StorageError:
        if isinstance(exc, ValueError | TypeError):  # the driver's own option checks
            return ThreadStoreConfigurationError(
                redact(f"invalid MongoDB connection string: {exc}", self.url)
            )
        return runtime_error(exc, "connect", self.url)

    async def database(self) -> AsyncDatabase[Doc]:
        """The database (timezone-aware UTC dates, plain dicts), connected."""
        await self.client()
        if self._db is None or self.closed:  # the last user released the holder meanwhile
            raise closed_error()
        return self._db

    def name(self, component: str) -> str:
        """The collection name of ``component`` (``kv``, ``state``, ``snapshots``, ``guard``)."""
        return self.names[component]

    def thread_collections(self, collection_name: str | None = None) -> dict[str, str]:
        """A thread store's collections, keyed by family (see :data:`THREAD_SUFFIXES`).

        ``collection_name`` defaults to ``<collection_prefix>threads``. Each
        must be a valid MongoDB name and none a runtime component's collection:
        a runtime store's indexes on a thread collection would delete thread
        roots (the snapshot TTL index) or refuse thread writes (a unique index).

        Raises
        ------
        ConfigurationError
            A name MongoDB refuses, or one a runtime component of this holder
            uses (both are named).
        """
        kind = "collection_prefix" if collection_name is None else "collection_name"
        base = self.collection_prefix + "threads" if collection_name is None else collection_name
        threads = {family: base + suffix for family, suffix in THREAD_SUFFIXES.items()}
        owners = {
            name: f"the thread store's {family} collection" for family, name in threads.items()
        }
        for name in threads.values():
            _check_collection(kind, name, self.db_name)
        for component, name in self.names.items():
            if name in owners:
                raise ThreadStoreConfigurationError(
                    f"option names: collection {name!r} would be both {owners[name]} and the "
                    f"{component} store's; give each its own (options names, collection_name "
                    "or collection_prefix)"
                )
            owners[name] = f"the {component} store's"
        return threads

    async def collection(
        self, component: str, indexes: Sequence[IndexModel] = ()
    ) -> AsyncCollection[Doc]:
        """The component's collection, connected, its ``indexes`` created.

        Each store declares its index list; ``create_indexes`` (idempotent on
        the server, with the URL's write concern) runs once per collection per
        client, shared by concurrent callers and forgotten when it fails.

        The collection returned has majority write and read concern and reads
        from the primary, whatever the URL says: an acknowledged write is on a
        majority of the replica set and survives a failover, a read never
        returns a write a failover could roll back, and a read sees the
        caller's own acknowledged writes. The URL's ``w``, ``journal``,
        ``wTimeoutMS``, ``readConcernLevel`` and ``readPreference`` do not
        apply to the runtime stores.
        """
        db = await self.database()
        name = self.name(component)
        collection = db.get_collection(name)
        if indexes:
            await self._indexed(db, collection, indexes)
        return collection.with_options(
            write_concern=_MAJORITY_WRITES,
            read_concern=_MAJORITY_READS,
            read_preference=ReadPreference.PRIMARY,
        )

    async def _indexed(
        self,
        db: AsyncDatabase[Doc],
        collection: AsyncCollection[Doc],
        indexes: Sequence[IndexModel],
    ) -> None:
        name = collection.name
        made = _INDEXED.setdefault(cast(Any, db.client), {})
        key = (self.db_name, name)
        task = made.get(key)
        if task is None:
            task = made[key] = asyncio.ensure_future(self._create(collection, indexes))
            task.add_done_callback(_retrieve)

            def forget(done: asyncio.Future[None]) -> None:
                if (done.cancelled() or done.exception() is not None) and made.get(key) is done:
                    del made[key]

            task.add_done_callback(forget)
        await asyncio.shield(task)

    async def _create(
        self, collection: AsyncCollection[Doc], indexes: Sequence[IndexModel]
    ) -> None:
        try:
            with self.errors("connect"):
                await collection.create_indexes(list(indexes))
        except StorageError as exc:
            cause = exc.__cause__
            if isinstance(cause, pm.OperationFailure) and cause.code in (85, 86):
                raise ConfigurationError(
                    f"collection {collection.name!r} already has an index of the same keys "
                    f"but other options ({_describe(cause)}); drop that index or choose "
                    "another collection name (option names or collection_prefix)"
                ) from cause
            raise

    def errors(self, phase: Phase) -> contextlib.AbstractContextManager[None]:
        """Map every exception of the block to the contract's general errors.

        PyMongo and BSON exceptions through :func:`runtime_error`. Whatever
        else escapes a read or a write (an exception the driver raised from
        inside its own error handling, say) is
        :class:`~pai_storage.errors.OutcomeUnknownError` in a write and
        :class:`~pai_storage.errors.StorageError` in a read; after the holder
        was closed under the operation, the closed-store error.
        """
        return map_errors(functools.partial(_translate, self, phase))

    async def server_time(self) -> datetime:
        """The server's current time, to the millisecond (for bounds on an index)."""
        db = await self.database()
        with self.errors("read"):
            hello = await db.command("hello")
        return truncate_ms(hello["localTime"])


def _translate(holder: MongoClientHolder, phase: Phase, exc: Exception) -> Exception:
    """The contract's error for ``exc`` (see :meth:`MongoClientHolder.errors`)."""
    if isinstance(exc, pm.PyMongoError | BSONError):
        if holder.closed:
            return ThreadStoreConfigurationError("this store was closed while the operation ran")
        return runtime_error(exc, phase, holder.url)
    if holder.closed and isinstance(exc, AttributeError | TypeError):
        return closed_error()  # the client went away under the operation
    if phase == "write":
        return OutcomeUnknownError(
            f"a MongoDB write failed unexpectedly ({type(exc).__name__}); it may or may "
            "not have been applied: read it back before retrying"
        )
    if phase == "read":
        return StorageError(f"a MongoDB read failed unexpectedly ({type(exc).__name__})")
    return exc


def _describe(exc: pm.OperationFailure) -> str:
    name = (exc.details or {}).get("codeName") or type(exc).__name__
    return f"{name}, code {exc.code}"


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished attempt's exception as seen (its callers may all be gone)."""
    if not task.cancelled():
        task.exception()


def _check_client(client: object) -> None:
    from pymongo import AsyncMongoClient

    if not isinstance(client, AsyncMongoClient):
        raise ThreadStoreConfigurationError(
            f"option client must be a pymongo.AsyncMongoClient, not {type(client).__qualname__}"
        )


def _check_names(value: object) -> dict[str, object]:
    """The ``names`` option as a dict of known components (names are checked after)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ThreadStoreConfigurationError(
            "option names must be a mapping from component to collection name, e.g. "
            f"{{'kv': 'my_kv'}}; not {type(value).__qualname__}"
        )
    for component in value:
        if component not in DEFAULT_COLLECTIONS:
            raise ThreadStoreConfigurationError(
                f"option names: unknown component {component!r} "
                f"(valid: {', '.join(DEFAULT_COLLECTIONS)})"
            )
    return dict(value)


def _text(kind: str, value: object) -> str:
    """``value`` if it is a non-empty string UTF-8 can encode (as BSON must)."""
    if type(value) is not str or not value:
        raise ThreadStoreConfigurationError(f"option {kind} must be a non-empty string")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ThreadStoreConfigurationError(
            f"option {kind} must be valid Unicode text (it holds a lone surrogate)"
        ) from None
    return value


def _check_db_name(value: object) -> str:
    value = _text("db_name", value)
    size = len(value.encode())
    if any(c in value for c in '/\\. "$\x00'):
        raise ThreadStoreConfigurationError(
            "option db_name must not contain '/', '\\', '.', a space, '\"', '$' or U+0000"
        )
    if size > MAX_DB_NAME_BYTES:
        raise ThreadStoreConfigurationError(
            f"option db_name is {size} bytes long; MongoDB allows {MAX_DB_NAME_BYTES}"
        )
    return value


def _check_collection(kind: str, value: object, db_name: str) -> str:
    """``value`` if MongoDB accepts it as a collection name in ``db_name``, else a
    configuration error naming the option ``kind``."""
    value = _text(kind, value)
    size = len(f"{db_name}.{value}".encode())
    if (
        any(c in value for c in "\x00$")
        or ".." in value
        or value.startswith((".", "system."))
        or value.endswith(".")
    ):
        raise ThreadStoreConfigurationError(
            f"option {kind} makes a collection name MongoDB refuses: it must not contain "
            "'$', '..' or U+0000, start or end with '.', nor start with 'system.'"
        )
    if size > MAX_NAMESPACE_BYTES:
        raise ThreadStoreConfigurationError(
            f"option {kind} makes a collection name too long: the database name, a dot and "
            f"the collection name are {size} bytes; MongoDB allows {MAX_NAMESPACE_BYTES} bytes"
        )
    return value
