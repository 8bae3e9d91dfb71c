"""The PostgreSQL key-value store: one row per item, keyed ``(ns, key)``.

``ns`` is the namespace path (:func:`~pai_storage.backend.namespace_path`: each
segment followed by U+001F) and ``key`` the key, both ``text COLLATE "C"``, so
the primary-key index orders them by code point and a namespace or key prefix
is a range on it (``prefix <= x < prefix_upper_bound(prefix)``), never a
``LIKE`` pattern. The value is its canonical JSON text (``text``, never
``jsonb``, which would lose key order and ``1.0``). Expiry is exact at read
time (every statement filters on ``expires_at`` against the same clock); a
partial index on ``expires_at`` serves :meth:`purge_expired`, which deletes in
bounded batches. Every write is one statement. See ``docs/postgres.md``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pai_storage.backend import (
    KeyValueStore,
    KVRecord,
    VersionMismatch,
    namespace_from_path,
    namespace_path,
    namespace_path_after,
    prefix_upper_bound,
)

from .runtime import MAX_VALUE_BYTES, PURGE_BATCH, PgRuntimeStore, rows_affected

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

    from .schema import Tables

__all__ = ["PURGE_BATCH", "PostgresKeyValueStore", "ddl"]

NOW = "COALESCE($1::timestamptz, date_trunc('milliseconds', clock_timestamp()))"
"""The store's time: the test clock (``$1``) or the server's, in milliseconds."""

COLUMNS = "ns, key, value, version, created_at, updated_at, expires_at, ttl_ms"
LIVE = "(expires_at IS NULL OR expires_at > n.t)"


class Names(Protocol):
    """The names this module needs (:class:`~pai_storage_postgres.schema.Tables` has them)."""

    @property
    def kv(self) -> str: ...

    def index(self, component: str, suffix: str) -> str: ...


def ddl(tables: Names) -> list[str]:
    """Idempotent DDL for the key-value table and its expiry index."""
    t = tables.kv
    return [
        f"""CREATE TABLE IF NOT EXISTS {t} (
            ns text COLLATE "C" NOT NULL,
            key text COLLATE "C" NOT NULL,
            value text NOT NULL,
            version bigint NOT NULL,
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            expires_at timestamptz,
            ttl_ms bigint,
            PRIMARY KEY (ns, key))""",
        f"CREATE INDEX IF NOT EXISTS {tables.index('kv', '_expiry')} ON {t} (expires_at) "
        "WHERE expires_at IS NOT NULL",
    ]


class Statements:
    """Every SQL statement of the store, built once per table."""

    def __init__(self, table: str) -> None:
        t = table
        head = f"WITH n AS (SELECT {NOW} AS t) "
        self.get_many = (
            f"{head}SELECT {COLUMNS} FROM {t}, n WHERE ns = $2 AND key = ANY($3::text[]) AND {LIVE}"
        )
        self.refresh = (
            f"{head}, u AS (UPDATE {t} AS k SET expires_at = n.t + k.ttl_ms * interval '1 ms' "
            "FROM n WHERE k.ns = $2 AND k.key = $3 AND k.ttl_ms IS NOT NULL "
            f"AND (k.expires_at IS NULL OR k.expires_at > n.t) RETURNING {_cols('k')}) "
            f"SELECT {COLUMNS} FROM u UNION ALL "
            f"SELECT {COLUMNS} FROM {t}, n WHERE ns = $2 AND key = $3 AND ttl_ms IS NULL "
            f"AND {LIVE}"
        )
        fresh = "SELECT $2, $3, $4, 1, n.t, n.t, n.t + $5::bigint * interval '1 ms', $5 FROM n"
        live_old = "(k.expires_at IS NULL OR k.expires_at > EXCLUDED.updated_at)"
        self.put = (
            f"{head}INSERT INTO {t} AS k ({COLUMNS}) {fresh} "
            "ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, "
            f"version = CASE WHEN {live_old} THEN k.version + 1 ELSE 1 END, "
            f"created_at = CASE WHEN {live_old} THEN k.created_at ELSE EXCLUDED.created_at END, "
            "updated_at = EXCLUDED.updated_at, expires_at = EXCLUDED.expires_at, "
            f"ttl_ms = EXCLUDED.ttl_ms RETURNING {_cols('k')}"
        )
        # Create only when absent or expired: a live row makes the conflict
        # update's WHERE false, so nothing is written and nothing returned.
        self.create = (
            f"{head}INSERT INTO {t} AS k ({COLUMNS}) {fresh} "
            "ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, version = 1, "
            "created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, "
            "expires_at = EXCLUDED.expires_at, ttl_ms = EXCLUDED.ttl_ms "
            f"WHERE NOT {live_old} RETURNING {_cols('k')}"
        )
        # Under READ COMMITTED a racing update re-checks the WHERE on the row
        # the winner wrote: the version no longer matches, so one wins.
        self.update = (
            f"{head}UPDATE {t} AS k SET value = $4, version = k.version + 1, updated_at = n.t, "
            "expires_at = n.t + $5::bigint * interval '1 ms', ttl_ms = $5 FROM n "
            "WHERE k.ns = $2 AND k.key = $3 AND k.version = $6 "
            f"AND (k.expires_at IS NULL OR k.expires_at > n.t) RETURNING {_cols('k')}"
        )
        self.delete = (
            f"{head}DELETE FROM {t} AS k USING n WHERE k.ns = $2 AND k.key = $3 "
            "AND (k.expires_at IS NULL OR k.expires_at > n.t) "
            "AND ($4::bigint IS NULL OR k.version = $4)"
        )
        self.purge = (
            f"{head}, d AS (SELECT ns, key FROM {t}, n WHERE expires_at <= n.t "
            f"ORDER BY expires_at LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED) "
            f"DELETE FROM {t} AS k USING d, n WHERE k.ns = d.ns AND k.key = d.key "
            "AND k.expires_at <= n.t"
        )
        self._table = t
        self._head = head

    def search(
        self,
        low: str,
        high: str | None,
        keys: tuple[str, str | None] | None,
        after: tuple[str, str] | None,
        limit: int,
    ) -> tuple[str, list[Any]]:
        """A page of items under the path range ``[low, high)``, keys in ``keys``
        (a lowest key and a bound), strictly after the ``(ns, key)`` ``after``."""
        q = _Query()
        where = [f"ns >= {q.arg(low)}"]
        if high is not None:
            where.append(f"ns < {q.arg(high)}")
        if keys is not None:
            where.append(f"key >= {q.arg(keys[0])}")
            if keys[1] is not None:
                where.append(f"key < {q.arg(keys[1])}")
        if after is not None:
            where.append(f"(ns, key) > ({q.arg(after[0])}, {q.arg(after[1])})")
        sql = (
            f"{self._head}SELECT {COLUMNS} FROM {self._table}, n WHERE {' AND '.join(where)} "
            f"AND {LIVE} ORDER BY ns, key LIMIT {limit}"
        )
        return sql, q.args

    def keys(
        self, path: str, low: str | None, high: str | None, after: str | None, limit: int
    ) -> tuple[str, list[Any]]:
        """Keys of the namespace ``path`` in ``[low, high)``, strictly after ``after``."""
        q = _Query()
        where = [f"ns = {q.arg(path)}"]
        if low is not None:
            where.append(f"key >= {q.arg(low)}")
        if high is not None:
            where.append(f"key < {q.arg(high)}")
        if after is not None:
            where.append(f"key > {q.arg(after)}")
        sql = (
            f"{self._head}SELECT key FROM {self._table}, n WHERE {' AND '.join(where)} "
            f"AND {LIVE} ORDER BY ns, key LIMIT {limit}"
        )
        return sql, q.args

    def namespaces(
        self, low: str, high: str | None, depth: int | None, limit: int
    ) -> tuple[str, list[Any]]:
        """Distinct (truncated) namespace paths in ``[low, high)``, one index probe each.

        A recursive walk: each step finds the first live row at or after the
        position the previous step skipped to (past every path the truncated
        namespace covers).
        """
        q = _Query()
        t = self._table
        lowest = q.arg(low)
        bound = f" AND r.ns < {q.arg(high)}" if high is not None else ""
        if depth is not None:
            d = q.arg(depth) + "::int"
            trunc = (
                f"(array_to_string((string_to_array(left(w.ns, -1), E'\\x1f'))[1:{d}], "
                "E'\\x1f') || E'\\x1f')"
            )
            cut = f"(length(w.ns) - length(replace(w.ns, E'\\x1f', ''))) >= {d}"
            skip = f"CASE WHEN {cut} THEN left(w.path, -1) || ' ' ELSE w.path || E'\\x01' END"
        else:
            trunc = "w.ns"
            skip = "w.path || E'\\x01'"

        def first(lower: str) -> str:
            return (
                f"SELECT r.ns FROM {t} AS r, n WHERE r.ns >= {lower}{bound} "
                "AND (r.expires_at IS NULL OR r.expires_at > n.t) ORDER BY r.ns, r.key LIMIT 1"
            )

        sql = (
            f"{self._head}, walk AS (WITH RECURSIVE w0(ns, step) AS ("
            f"(SELECT x.ns, 1 FROM ({first(lowest)}) AS x) UNION ALL "
            f"SELECT nx.ns, w1.step + 1 FROM (SELECT w.ns, w.step, {trunc} AS path FROM w0 AS w) "
            f"AS w1 CROSS JOIN LATERAL ({first(_skip_for('w1', skip))}) AS nx "
            f"WHERE w1.step < {limit}) SELECT ns, step FROM w0) "
            f"SELECT {trunc.replace('w.ns', 'walk.ns')} AS path FROM walk"
        )
        return sql, q.args


class _Query:
    """Numbers a statement's arguments from ``$2`` (``$1`` is always the clock)."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def arg(self, value: Any) -> str:
        self.args.append(value)
        return f"${len(self.args) + 1}"


