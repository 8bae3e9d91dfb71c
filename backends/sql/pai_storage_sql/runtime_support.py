"""What the four SQL runtime stores share: the client, the clock, transactions, ordered scans.

:class:`RuntimeDb` is each store's handle on the shared
:class:`~pai_storage_sql.client.SqlClient`: its runtime tables, its dialect,
one write transaction per operation (run again after a deadlock or a lock wait
timeout), one read snapshot per read, the store's clock inside a transaction,
and the MariaDB/MySQL ``max_allowed_packet`` check that turns a statement the
server would refuse into a typed error before anything is sent.

:func:`ordered_scan` reads a range of an ordered key in exact byte order
although MariaDB/MySQL index only the key's head (``runtime_tables``).

:class:`SqlRuntimeStore` is the base the four stores share: it attaches the
store to its :class:`RuntimeDb` once the core options are checked (its
constructor is every store's: a store only names its tables, in
:meth:`~SqlRuntimeStore._use_tables`), names the store's URL and table in its
repr, connects and releases the client, and judges and purges expiry on its
main table's ``expires_at``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    and_,
    bindparam,
    delete,
    func,
    literal_column,
    or_,
    select,
    text,
    true,
    tuple_,
)

from pai_storage.backend import StoreURL
from pai_storage.errors import general_errors
from pai_storage.fields import truncate_ms
from pai_storage.runtime import RuntimeStore

from .client import CLIENT_OPTIONS, SqlClient
from .runtime_tables import RuntimeTables, UtcMillis, head_bytes, join_key

if TYPE_CHECKING:
    from sqlalchemy.engine import Row
    from sqlalchemy.ext.asyncio import AsyncConnection

    from pai_storage.lifecycle import ManagedStore

__all__ = [
    "CLIENT_OPTIONS",
    "MAX_VALUE_BYTES",
    "PURGE_BATCH",
    "RuntimeDb",
    "SqlRuntimeStore",
    "escaped_size",
    "ordered_scan",
    "split_client_options",
]

T = TypeVar("T")

MAX_VALUE_BYTES = 256 * 1024 * 1024
"""The largest ``max_value_bytes`` of the key-value and agent-state stores: 256 MiB
(on MariaDB/MySQL a value must also fit the server's ``max_allowed_packet``)."""

PURGE_BATCH = 1000
"""Rows one ``purge_expired`` transaction deletes at most (it loops until none are left)."""

STATEMENT_OVERHEAD = 64 * 1024
"""Bytes a statement needs beyond its escaped values (SQL text, names, numbers)."""

_ESCAPED = tuple(bytes([c]) for c in b"\x00\n\r\x1a\"'\\")


def escaped_size(*values: bytes) -> int:
    """Bytes ``values`` take in a MySQL statement: the MySQL drivers send a byte
    string as a quoted literal in which each of seven byte values takes two bytes."""
    return sum(len(v) + sum(v.count(c) for c in _ESCAPED) for v in values)


def split_client_options(options: dict[str, Any]) -> dict[str, Any]:
    """Remove and return the client options among a store's keyword arguments."""
    return {k: options.pop(k) for k in list(options) if k in CLIENT_OPTIONS}


class RuntimeDb:
    """A runtime store's handle on its (possibly shared) :class:`SqlClient`.

    Parameters
    ----------
    url:
        The store's URL (not needed with a shared ``client``).
    client:
        The :class:`SqlClient` of a ``connect()`` call, or ``None`` to make one.
    options:
        Client options (:data:`CLIENT_OPTIONS`), only without ``client``.
    """

    def __init__(self, url: str | StoreURL | None, client: object, options: dict[str, Any]) -> None:
        with general_errors():
            self.client: SqlClient = SqlClient.attached(url, client, **options)
        self.url = self.client.url
        self.dialect = self.client.dialect
        self.head_bytes = head_bytes(self.dialect)
        self.id_head_bytes = head_bytes(self.dialect, snapshot_id=True)
        self.max_packet: int | None = None
        """MariaDB/MySQL: the server's ``max_allowed_packet`` once connected."""
        self._statements: dict[Hashable, Any] = {}

    def statement(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The statement ``key`` names, built once per store: the hot paths bind
        their values as parameters, so each runs one compiled form."""
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = build()
        return found

    @property
    def tables(self) -> RuntimeTables:
        tables: RuntimeTables = self.client.tables.runtime
        return tables

    @property
    def mysql(self) -> bool:
        return self.dialect == "mysql"

    async def ready(self) -> None:
        """Connect (schema included); on MariaDB/MySQL read ``max_allowed_packet`` once."""
        with general_errors():  # the client is shared with the thread store
            await self.client.ready()
        if self.mysql and self.max_packet is None:

            async def packet(conn: AsyncConnection) -> int:
                result = await conn.exec_driver_sql("SELECT @@global.max_allowed_packet")
                return int(result.scalar_one())

            self.max_packet = await self.read(packet)

    async def release(self) -> None:
        with general_errors():
            await self.client.release()

    # ------------------------------------------------------------ transactions

    async def write(self, operation: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``operation(conn)`` in one write transaction, again after a deadlock.

        The transaction commits when ``operation`` returns; when it raises,
        nothing is applied. ``operation`` may roll back itself
        (``await conn.rollback()``) to apply nothing and still return. On
        SQLite engines the client made it runs whole in the database thread
        (:meth:`~pai_storage_sql.client.SqlClient.run_write`), as does
        :meth:`read`.
        """

        client = self.client

        async def attempt() -> T:
            return await client.run_write(lambda op: operation(client.connection(op)))

        # The client maps driver errors to the thread store's classes (it serves
        # both); a runtime store raises the general ones, the original chained.
        with general_errors():
            return await client.retrying(attempt)

    async def read(self, operation: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``operation(conn)`` in one read snapshot."""
        client = self.client
        with general_errors():
            return await client.run_read(lambda op: operation(client.connection(op)))

    async def now(self, conn: AsyncConnection, store: ManagedStore) -> datetime:
        """The store's time in whole milliseconds: the test clock, else the server's.

        MariaDB/MySQL: ``UTC_TIMESTAMP(6)`` read on ``conn``; SQLite has no
        server, so its clock is this process's UTC clock.
        """
        given = store.now()
        if given is not None:
            return given
        return truncate_ms(await self.client.server_time(conn))

    def clock(self, store: ManagedStore) -> Any:
        """The store's time for one read statement, without a round trip.

        The test clock when set; on MariaDB/MySQL ``UTC_TIMESTAMP(6)``,
        evaluated by the statement itself (once per statement; comparing a
        whole-millisecond ``expires_at`` with it is the same as comparing with
        the time truncated to milliseconds); on SQLite the process clock.
        """
        given = store.now()
        if given is not None:
            return given
        if self.mysql:
            return func.utc_timestamp(6)
        return truncate_ms(datetime.now(UTC))

    async def purge(self, table: Table, store: ManagedStore) -> int:
        """Delete every row of ``table`` whose ``expires_at`` has passed, in batches.

        Each batch is one transaction and one ``DELETE`` of at most
        :data:`PURGE_BATCH` rows, the oldest first, through the ``expires_at``
        index: MariaDB/MySQL ``DELETE ... ORDER BY expires_at LIMIT n``;
        SQLite (no ``DELETE ... LIMIT``) by ``rowid`` from a bounded
        ``SELECT``. Batches repeat until one deletes fewer.
        """
        expires = table.c.expires_at

        async def batch(conn: AsyncConnection) -> int:
            now = await self.now(conn, store)
            if self.mysql:
                name = conn.dialect.identifier_preparer.format_table(table)
                statement: Any = text(
                    f"DELETE FROM {name} WHERE expires_at <= :now "
                    f"ORDER BY expires_at LIMIT {PURGE_BATCH}"
                ).bindparams(bindparam("now", now, type_=UtcMillis()))
            else:
                rowid: ColumnElement[Any] = literal_column("rowid")
                oldest = select(rowid).select_from(table).where(expires <= now).limit(PURGE_BATCH)
                statement = delete(table).where(rowid.in_(oldest))
            return int((await conn.execute(statement)).rowcount)

        total = 0
        while True:
            count = await self.write(batch)
            total += count
            if count < PURGE_BATCH:
                return total

    async def erase_range(self, table: Table, low: bytes, high: bytes) -> int:
        """Delete every row of ``table`` whose ordered key ``sk`` is in ``[low, high)``.

        Expired rows too (a scope erasure). In batches of at most
        :data:`PURGE_BATCH` rows, each one transaction: the rows of the range
        found by :func:`ordered_scan` (exact on long keys), deleted by their
        unique ``(sk_head, sk_tail_hash)``; until a batch is short. Returns
        the rows deleted.
        """
        query = select(table.c.sk_head, table.c.sk_tail, table.c.sk_tail_hash)
        unique = tuple_(table.c.sk_head, table.c.sk_tail_hash)

        async def batch(conn: AsyncConnection) -> int:
            rows = await ordered_scan(
                conn, query, table, "sk", self.head_bytes, low, True, high, PURGE_BATCH
            )
            if rows:
                keys = [(r.sk_head, r.sk_tail_hash) for r in rows]
                await conn.execute(delete(table).where(unique.in_(keys)))
            return len(rows)

        total = 0
        while True:
            count = await self.write(batch)
            total += count
            if count < PURGE_BATCH:
                return total

    def packet_room(self) -> int | None:
        """Bytes of escaped values one statement may carry (``None``: no limit, SQLite)."""
        if self.max_packet is None:
            return None
        return max(self.max_packet - STATEMENT_OVERHEAD, 0)


class SqlRuntimeStore(RuntimeStore):
    """Base of the SQL runtime stores, listed before the core store class::

        class SqlKeyValueStore(SqlRuntimeStore, KeyValueStore): ...

    The constructor is every store's: it checks the contract's options (by
    the contract class), then attaches the store to its :class:`RuntimeDb`
    (``_db``), so a store refused for a bad option holds no client; it sets
    ``url`` and lets the store take its tables (:meth:`_use_tables`). The
    store's main table (:attr:`_main_table`) is the one its repr names and
    whose ``expires_at`` decides what is live (:meth:`_live`,
    :meth:`_now_param`) and what ``purge_expired`` deletes.

    Parameters
    ----------
    url:
        ``sqlite:///file.db`` or ``mysql://user@host/db`` (not needed with ``client=``).
    client:
        The :class:`~pai_storage_sql.client.SqlClient` shared by the stores of
        one ``connect()`` call, an application's ``AsyncEngine``, or ``None``.
    **options:
        The client's options (:data:`CLIENT_OPTIONS`: ``table_prefix``,
        ``names``, ``busy_timeout``, ``pool_size``, ``connect_timeout``,
        ``retry_attempts``; not with a shared client), and the options of the
        store's contract class (``clock``, ``on_warning``, ``token_secret``,
        and its own).
    """

    backend_name = "sql"
    token_prefix = "pai-sql"
    _main_table: ClassVar[str] = "table"
    """The attribute holding the store's main table (the repr's, the expiry's)."""

    def __init__(
        self, url: str | StoreURL | None = None, *, client: object = None, **options: Any
    ) -> None:
        client_options = split_client_options(options)
        # The contract's options first: a store refused for a bad one holds no client.
        super().__init__(**options)
        self._db = RuntimeDb(url, client, client_options)
        self.url = self._db.url
        self._use_tables(self._db.tables)

    def _use_tables(self, tables: RuntimeTables) -> None:
        """Take the store's tables from the client's runtime ``tables``."""
        raise NotImplementedError

    @property
    def _expiring(self) -> Table:
        """The store's main table (:attr:`_main_table`)."""
        table: Table = getattr(self, self._main_table)
        return table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.url)!r}, table={self._expiring.name!r})"

    async def _initialize(self) -> None:
        await self._db.ready()

    async def _close(self) -> None:
        await self._db.release()

    def _now_param(self) -> Any:
        """The store's clock as the statement parameter ``now``."""
        return bindparam("now", type_=self._expiring.c.expires_at.type)

    def _live(self, now: Any) -> ColumnElement[bool]:
        """A main-table row has not expired at ``now`` (no ``expires_at``, or later)."""
        expires = self._expiring.c.expires_at
        return or_(expires.is_(None), expires > now)

    async def _purge_expired(self) -> int:
        return await self._db.purge(self._expiring, self)


