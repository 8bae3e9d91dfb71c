"""The SQL snapshot store: one row per snapshot, the data in a ``LONGBLOB``/``BLOB``.

The table (``<prefix>_snapshots``, ``pai_snapshots`` by default) is keyed by
the SHA-256 of the scope and the snapshot id (UTF-8, split into an indexed
head and a hashed tail like every ordered key, ``runtime_tables``). The index
``(scope_hash, created_at, id_head, id_tail_hash)`` serves ``list`` and
``latest`` as one backward index range scan with a ``LIMIT`` (newest first,
ties on the creation millisecond by snapshot id descending); an index on
``expires_at`` serves ``purge_expired``; an index on ``(scope_head,
expires_at)`` (the scope, on MariaDB/MySQL its first bytes) lists the scopes
in order for a copy of the store. The scope is stored beside its hash
and checked on every read.

The size limit is :data:`MAX_SNAPSHOT_BYTES` (256 MiB). On MariaDB/MySQL a
snapshot travels in one statement, so it must also fit the server's
``max_allowed_packet`` (the drivers send bytes as an escaped literal: seven
byte values take two bytes); a larger one raises
:class:`~pai_storage.errors.SnapshotTooLargeError` naming both numbers before
anything is sent. See ``docs/sql.md``, "Runtime stores".
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import ColumnElement, and_, bindparam, delete, or_, select
from sqlalchemy.dialects import mysql, sqlite

from pai_storage.backend import ENUMERATE
from pai_storage.errors import CorruptSnapshotError, SnapshotTooLargeError
from pai_storage.events import StoreWarning
from pai_storage.runtime import parse_json_text
from pai_storage.snapshots import Snapshot, SnapshotDraft, SnapshotInfo, SnapshotStore

from .runtime_support import SqlRuntimeStore, escaped_size
from .runtime_tables import RuntimeTables, digest, join_key, split_key

if TYPE_CHECKING:
    from sqlalchemy.engine import Row
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["MAX_SNAPSHOT_BYTES", "SqlSnapshotStore"]

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
"""The largest snapshot this backend stores: 256 MiB.

