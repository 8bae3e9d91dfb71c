"""The SQL schema: the thread tables, the runtime tables, and the schema version.

Every table is a SQLAlchemy :class:`~sqlalchemy.Table` on one
:class:`~sqlalchemy.MetaData` (:class:`Tables`), created idempotently with
``checkfirst`` and recorded in ``<prefix>_schema``.

Identifiers (scope keys, thread ids, record ids, agent, category) may be 1,024
characters, up to 4,096 bytes of UTF-8 each, more than an InnoDB index entry
holds (3,072 bytes). So every index keys an identifier by a 16-byte BLAKE2b
digest of its UTF-8 bytes (``*_h`` columns); the full identifier is stored
beside it, and every row read back is checked against the identifiers asked
for, so a digest collision can never return another thread's data. The list
order's tie-break (thread id by code point) uses ``thread_ord``: the thread
id's UTF-8 bytes, whole on SQLite and the first :data:`ORDER_BYTES` bytes on
MySQL; ties beyond it are ordered exactly by the store.

Four tables hold a thread store's data (``<prefix>`` defaults to ``pai_threads``):

``<prefix>``
    Thread roots: key ``tkey`` (the digest of scope key and thread id), the
    columns the list queries filter and order by, the version, the three
    child-family position counters, the record's JSON text (``doc``) and the
    thread's relationship facts after the commit that wrote it (``facts``,
    JSON text ``{"revision": n, "facts": {...}}``, or ``NULL``), which a
    commit uses only when ``n`` is the root's revision. On SQLite the four list
    indexes keyed by parent or category are partial (``WHERE parent_h IS NOT
    NULL``, ``WHERE category_h IS NOT NULL``): a commit of a thread without
    one moves none of them.
``<prefix>_messages`` / ``<prefix>_runs`` / ``<prefix>_queued_items``
    Child records keyed by ``(tkey, position)``, unique by ``(tkey, id_h)``,
    with the columns their pages and the relationship checks filter on, and
    the record's JSON text. On SQLite the messages' run index leaves out the
    messages outside any run (``WHERE run_h IS NOT NULL``).

Records are stored as JSON *text* (``TEXT`` / ``LONGTEXT``), never a JSON
column type, so key order, ``1`` versus ``1.0`` and escapes survive exactly.
On MySQL/MariaDB every table is InnoDB, ``utf8mb4`` with the binary collation;
identifiers are ``VARBINARY``/``BINARY`` (compared byte by byte, no padding),
so ``"a"``, ``"A"`` and ``"a "`` are three different ids.

The runtime stores' tables come from :mod:`pai_storage_sql.runtime_tables`
(``define_runtime_tables(metadata, prefix, names=...)``) on the same metadata;
``names`` gives a component's tables a base name of their own.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BINARY,
    VARBINARY,
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.types import TypeEngine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "DEFAULT_PREFIX",
    "DIGEST_BYTES",
    "MAX_PREFIX_LENGTH",
    "ORDER_BYTES",
    "SCHEMA_VERSION",
    "Tables",
    "binary",
    "digest",
    "json_text",
    "prepare_schema",
    "runtime_prefix",
    "validate_names",
    "validate_prefix",
]

SCHEMA_VERSION = 3
"""The schema version this package creates and understands.

Version 2 adds the snapshot table's ``scope_head`` column and its
``<snapshots>_scopes`` index (the scopes in order). Version 3 adds the thread
root's ``facts`` column and, on SQLite, makes the parent and category list
indexes and the messages' run index partial. An older database gains them on its first connect
(:func:`prepare_schema`)."""

DEFAULT_PREFIX = "pai_threads"
"""The default ``table_prefix`` (the thread tables' base name)."""

DIGEST_BYTES = 16
"""Size of the BLAKE2b digests that key identifiers in every index."""

ORDER_BYTES = 1024
"""On MySQL, how many leading bytes of a scope key or thread id ``scope_ord`` and
``thread_ord`` keep (the updated-at index holds both within 3,072 bytes)."""

MAX_ID_BYTES = 4096
"""The largest identifier in UTF-8 bytes (1,024 characters of up to 4 bytes)."""

MAX_PREFIX_LENGTH = 34
"""MySQL names are shorter than 64 characters (InnoDB refuses a foreign key
name of 64); the longest suffix adds 29 (``<prefix>_agent_sessions_values_ibfk_1``,
the name InnoDB gives the values table's foreign key)."""

MAX_NAME_LENGTH = 49
"""The longest base name ``names`` may give a component (the longest suffix
after it adds 14: ``<name>_values_ibfk_1``)."""

RUNTIME_COMPONENTS = ("kv", "state", "snapshots", "guard")
"""The components whose tables ``names`` may rename."""

_PREFIX = re.compile(r"[a-z_][a-z0-9_]*\Z")

MYSQL_TABLE_ARGS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}
"""Table options every MySQL/MariaDB table of this backend uses."""


