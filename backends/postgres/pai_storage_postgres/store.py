"""The PostgreSQL thread store: normalized tables, one transaction per commit.

Commits and reads run the core's pipelines (:func:`~pai_storage.backend.run_commit`,
:func:`~pai_storage.backend.run_read`); this module supplies their primitives
over asyncpg. A commit runs in one transaction (:class:`_PgTransaction`): the
root row is held with ``SELECT ... FOR UPDATE`` (a create checks it is missing
and later inserts it with ``ON CONFLICT DO NOTHING``), the server's clock is
read after the hold, only the child rows the changes name are loaded, the net
writes are ``unnest`` statements, and the relationship rules are checked with
bounded queries inside the same transaction. A read of the root alone, or of
the root and one page without anchors, is one statement (its own snapshot);
other reads with pages run in one ``REPEATABLE READ READ ONLY`` transaction
(:class:`_PgSnapshot`), so the root and every page agree. Every page and list
is a bounded index range scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

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
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
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
    map_errors,
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
    enc_opt,
    list_page,
    page_records,
    parse,
)

from .client import SESSION_SETTINGS, PgClient, keep_session, terminate
from .errors import Phase, is_retryable, map_error
from .schema import SCHEMA_VERSION, Tables

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

__all__ = ["SESSION_SETTINGS", "PostgresThreadStore", "keep_session"]

COMMIT_ATTEMPTS = 3
"""Attempts for a commit that hits a serialization failure or deadlock."""

_NOW_SQL = "SELECT date_trunc('milliseconds', clock_timestamp())"

_LAST_POSITION = 2**63 - 1
"""The cut of a fork that copies every message (the largest ``bigint``)."""

T = TypeVar("T")


_ID_COLUMN: dict[FamilyName, str] = {
    "messages": "message_id",
    "runs": "run_id",
    "queuedItems": "queue_item_id",
}
"""The record id column of each family's table."""


