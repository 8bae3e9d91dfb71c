"""The commit transaction of the SQL thread store.

A commit runs in one write transaction of the shared
:class:`~pai_storage_sql.client.SqlClient` (SQLite: ``BEGIN IMMEDIATE`` on the
writer connection, so the whole database is held; MySQL: the root row held
with ``SELECT ... FOR UPDATE``), reads the clock after the hold, loads only
the child rows the changes name, writes the net changes (in statements that
fit MySQL's ``max_allowed_packet``), checks the relationship rules, and
writes the root last, once, with the thread's relationship facts after the
commit (the ``facts`` column, :mod:`pai_storage.root_facts`).

The facts are stored with the revision they belong to and used only when it
is the held root's revision, so a root written without them (by an older
version of this package, a restore or a fork) is never judged by stale facts.
A commit whose facts follow from the stored ones and its writes (it inserts
messages and inserts or replaces runs) checks the rules with no query; any
other commit queries the children with bounded queries inside the same
transaction (:mod:`.relations`) and reads the facts back for the next one.

On SQLite, whose clock is the process's, a commit of a version this store
committed that only inserts messages and runs, with no lease involved
(:func:`~pai_storage.root_cache.optimistic`), is *optimistic*: the root the
store kept (:attr:`.store.SqlThreadStore.roots`) stands in for the hold and
the ids it inserts are taken to be new, so nothing is read. Nothing is
written until the root is updated, only where it is stored exactly as known
(document, facts and counters); a root that matches nothing, a rule that
must read, or a conflict or error in the judgement raises
:class:`~pai_storage.root_cache.Unsure` with nothing written, and the commit
is judged again the usual way in the same transaction. The rows are inserted
after the root; the tables' unique keys refuse an id that exists, and then
the transaction is rolled back and the commit judged again, held.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import bindparam, delete, func, insert, select, update

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ThreadRecord,
    ThreadVersion,
    codec,
)
from pai_storage.backend import (
    CommitTransaction,
    FamilyName,
    FamilySpec,
    FamilyWrite,
    HeldThread,
    RelationshipContext,
    RelationshipReader,
    ThreadConflict,
    run_commit,
    timestamp_ms,
)
from pai_storage.errors import ThreadStoreError, ThreadStoreInvariantError
from pai_storage.models import CreateMutation
from pai_storage.root_cache import (
    NoQueries,
    TextRoot,
    Unsure,
    judge_optimistic,
    keep_written,
    optimistic,
)
from pai_storage.root_facts import (
    NO_FACTS,
    RootFacts,
    check_rules,
    facts_after,
    facts_text,
    stored_facts,
)
from pai_storage.rows import dec, enc

from .client import Operation, is_unique_violation
from .relations import _Reader
from .schema import digest
from .thread_rows import _opt_digest, _row, _ThreadRows, _version

if TYPE_CHECKING:
    from .store import SqlThreadStore


_RESTORE = object()
"""The mutation of a restore: held like a create (the key must be missing)."""


class _Conflict(Exception):
    """Internal: the pipeline judged a conflict; the transaction is rolled back."""

    def __init__(self, result: ConflictResult) -> None:
        super().__init__("conflict")
        self.result = result


class _Rejudge(Exception):
    """Internal: an optimistic commit wrote its root, then found an inserted id
    taken: its transaction is rolled back and the commit judged again, held."""


async def commit_once(
    store: SqlThreadStore, request: CommitThreadInput
) -> CommittedResult | ConflictResult:
    """One attempt: the write transaction, the core's commit pipeline, commit or roll
    back. On SQLite, when the store knows the version, the commit is judged
    optimistically first; it writes nothing until its root's guarded update
    succeeds, so on :class:`~pai_storage.root_cache.Unsure` it is judged again,
    held, in the same transaction, with the write lock kept (no other commit
    gets in between). Only an inserted id found taken after that (an error the
    held judgement reports) rolls the transaction back first."""
    key = (request.scope_key, request.thread_id)
    sqlite = store.client.dialect == "sqlite"
    known = store.roots.get(key) if sqlite else None
    if known is not None and not optimistic(request, known):
        known = None
    try:
        return await _commit(store, request, known)
    except _Rejudge:
        return await _commit(store, request, None)


async def _commit(
    store: SqlThreadStore, request: CommitThreadInput, known: TextRoot | None
) -> CommittedResult | ConflictResult:
    key = (request.scope_key, request.thread_id)
    sqlite = store.client.dialect == "sqlite"
    written: TextRoot | None = None

    async def attempt(op: Operation) -> CommittedResult:
        nonlocal written
        written = None
        if known is not None:
            tx = _Transaction(op, store, request.scope_key, request.thread_id, request.mutation)
            tx.known = known
            try:
                result = await judge_optimistic(tx, request, store.now)
            except Unsure:
                pass  # nothing written: judged again, held
            else:
                written = tx.written
                return result
        tx = _Transaction(op, store, request.scope_key, request.thread_id, request.mutation)
        outcome = await run_commit(tx, request, clock=store.now)
        if isinstance(outcome, ConflictResult):
            raise _Conflict(outcome)
        written = tx.written
        return outcome

    try:
        result = await store.client.run_write(attempt)
    except _Conflict as conflict:
        return conflict.result
    if not sqlite:
        return result
    keep_written(store.roots, key, written)
    return result


class _Transaction(_ThreadRows, CommitTransaction):
    """The commit primitives inside the client's write transaction."""

    def __init__(
        self,
        op: Operation,
        store: SqlThreadStore,
        scope_key: str,
        thread_id: str,
        mutation: object = None,
    ) -> None:
        super().__init__(op, store, scope_key, thread_id)
        self._mutation = mutation
        self._previous_facts: RootFacts | None = None
        """The stored facts of the held root (``None``: unknown, the check queries)."""
        self._update: dict[str, Any] | None = None
        """The root's columns, written after the relationship check with its facts."""
        self._root: tuple[ThreadRecord, Mapping[FamilyName, int]] | None = None
        self.known: TextRoot | None = None
        """Set for an optimistic commit: the root it is judged from (no hold)."""
        self.written: TextRoot | None = None
        """What the commit stored, when its facts are known: the next commit's ``known``."""
        self._held_back: list[tuple[FamilySpec, FamilyWrite[Any]]] = []
        """An optimistic commit's inserts, written once its root's update matched."""

    async def hold(self) -> HeldThread:
        if self.known is not None:  # optimistic: nothing read, the writes check it all
            self._previous_facts = self.known.facts
            return HeldThread(self.known.root, self.known.next_positions, {})
        t = self._t.threads
        if isinstance(self._mutation, CreateMutation) or self._mutation is _RESTORE:
            # Nothing to lock yet: write_root inserts and a concurrent create's
            # row makes the insert fail on the primary key.
            stmt = self._store.sql(
                self._op,
                "hold-create",
                lambda: select(t.c.instance_id, t.c.revision).where(t.c.tkey == bindparam("k")),
            )
            rows = await self._op.rows(stmt, {"k": self._key})
            if rows:
                instance_id, revision = rows[0]
                raise ThreadConflict(
                    ThreadVersion(thread_instance_id=instance_id, revision=int(revision))
                )
            return HeldThread(None)
        stmt = self._store.sql(
            self._op,
            "hold",
            lambda: (
                select(t.c.messages_next, t.c.runs_next, t.c.queued_next, t.c.doc, t.c.facts)
                .where(t.c.tkey == bindparam("k"))
                .with_for_update()
            ),
        )
        rows = await self._op.rows(stmt, {"k": self._key})
        if not rows:
            return HeldThread(None)
        messages, runs, queued, doc, facts = rows[0]
        root = self._parse_root(doc)
        self._previous_facts = stored_facts(facts, root.version.revision)
        return HeldThread(root, self._next(messages, runs, queued))

    async def server_time(self) -> datetime:
        if self._op.sqlite:
            return datetime.now(UTC)
        stmt = self._store.sql(self._op, "now", lambda: select(func.utc_timestamp(6)))
        rows = await self._op.rows(stmt, {})
        return cast(datetime, rows[0][0]).replace(tzinfo=UTC)

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        t = self._t.threads
        values: dict[str, Any] = {
            "revision": root.version.revision,
            "hidden": 1 if root.list_visibility == "hidden" else 0,
            "category_h": _opt_digest(root.category),
            "sort_key": -timestamp_ms(root.updated_at),
            "updated_ms": timestamp_ms(root.updated_at),
            "messages_next": next_positions["messages"],
            "runs_next": next_positions["runs"],
            "queued_next": next_positions["queuedItems"],
            "doc": codec.encode(root),
        }
        self._check_size("thread root", values["doc"])
        self._root = (root, next_positions)
        if not created:
            # Written with its facts once the relationship check has judged them.
            self._update = values
            return
        thread = enc(self._thread_id)
        # A new thread's facts are known when it starts empty; a create with
        # records, a restore or a fork leaves them to its next commit.
        mutation = self._mutation
        empty = isinstance(mutation, CreateMutation) and _no_records(mutation)
        if empty:
            self.written = TextRoot(
                (values["doc"], facts_text(NO_FACTS, root.version.revision)),
                root,
                next_positions,
                NO_FACTS,
            )
        values.update(
            facts=self.written.stored[1] if self.written is not None else None,
            tkey=self._key,
            scope_h=digest(self._scope_key),
            scope_key=enc(self._scope_key),
            thread_id=thread,
            thread_ord=self._store._ord(thread),
            scope_ord=self._store._ord(enc(self._scope_key)),
            instance_id=root.version.thread_instance_id,
            agent_h=digest(root.agent),
            parent_h=_opt_digest(root.parent_thread_id),
        )
        try:
            await self._op.execute(
                self._store.sql(self._op, "root-insert", lambda: insert(t)), values
            )
        except Exception as exc:
            if not is_unique_violation(exc):
                raise
            # A concurrent create won the key (the insert waited for it to
            # commit); a locking read sees the winner's version.
            row = (
                await self._conn.execute(
                    select(t.c.instance_id, t.c.revision)
                    .where(t.c.tkey == self._key)
                    .with_for_update(read=True)
                )
            ).first()
            raise ThreadConflict(_version(row) if row is not None else None) from None

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        if self.known is not None:  # inserts only: written after the root's guarded update
            self._held_back.append((spec, write))
            return ()
        table = self._table(spec.name)
        conn, key = self._conn, self._key
        truncated: list[str] = []
        if write.truncate_after is not None:
            after = write.truncate_after
            rows = (
                await conn.execute(
                    select(table.c.run_id).where(table.c.tkey == key, table.c.position > after)
                )
            ).all()
            truncated = sorted({dec(r.run_id) for r in rows if r.run_id is not None})
            await conn.execute(delete(table).where(table.c.tkey == key, table.c.position > after))
        if write.deletes:
            await conn.execute(
                delete(table).where(
                    table.c.tkey == key,
                    table.c.id_h.in_(bindparam("ids", expanding=True)),
                ),
                {"ids": [digest(i) for i in write.deletes]},
            )
        if write.updates:
            rows_ = [_row(spec, e) for e in write.updates.values()]
            for r in rows_:
                self._check_size(spec.noun, r["doc"])
            names = [c for c in rows_[0] if c not in ("position", "id_h")]
            stmt = self._store.sql(
                self._op,
                ("update-rows", spec.name),
                lambda: (
                    update(table)
                    .where(
                        table.c.tkey == bindparam("b_tkey"),
                        table.c.position == bindparam("b_position"),
                        table.c.id_h == bindparam("b_id_h"),
                    )
                    .values({c: bindparam(f"b_{c}") for c in names})
                ),
            )
            await self._op.executemany(
                stmt, [{"b_tkey": key, **{f"b_{c}": v for c, v in r.items()}} for r in rows_]
            )
        if write.inserts:
            rows_ = [{"tkey": key, **_row(spec, e)} for e in write.inserts]
            stmt = self._store.sql(self._op, ("insert-rows", spec.name), lambda: insert(table))
            for chunk in self._chunks(spec, rows_):
                await self._op.executemany(stmt, chunk)
        return truncated

    def _chunks(
        self, spec: FamilySpec, rows: list[dict[str, Any]]
    ) -> Iterable[list[dict[str, Any]]]:
        """The rows in groups that each fit one statement (MySQL's ``max_allowed_packet``).

        A multi-row ``INSERT`` is one packet; a row too large for any packet
        is refused before anything is sent.
        """
        limit = self._client.max_packet
        if limit is None:
            yield rows
            return
        budget = max(limit - STATEMENT_OVERHEAD, 0)
        chunk: list[dict[str, Any]] = []
        size = 0
        for row in rows:
            need = _sent_size(row["doc"])
            if need > budget:
                raise _too_large(spec.noun, need, limit)
            if chunk and size + need > budget:
                yield chunk
                chunk, size = [], 0
            chunk.append(row)
            size += need
        if chunk:
            yield chunk

    def _check_size(self, noun: str, doc: str) -> None:
        limit = self._client.max_packet
        if limit is not None:
            need = _sent_size(doc)
            if need > limit - STATEMENT_OVERHEAD:
                raise _too_large(noun, need, limit)

    async def delete_thread(self) -> None:
        t = self._t
        for table in (t.messages, t.runs, t.queued, t.threads):
            await self._conn.execute(delete(table).where(table.c.tkey == self._key))

    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        if self.known is not None:
            return NoQueries()  # an optimistic commit reads nothing
        return _Reader(self._op, self._store, self._key)

    async def check_relationships(self, context: RelationshipContext) -> None:
        """Check the rules, then write the root with the thread's facts after the commit.

        Facts that follow from the stored ones and this commit's writes answer
        the rules' queries (only runs they do not know are queried); otherwise
        the queries run, and the facts are read back when a message or run
        changed (else the stored ones still hold).
        """
        reader = self.relationship_reader(context)
        previous = self._previous_facts
        derived = await check_rules(previous, context, reader)
        values = self._update
        if values is None:  # a create: its root is written already
            return
        facts = await facts_after(previous, context, reader, derived)
        values["facts"] = facts_text(facts, values["revision"])
        if self._root is not None:
            root, counters = self._root
            self.written = TextRoot((values["doc"], values["facts"]), root, counters, facts)
        t = self._t.threads
        names = list(values)
        params = {"k": self._key, **{f"b_{c}": values[c] for c in names}}
        known = self.known
        if known is None:
            stmt = self._store.sql(
                self._op,
                "root-update",
                lambda: (
                    update(t)
                    .where(t.c.tkey == bindparam("k"))
                    .values({c: bindparam(f"b_{c}") for c in names})
                ),
            )
            await self._op.execute(stmt, params)
            return
        # Only over the root as this store committed it: else judged again, held.
        stmt = self._store.sql(
            self._op,
            "root-update-known",
            lambda: (
                update(t)
                .where(
                    t.c.tkey == bindparam("k"),
                    t.c.doc == bindparam("g_doc"),
                    t.c.facts == bindparam("g_facts"),
                    t.c.messages_next == bindparam("g_messages"),
                    t.c.runs_next == bindparam("g_runs"),
                    t.c.queued_next == bindparam("g_queued"),
                )
                .values({c: bindparam(f"b_{c}") for c in names})
            ),
        )
        positions = known.next_positions
        params.update(
            g_doc=known.stored[0],
            g_facts=known.stored[1],
            g_messages=positions["messages"],
            g_runs=positions["runs"],
            g_queued=positions["queuedItems"],
        )
        if await self._op.changed(stmt, params) != 1:
            raise Unsure()  # nothing written yet
        self.known = None
        for spec, write in self._held_back:
            try:
                await self.write_family(spec, write)
            except Exception as exc:
                # The root is written: never judged again in this transaction.
                if is_unique_violation(exc) or isinstance(exc, ThreadStoreError):
                    raise _Rejudge() from exc  # an id taken as new exists, say
                raise


def _no_records(mutation: CreateMutation) -> bool:
    changes = mutation.changes
    return changes is None or not (changes.messages or changes.runs or changes.queued_items)


STATEMENT_OVERHEAD = 64 * 1024
"""Room for a statement's SQL, identifiers and other columns beside its documents."""


def _sent_size(doc: str) -> int:
    """Bytes a document takes in a statement: its UTF-8 plus one escape per quote
    or backslash (JSON text holds no raw control characters)."""
    return len(doc.encode("utf-8")) + doc.count('"') + doc.count("\\") + doc.count("'") + 8


def _too_large(noun: str, need: int, limit: int) -> ThreadStoreInvariantError:
    return ThreadStoreInvariantError(
        f"a {noun} of {need:,} bytes does not fit this MariaDB/MySQL server's "
        f"max_allowed_packet of {limit:,} bytes; raise max_allowed_packet on the server "
        "(see docs/sql.md, 'Limits'); nothing was applied"
    )
