"""The PostgreSQL snapshot store: one row per snapshot, the data in ``bytea``.

The table (``Tables.snapshots``, ``pai_snapshots`` by default) is keyed
``(scope, snapshot_id)``, both UTF-8 ``bytea`` (byte order is code-point order,
the ``list`` tie-break). The index ``(scope, created_at DESC, snapshot_id
DESC)`` serves ``list`` and ``latest`` as a bounded index range scan; the
scopes of a copy are a walk of the primary key, one probe per scope; a partial
index on ``expires_at`` serves ``purge_expired``. The data column is stored
uncompressed out of line (``STORAGE EXTERNAL``): snapshots are usually
compressed archives already. The size limit is :data:`MAX_SNAPSHOT_BYTES`.
See ``docs/postgres.md``.
"""

from __future__ import annotations

import builtins
import contextlib
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pai_storage.backend import ENUMERATE
from pai_storage.errors import CorruptSnapshotError
from pai_storage.events import StoreWarning
from pai_storage.runtime import parse_json_text
from pai_storage.snapshots import Snapshot, SnapshotDraft, SnapshotInfo, SnapshotStore

from .runtime import PURGE_BATCH, PgRuntimeStore, micros

if TYPE_CHECKING:
    from .schema import Tables

__all__ = ["MAX_SNAPSHOT_BYTES", "PostgresSnapshotStore", "ddl"]

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
"""The largest snapshot this backend stores: 256 MiB.

PostgreSQL's own ceiling for one ``bytea`` value is 1 GiB, but a value is
sent, stored and returned whole (the server and the driver each hold it in
memory, escaped or not): 256 MiB keeps one operation's memory bounded."""

_NOW = "COALESCE($1::timestamptz, date_trunc('milliseconds', clock_timestamp()))"
"""The store's clock: the test clock when set, else the server's, in whole ms.

Always parameter ``$1``; as a scalar sub-select it is evaluated once per statement."""

_LIVE = f"(expires_at IS NULL OR expires_at > (SELECT {_NOW}))"


class Names(Protocol):
    """The table names this module needs (:class:`~pai_storage_postgres.schema.Tables`)."""

    @property
    def snapshots(self) -> str: ...

    def index(self, component: str, suffix: str) -> str: ...


def ddl(tables: Names) -> list[str]:
    """Idempotent DDL for the snapshot table and its indexes."""
    s = tables.snapshots
    return [
        f"""CREATE TABLE IF NOT EXISTS {s} (
            scope bytea NOT NULL,
            snapshot_id bytea NOT NULL,
            created_at timestamptz NOT NULL,
            expires_at timestamptz,
            size bigint NOT NULL,
            sha256 text NOT NULL,
            metadata text NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (scope, snapshot_id))""",
        f"ALTER TABLE {s} ALTER COLUMN data SET STORAGE EXTERNAL",
        f"CREATE INDEX IF NOT EXISTS {tables.index('snapshots', '_newest')} ON {s} "
        "(scope, created_at DESC, snapshot_id DESC)",
        f"CREATE INDEX IF NOT EXISTS {tables.index('snapshots', '_expiry')} ON {s} "
        "(expires_at) WHERE expires_at IS NOT NULL",
    ]