@dataclass(frozen=True, slots=True)
class _Table:
    """Where one family lives; every other fact about it is in :data:`FAMILIES`.

    ``id_col`` is the record id column, ``next_col`` the family's position
    counter on the root row, ``extra`` the columns beside ``doc`` that pages
    and relationship checks filter on (name and SQL type).
    """

    table: str
    id_col: str
    next_col: str
    extra: tuple[tuple[str, str], ...]
    insert: str = field(init=False, repr=False, compare=False)
    """Insert the ``unnest`` of ``_columns``' arrays (made once)."""
    update: str = field(init=False, repr=False, compare=False)
    """Update rows by position and id from the same arrays (made once)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "insert", _insert_sql(self))
        object.__setattr__(self, "update", _update_sql(self))


@dataclass(frozen=True, slots=True)
class _Layout:
    """The store's tables: the roots table and each family's :class:`_Table`."""

    tables: Tables
    families: Mapping[FamilyName, _Table]

    @classmethod
    def of(cls, t: Tables) -> _Layout:
        messages_extra = (
            ("run_id", "bytea"),
            ("relation", "text"),
            ("transcript", "boolean"),
            ("context", "boolean"),
        )
        return cls(
            t,
            {
                "messages": _Table(
                    t.messages, _ID_COLUMN["messages"], "messages_next", messages_extra
                ),
                "runs": _Table(t.runs, _ID_COLUMN["runs"], "runs_next", (("status", "text"),)),
                "queuedItems": _Table(
                    t.queued, _ID_COLUMN["queuedItems"], "queued_next", (("run_id", "bytea"),)
                ),
            },
        )


class _Retry(Exception):
    """Internal: a serialization failure or deadlock; the attempt is rolled back and retried."""


@dataclass(frozen=True, slots=True)
class _Abort:
    """What a transaction body returns to roll back: then ``error`` is raised, or
    ``value`` returned."""

    value: Any = None
    error: Exception | None = None


class PostgresThreadStore(ThreadStore):
    """Thread state in PostgreSQL 13+ (asyncpg).

    Parameters
    ----------
    url:
        ``postgresql://user:password@host:port/database`` (also ``postgres://``
        and ``postgresql+asyncpg://``); query parameters go to asyncpg.
    client:
        An application's own ``asyncpg.Pool`` (never closed by pai-storage;
        the pool options below do not apply), or the
        :class:`~pai_storage_postgres.client.PgClient` shared by the stores
        of one ``connect()`` call.
    table_prefix:
        Base name of the tables (default ``"pai_threads"``).
    schema:
        PostgreSQL schema holding the tables (created if missing); default:
        the connection's ``search_path``.
    min_pool_size, max_pool_size:
        Connection-pool bounds (defaults 1 and 10).
    connect_timeout:
        Seconds to wait for a connection (default 10).
    command_timeout:
        Seconds a statement may run before it is abandoned (default: none).
    statement_cache_size:
        asyncpg's prepared-statement cache per connection (0 behind PgBouncer
        in transaction mode).
    clock, on_warning, token_secret:
        The common options of :class:`~pai_storage.ThreadStore` (checked
        there); production uses the server's ``clock_timestamp()``.
    """

    backend_name = "postgres"
    token_prefix = "pai-pg"
    capabilities = frozenset({LIFECYCLE})

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        table_prefix: str | None = None,
        schema: str | None = None,
        min_pool_size: int | None = None,
        max_pool_size: int | None = None,
        connect_timeout: float | None = None,
        command_timeout: float | None = None,
        statement_cache_size: int | None = None,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning, token_secret=token_secret)
        self._client = PgClient.attached(
            url,
            client,
            table_prefix=table_prefix,
            schema=schema,
            min_pool_size=min_pool_size,
            max_pool_size=max_pool_size,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
            statement_cache_size=statement_cache_size,
        )
        self.url = self._client.url
        self.tables = self._client.tables
        self._pool: asyncpg.Pool | None = None
        self._layout = _Layout.of(self.tables)
        self._list_sql: dict[tuple[bool, bool, bool, str, bool], str] = {}

    def __repr__(self) -> str:
        return (
            f"PostgresThreadStore({str(self.url)!r}, table_prefix={self.tables.prefix!r}, "
            f"schema={self.tables.schema!r})"
        )

    def _errors(self, phase: Phase) -> contextlib.AbstractContextManager[None]:
        """Map every driver exception of the block to the contract's errors."""
        return self._client.errors(phase)

    # ------------------------------------------------------------ lifecycle

    @property
    def _server_version(self) -> str | None:
        return self._client.server_version

    async def _initialize(self) -> None:
        """Take the shared pool, connected and with the schema ready (see :class:`PgClient`)."""
        self._pool = await self._client.pool()

    async def _close(self) -> None:
        self._pool = None
        await self._client.release()

    async def _info(self) -> StoreInfo:
        return StoreInfo(
            backend="postgres",
            server_version=self._server_version,
            transactions=True,
            details={
                "url": str(self.url),
                "schema": self.tables.schema or "(search_path)",
                "table_prefix": self.tables.prefix,
                "schema_version": str(SCHEMA_VERSION),
            },
        )

    def _connection(
        self, pool: asyncpg.Pool | None = None
    ) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        """A pooled connection for one operation (see :meth:`PgClient.connection`)."""
        if pool is None and self._pool is None:  # close() released the pool under this operation
            raise _closed_error()
        return self._client.connection(pool or self._pool)

    # ------------------------------------------------------------ reads

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self.selections.plan_read(request)
        single = plan.single_page()
        one_statement = (
            _one_statement(single[1])
            if single is not None
            else all(getattr(plan, spec.attr) is None for spec in FAMILIES)
        )
        if one_statement:
            # The root alone, or the root and one page (head_and_page): one
            # statement is its own snapshot, no transaction needed, and its
            # connection goes back to the pool before its rows are validated.
            statement = _StatementSnapshot(
                self._connection, self._layout, request.scope_key, request.thread_id
            )
            with self._errors("read"):
                return await run_read(statement, plan, clock_now=self.now())
        async with self._connection() as conn:
            with self._errors("read"):
                snapshot = _PgSnapshot(conn, self._layout, request.scope_key, request.thread_id)
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    return await run_read(snapshot, plan, clock_now=self.now())

    def page_statement(
        self,
        family: FamilyName,
        order: str,
        view: str | None = None,
        run_filter: bool = False,
        statuses: int = 0,
    ) -> str:
        """The SQL of a child page: ``$1`` scope, ``$2`` thread, ``$3``/``$4`` the
        exclusive position bounds, ``$5`` the row count, then the run id or statuses."""
        return page_statement(
            self._layout.families[family].table, family, order, view, run_filter, statuses
        )

    def head_page_statement(
        self,
        family: FamilyName,
        order: str,
        view: str | None = None,
        run_filter: bool = False,
        statuses: int = 0,
    ) -> str:
        """The SQL of a read of the root and one child page in one statement (the
        arguments of :meth:`page_statement`); see :func:`head_page_statement`."""
        table = self._layout.families[family]
        return head_page_statement(
            self._layout.tables.threads,
            table.table,
            table.next_col,
            family,
            order,
            view,
            run_filter,
            statuses,
        )

    # ------------------------------------------------------------ listing

    def list_statement(
        self, agent: bool, parent: bool, category: bool, vis: str, cursor: bool
    ) -> str:
        key = (agent, parent, category, vis, cursor)
        sql = self._list_sql.get(key)
        if sql is not None:
            return sql
        where = ["scope_key = $1"]
        n = 3
        if agent:
            where.append(f"agent = ${n}")
            n += 1
        if parent:
            where.append(f"parent_thread_id = ${n}")
            n += 1
        if category:
            where.append(f"category = ${n}")
            n += 1
        if cursor:
            where.append(f"(sort_key, thread_id) > (${n}, ${n + 1})")

        def branch(visibility: str) -> str:
            conds = [*where[:1], f"list_visibility = '{visibility}'", *where[1:]]
            return (
                f"SELECT sort_key, thread_id, doc FROM {self.tables.threads} "
                f"WHERE {' AND '.join(conds)} ORDER BY sort_key, thread_id LIMIT $2"
            )

        if vis == "visible":
            sql = branch("visible")
        else:
            # Both visibility values, each a bounded ordered index scan; merged here.
            sql = f"({branch('visible')}) UNION ALL ({branch('hidden')})"
        self._list_sql[key] = sql
        return sql

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self.selections.plan_list(request)
        async with self._connection() as conn:
            with self._errors("read"):
                return await self._list(conn, plan)

    async def _list(self, conn: asyncpg.Connection, plan: ListPlan) -> Page[ThreadRecord]:
        vis = "all" if plan.include_hidden else "visible"
        filters: list[Any] = [
            enc(v) for v in (plan.agent, plan.parent_thread_id, plan.category) if v is not None
        ]

        async def batch(cursor: ListCursor | None) -> Sequence[ListRow]:
            sql = self.list_statement(
                plan.agent is not None,
                plan.parent_thread_id is not None,
                plan.category is not None,
                vis,
                cursor is not None,
            )
            args: list[Any] = [enc(plan.scope_key), plan.fetch, *filters]
            if cursor is not None:
                args.extend(cursor)
            rows: list[Any] = await conn.fetch(sql, *args)  # records of ListRow's columns
            if vis != "visible":  # two ordered branches: merge them
                rows = sorted(rows, key=_list_order)[: plan.fetch]
            return rows

        return await list_page(plan, batch, self.warn)

    # ------------------------------------------------------------ commits

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        async def body(conn: asyncpg.Connection) -> CommittedResult | ConflictResult | _Abort:
            tx = _PgTransaction(conn, self._layout, request.scope_key, request.thread_id)
            tx.mutation = request.mutation
            result = await run_commit(tx, request, clock=self.now)
            return _Abort(result) if isinstance(result, ConflictResult) else result

        return await self._transaction(body, "commit")

    async def _transaction(
        self, body: Callable[[asyncpg.Connection], Awaitable[T | _Abort]], what: str
    ) -> T:
        """Run ``body`` in one ``READ COMMITTED`` transaction, retried on a
        serialization failure or deadlock (:data:`COMMIT_ATTEMPTS` attempts)."""
        last: BaseException | None = None
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                return await self._transaction_once(body)
            except _Retry as retry:
                last = retry.__cause__
                await asyncio.sleep(0.005 * (attempt + 1))
        raise ThreadStoreUnavailableError(
            f"the {what} kept hitting serialization failures or deadlocks "
            f"({COMMIT_ATTEMPTS} attempts); nothing was applied"
        ) from last

    async def _transaction_once(
        self, body: Callable[[asyncpg.Connection], Awaitable[T | _Abort]]
    ) -> T:
        """One attempt: ``BEGIN``, ``body``, ``COMMIT`` (``ROLLBACK`` on :class:`_Abort`)."""
        attempt = _Attempt(self.url)
        async with self._connection() as conn:
            try:
                with map_errors(attempt.translate):
                    await conn.execute("BEGIN")
                    result = await body(conn)
                    if isinstance(result, _Abort):
                        await conn.execute("ROLLBACK")
                    else:
                        attempt.phase = "commit"
                        await conn.execute("COMMIT")
                        return result
            except _Retry:
                await _rollback(conn)
                raise
            except ThreadStoreError:
                if attempt.driver_failed:
                    terminate(conn)  # the connection's state is unknown
                else:
                    await _rollback(conn)  # a judgement error: the connection is fine
                raise
            # Cancelled mid-transaction: _connection terminates the connection.
        assert isinstance(result, _Abort)
        if result.error is not None:
            raise result.error
        return cast(T, result.value)

    # ------------------------------------------------------------ lifecycle primitives

    async def _thread_heads(
        self,
        scope_key: str | None,
        *,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> Sequence[ThreadIndexEntry]:
        """A bounded range scan of ``<p>_scope_updated`` (one scope) or ``<p>_updated``."""
        sql = heads_statement(
            self.tables.threads,
            scope_key is not None,
            updated_before is not None,
            after is not None,
        )
        args: list[Any] = [limit]
        if scope_key is not None:
            args.append(enc(scope_key))
        if updated_before is not None:
            args.append(updated_before)
        if after is not None:
            args.append(after.updated_at)
            if scope_key is None:
                args.append(enc(after.scope_key))
            args.append(enc(after.thread_id))
        async with self._connection() as conn:
            with self._errors("read"):
                if scope_key is None:
                    rows = await conn.fetch(sql, *args)
                else:
                    # A generic plan knows no scope's size and may walk the global
                    # index, stepping over every other scope; a sweep is rare, so
                    # it gets a custom plan for its own scope each time.
                    async with conn.transaction(readonly=True):
                        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                        rows = await conn.fetch(sql, *args)
        return [
            ThreadIndexEntry(dec(r["scope_key"]), dec(r["thread_id"]), _version(r), r["updated_at"])
            for r in rows
        ]

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        """The root and every row of the thread, from one ``REPEATABLE READ`` snapshot."""
        async with self._connection() as conn:
            with self._errors("read"):
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    rows = _ThreadRows(conn, self._layout, scope_key, thread_id)
                    return await rows.load_all()

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        """Insert the root and every row in one transaction, only if the thread is missing."""
        root = aggregate.root
        families: dict[FamilyName, Family[Any]] = {
            "messages": aggregate.messages,
            "runs": aggregate.runs,
            "queuedItems": aggregate.queued_items,
        }

        async def body(conn: asyncpg.Connection) -> ThreadVersion | _Abort | None:
            tx = _PgTransaction(conn, self._layout, root.scope_key, root.thread_id)
            positions = {name: family.next_position for name, family in families.items()}
            try:
                await tx.write_root(root, positions, created=True)
            except ThreadConflict as conflict:
                if conflict.current is None:  # the holder was deleted meanwhile: again
                    return _Abort(error=_Retry())
                return _Abort(conflict.current)
            for spec in FAMILIES:
                entries = list(families[spec.name])
                if entries:
                    await tx.write_family(spec, FamilyWrite(inserts=entries))
            return None

        return await self._transaction(body, "restore")

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        """The fork in one transaction; the copied rows never leave the database.

        The source root is held (``FOR SHARE``: commits to it wait, other
        forks of it do not), the fork's plan made from reads in the same
        transaction (so at the held version), its root inserted, then one
        ``INSERT ... SELECT`` per family copies the rows the plan keeps.
        """
        scope = enc(fork.scope_key)
        source, target = enc(fork.source_thread_id), enc(fork.thread_id)
        sql = fork_statements(self._layout.tables)

        async def body(conn: asyncpg.Connection) -> ThreadRecord | _Abort:
            held = await conn.fetchrow(sql.hold, scope, source)
            snapshot = _PgSnapshot(conn, self._layout, fork.scope_key, fork.source_thread_id)
            try:
                plan = await fork.plan_in(self, snapshot)  # a missing source raises
            except SourceChanged as changed:
                return _Abort(error=changed)
            if held is None or _version(held) != plan.source_version:
                return _Abort(error=SourceChanged())
            dropped = [enc(i) for i in sorted(plan.dropped_run_ids)]
            now = None if plan.test_now is not None else await conn.fetchval(_NOW_SQL)
            root = plan.root(now)
            target_rows = _PgTransaction(conn, self._layout, plan.scope_key, plan.thread_id)
            positions = {name: int(held[t.next_col]) for name, t in self._layout.families.items()}
            try:
                await target_rows.write_root(root, positions, created=True)
            except ThreadConflict as conflict:
                return _Abort(error=conflict)
            cut = _LAST_POSITION
            if plan.through_message_id is not None:
                found = await conn.fetchval(sql.cut, scope, source, enc(plan.through_message_id))
                if found is None:  # the plan was made from this very version
                    return _Abort(error=SourceChanged())
                cut = int(found)
            await conn.execute(sql.copy_messages, scope, source, target, cut, dropped)
            await conn.execute(sql.copy_runs, scope, source, target, dropped)
            return root

        return await self._transaction(body, "fork")


class _Attempt:
    """Error translation for one commit attempt: which phase, and whether the driver failed."""

    def __init__(self, url: StoreURL) -> None:
        self.url = url
        self.phase: Phase = "write"
        self.driver_failed = False

    def translate(self, exc: Exception) -> Exception:
        if is_retryable(exc):
            return _Retry()
        self.driver_failed = True
        return map_error(exc, self.phase, self.url)


# ---------------------------------------------------------------- pipeline primitives


class _ThreadRows:
    """Queries over one thread's rows on one connection (shared by commits and reads)."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        layout: _Layout,
        scope_key: str,
        thread_id: str,
    ) -> None:
        self._conn = conn
        self._tables = layout.tables
        self._families = layout.families
        self._scope_key = scope_key
        self._thread_id = thread_id
        self._scope = enc(scope_key)
        self._thread = enc(thread_id)

    def _parse_root(self, doc: str) -> ThreadRecord:
        root = parse(ThreadRecord, doc)
        if root.scope_key != self._scope_key or root.thread_id != self._thread_id:
            raise ThreadStoreInvariantError(
                "stored thread root does not match its key (scope_key/thread_id)"
            )
        return root

    def _positions(self, row: Any) -> dict[FamilyName, int]:
        return {name: int(row[table.next_col]) for name, table in self._families.items()}

    async def load_all(self) -> ThreadAggregate | None:
        """The root and every row of the thread (run it in one snapshot)."""
        head = await self._conn.fetchrow(
            f"SELECT messages_next, runs_next, queued_next, doc FROM {self._tables.threads} "
            "WHERE scope_key = $1 AND thread_id = $2",
            self._scope,
            self._thread,
        )
        if head is None:
            return None
        root = self._parse_root(head["doc"])
        positions = self._positions(head)
        families: dict[FamilyName, Family[Any]] = {}
        for spec in FAMILIES:
            rows = await self._conn.fetch(
                whole_family_statement(self._families[spec.name].table), self._scope, self._thread
            )
            entries: dict[str, Entry[Any]] = {}
            for position, doc in rows:
                record = parse(spec.model, doc)
                entries[spec.record_id(record)] = Entry(int(position), record)
            families[spec.name] = Family(entries, positions[spec.name])
        return ThreadAggregate(
            root, families["messages"], families["runs"], families["queuedItems"]
        )

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        wanted = [enc(i) for i in ids]
        if not wanted:
            return {}
        table = self._families[spec.name]
        rows = await self._conn.fetch(
            by_keys(table.table, table.id_col, f"t.position, t.{table.id_col} AS id, t.doc"),
            self._scope,
            self._thread,
            wanted,
        )
        found: dict[str, Entry[Any]] = {}
        for r in rows:
            record = parse(spec.model, r["doc"])
            rid = dec(r["id"])
            if spec.record_id(record) != rid:
                raise ThreadStoreInvariantError(
                    f"stored {spec.noun} record does not match its id column"
                )
            found[rid] = Entry(int(r["position"]), record)
        return found


class _PgTransaction(_ThreadRows, CommitTransaction):
    """The commit primitives inside the attempt's ``READ COMMITTED`` transaction.

    ``mutation`` is the commit's (a restore or a fork only writes a new root
    and rows, and never holds).
    """

    mutation: object = None

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
        return HeldThread(self._parse_root(row["doc"]), self._positions(row))

    async def server_time(self) -> datetime:
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
            dump(root),
        )
        if not created:
            await self._conn.execute(update_root_statement(t), *args)
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


class _PgSnapshot(_ThreadRows, ReadSnapshot):
    """The read primitives; the caller runs them in one ``REPEATABLE READ`` snapshot
    (except :meth:`head_and_page`, one statement and so its own snapshot)."""

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        """The rows of one statement, on the snapshot's connection."""
        rows: list[Any] = await self._conn.fetch(sql, *args)
        return rows

    async def head(self) -> SnapshotRoot:
        (row,) = await self._fetch(head_statement(self._tables.threads), self._scope, self._thread)
        if row["doc"] is None:
            return SnapshotRoot(row["now"], None)
        return SnapshotRoot(row["now"], self._parse_root(row["doc"]), self._positions(row))

    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        rows = await self._conn.fetch(
            by_keys(self._tables.messages, "message_id", "t.message_id, t.position"),
            self._scope,
            self._thread,
            [enc(i) for i in message_ids],
        )
        return {dec(r["message_id"]): int(r["position"]) for r in rows}

    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        table = self._families[spec.name]
        args: list[Any] = [self._scope, self._thread, window.lower, window.upper, window.fetch]
        statuses = sorted(plan.statuses) if plan.statuses is not None else []
        run_filter = spec.name == "queuedItems" and plan.run_id is not None
        sql = page_statement(
            table.table, spec.name, window.order, plan.view, run_filter, len(statuses)
        )
        if run_filter:
            args.append(enc(cast(str, plan.run_id)))
        args.extend(statuses)
        rows = await self._conn.fetch(sql, *args)
        if len(statuses) > 1:
            # One bounded index range scan per status, merged here: the same
            # streaming merge MongoDB does for an $in on a leading index key.
            rows = sorted(rows, key=lambda r: r[0], reverse=window.order == "newest")
            del rows[window.fetch :]
        return page_records(spec, rows)  # (position, doc, id) rows

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        """The root and the page in one statement (:func:`head_page_statement`).

        One statement is its own snapshot: the page is bounded by the family's
        counter on the root row it returns, so no transaction is needed.
        """
        if not _one_statement(plan):
            return None  # several statuses: merged range scans, run in the read's transaction
        table = self._families[spec.name]
        statuses = sorted(plan.statuses) if plan.statuses is not None else []
        run_filter = spec.name == "queuedItems" and plan.run_id is not None
        sql = head_page_statement(
            self._tables.threads,
            table.table,
            table.next_col,
            spec.name,
            window.order,
            plan.view,
            run_filter,
            len(statuses),
        )
        args: list[Any] = [self._scope, self._thread, window.lower, window.upper, window.fetch]
        if run_filter:
            args.append(enc(cast(str, plan.run_id)))
        args.extend(statuses)
        head: Any = None
        page: list[tuple[int, str, bytes]] = []
        # Columns by index (see head_page_statement): now, doc, the three
        # counters, position and record id (NULL on the root row).
        for row in await self._fetch(sql, *args):
            if row[5] is None:
                head = row
            else:
                page.append((row[5], row[1], row[6]))
        if head is None:  # unreachable: the root part always returns its one row
            raise ThreadStoreInvariantError("a read returned no root row")
        if head[1] is None:
            return SnapshotRoot(head[0], None), ()
        root = self._parse_root(head[1])
        # UNION ALL promises no order across or within its parts: sort here
        # (the rows come in order, so this is one linear pass).
        page.sort(reverse=window.order == "newest")  # positions are unique
        return SnapshotRoot(head[0], root, self._positions(head)), page_records(spec, page)


