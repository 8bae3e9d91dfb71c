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
  disposes of the engines.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from pai_storage import StorageError, ThreadStoreConfigurationError
from pai_storage.backend import SharedClient, StoreURL, make_url
from pai_storage.shared import closed_error

from .errors import Phase, RetryableError, is_driver_exception, is_driver_failure, map_error
from .schema import DEFAULT_PREFIX, SCHEMA_VERSION, Tables, prepare_schema

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["CLIENT_OPTIONS", "Dialect", "Engines", "SqlClient"]

T = TypeVar("T")

Dialect = Literal["sqlite", "mysql"]

CLIENT_OPTIONS = frozenset(
    {"table_prefix", "busy_timeout", "pool_size", "connect_timeout", "retry_attempts"}
)
"""The options that shape a :class:`SqlClient` (every SQL store takes them)."""

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
    table_prefix:
        Base name of the thread tables (default ``"pai_threads"``); the
        runtime tables use ``pai_`` under the default and ``<prefix>_`` otherwise.
    busy_timeout:
        SQLite: seconds a writer waits for another connection's write lock
        before failing with ``UnavailableError`` (default 5).
    pool_size:
        SQLite: reader connections (default 4); MySQL: pooled connections
        (default 10).
    connect_timeout:
        MySQL: seconds to wait for a connection (default 10).
    retry_attempts:
        Attempts of a write that hits a deadlock or lock wait timeout (default 3).
    """

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        table_prefix: str = DEFAULT_PREFIX,
        busy_timeout: float = 5.0,
        pool_size: int | None = None,
        connect_timeout: float = 10.0,
        retry_attempts: int = 3,
    ) -> None:
        if url is None:
            raise ThreadStoreConfigurationError(
                "a SQL store needs a sqlite:// or mysql:// URL (e.g. sqlite:///pai.db)"
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
        if importlib.util.find_spec(self.driver) is None:
            extra = "sql" if self.dialect == "sqlite" else "mysql"
            hint = "aiomysql" if self.driver == "aiomysql" else f"'pai-storage[{extra}]'"
            raise ThreadStoreConfigurationError(
                f"the {self.url.full_scheme}:// URL needs the {self.driver} driver: "
                f"pip install {hint}"
            )
        _check_seconds("busy_timeout", busy_timeout)
        _check_seconds("connect_timeout", connect_timeout)
        if pool_size is None:
            pool_size = 4 if self.dialect == "sqlite" else 10
        _check_int("pool_size", pool_size, 1)
        _check_int("retry_attempts", retry_attempts, 1)
        self.busy_timeout = float(busy_timeout)
        self.pool_size = pool_size
        self.connect_timeout = float(connect_timeout)
        self.retry_attempts = retry_attempts
        self.memory = self.dialect == "sqlite" and self._sqlite_path() == ":memory:"
        self.tables: Tables = Tables.define(table_prefix)
        """Every table (thread tables and ``tables.runtime``) on one metadata."""
        self.server_version: str | None = None
        """``"SQLite 3.x"`` or ``"MariaDB 10.11.x"`` / ``"MySQL 8.x"`` once connected."""
        self.is_mariadb = False
        self.max_packet: int | None = None
        """MySQL: the server's ``max_allowed_packet`` (bytes one statement may carry)."""
        super().__init__(owned=True)

    @classmethod
    def attached(
        cls, url: str | StoreURL | None, client: object = None, **options: Any
    ) -> SqlClient:
        """The client a store uses, counted as one more user of it.

        ``client`` is a shared :class:`SqlClient` (then no client option may be
        given: the client already has them) or ``None`` for a new client from
        ``url``; options given as ``None`` take their defaults.
        """
        given = {k: v for k, v in options.items() if v is not None}
        if client is not None:
            if not isinstance(client, SqlClient):
                raise ThreadStoreConfigurationError(
                    f"option client must be a pai_storage_sql SqlClient, not "
                    f"{type(client).__qualname__}"
                )
            if given:
                raise ThreadStoreConfigurationError(
                    f"option(s) {', '.join(sorted(given))} cannot be combined with a shared "
                    "client; give them where the client is made"
                )
            client.attach()
            return client
        made = cls(url, **given)
        made.attach()
        return made

    def __repr__(self) -> str:
        return f"SqlClient({str(self.url)!r}, table_prefix={self.tables.prefix!r})"

    # ------------------------------------------------------------ engines

    async def ready(self) -> Engines:
        """The engines, connected and with the schema ready (on first call: connect, prepare)."""
        return await self._ready()

    def _sqlite_path(self) -> str:
        path = self.url.path
        if path in ("", "/", "/:memory:"):
            return ":memory:"
        return path[1:]  # sqlite:///rel.db -> rel.db; sqlite:////abs.db -> /abs.db

    def _make(self) -> Engines:
        from sqlalchemy import event
        from sqlalchemy.engine import URL
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import StaticPool

        query = dict(self.url.query)
        if self.dialect == "sqlite":
            path = self._sqlite_path()
            sa_url = URL.create("sqlite+aiosqlite", database=path, query=query)
            connect_args = {"timeout": self.busy_timeout}
            if self.memory:
                engine = create_async_engine(
                    sa_url,
                    poolclass=StaticPool,
                    connect_args={**connect_args, "check_same_thread": False},
                )
                self._sqlite_hooks(engine, event)
                return Engines(engine, engine, asyncio.Lock())
            # Each operation ends its own transaction (commit, or rollback on
            # close), so the pool's own rollback on return would only repeat it.
            writer = create_async_engine(
                sa_url,
                pool_size=1,
                max_overflow=0,
                pool_timeout=None,
                pool_reset_on_return=None,
                connect_args=connect_args,
            )
            reader = create_async_engine(
                sa_url,
                pool_size=self.pool_size,
                max_overflow=0,
                pool_timeout=None,
                pool_reset_on_return=None,
                connect_args=connect_args,
            )
            self._sqlite_hooks(writer, event)
            self._sqlite_hooks(reader, event)
            return Engines(writer, reader, None)
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
        return Engines(engine, engine, None)

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
        with self.errors("connect"):
            async with made.writer.connect() as conn:
                self.server_version, self.is_mariadb = await prepare_schema(
                    conn, self.dialect, self.tables
                )
                if self.dialect == "mysql":
                    packet = await conn.exec_driver_sql("SELECT @@global.max_allowed_packet")
                    self.max_packet = int(packet.scalar_one())
                    await conn.rollback()

    async def _disconnect(self, made: Engines, *, failed: bool) -> None:
        for engine in {id(made.writer): made.writer, id(made.reader): made.reader}.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.dispose(), timeout=10)

    # ------------------------------------------------------------ operations

    @contextlib.contextmanager
    def errors(self, phase: Phase) -> Iterator[None]:
        """Map every driver exception of the block to the contract's errors.

        Exceptions that do not come from the driver or the connection (the
        store's own, a conflict signal, a bug) pass through unchanged.
        """
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:
            if not is_driver_exception(exc):
                raise
            raise map_error(exc, phase, self.url) from exc

    @contextlib.asynccontextmanager
    async def _lock(self, engines: Engines) -> AsyncIterator[None]:
        if engines.lock is None:
            yield
            return
        async with engines.lock:
            yield

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
        engines = await self._ready()
        async with self._lock(engines), self._connection(engines.writer) as conn:
            with self.errors("write"):
                if self.dialect == "sqlite":
                    await conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    await conn.begin()
            with self.errors("write"):
                yield conn
            with self.errors("commit"):
                await conn.commit()

    @contextlib.asynccontextmanager
    async def read(self, *, snapshot: bool = True) -> AsyncIterator[AsyncConnection]:
        """One read snapshot, rolled back afterwards.

        SQLite: a reader connection in a deferred ``BEGIN`` (the snapshot
        starts with its first statement). MySQL: ``START TRANSACTION WITH
        CONSISTENT SNAPSHOT, READ ONLY``. ``snapshot=False`` skips the explicit
        transaction for an operation of one statement (which is its own
        snapshot).
        """
        engines = await self._ready()
        async with self._lock(engines), self._connection(engines.reader) as conn:
            if snapshot:
                with self.errors("read"):
                    if self.dialect == "sqlite":
                        await conn.exec_driver_sql("BEGIN")
                    else:
                        await conn.exec_driver_sql(
                            "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"
                        )
            with self.errors("read"):
                yield conn

    @contextlib.asynccontextmanager
    async def _connection(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        """A pooled connection for one operation; rolled back and returned afterwards,
        or invalidated (closed, never reused) when its state is unknown."""
        if self.closed:
            raise closed_error()
        with self.errors("connect"):
            conn = await engine.connect()
        try:
            yield conn
        except BaseException as exc:
            if not isinstance(exc, Exception) or (
                is_driver_failure(exc) and not isinstance(exc, RetryableError)
            ):
                # Cancelled mid-way or the driver failed: the state is unknown.
                with contextlib.suppress(BaseException):
                    await conn.invalidate()
            else:
                with contextlib.suppress(Exception):
                    await conn.rollback()
            raise
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

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


def _check_int(name: str, value: object, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ThreadStoreConfigurationError(f"option {name} must be an integer >= {minimum}")


def _check_seconds(name: str, value: object) -> None:
    if type(value) not in (int, float) or not 0 < cast(float, value) < 86_400:
        raise ThreadStoreConfigurationError(f"option {name} must be a number of seconds > 0")
