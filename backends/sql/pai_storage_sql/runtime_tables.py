"""The tables of the SQL runtime stores (key-value, agent state, snapshots, locks).

Every table is a SQLAlchemy Core :class:`~sqlalchemy.Table` added to the
client's :class:`~sqlalchemy.MetaData` by :func:`define_runtime_tables`; the
schema module creates them (idempotently) with the thread tables. The layout
is the same on SQLite and on MariaDB/MySQL; only the column types differ.

Binary keys
    Every name (namespace, key, user id, session id, scope, snapshot id,
    resource, owner) is stored as the bytes of its UTF-8 encoding in a binary
    column (``BLOB`` on SQLite, ``VARBINARY``/``BLOB`` on MariaDB/MySQL). Byte
    order of UTF-8 is code-point order, no collation folds case, and nothing
    pads trailing spaces (MariaDB's ``utf8mb4_bin`` is ``PAD SPACE``:
    ``'a' = 'a '`` there), so ``"a"``, ``"A"`` and ``"a "`` are three keys.

Ordered keys with a head and a tail
    The key-value store orders items by one byte string, the *sort key*
    :func:`sort_key` (``namespace path || 0x00 || key``: the separator sorts
    below every byte a name can hold, so the order of sort keys is the order
    of (namespace path, key) pairs). A sort key can be ~70 KB long (16
    segments and a key of 1,024 characters, four bytes each) but an InnoDB
    index key holds at most 3,072 bytes, so an ordered key is split
    (:func:`split_key`): its first :data:`MYSQL_HEAD_BYTES` bytes (``*_head``,
    indexed), the rest (``*_tail``, not indexed, ``NULL`` when empty) and the
    SHA-256 of the rest (``*_tail_hash``, empty when there is no tail), which
    makes ``(head, tail_hash)`` unique. Comparing heads orders keys exactly,
    except among keys longer than the head that share it; the stores read
    such a group whole and order it by the full key
    (:func:`~pai_storage_sql.runtime_support.ordered_scan`). On SQLite nothing
    is split: the head is the whole key.

Unordered keys
    Keys only ever looked up (a state key, a lock resource, a snapshot
    scope) are found by the SHA-256 of their bytes (``BINARY(32)``), with the
    name itself stored beside it.

Times
    ``DATETIME(3)`` (UTC) on MariaDB/MySQL; integer milliseconds since the
    Unix epoch on SQLite, which has no date type. Both read back as aware UTC
    datetimes (:class:`UtcMillis`).

Values
    Canonical JSON text as UTF-8 bytes (``LONGBLOB``/``BLOB``), so no
    connection character set or collation can change a byte; snapshot data
    in ``LONGBLOB``/``BLOB``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

__all__ = [
    "COMPONENT_TABLES",
    "MYSQL_HEAD_BYTES",
    "MYSQL_ID_HEAD_BYTES",
    "RuntimeTables",
    "UtcMillis",
    "define_runtime_tables",
    "digest",
    "head_bytes",
    "join_key",
    "sort_key",
    "split_key",
]

MYSQL_HEAD_BYTES = 3000
"""Bytes of an ordered key kept in its indexed head on MariaDB/MySQL.

With the 32-byte tail hash the primary key is 3,032 bytes, inside InnoDB's
3,072-byte limit for one index key (``DYNAMIC`` rows, the default)."""

MYSQL_ID_HEAD_BYTES = 2900
"""Bytes of a snapshot id kept in the head of the snapshot index on MariaDB/MySQL
(beside the 32-byte scope hash, the creation time and the tail hash)."""

MYSQL_NAME_BYTES = 4096
"""A name of 1,024 characters is at most 4,096 bytes of UTF-8."""

COMPONENT_TABLES = {
    "kv": "kv",
    "state": "agent_sessions",
    "snapshots": "snapshots",
    "guard": "locks",
}
"""Each runtime component's base table name, after the prefix."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_MYSQL = ("mysql", "mariadb")


# ---------------------------------------------------------------- column types