class _StatementSnapshot(_PgSnapshot):
    """The snapshot of a read that is one statement (:meth:`head`, or
    :meth:`head_and_page` of a plan :func:`_one_statement` accepts), its own
    snapshot: the statement takes a pooled connection and gives it back as
    soon as its rows are in, before they are validated and copied, so the
    connection serves the next operation sooner. The other primitives have no
    connection: a read of more than one statement runs on :class:`_PgSnapshot`
    in a transaction."""

    def __init__(
        self,
        lease: Callable[[], contextlib.AbstractAsyncContextManager[asyncpg.Connection]],
        layout: _Layout,
        scope_key: str,
        thread_id: str,
    ) -> None:
        super().__init__(None, layout, scope_key, thread_id)
        self._lease = lease

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        async with self._lease() as conn:
            rows: list[Any] = await conn.fetch(sql, *args)
        return rows

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        raise _more_than_one_statement()

    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        raise _more_than_one_statement()

    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        raise _more_than_one_statement()


def _more_than_one_statement() -> ThreadStoreInvariantError:
    # Unreachable: _read_thread runs only one-statement plans on _StatementSnapshot.
    return ThreadStoreInvariantError(
        "internal error: a read of more than one statement ran outside a transaction"
    )


def _one_statement(plan: ChildPagePlan) -> bool:
    """Whether the root and this page are one statement (at most one status filter)."""
    return plan.statuses is None or len(plan.statuses) <= 1


