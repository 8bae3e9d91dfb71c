"""The SQL agent-state store: sessions, states and list items as rows.

Three tables (``docs/sql.md``, "Runtime stores"): ``<state>`` has one row per
session with an auto-increment ``id``, its ordered key ``user || 0x00 ||
session`` (split into an indexed head and a hashed tail like the key-value
sort key) and ``expires_at``; ``<state>_values`` one row per state key (found
by the SHA-256 of the key) with its kind and either the value's canonical
JSON and version or the list's length and content hash; ``<state>_items`` one
row per list item, keyed ``(value_id, position)``. An append inserts only the
new item rows and moves the list head; a rewrite deletes and re-inserts.

Every write is one transaction that first takes the session row: an insert
that leaves an existing row as it is (SQLite ``ON CONFLICT DO NOTHING``;
MariaDB/MySQL ``ON DUPLICATE KEY UPDATE``, which locks the row), then a
locking read of it. Writes to one session therefore run one at a time; a
write to an expired session first clears its states (a new, empty session).
The write itself is then one conditional statement (``UPDATE ... WHERE
version = n``, ``... WHERE length = n AND hash = h``, or an ``INSERT`` of an
absent key); when its condition fails the transaction is rolled back, so a
failed condition changes nothing, the session's expiry included. Reads filter
on the session's ``expires_at`` against the same clock, so expiry is exact.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    delete,
    exists,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import mysql, sqlite

from pai_storage.backend import ENUMERATE, AgentStateStore, ListHead, ListWrite, SessionKey
from pai_storage.errors import InvalidInputError
from pai_storage.state import (
    ANONYMOUS_USER,
    StaleVersion,
    StoredKind,
    VersionedState,
    session_ranges,
)

from .runtime_support import MAX_VALUE_BYTES, SqlRuntimeStore, escaped_size, ordered_scan
from .runtime_tables import RuntimeTables, digest, join_key, split_key

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["MAX_VALUE_BYTES", "SqlAgentStateStore"]


def _session_key(session: SessionKey) -> bytes:
    return session.user.encode() + b"\x00" + session.session.encode()


class SqlAgentStateStore(SqlRuntimeStore, AgentStateStore):
    """Agent state in SQLite or MariaDB/MySQL (SQLAlchemy Core), on a shared :class:`SqlClient`.

    Takes the parameters of :class:`~pai_storage_sql.runtime_support.SqlRuntimeStore`
    (``url``, ``client``, the client's options) and the options of
    :class:`~pai_storage.AgentStateStore` (``clock``, ``on_warning``,
    ``token_secret``, ``session_ttl``, ``max_value_bytes``);
    ``max_value_bytes`` is at most 256 MiB here.
    """

    _main_table = "sessions"
    value_bytes_limit: ClassVar[int | None] = MAX_VALUE_BYTES
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})

    def _use_tables(self, tables: RuntimeTables) -> None:
        self.sessions = tables.state_sessions
        self.values = tables.state_values
        self.items = tables.state_items

    # ------------------------------------------------------------ statements

    def _session_params(self, session: SessionKey) -> dict[str, Any]:
        head, _, tail_hash = split_key(_session_key(session), self._db.head_bytes)
        return {"s_head": head, "s_tail_hash": tail_hash}

    def _session_bound(self) -> ColumnElement[bool]:
        """The session's row, by the parameters of :meth:`_session_params`."""
        s = self.sessions
        return and_(
            s.c.sk_head == bindparam("s_head"), s.c.sk_tail_hash == bindparam("s_tail_hash")
        )

    def _session_where(self, session: SessionKey) -> ColumnElement[bool]:
        head, _, tail_hash = split_key(_session_key(session), self._db.head_bytes)
        s = self.sessions
        return and_(s.c.sk_head == head, s.c.sk_tail_hash == tail_hash)

    def _check_packet(self, texts: tuple[str, ...] | list[str]) -> None:
        room = self._db.packet_room()
        if room is None:
            return
        for text in texts:
            size = escaped_size(text.encode())
            if size > room:
                raise InvalidInputError(
                    f"a value of {len(text.encode()):,} bytes of JSON would exceed this "
                    f"MariaDB/MySQL server's max_allowed_packet of {self._db.max_packet:,} "
                    "bytes; raise max_allowed_packet on the server or store smaller values"
                )

    async def _touch(self, conn: AsyncConnection, session: SessionKey, now: datetime) -> int:
        """Take the session row (creating it), clear it if it had expired, refresh its
        expiry; return its id. Later writes of the session wait for this transaction."""
        s = self.sessions
        head, tail, tail_hash = split_key(_session_key(session), self._db.head_bytes)
        expires = self.session_expiry(now)
        row = {"sk_head": head, "sk_tail_hash": tail_hash, "sk_tail": tail, "expires_at": expires}

        def build_insert() -> Any:
            values = {name: bindparam(f"v_{name}", type_=s.c[name].type) for name in row}
            if self._db.mysql:
                return mysql.insert(s).values(values).on_duplicate_key_update(id=s.c.id)
            return sqlite.insert(s).values(values).on_conflict_do_nothing()

        await conn.execute(
            self._db.statement("touch", build_insert), {f"v_{k}": v for k, v in row.items()}
        )

        def build_select() -> Any:
            query = select(s.c.id, s.c.expires_at).where(self._session_bound())
            return query.with_for_update() if self._db.mysql else query

        found = (
            await conn.execute(
                self._db.statement("session", build_select), self._session_params(session)
            )
        ).one()
        sid = int(found.id)
        if found.expires_at is not None and found.expires_at <= now:
            # A write to an expired session starts a new, empty one.
            await conn.execute(
                self._db.statement(
                    "clear-session",
                    lambda: delete(self.values).where(self.values.c.session_id == bindparam("sid")),
                ),
                {"sid": sid},
            )
        if found.expires_at != expires:
            await conn.execute(
                self._db.statement(
                    "session-expiry",
                    lambda: (
                        update(s)
                        .where(s.c.id == bindparam("sid"))
                        .values(expires_at=bindparam("v_expires_at", type_=s.c.expires_at.type))
                    ),
                ),
                {"sid": sid, "v_expires_at": expires},
            )
        return sid

    async def _value_row(self, conn: AsyncConnection, sid: int, key: str) -> Any:
        v = self.values
        query = self._db.statement(
            "value-row",
            lambda: select(v.c.id, v.c.is_list, v.c.version, v.c.length, v.c.hash).where(
                v.c.session_id == bindparam("sid"), v.c.key_hash == bindparam("key_hash")
            ),
        )
        params = {"sid": sid, "key_hash": digest(key.encode())}
        return (await conn.execute(query, params)).first()

    async def _joined(self, conn: AsyncConnection, session: SessionKey, key: str, now: Any) -> Any:
        """The live state row of ``key`` in the session (with its value and list head)."""
        s, v = self.sessions, self.values
        bound = isinstance(now, datetime)  # else the server's clock, in the statement

        def build() -> Any:
            return (
                select(v.c.id, v.c.is_list, v.c.value, v.c.version, v.c.length, v.c.hash)
                .select_from(v.join(s, s.c.id == v.c.session_id))
                .where(self._session_bound(), self._live(self._now_param() if bound else now))
                .where(v.c.key_hash == bindparam("key_hash"))
            )

        params = {**self._session_params(session), "key_hash": digest(key.encode())}
        if bound:
            params["now"] = now
        return (await conn.execute(self._db.statement(("joined", bound), build), params)).first()

    async def _new_value(self, conn: AsyncConnection, sid: int, key: str, **columns: Any) -> Any:
        """Insert the state row of ``key`` with ``columns``; the result (its id)."""
        # One statement per store: the columns go as parameters, so every
        # insert of the same columns runs one compiled form.
        statement = self._db.statement("new-value", lambda: insert(self.values))
        params = {"session_id": sid, "key_hash": digest(key.encode()), "key": key.encode()}
        return await conn.execute(statement, {**params, **columns})

    # ------------------------------------------------------------ single values

    async def _save_value(
        self,
        session: SessionKey,
        key: str,
        value: Any,
        text: str,
        expected_version: int | None,
    ) -> int | StoredKind | StaleVersion:
        self._check_packet([text])
        v = self.values
        data = text.encode()

        async def write(conn: AsyncConnection) -> int | StoredKind | StaleVersion:
            now = await self._db.now(conn, self)
            sid = await self._touch(conn, session, now)
            current = await self._value_row(conn, sid, key)
            outcome: StoredKind | StaleVersion
            if current is not None and current.is_list:
                outcome = StoredKind.LIST
            elif current is None:
                if expected_version not in (None, 0):
                    outcome = StaleVersion(0)
                else:
                    await self._new_value(conn, sid, key, is_list=False, value=data, version=1)
                    return 1
            elif expected_version in (None, int(current.version)):
                version = int(current.version)
                done = await conn.execute(
                    self._db.statement(
                        "save-value",
                        lambda: (
                            update(v)
                            .where(v.c.id == bindparam("vid"), v.c.version == bindparam("expected"))
                            .values(
                                value=bindparam("v_value", type_=v.c.value.type),
                                version=bindparam("v_version"),
                            )
                        ),
                    ),
                    {
                        "vid": current.id,
                        "expected": version,
                        "v_value": data,
                        "v_version": version + 1,
                    },
                )
                if done.rowcount == 1:
                    return version + 1
                won = await self._value_row(conn, sid, key)  # a racing write got there first
                if won is not None and won.is_list:
                    outcome = StoredKind.LIST
                else:
                    outcome = StaleVersion(0 if won is None else int(won.version))
            else:
                outcome = StaleVersion(int(current.version))
            await conn.rollback()  # nothing written, the session's expiry included
            return outcome

        return await self._db.write(write)

    async def _get_value(self, session: SessionKey, key: str) -> VersionedState | StoredKind | None:
        async def read(conn: AsyncConnection) -> Any:
            return await self._joined(conn, session, key, self._db.clock(self))

        row = await self._db.read(read)
        if row is None:
            return None
        if row.is_list:
            return StoredKind.LIST
        text = bytes(row.value).decode(errors="surrogateescape")
        return await self.stored_value(session, key, text, int(row.version))

    # ------------------------------------------------------------ lists

    async def _list_head(self, session: SessionKey, key: str) -> ListHead | StoredKind | None:
        async def read(conn: AsyncConnection) -> Any:
            return await self._joined(conn, session, key, self._db.clock(self))

        row = await self._db.read(read)
        if row is None:
            return None
        if not row.is_list:
            return StoredKind.VALUE
        return ListHead(int(row.length), bytes(row.hash).hex())

    async def _write_list(
        self, session: SessionKey, key: str, write: ListWrite
    ) -> bool | StoredKind:
        self._check_packet(write.texts)
        v, it = self.values, self.items
        head, expect = write.head, write.expect
        texts = [text.encode() for text in write.texts]

        async def apply(conn: AsyncConnection) -> bool | StoredKind:
            now = await self._db.now(conn, self)
            sid = await self._touch(conn, session, now)
            current = await self._value_row(conn, sid, key)
            outcome: bool | StoredKind = False
            if current is not None and not current.is_list:
                outcome = StoredKind.VALUE
            elif expect is None and current is None:
                result = await self._new_value(
                    conn, sid, key, is_list=True, length=head.length, hash=bytes.fromhex(head.hash)
                )
                inserted = result.inserted_primary_key
                assert inserted is not None
                value_id = int(inserted[0])
                await self._add_items(conn, value_id, 0, texts)
                return True
            elif (
                expect is not None
                and current is not None
                and int(current.length) == expect.length
                and bytes(current.hash).hex() == expect.hash
            ):
                done = await conn.execute(
                    self._db.statement(
                        "list-head",
                        lambda: (
                            update(v)
                            .where(
                                v.c.id == bindparam("vid"),
                                v.c.length == bindparam("expected_length"),
                                v.c.hash == bindparam("expected_hash", type_=v.c.hash.type),
                            )
                            .values(
                                length=bindparam("v_length"),
                                hash=bindparam("v_hash", type_=v.c.hash.type),
                            )
                        ),
                    ),
                    {
                        "vid": current.id,
                        "expected_length": expect.length,
                        "expected_hash": bytes.fromhex(expect.hash),
                        "v_length": head.length,
                        "v_hash": bytes.fromhex(head.hash),
                    },
                )
                if done.rowcount == 1:
                    start = expect.length
                    if write.replace:
                        await conn.execute(
                            self._db.statement(
                                "clear-list",
                                lambda: delete(it).where(it.c.value_id == bindparam("vid")),
                            ),
                            {"vid": current.id},
                        )
                        start = 0
                    await self._add_items(conn, int(current.id), start, texts)
                    return True
            await conn.rollback()  # nothing written, the session's expiry included
            return outcome

        return await self._db.write(apply)

    async def _add_items(
        self, conn: AsyncConnection, value_id: int, start: int, texts: list[bytes]
    ) -> None:
        if texts:
            rows = [
                {"value_id": value_id, "position": start + i, "value": text}
                for i, text in enumerate(texts)
            ]
            # Built once per store (a statement built per call is compiled per call).
            await conn.execute(self._db.statement("add-items", lambda: insert(self.items)), rows)

    async def _get_list(self, session: SessionKey, key: str) -> list[Any] | StoredKind | None:
        it = self.items

        async def read(conn: AsyncConnection) -> Any:
            row = await self._joined(conn, session, key, self._db.clock(self))
            if row is None or not row.is_list:
                return row, []
            query = self._db.statement(
                "list-items",
                lambda: (
                    select(it.c.value)
                    .where(it.c.value_id == bindparam("vid"))
                    .order_by(it.c.position)
                ),
            )
            return row, [bytes(r[0]) for r in await conn.execute(query, {"vid": row.id})]

        row, texts = await self._db.read(read)
        if row is None:
            return None
        if not row.is_list:
            return StoredKind.VALUE
        return await self.stored_items(
            session, key, (t.decode(errors="surrogateescape") for t in texts)
        )

    # ------------------------------------------------------------ sessions

    async def _exists(self, session: SessionKey) -> bool:
        s, v = self.sessions, self.values

        async def read(conn: AsyncConnection) -> bool:
            now = self._db.clock(self)
            query = select(s.c.id).where(
                self._session_where(session),
                self._live(now),
                exists().where(v.c.session_id == s.c.id),
            )
            return (await conn.execute(query)).first() is not None

        return await self._db.read(read)

    async def _delete(self, session: SessionKey) -> bool:
        s = self.sessions

        async def write(conn: AsyncConnection) -> bool:
            now = await self._db.now(conn, self)
            live = await conn.execute(
                delete(s).where(self._session_where(session), self._live(now))
            )
            if live.rowcount > 0:
                return True
            await conn.execute(delete(s).where(self._session_where(session)))  # expired
            return False

        return await self._db.write(write)

    async def _delete_state(self, session: SessionKey, key: str) -> bool:
        s, v = self.sessions, self.values

        async def write(conn: AsyncConnection) -> bool:
            now = await self._db.now(conn, self)
            query = select(s.c.id).where(self._session_where(session), self._live(now))
            if self._db.mysql:
                query = query.with_for_update()
            found = (await conn.execute(query)).first()
            if found is None:
                return False
            sid = int(found.id)
            gone = await conn.execute(
                delete(v).where(v.c.session_id == sid, v.c.key_hash == digest(key.encode()))
            )
            if gone.rowcount == 0:
                return False
            left = await conn.execute(select(v.c.id).where(v.c.session_id == sid).limit(1))
            if left.first() is None:
                await conn.execute(delete(s).where(s.c.id == sid))
            else:
                expires = self.session_expiry(now)
                await conn.execute(update(s).where(s.c.id == sid).values(expires_at=expires))
            return True

        return await self._db.write(write)

    async def _list_session_ids(self, user: str, after: str | None, limit: int) -> list[str]:
        s = self.sessions
        base = user.encode() + b"\x00"
        low, inclusive = base, True
        if after is not None:
            low, inclusive = base + after.encode(), False

        # A page is a range of the unique key in key order with a LIMIT; on a
        # small table MariaDB may prefer a scan and a sort, so the key is named.
        query = select(s.c.sk_head, s.c.sk_tail).with_hint(
            s, f"FORCE INDEX ({s.name}_key)", "mysql"
        )

        async def read(conn: AsyncConnection) -> list[str]:
            now = self._db.clock(self)
            rows = await ordered_scan(
                conn,
                query,
                s,
                "sk",
                self._db.head_bytes,
                low,
                inclusive,
                user.encode() + b"\x01",
                limit,
                self._live(now),
            )
            keys = [join_key(r.sk_head, r.sk_tail) for r in rows]
            return [k[len(base) :].decode() for k in keys]

        return await self._db.read(read)

    async def _erase_scope(self, user: str) -> int:
        # Every session key of the user, expired or not; values and items cascade.
        low = user.encode()
        return await self._db.erase_range(self.sessions, low + b"\x00", low + b"\x01")

    # ------------------------------------------------------------ enumeration

    async def _list_sessions(
        self, after: tuple[str | None, str] | None, limit: int
    ) -> list[tuple[str | None, str]]:
        """Live sessions in (user, session) order, the anonymous user first.

        The ranges of :func:`~pai_storage.state.session_ranges` on the session
        key (``user || 0x00 || session``), each one index range with a
        ``LIMIT`` (:func:`ordered_scan`). The stored key of ``user_id=None``
        starts with U+001F, which no real user id holds, so no real user's
        session falls inside its range.
        """
        s = self.sessions
        anonymous = ANONYMOUS_USER.encode() + b"\x00"
        anonymous_end = ANONYMOUS_USER.encode() + b"\x01"
        query = select(s.c.sk_head, s.c.sk_tail).with_hint(
            s, f"FORCE INDEX ({s.name}_key)", "mysql"
        )
        bounds: dict[str, tuple[bytes, bytes | None]] = {
            "anonymous": (anonymous, anonymous_end),
            "below": (b"", anonymous),
            "above": (anonymous_end, None),
        }
        # (low, inclusive, high) of each range still to read, in order.
        ranges: list[tuple[bytes, bool, bytes | None]] = []
        for users, start in session_ranges(after):
            low, high = bounds[users]
            if start is None:
                ranges.append((low, True, high))
            else:
                ranges.append((start.user.encode() + b"\x00" + start.session.encode(), False, high))

        async def read(conn: AsyncConnection) -> list[bytes]:
            now = self._db.clock(self)
            keys: list[bytes] = []
            for low, inclusive, high in ranges:
                rows = await ordered_scan(
                    conn,
                    query,
                    s,
                    "sk",
                    self._db.head_bytes,
                    low,
                    inclusive,
                    high,
                    limit - len(keys),
                    self._live(now),
                )
                keys += [join_key(r.sk_head, r.sk_tail) for r in rows]
                if len(keys) >= limit:
                    break
            return keys

        found: list[tuple[str | None, str]] = []
        for key in await self._db.read(read):
            user, _, session = key.partition(b"\x00")
            name = user.decode()
            found.append((None if name == ANONYMOUS_USER else name, session.decode()))
        return found

    async def _session_keys(
        self, user_id: str | None, session_id: str
    ) -> tuple[list[str], list[str]]:
        """The session's keys: one lookup of the session by its key and one index
        range of its state rows, ordered here (a session's keys come back whole)."""
        s, v = self.sessions, self.values
        session = SessionKey(ANONYMOUS_USER if user_id is None else user_id, session_id)

        async def read(conn: AsyncConnection) -> list[Any]:
            query = (
                select(v.c.key, v.c.is_list)
                .select_from(s.join(v, v.c.session_id == s.c.id))
                .where(self._session_where(session), self._live(self._db.clock(self)))
            )
            return list(await conn.execute(query))

        rows = sorted(await self._db.read(read), key=lambda r: bytes(r.key))
        values = [bytes(r.key).decode() for r in rows if not r.is_list]
        lists = [bytes(r.key).decode() for r in rows if r.is_list]
        return values, lists
