"""The PostgreSQL thread store: normalized tables, one transaction per commit.

Commits and reads run the core's pipelines (:func:`~pai_storage.backend.run_commit`,
:func:`~pai_storage.backend.run_read`); the backend supplies their primitives
over asyncpg, one module a job:

- this module: :class:`PostgresThreadStore`, its options, lifecycle, listing,
  and which read runs how;
- :mod:`.commit`: the commit transaction (:class:`~.commit._PgTransaction`):
  the root row held with ``SELECT ... FOR UPDATE`` (a create checks it is
  missing and later inserts it with ``ON CONFLICT DO NOTHING``), the server's
  clock read after the hold, only the child rows the changes name loaded, the
  net writes as ``unnest`` statements; :mod:`.relations` checks the
  relationship rules with bounded queries inside the same transaction;
- :mod:`.transactions`: ``BEGIN`` ... ``COMMIT``, retried on serialization
  failures and deadlocks;
- :mod:`.reads`: a read of the root alone, or of the root and one page
  without anchors, is one statement (its own snapshot); other reads with
  pages run in one ``REPEATABLE READ READ ONLY`` transaction, so the root and
  every page agree;
- :mod:`.lifecycle`: the updated-at index, whole-thread loads, restores and
  forks inside the database;
- :mod:`.layout` and :mod:`.statements`: the tables and their SQL. Every page
  and list is a bounded index range scan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    Page,
    ReadThreadInput,
    StoreInfo,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ThreadVersion,
)
from pai_storage.backend import (
    FAMILIES,
    LIFECYCLE,
    Clock,
    FamilyName,
    ForkRequest,
    ListPlan,
    StoreURL,
    ThreadAggregate,
    ThreadIndexEntry,
    WarningCallback,
    run_commit,
    run_read,
)
from pai_storage.clock import ServerClock
from pai_storage.errors import ThreadStoreConfigurationError
from pai_storage.root_cache import (
    RootCache,
    TextRoot,
    Unsure,
    judge_optimistic,
    keep_written,
    optimistic,
)
from pai_storage.rows import ListCursor, ListRow, enc, list_page
from pai_storage.watch import WATCH_CHANGES, ChangeSignal

from . import lifecycle
from .client import SESSION_SETTINGS, PgClient, keep_session
from .commit import Notice, _PgTransaction
from .errors import Phase
from .layout import _Layout
from .reads import _one_statement, _PgSnapshot, _StatementSnapshot
from .schema import SCHEMA_VERSION
from .statements import (
    by_keys,
    fork_statements,
    head_page_statement,
    head_statement,
    heads_statement,
    open_runs_statement,
    page_statement,
    tail_statement,
    whole_family_statement,
)
from .transactions import COMMIT_ATTEMPTS, _Abort, run_transaction
from .watch import PgNotifier

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

__all__ = [
    "COMMIT_ATTEMPTS",
    "SESSION_SETTINGS",
    "PostgresThreadStore",
    # The statement builders, importable here as before the store was split.
    "by_keys",
    "fork_statements",
    "head_page_statement",
    "head_statement",
    "heads_statement",
    "keep_session",
    "open_runs_statement",
    "page_statement",
    "tail_statement",
    "whole_family_statement",
]

T = TypeVar("T")


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
    capabilities = frozenset({LIFECYCLE, WATCH_CHANGES})

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
        self._watchers = PgNotifier(self._client, self._connection)  # NOTIFY / LISTEN
        self._roots: RootCache[tuple[str, str]] = RootCache()  # what this store committed
        self._server_clock = ServerClock()

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
        await self._watchers.close()
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

    def _change_signal(self, scope_key: str, thread_id: str | None) -> ChangeSignal:
        return self._watchers.signal(scope_key, thread_id)  # woken by NOTIFY (watch.py)

    # ------------------------------------------------------------ commits

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        key = (request.scope_key, request.thread_id)
        known = self._roots.get(key)
        if known is not None and optimistic(request, known):
            done = await self._commit_optimistic(request, known)
            if done is not None:
                return done
        written: TextRoot | None = None

        async def body(conn: asyncpg.Connection) -> CommittedResult | ConflictResult | _Abort:
            nonlocal written
            written = None  # an attempt rolled back and retried wrote nothing
            tx = self._commit_transaction(conn, request)
            result = await run_commit(tx, request, clock=self.now)
            if isinstance(result, ConflictResult):
                return _Abort(result)
            written = tx.written
            if tx.notified:  # the root's update sent the NOTIFY (commit.py)
                return result
            return await self._watchers.committed(conn, request, result)  # NOTIFY before COMMIT

        result: CommittedResult | ConflictResult = await self._transaction(body, "commit")
        if isinstance(result, CommittedResult):  # the thread's next commit may be optimistic
            keep_written(self._roots, key, written)
        return result

    async def _commit_optimistic(
        self, request: CommitThreadInput, known: TextRoot
    ) -> CommittedResult | None:
        """One round trip: the guarded write alone (see :mod:`.commit`); ``None``
        when the commit must be judged the usual way."""
        async with self._connection() as conn:
            tx = self._commit_transaction(conn, request)
            tx.known = known
            with self._errors("commit"):  # the write commits itself: a lost reply is unknown
                try:
                    result = await judge_optimistic(tx, request, self.now)
                except Unsure:  # judged again, held (a driver's error is mapped instead)
                    return None
        keep_written(self._roots, (request.scope_key, request.thread_id), tx.written)
        return result

    def _commit_transaction(
        self, conn: asyncpg.Connection, request: CommitThreadInput
    ) -> _PgTransaction:
        tx = _PgTransaction(conn, self._layout, request.scope_key, request.thread_id)
        tx.mutation = request.mutation
        tx.notice = Notice(self._watchers.channel, request)
        tx.clock = self._server_clock
        return tx

    async def _transaction(
        self, body: Callable[[asyncpg.Connection], Awaitable[T | _Abort]], what: str
    ) -> T:
        """Run ``body`` in one transaction, retried (see :func:`.transactions.run_transaction`)."""
        return await run_transaction(self._connection, self.url, body, what)

    # ------------------------------------------------------------ lifecycle primitives

    async def _thread_heads(
        self,
        scope_key: str | None,
        *,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> Sequence[ThreadIndexEntry]:
        return await lifecycle.thread_heads(
            self, scope_key, updated_before=updated_before, after=after, limit=limit
        )

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        return await lifecycle.load_thread(self, scope_key, thread_id)

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        return await lifecycle.restore_thread(self, aggregate)

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        return await lifecycle.fork_copy(self, fork)


def _list_order(row: Any) -> tuple[int, bytes]:
    return (row["sort_key"], row["thread_id"])


def _closed_error() -> ThreadStoreConfigurationError:
    """What an operation that outlived ``close()`` raises (as the base class does)."""
    return ThreadStoreConfigurationError("this store is closed; open a new one")