# ---------------------------------------------------------------- statements and rows


def _list_order(row: Any) -> tuple[int, bytes]:
    return (row["sort_key"], row["thread_id"])


@functools.lru_cache(maxsize=64)
def head_statement(threads: str) -> str:
    """The root row of a read (``$1`` scope, ``$2`` thread) and the snapshot's time."""
    return (
        "SELECT date_trunc('milliseconds', clock_timestamp()) AS now, t.doc, "
        "t.messages_next, t.runs_next, t.queued_next "
        f"FROM (VALUES (1)) AS one LEFT JOIN {threads} t "
        "ON t.scope_key = $1 AND t.thread_id = $2"
    )


@functools.lru_cache(maxsize=512)
def head_page_statement(
    threads: str,
    table: str,
    next_col: str,
    family: FamilyName,
    order: str,
    view: str | None,
    run_filter: bool,
    statuses: int,
) -> str:
    """The root row and one child page in one statement: one snapshot, one round trip.

    The root is :func:`head_statement` (always one row, its ``position`` NULL),
    materialized once; the page is :func:`page_statement` run ``LATERAL`` to it
    with a second upper bound, ``position < <family counter>``, so a first page
    (whose ``$4`` is only a cap) stays inside what the root's version had
    committed and a missing thread (a NULL counter) yields no rows. The page's
    rows carry NULL root columns. ``UNION ALL`` promises no order: the caller
    sorts the page by position.
    """
    page = page_statement(table, family, order, view, run_filter, statuses, f"h.{next_col}")
    return (
        f"WITH h AS MATERIALIZED ({head_statement(threads)}) "
        "SELECT h.now, h.doc, h.messages_next, h.runs_next, h.queued_next, "
        "NULL::bigint AS position, NULL::bytea AS id FROM h "
        "UNION ALL (SELECT NULL, p.doc, NULL, NULL, NULL, p.position, p.id "
        f"FROM h, LATERAL ({page}) AS p)"
    )