SQLite holds a ``BLOB`` of up to 1,000,000,000 bytes by default, MariaDB/MySQL
a ``LONGBLOB`` of 4 GiB, but a value is sent, stored and returned whole (the
driver holds it in memory, MySQL's escaped too): 256 MiB keeps one operation's
memory bounded. On MariaDB/MySQL ``max_allowed_packet`` (16 MiB by default on
MariaDB 10.11, at most 1 GiB) bounds it further."""


class SqlSnapshotStore(SqlRuntimeStore, SnapshotStore):
    """Snapshots in SQLite or MariaDB/MySQL (SQLAlchemy Core), on a shared :class:`SqlClient`.

    Every operation is one transaction; ``put`` is one upsert. Expiry is
    judged on the store's clock (MariaDB/MySQL ``UTC_TIMESTAMP``; SQLite this
    process's clock; or the test ``clock``).

    Takes the parameters of :class:`~pai_storage_sql.runtime_support.SqlRuntimeStore`
    (``url``, ``client``, the client's options) and the options of
    :class:`~pai_storage.snapshots.SnapshotStore` (``clock``, ``on_warning``,
    ``token_secret``, ``snapshot_ttl``).
    """

    max_snapshot_bytes: ClassVar[int | None] = MAX_SNAPSHOT_BYTES
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})

    def _use_tables(self, tables: RuntimeTables) -> None:
        self.table = tables.snapshots

    def _key_params(self, scope: str, snapshot_id: str) -> dict[str, Any]:
        head, _, tail_hash = split_key(snapshot_id.encode(), self._db.id_head_bytes)
        return {"scope_hash": digest(scope.encode()), "id_head": head, "id_tail_hash": tail_hash}

    def _key_bound(self) -> ColumnElement[bool]:
        """The snapshot's row, by the parameters of :meth:`_key_params`."""
        t = self.table
        return and_(
            t.c.scope_hash == bindparam("scope_hash"),
            t.c.id_head == bindparam("id_head"),
            t.c.id_tail_hash == bindparam("id_tail_hash"),
        )

    # ------------------------------------------------------------ statements

    def _key(self, scope: str, snapshot_id: str) -> ColumnElement[bool]:
        head, _, tail_hash = split_key(snapshot_id.encode(), self._db.id_head_bytes)
        t = self.table
        return and_(
            t.c.scope_hash == digest(scope.encode()),
            t.c.id_head == head,
            t.c.id_tail_hash == tail_hash,
        )

    def _columns(self, data: bool) -> list[Any]:
        t = self.table
        columns = [
            t.c.scope,
            t.c.id_head,
            t.c.id_tail,
            t.c.created_at,
            t.c.expires_at,
            t.c.size,
            t.c.sha256,
            t.c.metadata,
        ]
        return [*columns, t.c.data] if data else columns

    def _check_packet(self, draft: SnapshotDraft) -> None:
        room = self._db.packet_room()
        if room is None:
            return
        escaped = escaped_size(
            draft.data,
            draft.metadata_json.encode(),
            draft.scope.encode(),
            draft.snapshot_id.encode(),
        )
        if escaped > room:
            raise SnapshotTooLargeError(
                f"snapshot is {draft.size:,} bytes ({escaped:,} bytes with its metadata once "
                "escaped for the MariaDB/MySQL protocol), over what this server's "
                f"max_allowed_packet of {self._db.max_packet:,} bytes lets one statement "
                f"carry; raise max_allowed_packet (this backend's limit is "
                f"{MAX_SNAPSHOT_BYTES:,} bytes) or store large snapshots in another backend "
                "with a hybrid bundle: connect(url, snapshots=other_url)"
            )

    # ------------------------------------------------------------ hooks

    async def _put(self, draft: SnapshotDraft) -> SnapshotInfo:
        self._check_packet(draft)
        head, tail, tail_hash = split_key(draft.snapshot_id.encode(), self._db.id_head_bytes)

        async def write(conn: AsyncConnection) -> datetime:
            now = await self._db.now(conn, self)
            row = {
                "scope_hash": digest(draft.scope.encode()),
                "id_head": head,
                "id_tail_hash": tail_hash,
                "id_tail": tail,
                "scope": draft.scope.encode(),
                "scope_head": split_key(draft.scope.encode(), self._db.head_bytes)[0],
                "created_at": now,
                "expires_at": self.snapshot_expiry(now),
                "size": draft.size,
                "sha256": bytes.fromhex(draft.sha256),
                "metadata": draft.metadata_json.encode(),
                "data": draft.data,
            }
            await conn.execute(
                self._db.statement(("put", tuple(row)), lambda: self._upsert(tuple(row))),
                {f"v_{name}": value for name, value in row.items()},
            )
            return now

        created_at = await self._db.write(write)
        return draft.info(created_at, self.snapshot_expiry(created_at))

    def _upsert(self, names: tuple[str, ...]) -> Any:
        """The ``put`` of a row of ``names`` (parameters ``v_<column>``)."""
        t = self.table
        row = {name: bindparam(f"v_{name}", type_=t.c[name].type) for name in names}
        changed = ("created_at", "expires_at", "size", "sha256", "metadata", "data")
        if self._db.mysql:
            ins = mysql.insert(t).values(row)
            return ins.on_duplicate_key_update([(c, ins.inserted[c]) for c in changed])
        lite = sqlite.insert(t).values(row)
        return lite.on_conflict_do_update(
            index_elements=[t.c.scope_hash, t.c.id_head, t.c.id_tail_hash],
            set_={c: lite.excluded[c] for c in changed},
        )

    async def _get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        async def read(conn: AsyncConnection) -> Row[Any] | None:
            now = self._db.clock(self)
            bound = isinstance(now, datetime)  # else the server's clock, in the statement
            params = self._key_params(scope, snapshot_id)
            if bound:
                params["now"] = now

            def build() -> Any:
                clock = self._now_param() if bound else now
                return select(*self._columns(True)).where(self._key_bound(), self._live(clock))

            return (await conn.execute(self._db.statement(("get", bound), build), params)).first()

        row = await self._db.read(read)
        if row is None or bytes(row.scope) != scope.encode():
            return None
        return await self._snapshot(scope, row)

    async def _latest(self, scope: str) -> Snapshot | None:
        async def read(conn: AsyncConnection) -> builtins.list[Row[Any]]:
            return await self._scan(conn, scope, None, 1, data=True)

        rows = await self._db.read(read)
        return await self._snapshot(scope, rows[0]) if rows else None

    async def _list(
        self, scope: str, after: tuple[datetime, str] | None, limit: int
    ) -> builtins.list[SnapshotInfo]:
        async def read(conn: AsyncConnection) -> builtins.list[Row[Any]]:
            return await self._scan(conn, scope, after, limit, data=False)

        infos = []
        for row in await self._db.read(read):
            info = await self._info(scope, row)
            if info is not None:
                infos.append(info)
        return infos

    async def _scan(
        self,
        conn: AsyncConnection,
        scope: str,
        after: tuple[datetime, str] | None,
        limit: int,
        *,
        data: bool,
    ) -> builtins.list[Row[Any]]:
        """Up to ``limit`` live rows of ``scope``, newest first, strictly after ``after``.

        One backward range scan of the ``_newest`` index with a ``LIMIT``. On
        MariaDB/MySQL the index holds an id's first bytes only: ids longer than
        that created in the same millisecond with the same first bytes (a
        group) are read whole when a page bound cuts them, and ordered here.
        """
        t = self.table
        split = self._db.id_head_bytes
        now = self._db.clock(self)
        # Named: on a small table MariaDB may prefer a scan and a sort.
        base = (
            select(*self._columns(data))
            .with_hint(t, f"FORCE INDEX ({t.name}_newest)", "mysql")
            .where(t.c.scope_hash == digest(scope.encode()), self._live(now))
        )

        async def group(created: datetime, head: bytes) -> builtins.list[Row[Any]]:
            query = base.where(t.c.created_at == created, t.c.id_head == head)
            return list(await conn.execute(query))

        rows: builtins.list[Row[Any]] = []
        query = base
        position: tuple[datetime, bytes] | None = None
        if after is not None:
            position = (after[0], after[1].encode())
            moment, wanted = position
            if split is not None and len(wanted) >= split:
                rows += await group(moment, wanted[:split])
                wanted = wanted[:split]
            query = query.where(
                or_(t.c.created_at < moment, and_(t.c.created_at == moment, t.c.id_head < wanted))
            )
        order = (t.c.created_at.desc(), t.c.id_head.desc(), t.c.id_tail_hash.desc())
        main = list(await conn.execute(query.order_by(*order).limit(limit)))
        if split is not None and len(main) == limit and len(main[-1].id_head) >= split:
            last = main[-1]
            cut = (last.created_at, bytes(last.id_head))
            main = [r for r in main if (r.created_at, bytes(r.id_head)) != cut]
            main += await group(*cut)
        rows += main

        def order_key(row: Row[Any]) -> tuple[datetime, bytes]:
            return row.created_at, join_key(row.id_head, row.id_tail)

        found = [r for r in rows if position is None or order_key(r) < position]
        found.sort(key=order_key, reverse=True)
        return [r for r in found[:limit] if bytes(r.scope) == scope.encode()]

    async def _delete(self, scope: str, snapshot_id: str) -> bool:
        t = self.table

        async def write(conn: AsyncConnection) -> bool:
            now = await self._db.now(conn, self)
            key = self._key(scope, snapshot_id)
            live = await conn.execute(delete(t).where(key, self._live(now)))
            if live.rowcount > 0:
                return True
            await conn.execute(delete(t).where(key))  # an expired one, not yet purged
            return False

        return await self._db.write(write)

    async def _erase_scope(self, scope: str) -> int:
        t = self.table
        scoped = and_(t.c.scope_hash == digest(scope.encode()), t.c.scope == scope.encode())

        async def write(conn: AsyncConnection) -> int:
            return int((await conn.execute(delete(t).where(scoped))).rowcount)  # expired too

        return await self._db.write(write)

    async def _list_scopes(self, after: str | None, limit: int) -> builtins.list[str]:
        """Scopes with a live snapshot, in order: one walk of the ``_scopes`` index.

        ``SELECT DISTINCT scope_head ... WHERE scope_head > after ORDER BY
        scope_head LIMIT n``, the live filter on the index's ``expires_at``. On
        MariaDB/MySQL a head as long as the split may stand for several scopes
        (a group): a group is read whole by its head (an index equality) and
        ordered here, like the groups of an ordered key.
        """
        t = self.table
        split = self._db.head_bytes
        hint = f"FORCE INDEX ({t.name}_scopes)"

        async def read(conn: AsyncConnection) -> builtins.list[bytes]:
            live = self._live(self._db.clock(self))

            async def group(head: bytes) -> builtins.list[bytes]:
                query = select(t.c.scope).with_hint(t, hint, "mysql")
                rows = await conn.execute(query.where(t.c.scope_head == head, live))
                return sorted({bytes(r.scope) for r in rows})

            found: builtins.list[bytes] = []
            query = select(t.c.scope_head).distinct().with_hint(t, hint, "mysql").where(live)
            if after is None:
                # A range from the lowest key, not an unbounded walk.
                query = query.where(t.c.scope_head >= b"")
            else:
                wanted = after.encode()
                if split is not None and len(wanted) >= split:
                    found += [s for s in await group(wanted[:split]) if s > wanted]
                    wanted = wanted[:split]
                query = query.where(t.c.scope_head > wanted)
            heads = await conn.execute(query.order_by(t.c.scope_head).limit(limit))
            for (head,) in list(heads):
                if len(found) >= limit:
                    break
                if split is not None and len(head) >= split:
                    found += await group(bytes(head))
                else:
                    found.append(bytes(head))
            return found[:limit]

        return [scope.decode() for scope in await self._db.read(read)]

    # ------------------------------------------------------------ rows

    async def _info(self, scope: str, row: Any) -> SnapshotInfo | None:
        """The row's info, or ``None`` (reported) when a column does not decode.

        A tampered row may hold any SQLite type in any column (``TEXT`` in
        ``size`` or ``data``): every column is checked, never converted blindly.
        """
        try:
            if not (
                type(row.size) is int
                and row.size >= 0
                and _is_bytes(row.sha256)
                and len(row.sha256) == 32
                and _is_bytes(row.metadata)
                and isinstance(row.created_at, datetime)
                and (row.expires_at is None or isinstance(row.expires_at, datetime))
            ):
                raise ValueError("a column has the wrong type")
            metadata = parse_json_text(bytes(row.metadata).decode())
            if type(metadata) is not dict:
                raise ValueError("metadata is not a JSON object")
            snapshot_id = join_key(row.id_head, row.id_tail).decode()
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError):
            await self.warn(
                StoreWarning(
                    kind="invalid_record",
                    reason="a stored snapshot row does not decode (columns, metadata or id)",
                    scope_key=scope,
                )
            )
            return None
        return SnapshotInfo.model_construct(
            scope=scope,
            snapshot_id=snapshot_id,
            size=row.size,
            sha256=bytes(row.sha256).hex(),
            metadata=metadata,
            created_at=row.created_at,
            expires_at=row.expires_at,
        )

    async def _snapshot(self, scope: str, row: Any) -> Snapshot:
        info = await self._info(scope, row)
        if info is None or not _is_bytes(row.data):
            if info is not None:
                await self.warn(
                    StoreWarning(
                        kind="invalid_record",
                        reason="a stored snapshot row's data is not bytes",
                        scope_key=scope,
                        snapshot_id=info.snapshot_id,
                    )
                )
            raise CorruptSnapshotError(
                f"a stored snapshot of scope {scope!r} is damaged (its row does not "
                "decode) and was not returned"
            )
        return Snapshot.model_construct(info=info, data=bytes(row.data))


def _is_bytes(value: object) -> bool:
    return isinstance(value, bytes | bytearray | memoryview)