def validate_prefix(value: object) -> str:
    """Check a ``table_prefix``; the error names the rule broken."""
    from pai_storage.errors import ThreadStoreConfigurationError

    if not isinstance(value, str) or not _PREFIX.match(value) or len(value) > MAX_PREFIX_LENGTH:
        raise ThreadStoreConfigurationError(
            f"option table_prefix must be 1 to {MAX_PREFIX_LENGTH} characters of lower-case "
            "letters, digits and '_', not starting with a digit"
        )
    return value


def validate_names(value: object) -> dict[str, str] | None:
    """Check the ``names`` option: runtime component -> base table name."""
    from pai_storage.errors import ThreadStoreConfigurationError

    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ThreadStoreConfigurationError(
            'option names must be a dict from component name to table name, e.g. {"kv": "my_kv"}'
        )
    chosen: dict[str, str] = {}
    for component, name in value.items():
        if component not in RUNTIME_COMPONENTS:
            raise ThreadStoreConfigurationError(
                f"option names: unknown component {component!r}; valid: "
                f"{', '.join(RUNTIME_COMPONENTS)} (the thread tables use table_prefix)"
            )
        if not isinstance(name, str) or not _PREFIX.match(name) or len(name) > MAX_NAME_LENGTH:
            raise ThreadStoreConfigurationError(
                f"option names: the table name of {component} must be 1 to {MAX_NAME_LENGTH} "
                "characters of lower-case letters, digits and '_', not starting with a digit"
            )
        chosen[component] = name
    return chosen


def runtime_prefix(table_prefix: str) -> str:
    """The prefix the runtime tables get: ``pai`` under the default ``table_prefix``
    (``pai_kv``, ...), the ``table_prefix`` itself otherwise (``p_kv``, ...)."""
    return "pai" if table_prefix == DEFAULT_PREFIX else table_prefix