# ---------------------------------------------------------------- ordered scans


async def ordered_scan(
    conn: AsyncConnection,
    query: Select[Any],
    table: Table,
    prefix: str,
    head_bytes: int | None,
    low: bytes,
    low_inclusive: bool,
    high: bytes | None,
    limit: int,
    where: ColumnElement[bool] | None = None,
) -> list[Row[Any]]:
    """Up to ``limit`` rows of ``query`` whose ordered key is in the range, in key order.

    The ordered key is split into the columns ``<prefix>_head``,
    ``<prefix>_tail`` and ``<prefix>_tail_hash`` (``runtime_tables``); the
    range is ``low <= key < high`` (``low < key`` unless ``low_inclusive``;
    ``high`` ``None``: unbounded). ``query`` must select the head and tail
    columns; ``where`` is any further condition.

    The index orders rows by ``(head, tail_hash)``, which is the key order
    except among keys longer than the head that share it (a *group*). The
    scan is one index range with ``LIMIT``; a group cut by a bound or by the
    limit is read whole (by its head: an index equality) and ordered here by
    the full key. Without a split (SQLite) there are no groups.
    """
    head = table.c[f"{prefix}_head"]
    tail_hash = table.c[f"{prefix}_tail_hash"]
    extra = where if where is not None else true()
    split = head_bytes

    def full(row: Row[Any]) -> bytes:
        return join_key(row._mapping[f"{prefix}_head"], row._mapping[f"{prefix}_tail"])

    def inside(key: bytes) -> bool:
        above = key >= low if low_inclusive else key > low
        return above and (high is None or key < high)

    async def group(value: bytes) -> list[Row[Any]]:
        result = await conn.execute(query.where(and_(head == value, extra)))
        return list(result)

    rows: list[Row[Any]] = []
    if split is not None and len(low) >= split:
        start = low[:split]
        rows += await group(start)
        lower: ColumnElement[bool] = head > start
    else:
        lower = head >= low if low_inclusive else head > low
    if high is None:
        upper: ColumnElement[bool] = true()
    elif split is None or len(high) < split:
        upper = head < high
    else:
        upper = head <= high[:split]
    main = list(
        await conn.execute(
            query.where(and_(lower, upper, extra)).order_by(head, tail_hash).limit(limit)
        )
    )
    if (
        split is not None
        and len(main) == limit
        and len(main[-1]._mapping[f"{prefix}_head"]) >= split
    ):
        last = main[-1]._mapping[f"{prefix}_head"]
        main = [r for r in main if r._mapping[f"{prefix}_head"] != last] + await group(last)
    rows += main
    found = sorted((r for r in rows if inside(full(r))), key=full)
    return found[:limit]


def keys_of(rows: Sequence[Row[Any]], prefix: str) -> list[bytes]:
    """The full ordered keys of ``rows``."""
    return [join_key(r._mapping[f"{prefix}_head"], r._mapping[f"{prefix}_tail"]) for r in rows]