@functools.lru_cache(maxsize=512)
def page_statement(
    table: str,
    family: FamilyName,
    order: str,
    view: str | None = None,
    run_filter: bool = False,
    statuses: int = 0,
    counter: str | None = None,
) -> str:
    """The SQL of a child page of ``table`` (see :meth:`PostgresThreadStore.page_statement`);
    ``counter``, when given, is a second exclusive upper bound (the family's counter)."""
    direction = "ASC" if order == "oldest" else "DESC"
    base = (
        f"SELECT position, doc, {_ID_COLUMN[family]} AS id FROM {table} "
        "WHERE scope_key = $1 AND thread_id = $2 AND position > $3 AND position < $4"
    )
    if counter is not None:
        base += f" AND position < {counter}"
    tail = f" ORDER BY position {direction} LIMIT $5"
    if family == "messages":
        views = {"transcript": " AND transcript", "context": " AND context"}
        return base + views.get(view or "raw", "") + tail
    if run_filter:
        return base + " AND run_id = $6" + tail
    if statuses == 0:
        return base + tail
    if statuses == 1:
        return base + " AND status = $6" + tail
    branches = [f"({base} AND status = ${6 + i}{tail})" for i in range(statuses)]
    return " UNION ALL ".join(branches)


@functools.lru_cache(maxsize=64)
def heads_statement(threads: str, scoped: bool, before: bool, after: bool) -> str:
    """Entries of the updated-at index: ``$1`` the row count, then the scope key
    (``scoped``), the ``updated_at`` bound (``before``), and the exclusive start
    (``after``: its updated_at, scope key unless ``scoped``, thread id).

    One scope is a range of ``<p>_scope_updated``, every scope one of
    ``<p>_updated``; the row-value comparison is the index order, so the
    start is an index bound, not a filter. (For a scope holding most of the
    threads the planner may walk ``<p>_updated`` instead, checking the scope
    key in the index: then too the walk is about what it returns.)
    """
    order = ["updated_at", "thread_id"] if scoped else ["updated_at", "scope_key", "thread_id"]
    where: list[str] = []
    n = 2
    if scoped:
        where.append(f"scope_key = ${n}")
        n += 1
    if before:
        where.append(f"updated_at < ${n}")
        n += 1
    if after:
        bound = ", ".join(f"${n + i}" for i in range(len(order)))
        where.append(f"({', '.join(order)}) > ({bound})")
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    return (
        f"SELECT scope_key, thread_id, instance_id, revision, updated_at FROM {threads}"
        f"{condition} ORDER BY {', '.join(order)} LIMIT $1"
    )


