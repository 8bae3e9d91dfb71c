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

SQLite (``sqlite:///path/file.db``, driver aiosqlite): the file turned to
the WAL journal on connect, ``busy_timeout``, ``foreign_keys=ON``; one writer
connection whose transactions start with ``BEGIN IMMEDIATE`` (so writers of several processes
queue on the database lock instead of failing at commit) and a small pool of
reader connections, each read one deferred ``BEGIN`` snapshot. A
``sqlite:///:memory:`` database lives on one connection that reads and writes
take in turn.

MySQL / MariaDB (``mysql://``, ``mariadb://``; driver asyncmy, ``+aiomysql``
accepted): one pool; writes are ``REPEATABLE READ`` transactions that hold
rows with ``SELECT ... FOR UPDATE``; reads are ``START TRANSACTION WITH
CONSISTENT SNAPSHOT, READ ONLY``.

Invariants kept here: every operation is one transaction on a connection of
its own, ended (committed, or rolled back) before the connection is used
again; a connection whose state is unknown (cancelled mid-way, or the driver
failed) is invalidated, never reused; every driver exception of an operation
is mapped (phase ``connect``, ``write``/``read``, ``commit``).

The client's parts, each in a module named for its job: the engines per
dialect (:mod:`.engines`), the connections it keeps checked out
(:mod:`.held`), an operation and its precompiled statements
(:mod:`.operation`), the runtime stores' Core statements on the driver
(:mod:`.core_connection`), a SQLite operation run whole in the database
thread (:mod:`.sqlite_thread`), and the mapping of a block's driver errors
(:mod:`.error_scope`). The names other modules import from here stay
importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pai_storage.backend import (
    HeldWarnings,
    SharedClient,
    StoreURL,
    deliver_held_warnings,
    make_url,
)
from pai_storage.errors import ThreadStoreConfigurationError
from pai_storage.shared import closed_error

from . import sqlite_thread

# The names below were all defined here once; the modules named for their
# jobs hold them now, and this module re-exports them for its importers.
from .core_connection import CoreConnection, CoreResult, value_rows
from .engines import (
    MYSQL_SCHEMES,
    SQLITE_SCHEMES,
    Dialect,
    Engines,
    check_engine,
    check_given_mysql,
    check_int,
    check_seconds,
    given_engines,
    mysql_engines,
    sqlite_engines,
    turn_to_wal,
)
from .error_scope import MappedErrors, is_unique_violation, mapped_error
from .errors import Phase, RetryableError, is_driver_failure
from .held import Held
from .operation import Operation, Statement
from .schema import DEFAULT_PREFIX, SCHEMA_VERSION, Tables, prepare_schema
from .sqlite_thread import (
    BUSY_KEY,
    SQLITE3_KEY,
    Busy,
    CommitFailed,
    InlineDriver,
    call_failure,
    find_sqlite3,
    pool_info,
    settled,
    sqlite3_of,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = [
    "CLIENT_OPTIONS",
    "CoreConnection",
    "CoreResult",
    "Dialect",
    "Engines",
    "Held",
    "InlineDriver",
    "Operation",
    "SqlClient",
    "Statement",
    "is_unique_violation",
    "value_rows",
]

T = TypeVar("T")

CLIENT_OPTIONS = frozenset(
    {"table_prefix", "names", "busy_timeout", "pool_size", "connect_timeout", "retry_attempts"}
)
"""The options that shape a :class:`SqlClient` (every SQL store takes them)."""

_ENGINE_OPTIONS = ("pool_size", "connect_timeout")
"""Options of the engines a client makes (an application's engine keeps its own)."""

_STORES = object()
"""Marks a client made by a store or ``connect()`` (closed by its last store)."""


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
        before failing with ``UnavailableError`` (default 5); the turn of the
        file to WAL when the client connects is retried as long.
    pool_size:
        SQLite: reader connections (default 4); MySQL: pooled connections
        (default 10). Not with ``engine``.
    connect_timeout:
        MySQL: seconds to wait for a new connection, greeting and login
        included (default 10). Not with ``engine``.
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
            check_engine(engine)
            # The engine says which database it is; its password stays out of messages.
            url = url or engine.url.render_as_string(hide_password=True)
        if url is None:
            raise ThreadStoreConfigurationError(
                "a SQL store needs a sqlite:// or mysql:// URL (e.g. sqlite:///pai.db) "
                "or client= an AsyncEngine"
            )
        self.url: StoreURL = make_url(url)
        scheme, driver = self.url.scheme, self.url.driver
        if scheme in SQLITE_SCHEMES and driver in (None, *SQLITE_SCHEMES[scheme]):
            self.dialect: Dialect = "sqlite"
        elif scheme in MYSQL_SCHEMES and driver in (None, *MYSQL_SCHEMES[scheme]):
            self.dialect = "mysql"
        else:
            raise ThreadStoreConfigurationError(
                "the sql backend serves sqlite://, sqlite+aiosqlite://, mysql://, mariadb:// "
                f"(+asyncmy or +aiomysql) URLs, not {self.url.full_scheme}://"
            )
        self.driver = driver or ("aiosqlite" if self.dialect == "sqlite" else "asyncmy")
        if self.dialect == "sqlite" and self.url.query and engine is None:
            given = ", ".join(sorted({name for name, _ in self.url.query}))
            raise ThreadStoreConfigurationError(
                f"a sqlite:// URL takes no query parameters (given: {given}); store "
                "options are keyword arguments, e.g. open_store(url, busy_timeout=10)"
            )
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
            check_seconds("busy_timeout", busy_timeout)
        check_seconds("connect_timeout", connect_timeout)
        if pool_size is None:
            pool_size = 4 if self.dialect == "sqlite" else 10
        check_int("pool_size", pool_size, 1)
        check_int("retry_attempts", retry_attempts, 1)
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
        return cls.shared_or_made(client, given, lambda **o: cls._new_shared(url, client, o))

    @classmethod
    def _new_shared(
        cls, url: str | StoreURL | None, client: object, given: dict[str, Any]
    ) -> SqlClient:
        """A new client for :meth:`shared`: over the application's engine, or new engines."""
        if client is not None:
            check_engine(client)
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
        if self._engine is not None:
            busy = self.busy_timeout if self._busy_given else None
            return given_engines(self._engine, self.dialect, memory=self.memory, busy_timeout=busy)
        if self.dialect == "sqlite":
            return sqlite_engines(
                self._sqlite_path(),
                memory=self.memory,
                busy_timeout=self.busy_timeout,
                pool_size=self.pool_size,
            )
        return mysql_engines(
            self.url, self.driver, pool_size=self.pool_size, connect_timeout=self.connect_timeout
        )

    async def _connect(self, made: Engines) -> None:
        if self._engine is not None and self.dialect == "mysql":
            await check_given_mysql(made, self.errors)
        with self.errors("connect"):
            async with made.writer.connect() as conn:
                if self.dialect == "sqlite" and self._engine is None and not self.memory:
                    await turn_to_wal(conn, self.busy_timeout)
                self.server_version, self.is_mariadb = await prepare_schema(
                    conn, self.dialect, self.tables
                )
                if self.dialect == "mysql":
                    packet = await conn.exec_driver_sql("SELECT @@global.max_allowed_packet")
                    self.max_packet = int(packet.scalar_one())
                    await conn.rollback()

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
        return MappedErrors(phase, self.url)

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

    @property
    def _busy_ms(self) -> int:
        return int(self.busy_timeout * 1000)

    async def _begin(self, op: Operation, write: bool, begin: bool) -> None:
        if op.held is not None and BUSY_KEY in pool_info(op):
            # A held reader, statement by statement in aiosqlite's thread: it
            # may wait for a lock there (_checkin sets 0 again).
            await op.driver.execute_fetchall(f"PRAGMA busy_timeout={self._busy_ms}", ())
            pool_info(op)[BUSY_KEY] = self._busy_ms
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
    ) -> T:
        """``await body(op)`` in one read snapshot (see :meth:`read`).

        On SQLite engines the client made, the whole read (``BEGIN``, ``body``'s
        statements, ``ROLLBACK``) runs as one call on the event loop, on a
        reader connection's ``sqlite3`` connection, under the rules of
        :meth:`run_write`'s ``body``. It never waits for a lock there (a held
        reader's ``busy_timeout`` is 0 between operations): a read that finds
        the database locked (SQLite recovering its write-ahead log, or another
        connection in exclusive locking mode) is rolled back and runs again in
        a thread of the client's executor, waiting up to ``busy_timeout``.
        Elsewhere it runs in :meth:`read`.
        """
        return await self._run(False, snapshot, body)

    async def _run(self, write: bool, begin: bool, body: Callable[[Operation], Awaitable[T]]) -> T:
        engines = self._made
        if engines is None or self._closed:
            engines = await self._ready()
        executor = engines.executor
        if executor is None:
            async with self._operation(write, begin) as op:
                return await body(op)
        held: HeldWarnings = []
        lock = engines.lock
        if lock is not None:
            await lock.acquire()
        try:
            op = await self._checkout(engines, write)
            inline = Operation(op.conn, InlineDriver(sqlite3_of(op)), True, op.held)
            busy_ms = None
            if not write:
                try:
                    with self.errors("read"):
                        result: T = sqlite_thread.at_once(inline, begin, body, held)
                except Busy:
                    held.clear()  # rolled back: the read runs again in the thread
                    busy_ms = self._busy_ms
                except BaseException as exc:
                    await self._failed(op, exc)
                    raise
                else:
                    await self._checkin(op, reuse=True)
                    return result
            # The connection is this operation's: its aiosqlite thread is idle
            # while a thread of the executor runs the whole operation on it.
            abandoned = threading.Event()
            call = asyncio.get_running_loop().run_in_executor(
                executor,
                sqlite_thread.in_thread,
                inline,
                write,
                begin,
                body,
                held,
                abandoned,
                busy_ms,
            )
            try:
                try:
                    with self.errors("write" if write else "read"):
                        result = await asyncio.shield(call)
                except CommitFailed as failed:
                    with self.errors("commit"):
                        raise failed.error from None
            except asyncio.CancelledError:
                # The call ends its own transaction there (rolled back unless it
                # was committing): once it has, the connection is clean and kept
                # (closing the only connection of an in-memory database would
                # lose the database).
                abandoned.set()
                await settled(call)
                await self._failed(op, call_failure(call))
                raise
            except BaseException as exc:
                await self._failed(op, exc)
                raise
            await self._checkin(op, reuse=True)
            return result
        finally:
            if lock is not None:
                lock.release()
            if held:
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
        if held is not None and SQLITE3_KEY not in pool_info(op):
            try:
                with self.errors("connect"):
                    await find_sqlite3(op, reader=held is not engines.held_writer)
            except BaseException as exc:
                await self._failed(op, exc)
                raise
        return op

    async def _checkin(self, op: Operation, *, reuse: bool) -> None:
        """Keep a held connection for the next operation (a held reader's
        ``busy_timeout`` 0 again, :data:`~.sqlite_thread.BUSY_KEY`), or return it
        to the pool."""
        held = op.held
        if held is not None and reuse and not self._closed:
            if pool_info(op).get(BUSY_KEY):
                try:
                    await op.driver.execute_fetchall("PRAGMA busy_timeout=0", ())
                except Exception:
                    await self._checkin(op, reuse=False)
                    return
                pool_info(op)[BUSY_KEY] = 0
            held.give(op.conn)
            return
        try:
            with contextlib.suppress(Exception):
                # The pool's reset (a rollback, on MySQL) runs to its end even
                # when the caller is cancelled meanwhile: cut short, the pool
                # would log it as an error.
                await asyncio.shield(op.conn.close())
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
                failure = mapped_error(exc, self._phase, client.url)
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