def _binary(mysql_type: TypeEngine[Any]) -> TypeEngine[bytes]:
    """``BLOB`` on SQLite, ``mysql_type`` on MariaDB/MySQL."""
    return LargeBinary().with_variant(mysql_type, *_MYSQL)


def _head() -> TypeEngine[bytes]:
    return _binary(mysql.VARBINARY(MYSQL_HEAD_BYTES))


def _hash() -> TypeEngine[bytes]:
    return _binary(mysql.VARBINARY(32))


def _name() -> TypeEngine[bytes]:
    return _binary(mysql.VARBINARY(MYSQL_NAME_BYTES))


def _tail() -> TypeEngine[bytes]:
    return _binary(mysql.MEDIUMBLOB())


def _long() -> TypeEngine[bytes]:
    return _binary(mysql.LONGBLOB())


def _serial() -> TypeEngine[int]:
    """An auto-increment key: ``BIGINT`` on MariaDB/MySQL, the rowid on SQLite."""
    return BigInteger().with_variant(Integer(), "sqlite")


class UtcMillis(TypeDecorator[datetime]):
    """An aware UTC datetime in whole milliseconds.

    ``DATETIME(3)`` holding UTC on MariaDB/MySQL; ``BIGINT`` milliseconds since
    the Unix epoch on SQLite. Bound values are truncated to the millisecond.
    """

    impl = BigInteger
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in _MYSQL:
            return dialect.type_descriptor(mysql.DATETIME(fsp=3))
        return dialect.type_descriptor(BigInteger())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise TypeError("UtcMillis takes an aware datetime")
        ms = (value - _EPOCH) // _MS
        if dialect.name in _MYSQL:
            return (_EPOCH + ms * _MS).replace(tzinfo=None)
        return ms

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        # SQLite's BIGINT has no processor of its own to keep: one call a value
        # instead of TypeDecorator's two (rows of a page convert three each).
        if dialect.name in _MYSQL or self.impl_instance.result_processor(dialect, coltype):
            return super().result_processor(dialect, coltype)
        epoch, ms = _EPOCH, _MS

        def process(value: Any) -> datetime | None:
            return None if value is None else epoch + int(value) * ms

        return process

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, datetime):
            return value.replace(tzinfo=UTC)
        return _EPOCH + int(value) * _MS


