"""The PostgreSQL agent-state store: sessions, states and list items as rows.

Three tables (``docs/postgres.md``): ``<state>`` has one row per session
``(user_key, session_id)`` with its ``expires_at``; ``<state>_values`` one row
per state key with its kind, and either the value's canonical JSON text and
version or the list's length and content hash; ``<state>_items`` one row per
list item, keyed by position. An append inserts only the new item rows and
moves the list head; a rewrite deletes and re-inserts.

Every write is one transaction: a first statement refreshes the session's
expiry and locks its row (and reports whether the session had expired, whose
states are then cleared: a new, empty session), then the write itself is one
conditional statement (``... WHERE version = $n``, ``ON CONFLICT DO NOTHING``,
``... WHERE length = $n AND hash = $h``); when it writes nothing the
transaction is rolled back, so a failed condition changes nothing, the
session's expiry included. Reads filter on the session's ``expires_at``
against the same clock, so expiry is exact.

Enumeration (the ``enumerate`` capability, for a copy of the runtime stores)
walks the sessions' primary key in pages: the anonymous user first, then real
user ids by code point, each page one to three ordered range scans.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pai_storage.backend import ENUMERATE, AgentStateStore, ListHead, ListWrite, SessionKey
from pai_storage.state import (
    ANONYMOUS_USER,
    StaleVersion,
    StoredKind,
    VersionedState,
    session_ranges,
)

from .runtime import MAX_VALUE_BYTES, PURGE_BATCH, PgRuntimeStore

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

    from .schema import Tables

__all__ = ["PURGE_BATCH", "PostgresAgentStateStore", "ddl"]


NOW = "COALESCE($1::timestamptz, date_trunc('milliseconds', clock_timestamp()))"


class Names(Protocol):
    """The names this module needs (:class:`~pai_storage_postgres.schema.Tables` has them)."""

    @property
    def state_sessions(self) -> str: ...

    @property
    def state_values(self) -> str: ...

    @property
    def state_items(self) -> str: ...

    def index(self, component: str, suffix: str) -> str: ...


def ddl(tables: Names) -> list[str]:
    """Idempotent DDL for the three agent-state tables and the expiry index."""
    s, v, i = tables.state_sessions, tables.state_values, tables.state_items
    key = 'user_key text COLLATE "C" NOT NULL, session_id text COLLATE "C" NOT NULL'
    return [
        f"""CREATE TABLE IF NOT EXISTS {s} (
            {key},
            expires_at timestamptz,
            PRIMARY KEY (user_key, session_id))""",
        f"CREATE INDEX IF NOT EXISTS {tables.index('state', '_expiry')} ON {s} (expires_at) "
        "WHERE expires_at IS NOT NULL",
        f"""CREATE TABLE IF NOT EXISTS {v} (
            {key},
            key text COLLATE "C" NOT NULL,
            is_list boolean NOT NULL,
            value text,
            version bigint,
            length bigint,
            hash text,
            PRIMARY KEY (user_key, session_id, key),
            FOREIGN KEY (user_key, session_id) REFERENCES {s} ON DELETE CASCADE)""",
        f"""CREATE TABLE IF NOT EXISTS {i} (
            {key},
            key text COLLATE "C" NOT NULL,
            position bigint NOT NULL,
            value text NOT NULL,
            PRIMARY KEY (user_key, session_id, key, position),
            FOREIGN KEY (user_key, session_id, key) REFERENCES {v} ON DELETE CASCADE)""",
    ]


class Statements:
    """Every SQL statement of the store, built once per set of tables."""

    def __init__(self, tables: Names) -> None:
        s, v, i = tables.state_sessions, tables.state_values, tables.state_items
        head = f"WITH n AS (SELECT {NOW} AS t) "
        live = "(s.expires_at IS NULL OR s.expires_at > n.t)"
        # $2 user, $3 session, $4 the session TTL in ms (NULL: forever). Locks the
        # session row; ``stale``: it existed and had expired (its states must go).
        self.touch = (
            f"{head}, old AS (SELECT expires_at FROM {s} WHERE user_key = $2 "
            "AND session_id = $3 FOR UPDATE) "
            f"INSERT INTO {s} AS s (user_key, session_id, expires_at) "
            # Joined here so the lock is taken (and the old expiry read) before
            # the upsert touches the row; RETURNING reads the same materialized rows.
            "SELECT $2, $3, n.t + $4::bigint * interval '1 ms' FROM n LEFT JOIN old ON true "
            "ON CONFLICT (user_key, session_id) DO UPDATE SET expires_at = EXCLUDED.expires_at "
            "RETURNING EXISTS (SELECT 1 FROM old, n WHERE old.expires_at <= n.t) AS stale"
        )
        self.clear = f"DELETE FROM {v} WHERE user_key = $1 AND session_id = $2"
        vkey = "user_key = $1 AND session_id = $2 AND key = $3"
        self.kind = f"SELECT is_list, version FROM {v} WHERE {vkey}"
        self.save_any = (
            f"INSERT INTO {v} AS v (user_key, session_id, key, is_list, value, version) "
            "VALUES ($1, $2, $3, false, $4, 1) ON CONFLICT (user_key, session_id, key) "
            "DO UPDATE SET value = EXCLUDED.value, version = v.version + 1 "
            "WHERE NOT v.is_list RETURNING v.version"
        )
        self.save_new = (
            f"INSERT INTO {v} (user_key, session_id, key, is_list, value, version) "
            "VALUES ($1, $2, $3, false, $4, 1) ON CONFLICT (user_key, session_id, key) "
            "DO NOTHING RETURNING version"
        )
        self.save_at = (
            f"UPDATE {v} SET value = $4, version = version + 1 WHERE {vkey} "
            "AND NOT is_list AND version = $5 RETURNING version"
        )
        self.list_new = (
            f"INSERT INTO {v} (user_key, session_id, key, is_list, length, hash) "
            "VALUES ($1, $2, $3, true, $4, $5) ON CONFLICT (user_key, session_id, key) "
            "DO NOTHING RETURNING length"
        )
        self.list_at = (
            f"UPDATE {v} SET length = $4, hash = $5 WHERE {vkey} AND is_list "
            "AND length = $6 AND hash = $7 RETURNING length"
        )
        self.items_clear = f"DELETE FROM {i} WHERE {vkey}"
        self.items_add = (
            f"INSERT INTO {i} (user_key, session_id, key, position, value) "
            "SELECT $1, $2, $3, $4 + g.ord - 1, g.v FROM unnest($5::text[]) "
            "WITH ORDINALITY AS g(v, ord)"
        )
        joined = (
            f"FROM {v} AS x JOIN {s} AS s ON s.user_key = x.user_key "
            "AND s.session_id = x.session_id, n WHERE x.user_key = $2 AND x.session_id = $3 "
            f"AND x.key = $4 AND {live}"
        )
        self.get = f"{head}SELECT x.is_list, x.value, x.version, x.length, x.hash {joined}"
        self.get_list = (
            f"{head}SELECT x.is_list, CASE WHEN x.is_list THEN ARRAY(SELECT it.value "
            f"FROM {i} AS it WHERE it.user_key = x.user_key AND it.session_id = x.session_id "
            f"AND it.key = x.key ORDER BY it.position) END AS items {joined}"
        )
        self.exists = (
            f"{head}SELECT EXISTS (SELECT 1 FROM {s} AS s, n WHERE s.user_key = $2 "
            f"AND s.session_id = $3 AND {live} AND EXISTS (SELECT 1 FROM {v} AS x "
            "WHERE x.user_key = s.user_key AND x.session_id = s.session_id))"
        )
        self.delete = (
            f"{head}DELETE FROM {s} AS s USING n WHERE s.user_key = $2 AND s.session_id = $3 "
            f"RETURNING {live} AS live"
        )
        self.lock = (
            f"{head}SELECT {live} AS live FROM {s} AS s, n WHERE s.user_key = $2 "
            "AND s.session_id = $3 FOR UPDATE OF s"
        )
        self.delete_key = f"DELETE FROM {v} WHERE {vkey}"
        self.drop_empty = (
            f"DELETE FROM {s} WHERE user_key = $1 AND session_id = $2 "
            f"AND NOT EXISTS (SELECT 1 FROM {v} WHERE user_key = $1 AND session_id = $2)"
        )
        self.refresh = (
            f"{head}UPDATE {s} AS s SET expires_at = n.t + $4::bigint * interval '1 ms' "
            "FROM n WHERE s.user_key = $2 AND s.session_id = $3"
        )
        self.sessions = (
            f"{head}SELECT s.session_id FROM {s} AS s, n WHERE s.user_key = $2 "
            f"AND s.session_id > $3 AND {live} ORDER BY s.user_key, s.session_id LIMIT $4"
        )
        self.sessions_first = (
            f"{head}SELECT s.session_id FROM {s} AS s, n WHERE s.user_key = $2 "
            f"AND {live} ORDER BY s.user_key, s.session_id LIMIT $3"
        )
        # Enumeration (``copy --all``): every live session in the order the
        # anonymous user first, then users by code point. The anonymous key
        # (U+001F...) sits between real user keys below U+001F and those above
        # it, so the walk is the anonymous user's range (``sessions`` above),
        # then the range below its key, then the range above it: each one
        # ordered, bounded range scan of the primary key.
        order = "ORDER BY s.user_key, s.session_id"
        self.all_below = (
            f"{head}SELECT s.user_key, s.session_id FROM {s} AS s, n "
            "WHERE (s.user_key, s.session_id) > ($2, $3) AND s.user_key < $4 "
            f"AND {live} {order} LIMIT $5"
        )
        self.all_above_first = (
            f"{head}SELECT s.user_key, s.session_id FROM {s} AS s, n "
            f"WHERE s.user_key > $2 AND {live} {order} LIMIT $3"
        )
        self.all_above = (
            f"{head}SELECT s.user_key, s.session_id FROM {s} AS s, n "
            f"WHERE (s.user_key, s.session_id) > ($2, $3) AND {live} {order} LIMIT $4"
        )
        self.session_keys = (
            f"{head}SELECT x.key, x.is_list FROM {s} AS s JOIN {v} AS x "
            "ON x.user_key = s.user_key AND x.session_id = s.session_id, n "
            f"WHERE s.user_key = $2 AND s.session_id = $3 AND {live} ORDER BY x.key"
        )
        self.purge = (
            f"{head}, d AS (SELECT user_key, session_id FROM {s}, n WHERE expires_at <= n.t "
            f"ORDER BY expires_at LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED) "
            f"DELETE FROM {s} AS s USING d, n WHERE s.user_key = d.user_key "
            "AND s.session_id = d.session_id AND s.expires_at <= n.t"
        )


class _Nothing(Exception):
    """Internal: the conditional write wrote nothing; roll the transaction back."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome


class PostgresAgentStateStore(PgRuntimeStore, AgentStateStore):
    """Agent state in PostgreSQL 13+ (asyncpg), on the shared pool of :class:`PgClient`.

    Takes the parameters of :class:`~pai_storage_postgres.runtime.PgRuntimeStore`
    (``url``, ``client``, the pool and table options) and the
    options of :class:`~pai_storage.AgentStateStore` (``clock``, ``on_warning``,
    ``token_secret``, ``session_ttl``, ``max_value_bytes``); ``max_value_bytes``
    is at most 256 MiB here.
    """

    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})
    value_bytes_limit: ClassVar[int | None] = MAX_VALUE_BYTES
    _repr_format = "{name}({url!r}, table={tables.state_sessions!r})"

    def _use_tables(self, tables: Tables) -> None:
        self.sql = Statements(tables)

    @property
    def _ttl_ms(self) -> int | None:
        ttl = self.session_ttl
        return None if ttl is None else ttl // timedelta(milliseconds=1)

    async def _write(self, session: SessionKey, key: str, apply: Any) -> Any:
        """Run ``apply(conn)`` in a transaction after refreshing the session.

        ``apply`` raises :class:`_Nothing` when its condition failed: the
        transaction is rolled back and the outcome returned.
        """
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("write", runtime=True):
                tx = conn.transaction()
                await tx.start()
                try:
                    stale = await conn.fetchval(
                        self.sql.touch, self.now(), session.user, session.session, self._ttl_ms
                    )
                    if stale:  # a write to an expired session starts a new, empty one
                        await conn.execute(self.sql.clear, session.user, session.session)
                    result = await apply(conn)
                except _Nothing as nothing:
                    await tx.rollback()
                    return nothing.outcome
                except BaseException:
                    if not conn.is_closed():
                        await tx.rollback()
                    raise
            with self._client.errors("commit", runtime=True):
                await tx.commit()
            return result

    async def _kind(self, conn: asyncpg.Connection, session: SessionKey, key: str) -> Any:
        is_list = await conn.fetchval(self.sql.kind, session.user, session.session, key)
        return None if is_list is None else StoredKind.LIST if is_list else StoredKind.VALUE

    # ------------------------------------------------------------ single values

    async def _save_value(
        self,
        session: SessionKey,
        key: str,
        value: Any,
        text: str,
        expected_version: int | None,
    ) -> int | StoredKind | StaleVersion:
        user, sid = session

        async def apply(conn: asyncpg.Connection) -> int:
            if expected_version is None:
                version = await conn.fetchval(self.sql.save_any, user, sid, key, text)
            elif expected_version == 0:
                version = await conn.fetchval(self.sql.save_new, user, sid, key, text)
            else:
                version = await conn.fetchval(
                    self.sql.save_at, user, sid, key, text, expected_version
                )
            if version is None:  # nothing written: say what is stored instead
                row = await conn.fetchrow(self.sql.kind, user, sid, key)
                if row is not None and row["is_list"]:
                    raise _Nothing(StoredKind.LIST)
                raise _Nothing(StaleVersion(0 if row is None else int(row["version"])))
            return int(version)

        result: int | StoredKind | StaleVersion = await self._write(session, key, apply)
        return result

    async def _get_value(self, session: SessionKey, key: str) -> VersionedState | StoredKind | None:
        row = await self._fetchrow(self.sql.get, session, key)
        if row is None:
            return None
        if row["is_list"]:
            return StoredKind.LIST
        return await self.stored_value(session, key, row["value"], int(row["version"]))

    # ------------------------------------------------------------ lists

    async def _list_head(self, session: SessionKey, key: str) -> ListHead | StoredKind | None:
        row = await self._fetchrow(self.sql.get, session, key)
        if row is None:
            return None
        if not row["is_list"]:
            return StoredKind.VALUE
        return ListHead(int(row["length"]), str(row["hash"]))

    async def _write_list(
        self, session: SessionKey, key: str, write: ListWrite
    ) -> bool | StoredKind:
        user, sid = session
        head, expect = write.head, write.expect

        async def apply(conn: asyncpg.Connection) -> bool:
            if expect is None:
                done = await conn.fetchval(
                    self.sql.list_new, user, sid, key, head.length, head.hash
                )
            else:
                done = await conn.fetchval(
                    self.sql.list_at,
                    user,
                    sid,
                    key,
                    head.length,
                    head.hash,
                    expect.length,
                    expect.hash,
                )
            if done is None:
                kind = await self._kind(conn, session, key)
                raise _Nothing(StoredKind.VALUE if kind is StoredKind.VALUE else False)
            start = 0
            if expect is not None and write.replace:
                await conn.execute(self.sql.items_clear, user, sid, key)
            elif expect is not None:
                start = expect.length
            if write.texts:
                await conn.execute(self.sql.items_add, user, sid, key, start, list(write.texts))
            return True

        result: bool | StoredKind = await self._write(session, key, apply)
        return result

    async def _get_list(self, session: SessionKey, key: str) -> list[Any] | StoredKind | None:
        row = await self._fetchrow(self.sql.get_list, session, key)
        if row is None:
            return None
        if not row["is_list"]:
            return StoredKind.VALUE
        return await self.stored_items(session, key, row["items"])

    # ------------------------------------------------------------ sessions

    async def _fetchrow(self, sql: str, session: SessionKey, *args: Any) -> Any:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                return await conn.fetchrow(sql, self.now(), session.user, session.session, *args)

    async def _exists(self, session: SessionKey) -> bool:
        row = await self._fetchrow(self.sql.exists, session)
        return bool(row[0])

    async def _delete(self, session: SessionKey) -> bool:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("commit", runtime=True):  # one autocommit statement
                live = await conn.fetchval(
                    self.sql.delete, self.now(), session.user, session.session
                )
        return bool(live)

    async def _delete_state(self, session: SessionKey, key: str) -> bool:
        user, sid = session
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("write", runtime=True):
                tx = conn.transaction()
                await tx.start()
                try:
                    deleted = await self._delete_key(conn, user, sid, key)
                except BaseException:
                    if not conn.is_closed():
                        await tx.rollback()
                    raise
                if not deleted:
                    await tx.rollback()
                    return False
            with self._client.errors("commit", runtime=True):
                await tx.commit()
            return True

    async def _delete_key(self, conn: asyncpg.Connection, user: str, sid: str, key: str) -> bool:
        """The statements of :meth:`_delete_state`; ``False`` when nothing was deleted."""
        live = await conn.fetchval(self.sql.lock, self.now(), user, sid)
        if not live:
            return False
        if await conn.execute(self.sql.delete_key, user, sid, key) == "DELETE 0":
            return False
        if await conn.execute(self.sql.drop_empty, user, sid) == "DELETE 0":
            await conn.execute(self.sql.refresh, self.now(), user, sid, self._ttl_ms)
        return True

    async def _list_session_ids(self, user: str, after: str | None, limit: int) -> list[str]:
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                if after is None:
                    rows = await conn.fetch(self.sql.sessions_first, self.now(), user, limit)
                else:
                    rows = await conn.fetch(self.sql.sessions, self.now(), user, after, limit)
        return [str(r["session_id"]) for r in rows]

    # ------------------------------------------------------------ enumeration

    async def _list_sessions(
        self, after: tuple[str | None, str] | None, limit: int
    ) -> list[tuple[str | None, str]]:
        # The ranges of session_ranges() in order; a page continues into the
        # next range when the current one runs out, so only a last page is short.
        found: list[tuple[str | None, str]] = []
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                now = self.now()
                for users, start in session_ranges(after):
                    left = limit - len(found)
                    if left <= 0:
                        break
                    sql, args = self._session_range(users, start)
                    rows = await conn.fetch(sql, now, *args, left)
                    if users == "anonymous":
                        found += [(None, str(r["session_id"])) for r in rows]
                    else:
                        found += [(str(r["user_key"]), str(r["session_id"])) for r in rows]
        return found

    def _session_range(self, users: str, start: SessionKey | None) -> tuple[str, tuple[str, ...]]:
        """The statement of one range of :func:`session_ranges` and its arguments
        between the clock (``$1``) and the limit (the last)."""
        if users == "anonymous":
            if start is None:
                return self.sql.sessions_first, (ANONYMOUS_USER,)
            return self.sql.sessions, (ANONYMOUS_USER, start.session)
        if users == "below":
            user, sid = ("", "") if start is None else start  # "": below every user key
            return self.sql.all_below, (user, sid, ANONYMOUS_USER)
        if start is None:
            return self.sql.all_above_first, (ANONYMOUS_USER,)
        return self.sql.all_above, (start.user, start.session)

    async def _session_keys(
        self, user_id: str | None, session_id: str
    ) -> tuple[list[str], list[str]]:
        session = SessionKey(ANONYMOUS_USER if user_id is None else user_id, session_id)
        async with self._client.connection(self._pool, runtime=True) as conn:
            with self._client.errors("read", runtime=True):
                rows = await conn.fetch(
                    self.sql.session_keys, self.now(), session.user, session.session
                )
        values = [str(r["key"]) for r in rows if not r["is_list"]]
        lists = [str(r["key"]) for r in rows if r["is_list"]]
        return values, lists

    async def _erase_scope(self, user: str) -> int:
        # Expired sessions too; their values and list items go by ON DELETE CASCADE.
        statement = f"DELETE FROM {self.tables.state_sessions} WHERE user_key = $1"
        return await self._delete_rows(statement, user)

    async def _purge_expired(self) -> int:
        return await self._purge_batches(self.sql.purge)
