"""The PostgreSQL execution guard: one row per held lock, fencing tokens from a sequence.

The table (``Tables.locks``, ``pai_locks`` by default) is keyed by the resource
(UTF-8 ``bytea``); an index on ``expires_at`` serves ``purge_expired``. Every
primitive is one statement judged on the server's clock
(``clock_timestamp()`` in whole milliseconds, or the test clock):

- acquire: ``INSERT ... ON CONFLICT (resource) DO UPDATE ... WHERE`` the
  stored lock has expired, so of concurrent acquisitions exactly one wins;
- renew and release: ``UPDATE`` / ``DELETE`` where the stored token is the
  caller's;
- fencing tokens: ``nextval`` of the sequence ``<locks>_fencing``, which purges
  never reset. An acquisition first takes a transaction advisory lock keyed by
  the resource and only then draws its token, so no acquisition of the same
  resource can start, win and be released between the draw and the insert: a
  holder's token is always greater than every earlier holder's.

See ``docs/postgres.md``.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from pai_storage.guard import ExecutionGuard, LockInfo

from .runtime import PURGE_BATCH, PgRuntimeStore, micros

if TYPE_CHECKING:
    from .schema import Tables

__all__ = ["PostgresExecutionGuard", "ddl"]

_NOW = "COALESCE($1::timestamptz, date_trunc('milliseconds', clock_timestamp()))"
"""The guard's clock: the test clock when set, else the server's, in whole ms (always ``$1``)."""

_LEASE_END = "date_trunc('milliseconds', n.t + $2::bigint * interval '1 microsecond')"
"""``now + lease_ttl`` in whole ms; the lease (``$2``) in microseconds: no calendar arithmetic."""


class Names(Protocol):
    """The table names this module needs (:class:`~pai_storage_postgres.schema.Tables`)."""

    @property
    def locks(self) -> str: ...

    def table(self, component: str, suffix: str = "") -> str: ...

    def index(self, component: str, suffix: str) -> str: ...


def sequence(tables: Names) -> str:
    """The qualified name of the fencing-token sequence."""
    return tables.table("guard", "_fencing")


def ddl(tables: Names) -> list[str]:
    """Idempotent DDL for the fencing sequence, the lock table and its index."""
    locks = tables.locks
    return [
        f"CREATE SEQUENCE IF NOT EXISTS {sequence(tables)} AS bigint MINVALUE 1 NO CYCLE",
        f"""CREATE TABLE IF NOT EXISTS {locks} (
            resource bytea PRIMARY KEY,
            token text NOT NULL,
            owner text NOT NULL,
            fencing_token bigint NOT NULL,
            acquired_at timestamptz NOT NULL,
            expires_at timestamptz NOT NULL)""",
        f"CREATE INDEX IF NOT EXISTS {tables.index('guard', '_expiry')} ON {locks} (expires_at)",
    ]


class Statements:
    """Every statement of the guard (the EXPLAIN tests use these too)."""

    def __init__(self, tables: Names) -> None:
        locks = tables.locks
        seq = "'" + sequence(tables).replace("'", "''") + "'"
        self.acquire = f"""INSERT INTO {locks} AS l
                (resource, token, owner, fencing_token, acquired_at, expires_at)
            SELECT $3, $4, $5, nextval({seq}), n.t, {_LEASE_END}
            FROM (SELECT {_NOW} AS t, pg_advisory_xact_lock($6::bigint) AS held
                  OFFSET 0) AS n
            ON CONFLICT (resource) DO UPDATE SET
                token = EXCLUDED.token, owner = EXCLUDED.owner,
                fencing_token = nextval({seq}),
                acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
            WHERE l.expires_at <= EXCLUDED.acquired_at
            RETURNING fencing_token, acquired_at, expires_at"""
        self.renew = f"""UPDATE {locks} AS l SET expires_at = {_LEASE_END}
            FROM (SELECT {_NOW} AS t) AS n
            WHERE l.resource = $3 AND l.token = $4 AND l.expires_at > n.t
            RETURNING l.expires_at"""
        self.release = (
            f"DELETE FROM {locks} WHERE resource = $2 AND token = $3 "
            f"RETURNING expires_at > (SELECT {_NOW})"
        )
        self.inspect = (
            f"SELECT owner, fencing_token, acquired_at, expires_at FROM {locks} "
            f"WHERE resource = $2 AND expires_at > (SELECT {_NOW})"
        )
        self.purge = f"""DELETE FROM {locks} AS l USING (
                SELECT resource FROM {locks} WHERE expires_at <= (SELECT {_NOW})
                ORDER BY expires_at LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED) AS d
            WHERE l.resource = d.resource"""


class PostgresExecutionGuard(PgRuntimeStore, ExecutionGuard):
    """Locks in a PostgreSQL table, sharing the pool of a ``connect()`` call.

    Each primitive is one autocommit statement: a connection lost while it
    ran raises :class:`~pai_storage.errors.OutcomeUnknownError` (for
    ``acquire``, the lock may be held until its lease ends).

    Takes the parameters of :class:`~pai_storage_postgres.runtime.PgRuntimeStore`
    (``url``, ``client``, the pool and table options) and the
    options of :class:`~pai_storage.guard.ExecutionGuard` (``lock_timeout``,
    ``lease_ttl``, ``retry_interval``, ``clock``, ``on_warning``,
    ``token_secret``).
    """

    _repr_format = "{name}({url!r}, table={tables.locks})"

    def _use_tables(self, tables: Tables) -> None:
        self._sql = Statements(tables)

    def _lock_key(self, resource: bytes) -> int:
        """The transaction advisory-lock key that serializes acquisitions of ``resource``."""
        digest = hashlib.sha256(self.tables.locks.encode() + b"\x00" + resource).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    async def _one(self, sql: str, *args: Any) -> Any:
        """The first row of one autocommit statement (``None`` when there is none)."""
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("commit", runtime=True):
                return await conn.fetchrow(sql, self.now(), *args)

    # ------------------------------------------------------------ primitives

    async def _acquire(
        self, resource: str, owner: str, token: str, lease_ttl: timedelta
    ) -> LockInfo | None:
        key = resource.encode()
        row = await self._one(
            self._sql.acquire, micros(lease_ttl), key, token, owner, self._lock_key(key)
        )
        if row is None:
            return None
        return LockInfo.model_construct(
            resource=resource,
            owner=owner,
            fencing_token=int(row["fencing_token"]),
            acquired_at=row["acquired_at"],
            expires_at=row["expires_at"],
        )

    async def _renew(self, resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
        row = await self._one(self._sql.renew, micros(lease_ttl), resource.encode(), token)
        return None if row is None else row["expires_at"]

    async def _release(self, resource: str, token: str) -> bool:
        row = await self._one(self._sql.release, resource.encode(), token)
        return row is not None and row[0] is True

    async def _inspect(self, resource: str) -> LockInfo | None:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                row = await conn.fetchrow(self._sql.inspect, self.now(), resource.encode())
        if row is None:
            return None
        return LockInfo.model_construct(
            resource=resource,
            owner=row["owner"],
            fencing_token=int(row["fencing_token"]),
            acquired_at=row["acquired_at"],
            expires_at=row["expires_at"],
        )

    async def _purge_expired(self) -> int:
        return await self._purge_batches(self._sql.purge)