def _skip_for(alias: str, skip: str) -> str:
    return skip.replace("w.path", f"{alias}.path").replace("w.ns", f"{alias}.ns")


def _cols(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in COLUMNS.split(", "))


class PostgresKeyValueStore(PgRuntimeStore, KeyValueStore):
    """Key-value items in PostgreSQL 13+ (asyncpg), on the shared pool of :class:`PgClient`.

    Takes the parameters of :class:`~pai_storage_postgres.runtime.PgRuntimeStore`
    (``url``, ``client``, the pool and table options) and the
    options of :class:`~pai_storage.KeyValueStore` (``clock``, ``on_warning``,
    ``token_secret``, ``max_value_bytes``); ``max_value_bytes`` is at most
    256 MiB here.
    """

    value_bytes_limit: ClassVar[int | None] = MAX_VALUE_BYTES
    _repr_format = "{name}({url!r}, table={tables.kv!r})"

    def _use_tables(self, tables: Tables) -> None:
        self.sql = Statements(tables.kv)

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        """Run a read statement (``$1`` is the store's time)."""
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                return list(await conn.fetch(sql, self.now(), *args))

    async def _write(self, sql: str, *args: Any) -> list[Any]:
        """Run one autocommit write statement (``$1`` is the store's time).

        Its reply is the commit's: a connection lost before the reply arrives
        is an unknown outcome, never "nothing was applied".
        """
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("commit", runtime=True):
                return list(await conn.fetch(sql, self.now(), *args))

    # ------------------------------------------------------------ hooks

    async def _get_many(self, namespace: tuple[str, ...], keys: list[str]) -> list[KVRecord]:
        rows = await self._fetch(self.sql.get_many, namespace_path(namespace), keys)
        return [_record(r) for r in rows]

    async def _refresh_ttl(self, namespace: tuple[str, ...], key: str) -> KVRecord | None:
        rows = await self._write(self.sql.refresh, namespace_path(namespace), key)
        return _record(rows[0]) if rows else None

    async def _put(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None
    ) -> KVRecord:
        rows = await self._write(self.sql.put, namespace_path(namespace), key, text, _ms(ttl))
        return _record(rows[0])

    async def _put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        expected_version: int | None,
    ) -> KVRecord | VersionMismatch:
        path = namespace_path(namespace)
        if expected_version is None:
            rows = await self._write(self.sql.create, path, key, text, _ms(ttl))
        else:
            rows = await self._write(self.sql.update, path, key, text, _ms(ttl), expected_version)
        if rows:
            return _record(rows[0])
        current = await self._fetch(self.sql.get_many, path, [key])
        return VersionMismatch(_record(current[0]) if current else None)

    async def _delete(
        self, namespace: tuple[str, ...], key: str, expected_version: int | None
    ) -> bool:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("commit", runtime=True):  # one autocommit statement
                status = await conn.execute(
                    self.sql.delete, self.now(), namespace_path(namespace), key, expected_version
                )
        return rows_affected(status) > 0

    async def _search(
        self,
        prefix: tuple[str, ...],
        key_prefix: str,
        after: tuple[tuple[str, ...], str] | None,
        limit: int,
    ) -> list[KVRecord]:
        low = namespace_path(prefix)
        keys = (key_prefix, prefix_upper_bound(key_prefix)) if key_prefix else None
        position = None if after is None else (namespace_path(after[0]), after[1])
        sql, args = self.sql.search(low, _upper(low), keys, position, limit)
        return _records(await self._fetch(sql, *args))

    async def _list_keys(
        self, namespace: tuple[str, ...], prefix: str, after: str | None, limit: int
    ) -> list[str]:
        high = prefix_upper_bound(prefix) if prefix else None
        sql, args = self.sql.keys(namespace_path(namespace), prefix or None, high, after, limit)
        return [str(r["key"]) for r in await self._fetch(sql, *args)]

    async def _list_namespaces(
        self,
        prefix: tuple[str, ...],
        max_depth: int | None,
        after: tuple[str, ...] | None,
        limit: int,
    ) -> list[tuple[str, ...]]:
        low = namespace_path(prefix)
        high = _upper(low)
        if after is not None:
            low = max(low, namespace_path_after(after, max_depth))
        sql, args = self.sql.namespaces(low, high, max_depth, limit)
        # The walk finds them in path order; sorted here again rather than by a
        # Sort node (code-point order of str is the byte order of "C").
        paths = sorted(str(r["path"]) for r in await self._fetch(sql, *args))
        return [namespace_from_path(path) for path in paths]

    async def _erase_scope(self, scope: str) -> int:
        low = namespace_path((scope,))  # expired items too: no expiry condition
        statement = f"DELETE FROM {self.tables.kv} WHERE ns >= $1 AND ns < $2"
        return await self._delete_rows(statement, low, prefix_upper_bound(low))

    async def _purge_expired(self) -> int:
        return await self._purge_batches(self.sql.purge)


