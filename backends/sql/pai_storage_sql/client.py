"""The SQLAlchemy engines every SQL store of a ``connect()`` call shares.

:class:`SqlClient` owns the engines, creates the schema once, and counts the
stores using it:

- a store takes its client in its constructor with :meth:`SqlClient.attached`
  (a new client from the URL and options, or the shared client given by the
  backend's opener), which counts it as a user;
- ``await client.ready()`` connects on first call and prepares the schema;
  concurrent callers share one attempt, a cancelled caller does not cancel it,
  and a failed attempt is forgotten so the next call retries;
- ``async with client.write() as conn:`` is one write transaction,
  ``async with client.read() as conn:`` one read snapshot;
  ``await client.retrying(fn)`` runs ``fn`` again after a deadlock or a lock
  wait timeout; ``with client.errors(phase):`` maps driver exceptions;
- a store calls ``await client.release()`` from its ``_close``; the last user
  disposes of the engines the client made.

Who closes what: a client a store or ``connect()`` makes for itself is closed
by its last store. A :class:`SqlClient` an application makes counts the
application as one more user, so its stores never close it: the application
does, with ``await client.close()`` (or ``async with SqlClient(url) as
client:``). An application's own SQLAlchemy ``AsyncEngine`` given as
``client=`` is used, never disposed.

SQLite (``sqlite:///path/file.db``, driver aiosqlite): WAL journal,
``busy_timeout``, ``foreign_keys=ON``; one writer connection whose
transactions start with ``BEGIN IMMEDIATE`` (so writers of several processes
queue on the database lock instead of failing at commit) and a small pool of
reader connections, each read one deferred ``BEGIN`` snapshot. A
``sqlite:///:memory:`` database lives on one connection that reads and writes
take in turn.

MySQL / MariaDB (``mysql://``, ``mariadb://``; driver asyncmy, ``+aiomysql``
accepted): one pool; writes are ``REPEATABLE READ`` transactions that hold
rows with ``SELECT ... FOR UPDATE``; reads are ``START TRANSACTION WITH
CONSISTENT SNAPSHOT, READ ONLY``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import sqlite3
import threading
import weakref
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from pai_storage import StorageError, ThreadStoreConfigurationError
from pai_storage.backend import (
    HeldWarnings,
    SharedClient,
    StoreURL,
    deliver_held_warnings,
    holding_warnings,
    make_url,
    run_sync,
)
from pai_storage.shared import closed_error

from .errors import Phase, RetryableError, is_driver_exception, is_driver_failure, map_error
from .schema import DEFAULT_PREFIX, SCHEMA_VERSION, Tables, prepare_schema

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = [
    "CLIENT_OPTIONS",
    "Dialect",
    "Engines",
    "Held",
    "Operation",
    "SqlClient",
    "Statement",
    "is_unique_violation",
]

T = TypeVar("T")

Dialect = Literal["sqlite", "mysql"]

CLIENT_OPTIONS = frozenset(
    {"table_prefix", "names", "busy_timeout", "pool_size", "connect_timeout", "retry_attempts"}
)
"""The options that shape a :class:`SqlClient` (every SQL store takes them)."""

_ENGINE_OPTIONS = ("pool_size", "connect_timeout")
"""Options of the engines a client makes (an application's engine keeps its own)."""

_ACCEPTED_CLIENTS = (
    "a SQLAlchemy AsyncEngine (sqlite+aiosqlite, mysql+asyncmy or mysql+aiomysql) "
    "or a pai_storage_sql SqlClient"
)

_STORES = object()
"""Marks a client made by a store or ``connect()`` (closed by its last store)."""

_SQLITE_SCHEMES = {"sqlite": ("aiosqlite",)}
_MYSQL_SCHEMES = {"mysql": ("asyncmy", "aiomysql"), "mariadb": ("asyncmy", "aiomysql")}


@dataclass(slots=True)
class Engines:
    """The connected engines: ``writer`` and ``reader`` are the same engine on MySQL
    and for an in-memory SQLite database."""

    writer: AsyncEngine
    reader: AsyncEngine
    lock: asyncio.Lock | None
    """Serializes every operation of an in-memory SQLite database (one connection)."""
    held_writer: Held | None = None
    """SQLite engines the client made: the connections its writes keep checked out."""
    held_reader: Held | None = None
    """The same for reads (the writer's for an in-memory database)."""
    executor: ThreadPoolExecutor | None = None
    """SQLite engines the client made: the threads operations run whole in
    (one per held connection, so each connection is used by one at a time)."""


class Held:
    """Connections of one engine that a client keeps checked out between operations.

    SQLite engines the client made: checking a connection out of SQLAlchemy's
    pool and back in costs more than a short statement, so the client's
    operations take them from here (at most ``limit`` at once, in arrival
    order when all are busy). A connection comes from the engine's pool the
    first time it is needed and goes back when it is dropped (its operation
    failed in the driver or was cancelled: it is then invalidated) or when
    the client is disposed of. The engines keep room beside them for the
    application's direct use of ``ready()``'s engines.
    """

    __slots__ = ("count", "engine", "idle", "limit", "waiters")

    def __init__(self, engine: AsyncEngine, limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self.idle: list[AsyncConnection] = []
        self.count = 0
        """Connections held: idle, in use, or being connected."""
        self.waiters: deque[asyncio.Future[AsyncConnection | None]] = deque()

    async def take(self) -> AsyncConnection:
        """An idle connection, a new one while fewer than ``limit`` are held, else
        the next one given back (or the slot of one dropped)."""
        if self.idle:
            return self.idle.pop()
        if self.count < self.limit:
            self.count += 1
        else:
            waiter: asyncio.Future[AsyncConnection | None] = (
                asyncio.get_running_loop().create_future()
            )
            self.waiters.append(waiter)
            try:
                given = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    # Handed over as this caller was cancelled: pass it on.
                    passed = waiter.result()
                    if passed is None:
                        self.free()
                    else:
                        self.give(passed)
                raise
            if given is not None:
                return given
            # A dropped connection's slot: counted already, connect anew.
        try:
            return await self.engine.connect()
        except BaseException:
            self.free()
            raise

    def give(self, conn: AsyncConnection) -> None:
        """A connection back from a clean operation: to the first waiter, else idle."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    def free(self) -> None:
        """A held connection was dropped: its slot goes to the first waiter."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.count -= 1

    async def close(self) -> None:
        """Give the idle connections back to the engine's pool."""
        idle, self.idle = self.idle, []
        for conn in idle:
            self.count -= 1
            with contextlib.suppress(Exception):
                await conn.close()


class SqlClient(SharedClient[Engines]):
    """SQLAlchemy engines for one database, the tables they serve, and their users.

    Parameters
    ----------
    url:
        ``sqlite:///relative.db``, ``sqlite:////absolute/path.db``,
        ``sqlite:///:memory:`` (also ``sqlite+aiosqlite://``);
        ``mysql://user:password@host:port/database`` (also ``mariadb://``,
        ``mysql+asyncmy://``, ``mysql+aiomysql://``); query parameters go to the
        driver.
    engine:
        An application's own SQLAlchemy ``AsyncEngine`` (``sqlite+aiosqlite``,
        ``mysql+asyncmy`` or ``mysql+aiomysql``) to use instead of making
        engines; ``url`` may then be left out. pai-storage never disposes of
        it. Its pool serves reads and writes; on SQLite each of its
        connections gets ``PRAGMA foreign_keys=ON`` (and ``busy_timeout`` when
        given) the first time a store uses it, and the file keeps its journal
        mode; on MySQL the stores' transactions run at ``REPEATABLE READ`` and
        the engine must connect with ``charset=utf8mb4``.
    table_prefix:
        Base name of the thread tables (default ``"pai_threads"``); the
        runtime tables use ``pai_`` under the default and ``<prefix>_`` otherwise.
    names:
        Base names of runtime components' tables, e.g. ``{"kv": "my_kv"}``
        (components ``kv``, ``state``, ``snapshots``, ``guard``; the same
        rules as ``table_prefix``).
    busy_timeout:
        SQLite: seconds a writer waits for another connection's write lock
        before failing with ``UnavailableError`` (default 5).
    pool_size:
        SQLite: reader connections (default 4); MySQL: pooled connections
        (default 10). Not with ``engine``.
    connect_timeout:
        MySQL: seconds to wait for a connection (default 10). Not with ``engine``.
    retry_attempts:
        Attempts of a write that hits a deadlock or lock wait timeout (default 3).

    A client made this way belongs to the application: the stores it is given
    to never close it; ``await client.close()`` does once they are closed (or
    ``async with SqlClient(url) as client:``).
    """

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        engine: AsyncEngine | None = None,
        table_prefix: str = DEFAULT_PREFIX,
        names: object = None,
        busy_timeout: float | None = None,
        pool_size: int | None = None,
        connect_timeout: float = 10.0,
        retry_attempts: int = 3,
        _maker: object = None,
    ) -> None:
        if engine is not None:
            _check_engine(engine)
            # The engine says which database it is; its password stays out of messages.
            url = url or engine.url.render_as_string(hide_password=True)
        if url is None:
            raise ThreadStoreConfigurationError(
                "a SQL store needs a sqlite:// or mysql:// URL (e.g. sqlite:///pai.db) "
                "or client= an AsyncEngine"
            )
        self.url: StoreURL = make_url(url)
        scheme, driver = self.url.scheme, self.url.driver
        if scheme in _SQLITE_SCHEMES and driver in (None, *_SQLITE_SCHEMES[scheme]):
            self.dialect: Dialect = "sqlite"
        elif scheme in _MYSQL_SCHEMES and driver in (None, *_MYSQL_SCHEMES[scheme]):
            self.dialect = "mysql"
        else:
            raise ThreadStoreConfigurationError(
                "the sql backend serves sqlite://, sqlite+aiosqlite://, mysql://, mariadb:// "
                f"(+asyncmy or +aiomysql) URLs, not {self.url.full_scheme}://"
            )
        self.driver = driver or ("aiosqlite" if self.dialect == "sqlite" else "asyncmy")
        if engine is not None:
            given_dialect = "sqlite" if engine.dialect.name == "sqlite" else "mysql"
            if given_dialect != self.dialect:
                raise ThreadStoreConfigurationError(
                    f"the URL ({self.url.full_scheme}://) and the engine "
                    f"({engine.dialect.name}+{engine.dialect.driver}) name different databases"
                )
            self.driver = engine.dialect.driver
        if importlib.util.find_spec(self.driver) is None:
            extra = "sql" if self.dialect == "sqlite" else "mysql"
            hint = "aiomysql" if self.driver == "aiomysql" else f"'pai-storage[{extra}]'"
            raise ThreadStoreConfigurationError(
                f"the {self.url.full_scheme}:// URL needs the {self.driver} driver: "
                f"pip install {hint}"
            )
        if busy_timeout is not None:
            _check_seconds("busy_timeout", busy_timeout)
        _check_seconds("connect_timeout", connect_timeout)
        if pool_size is None:
            pool_size = 4 if self.dialect == "sqlite" else 10
        _check_int("pool_size", pool_size, 1)
        _check_int("retry_attempts", retry_attempts, 1)
        self._busy_given = busy_timeout is not None
        self.busy_timeout = float(busy_timeout) if busy_timeout is not None else 5.0
        self.pool_size = pool_size
        self.connect_timeout = float(connect_timeout)
        self.retry_attempts = retry_attempts
        self._engine = engine
        self.memory = self.dialect == "sqlite" and self._sqlite_path() == ":memory:"
        self.tables: Tables = Tables.define(table_prefix, names)
        """Every table (thread tables and ``tables.runtime``) on one metadata."""
        self.server_version: str | None = None
        """``"SQLite 3.x"`` or ``"MariaDB 10.11.x"`` / ``"MySQL 8.x"`` once connected."""
        self.is_mariadb = False
        self.max_packet: int | None = None
        """MySQL: the server's ``max_allowed_packet`` (bytes one statement may carry)."""
        self._core_cache: MutableMapping[Any, Any] = weakref.WeakKeyDictionary()
        """The compiled forms of the runtime stores' statements (SQLite), by statement."""
        super().__init__(owned=engine is None)
        self._held = _maker is not _STORES
        if self._held:
            self.attach()  # the application's hold, released by close()

    @classmethod
    def shared(cls, url: str | StoreURL | None, client: object = None, **options: Any) -> SqlClient:
        """The client for the stores of one ``connect()`` call (not yet counted as used).

        ``client`` is a :class:`SqlClient` (then no client option may be given:
        the client already has them), an application's ``AsyncEngine`` (used,
        never disposed), or ``None`` for new engines from ``url``; options
        given as ``None`` take their defaults. A client made here is closed by
        the last store that releases it.
        """
        given = {k: v for k, v in options.items() if v is not None}
        if isinstance(client, SqlClient):
            if given:
                raise ThreadStoreConfigurationError(
                    f"option(s) {', '.join(sorted(given))} cannot be combined with a shared "
                    "client; give them where the client is made"
                )
            return client
        if client is not None:
            _check_engine(client)
            fixed = sorted(k for k in given if k in _ENGINE_OPTIONS)
            if fixed:
                raise ThreadStoreConfigurationError(
                    f"option(s) {', '.join(fixed)} cannot be combined with an application's "
                    "engine (it keeps its own pool settings)"
                )
        return cls(url, engine=cast("AsyncEngine | None", client), _maker=_STORES, **given)

    @classmethod
    def attached(
        cls, url: str | StoreURL | None, client: object = None, **options: Any
    ) -> SqlClient:
        """The client a store uses, counted as one more user of it.

        ``client`` and ``options`` as for :meth:`shared`.
        """
        made = cls.shared(url, client, **options)
        made.attach()
        return made

    async def close(self) -> None:
        """Release the application's hold on a client it made (once; later calls do
        nothing). Its engines are disposed of when its last store is closed too."""
        if self._held:
            self._held = False
            await self.release()

    async def __aenter__(self) -> SqlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def owns_engine(self) -> bool:
        """Whether the client made its engines (and so disposes of them)."""
        return self._owned

    def __repr__(self) -> str:
        return (
            f"SqlClient({str(self.url)!r}, table_prefix={self.tables.prefix!r}, "
            f"own_engine={self.owns_engine})"
        )

    # ------------------------------------------------------------ engines

    async def ready(self) -> Engines:
        """The engines, connected and with the schema ready (on first call: connect, prepare)."""
        return await self._ready()

    def _sqlite_path(self) -> str:
        if self._engine is not None:
            database = self._engine.url.database
            return database if database not in (None, "") else ":memory:"
        path = self.url.path
        if path in ("", "/", "/:memory:"):
            return ":memory:"
        return path[1:]  # sqlite:///rel.db -> rel.db; sqlite:////abs.db -> /abs.db

    def _make(self) -> Engines:
        from sqlalchemy import event
        from sqlalchemy.engine import URL
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import StaticPool

        if self._engine is not None:
            return self._given_engines(self._engine, event)
        query = dict(self.url.query)
        if self.dialect == "sqlite":
            path = self._sqlite_path()
            sa_url = URL.create("sqlite+aiosqlite", database=path, query=query)
            # An operation may run whole in a thread of the client's executor,
            # on the connection's sqlite3 connection (see SqlClient.run_write).
            connect_args = {"timeout": self.busy_timeout, "check_same_thread": False}
            if self.memory:
                engine = create_async_engine(
                    sa_url, poolclass=StaticPool, connect_args=connect_args
                )
                self._sqlite_hooks(engine, event)
                held = Held(engine, 1)
                return Engines(engine, engine, asyncio.Lock(), held, held, _executor(1))
            # Each operation ends its own transaction (commit, or rollback on
            # close), so the pool's own rollback on return would only repeat it.
            # The client's operations keep their connections checked out (Held:
            # one writer, pool_size readers); one overflow connection serves a
            # direct use of the engines meanwhile.
            writer = create_async_engine(
                sa_url,
                pool_size=1,
                max_overflow=1,
                pool_timeout=None,
                pool_reset_on_return=None,
                connect_args=connect_args,
            )
            reader = create_async_engine(
                sa_url,
                pool_size=self.pool_size,
                max_overflow=1,
                pool_timeout=None,
                pool_reset_on_return=None,
                connect_args=connect_args,
            )
            self._sqlite_hooks(writer, event)
            self._sqlite_hooks(reader, event)
            held_writer, held_reader = Held(writer, 1), Held(reader, self.pool_size)
            executor = _executor(1 + self.pool_size)
            return Engines(writer, reader, None, held_writer, held_reader, executor)
        driver = self.driver
        query.setdefault("charset", "utf8mb4")
        sa_url = URL.create(
            f"mysql+{driver}",
            username=self.url.username,
            password=self.url.password,
            host=self.url.host or "127.0.0.1",
            port=self.url.port,
            database=self.url.database,
            query=query,
        )
        engine = create_async_engine(
            sa_url,
            pool_size=self.pool_size,
            max_overflow=0,
            pool_recycle=3600,
            isolation_level="REPEATABLE READ",
            connect_args={"connect_timeout": self.connect_timeout},
        )
        self._check_driver_options(engine)
        return Engines(engine, engine, None)

    def _check_driver_options(self, engine: AsyncEngine) -> None:
        """Refuse URL query parameters the driver's ``connect()`` does not take
        (a ConfigurationError naming them, not the driver's TypeError later)."""
        import inspect

        dialect = engine.sync_engine.dialect
        _, given = dialect.create_connect_args(engine.sync_engine.url)
        try:
            accepted = inspect.signature(importlib.import_module(self.driver).connect).parameters
        except (TypeError, ValueError):  # not introspectable: let the driver judge
            return
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
            return
        unknown = sorted(set(given) - set(accepted))
        if unknown:
            raise ThreadStoreConfigurationError(
                f"unknown URL query parameter(s) for the {self.driver} driver: "
                f"{', '.join(unknown)} (store options are keyword arguments, not URL parameters)"
            )

    def _given_engines(self, engine: AsyncEngine, event: Any) -> Engines:
        """The application's engine, through a proxy of its own (same pool) that
        carries this client's settings; nothing is changed on ``engine`` itself."""
        if self.dialect == "mysql":
            return Engines(engine, engine, None)  # isolation checked by _connect
        own = engine.execution_options()
        settings = ["PRAGMA foreign_keys=ON"]
        if self._busy_given:
            settings.append(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        key = f"pai_storage_sql:{';'.join(settings)}"

        def on_engine_connect(conn: Any) -> None:
            # Once per driver connection (the pool keeps ``info`` with it).
            info = conn.connection.info
            if info.get(key):
                return
            cursor = conn.connection.dbapi_connection.cursor()
            try:
                for statement in settings:
                    cursor.execute(statement)
            finally:
                cursor.close()
            info[key] = True

        event.listen(own.sync_engine, "engine_connect", on_engine_connect)
        return Engines(own, own, asyncio.Lock() if self.memory else None)

    def _sqlite_hooks(self, engine: AsyncEngine, event: Any) -> None:
        busy_ms = int(self.busy_timeout * 1000)
        memory = self.memory

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            # The transactions are begun explicitly (BEGIN IMMEDIATE / BEGIN):
            # the driver must not begin its own.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                if not memory:
                    cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
                cursor.execute("PRAGMA foreign_keys=ON")
            finally:
                cursor.close()

        event.listen(engine.sync_engine, "connect", on_connect)

    async def _connect(self, made: Engines) -> None:
        if self._engine is not None and self.dialect == "mysql":
            await self._check_given_mysql(made)
        with self.errors("connect"):
            async with made.writer.connect() as conn:
                self.server_version, self.is_mariadb = await prepare_schema(
                    conn, self.dialect, self.tables
                )
                if self.dialect == "mysql":
                    packet = await conn.exec_driver_sql("SELECT @@global.max_allowed_packet")
                    self.max_packet = int(packet.scalar_one())
                    await conn.rollback()

    async def _check_given_mysql(self, made: Engines) -> None:
        """An application's MySQL engine: ``utf8mb4`` connections, and transactions
        at ``REPEATABLE READ`` (through a proxy of the engine when it uses another level)."""
        with self.errors("connect"):
            async with made.writer.connect() as conn:
                result = await conn.exec_driver_sql(
                    "SELECT @@character_set_client, @@character_set_connection, "
                    "@@character_set_results"
                )
                charsets = list(result.one())
                isolation = await conn.get_isolation_level()
                await conn.rollback()
        if any(str(c).lower() != "utf8mb4" for c in charsets):
            raise ThreadStoreConfigurationError(
                f"the application's engine connects with character set {charsets[0]}; "
                "pai-storage needs utf8mb4 (add ?charset=utf8mb4 to the engine's URL)"
            )
        if isolation != "REPEATABLE READ":
            own = made.writer.execution_options(isolation_level="REPEATABLE READ")
            made.writer = made.reader = own

    async def _disconnect(self, made: Engines, *, failed: bool) -> None:
        for held in {id(h): h for h in (made.held_writer, made.held_reader) if h}.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(held.close(), timeout=10)
        for engine in {id(made.writer): made.writer, id(made.reader): made.reader}.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.dispose(), timeout=10)
        if made.executor is not None:
            made.executor.shutdown(wait=False)

    # ------------------------------------------------------------ operations

    def errors(self, phase: Phase) -> contextlib.AbstractContextManager[None]:
        """Map every driver exception of the block to the contract's errors.

        Exceptions that do not come from the driver or the connection (the
        store's own, a conflict signal, a bug) pass through unchanged.
        """
        return _MappedErrors(phase, self.url)

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """One write transaction, committed when the block exits normally.

        SQLite: the writer connection, ``BEGIN IMMEDIATE`` (waits up to
        ``busy_timeout`` for another writer, then ``UnavailableError``).
        MySQL: a pooled connection in a ``REPEATABLE READ`` transaction.
        Anything raised in the block rolls the transaction back (a driver
        exception is mapped to the contract's errors first; a deadlock or lock
        wait timeout becomes :class:`~pai_storage_sql.errors.RetryableError`).
        A ``COMMIT`` whose connection fails gives ``OutcomeUnknownError``.
        """
        async with self._operation(True, True) as op:
            yield op.conn

    @contextlib.asynccontextmanager
    async def read(self, *, snapshot: bool = True) -> AsyncIterator[AsyncConnection]:
        """One read snapshot, rolled back afterwards.

        SQLite: a reader connection in a deferred ``BEGIN`` (the snapshot
        starts with its first statement). MySQL: ``START TRANSACTION WITH
        CONSISTENT SNAPSHOT, READ ONLY``. ``snapshot=False`` skips the explicit
        transaction for an operation of one statement (which is its own
        snapshot).
        """
        async with self._operation(False, snapshot) as op:
            yield op.conn

    def writing(self) -> contextlib.AbstractAsyncContextManager[Operation]:
        """:meth:`write` as an :class:`Operation`: its statements may also run
        precompiled on the driver connection (same transaction)."""
        return self._operation(True, True)

    def reading(
        self, *, snapshot: bool = True
    ) -> contextlib.AbstractAsyncContextManager[Operation]:
        """:meth:`read` as an :class:`Operation` (see :meth:`writing`)."""
        return self._operation(False, snapshot)

    def _operation(self, write: bool, begin: bool) -> _Scope:
        """One write transaction (``write``) or read, on a connection of its own.

        Driver exceptions are mapped (phase ``connect``, then ``write`` or
        ``read``, ``commit`` for the ``COMMIT``). Anything raised rolls the
        transaction back; a connection whose state is unknown (cancelled
        mid-way, or the driver failed) is invalidated: closed, never reused.
        """
        return _Scope(self, write, begin)

    async def _begin(self, op: Operation, write: bool, begin: bool) -> None:
        if write:
            # MySQL: the driver connection is not in autocommit mode; its
            # transaction begins with the first statement.
            if op.sqlite:
                await op.run_text("BEGIN IMMEDIATE")
        elif begin:
            await op.run_text(
                "BEGIN" if op.sqlite else "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"
            )

    async def _end(self, op: Operation, write: bool) -> None:
        if write:
            with self.errors("commit"):
                await op.commit()
        elif op.sqlite:
            # Ends the snapshot (SQLite connections are not reset between operations).
            await op.rollback()

    async def run_write(self, body: Callable[[Operation], Awaitable[T]]) -> T:
        """``await body(op)`` in one write transaction (see :meth:`write`), committed
        when it returns.

        On SQLite engines the client made, the whole transaction (``BEGIN
        IMMEDIATE``, ``body``, ``COMMIT``) runs as one call in a thread of the
        client's executor, on the writer connection's ``sqlite3`` connection
        (the database thread; aiosqlite's own thread is idle meanwhile, the
        operation having the connection to itself): ``body``'s statements run at once, with no
        trip between threads per statement (it must not wait for anything but
        ``op``'s statements, and never use ``op.conn``, SQLAlchemy's execution
        layer; :func:`~pai_storage.backend.run_sync` raises if it does, and the
        transaction is rolled back). Warnings it emits are
        delivered afterwards, on the event loop. Elsewhere it runs in
        :meth:`writing`. Errors, rollback and the connection's fate are those of
        :meth:`write`.
        """
        return await self._run(True, True, body)

    async def run_read(
        self,
        body: Callable[[Operation], Awaitable[T]],
        *,
        snapshot: bool = True,
        in_thread: bool = True,
    ) -> T:
        """``await body(op)`` in one read snapshot (see :meth:`read`), in the reader
        connection's database thread as one call where :meth:`run_write` runs a
        write in one. ``in_thread=False`` runs it statement by statement (for a
        read of one statement, that one trip is all)."""
        return await self._run(False, snapshot, body, in_thread)

    async def _run(
        self,
        write: bool,
        begin: bool,
        body: Callable[[Operation], Awaitable[T]],
        in_thread: bool = True,
    ) -> T:
        engines = self._made
        if engines is None or self._closed:
            engines = await self._ready()
        executor = engines.executor
        if not in_thread or executor is None:
            async with self._operation(write, begin) as op:
                return await body(op)
        held: HeldWarnings = []
        abandoned = threading.Event()
        lock = engines.lock
        if lock is not None:
            await lock.acquire()
        try:
            op = await self._checkout(engines, write)
            inline = Operation(op.conn, InlineDriver(_sqlite3_of(op)), True, op.held)
            # The connection is this operation's: its aiosqlite thread is idle
            # while a thread of the executor runs the whole operation on it.
            call = asyncio.get_running_loop().run_in_executor(
                executor, _in_thread, inline, write, begin, body, held, abandoned
            )
            try:
                try:
                    with self.errors("write" if write else "read"):
                        result: T = await asyncio.shield(call)
                except _CommitFailed as failed:
                    with self.errors("commit"):
                        raise failed.error from None
            except asyncio.CancelledError:
                # The call ends its own transaction there (rolled back unless it
                # was committing): once it has, the connection is clean and kept
                # (closing the only connection of an in-memory database would
                # lose the database).
                abandoned.set()
                await _settled(call)
                await self._failed(op, _call_failure(call))
                raise
            except BaseException as exc:
                await self._failed(op, exc)
                raise
            await self._checkin(op, reuse=True)
            return result
        finally:
            if lock is not None:
                lock.release()
            await deliver_held_warnings(held)

    async def _failed(self, op: Operation, exc: BaseException) -> None:
        """Put ``op``'s connection back after ``exc``: rolled back and reused, or,
        when its state is unknown (cancelled mid-way, or the driver failed),
        invalidated: closed, never reused.

        The one connection of an in-memory database is kept after a
        cancellation (closing it would lose the database) when only the driver
        ran the operation's statements: its transaction is rolled back in the
        driver's thread, after whatever statement is still running there.
        """
        if (
            self.memory
            and isinstance(exc, asyncio.CancelledError)
            and not op.conn.in_transaction()
            and op.held is not None
        ):
            ended = False
            with contextlib.suppress(BaseException):
                await op.driver.rollback()  # queued after the statement still running
                ended = True
            if ended:
                await self._checkin(op, reuse=True)
                return
        if not isinstance(exc, Exception) or (
            is_driver_failure(exc) and not isinstance(exc, RetryableError)
        ):
            with contextlib.suppress(BaseException):
                await op.conn.invalidate()
            await self._checkin(op, reuse=False)
        else:
            with contextlib.suppress(Exception):
                await op.rollback()
            await self._checkin(op, reuse=True)

    async def _checkout(self, engines: Engines, write: bool) -> Operation:
        """A connection for one operation: a held one (SQLite engines the client
        made) or one from the engine's pool."""
        held = engines.held_writer if write else engines.held_reader
        with self.errors("connect"):
            if held is not None:
                conn = await held.take()
            else:
                conn = await (engines.writer if write else engines.reader).connect()
        # The connection is checked out: its driver connection is at hand.
        driver = conn.sync_connection.connection.driver_connection  # type: ignore[union-attr]
        op = Operation(conn, driver, self.dialect == "sqlite", held)
        if self._closed:
            # The last store was closed while this operation waited.
            await self._checkin(op, reuse=False)
            raise closed_error()
        if held is not None and _SQLITE3 not in _pool_info(op):
            try:
                with self.errors("connect"):
                    await _find_sqlite3(op)
            except BaseException as exc:
                await self._failed(op, exc)
                raise
        return op

    async def _checkin(self, op: Operation, *, reuse: bool) -> None:
        """Keep a held connection for the next operation, or return it to the pool."""
        held = op.held
        if held is not None and reuse and not self._closed:
            held.give(op.conn)
            return
        try:
            with contextlib.suppress(Exception):
                await op.conn.close()
        finally:
            if held is not None:
                held.free()

    def connection(self, op: Operation) -> AsyncConnection:
        """The connection the runtime stores work with in ``op``: a
        :class:`CoreConnection` on SQLite engines the client made (their Core
        statements run on the driver), else ``op``'s ``AsyncConnection``."""
        if op.held is None:
            return op.conn
        return cast("AsyncConnection", CoreConnection(op, self._core_cache))

    async def retrying(self, operation: Callable[[], Awaitable[T]]) -> T:
        """``await operation()``, again after a deadlock or lock wait timeout.

        Each attempt must run its own :meth:`write` block (a retried attempt
        starts afresh). After ``retry_attempts`` attempts the last
        :class:`~pai_storage_sql.errors.RetryableError` is raised.
        """
        for attempt in range(self.retry_attempts):
            try:
                return await operation()
            except RetryableError:
                if attempt + 1 == self.retry_attempts:
                    raise
                await asyncio.sleep(0.005 * (attempt + 1))
        raise AssertionError("unreachable")

    async def server_time(self, conn: AsyncConnection) -> datetime:
        """The clock commits are stamped with, read inside the transaction of ``conn``.

        SQLite has no server: the store's clock is this process's UTC clock.
        MySQL: ``UTC_TIMESTAMP(6)`` of the server.
        """
        if self.dialect == "sqlite":
            return datetime.now(UTC)
        with self.errors("write"):
            result = await conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)")
            value = cast(datetime, result.scalar_one())
        return value.replace(tzinfo=UTC)

    @property
    def schema_version(self) -> int:
        return SCHEMA_VERSION


