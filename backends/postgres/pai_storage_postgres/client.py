"""The one asyncpg pool every PostgreSQL store of a ``connect()`` call shares.

:class:`PgClient` owns (or borrows) the pool, creates or migrates the schema
once, and counts the stores using it:

- a store takes its client in its constructor with :meth:`PgClient.attached`
  (a new client from the URL and options, an application's own
  ``asyncpg.Pool`` wrapped, or a shared :class:`PgClient` given by the
  backend's opener), which counts it as a user;
- ``await client.pool()`` connects on first call and prepares the schema;
  concurrent callers share one attempt, a cancelled caller does not cancel it,
  and a failed attempt is forgotten so the next call retries;
- a store calls ``await client.release()`` from its ``_close``; when the last
  user has released it the client closes the pool it created (a pool given by
  the application is never closed) and cancels a connection attempt still
  running, terminating whatever it opened;
- ``with client.errors(phase):`` maps every driver exception of a block to the
  contract's errors; ``async with client.connection() as conn:`` is one pooled
  connection for one operation (terminated rather than reused when the
  operation was cancelled mid-way).

The counting, the shared connect and the close are
:class:`pai_storage.backend.SharedClient`'s; this module supplies only what
touches PostgreSQL: creating, preparing and closing the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from pai_storage.backend import SharedClient, StoreURL, make_url
from pai_storage.errors import StorageError, ThreadStoreConfigurationError, ThreadStoreError
from pai_storage.shared import closed_error

from .errors import Phase, general_error, map_error
from .schema import (
    DEFAULT_PREFIX,
    SCHEMA_VERSION,
    Tables,
    all_ddl,
    validate_identifier,
    validate_names,
)

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

__all__ = ["POOL_OPTIONS", "SESSION_SETTINGS", "PgClient", "keep_session"]

SESSION_SETTINGS = {
    "enable_sort": "off",
    "enable_incremental_sort": "off",
    "enable_hashjoin": "off",
    "enable_mergejoin": "off",
}
"""Set on every connection of a pool the client creates.

Each statement of these stores has an index that delivers its rows in order,
or probes one key at a time. With generic plans the planner assumes an average
thread, session or namespace (a handful of rows) and would rather collect a
whole group and sort or hash it, which costs O(group) instead of O(page).
These settings only price those plans out; nothing becomes impossible."""

POOL_OPTIONS = frozenset(
    {
        "table_prefix",
        "schema",
        "names",
        "min_pool_size",
        "max_pool_size",
        "connect_timeout",
        "command_timeout",
        "statement_cache_size",
    }
)
"""The options that shape a :class:`PgClient` (every PostgreSQL store takes them)."""


async def keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to undo.

    asyncpg still rolls back an open transaction on release; its default reset
    (``RESET ALL``, ``UNLISTEN *``, ...) would cost one more round trip per
    operation for session state these stores never create.
    """


