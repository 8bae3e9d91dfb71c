"""What the four PostgreSQL runtime stores share: the client, its tables, the lifecycle.

:class:`PgRuntimeStore` sits before the contract class in each store's bases
(``class PostgresKeyValueStore(PgRuntimeStore, KeyValueStore)``): its
constructor passes the contract's options on to the contract class and then
attaches the :class:`~pai_storage_postgres.client.PgClient` the store runs on
(a new one from the URL and pool options, an application's ``asyncpg.Pool``
wrapped, or the client shared by the stores of one ``connect()`` call), so
the constructor is every store's and a store refused for a bad option holds
no client; a store builds its statements for its tables in
:meth:`PgRuntimeStore._use_tables`. ``initialize`` connects the client and
``close`` releases it; the batched ``purge_expired`` loop is
:meth:`PgRuntimeStore._purge_batches` and a scope erasure's ``DELETE``
:meth:`PgRuntimeStore._delete_rows`. A store keeps only its own options,
statements and operations. See ``docs/postgres.md``,
"Key-value and agent-state stores" and "Snapshot store and execution guard".
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from pai_storage.backend import StoreURL
from pai_storage.runtime import RuntimeStore

from .client import POOL_OPTIONS, PgClient

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

    from .schema import Tables

__all__ = [
    "MAX_VALUE_BYTES",
    "PURGE_BATCH",
    "PgRuntimeStore",
    "micros",
    "rows_affected",
    "split_pool_options",
]

MAX_VALUE_BYTES = 256 * 1024 * 1024
"""The largest ``max_value_bytes`` of the key-value and agent-state stores: 256 MiB."""

PURGE_BATCH = 1000
"""Rows one statement of a store's ``purge_expired`` deletes at most."""


def split_pool_options(options: dict[str, Any]) -> dict[str, Any]:
    """Remove and return the pool and table options among a store's keyword arguments."""
    return {k: options.pop(k) for k in list(options) if k in POOL_OPTIONS}


def rows_affected(status: str) -> int:
    """The row count of a statement's command status (``"DELETE 3"`` -> 3)."""
    return int(status.rsplit(" ", 1)[-1])


def micros(duration: timedelta) -> int:
    """``duration`` in whole microseconds (a ``bigint`` statement parameter)."""
    return duration // timedelta(microseconds=1)


class PgRuntimeStore(RuntimeStore):
    """A runtime store on the shared pool of a :class:`PgClient`.

    Parameters
    ----------
    url:
        The ``postgresql://`` URL (not needed with ``client=``).
    client:
        An application's own ``asyncpg.Pool`` (never closed by pai-storage), or
        the :class:`PgClient` shared by the stores of one ``connect()`` call.
    **options:
        Where the tables live and the pool's settings
        (:data:`~pai_storage_postgres.client.POOL_OPTIONS`: ``table_prefix``,
        ``schema``, ``names``, ``min_pool_size``, ``max_pool_size``, ...; see
        :class:`~pai_storage_postgres.PostgresThreadStore`; not with a shared
        :class:`PgClient`), and the options of the contract class that follows
        this one in the store's bases (``clock``, ``on_warning``,
        ``token_secret``, and its own).
    """

    backend_name = "postgres"
    token_prefix = "pai-pg"
    _repr_format: ClassVar[str]
    """``repr(store)``: a :meth:`str.format` template of ``name`` (the class's),
    ``url`` (the URL's text, password hidden) and ``tables``
    (:class:`~pai_storage_postgres.schema.Tables`)."""

    def __init__(
        self, url: str | StoreURL | None = None, *, client: object = None, **options: Any
    ) -> None:
        pool_options = split_pool_options(options)
        # The contract's options first: a store refused for a bad one holds no client.
        super().__init__(**options)
        self._client: PgClient = PgClient.attached(url, client, **pool_options)
        self.url: StoreURL = self._client.url
        self.tables: Tables = self._client.tables
        self._pool: asyncpg.Pool | None = None
        """The client's pool once initialized (``None`` before and after)."""
        self._use_tables(self.tables)

    def _use_tables(self, tables: Tables) -> None:
        """Build the store's statements for its tables (named by ``tables``)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self._repr_format.format(
            name=type(self).__name__, url=str(self.url), tables=self.tables
        )

    async def _initialize(self) -> None:
        self._pool = await self._client.pool(runtime=True)

    async def _close(self) -> None:
        self._pool = None
        await self._client.release()

    async def _delete_rows(self, statement: str, *args: Any) -> int:
        """Run one autocommit ``DELETE`` (a scope erasure); the rows it deleted."""
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("commit", runtime=True):
                status = await conn.execute(statement, *args)
        return rows_affected(status)

    async def _purge_batches(self, statement: str, batch: int = PURGE_BATCH) -> int:
        """Run ``statement`` until it deletes fewer than ``batch`` rows; the rows deleted.

        ``statement`` deletes at most ``batch`` expired rows (``$1`` is the
        store's time), each run its own autocommit ``DELETE``, all on one
        pooled connection.
        """
        total = 0
        async with self._client.connection(self._pool, runtime=True) as conn:
            while True:
                with self._client.errors("commit", runtime=True):  # autocommit DELETE
                    status = await conn.execute(statement, self.now())
                count = rows_affected(status)
                total += count
                if count < batch:
                    return total