def digest(text: str) -> bytes:
    """The 16-byte key of an identifier in every index."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=DIGEST_BYTES).digest()


def binary(length: int) -> TypeEngine[bytes]:
    """A variable-length byte string: ``VARBINARY(length)`` on MySQL, ``BLOB`` on SQLite."""
    return VARBINARY(length).with_variant(LargeBinary(), "sqlite")


def fixed_binary(length: int) -> TypeEngine[bytes]:
    """A fixed-length byte string: ``BINARY(length)`` on MySQL, ``BLOB`` on SQLite."""
    return BINARY(length).with_variant(LargeBinary(), "sqlite")


def json_text() -> TypeEngine[str]:
    """JSON text stored verbatim: ``LONGTEXT`` (utf8mb4, binary collation) on MySQL."""
    return Text().with_variant(
        mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def _key() -> Column[bytes]:
    return Column("tkey", fixed_binary(DIGEST_BYTES), nullable=False)


def _id(name: str, nullable: bool = False) -> Column[bytes]:
    return Column(name, binary(MAX_ID_BYTES), nullable=nullable)


def _h(name: str, nullable: bool = False) -> Column[bytes]:
    return Column(name, fixed_binary(DIGEST_BYTES), nullable=nullable)


@dataclass(frozen=True, slots=True)
class Tables:
    """Every table of one ``table_prefix``, on one :class:`~sqlalchemy.MetaData`.

    ``runtime`` is the runtime stores' ``RuntimeTables`` (``None`` when this
    installation ships no runtime stores).
    """

    prefix: str
    metadata: MetaData
    version: Table
    threads: Table
    messages: Table
    runs: Table
    queued: Table
    runtime: Any
    renamed: bool = False
    """Whether ``names`` renamed a component's tables (then every connect makes
    sure they exist, whatever names created the schema first)."""

    @classmethod
    def define(cls, prefix: str = DEFAULT_PREFIX, names: object = None) -> Tables:
        """Define the tables of ``prefix`` (and ``names``) on a new metadata."""
        validate_prefix(prefix)
        chosen = validate_names(names)
        md = MetaData()
        p = prefix
        version = Table(
            f"{p}_schema",
            md,
            Column("singleton", Integer, primary_key=True, autoincrement=False),
            Column("version", Integer, nullable=False),
            **MYSQL_TABLE_ARGS,
        )
        threads = Table(
            p,
            md,
            _key(),
            _h("scope_h"),
            _id("scope_key"),
            _id("thread_id"),
            Column("scope_ord", binary(ORDER_BYTES), nullable=False),
            Column("thread_ord", binary(ORDER_BYTES), nullable=False),
            Column("instance_id", String(64), nullable=False),
            Column("revision", BigInteger, nullable=False),
            _h("agent_h"),
            Column("hidden", SmallInteger, nullable=False),
            _h("parent_h", nullable=True),
            _h("category_h", nullable=True),
            Column("sort_key", BigInteger, nullable=False),
            Column("updated_ms", BigInteger, nullable=False),
            Column("messages_next", BigInteger, nullable=False),
            Column("runs_next", BigInteger, nullable=False),
            Column("queued_next", BigInteger, nullable=False),
            Column("doc", json_text(), nullable=False),
            Column("facts", json_text(), nullable=True),
            PrimaryKeyConstraint("tkey"),
            **MYSQL_TABLE_ARGS,
        )
        # Every list form binds `hidden` (include_hidden reads both values as
        # two bounded index scans); sort_key = -epoch_ms(updated_at) gives the
        # newest first in ascending index order, thread_ord breaks ties. A list
        # by parent or category binds it (`= ?`, never NULL): on SQLite those
        # indexes leave out the threads without one, which a commit then moves
        # in four indexes fewer.
        with_parent: dict[str, Any] = {"sqlite_where": threads.c.parent_h.isnot(None)}
        with_category: dict[str, Any] = {"sqlite_where": threads.c.category_h.isnot(None)}
        Index(
            f"{p}_list_vis",
            threads.c.scope_h,
            threads.c.hidden,
            threads.c.sort_key,
            threads.c.thread_ord,
        )
        Index(
            f"{p}_list_agent",
            threads.c.scope_h,
            threads.c.agent_h,
            threads.c.hidden,
            threads.c.sort_key,
            threads.c.thread_ord,
        )
        Index(
            f"{p}_list_agent_parent",
            threads.c.scope_h,
            threads.c.agent_h,
            threads.c.hidden,
            threads.c.parent_h,
            threads.c.sort_key,
            threads.c.thread_ord,
            **with_parent,
        )
        Index(
            f"{p}_list_agent_category",
            threads.c.scope_h,
            threads.c.agent_h,
            threads.c.hidden,
            threads.c.category_h,
            threads.c.sort_key,
            threads.c.thread_ord,
            **with_category,
        )
        Index(
            f"{p}_list_parent",
            threads.c.scope_h,
            threads.c.hidden,
            threads.c.parent_h,
            threads.c.sort_key,
            threads.c.thread_ord,
            **with_parent,
        )
        Index(
            f"{p}_list_category",
            threads.c.scope_h,
            threads.c.hidden,
            threads.c.category_h,
            threads.c.sort_key,
            threads.c.thread_ord,
            **with_category,
        )
        # The updated-at index of retention sweeps and exports: oldest first,
        # then scope key, then thread id (within one scope, or across all).
        Index(f"{p}_updated", threads.c.updated_ms, threads.c.scope_ord, threads.c.thread_ord)
        Index(f"{p}_scope_updated", threads.c.scope_h, threads.c.updated_ms, threads.c.thread_ord)
        messages = Table(
            f"{p}_messages",
            md,
            _key(),
            Column("position", BigInteger, nullable=False, autoincrement=False),
            _h("id_h"),
            _id("message_id"),
            _h("run_h", nullable=True),
            _id("run_id", nullable=True),
            Column("relation", String(16), nullable=True),
            Column("transcript", Boolean, nullable=False),
            Column("context", Boolean, nullable=False),
            Column("doc", json_text(), nullable=False),
            PrimaryKeyConstraint("tkey", "position"),
            UniqueConstraint("tkey", "id_h", name=f"{p}_messages_id"),
            **MYSQL_TABLE_ARGS,
        )
        Index(
            f"{p}_messages_transcript", messages.c.tkey, messages.c.transcript, messages.c.position
        )
        Index(f"{p}_messages_context", messages.c.tkey, messages.c.context, messages.c.position)
        # A message outside any run is never found by its run (`run_h = ?`,
        # `run_h IN (...)`): on SQLite the run index leaves it out.
        Index(
            f"{p}_messages_run",
            messages.c.tkey,
            messages.c.run_h,
            messages.c.position,
            sqlite_where=messages.c.run_h.isnot(None),
        )
        runs = Table(
            f"{p}_runs",
            md,
            _key(),
            Column("position", BigInteger, nullable=False, autoincrement=False),
            _h("id_h"),
            _id("run_id"),
            Column("status", String(16), nullable=False),
            Column("doc", json_text(), nullable=False),
            PrimaryKeyConstraint("tkey", "position"),
            UniqueConstraint("tkey", "id_h", name=f"{p}_runs_id"),
            **MYSQL_TABLE_ARGS,
        )
        Index(f"{p}_runs_status", runs.c.tkey, runs.c.status, runs.c.position)
        queued = Table(
            f"{p}_queued_items",
            md,
            _key(),
            Column("position", BigInteger, nullable=False, autoincrement=False),
            _h("id_h"),
            _id("queue_item_id"),
            _h("run_h"),
            _id("run_id"),
            Column("doc", json_text(), nullable=False),
            PrimaryKeyConstraint("tkey", "position"),
            UniqueConstraint("tkey", "id_h", name=f"{p}_queued_id"),
            **MYSQL_TABLE_ARGS,
        )
        Index(f"{p}_queued_run", queued.c.tkey, queued.c.run_h, queued.c.position)
        try:
            runtime = _runtime_tables(md, runtime_prefix(p), chosen)
        except InvalidRequestError:  # a table defined twice
            runtime = None
        if chosen and (runtime is None or not _distinct(md)):
            from pai_storage.errors import ThreadStoreConfigurationError

            raise ThreadStoreConfigurationError(
                "option names: the tables of two components (or of a component and the "
                "thread tables) would have the same name"
            )
        return cls(p, md, version, threads, messages, runs, queued, runtime, bool(chosen))

    @property
    def thread_tables(self) -> tuple[Table, ...]:
        return (self.threads, self.messages, self.runs, self.queued)


def _distinct(metadata: MetaData) -> bool:
    """Whether every table, index and constraint of ``metadata`` has its own name."""
    seen: list[str] = []
    for table in metadata.tables.values():
        seen.append(table.name)
        seen.extend(str(i.name) for i in table.indexes)
        seen.extend(str(c.name) for c in table.constraints if isinstance(c.name, str))
    return len(seen) == len(set(seen))


def _runtime_tables(metadata: MetaData, prefix: str, names: dict[str, str] | None) -> Any:
    """The runtime stores' tables, when this installation ships them."""
    try:
        module = importlib.import_module(f"{__package__}.runtime_tables")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.runtime_tables":
            raise
        if names:
            from pai_storage.errors import ThreadStoreConfigurationError

            raise ThreadStoreConfigurationError(
                "option names: this installation ships no runtime stores"
            ) from None
        return None
    return module.define_runtime_tables(metadata, prefix, names=names)


