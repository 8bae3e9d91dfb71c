"""The SQL execution guard: one row per held lock, fencing tokens from a counter row.

The lock table (``<prefix>_locks``, ``pai_locks`` by default) is keyed by the
SHA-256 of the resource (UTF-8), with the resource stored beside it; an index
on ``expires_at`` serves ``purge_expired``. The counter table
(``<prefix>_locks_fencing``) has one row holding the last fencing token
handed out; purges never touch it. Every primitive is one transaction judged
on the store's clock, read inside it (MariaDB/MySQL ``UTC_TIMESTAMP(6)`` of
the server, in whole milliseconds; SQLite, which has no server, the clock of
the process; or the test clock):

- acquire: first the counter row is incremented (an upsert, which locks it:
  acquisitions of the store run one at a time from here to their commit),
  then the lock row is read with a locking read; when it holds an unexpired
  lock the transaction is rolled back (no token is used up) and the answer
  is "busy"; otherwise one upsert writes the new lock with the counter's
  value as its fencing token. A later acquisition reads the counter only
  after this one committed, so fencing tokens strictly increase in the order
  locks are granted;
- renew and release: one ``UPDATE`` / ``DELETE`` whose ``WHERE`` names the
  caller's token and an unexpired lease.

See ``docs/sql.md``, "Runtime stores".
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, and_, bindparam, delete, select, update
from sqlalchemy.dialects import mysql, sqlite

from pai_storage.fields import truncate_ms
from pai_storage.guard import ExecutionGuard, LockInfo

from .runtime_support import SqlRuntimeStore
from .runtime_tables import RuntimeTables, digest

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["SqlExecutionGuard"]

_COUNTER = 1
"""The ``id`` of the fencing counter's one row."""


class SqlExecutionGuard(SqlRuntimeStore, ExecutionGuard):
    """Locks in SQLite or MariaDB/MySQL (SQLAlchemy Core), on a shared :class:`SqlClient`.

    Takes the parameters of :class:`~pai_storage_sql.runtime_support.SqlRuntimeStore`
    (``url``, ``client``, the client's options) and the options of
    :class:`~pai_storage.guard.ExecutionGuard` (``lock_timeout``,
    ``lease_ttl``, ``retry_interval``, ``clock``, ``on_warning``,
    ``token_secret``).
    """

    def _use_tables(self, tables: RuntimeTables) -> None:
        self.table = tables.locks
        self.counter = tables.fencing

    def _key(self, resource: str) -> ColumnElement[bool]:
        return self.table.c.resource_hash == digest(resource.encode())

    # ------------------------------------------------------------ primitives

    async def _acquire(
        self, resource: str, owner: str, token: str, lease_ttl: timedelta
    ) -> LockInfo | None:
        t, f = self.table, self.counter

        changed = ("resource", "token", "owner", "fencing_token", "acquired_at", "expires_at")

        def build_bump() -> Any:
            if self._db.mysql:
                bump: Any = mysql.insert(f).values(id=_COUNTER, value=1)
                return bump.on_duplicate_key_update(value=f.c.value + 1)
            bump = sqlite.insert(f).values(id=_COUNTER, value=1)
            return bump.on_conflict_do_update(
                index_elements=[f.c.id], set_={"value": f.c.value + 1}
            )

        def build_held() -> Any:
            held = select(t.c.expires_at).where(t.c.resource_hash == bindparam("resource_hash"))
            return held.with_for_update() if self._db.mysql else held

        def build_upsert() -> Any:
            row = {
                name: bindparam(f"v_{name}", type_=t.c[name].type)
                for name in ("resource_hash", *changed)
            }
            if self._db.mysql:
                ins = mysql.insert(t).values(row)
                return ins.on_duplicate_key_update([(c, ins.inserted[c]) for c in changed])
            lite = sqlite.insert(t).values(row)
            return lite.on_conflict_do_update(
                index_elements=[t.c.resource_hash],
                set_={c: lite.excluded[c] for c in changed},
            )

        async def write(conn: AsyncConnection) -> LockInfo | None:
            now = await self._db.now(conn, self)
            # The counter row first: from here to the commit this acquisition is
            # the only one of the store.
            await conn.execute(self._db.statement("bump", build_bump))
            counter = self._db.statement(
                "counter", lambda: select(f.c.value).where(f.c.id == _COUNTER)
            )
            fencing = int((await conn.execute(counter)).scalar_one())
            resource_hash = digest(resource.encode())
            current = (
                await conn.execute(
                    self._db.statement("held", build_held), {"resource_hash": resource_hash}
                )
            ).first()
            if current is not None and current.expires_at > now:
                await conn.rollback()  # busy: nothing written, no token used up
                return None
            expires = truncate_ms(now + lease_ttl)
            row = {
                "resource_hash": resource_hash,
                "resource": resource.encode(),
                "token": bytes.fromhex(token),
                "owner": owner.encode(),
                "fencing_token": fencing,
                "acquired_at": now,
                "expires_at": expires,
            }
            await conn.execute(
                self._db.statement("acquire", build_upsert),
                {f"v_{name}": value for name, value in row.items()},
            )
            return LockInfo.trusted(
                {
                    "resource": resource,
                    "owner": owner,
                    "fencing_token": fencing,
                    "acquired_at": now,
                    "expires_at": expires,
                }
            )

        return await self._db.write(write)

    async def _renew(self, resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
        t = self.table

        async def write(conn: AsyncConnection) -> datetime | None:
            now = await self._db.now(conn, self)
            expires = truncate_ms(now + lease_ttl)
            done = await conn.execute(
                update(t)
                .where(self._key(resource), t.c.token == bytes.fromhex(token), t.c.expires_at > now)
                .values(expires_at=expires)
            )
            return expires if done.rowcount == 1 else None

        return await self._db.write(write)

    async def _release(self, resource: str, token: str) -> bool:
        t = self.table

        def build() -> Any:
            return delete(t).where(
                t.c.resource_hash == bindparam("resource_hash"),
                t.c.token == bindparam("token"),
                t.c.expires_at > self._now_param(),
            )

        async def write(conn: AsyncConnection) -> bool:
            now = await self._db.now(conn, self)
            params = {
                "resource_hash": digest(resource.encode()),
                "token": bytes.fromhex(token),
                "now": now,
            }
            live = await conn.execute(self._db.statement("release", build), params)
            if live.rowcount > 0:
                return True
            mine = and_(self._key(resource), t.c.token == bytes.fromhex(token))
            await conn.execute(delete(t).where(mine))  # expired: no longer held
            return False

        return await self._db.write(write)

    async def _inspect(self, resource: str) -> LockInfo | None:
        t = self.table

        async def read(conn: AsyncConnection) -> Any:
            now = self._db.clock(self)
            query = select(
                t.c.resource, t.c.owner, t.c.fencing_token, t.c.acquired_at, t.c.expires_at
            ).where(self._key(resource), t.c.expires_at > now)
            return (await conn.execute(query)).first()

        row = await self._db.read(read)
        if row is None or bytes(row.resource) != resource.encode():
            return None
        return LockInfo.trusted(
            {
                "resource": resource,
                "owner": bytes(row.owner).decode(),
                "fencing_token": int(row.fencing_token),
                "acquired_at": row.acquired_at,
                "expires_at": row.expires_at,
            }
        )