def _upper(path: str) -> str | None:
    """The bound of a namespace-path range (``None`` for the empty prefix: everything)."""
    return prefix_upper_bound(path) if path else None


def _ms(ttl: timedelta | None) -> int | None:
    return None if ttl is None else ttl // timedelta(milliseconds=1)


def _records(rows: list[asyncpg.Record]) -> list[KVRecord]:
    """Records of a page of rows: each distinct namespace path is split once."""
    spaces: dict[str, tuple[str, ...]] = {}
    out = []
    for ns, key, value, version, created, updated, expires, ttl_ms in rows:  # COLUMNS order
        namespace = spaces.get(ns)
        if namespace is None:
            namespace = spaces[ns] = namespace_from_path(ns)
        ttl = None if ttl_ms is None else timedelta(milliseconds=ttl_ms)
        out.append(KVRecord(namespace, key, value, version, created, updated, expires, ttl))
    return out


def _record(row: asyncpg.Record) -> KVRecord:
    ttl_ms = row["ttl_ms"]
    created: datetime = row["created_at"]
    return KVRecord(
        namespace=namespace_from_path(row["ns"]),
        key=row["key"],
        text=row["value"],
        version=int(row["version"]),
        created_at=created,
        updated_at=row["updated_at"],
        expires_at=row["expires_at"],
        ttl=None if ttl_ms is None else timedelta(milliseconds=int(ttl_ms)),
    )