def to_ms(moment: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime."""
    return (moment - _EPOCH) // _MS


# ---------------------------------------------------------------- keys


def digest(data: bytes) -> bytes:
    """The 32-byte SHA-256 of ``data`` (the lookup key of an unordered name)."""
    return hashlib.sha256(data).digest()


def sort_key(path: str, key: str) -> bytes:
    """The key-value sort key: ``path || 0x00 || key`` in UTF-8.

    Names never contain U+0000, so the separator sorts below every byte that
    can follow it and comparing sort keys compares ``(path, key)`` pairs.
    """
    return path.encode() + b"\x00" + key.encode()


def split_key(full: bytes, head_bytes: int | None) -> tuple[bytes, bytes | None, bytes]:
    """``(head, tail, tail_hash)`` of an ordered key (``head_bytes`` None: no split)."""
    if head_bytes is None or len(full) <= head_bytes:
        return full, None, b""
    tail = full[head_bytes:]
    return full[:head_bytes], tail, digest(tail)


def head_bytes(dialect: str, *, snapshot_id: bool = False) -> int | None:
    """Where ordered keys are split on ``dialect`` (``None``: never, on SQLite)."""
    if dialect in _MYSQL:
        return MYSQL_ID_HEAD_BYTES if snapshot_id else MYSQL_HEAD_BYTES
    return None


def join_key(head: bytes, tail: bytes | None) -> bytes:
    """The full ordered key of a stored ``(head, tail)``."""
    return bytes(head) if tail is None else bytes(head) + bytes(tail)


# ---------------------------------------------------------------- the tables


@dataclass(frozen=True, slots=True)
class RuntimeTables:
    """The runtime stores' tables, defined on one :class:`MetaData`.

    ``kv``
        One row per item: the sort key ``(sk_head, sk_tail_hash)`` (primary
        key) and ``sk_tail``; the namespace path and the key (UTF-8), the
        value (canonical JSON, UTF-8), version, times and TTL; ``writer``, a
        random tag of the last write, by which a conditional upsert learns
        whether it was the one that wrote. Index on ``expires_at``.
    ``state_sessions``
        One row per session: ``id`` (auto-increment), the ordered key
        ``user || 0x00 || session`` split like the key-value sort key (unique),
        and ``expires_at`` (indexed).
    ``state_values``
        One row per state key: ``id``, the session, the SHA-256 of the key
        (unique per session) and the key; a single value (``value``,
        ``version``) or a list's head (``length``, ``hash``).
    ``state_items``
        One row per list item, keyed ``(value_id, position)``: an append is an
        insert of the new rows.
    ``snapshots``
        One row per snapshot, keyed by the SHA-256 of the scope and the split
        snapshot id; index ``(scope_hash, created_at, id_head, id_tail_hash)``
        for newest-first pages; index on ``expires_at``; index
        ``(scope_head, expires_at)`` (the scope's first bytes, split like an
        ordered key's head) for the scopes in order (schema version 2).
    ``locks``
        One row per held (or expired, not yet purged) lock, keyed by the
        SHA-256 of the resource; index on ``expires_at``.
    ``fencing``
        One row (``id = 1``) holding the last fencing token handed out; purges
        never touch it, so tokens keep increasing.
    """

    kv: Table
    state_sessions: Table
    state_values: Table
    state_items: Table
    snapshots: Table
    locks: Table
    fencing: Table

    def all(self) -> tuple[Table, ...]:
        """Every runtime table, parents before children."""
        return (
            self.kv,
            self.state_sessions,
            self.state_values,
            self.state_items,
            self.snapshots,
            self.locks,
            self.fencing,
        )


def base_names(prefix: str, names: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each component's base table name: ``names`` wins, else ``<prefix>_<table>``."""
    chosen = dict(names or {})
    return {c: chosen.get(c) or f"{prefix}_{table}" for c, table in COMPONENT_TABLES.items()}


def define_runtime_tables(
    metadata: MetaData, prefix: str, *, names: Mapping[str, str] | None = None
) -> RuntimeTables:
    """Define the runtime tables on ``metadata``, named ``<prefix>_kv``, ... .

    ``names`` maps a component (``kv``, ``state``, ``snapshots``, ``guard``)
    to its own base name. With the prefix ``pai`` the tables are ``pai_kv``,
    ``pai_agent_sessions`` (+ ``_values``, ``_items``), ``pai_snapshots``,
    ``pai_locks`` and ``pai_locks_fencing``. Table options on MariaDB/MySQL:
    InnoDB, ``DYNAMIC`` rows.
    """
    base = base_names(prefix, names)
    opts: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_row_format": "DYNAMIC"}

    kv = Table(
        base["kv"],
        metadata,
        Column("sk_head", _head(), nullable=False),
        Column("sk_tail_hash", _hash(), nullable=False),
        Column("sk_tail", _tail(), nullable=True),
        Column("ns", _tail(), nullable=False),
        Column("key", _name(), nullable=False),
        Column("value", _long(), nullable=False),
        Column("version", BigInteger(), nullable=False),
        Column("writer", _hash(), nullable=False),
        Column("created_at", UtcMillis(), nullable=False),
        Column("updated_at", UtcMillis(), nullable=False),
        Column("expires_at", UtcMillis(), nullable=True),
        Column("ttl_ms", BigInteger(), nullable=True),
        PrimaryKeyConstraint("sk_head", "sk_tail_hash"),
        **opts,
    )
    Index(f"{base['kv']}_expiry", kv.c.expires_at)

    state = base["state"]
    sessions = Table(
        state,
        metadata,
        Column("id", _serial(), primary_key=True, autoincrement=True),
        Column("sk_head", _head(), nullable=False),
        Column("sk_tail_hash", _hash(), nullable=False),
        Column("sk_tail", _tail(), nullable=True),
        Column("expires_at", UtcMillis(), nullable=True),
        UniqueConstraint("sk_head", "sk_tail_hash", name=f"{state}_key"),
        sqlite_autoincrement=True,  # an id is never reused, even after a purge
        **opts,
    )
    Index(f"{state}_expiry", sessions.c.expires_at)
    values = Table(
        f"{state}_values",
        metadata,
        Column("id", _serial(), primary_key=True, autoincrement=True),
        Column(
            "session_id",
            BigInteger().with_variant(Integer(), "sqlite"),
            ForeignKey(sessions.c.id, ondelete="CASCADE"),
            nullable=False,
        ),
        Column("key_hash", _hash(), nullable=False),
        Column("key", _name(), nullable=False),
        Column("is_list", Boolean(create_constraint=False), nullable=False),
        Column("value", _long(), nullable=True),
        Column("version", BigInteger(), nullable=True),
        Column("length", BigInteger(), nullable=True),
        Column("hash", _hash(), nullable=True),
        UniqueConstraint("session_id", "key_hash", name=f"{state}_values_key"),
        sqlite_autoincrement=True,
        **opts,
    )
    items = Table(
        f"{state}_items",
        metadata,
        Column("value_id", BigInteger().with_variant(Integer(), "sqlite"), nullable=False),
        Column("position", BigInteger(), nullable=False),
        Column("value", _long(), nullable=False),
        PrimaryKeyConstraint("value_id", "position"),
        ForeignKeyConstraint(
            ["value_id"], [values.c.id], ondelete="CASCADE", name=f"{state}_items_fk"
        ),
        **opts,
    )

    snap = base["snapshots"]
    snapshots = Table(
        snap,
        metadata,
        Column("scope_hash", _hash(), nullable=False),
        Column("id_head", _binary(mysql.VARBINARY(MYSQL_ID_HEAD_BYTES)), nullable=False),
        Column("id_tail_hash", _hash(), nullable=False),
        Column("id_tail", _name(), nullable=True),
        Column("scope", _name(), nullable=False),
        Column("scope_head", _head(), nullable=False),
        Column("created_at", UtcMillis(), nullable=False),
        Column("expires_at", UtcMillis(), nullable=True),
        Column("size", BigInteger(), nullable=False),
        Column("sha256", _hash(), nullable=False),
        Column("metadata", _long(), nullable=False),
        Column("data", _long(), nullable=False),
        PrimaryKeyConstraint("scope_hash", "id_head", "id_tail_hash"),
        **opts,
    )
    Index(
        f"{snap}_newest",
        snapshots.c.scope_hash,
        snapshots.c.created_at,
        snapshots.c.id_head,
        snapshots.c.id_tail_hash,
    )
    Index(f"{snap}_expiry", snapshots.c.expires_at)
    Index(f"{snap}_scopes", snapshots.c.scope_head, snapshots.c.expires_at)

    guard = base["guard"]
    locks = Table(
        guard,
        metadata,
        Column("resource_hash", _hash(), primary_key=True),
        Column("resource", _name(), nullable=False),
        Column("token", _hash(), nullable=False),
        Column("owner", _name(), nullable=False),
        Column("fencing_token", BigInteger(), nullable=False),
        Column("acquired_at", UtcMillis(), nullable=False),
        Column("expires_at", UtcMillis(), nullable=False),
        **opts,
    )
    Index(f"{guard}_expiry", locks.c.expires_at)
    fencing = Table(
        f"{guard}_fencing",
        metadata,
        Column("id", Integer(), primary_key=True, autoincrement=False),
        Column("value", BigInteger(), nullable=False),
        **opts,
    )
    return RuntimeTables(
        kv=kv,
        state_sessions=sessions,
        state_values=values,
        state_items=items,
        snapshots=snapshots,
        locks=locks,
        fencing=fencing,
    )