class Statements:
    """Every statement of the store, for one table (the EXPLAIN tests use these too)."""

    def __init__(self, table: str) -> None:
        info = "snapshot_id, created_at, expires_at, size, sha256, metadata"
        self.put = f"""INSERT INTO {table} AS s
            (scope, snapshot_id, created_at, expires_at, size, sha256, metadata, data)
            SELECT $2, $3, n.t, n.t + $4::bigint * interval '1 microsecond', $5, $6, $7, $8
            FROM (SELECT {_NOW} AS t) AS n
            ON CONFLICT (scope, snapshot_id) DO UPDATE SET
                created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
                size = EXCLUDED.size, sha256 = EXCLUDED.sha256,
                metadata = EXCLUDED.metadata, data = EXCLUDED.data
            RETURNING created_at"""
        self.get = (
            f"SELECT {info}, data FROM {table} WHERE scope = $2 AND snapshot_id = $3 AND {_LIVE}"
        )
        self.latest = (
            f"SELECT {info}, data FROM {table} WHERE scope = $2 AND {_LIVE} "
            "ORDER BY created_at DESC, snapshot_id DESC LIMIT 1"
        )
        self.list_first = (
            f"SELECT {info} FROM {table} WHERE scope = $2 AND {_LIVE} "
            "ORDER BY created_at DESC, snapshot_id DESC LIMIT $3"
        )
        self.list_after = (
            f"SELECT {info} FROM {table} WHERE scope = $2 AND {_LIVE} "
            "AND (created_at, snapshot_id) < ($3, $4) "
            "ORDER BY created_at DESC, snapshot_id DESC LIMIT $5"
        )
        self.delete = f"DELETE FROM {table} WHERE scope = $2 AND snapshot_id = $3 RETURNING {_LIVE}"
        # The scopes holding a live snapshot, after $2, one index probe each:
        # each step jumps to the first live row of a greater scope.
        step = f"SELECT scope FROM {table} WHERE scope > {{}} AND {_LIVE} ORDER BY scope LIMIT 1"
        self.scopes = (
            "WITH RECURSIVE w(scope, step) AS ("
            f"(SELECT x.scope, 1 FROM ({step.format('$2')}) AS x) UNION ALL "
            f"SELECT nx.scope, w.step + 1 FROM w CROSS JOIN LATERAL ({step.format('w.scope')}) "
            "AS nx WHERE w.step < $3) SELECT scope FROM w"
        )
        self.purge = f"""DELETE FROM {table} AS s USING (
                SELECT scope, snapshot_id FROM {table}
                WHERE expires_at <= (SELECT {_NOW})
                ORDER BY expires_at LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED) AS d
            WHERE s.scope = d.scope AND s.snapshot_id = d.snapshot_id"""


