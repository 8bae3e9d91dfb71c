"""The SQL thread store: normalized tables, one transaction per commit.

Commits and reads run the core's pipelines (:func:`~pai_storage.backend.run_commit`,
:func:`~pai_storage.backend.run_read`); this module supplies their primitives
over SQLAlchemy Core. A commit runs in one write transaction of the shared
:class:`~pai_storage_sql.client.SqlClient` (SQLite: ``BEGIN IMMEDIATE`` on the
writer connection, so the whole database is held; MySQL: the root row held
with ``SELECT ... FOR UPDATE``), reads the clock after the hold, loads only
the child rows the changes name, writes the net changes, and checks the
relationship rules with bounded queries inside the same transaction. Reads
with pages run in one snapshot, so the root and every page agree. Every page
and list is a bounded index range scan on the ``(thread key, position)`` or
``(scope, visibility, sort key, thread id)`` indexes of :mod:`.schema`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, cast

from sqlalchemy import (
    Select,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)

from pai_storage import (
    Clock,
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    CreateMutation,
    ListThreadsInput,
    Message,
    Page,
    QueuedItem,
    ReadThreadInput,
    RunRecord,
    StoreInfo,
    StoreURL,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ThreadStoreInvariantError,
    ThreadVersion,
    WarningCallback,
)
from pai_storage.backend import (
    FAMILIES,
    LIFECYCLE,
    ChildPagePlan,
    CommitTransaction,
    Entry,
    Family,
    FamilyName,
    FamilySpec,
    FamilyWrite,
    ForkRequest,
    HeldThread,
    ListPlan,
    MessageRef,
    ReadSnapshot,
    RelationshipContext,
    RelationshipReader,
    RunRef,
    RunRelations,
    SnapshotRoot,
    SourceChanged,
    ThreadAggregate,
    ThreadConflict,
    ThreadIndexEntry,
    Window,
    gapped_spans,
    message_ref_from_row,
    run_commit,
    run_facts_from_rows,
    run_read,
    run_ref_from_row,
    timestamp_ms,
)
from pai_storage.rows import (
    ListCursor,
    ListRow,
    dec,
    dump,
    enc,
    list_page,
    page_records,
    parse,
)

from .client import Operation, SqlClient, Statement, is_unique_violation
from .schema import ORDER_BYTES, SCHEMA_VERSION, Tables, digest

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["SqlThreadStore", "thread_key"]

_ID_COLUMN: dict[FamilyName, str] = {
    "messages": "message_id",
    "runs": "run_id",
    "queuedItems": "queue_item_id",
}
_NEXT_COLUMN: dict[FamilyName, str] = {
    "messages": "messages_next",
    "runs": "runs_next",
    "queuedItems": "queued_next",
}


def thread_key(scope_key: str, thread_id: str) -> bytes:
    """The 16-byte key of a thread: the digest of its scope key and thread id."""
    scope = enc(scope_key)
    return digest_bytes(len(scope).to_bytes(4, "big") + scope + enc(thread_id))


def digest_bytes(data: bytes) -> bytes:
    import hashlib

    return hashlib.blake2b(data, digest_size=16).digest()


def _opt_digest(text: str | None) -> bytes | None:
    return None if text is None else digest(text)


class _Conflict(Exception):
    """Internal: the pipeline judged a conflict; the transaction is rolled back."""

    def __init__(self, result: ConflictResult) -> None:
        super().__init__("conflict")
        self.result = result


class SqlThreadStore(ThreadStore):
    """Thread state in SQLite or MariaDB/MySQL (SQLAlchemy 2 Core, asyncio).

    Parameters
    ----------
    url:
        ``sqlite:///path/file.db``, ``sqlite:///:memory:``,
        ``mysql://user:password@host:port/database`` or ``mariadb://...``
        (see :class:`~pai_storage_sql.client.SqlClient`).
    client:
        The :class:`~pai_storage_sql.client.SqlClient` shared by the stores of
        one ``connect()`` call (then no client option may be given).
    table_prefix, busy_timeout, pool_size, connect_timeout, retry_attempts:
        The client's options (see :class:`~pai_storage_sql.client.SqlClient`).
    clock, on_warning, token_secret:
        The common options of :class:`~pai_storage.ThreadStore` (checked
        there); production uses the database's clock (SQLite: this process's
        UTC clock).
    """

    backend_name = "sql"
    token_prefix = "pai-sql"
    # The lifecycle primitives below run inside the database (see docs/lifecycle.md).
    capabilities: ClassVar[frozenset[str]] = frozenset({LIFECYCLE})

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        table_prefix: str | None = None,
        busy_timeout: float | None = None,
        pool_size: int | None = None,
        connect_timeout: float | None = None,
        retry_attempts: int | None = None,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning, token_secret=token_secret)
        self._client = SqlClient.attached(
            url,
            client,
            table_prefix=table_prefix,
            busy_timeout=busy_timeout,
            pool_size=pool_size,
            connect_timeout=connect_timeout,
            retry_attempts=retry_attempts,
        )
        self.url = self._client.url
        self.tables: Tables = self._client.tables
        self._ord_bytes: int | None = None if self._client.dialect == "sqlite" else ORDER_BYTES
        self._statements: dict[Hashable, Any] = {}
        self._compiled: dict[Hashable, Statement] = {}

    def statement(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The statement ``key`` names, built once per store (SQLAlchemy then reuses
        its compiled form): only values change between calls, as bound parameters."""
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = build()
        return found

    def sql(self, op: Operation, key: Hashable, build: Callable[[], Any]) -> Statement:
        """The statement ``key`` names, compiled once per store for its dialect and
        run on the driver connection (the hot statements of commits and reads)."""
        found = self._compiled.get(key)
        if found is None:
            found = self._compiled[key] = op.compile(build())
        return found

    def __repr__(self) -> str:
        return f"SqlThreadStore({str(self.url)!r}, table_prefix={self.tables.prefix!r})"

    @property
    def client(self) -> SqlClient:
        """The shared client (engines, tables, transactions)."""
        return self._client

    # ------------------------------------------------------------ lifecycle

    async def _initialize(self) -> None:
        await self._client.ready()

    async def _close(self) -> None:
        await self._client.release()

    async def _info(self) -> StoreInfo:
        return StoreInfo(
            backend="sql",
            server_version=self._client.server_version,
            transactions=True,
            details={
                "url": str(self.url),
                "dialect": self._client.dialect,
                "table_prefix": self.tables.prefix,
                "schema_version": str(SCHEMA_VERSION),
            },
        )

    # ------------------------------------------------------------ reads

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self.selections.plan_read(request)
        paged = any(getattr(plan, spec.attr) is not None for spec in FAMILIES)
        single = plan.single_page()
        # SQLite answers the root and one page in one statement (its own snapshot).
        combined = (
            single is not None and self._client.dialect == "sqlite" and single[1].statuses is None
        )

        async def read(op: Operation) -> ThreadReadResult:
            snapshot = _Snapshot(op, self, request.scope_key, request.thread_id)
            snapshot.combined = combined
            return await run_read(snapshot, plan, clock_now=self.now())

        # Statement by statement: a read is one or a few statements.
        return await self._client.run_read(read, snapshot=paged and not combined, in_thread=False)

    # ------------------------------------------------------------ listing

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self.selections.plan_list(request)
        return await self._client.run_read(
            lambda op: self._list(op, plan), snapshot=plan.include_hidden, in_thread=False
        )

    def _ord(self, thread_id: bytes) -> bytes:
        return thread_id if self._ord_bytes is None else thread_id[: self._ord_bytes]

    def list_statement(self, plan: ListPlan, hidden: int, cursor: bool | None) -> Select[Any]:
        """One visibility's bounded index range scan, in ``(sort_key, thread_ord)`` order.

        Binds ``scope``, ``fetch`` and, with a cursor (``cursor`` is then
        whether the cursor's id was cut to fit ``thread_ord``), ``cs`` (sort
        key) and ``co`` (the cursor's thread id as ``thread_ord``).
        """
        t = self.tables.threads
        where = [t.c.scope_h == bindparam("scope"), t.c.hidden == hidden]
        if plan.agent is not None:
            where.append(t.c.agent_h == bindparam("agent"))
        if plan.parent_thread_id is not None:
            where.append(t.c.parent_h == bindparam("parent"))
        if plan.category is not None:
            where.append(t.c.category_h == bindparam("category"))
        if cursor is not None:
            # Inclusive only when the cursor's id is longer than thread_ord keeps:
            # then its whole tie is read and cut exactly by the full thread id.
            after = (
                t.c.thread_ord >= bindparam("co") if cursor else t.c.thread_ord > bindparam("co")
            )
            where.append(
                or_(
                    t.c.sort_key > bindparam("cs"),
                    and_(t.c.sort_key == bindparam("cs"), after),
                )
            )
        return (
            select(t.c.sort_key, t.c.thread_ord, t.c.thread_id, t.c.doc)
            .where(*where)
            .order_by(t.c.sort_key, t.c.thread_ord)
            .limit(bindparam("fetch"))
        )

    async def _list(self, op: Operation, plan: ListPlan) -> Page[ThreadRecord]:
        t = self.tables.threads
        conn = op.conn
        params: dict[str, Any] = {"scope": digest(plan.scope_key), "fetch": plan.fetch}
        if plan.agent is not None:
            params["agent"] = digest(plan.agent)
        if plan.parent_thread_id is not None:
            params["parent"] = digest(plan.parent_thread_id)
        if plan.category is not None:
            params["category"] = digest(plan.category)
        visibilities = (0, 1) if plan.include_hidden else (0,)
        shape = (
            plan.agent is not None,
            plan.parent_thread_id is not None,
            plan.category is not None,
        )
        # SQLite keeps whole ids in thread_ord: one visibility's rows come in the
        # exact order, strictly after the cursor, each thread once.
        ordered = self._ord_bytes is None and len(visibilities) == 1

        async def batch(cursor: ListCursor | None) -> Sequence[ListRow]:
            rows: list[tuple[int, bytes, str]] = []
            for hidden in visibilities:
                args = dict(params)
                cut: bool | None = None
                if cursor is not None:
                    args["cs"], args["co"] = cursor[0], self._ord(cursor[1])
                    cut = len(args["co"]) < len(cursor[1])
                    if cut:
                        # The tie of the cut cursor id is read too: make room for it.
                        tied = select(func.count()).where(
                            t.c.scope_h == params["scope"],
                            t.c.hidden == hidden,
                            t.c.sort_key == cursor[0],
                            t.c.thread_ord == args["co"],
                        )
                        args["fetch"] += int((await conn.execute(tied)).scalar_one())
                key = ("list", *shape, hidden, cut)
                stmt = self._compiled.get(key)
                if stmt is None:
                    stmt = self.sql(
                        op, key, functools.partial(self.list_statement, plan, hidden, cut)
                    )
                got: list[Any] = await op.rows(stmt, args)
                if got and len(got) == args["fetch"] and len(got[-1][1]) == self._ord_bytes:
                    # Ids longer than thread_ord tie on it: read the whole tie so
                    # that the exact order (full thread id) is known.
                    last = got[-1]
                    tie = select(t.c.sort_key, t.c.thread_ord, t.c.thread_id, t.c.doc).where(
                        t.c.scope_h == params["scope"],
                        t.c.hidden == hidden,
                        t.c.sort_key == last[0],
                        t.c.thread_ord == last[1],
                    )
                    more = (await conn.execute(tie)).all()
                    got = [*got, *more]
                rows.extend([(r[0], r[2], r[3]) for r in got])
            if ordered:
                return [(int(s), bytes(tid), doc) for s, tid, doc in rows[: plan.fetch]]
            unique = {(int(s), bytes(tid)): doc for s, tid, doc in rows}
            return [
                (s, tid, unique[(s, tid)])
                for s, tid in sorted(k for k in unique if cursor is None or k > cursor)
            ][: plan.fetch]

        with self._client.errors("read"):
            return await list_page(plan, batch, self.warn)

    # ------------------------------------------------------------ lifecycle

    async def _thread_heads(
        self,
        scope_key: str | None,
        *,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> Sequence[ThreadIndexEntry]:
        """A bounded range scan of ``<p>_scope_updated`` (one scope) or ``<p>_updated``."""
        t = self.tables.threads
        cols = (t.c.scope_key, t.c.thread_id, t.c.instance_id, t.c.revision, t.c.updated_ms)
        where: list[Any] = []
        order: list[Any] = [t.c.updated_ms]
        if scope_key is not None:
            where.append(t.c.scope_h == digest(scope_key))
        else:
            order.append(t.c.scope_ord)
        order.append(t.c.thread_ord)
        if updated_before is not None:
            where.append(t.c.updated_ms < timestamp_ms(updated_before))
        tie: list[Any] = []
        if after is not None and self._ord_bytes is None:
            # SQLite keeps whole ids in the ord columns: a strict row-value bound.
            at = timestamp_ms(after.updated_at)
            bound = [
                at,
                *([enc(after.scope_key)] if scope_key is None else []),
                enc(after.thread_id),
            ]
            columns = [
                t.c.updated_ms,
                *([t.c.scope_ord] if scope_key is None else []),
                t.c.thread_ord,
            ]
            where.append(tuple_(*columns) > tuple_(*bound))
        elif after is not None:
            # Inclusive on the ord columns (they may be cut on MySQL); rows not
            # strictly after `after` are dropped below by their full ids.
            at = timestamp_ms(after.updated_at)
            s_ord, t_ord = self._ord(enc(after.scope_key)), self._ord(enc(after.thread_id))
            if scope_key is not None:
                tie = [t.c.updated_ms == at, t.c.thread_ord == t_ord]
                later = and_(t.c.updated_ms == at, t.c.thread_ord >= t_ord)
            else:
                tie = [t.c.updated_ms == at, t.c.scope_ord == s_ord]
                later = and_(
                    t.c.updated_ms == at,
                    or_(
                        t.c.scope_ord > s_ord,
                        and_(t.c.scope_ord == s_ord, t.c.thread_ord >= t_ord),
                    )
                    if len(s_ord) == len(enc(after.scope_key))
                    else t.c.scope_ord >= s_ord,
                )
            where.append(or_(t.c.updated_ms > at, later))
        async with self._client.read() as conn:
            fetch = limit
            if tie:
                count = select(func.count()).where(*where[: 1 if scope_key else 0], *tie)
                fetch += int((await conn.execute(count)).scalar_one())
            index = f"{t.name}_updated" if scope_key is None else f"{t.name}_scope_updated"
            stmt = (
                select(*cols, t.c.scope_ord, t.c.thread_ord)
                .where(*where)
                .order_by(*order)
                .with_hint(t, f"FORCE INDEX ({index})", "mysql")
            )
            rows = list((await conn.execute(stmt.limit(fetch))).all())
            if len(rows) == fetch and rows:
                last = rows[-1]
                if self._ord_bytes is not None and (
                    len(last.thread_ord) == self._ord_bytes
                    or len(last.scope_ord) == self._ord_bytes
                ):
                    # Ids longer than the ord columns tie on them: read the whole tie.
                    same = [
                        *where,
                        t.c.updated_ms == last.updated_ms,
                        t.c.scope_ord == last.scope_ord,
                        t.c.thread_ord == last.thread_ord,
                    ]
                    rows += (
                        await conn.execute(
                            select(*cols, t.c.scope_ord, t.c.thread_ord).where(*same)
                        )
                    ).all()
        after_key = (
            None
            if after is None
            else (timestamp_ms(after.updated_at), enc(after.scope_key), enc(after.thread_id))
        )
        keyed = {(int(r.updated_ms), bytes(r.scope_key), bytes(r.thread_id)): r for r in rows}
        heads = []
        for key in sorted(k for k in keyed if after_key is None or k > after_key)[:limit]:
            r = keyed[key]
            heads.append(
                ThreadIndexEntry(
                    dec(r.scope_key),
                    dec(r.thread_id),
                    _version(r),
                    _EPOCH + timedelta(milliseconds=int(r.updated_ms)),
                )
            )
        return heads

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        """The root and every row of the thread, from one read snapshot."""
        async with self._client.reading() as op:
            conn = op.conn
            rows = _ThreadRows(op, self, scope_key, thread_id)
            t = self.tables.threads
            head = (
                await conn.execute(
                    select(t.c.doc, t.c.messages_next, t.c.runs_next, t.c.queued_next).where(
                        t.c.tkey == rows.key
                    )
                )
            ).first()
            if head is None:
                return None
            root = rows.parse_root(head.doc)
            positions = _ThreadRows._positions(head)
            families: dict[FamilyName, Family[Any]] = {}
            for spec in FAMILIES:
                table = rows.table(spec.name)
                found = (
                    await conn.execute(
                        select(table.c.position, table.c.doc)
                        .where(table.c.tkey == rows.key)
                        .order_by(table.c.position)
                    )
                ).all()
                entries: dict[str, Entry[Any]] = {}
                for r in found:
                    record = parse(spec.model, r.doc)
                    entries[spec.record_id(record)] = Entry(int(r.position), record)
                families[spec.name] = Family(entries, positions[spec.name])
        return ThreadAggregate(
            root, families["messages"], families["runs"], families["queuedItems"]
        )

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        """Insert the root and every row in one write transaction, if the thread is missing."""
        return await self._client.retrying(lambda: self._restore_once(aggregate))

    async def _restore_once(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        root = aggregate.root
        families: dict[FamilyName, Family[Any]] = {
            "messages": aggregate.messages,
            "runs": aggregate.runs,
            "queuedItems": aggregate.queued_items,
        }
        try:
            async with self._client.writing() as op:
                tx = _Transaction(op, self, root.scope_key, root.thread_id, _RESTORE)
                await tx.hold()
                positions = {name: fam.next_position for name, fam in families.items()}
                await tx.write_root(root, positions, created=True)
                for spec in FAMILIES:
                    entries = list(families[spec.name])
                    if entries:
                        await tx.write_family(spec, FamilyWrite(inserts=entries))
        except ThreadConflict as conflict:
            return conflict.current
        return None

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        """The fork in one write transaction; the copied rows never leave the database.

        The source root is held (``FOR UPDATE`` on MySQL; SQLite's write
        transaction holds the database), the fork's plan made from reads in the
        same transaction (so at the held version), its root inserted, then
        one ``INSERT ... SELECT`` per family copies the rows the plan keeps.
        """
        return await self._client.retrying(lambda: self._fork_once(fork))

    async def _fork_once(self, request: ForkRequest) -> ThreadRecord:
        async with self._client.writing() as op:
            conn = op.conn
            source = _Transaction(op, self, request.scope_key, request.source_thread_id)
            held = await source.hold()
            snapshot = _Snapshot(op, self, request.scope_key, request.source_thread_id)
            plan = await request.plan_in(self, snapshot)  # a missing source raises
            if held.root is None or held.root.version != plan.source_version:
                raise SourceChanged
            now = None if plan.test_now is not None else await self._client.server_time(conn)
            root = plan.root(now)
            fork = _Transaction(op, self, plan.scope_key, plan.thread_id, _RESTORE)
            await fork.hold()
            await fork.write_root(root, held.next_positions, created=True)
            dropped = [digest(i) for i in sorted(plan.dropped_run_ids)]
            m, r = self.tables.messages, self.tables.runs
            keep_messages: list[Any] = [m.c.tkey == source.key]
            if plan.through_message_id is not None:
                cut = (
                    await conn.execute(
                        select(m.c.position).where(
                            m.c.tkey == source.key, m.c.id_h == digest(plan.through_message_id)
                        )
                    )
                ).scalar()
                if cut is None:  # the plan was made from this very version
                    raise SourceChanged
                keep_messages.append(m.c.position <= int(cut))
            keep_runs: list[Any] = [r.c.tkey == source.key]
            if dropped:
                keep_messages.append(or_(m.c.run_h.is_(None), m.c.run_h.not_in(dropped)))
                keep_runs.append(r.c.id_h.not_in(dropped))
            for table, keep in ((m, keep_messages), (r, keep_runs)):
                names = [c.name for c in table.columns if c.name != "tkey"]
                rows = select(
                    literal(fork.key, type_=table.c.tkey.type).label("tkey"),
                    *(table.c[n] for n in names),
                ).where(*keep)
                await conn.execute(insert(table).from_select(["tkey", *names], rows))
            return root

    # ------------------------------------------------------------ commits

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        return await self._client.retrying(lambda: self._commit_once(request))

    async def _commit_once(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        """One attempt: the write transaction, the core's commit pipeline, commit or roll back."""

        async def attempt(op: Operation) -> CommittedResult:
            tx = _Transaction(op, self, request.scope_key, request.thread_id, request.mutation)
            result = await run_commit(tx, request, clock=self.now)
            if isinstance(result, ConflictResult):
                raise _Conflict(result)
            return result

        try:
            return await self._client.run_write(attempt)
        except _Conflict as conflict:
            return conflict.result


# ---------------------------------------------------------------- pipeline primitives


class _ThreadRows:
    """Queries over one thread's rows on one connection (shared by commits and reads)."""

    def __init__(
        self, op: Operation, store: SqlThreadStore, scope_key: str, thread_id: str
    ) -> None:
        self._op = op
        self._conn = _connection(op, store)
        self._store = store
        self._client = store.client
        self._t = store.tables
        self._scope_key = scope_key
        self._thread_id = thread_id
        self._key = thread_key(scope_key, thread_id)

    @property
    def key(self) -> bytes:
        return self._key

    def table(self, family: FamilyName) -> Table:
        return self._table(family)

    def parse_root(self, doc: str) -> ThreadRecord:
        return self._parse_root(doc)

    def _table(self, family: FamilyName) -> Table:
        t = self._t
        return {"messages": t.messages, "runs": t.runs, "queuedItems": t.queued}[family]

    def _parse_root(self, doc: str) -> ThreadRecord:
        root = parse(ThreadRecord, doc)
        if root.scope_key != self._scope_key or root.thread_id != self._thread_id:
            raise ThreadStoreInvariantError(
                "stored thread root does not match its key (scope_key/thread_id)"
            )
        return root

    @staticmethod
    def _positions(row: Any) -> dict[FamilyName, int]:
        return {name: int(getattr(row, col)) for name, col in _NEXT_COLUMN.items()}

    @staticmethod
    def _next(messages: Any, runs: Any, queued: Any) -> dict[FamilyName, int]:
        return {"messages": int(messages), "runs": int(runs), "queuedItems": int(queued)}

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        if not ids:
            return {}
        table = self._table(spec.name)
        id_col = table.c[_ID_COLUMN[spec.name]]
        stmt = self._store.sql(
            self._op,
            ("load", spec.name),
            lambda: select(table.c.position, id_col, table.c.doc).where(
                table.c.tkey == bindparam("k"),
                table.c.id_h.in_(bindparam("ids", expanding=True)),
            ),
        )
        params = {"k": self._key, "ids": [digest(i) for i in ids]}
        rows = await self._op.rows(stmt, params)
        wanted = {enc(i): i for i in ids}
        found: dict[str, Entry[Any]] = {}
        for position, stored_id, doc in rows:
            rid = wanted.get(bytes(stored_id))  # bytes: a damaged column may not decode
            if rid is None:  # another id with the same digest
                continue
            record = parse(spec.model, doc)
            if spec.record_id(record) != rid:
                raise ThreadStoreInvariantError(
                    f"stored {spec.noun} record does not match its id column"
                )
            found[rid] = Entry(int(position), record)
        return found


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

    async def hold(self) -> HeldThread:
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
                select(t.c.messages_next, t.c.runs_next, t.c.queued_next, t.c.doc)
                .where(t.c.tkey == bindparam("k"))
                .with_for_update()
            ),
        )
        rows = await self._op.rows(stmt, {"k": self._key})
        if not rows:
            return HeldThread(None)
        messages, runs, queued, doc = rows[0]
        return HeldThread(self._parse_root(doc), self._next(messages, runs, queued))

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
            "doc": dump(root),
        }
        self._check_size("thread root", values["doc"])
        if not created:
            names = list(values)
            stmt = self._store.sql(
                self._op,
                "root-update",
                lambda: (
                    update(t)
                    .where(t.c.tkey == bindparam("k"))
                    .values({c: bindparam(f"b_{c}") for c in names})
                ),
            )
            await self._op.execute(stmt, {"k": self._key, **{f"b_{c}": values[c] for c in names}})
            return
        thread = enc(self._thread_id)
        values.update(
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
        return _Reader(self._op, self._store, self._key)


class _Snapshot(_ThreadRows, ReadSnapshot):
    """The read primitives; the caller runs them in one read snapshot."""

    combined = False
    """Whether :meth:`head_and_page` answers (the read then has no explicit snapshot)."""

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        """The root and the page in one ``UNION ALL`` statement (SQLite).

        Its second part reads the page's rows by position from a bounded index
        range scan below the family's counter (a scalar subquery on the root).
        """
        if not self.combined:
            return None
        table = self._table(spec.name)
        view = plan.view if spec.name == "messages" and plan.view in VIEWS else None
        run_filter = spec.name == "queuedItems" and plan.run_id is not None
        params: dict[str, Any] = {
            "k": self._key,
            "lo": window.lower,
            "hi": window.upper,
            "n": window.fetch,
        }
        if run_filter:
            params["run"] = digest(cast(str, plan.run_id))
        shape = (spec.name, view, window.order, run_filter)
        threads = self._t.threads
        stmt = self._store.sql(
            self._op,
            ("head-page", *shape),
            lambda: _head_page_statement(threads, table, _NEXT_COLUMN[spec.name], *shape),
        )
        now = datetime.now(UTC)
        head: Any = None
        found: list[tuple[int, str, bytes]] = []
        rows = await self._op.rows(stmt, params)
        for doc, messages, runs, queued, position, row_doc, row_id in rows:
            if position is None:
                head = (doc, messages, runs, queued)
            else:
                found.append((int(position), row_doc, row_id))
        if head is None:
            return SnapshotRoot(now, None), []
        # Positions are unique: the documents are never compared.
        found.sort(reverse=window.order == "newest")
        root = self._parse_root(head[0])
        return SnapshotRoot(now, root, self._next(*head[1:])), page_records(spec, found)

    async def head(self) -> SnapshotRoot:
        t = self._t.threads
        cols = (t.c.doc, t.c.messages_next, t.c.runs_next, t.c.queued_next)
        row: Any
        if self._op.sqlite:
            now = datetime.now(UTC)
            stmt = self._store.sql(
                self._op, "head", lambda: select(*cols).where(t.c.tkey == bindparam("k"))
            )
            rows = await self._op.rows(stmt, {"k": self._key})
            row = rows[0] if rows else None
        else:

            def build() -> Any:
                one = select(literal(1).label("one")).subquery()
                return select(*cols, func.utc_timestamp(6).label("now")).select_from(
                    one.outerjoin(t, t.c.tkey == bindparam("k"))
                )

            stmt = self._store.sql(self._op, "head", build)
            row = (await self._op.rows(stmt, {"k": self._key}))[0]
            now = cast(datetime, row[4]).replace(tzinfo=UTC)
        if row is None or row[0] is None:
            return SnapshotRoot(now, None)
        doc, messages, runs, queued = row[:4]
        return SnapshotRoot(now, self._parse_root(doc), self._next(messages, runs, queued))

    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        if not message_ids:
            return {}
        m = self._t.messages
        stmt = self._store.sql(
            self._op,
            "anchors",
            lambda: select(m.c.message_id, m.c.position).where(
                m.c.tkey == bindparam("k"), m.c.id_h.in_(bindparam("ids", expanding=True))
            ),
        )
        params = {"k": self._key, "ids": [digest(i) for i in message_ids]}
        rows = await self._op.rows(stmt, params)
        wanted = set(message_ids)
        out = {dec(message_id): int(position) for message_id, position in rows}
        return {k: v for k, v in out.items() if k in wanted}

    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        table = self._table(spec.name)
        view = plan.view if spec.name == "messages" and plan.view in VIEWS else None
        run_filter = spec.name == "queuedItems" and plan.run_id is not None
        statuses = sorted(plan.statuses) if plan.statuses is not None else []
        params: dict[str, Any] = {
            "k": self._key,
            "lo": window.lower,
            "hi": window.upper,
            "n": window.fetch,
        }
        if run_filter:
            params["run"] = digest(cast(str, plan.run_id))
        shape = (spec.name, view, window.order, run_filter, bool(statuses))
        stmt = self._store.sql(self._op, ("scan", *shape), lambda: _page_statement(table, *shape))
        if not statuses:
            found = list(await self._op.rows(stmt, params))
        else:
            # One bounded index range scan per status, merged here.
            found = []
            for status in statuses:
                found.extend(await self._op.rows(stmt, {**params, "status": status}))
            found.sort(key=lambda row: int(row[0]), reverse=window.order == "newest")
            del found[window.fetch :]
        return page_records(spec, found)


# ---------------------------------------------------------------- rows

VIEWS = ("transcript", "context")
"""Message views with their own index (``raw`` reads the primary key)."""


def _page_statement(
    table: Any, family: str, view: str | None, order: str, run_filter: bool, status: bool
) -> Any:
    """A child page: ``k`` thread key, ``lo``/``hi`` exclusive position bounds, ``n``
    rows, then ``run`` (a run id digest) or ``status`` when filtered."""
    where = [
        table.c.tkey == bindparam("k"),
        table.c.position > bindparam("lo"),
        table.c.position < bindparam("hi"),
    ]
    if view is not None:
        where.append(table.c[view] == true())
    if run_filter:
        where.append(table.c.run_h == bindparam("run"))
    if status:
        where.append(table.c.status == bindparam("status"))
    position = table.c.position
    return (
        select(position, table.c.doc, table.c[_ID_COLUMN[cast(FamilyName, family)]])
        .where(*where)
        .order_by(position.asc() if order == "oldest" else position.desc())
        .limit(bindparam("n"))
    )


def _head_page_statement(
    threads: Table,
    table: Table,
    next_column: str,
    family: str,
    view: str | None,
    order: str,
    run_filter: bool,
) -> Any:
    """The root (``k``) and one page of :func:`_page_statement`'s rows below the
    family's counter, as ``doc, messages_next, runs_next, queued_next, position,
    row_doc, row_id`` (the root's row has a ``NULL`` position, the page's rows
    ``NULL`` root columns)."""
    cap = select(threads.c[next_column]).where(threads.c.tkey == bindparam("k"))
    scanned = table.alias("scanned")
    page = (
        _page_statement(scanned, family, view, order, run_filter, False)
        .with_only_columns(scanned.c.position)
        .where(scanned.c.position < cap.scalar_subquery())
    )
    head = select(
        threads.c.doc,
        threads.c.messages_next,
        threads.c.runs_next,
        threads.c.queued_next,
        null().label("position"),
        null().label("row_doc"),
        null().label("row_id"),
    ).where(threads.c.tkey == bindparam("k"))
    rows = select(
        null(),
        null(),
        null(),
        null(),
        table.c.position,
        table.c.doc.label("row_doc"),
        table.c[_ID_COLUMN[cast(FamilyName, family)]].label("row_id"),
    ).where(table.c.tkey == bindparam("k"), table.c.position.in_(page))
    return union_all(head, rows)


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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_RESTORE = object()
"""The mutation of a restore: held like a create (the key must be missing)."""


def _connection(op: Operation, store: SqlThreadStore) -> AsyncConnection:
    """The connection for SQLAlchemy Core statements in ``op``: inside the database
    thread (:meth:`SqlClient.run_write`) they run on the driver, never through
    SQLAlchemy's asyncio layer."""
    return store.client.connection(op) if op.inline else op.conn


def _version(row: Any) -> ThreadVersion:
    return ThreadVersion(thread_instance_id=row.instance_id, revision=int(row.revision))


def _row(spec: FamilySpec, entry: Entry[Any]) -> dict[str, Any]:
    """The columns of one child row (without the thread key)."""
    rid = spec.record_id(entry.record)
    row: dict[str, Any] = {"position": entry.position, "id_h": digest(rid)}
    if spec.name == "messages":
        m = cast(Message, entry.record)
        row.update(
            message_id=enc(rid),
            run_h=_opt_digest(m.run_id),
            run_id=None if m.run_id is None else enc(m.run_id),
            relation=getattr(m.association, "relation", None),
            transcript=m.visibility.transcript,
            context=m.visibility.context,
        )
    elif spec.name == "runs":
        row.update(run_id=enc(rid), status=cast(RunRecord, entry.record).status)
    else:
        q = cast(QueuedItem, entry.record)
        row.update(queue_item_id=enc(rid), run_h=digest(q.run_id), run_id=enc(q.run_id))
    row["doc"] = dump(entry.record)
    return row


# ---------------------------------------------------------------- relationships


class _Reader:
    """Post-commit relationship facts, queried inside the commit's transaction."""

    def __init__(self, op: Operation, store: SqlThreadStore, key: bytes) -> None:
        self._op = op
        self._conn = _connection(op, store)
        self._store = store
        self._t = store.tables
        self._key = key

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        ids = list(run_ids)
        if not ids:
            return {}
        params = {"k": self._key, "ids": [digest(i) for i in ids]}
        conn, key, t, op = self._conn, self._key, self._t, self._op

        def stmt(name: str, build: Callable[[], Any]) -> Statement:
            return self._store.sql(op, name, build)

        m, q, r = t.messages, t.queued, t.runs
        runs: Sequence[Any] = await op.rows(
            stmt(
                "facts-runs",
                lambda: select(r.c.run_id, r.c.doc).where(
                    r.c.tkey == bindparam("k"), r.c.id_h.in_(bindparam("ids", expanding=True))
                ),
            ),
            params,
        )
        messages: Sequence[Any] = await op.rows(
            stmt(
                "facts-messages",
                lambda: (
                    select(m.c.run_id, m.c.position, m.c.message_id, m.c.relation)
                    .where(
                        m.c.tkey == bindparam("k"),
                        m.c.run_h.in_(bindparam("ids", expanding=True)),
                    )
                    .order_by(m.c.position)
                ),
            ),
            params,
        )
        items: Sequence[Any] = await op.rows(
            stmt(
                "facts-queued",
                lambda: (
                    select(q.c.run_id, q.c.queue_item_id, q.c.position)
                    .where(
                        q.c.tkey == bindparam("k"),
                        q.c.run_h.in_(bindparam("ids", expanding=True)),
                    )
                    .order_by(q.c.position)
                ),
            ),
            params,
        )
        facts = run_facts_from_rows(ids, runs, messages, items)
        for rid, lo, hi in gapped_spans(facts):
            foreign = (
                await conn.execute(
                    select(
                        exists().where(
                            m.c.tkey == key,
                            m.c.position > lo,
                            m.c.position < hi,
                            or_(m.c.run_h.is_(None), m.c.run_h != digest(rid)),
                        )
                    )
                )
            ).scalar()
            if foreign:
                facts[rid].foreign_inside = True
        return facts

    async def open_runs(self) -> Sequence[RunRef]:
        # Two is all the rules need: one bounded probe of (tkey, status) per status.
        r = self._t.runs
        stmt = self._store.sql(
            self._op,
            "open-runs",
            lambda: (
                select(r.c.run_id, r.c.doc)
                .where(r.c.tkey == bindparam("k"), r.c.status.in_(("running", "waiting")))
                .limit(2)
            ),
        )
        return [run_ref_from_row(row) for row in await self._op.rows(stmt, {"k": self._key})]

    async def tail(self) -> MessageRef | None:
        m = self._t.messages
        stmt = self._store.sql(
            self._op,
            "tail",
            lambda: (
                select(m.c.position, m.c.message_id, m.c.run_id, m.c.relation)
                .where(m.c.tkey == bindparam("k"))
                .order_by(m.c.position.desc())
                .limit(1)
            ),
        )
        rows = await self._op.rows(stmt, {"k": self._key})
        return message_ref_from_row(rows[0]) if rows else None