@functools.lru_cache(maxsize=64)
def whole_family_statement(table: str) -> str:
    """Every row of one thread in one family (``$1`` scope, ``$2`` thread), by position."""
    return (
        f"SELECT position, doc FROM {table} WHERE scope_key = $1 AND thread_id = $2 "
        "ORDER BY position"
    )


@dataclass(frozen=True, slots=True)
class ForkStatements:
    """The statements of a fork (``$1`` scope, ``$2`` source thread, ``$3`` the fork).

    ``hold``: the source root's version and counters, ``FOR SHARE``;
    ``cut``: the cut message's position; ``copy_messages`` (``$4`` the cut
    position, ``$5`` the dropped run ids) and ``copy_runs`` (``$4`` the
    dropped run ids): ``INSERT ... SELECT`` from the source's rows.
    """

    hold: str
    cut: str
    copy_messages: str
    copy_runs: str


@functools.lru_cache(maxsize=16)
def fork_statements(tables: Tables) -> ForkStatements:
    t, m, r = tables.threads, tables.messages, tables.runs
    key = "scope_key = $1 AND thread_id = $2"
    message_cols = "position, message_id, run_id, relation, transcript, context, doc"
    run_cols = "position, run_id, status, doc"
    return ForkStatements(
        hold=(
            f"SELECT instance_id, revision, messages_next, runs_next, queued_next FROM {t} "
            f"WHERE {key} FOR SHARE"
        ),
        cut=f"SELECT position FROM {m} WHERE {key} AND message_id = $3",
        copy_messages=(
            f"INSERT INTO {m} (scope_key, thread_id, {message_cols}) "
            f"SELECT scope_key, $3, {message_cols} FROM {m} WHERE {key} AND position <= $4 "
            "AND (run_id IS NULL OR run_id <> ALL($5::bytea[]))"
        ),
        copy_runs=(
            f"INSERT INTO {r} (scope_key, thread_id, {run_cols}) "
            f"SELECT scope_key, $3, {run_cols} FROM {r} WHERE {key} "
            "AND run_id <> ALL($4::bytea[])"
        ),
    )