class PgClient(SharedClient["asyncpg.Pool"]):
    """One asyncpg pool, the schema it serves, and the stores that share it.

    The users, the shared lazy connect and the close are
    :class:`~pai_storage.backend.SharedClient`'s; this class creates, prepares
    and closes the pool.

    Parameters
    ----------
    url:
        ``postgresql://user:password@host:port/database`` (also ``postgres://``
        and ``postgresql+asyncpg://``); query parameters go to asyncpg.
    pool:
        An application's own ``asyncpg.Pool`` to use instead of creating one;
        pai-storage never closes it (and sets no session settings on it).
    table_prefix, schema, names:
        Where the tables live (:class:`~pai_storage_postgres.schema.Tables`).
    min_pool_size, max_pool_size, connect_timeout, command_timeout, statement_cache_size:
        Settings of the pool the client creates (ignored parts of a given pool).
    """

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        table_prefix: str = DEFAULT_PREFIX,
        schema: str | None = None,
        names: Mapping[str, str] | None = None,
        min_pool_size: int = 1,
        max_pool_size: int = 10,
        connect_timeout: float = 10.0,
        command_timeout: float | None = None,
        statement_cache_size: int = 100,
    ) -> None:
        if pool is not None:
            _check_pool(pool)
        if url is None:
            if pool is None:
                raise ThreadStoreConfigurationError(
                    "a PostgreSQL store needs a postgresql:// URL or client= an asyncpg.Pool"
                )
            url = "postgresql://"
        self.url: StoreURL = make_url(url)
        if self.url.scheme not in ("postgresql", "postgres") or self.url.driver not in (
            None,
            "asyncpg",
        ):
            raise ThreadStoreConfigurationError(
                f"the postgres backend serves postgresql://, postgres:// and "
                f"postgresql+asyncpg:// URLs, not {self.url.full_scheme}://"
            )
        validate_identifier("table_prefix", table_prefix)
        if schema is not None:
            validate_identifier("schema", schema)
        _check_int("min_pool_size", min_pool_size, 0)
        _check_int("max_pool_size", max_pool_size, 1)
        if min_pool_size > max_pool_size:
            raise ThreadStoreConfigurationError("min_pool_size must not exceed max_pool_size")
        _check_seconds("connect_timeout", connect_timeout)
        if command_timeout is not None:
            _check_seconds("command_timeout", command_timeout)
        _check_int("statement_cache_size", statement_cache_size, 0)
        self.tables: Tables = Tables(table_prefix, schema, validate_names(names))
        super().__init__(owned=pool is None)
        self.server_version: str | None = None
        """``"PostgreSQL <version>"`` once connected."""
        self._pool_options: dict[str, Any] = {
            "min_size": min_pool_size,
            "max_size": max_pool_size,
            "timeout": connect_timeout,
            "command_timeout": command_timeout,
            "statement_cache_size": statement_cache_size,
            "server_settings": dict(SESSION_SETTINGS),
            "reset": keep_session,
        }
        self._given = pool

    @classmethod
    def attached(
        cls, url: str | StoreURL | None, client: object = None, **options: Any
    ) -> PgClient:
        """The client a store uses, counted as one more user of it.

        ``client`` is a shared :class:`PgClient` (then no pool or table option
        may be given: the client already has them), an application's
        ``asyncpg.Pool``, or ``None`` for a new pool from ``url``.
        """
        given = {k: v for k, v in options.items() if v is not None}
        pool = cast("asyncpg.Pool | None", client)
        holder = cls.shared_or_made(client, given, lambda **o: cls(url, pool=pool, **o))
        holder.attach()
        return holder

    def __repr__(self) -> str:
        return (
            f"PgClient({str(self.url)!r}, table_prefix={self.tables.prefix!r}, "
            f"schema={self.tables.schema!r}, own_pool={self.owns_pool})"
        )

    @property
    def owns_pool(self) -> bool:
        """Whether the client created its pool (and so closes it)."""
        return self._owned

    # ------------------------------------------------------------ the pool

    async def pool(self, *, runtime: bool = False) -> asyncpg.Pool:
        """The pool, connected and with the schema ready (on first call: connect, prepare).

        Concurrent callers share one attempt; a cancelled caller does not
        cancel it; a failed attempt is forgotten so the next call retries.
        ``runtime=True`` (a runtime store): a failure raises the general class.
        """
        if not runtime:
            return await self._ready()
        try:
            return await self._ready()
        except ThreadStoreError as exc:
            raise general_error(exc) from exc

    def _make(self) -> asyncpg.Pool:
        import asyncpg

        if self._given is not None:
            return self._given
        # Built here, connected by _connect: a cancellation while the pool
        # connects still leaves the pool object to terminate.
        return asyncpg.create_pool(self._dsn(), **self._pool_options)

    async def _connect(self, made: asyncpg.Pool) -> None:
        if made is not self._given:
            with self.errors("connect"):
                await made
        await self._prepare(made)

    async def _disconnect(self, made: asyncpg.Pool, *, failed: bool) -> None:
        if failed:
            terminate_pool(made)
            return
        try:
            await asyncio.wait_for(made.close(), timeout=10)
        except BaseException as exc:  # a broken connection, a timeout or a cancelled close
            terminate_pool(made)
            if not isinstance(exc, Exception):
                raise

    def _dsn(self) -> str:
        return self.url.render(hide_password=False, scheme="postgresql")

    def errors(
        self, phase: Phase, *, runtime: bool = False
    ) -> contextlib.AbstractContextManager[None]:
        """Map every driver exception of the block to the contract's errors.

        ``runtime=True`` for a runtime store: the general error classes.
        """
        return _MappedErrors(phase, self.url, runtime)

    def connection(
        self, pool: asyncpg.Pool | None = None, *, runtime: bool = False
    ) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        """A pooled connection for one operation.

        Released afterwards; terminated instead when the operation was
        cancelled (its state is then unknown, and closing must not wait for it).
        """
        return _Lease(self, pool, runtime)

    # ------------------------------------------------------------ schema

    async def _prepare(self, pool: asyncpg.Pool) -> None:
        async with self.connection(pool) as conn:
            with self.errors("connect"):
                await self._prepare_schema(conn)

    async def _prepare_schema(self, conn: asyncpg.Connection) -> None:
        version = conn.get_server_version()
        shown = await conn.fetchval("SHOW server_version")
        self.server_version = f"PostgreSQL {shown}"
        if version.major < 13:
            raise ThreadStoreConfigurationError(
                f"the postgres backend needs PostgreSQL 13 or newer; the server runs "
                f"{self.server_version}"
            )
        stored = await self._schema_version(conn)
        if stored is None or stored < SCHEMA_VERSION:
            async with conn.transaction():
                # Several processes may initialize at once: DDL under one lock.
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                    self.tables.lock_key,
                )
                stored = await self._schema_version(conn)
                if stored is None or stored < SCHEMA_VERSION:
                    # Every statement is idempotent: an older database gets the
                    # tables and indexes it lacks, in this one transaction.
                    for statement in all_ddl(self.tables):
                        await conn.execute(statement)
                    await conn.execute(
                        f"INSERT INTO {self.tables.version_table} (version) VALUES ($1) "
                        "ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version, "
                        "upgraded_at = now()",
                        SCHEMA_VERSION,
                    )
                    stored = SCHEMA_VERSION
        if stored > SCHEMA_VERSION:
            raise ThreadStoreConfigurationError(
                f"the tables {self.tables.threads} use schema version {stored}, newer "
                f"than this pai-storage understands ({SCHEMA_VERSION}); upgrade pai-storage"
            )

    async def _schema_version(self, conn: asyncpg.Connection) -> int | None:
        exists = await conn.fetchval("SELECT to_regclass($1)", self.tables.version_table)
        if exists is None:
            return None
        value = await conn.fetchval(f"SELECT version FROM {self.tables.version_table}")
        return int(value) if value is not None else None