class _Scope(contextlib.AbstractAsyncContextManager["Operation"]):
    """:meth:`SqlClient._operation`, as a plain class (every operation runs in one:
    no generator per operation)."""

    __slots__ = ("_begin", "_client", "_lock", "_op", "_phase", "_write")

    def __init__(self, client: SqlClient, write: bool, begin: bool) -> None:
        self._client = client
        self._write = write
        self._begin = begin
        self._phase: Phase = "write" if write else "read"

    async def __aenter__(self) -> Operation:
        client = self._client
        engines = client._made
        if engines is None or client._closed:
            engines = await client._ready()
        lock = self._lock = engines.lock
        if lock is not None:
            await lock.acquire()
        try:
            op = self._op = await client._checkout(engines, self._write)
            try:
                with client.errors(self._phase):
                    await client._begin(op, self._write, self._begin)
            except BaseException as exc:
                await client._failed(op, exc)
                raise
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        return op

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        client, op = self._client, self._op
        try:
            if exc is not None:
                # The block's driver errors are mapped; anything else propagates
                # as it was raised.
                failure = _mapped(exc, self._phase, client.url)
                await client._failed(op, failure)
                if failure is not exc:
                    raise failure from exc
                return
            try:
                with client.errors(self._phase):
                    await client._end(op, self._write)
            except BaseException as failed:
                await client._failed(op, failed)
                raise
            await client._checkin(op, reuse=True)
        finally:
            if self._lock is not None:
                self._lock.release()