def _version(row: Any) -> ThreadVersion:
    return ThreadVersion(thread_instance_id=row["instance_id"], revision=int(row["revision"]))


def _columns(spec: FamilySpec, entries: Sequence[Entry[Any]]) -> list[list[Any]]:
    """Column arrays ``position, id, <extra columns>, doc`` for ``unnest``."""
    positions = [e.position for e in entries]
    ids = [enc(spec.record_id(e.record)) for e in entries]
    docs = [dump(e.record) for e in entries]
    extra: list[list[Any]]
    if spec.name == "messages":
        records = [cast(Message, e.record) for e in entries]
        extra = [
            [enc_opt(m.run_id) for m in records],
            # A standalone message's association has no relation (read without
            # pydantic's __getattr__, which a missing attribute would call).
            [m.association.__dict__.get("relation") for m in records],
            [m.visibility.transcript for m in records],
            [m.visibility.context for m in records],
        ]
    elif spec.name == "runs":
        extra = [[cast(RunRecord, e.record).status for e in entries]]
    else:
        extra = [[enc(cast(QueuedItem, e.record).run_id) for e in entries]]
    return [positions, ids, *extra, docs]


def _unnest_params(table: _Table) -> str:
    types = ["bigint", "bytea", *(t for _, t in table.extra), "text"]
    return ", ".join(f"${i + 3}::{t}[]" for i, t in enumerate(types))


def _insert_sql(table: _Table) -> str:
    names = ["position", table.id_col, *(c for c, _ in table.extra), "doc"]
    return (
        f"INSERT INTO {table.table} (scope_key, thread_id, {', '.join(names)}) "
        f"SELECT $1, $2, * FROM unnest({_unnest_params(table)})"
    )


def _update_sql(table: _Table) -> str:
    names = ["position", "id", *(c for c, _ in table.extra), "doc"]
    sets = ", ".join(f"{c} = u.{c}" for c in [*(c for c, _ in table.extra), "doc"])
    return (
        f"UPDATE {table.table} AS t SET {sets} "
        f"FROM unnest({_unnest_params(table)}) AS u({', '.join(names)}) "
        f"WHERE t.scope_key = $1 AND t.thread_id = $2 AND t.position = u.position "
        f"AND t.{table.id_col} = u.id"
    )


def _closed_error() -> ThreadStoreConfigurationError:
    """What an operation that outlived ``close()`` raises (as the base class does)."""
    return ThreadStoreConfigurationError("this store is closed; open a new one")