async def prepare_schema(conn: AsyncConnection, dialect: str, tables: Tables) -> tuple[str, bool]:
    """Create every table that is missing and record :data:`SCHEMA_VERSION`.

    Several processes may prepare one database at once: SQLite creates the
    tables inside one ``BEGIN IMMEDIATE`` transaction, MySQL under a named
    lock (``GET_LOCK``). A database whose recorded version is newer than
    :data:`SCHEMA_VERSION` is refused with ``ConfigurationError``.

    Returns the server's description (``"SQLite 3.40.1"``, ``"MariaDB
    10.11.6"``) and whether it is MariaDB.
    """
    import sqlite3

    from pai_storage.errors import ThreadStoreConfigurationError

    if dialect == "sqlite":
        server, mariadb = f"SQLite {sqlite3.sqlite_version}", False
    else:
        shown = str((await conn.exec_driver_sql("SELECT VERSION()")).scalar_one())
        mariadb = "mariadb" in shown.lower()
        server = f"{'MariaDB' if mariadb else 'MySQL'} {shown.split('-')[0]}"
        await conn.rollback()
    stored = await _stored_version(conn, tables)
    create = _needs_tables(stored, tables)
    # End the transaction of that read: on MySQL the re-check below must see a
    # fresh snapshot (REPEATABLE READ keeps the first one), or it would miss the
    # tables another process created while this one waited for the lock.
    await conn.rollback()
    if create:
        lock_name = f"pai_storage:{tables.prefix}"
        if dialect == "sqlite":
            await conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            got = await conn.exec_driver_sql(f"SELECT GET_LOCK('{lock_name}', 60)")
            if got.scalar_one() != 1:
                raise ThreadStoreConfigurationError(
                    "timed out waiting for another process creating the tables"
                )
        try:
            stored = await _stored_version(conn, tables)
            if _needs_tables(stored, tables):
                await conn.run_sync(tables.metadata.create_all)
                await _upgrade(conn, dialect, tables)
                v = tables.version
                if stored is None:
                    await conn.execute(v.insert().values(singleton=1, version=SCHEMA_VERSION))
                elif stored < SCHEMA_VERSION:
                    await conn.execute(v.update().values(version=SCHEMA_VERSION))
                stored = SCHEMA_VERSION
            await conn.commit()
        finally:
            if dialect != "sqlite":
                await conn.exec_driver_sql(f"SELECT RELEASE_LOCK('{lock_name}')")
                await conn.rollback()
    if stored is not None and stored > SCHEMA_VERSION:
        raise ThreadStoreConfigurationError(
            f"the tables {tables.prefix}* use schema version {stored}, newer than this "
            f"pai-storage understands ({SCHEMA_VERSION}); upgrade pai-storage"
        )
    return server, mariadb