class PostgresSnapshotStore(PgRuntimeStore, SnapshotStore):
    """Snapshots in a PostgreSQL table, sharing the pool of a ``connect()`` call.

    Every operation is one statement (``put`` one statement in a transaction,
    so a connection lost before its ``COMMIT`` wrote nothing). Expiry is judged
    on the server's clock at read time (``clock_timestamp()``, in whole
    milliseconds), or on the test ``clock``. Snapshots over
    :data:`MAX_SNAPSHOT_BYTES` (256 MiB) are refused before anything is sent.

    Takes the parameters of :class:`~pai_storage_postgres.runtime.PgRuntimeStore`
    (``url``, ``client``, the pool and table options) and the
    options of :class:`~pai_storage.snapshots.SnapshotStore` (``clock``,
    ``on_warning``, ``token_secret``, ``snapshot_ttl``).
    """

    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})
    max_snapshot_bytes: ClassVar[int | None] = MAX_SNAPSHOT_BYTES
    _repr_format = "{name}({url!r}, table={tables.snapshots})"

    def _use_tables(self, tables: Tables) -> None:
        self._sql = Statements(tables.snapshots)

    # ------------------------------------------------------------ hooks

    async def _put(self, draft: SnapshotDraft) -> SnapshotInfo:
        ttl = None if self.snapshot_ttl is None else micros(self.snapshot_ttl)
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("write", runtime=True):
                tx = conn.transaction()
                await tx.start()
                try:
                    created_at = await conn.fetchval(
                        self._sql.put,
                        self.now(),
                        draft.scope.encode(),
                        draft.snapshot_id.encode(),
                        ttl,
                        draft.size,
                        draft.sha256,
                        draft.metadata_json,
                        draft.data,
                    )
                except Exception:
                    with contextlib.suppress(Exception):  # a lost connection rolls back anyway
                        await tx.rollback()
                    raise
            with self._client.errors("commit", runtime=True):
                await tx.commit()
        return draft.info(created_at, self.snapshot_expiry(created_at))

    async def _get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                row = await conn.fetchrow(
                    self._sql.get, self.now(), scope.encode(), snapshot_id.encode()
                )
        return None if row is None else await self._snapshot(scope, row)

    async def _latest(self, scope: str) -> Snapshot | None:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                row = await conn.fetchrow(self._sql.latest, self.now(), scope.encode())
        return None if row is None else await self._snapshot(scope, row)

    async def _list(
        self, scope: str, after: tuple[datetime, str] | None, limit: int
    ) -> builtins.list[SnapshotInfo]:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                if after is None:
                    rows = await conn.fetch(self._sql.list_first, self.now(), scope.encode(), limit)
                else:
                    rows = await conn.fetch(
                        self._sql.list_after,
                        self.now(),
                        scope.encode(),
                        after[0],
                        after[1].encode(),
                        limit,
                    )
        infos = []
        for row in rows:
            info = await self._info(scope, row)
            if info is not None:
                infos.append(info)
        return infos

    async def _delete(self, scope: str, snapshot_id: str) -> bool:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("commit", runtime=True):  # one autocommit statement
                live = await conn.fetchval(
                    self._sql.delete, self.now(), scope.encode(), snapshot_id.encode()
                )
        return live is True

    async def _erase_scope(self, scope: str) -> int:
        statement = f"DELETE FROM {self.tables.snapshots} WHERE scope = $1"  # expired ones too
        return await self._delete_rows(statement, scope.encode())

    async def _purge_expired(self) -> int:
        return await self._purge_batches(self._sql.purge)

    async def _list_scopes(self, after: str | None, limit: int) -> builtins.list[str]:
        start = b"" if after is None else after.encode()  # every scope is longer
        scopes: builtins.list[str] = []
        async with self._client.connection(self._pool, runtime=True) as conn:
            while True:  # again past a scope that does not decode, so only a last page is short
                wanted = limit - len(scopes)
                with self._client.errors("read", runtime=True):
                    rows = await conn.fetch(self._sql.scopes, self.now(), start, wanted)
                for row in rows:
                    start = bytes(row["scope"])
                    try:
                        scopes.append(start.decode())
                    except UnicodeDecodeError:
                        await self.warn(
                            StoreWarning(
                                kind="invalid_record",
                                reason="a stored snapshot scope does not decode",
                            )
                        )
                if len(rows) < wanted or len(scopes) == limit:
                    return scopes

    # ------------------------------------------------------------ rows

    async def _info(self, scope: str, row: Any) -> SnapshotInfo | None:
        """The row's info, or ``None`` (reported) when its id or metadata do not decode."""
        try:
            metadata = parse_json_text(row["metadata"])
            if type(metadata) is not dict:
                raise ValueError("metadata is not a JSON object")
            snapshot_id = bytes(row["snapshot_id"]).decode()
        except (ValueError, UnicodeDecodeError):
            await self.warn(
                StoreWarning(
                    kind="invalid_record",
                    reason="stored snapshot metadata or id does not decode",
                    scope_key=scope,
                )
            )
            return None
        return SnapshotInfo.model_construct(
            scope=scope,
            snapshot_id=snapshot_id,
            size=int(row["size"]),
            sha256=row["sha256"],
            metadata=metadata,
            created_at=row["created_at"],
            expires_at=row["expires_at"],
        )

    async def _snapshot(self, scope: str, row: Any) -> Snapshot:
        info = await self._info(scope, row)
        if info is None:
            raise CorruptSnapshotError(
                f"a stored snapshot of scope {scope!r} is damaged (its metadata does not "
                "decode) and was not returned"
            )
        return Snapshot.model_construct(info=info, data=bytes(row["data"]))
