"""The commit primitives of a PostgreSQL thread store, inside the attempt's transaction.

:class:`_PgTransaction` supplies the core's commit pipeline
(:func:`~pai_storage.backend.run_commit`): the root row held with
``SELECT ... FOR UPDATE`` (a create checks it is missing and inserts with
``ON CONFLICT DO NOTHING``), the server's clock read by that same statement
once the lock is granted, the child rows the changes name loaded, the net
writes as ``unnest`` statements, and the relationship reader
(:mod:`.relations`) in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from pai_storage import CommitThreadInput, ThreadRecord, codec
from pai_storage.backend import (
    CommitTransaction,
    FamilyName,
    FamilySpec,
    FamilyWrite,
    HeldThread,
    RelationshipContext,
    RelationshipReader,
    ThreadConflict,
    timestamp_ms,
)
from pai_storage.models import CreateMutation
from pai_storage.rows import dec, enc, enc_opt

from .layout import _columns
from .relations import _Reader
from .statements import (
    _NOW_SQL,
    hold_statement,
    update_root_notify_statement,
    update_root_statement,
)
from .thread_rows import _ThreadRows, _version
from .watch import payload


@dataclass(frozen=True, slots=True)
class Notice:
    """The notification of a commit to the thread's watchers (:mod:`.watch`):
    sent on ``channel``, telling of ``commit``."""

    channel: str
    commit: CommitThreadInput


class _PgTransaction(_ThreadRows, CommitTransaction):
    """The commit primitives inside the attempt's ``READ COMMITTED`` transaction.

    ``mutation`` is the commit's (a restore or a fork only writes a new root
    and rows, and never holds). With a ``notice``, an update of the root sends
    it in the same statement and sets ``notified``; otherwise (a create, a
    delete, no notice) the store sends the notification itself before
    ``COMMIT``.
    """

    mutation: object = None
    notice: Notice | None = None
    notified: bool = False
    _held_at: datetime | None = None
    """The server's clock as the hold read it, once it had the root's lock."""

    async def hold(self) -> HeldThread:
        t = self._tables.threads
        key = "WHERE scope_key = $1 AND thread_id = $2"
        if isinstance(self.mutation, CreateMutation):
            # Nothing to lock yet: write_root inserts with ON CONFLICT DO NOTHING.
            row = await self._conn.fetchrow(
                f"SELECT instance_id, revision FROM {t} {key}", self._scope, self._thread
            )
            if row is not None:  # the key is taken: no need to read the stored root
                raise ThreadConflict(_version(row))
            return HeldThread(None)
        row = await self._conn.fetchrow(hold_statement(t), self._scope, self._thread)
        if row is None:
            return HeldThread(None)
        self._held_at = row["now"]
        return HeldThread(self._parse_root(row["doc"]), self._positions(row))

    async def server_time(self) -> datetime:
        if self._held_at is not None:  # read by the hold, after its lock: no round trip
            return self._held_at
        # A create holds no row (and nothing to wait for): the clock is read now.
        return cast(datetime, await self._conn.fetchval(_NOW_SQL))

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        t = self._tables.threads
        args = (
            self._scope,
            self._thread,
            root.version.revision,
            root.list_visibility,
            enc_opt(root.category),
            root.updated_at,
            -timestamp_ms(root.updated_at),
            next_positions["messages"],
            next_positions["runs"],
            next_positions["queuedItems"],
            codec.encode(root),
        )
        if not created:
            if self.notice is None:
                await self._conn.execute(update_root_statement(t), *args)
                return
            # The watchers' NOTIFY rides on the root's update: one round trip fewer.
            notice = self.notice
            status = await self._conn.execute(
                update_root_notify_statement(t), *args, notice.channel, payload(notice.commit, root)
            )
            self.notified = status == "SELECT 1"
            return
        inserted = await self._conn.fetchval(
            f"INSERT INTO {t} (scope_key, thread_id, revision, list_visibility, category, "
            "updated_at, sort_key, messages_next, runs_next, queued_next, doc, instance_id, "
            "agent, parent_thread_id) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) "
            "ON CONFLICT (scope_key, thread_id) DO NOTHING RETURNING true",
            *args,
            root.version.thread_instance_id,
            enc(root.agent),
            enc_opt(root.parent_thread_id),
        )
        if not inserted:
            # A concurrent create won the key (the insert waited for it to commit);
            # this statement's fresh snapshot sees the winner's version.
            row = await self._conn.fetchrow(
                f"SELECT instance_id, revision FROM {t} WHERE scope_key = $1 AND thread_id = $2",
                self._scope,
                self._thread,
            )
            raise ThreadConflict(_version(row) if row is not None else None)

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        table = self._families[spec.name]
        conn, scope, thread = self._conn, self._scope, self._thread
        truncated: list[str] = []
        if write.truncate_after is not None:
            rows = await conn.fetch(
                f"DELETE FROM {table.table} WHERE scope_key = $1 AND thread_id = $2 "
                "AND position > $3 RETURNING run_id",
                scope,
                thread,
                write.truncate_after,
            )
            truncated = sorted({dec(r["run_id"]) for r in rows if r["run_id"] is not None})
        if write.deletes:
            await conn.execute(
                f"DELETE FROM {table.table} AS t USING unnest($3::bytea[]) AS k(id) "
                f"WHERE t.scope_key = $1 AND t.thread_id = $2 AND t.{table.id_col} = k.id",
                scope,
                thread,
                [enc(i) for i in write.deletes],
            )
        if write.updates:
            cols = _columns(spec, list(write.updates.values()))
            await conn.execute(table.update, scope, thread, *cols)
        if write.inserts:
            cols = _columns(spec, write.inserts)
            await conn.execute(table.insert, scope, thread, *cols)
        return truncated

    async def delete_thread(self) -> None:
        t = self._tables
        for table in (t.messages, t.runs, t.queued, t.threads):
            await self._conn.execute(
                f"DELETE FROM {table} WHERE scope_key = $1 AND thread_id = $2",
                self._scope,
                self._thread,
            )

    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        return _Reader(self._conn, self._tables, self._scope, self._thread)
