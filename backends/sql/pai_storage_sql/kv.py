"""The SQL key-value store: one row per item, ordered by one binary sort key.

The sort key of an item is ``namespace path || 0x00 || key`` in UTF-8
(:func:`~pai_storage_sql.runtime_tables.sort_key`); byte order of sort keys is
the store's (namespace path, key) code-point order, so a namespace prefix, a
key prefix within one namespace and a page position are each a range of it
(``low <= sk < prefix_upper_bound``), never a ``LIKE`` pattern. The primary
key is the sort key's indexed head and the hash of its tail
(``docs/sql.md``, "Runtime stores"); every listing is an index range scan in
index order with a ``LIMIT``. A ``search`` with a key prefix filters the
namespace range on the ``key`` column.

Writes are one transaction each and one conditional statement each:

- ``put``: an upsert (SQLite ``ON CONFLICT DO UPDATE``, MariaDB/MySQL ``ON
  DUPLICATE KEY UPDATE``) whose assignments keep ``created_at`` and add one
  to the version over a live row, and start afresh over an expired one;
- ``put_if_version(None)``: the same upsert with every assignment
  conditional on the stored row having expired; a random ``writer`` tag
  tells the caller whether its statement wrote the row;
- ``put_if_version(n)``: ``UPDATE ... WHERE version = n AND live``;
- ``delete``: ``DELETE ... WHERE live [AND version = n]``.

The row is then read back inside the same transaction (it is locked by the
write). Expiry is exact at read time: every statement compares
``expires_at`` with the store's clock (MariaDB/MySQL ``UTC_TIMESTAMP(6)``,
read once per write transaction and evaluated inside each read statement;
SQLite the process clock; or the test clock).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    case,
    delete,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import mysql, sqlite

from pai_storage.backend import (
    KeyValueStore,
    KVRecord,
    VersionMismatch,
    namespace_from_path,
    namespace_path,
    namespace_path_after,
)
from pai_storage.errors import InvalidInputError

from .core_connection import value_rows
from .runtime_support import MAX_VALUE_BYTES, SqlRuntimeStore, escaped_size, ordered_scan
from .runtime_tables import RuntimeTables, join_key, sort_key, split_key

if TYPE_CHECKING:
    from sqlalchemy.engine import Row
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["MAX_VALUE_BYTES", "SqlKeyValueStore"]

_NAMESPACE_BATCH = 16
"""Rows one step of ``list_namespaces`` reads before it skips past a namespace."""


def _upper(prefix: bytes) -> bytes | None:
    """The least byte string above every string starting with ``prefix`` (UTF-8 has no 0xFF)."""
    if not prefix:
        return None
    return prefix[:-1] + bytes([prefix[-1] + 1])


class SqlKeyValueStore(SqlRuntimeStore, KeyValueStore):
    """Key-value items in SQLite or MariaDB/MySQL (SQLAlchemy Core), on a shared :class:`SqlClient`.

    Takes the parameters of :class:`~pai_storage_sql.runtime_support.SqlRuntimeStore`
    (``url``, ``client``, the client's options) and the options of
    :class:`~pai_storage.KeyValueStore` (``clock``, ``on_warning``,
    ``token_secret``, ``max_value_bytes``); ``max_value_bytes`` is at most
    256 MiB here.
    """

    value_bytes_limit: ClassVar[int | None] = MAX_VALUE_BYTES

    def _use_tables(self, tables: RuntimeTables) -> None:
        self.table = tables.kv

    # ------------------------------------------------------------ statements

    def _pk_params(self) -> ColumnElement[bool]:
        t = self.table
        return and_(t.c.sk_head == bindparam("head"), t.c.sk_tail_hash == bindparam("tail_hash"))

    def _pk(self, sk: bytes) -> ColumnElement[bool]:
        head, _, tail_hash = split_key(sk, self._db.head_bytes)
        t = self.table
        return and_(t.c.sk_head == head, t.c.sk_tail_hash == tail_hash)

    def _select(self) -> Any:
        t = self.table
        return select(
            t.c.sk_head,
            t.c.sk_tail,
            t.c.value,
            t.c.version,
            t.c.created_at,
            t.c.updated_at,
            t.c.expires_at,
            t.c.ttl_ms,
            t.c.writer,
        )

    def _check_packet(self, sk: bytes, text: str) -> None:
        room = self._db.packet_room()
        if room is None:
            return
        # The value appears once in every statement; the key up to three times
        # (the sort key's head and tail, the namespace path and the key).
        size = escaped_size(text.encode()) + 3 * escaped_size(sk)
        if size > room:
            raise InvalidInputError(
                f"value is {len(text.encode()):,} bytes of JSON; with its key the statement "
                f"would exceed this MariaDB/MySQL server's max_allowed_packet of "
                f"{self._db.max_packet:,} bytes; raise max_allowed_packet on the server or "
                "store smaller values"
            )

    def _values(
        self,
        sk: bytes,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        now: datetime,
        writer: bytes,
    ) -> dict[str, Any]:
        head, tail, tail_hash = split_key(sk, self._db.head_bytes)
        ttl_ms = None if ttl is None else ttl // timedelta(milliseconds=1)
        return {
            "sk_head": head,
            "sk_tail_hash": tail_hash,
            "sk_tail": tail,
            "ns": namespace_path(namespace).encode(),
            "key": key.encode(),
            "value": text.encode(),
            "version": 1,
            "writer": writer,
            "created_at": now,
            "updated_at": now,
            "expires_at": None if ttl is None else now + ttl,
            "ttl_ms": ttl_ms,
        }

    def _upsert(self, row: dict[str, Any], now: datetime, *, only_expired: bool) -> Any:
        """``INSERT`` of ``row``, or over an existing row: a ``put`` (``only_expired``
        false) or a create that replaces only an expired row; and its parameters
        (``v_<column>`` and ``now``)."""
        names = tuple(row)
        statement = self._db.statement(
            ("upsert", names, only_expired),
            lambda: self._upsert_statement(names, only_expired=only_expired),
        )
        return statement, {"now": now, **{f"v_{name}": value for name, value in row.items()}}

    def _upsert_statement(self, names: tuple[str, ...], *, only_expired: bool) -> Any:
        t = self.table
        live = self._live(self._now_param())
        kept = ("sk_head", "sk_tail_hash")
        row = {name: bindparam(f"v_{name}", type_=t.c[name].type) for name in names}
        if self._db.mysql:
            ins = mysql.insert(t).values(row)
            new = ins.inserted
            changes: list[tuple[str, Any]] = []
            if only_expired:
                for name in row:
                    if name not in kept and name != "expires_at":
                        changes.append((name, func.if_(live, t.c[name], new[name])))
                # Last: every condition above reads the stored expires_at.
                changes.append(("expires_at", func.if_(live, t.c.expires_at, new.expires_at)))
            else:
                changes += [
                    ("version", func.if_(live, t.c.version + 1, 1)),
                    ("created_at", func.if_(live, t.c.created_at, new.created_at)),
                ]
                changes += [
                    (name, new[name])
                    for name in row
                    if name not in (*kept, "version", "created_at", "expires_at")
                ]
                changes.append(("expires_at", new.expires_at))
            return ins.on_duplicate_key_update(changes)
        lite = sqlite.insert(t).values(row)
        excluded = lite.excluded
        if only_expired:
            replaced = {name: excluded[name] for name in row if name not in kept}
            return lite.on_conflict_do_update(
                index_elements=[t.c.sk_head, t.c.sk_tail_hash], set_=replaced, where=~live
            )
        sets: dict[str, Any] = {name: excluded[name] for name in row if name not in kept}
        sets["version"] = case((live, t.c.version + 1), else_=1)
        sets["created_at"] = case((live, t.c.created_at), else_=excluded.created_at)
        return lite.on_conflict_do_update(index_elements=[t.c.sk_head, t.c.sk_tail_hash], set_=sets)

    async def _row(self, conn: AsyncConnection, sk: bytes, now: datetime) -> Row[Any] | None:
        """The live row of ``sk`` (locked on MariaDB/MySQL)."""

        def build() -> Any:
            query = self._select().where(self._pk_params(), self._live(self._now_param()))
            return query.with_for_update() if self._db.mysql else query

        head, _, tail_hash = split_key(sk, self._db.head_bytes)
        params = {"head": head, "tail_hash": tail_hash, "now": now}
        return (await conn.execute(self._db.statement("row", build), params)).first()

    # ------------------------------------------------------------ hooks

    async def _get_many(self, namespace: tuple[str, ...], keys: list[str]) -> list[KVRecord]:
        path = namespace_path(namespace)
        sks = [sort_key(path, key) for key in keys]
        t = self.table

        async def read(conn: AsyncConnection) -> list[KVRecord]:
            now = self._db.clock(self)
            pairs = [split_key(sk, self._db.head_bytes) for sk in sks]
            bound = isinstance(now, datetime)  # else the server's clock, in the statement
            one = len(pairs) == 1  # a primary-key probe, no list to expand
            params: dict[str, Any] = (
                {"head": pairs[0][0], "tail_hash": pairs[0][2]}
                if one
                else {"keys": [(h, th) for h, _, th in pairs]}
            )
            if bound:
                params["now"] = now

            def build() -> Any:
                wanted = (
                    self._pk_params()
                    if one
                    else tuple_(t.c.sk_head, t.c.sk_tail_hash).in_(
                        bindparam("keys", expanding=True)
                    )
                )
                return self._select().where(wanted, self._live(self._now_param() if bound else now))

            rows = await conn.execute(self._db.statement(("get", one, bound), build), params)
            return _records(value_rows(rows))

        return await self._db.read(read)

    async def _refresh_ttl(self, namespace: tuple[str, ...], key: str) -> KVRecord | None:
        sk = sort_key(namespace_path(namespace), key)
        t = self.table

        async def write(conn: AsyncConnection) -> KVRecord | None:
            now = await self._db.now(conn, self)
            row = await self._row(conn, sk, now)
            if row is None:
                return None
            record = _record(row)
            if record.ttl is None:
                return record
            expires = now + record.ttl
            await conn.execute(update(t).where(self._pk(sk)).values(expires_at=expires))
            return _replace_expiry(record, expires)

        return await self._db.write(write)

    async def _put(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None
    ) -> KVRecord:
        sk = sort_key(namespace_path(namespace), key)
        self._check_packet(sk, text)

        async def write(conn: AsyncConnection) -> KVRecord:
            now = await self._db.now(conn, self)
            row = self._values(sk, namespace, key, text, ttl, now, os.urandom(16))
            await conn.execute(*self._upsert(row, now, only_expired=False))
            stored = await self._row(conn, sk, now)
            assert stored is not None
            return _record(stored, namespace, key)

        return await self._db.write(write)

    async def _put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        expected_version: int | None,
    ) -> KVRecord | VersionMismatch:
        sk = sort_key(namespace_path(namespace), key)
        self._check_packet(sk, text)
        t = self.table

        async def write(conn: AsyncConnection) -> KVRecord | VersionMismatch:
            now = await self._db.now(conn, self)
            writer = os.urandom(16)
            row = self._values(sk, namespace, key, text, ttl, now, writer)
            if expected_version is None:
                await conn.execute(*self._upsert(row, now, only_expired=True))
            else:

                def build() -> Any:
                    changes = {
                        name: bindparam(f"v_{name}", type_=t.c[name].type)
                        for name in ("value", "writer", "updated_at", "expires_at", "ttl_ms")
                    }
                    return (
                        update(t)
                        .where(
                            self._pk_params(),
                            t.c.version == bindparam("expected"),
                            self._live(self._now_param()),
                        )
                        .values({**changes, "version": t.c.version + 1})
                    )

                params = {
                    "head": row["sk_head"],
                    "tail_hash": row["sk_tail_hash"],
                    "expected": expected_version,
                    "now": now,
                    "v_value": row["value"],
                    "v_writer": writer,
                    "v_updated_at": now,
                    "v_expires_at": row["expires_at"],
                    "v_ttl_ms": row["ttl_ms"],
                }
                await conn.execute(self._db.statement("update-if-version", build), params)
            stored = await self._row(conn, sk, now)
            if stored is None or bytes(stored.writer) != writer:
                return VersionMismatch(None if stored is None else _record(stored))
            return _record(stored, namespace, key)

        return await self._db.write(write)

    async def _delete(
        self, namespace: tuple[str, ...], key: str, expected_version: int | None
    ) -> bool:
        sk = sort_key(namespace_path(namespace), key)
        t = self.table

        async def write(conn: AsyncConnection) -> bool:
            now = await self._db.now(conn, self)
            statement = delete(t).where(self._pk(sk), self._live(now))
            if expected_version is not None:
                statement = statement.where(t.c.version == expected_version)
            return (await conn.execute(statement)).rowcount > 0

        return await self._db.write(write)

    async def _search(
        self,
        prefix: tuple[str, ...],
        key_prefix: str,
        after: tuple[tuple[str, ...], str] | None,
        limit: int,
    ) -> list[KVRecord]:
        low = namespace_path(prefix).encode()
        high = _upper(low)
        t = self.table
        inclusive = True
        if after is not None:
            position = sort_key(namespace_path(after[0]), after[1])
            if position >= low:
                low, inclusive = position, False

        async def read(conn: AsyncConnection) -> list[KVRecord]:
            now = self._db.clock(self)
            if self._db.head_bytes is None:
                # Keys are never split (SQLite): the scan is this one statement.
                return await self._search_whole_keys(
                    conn, now, key_prefix, low, inclusive, high, limit
                )
            where = self._live(now)
            if key_prefix:
                first = key_prefix.encode()
                where = and_(where, t.c.key >= first)
                bound = _upper(first)
                if bound is not None:
                    where = and_(where, t.c.key < bound)
            rows = await ordered_scan(
                conn,
                self._select(),
                t,
                "sk",
                self._db.head_bytes,
                low,
                inclusive,
                high,
                limit,
                where,
            )
            return _records(rows)

        return await self._db.read(read)

    async def _search_whole_keys(
        self,
        conn: AsyncConnection,
        now: Any,
        key_prefix: str,
        low: bytes,
        inclusive: bool,
        high: bytes | None,
        limit: int,
    ) -> list[KVRecord]:
        """:meth:`_search` where the head column holds the whole sort key: one index
        range scan in key order with a ``LIMIT`` (what ``ordered_scan`` reduces to)."""
        t = self.table
        first = key_prefix.encode() if key_prefix else None
        first_bound = _upper(first) if first is not None else None
        bound = isinstance(now, datetime)  # else the server's clock, in the statement
        params: dict[str, Any] = {"low": low, "limit": limit}
        if high is not None:
            params["high"] = high
        if bound:
            params["now"] = now
        if first is not None:
            params["key_low"] = first
        if first_bound is not None:
            params["key_high"] = first_bound

        def build() -> Any:
            head = t.c.sk_head
            where = [
                head >= bindparam("low") if inclusive else head > bindparam("low"),
                self._live(self._now_param() if bound else now),
            ]
            if high is not None:
                where.append(head < bindparam("high"))
            if first is not None:
                where.append(t.c.key >= bindparam("key_low"))
            if first_bound is not None:
                where.append(t.c.key < bindparam("key_high"))
            return (
                self._select()
                .where(*where)
                .order_by(head, t.c.sk_tail_hash)
                .limit(bindparam("limit"))
            )

        shape = (
            "search",
            inclusive,
            high is not None,
            bound,
            first is not None,
            first_bound is not None,
        )
        rows = await conn.execute(self._db.statement(shape, build), params)
        return _records(value_rows(rows))

    async def _list_keys(
        self, namespace: tuple[str, ...], prefix: str, after: str | None, limit: int
    ) -> list[str]:
        base = namespace_path(namespace).encode() + b"\x00"
        low, inclusive = base + prefix.encode(), True
        high = _upper(low) if prefix else namespace_path(namespace).encode() + b"\x01"
        if after is not None:
            position = base + after.encode()
            if position >= low:
                low, inclusive = position, False
        t = self.table

        async def read(conn: AsyncConnection) -> list[str]:
            now = self._db.clock(self)
            query = select(t.c.sk_head, t.c.sk_tail, t.c.key)
            rows = await ordered_scan(
                conn,
                query,
                t,
                "sk",
                self._db.head_bytes,
                low,
                inclusive,
                high,
                limit,
                self._live(now),
            )
            return [bytes(r.key).decode() for r in rows]

        return await self._db.read(read)

    async def _erase_scope(self, scope: str) -> int:
        low = namespace_path((scope,)).encode()  # every item of the scope, expired or not
        return await self._db.erase_range(self.table, low, low[:-1] + b"\x20")

    async def _list_namespaces(
        self,
        prefix: tuple[str, ...],
        max_depth: int | None,
        after: tuple[str, ...] | None,
        limit: int,
    ) -> list[tuple[str, ...]]:
        low = namespace_path(prefix).encode()
        high = _upper(low)
        if after is not None:
            low = max(low, namespace_path_after(after, max_depth).encode())
        t = self.table

        async def read(conn: AsyncConnection) -> list[tuple[str, ...]]:
            now = self._db.clock(self)
            query = select(t.c.sk_head, t.c.sk_tail, t.c.ns)
            found: list[tuple[str, ...]] = []
            position = low
            while len(found) < limit:
                rows = await ordered_scan(
                    conn,
                    query,
                    t,
                    "sk",
                    self._db.head_bytes,
                    position,
                    True,
                    high,
                    _NAMESPACE_BATCH,
                    self._live(now),
                )
                if not rows:
                    break
                for row in rows:
                    namespace = namespace_from_path(bytes(row.ns).decode())
                    if max_depth is not None:
                        namespace = namespace[:max_depth]
                    if not found or found[-1] != namespace:
                        found.append(namespace)
                        if len(found) == limit:
                            break
                last = found[-1]
                position = namespace_path_after(last, max_depth).encode()
            return found

        return await self._db.read(read)


def _records(rows: Iterable[Sequence[Any]]) -> list[KVRecord]:
    """The records of rows of :meth:`SqlKeyValueStore._select` (a page's rows
    mostly share a namespace: each path is decoded once)."""
    spaces: dict[bytes, tuple[str, ...]] = {}
    return [_record(row, spaces=spaces) for row in rows]


def _record(
    row: Sequence[Any],
    namespace: tuple[str, ...] | None = None,
    key: str | None = None,
    *,
    spaces: dict[bytes, tuple[str, ...]] | None = None,
) -> KVRecord:
    # The columns of _select(), by position.
    head, tail, value, version, created, updated, expires, ttl_ms = row[:8]
    if namespace is None or key is None:
        sk = join_key(head, tail)
        path, _, raw_key = sk.partition(b"\x00")
        found = None if spaces is None else spaces.get(path)
        if found is None:
            found = namespace_from_path(path.decode())
            if spaces is not None:
                spaces[path] = found
        namespace = found
        key = raw_key.decode()
    return KVRecord(
        namespace=namespace,
        key=key,
        text=bytes(value).decode(errors="surrogateescape"),
        version=int(version),
        created_at=created,
        updated_at=updated,
        expires_at=expires,
        ttl=None if ttl_ms is None else timedelta(milliseconds=int(ttl_ms)),
    )


def _replace_expiry(record: KVRecord, expires: datetime) -> KVRecord:
    return KVRecord(
        namespace=record.namespace,
        key=record.key,
        text=record.text,
        version=record.version,
        created_at=record.created_at,
        updated_at=record.updated_at,
        expires_at=expires,
        ttl=record.ttl,
    )
