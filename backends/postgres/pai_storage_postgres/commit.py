"""The commit primitives of a PostgreSQL thread store, inside the attempt's transaction.

:class:`_PgTransaction` supplies the core's commit pipeline
(:func:`~pai_storage.backend.run_commit`). An update sends two statements
between ``BEGIN`` and ``COMMIT``:

1. the hold: the root row ``SELECT ... FOR UPDATE``, with the server's clock
   read once the lock is granted, the root's relationship facts and the child
   rows the changes name (:func:`.statements.hold_statement`);
2. the write: the root with its new facts, every insert and the watchers'
   ``pg_notify`` in one statement of data-modifying ``WITH`` queries
   (:func:`.statements.write_statement`).

When the facts on the root follow from the commit's writes (it appends
messages, starts or finishes a run, takes or releases a lease:
:func:`~pai_storage.root_facts.derive_facts`), the relationship rules are
checked against them with no query. Otherwise the deletes, replacements and
truncations run as their own statements, the inserts are written before the
relationship queries (:mod:`.relations`) that must see them, and the facts
are read back for the next commit. A create checks the key is free (with the
clock), inserts the root with ``ON CONFLICT DO NOTHING`` (a concurrent
create wins or loses there) and then writes as an update does.

An *optimistic* commit (:func:`~pai_storage.root_cache.optimistic`) sends
only the write, outside a transaction: one round trip. It applies when this
store committed the version the commit expects (the store's
:class:`~pai_storage.root_cache.RootCache`), and the commit only inserts
messages and runs, with no lease involved. The root it knows stands in for
the hold; the ids it inserts are taken to be new (the tables' unique keys
refuse one that is not); the commit time is the server's clock as this
process tracks it (:class:`~pai_storage.clock.ServerClock`). The write is
guarded: it locks the root without waiting, only when it is stored exactly
as known and the server's clock, read just before the lock, is at most
:data:`~.statements.STAMP_WINDOW_MS` past that time, and writes only if it
locked it. Anything else (a guard that matches nothing, a clock past the
window, a root another transaction holds, an id that exists, a rule that
needs a query, a conflict or an error in the judgement) raises
:class:`~pai_storage.root_cache.Unsure`, and the store commits the usual
way. Writes that find the clock past the window, three among eight, pause
the predictions (:class:`~pai_storage.clock.ServerClock`): on a slow
network the store stops trying for a while.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pai_storage import CommitThreadInput, ThreadRecord, codec
from pai_storage.backend import (
    CommitTransaction,
    Entry,
    FamilyName,
    FamilySpec,
    FamilyWrite,
    HeldThread,
    MessageRef,
    RelationshipContext,
    RelationshipReader,
    RunRef,
    RunRelations,
    ThreadConflict,
    family,
    named_ids,
    timestamp_ms,
)
from pai_storage.clock import ServerClock
from pai_storage.fields import truncate_ms
from pai_storage.models import CreateMutation, DeleteMutation
from pai_storage.root_cache import NoQueries, TextRoot, Unsure
from pai_storage.root_facts import (
    NO_FACTS,
    RootFacts,
    check_rules,
    facts_after,
    facts_text,
    stored_facts,
)
from pai_storage.rows import dec, enc, enc_opt

from .errors import RETRYABLE_STATES, sqlstate
from .layout import _columns, _Table
from .relations import _Reader
from .statements import (
    STAMP_WINDOW_MS,
    create_hold_statement,
    hold_statement,
    write_statement,
)
from .thread_rows import _ThreadRows, _version
from .watch import payload

_JUDGED_HELD = RETRYABLE_STATES | {"23505", "55P03"}
"""Errors of an optimistic write that the usual commit judges again: an inserted
id that exists (unique violation), a root another transaction holds (lock not
available), a serialization failure or deadlock."""

STAMP_WINDOW = timedelta(milliseconds=STAMP_WINDOW_MS)


@dataclass(frozen=True, slots=True)
class Notice:
    """The notification of a commit to the thread's watchers (:mod:`.watch`):
    sent on ``channel``, telling of ``commit``."""

    channel: str
    commit: CommitThreadInput


class _PgTransaction(_ThreadRows, CommitTransaction):
    """The commit primitives inside the attempt's ``READ COMMITTED`` transaction.

    ``mutation`` is the commit's. A restore or a fork sets none: it only
    writes a new root (without facts) and rows, each at once, and never holds.
    With a ``notice``, the commit's write sends it and sets ``notified``;
    otherwise (a delete, no notice) the store sends the notification itself
    before ``COMMIT``.
    """

    mutation: object = None
    notice: Notice | None = None
    notified: bool = False
    _held_at: datetime | None = None
    """The server's clock as the hold read it, once it had the root's lock."""
    _previous_facts: RootFacts | None = None
    """The relationship facts stored with the held root (``None``: unknown)."""
    _root: tuple[ThreadRecord, Mapping[FamilyName, int]] | None = None
    """The stamped root and counters, written with the facts at the end."""
    _held_back: dict[FamilyName, FamilyWrite[Any]] | None = None
    """Family writes of replacements and inserts not yet sent (they ride on the
    root's write, or are sent before a relationship query)."""
    clock: ServerClock | None = None
    """The store's view of the server's clock: the hold teaches it, an
    optimistic commit predicts its time from it."""
    known: TextRoot | None = None
    """Set for an optimistic commit: the root it is judged from (no hold)."""
    _predicted: datetime | None = None
    """An optimistic commit's predicted server time (``None`` on a test clock)."""
    written: TextRoot | None = None
    """What the commit's write stored, once sent: the next commit's ``known``."""

    async def hold(self) -> HeldThread:
        if self.known is not None:  # optimistic: ids taken as new, the write checks all
            self._previous_facts = self.known.facts
            return HeldThread(self.known.root, self.known.next_positions, {})
        t = self._tables.threads
        if isinstance(self.mutation, CreateMutation):
            # Nothing to lock yet: write_root inserts with ON CONFLICT DO NOTHING.
            row = await self._conn.fetchrow(create_hold_statement(t), self._scope, self._thread)
            if row["instance_id"] is not None:  # the key is taken: no need to read the root
                raise ThreadConflict(_version(row))
            self._held_at = row["now"]
            if self.clock is not None:
                self.clock.observe(self._held_at)
            self._previous_facts = NO_FACTS
            return HeldThread(None)
        named = named_ids(getattr(self.mutation, "changes", None))
        loads = tuple(
            (name, table.table, table.id_col)
            for name, table in self._families.items()
            if named[name]
        )
        ids = [[enc(i) for i in named[name]] for name, _, _ in loads]
        rows = await self._conn.fetch(hold_statement(t, loads), self._scope, self._thread, *ids)
        head = next((r for r in rows if r["family"] is None), None)
        if head is None:
            return HeldThread(None)
        self._held_at = head["now"]
        if self.clock is not None:
            self.clock.observe(self._held_at)
        root = self._parse_root(head["doc"])
        if not isinstance(self.mutation, DeleteMutation):  # a delete needs no facts
            self._previous_facts = stored_facts(head["facts"], root.version.revision)
        if not head["fresh"]:
            # The lock waited for a commit that moved the root: the named rows were
            # read before it, so the pipeline loads them again (load_rows).
            return HeldThread(root, self._positions(head))
        loaded: dict[FamilyName, dict[str, Entry[Any]]] = {name: {} for name in self._families}
        for r in rows:
            name = r["family"]
            if name is not None:
                spec = family(name)
                rid, entry = self._entry(spec, r)
                loaded[name][rid] = entry
        return HeldThread(root, self._positions(head), loaded)

    async def server_time(self) -> datetime:
        if self.known is not None:
            self._predicted = self.clock.predict() if self.clock is not None else None
            if self._predicted is None:  # paused after a miss: commit the usual way
                raise Unsure()
            return self._predicted
        if self._held_at is None:  # pragma: no cover - hold() reads it
            raise RuntimeError("server_time() called before hold()")
        return self._held_at

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        """Keep the root for the write; a create inserts it now, taking the key."""
        self._root = (root, next_positions)
        if not created:
            return
        t = self._tables.threads
        inserted = await self._conn.fetchval(
            f"INSERT INTO {t} (scope_key, thread_id, revision, list_visibility, category, "
            "updated_at, sort_key, messages_next, runs_next, queued_next, doc, instance_id, "
            "agent, parent_thread_id) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) "
            "ON CONFLICT (scope_key, thread_id) DO NOTHING RETURNING true",
            *self._root_args(None)[:11],
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

    def _root_args(self, facts: RootFacts | None) -> list[Any]:
        """Parameters ``$1`` to ``$12`` of :func:`.statements.write_statement`."""
        if self._root is None:  # pragma: no cover - the pipeline writes the root first
            raise RuntimeError("the root was not written before the commit's write")
        root, next_positions = self._root
        stored = None if facts is None else facts_text(facts, root.version.revision)
        return [
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
            stored,
        ]

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        # A commit holds back its replacements and inserts; a restore or a fork
        # (no mutation, no relationship check to send them) writes at once.
        if self.mutation is not None and write.truncate_after is None and not write.deletes:
            if self._held_back is None:
                self._held_back = {}
            self._held_back[spec.name] = write  # sent with the root (or before a query)
            return ()
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
        await self._send_rows(spec, write)
        return truncated

    def _row_writes(
        self, spec: FamilySpec, write: FamilyWrite[Any]
    ) -> list[tuple[_Table, bool, list[list[Any]]]]:
        """A family write's replacements and inserts: ``(table, replace, column arrays)``."""
        table = self._families[spec.name]
        parts = []
        if write.updates:
            parts.append((table, True, _columns(spec, list(write.updates.values()))))
        if write.inserts:
            parts.append((table, False, _columns(spec, write.inserts)))
        return parts

    async def _send_rows(self, spec: FamilySpec, write: FamilyWrite[Any]) -> None:
        """Write a family's replacements and inserts, a statement each."""
        for table, replace, cols in self._row_writes(spec, write):
            sql = table.update if replace else table.insert
            await self._conn.execute(sql, self._scope, self._thread, *cols)

    async def _send_held_back(self) -> None:
        """Write the held-back replacements and inserts now (a relationship query
        must see them)."""
        pending, self._held_back = self._held_back, None
        for name, write in (pending or {}).items():
            await self._send_rows(family(name), write)

    async def delete_thread(self) -> None:
        t = self._tables
        for table in (t.messages, t.runs, t.queued, t.threads):
            await self._conn.execute(
                f"DELETE FROM {table} WHERE scope_key = $1 AND thread_id = $2",
                self._scope,
                self._thread,
            )

    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        if self.known is not None:
            return NoQueries()  # an optimistic commit reads nothing
        return _SendingReader(self, _Reader(self._conn, self._tables, self._scope, self._thread))

    async def check_relationships(self, context: RelationshipContext) -> None:
        """Check the rules, then write the root with the thread's facts after the commit.

        When the facts follow from the stored ones and this commit's writes,
        they answer the rules' queries (runs they do not know are queried,
        after the inserts are written); otherwise the queries run and the
        facts are read back. Then one statement writes the root, the facts,
        the family writes not yet sent and the notification.
        """
        reader = self.relationship_reader(context)
        derived = await check_rules(self._previous_facts, context, reader)
        await self._write(await facts_after(self._previous_facts, context, reader, derived))

    async def _write(self, facts: RootFacts) -> None:
        pending, self._held_back = self._held_back or {}, None
        writes: list[tuple[_Table, bool]] = []
        columns: list[list[Any]] = []
        for name, write in pending.items():
            for table, replace, cols in self._row_writes(family(name), write):
                writes.append((table, replace))
                columns.extend(cols)
        args = self._root_args(facts)
        if self._root is not None:
            root, counters = self._root
            self.written = TextRoot((args[10], args[11]), root, counters, facts)
        notice = self.notice
        if notice is not None:
            args += [notice.channel, payload(notice.commit, self._root[0] if self._root else None)]
        known = self.known
        if known is None:
            sql = write_statement(self._tables.threads, tuple(writes), notice is not None)
            status = await self._conn.execute(sql, *args, *columns)
            self.notified = notice is not None and status == "SELECT 1"
            return
        positions = known.next_positions
        args += [
            *known.stored,
            positions["messages"],
            positions["runs"],
            positions["queuedItems"],
            self._predicted,
        ]
        sql = write_statement(self._tables.threads, tuple(writes), notice is not None, True)
        try:
            row = await self._conn.fetchrow(sql, *args, *columns)
        except Exception as exc:
            if sqlstate(exc) in _JUDGED_HELD:
                raise Unsure() from exc
            raise
        clock, predicted, now = self.clock, self._predicted, row["now"]
        if clock is not None and predicted is not None:
            # ``now`` was read as the statement began, before the lock: when it
            # wrote nothing, was the prediction ahead of the server, or too far
            # behind it (a slow network)?
            if row["written"]:
                clock.hit()
            elif now < predicted:
                clock.reset(now)
            elif truncate_ms(now) - predicted > STAMP_WINDOW:
                clock.missed()
        if clock is not None:
            clock.observe(now)
        if not row["written"]:  # the root moved, or the clock ran past
            raise Unsure()
        self.notified = notice is not None


class _SendingReader:
    """The relationship queries, run only after the held-back writes are sent."""

    def __init__(self, tx: _PgTransaction, reader: _Reader) -> None:
        self._tx = tx
        self._reader = reader

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        await self._tx._send_held_back()
        return await self._reader.run_facts(run_ids)

    async def open_runs(self) -> Sequence[RunRef]:
        await self._tx._send_held_back()
        return await self._reader.open_runs()

    async def tail(self) -> MessageRef | None:
        await self._tx._send_held_back()
        return await self._reader.tail()