class _MappedErrors(contextlib.AbstractContextManager[None]):
    """:meth:`SqlClient.errors`, as a plain class (it wraps every operation: no
    generator per use)."""

    __slots__ = ("_phase", "_url")

    def __init__(self, phase: Phase, url: StoreURL) -> None:
        self._phase = phase
        self._url = url

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            mapped = _mapped(exc, self._phase, self._url)
            if mapped is not exc:
                raise mapped from exc


def _mapped(exc: BaseException, phase: Phase, url: StoreURL) -> BaseException:
    """The contract's error for a driver exception; any other exception itself."""
    if not isinstance(exc, Exception) or isinstance(exc, StorageError):
        return exc
    return map_error(exc, phase, url) if is_driver_exception(exc) else exc


class Statement:
    """A SQLAlchemy Core statement compiled once for the dialect of a connection.

    Run by :class:`Operation` directly on the driver connection: the SQL text in
    the driver's paramstyle and its parameters in order, taken by name from a
    mapping (a name the statement bound a value for defaults to that value).
    An expanding ``IN`` parameter takes a non-empty sequence.
    """

    __slots__ = ("_expanding", "_mark", "_names", "_plan", "_texts", "defaults", "text")

    def __init__(self, statement: Any, dialect: Any) -> None:
        compiled = statement.compile(dialect=dialect)
        binds = compiled.binds
        self._names: tuple[str, ...] = tuple(compiled.positiontup or ())
        self.defaults: dict[str, Any] = {n: binds[n].value for n in self._names}
        self._expanding = frozenset(n for n in self._names if binds[n].expanding)
        self._plan = tuple((n, n in self._expanding) for n in self._names)
        self.text: str = compiled.string
        self._texts: dict[tuple[int, ...], str] = {}
        self._mark = "?" if dialect.paramstyle == "qmark" else "%s"

    def bind(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL text and positional parameters for ``params``."""
        defaults = self.defaults
        if not self._expanding:
            try:
                return self.text, [params[n] for n in self._names]
            except KeyError:
                return self.text, [params[n] if n in params else defaults[n] for n in self._names]
        args: list[Any] = []
        sizes: list[int] = []
        for name, expanding in self._plan:
            value = params[name] if name in params else defaults[name]
            if expanding:
                values = value if type(value) is list else list(value)
                if not values:
                    raise ValueError(f"expanding parameter {name} needs at least one value")
                sizes.append(len(values))
                args.extend(values)
            else:
                args.append(value)
        key = tuple(sizes)
        text = self._texts.get(key)
        if text is None:
            text = self.text
            counts = iter(sizes)
            for name, expanding in self._plan:
                if expanding:
                    marks = ", ".join([self._mark] * next(counts))
                    text = text.replace(f"__[POSTCOMPILE_{name}]", marks)
            self._texts[key] = text
        return text, args


class Operation:
    """One write transaction or read snapshot of a :class:`SqlClient`.

    ``conn`` is its SQLAlchemy connection; :meth:`rows`, :meth:`execute` and
    :meth:`executemany` run a precompiled :class:`Statement` on the same
    connection's driver (aiosqlite or asyncmy) without SQLAlchemy's per-statement
    work, inside the same transaction. Driver exceptions are left to the
    client's error mapping around the operation. The engine's SQLAlchemy
    ``before_cursor_execute`` listeners still see every such
    statement (with ``cursor`` and ``context`` ``None``; their return value is
    not used).
    """

    __slots__ = ("_events", "conn", "dialect", "driver", "held", "sqlite")

    def __init__(
        self, conn: AsyncConnection, driver: Any, sqlite: bool, held: Held | None = None
    ) -> None:
        self.conn = conn
        self.driver = driver
        self.sqlite = sqlite
        self.held = held
        self.dialect = conn.dialect
        events = conn.sync_engine.dispatch.before_cursor_execute
        self._events: Any = events if events else None

    @property
    def inline(self) -> bool:
        """Whether this operation runs whole in the database's thread
        (:meth:`SqlClient.run_write`)."""
        return isinstance(self.driver, InlineDriver)

    def _announce(self, text: str, args: Any, many: bool) -> None:
        self._events(self.conn.sync_connection, None, text, args, None, many)

    def compile(self, statement: Any) -> Statement:
        return Statement(statement, self.dialect)

    async def rows(self, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """The rows (tuples) of a query."""
        text, args = statement.bind(params)
        if self._events is not None:
            self._announce(text, args, False)
        if self.sqlite:
            return cast(list[Any], await self.driver.execute_fetchall(text, args))
        async with self.driver.cursor() as cursor:
            await cursor.execute(text, args)
            return list(await cursor.fetchall())

    async def execute(self, statement: Statement, params: Mapping[str, Any]) -> None:
        """Run a statement that returns no rows."""
        text, args = statement.bind(params)
        if self._events is not None:
            self._announce(text, args, False)
        if self.sqlite:
            await self.driver.execute_fetchall(text, args)
            return
        async with self.driver.cursor() as cursor:
            await cursor.execute(text, args)

    async def executemany(self, statement: Statement, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement once per parameter set (MySQL: one multi-row ``INSERT``)."""
        if not params:
            return
        text = statement.text
        rows = [statement.bind(p)[1] for p in params]
        if self._events is not None:
            self._announce(text, [tuple(r) for r in rows], True)
        if self.sqlite:
            await self.driver.executemany(text, rows)
            return
        async with self.driver.cursor() as cursor:
            await cursor.executemany(text, rows)

    async def run_text(self, sql: str) -> None:
        """Run one SQL text without parameters or rows (transaction control)."""
        if self._events is not None:
            self._announce(sql, (), False)
        if self.sqlite:
            await self.driver.execute_fetchall(sql, ())
            return
        async with self.driver.cursor() as cursor:
            await cursor.execute(sql)

    async def commit(self) -> None:
        """Commit the transaction (begun on the driver, or by SQLAlchemy statements)."""
        if self.conn.in_transaction():
            await self.conn.commit()
        else:
            await self.driver.commit()

    async def rollback(self) -> None:
        """Roll the transaction back, if one is open."""
        if self.conn.in_transaction():
            await self.conn.rollback()
        elif not self.sqlite or self.driver.in_transaction:
            await self.driver.rollback()


class InlineDriver:
    """aiosqlite's connection as :class:`Operation` and :class:`CoreConnection`
    use it, over its ``sqlite3`` connection, inside the database thread.

    For :meth:`SqlClient.run_write`: every method is a coroutine that runs its
    statement at once and never suspends.
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    @property
    def in_transaction(self) -> bool:
        return self._raw.in_transaction

    async def execute_fetchall(self, sql: str, args: Any) -> list[Any]:
        return self._raw.execute(sql, args).fetchall()

    async def execute(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        return self._raw.execute(sql, args)

    async def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self._raw.executemany(sql, rows)

    async def commit(self) -> None:
        self._raw.commit()

    async def rollback(self) -> None:
        self._raw.rollback()


class _CommitFailed(Exception):
    """The ``COMMIT`` of an inline write failed with ``error`` (mapped as a commit's)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _executor(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pai-sqlite")


_SQLITE3 = "pai_storage_sql.sqlite3"
"""Key of a connection's ``sqlite3`` connection in its pool entry's ``info``."""


def _pool_info(op: Operation) -> dict[Any, Any]:
    """The ``info`` of ``op``'s connection in SQLAlchemy's pool (kept with the
    connection between checkouts, cleared when it is closed)."""
    return op.conn.sync_connection.connection.info  # type: ignore[union-attr]


async def _find_sqlite3(op: Operation) -> None:
    """Keep the ``sqlite3`` connection under ``op``'s aiosqlite connection in its
    pool ``info`` (aiosqlite's ``Cursor.connection``), once per connection."""
    async with op.driver.cursor() as cursor:
        _pool_info(op)[_SQLITE3] = cursor.connection


def _sqlite3_of(op: Operation) -> sqlite3.Connection:
    """The ``sqlite3`` connection of a held connection (see :func:`_find_sqlite3`)."""
    return cast(sqlite3.Connection, _pool_info(op)[_SQLITE3])


async def _settled(call: asyncio.Future[Any]) -> None:
    """Wait until ``call`` has ended, however often the waiter is cancelled
    meanwhile: its connection is touched again only once the thread running it
    has let go of it."""
    while not call.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({call})


class _Abandoned(Exception):
    """The caller of an operation was cancelled before it committed: roll back."""


def _call_failure(call: asyncio.Future[Any]) -> BaseException:
    """What a cancelled caller's call into the database thread (ended) left its
    connection with, for :meth:`SqlClient._failed`: its driver failure or a
    clean end (:class:`_Abandoned`)."""
    if call.cancelled():  # never started
        return _Abandoned()
    failure = call.exception()
    if isinstance(failure, _CommitFailed):
        failure = failure.error
    return failure if failure is not None and is_driver_failure(failure) else _Abandoned()


def _in_thread(
    op: Operation,
    write: bool,
    begin: bool,
    body: Callable[[Operation], Awaitable[T]],
    held: HeldWarnings,
    abandoned: threading.Event,
) -> T:
    """One operation around ``body``, run in the database thread (see
    :meth:`SqlClient.run_write`): its warnings are kept in ``held``; once
    ``abandoned`` is set (its caller was cancelled) it is not begun, and a
    write not yet committing is rolled back."""
    if abandoned.is_set():
        raise _Abandoned
    with holding_warnings(held):
        return run_sync(_transaction(op, write, begin, body, abandoned))


async def _transaction(
    op: Operation,
    write: bool,
    begin: bool,
    body: Callable[[Operation], Awaitable[T]],
    abandoned: threading.Event,
) -> T:
    if write:
        await op.run_text("BEGIN IMMEDIATE")  # may wait up to busy_timeout
    elif begin:
        await op.run_text("BEGIN")
    try:
        result = await body(op)
        if abandoned.is_set():
            raise _Abandoned
    except BaseException:
        with contextlib.suppress(Exception):
            await op.rollback()
        raise
    if not write:
        await op.rollback()  # ends the snapshot
        return result
    try:
        await op.commit()
    except Exception as exc:
        raise _CommitFailed(exc) from exc
    return result


class _Prepared:
    """A Core statement compiled for one dialect (``statement.compile``), and what
    binding its values and reading its rows need, from SQLAlchemy's public API."""

    __slots__ = (
        "compiled",
        "expands",
        "keys",
        "lastrowid_key",
        "positions",
        "processors",
        "row_processors",
    )

    @classmethod
    def make(cls, statement: Any, dialect: Any, keys: list[str], many: bool) -> _Prepared | None:
        """The prepared form, or ``None`` for what :class:`CoreConnection` leaves
        to SQLAlchemy."""
        from sqlalchemy.sql import ClauseElement

        if not isinstance(statement, ClauseElement):
            return None
        statement = cast(Any, statement)
        compiled: Any = statement.compile(dialect=dialect, column_keys=keys, for_executemany=many)
        dml = compiled.isinsert or compiled.isupdate or compiled.isdelete
        # A query is a statement with selected columns (not text).
        columns = None if dml else getattr(statement, "selected_columns", None)
        if (
            not compiled.positional
            or (not dml and columns is None)
            or compiled.effective_returning
            or compiled.insert_prefetch
            or compiled.update_prefetch
            or compiled.schema_translate_map
        ):
            return None
        prepared = cls(compiled, dialect, [] if columns is None else list(columns))
        if compiled.isinsert and statement.table.autoincrement_column is not None:
            # The key comes back as the driver's lastrowid, as SQLAlchemy takes it;
            # a key given in the statement or one of several columns: SQLAlchemy.
            if not compiled.postfetch_lastrowid or len(statement.table.primary_key) != 1:
                return None
            prepared.lastrowid_key = True
        return prepared

    def __init__(self, compiled: Any, dialect: Any, columns: list[Any]) -> None:
        self.compiled = compiled
        self.lastrowid_key = False
        self.expands = bool(compiled.literal_execute_params or compiled.post_compile_params)
        self.positions: tuple[str, ...] = tuple(compiled.positiontup or ())
        processors = {
            name: bind.type.dialect_impl(dialect).bind_processor(dialect)
            for name, bind in compiled.binds.items()
        }
        self.processors: Mapping[str, Any] = {n: p for n, p in processors.items() if p}
        self.keys: list[str] | None = [c.key for c in columns] if columns else None
        results = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
        self.row_processors: tuple[tuple[int, Any], ...] = tuple(
            (i, process) for i, process in enumerate(results) if process is not None
        )


class CoreResult:
    """The result of a Core statement run on the driver: its rows (SQLAlchemy
    ``Row`` objects, by position, name and attribute; or :meth:`value_rows`),
    ``rowcount`` and, for an insert into a table keyed by an auto-increment
    column, ``inserted_primary_key``."""

    __slots__ = ("_prepared", "_result", "_rows", "inserted_primary_key", "rowcount")

    def __init__(
        self,
        rows: list[Any] | None,
        rowcount: int,
        inserted_primary_key: tuple[Any, ...] | None = None,
        prepared: _Prepared | None = None,
    ) -> None:
        self._rows = rows
        self._prepared = prepared
        self._result: Any = None
        self.rowcount = rowcount
        self.inserted_primary_key = inserted_primary_key

    def value_rows(self) -> list[Any]:
        """The rows as sequences of their values (the columns' result processors
        applied), without building SQLAlchemy ``Row`` objects: for a caller that
        reads rows by position (see :func:`value_rows`)."""
        rows = self._rows or []
        prepared = self._prepared
        if prepared is None or not prepared.row_processors:
            return rows
        processors = prepared.row_processors
        out = []
        for row in rows:
            values = list(row)
            for i, process in processors:
                values[i] = process(values[i])
            out.append(values)
        return out

    def _rows_result(self, name: str) -> Any:
        if self._result is None:
            if self._prepared is None or self._prepared.keys is None:
                raise AttributeError(f"the result of a statement without rows has no {name!r}")
            from sqlalchemy.engine import IteratorResult
            from sqlalchemy.engine.result import SimpleResultMetaData

            rows = [tuple(row) for row in self.value_rows()]
            self._result = IteratorResult(SimpleResultMetaData(self._prepared.keys), iter(rows))
        return self._result

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows_result("__iter__"))

    def __getattr__(self, name: str) -> Any:
        # first(), one(), all(), scalar(), scalar_one(), ... of SQLAlchemy's Result.
        return getattr(self._rows_result(name), name)


def value_rows(result: Any) -> Iterable[Any]:
    """The rows of ``result`` (a :class:`CoreResult` or SQLAlchemy's result) by
    position: plain sequences from a :class:`CoreResult`, SQLAlchemy's ``Row``
    objects otherwise."""
    if isinstance(result, CoreResult):
        return result.value_rows()
    return cast(Iterable[Any], result)


class CoreConnection:
    """The connection of one runtime-store operation on SQLite engines the client made.

    ``execute(statement)`` of a SQLAlchemy Core statement compiles it once per
    shape (SQLAlchemy's cache key), binds its values with SQLAlchemy's
    processors and runs it on the driver connection in one trip, inside the
    operation's transaction; its rows come back as SQLAlchemy ``Row`` objects
    with the columns' result processors applied. What this does not cover
    (``RETURNING``, Python-side column defaults, an insert that gives an
    auto-increment key or inserts several rows with one, text, a statement
    without a cache key) runs through SQLAlchemy's connection, in the same
    transaction. Everything else is the ``AsyncConnection``'s.
    """

    __slots__ = ("_cache", "_op")

    def __init__(self, op: Operation, cache: MutableMapping[Any, Any]) -> None:
        self._op = op
        self._cache = cache

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._op.conn, name)
        if self._op.inline and inspect.iscoroutinefunction(found):
            raise RuntimeError(
                f"AsyncConnection.{name} needs SQLAlchemy's execution layer, which cannot "
                "run in the database thread"
            )
        return found

    async def rollback(self) -> None:
        """Roll the operation's transaction back (nothing it wrote is applied)."""
        await self._op.rollback()

    def _prepare(
        self, statement: Any, given: Sequence[Mapping[str, Any]]
    ) -> tuple[_Prepared, list[dict[str, Any]]] | None:
        """The statement's compiled form (compiled once per statement object and
        set of parameter names; the client keeps it while the statement lives)
        and its parameter values for each mapping of ``given`` (over the bound
        ones; one set when ``given`` is empty), or ``None`` when SQLAlchemy
        runs it."""
        many = len(given) > 1
        keys = tuple(sorted(given[0])) if given else ()
        try:
            shapes = self._cache.get(statement)
        except TypeError:  # not weakly referable: not a Core statement
            return None
        if shapes is None:
            shapes = self._cache[statement] = {}
        shape = (keys, many)
        if shape in shapes:
            prepared = shapes[shape]
        else:
            prepared = shapes[shape] = _Prepared.make(statement, self._op.dialect, list(keys), many)
        if prepared is None or (
            many and (prepared.expands or prepared.keys is not None or prepared.lastrowid_key)
        ):
            return None
        compiled = prepared.compiled
        sets = [
            compiled.construct_params(p, escape_names=False)
            for p in given or [None]  # type: ignore[list-item]
        ]
        return prepared, sets

    async def execute(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        """Run ``statement`` with no parameters, one mapping of them, or a list of
        mappings (``executemany``) on the driver (see the class)."""
        prepared = None
        if not options:
            if parameters is None:
                prepared = self._prepare(statement, [])
            elif isinstance(parameters, Mapping):
                prepared = self._prepare(statement, [parameters])
            elif isinstance(parameters, list) and parameters:
                prepared = self._prepare(statement, parameters)
        if prepared is None:
            if self._op.inline:  # SQLAlchemy's asyncio layer waits on the event loop
                raise RuntimeError(
                    f"{type(statement).__name__} needs SQLAlchemy's execution layer, which "
                    "cannot run in the database thread"
                )
            return await self._op.conn.execute(statement, parameters, **options)
        entry, sets = prepared
        compiled = entry.compiled
        processors = entry.processors
        positions = entry.positions
        op = self._op
        if len(sets) > 1:
            text = compiled.string
            rows = [
                [processors[name](p[name]) if name in processors else p[name] for name in positions]
                for p in sets
            ]
            if op._events is not None:
                op._announce(text, rows, True)
            cursor = await op.driver.executemany(text, rows)
            return CoreResult(None, cursor.rowcount)
        params = sets[0]
        text = compiled.string
        if entry.expands:
            expanded = compiled.construct_expanded_state(params, escape_names=False)
            text = expanded.statement
            positions = expanded.positiontup
            params = expanded.parameters
            processors = {**processors, **expanded.processors}
        args = [
            processors[name](params[name]) if name in processors else params[name]
            for name in positions
        ]
        if op._events is not None:
            op._announce(text, args, False)
        if entry.keys is None:
            cursor = await op.driver.execute(text, args)
            key = (cursor.lastrowid,) if entry.lastrowid_key else None
            return CoreResult(None, cursor.rowcount, key)
        rows = await op.driver.execute_fetchall(text, args)
        return CoreResult(rows, -1, None, entry)


def is_unique_violation(exc: BaseException) -> bool:
    """Whether ``exc`` (raw or wrapped by SQLAlchemy) is a constraint violation."""
    import sqlite3

    from sqlalchemy.exc import IntegrityError

    if isinstance(exc, IntegrityError | sqlite3.IntegrityError):
        return True
    return type(exc).__name__ == "IntegrityError" and type(exc).__module__.startswith(
        ("asyncmy", "pymysql", "aiomysql")
    )


def _check_engine(engine: object) -> None:
    """An application's engine must be a SQLAlchemy ``AsyncEngine`` of a driver this
    backend speaks."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    if not isinstance(engine, AsyncEngine):
        raise ThreadStoreConfigurationError(
            f"option client must be {_ACCEPTED_CLIENTS}, not {type(engine).__qualname__}"
        )
    name, driver = engine.dialect.name, engine.dialect.driver
    if (name, driver) not in (
        ("sqlite", "aiosqlite"),
        ("mysql", "asyncmy"),
        ("mysql", "aiomysql"),
        ("mariadb", "asyncmy"),
        ("mariadb", "aiomysql"),
    ):
        raise ThreadStoreConfigurationError(
            f"option client must be {_ACCEPTED_CLIENTS}, not an engine for {name}+{driver}"
        )


def _check_int(name: str, value: object, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ThreadStoreConfigurationError(f"option {name} must be an integer >= {minimum}")


def _check_seconds(name: str, value: object) -> None:
    if type(value) not in (int, float) or not 0 < cast(float, value) < 86_400:
        raise ThreadStoreConfigurationError(f"option {name} must be a number of seconds > 0")