async def _rollback(conn: asyncpg.Connection) -> None:
    try:
        if conn.is_closed():
            return
        await conn.execute("ROLLBACK")
    except Exception:
        terminate(conn)


# ---------------------------------------------------------------- relationships


@functools.lru_cache(maxsize=64)
def by_keys(table: str, column: str, select: str) -> str:
    """Rows of one thread whose ``column`` is in the ``$3`` array, one index probe per key.

    A ``LATERAL`` probe per key rather than ``= ANY($3)`` or a plain join: a
    generic plan believes a thread holds a handful of rows (the average), and
    would happily walk the whole thread and filter, O(thread) instead of O(keys).
    """
    cols = ", ".join(c.split(" AS ")[0].removeprefix("t.") for c in select.split(", "))
    where = f"scope_key = $1 AND thread_id = $2 AND {column} = k.id"
    if column == "run_id":
        where += " AND run_id IS NOT NULL"
    return (
        f"SELECT {select} FROM unnest($3::bytea[]) AS k(id) "
        # OFFSET 0 keeps the subquery from being pulled up into a join: it runs
        # once per key, as an equality probe of the (scope, thread, key) index.
        f"CROSS JOIN LATERAL (SELECT {cols} FROM {table} WHERE {where} OFFSET 0) AS t"
    )


@functools.lru_cache(maxsize=64)
def hold_statement(threads: str) -> str:
    """The root row of a thread being updated, locked until the commit ends."""
    return (
        f"SELECT messages_next, runs_next, queued_next, doc FROM {threads} "
        "WHERE scope_key = $1 AND thread_id = $2 FOR UPDATE"
    )


@functools.lru_cache(maxsize=64)
def update_root_statement(threads: str) -> str:
    """A commit's new root and counters (``$3`` to ``$11``, as ``write_root`` passes them)."""
    return (
        f"UPDATE {threads} SET revision = $3, list_visibility = $4, category = $5, "
        "updated_at = $6, sort_key = $7, messages_next = $8, runs_next = $9, "
        "queued_next = $10, doc = $11 WHERE scope_key = $1 AND thread_id = $2"
    )


@functools.lru_cache(maxsize=64)
def open_runs_statement(runs: str) -> str:
    """Up to two running or waiting runs (of the ``runs`` table): one equality
    range scan per status, so no plan can fall back to walking every run of
    the thread."""
    branch = (
        f"SELECT run_id, doc FROM {runs} WHERE scope_key = $1 AND thread_id = $2 "
        "AND status = '{}' LIMIT 2"
    )
    return f"({branch.format('running')}) UNION ALL ({branch.format('waiting')})"


@functools.lru_cache(maxsize=64)
def tail_statement(messages: str) -> str:
    """The last message (of the ``messages`` table)."""
    return (
        f"SELECT position, message_id, run_id, relation FROM {messages} "
        "WHERE scope_key = $1 AND thread_id = $2 ORDER BY position DESC LIMIT 1"
    )


class _Reader:
    """Post-commit relationship facts, queried inside the commit's transaction."""

    def __init__(self, conn: asyncpg.Connection, tables: Tables, scope: bytes, thread: bytes):
        self._conn = conn
        self._t = tables
        self._scope = scope
        self._thread = thread

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        ids = list(run_ids)
        keys = [enc(i) for i in ids]
        conn, s, th = self._conn, self._scope, self._thread
        runs = await conn.fetch(
            by_keys(self._t.runs, "run_id", "t.run_id, t.doc"),
            s,
            th,
            keys,
        )
        messages = await conn.fetch(
            by_keys(self._t.messages, "run_id", "t.run_id, t.position, t.message_id, t.relation"),
            s,
            th,
            keys,
        )
        items = await conn.fetch(
            by_keys(self._t.queued, "run_id", "t.run_id, t.queue_item_id, t.position"),
            s,
            th,
            keys,
        )
        facts = run_facts_from_rows(ids, runs, messages, items)
        spans = gapped_spans(facts)
        if spans:
            rows = await conn.fetch(
                f"SELECT r.run_id FROM unnest($3::bytea[], $4::bigint[], $5::bigint[]) "
                "AS r(run_id, lo, hi) WHERE EXISTS ("
                f"SELECT 1 FROM {self._t.messages} m WHERE m.scope_key = $1 "
                "AND m.thread_id = $2 AND m.position > r.lo AND m.position < r.hi "
                "AND m.run_id IS DISTINCT FROM r.run_id)",
                s,
                th,
                [enc(rid) for rid, _, _ in spans],
                [lo for _, lo, _ in spans],
                [hi for _, _, hi in spans],
            )
            for r in rows:
                facts[dec(r["run_id"])].foreign_inside = True
        return facts

    async def open_runs(self) -> Sequence[RunRef]:
        rows = await self._conn.fetch(open_runs_statement(self._t.runs), self._scope, self._thread)
        return [run_ref_from_row(r) for r in rows]

    async def tail(self) -> MessageRef | None:
        r = await self._conn.fetchrow(tail_statement(self._t.messages), self._scope, self._thread)
        return None if r is None else message_ref_from_row(r)