async def _upgrade(conn: AsyncConnection, dialect: str, tables: Tables) -> None:
    """Bring tables an older version created up to this one (idempotent).

    Version 1 to 2: the snapshot table gains ``scope_head`` (the scope, or on
    MySQL its first bytes) filled from ``scope``, and the index on it.
    Version 2 to 3: the thread table gains ``facts`` (``NULL``: every root's
    next commit reads its facts from the children), and on SQLite the parent
    and category list indexes and the messages' run index are made again as
    partial indexes.
    """
    await _upgrade_threads(conn, dialect, tables)
    await _upgrade_snapshots(conn, dialect, tables)


async def _column_names(conn: AsyncConnection, table: Table) -> set[str]:
    from sqlalchemy import inspect

    return await conn.run_sync(
        lambda sync: {c["name"] for c in inspect(sync).get_columns(table.name)}
    )


async def _upgrade_threads(conn: AsyncConnection, dialect: str, tables: Tables) -> None:
    from sqlalchemy.schema import CreateIndex, DropIndex

    threads = tables.threads
    name = conn.dialect.identifier_preparer.format_table(threads)
    if "facts" not in await _column_names(conn, threads):
        kind = (
            "TEXT" if dialect == "sqlite" else "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )
        await conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN facts {kind} NULL")
    if dialect != "sqlite":
        return
    for index in (*threads.indexes, *tables.messages.indexes):
        if index.dialect_options["sqlite"]["where"] is None:
            continue
        found = await conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", (str(index.name),)
        )
        sql = found.scalar()
        if sql is not None and " WHERE " in str(sql).upper():
            continue
        if sql is not None:
            await conn.execute(DropIndex(index))
        await conn.execute(CreateIndex(index))


async def _upgrade_snapshots(conn: AsyncConnection, dialect: str, tables: Tables) -> None:
    from sqlalchemy.schema import CreateIndex

    if tables.runtime is None:
        return
    snapshots = tables.runtime.snapshots
    if "scope_head" in await _column_names(conn, snapshots):
        return
    name = conn.dialect.identifier_preparer.format_table(snapshots)
    if dialect == "sqlite":
        await conn.exec_driver_sql(
            f"ALTER TABLE {name} ADD COLUMN scope_head BLOB NOT NULL DEFAULT x''"
        )
        await conn.exec_driver_sql(f"UPDATE {name} SET scope_head = scope")
    else:
        from .runtime_tables import MYSQL_HEAD_BYTES

        await conn.exec_driver_sql(
            f"ALTER TABLE {name} ADD COLUMN scope_head VARBINARY({MYSQL_HEAD_BYTES}) "
            "NOT NULL DEFAULT '' AFTER scope"
        )
        await conn.exec_driver_sql(
            f"UPDATE {name} SET scope_head = SUBSTRING(scope, 1, {MYSQL_HEAD_BYTES})"
        )
    index = next(i for i in snapshots.indexes if i.name == f"{snapshots.name}_scopes")
    await conn.execute(CreateIndex(index))


def _needs_tables(stored: int | None, tables: Tables) -> bool:
    """Whether tables may be missing: a new or older schema, or renamed runtime
    tables (``names``) that the process which created the schema may not have used."""
    if stored is None or stored < SCHEMA_VERSION:
        return True
    return tables.renamed and stored == SCHEMA_VERSION


async def _stored_version(conn: AsyncConnection, tables: Tables) -> int | None:
    from sqlalchemy import inspect, select

    name = tables.version.name
    exists = await conn.run_sync(lambda sync: inspect(sync).has_table(name))
    if not exists:
        return None
    value = (await conn.execute(select(tables.version.c.version))).scalar()
    return int(value) if value is not None else None