def _check_pool(pool: object) -> None:
    import asyncpg

    if not isinstance(pool, asyncpg.Pool):
        raise ThreadStoreConfigurationError(
            f"option client must be an asyncpg.Pool, not {type(pool).__qualname__}"
        )


def terminate(conn: asyncpg.Connection) -> None:
    """Drop a connection whose state is unknown (it may already be gone)."""
    with contextlib.suppress(Exception):
        if not conn.is_closed():
            conn.terminate()


def terminate_pool(pool: asyncpg.Pool) -> None:
    """Drop every connection of a pool, however far its start or use got."""
    with contextlib.suppress(Exception):
        pool.terminate()


def _check_int(name: str, value: object, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ThreadStoreConfigurationError(f"option {name} must be an integer >= {minimum}")


def _check_seconds(name: str, value: object) -> None:
    if type(value) not in (int, float) or not 0 < cast(float, value) < 86_400:
        raise ThreadStoreConfigurationError(f"option {name} must be a number of seconds > 0")


class _MappedErrors(contextlib.AbstractContextManager[None]):
    """:func:`~pai_storage.backend.map_errors` with :func:`map_error`, as a plain class
    (it wraps every statement: no generator per use)."""

    __slots__ = ("_phase", "_runtime", "_url")

    def __init__(self, phase: Phase, url: StoreURL, runtime: bool) -> None:
        self._phase = phase
        self._url = url
        self._runtime = runtime

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, StorageError):
            return
        raise map_error(exc, self._phase, self._url, runtime=self._runtime) from exc


class _Lease(contextlib.AbstractAsyncContextManager["asyncpg.Connection"]):
    """One pooled connection for one operation (see :meth:`PgClient.connection`)."""

    __slots__ = ("_client", "_conn", "_pool", "_runtime")

    def __init__(self, client: PgClient, pool: asyncpg.Pool | None, runtime: bool) -> None:
        self._client = client
        self._pool = pool
        self._runtime = runtime

    async def __aenter__(self) -> asyncpg.Connection:
        client = self._client
        pool = self._pool = self._pool or client._made
        if pool is None:  # the last user released the pool under this operation
            raise closed_error()
        try:
            self._conn = await pool.acquire()
        except Exception as exc:
            if client.closed:
                raise closed_error() from None
            raise map_error(exc, "connect", client.url, runtime=self._runtime) from exc
        return self._conn

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        conn = self._conn
        if exc is not None and not isinstance(exc, Exception):
            terminate(conn)
        try:
            await cast("asyncpg.Pool", self._pool).release(conn)
        except Exception:
            terminate(conn)
