"""The SQL thread store: normalized tables, one transaction per commit.

Commits and reads run the core's pipelines (:func:`~pai_storage.backend.run_commit`,
:func:`~pai_storage.backend.run_read`); the backend supplies their primitives
over SQLAlchemy Core, one module a job:

- this module: :class:`SqlThreadStore`, its options, lifecycle, listing (a
  bounded index range scan on ``(scope, visibility, sort key, thread id)``)
  and which read runs how;
- :mod:`.commit`: the commit transaction, in one write transaction of the
  shared :class:`~pai_storage_sql.client.SqlClient` (SQLite: ``BEGIN
  IMMEDIATE`` on the writer connection, so the whole database is held; MySQL:
  the root row held with ``SELECT ... FOR UPDATE``): the clock read after the
  hold, only the child rows the changes name loaded, the net changes written;
  :mod:`.relations` checks the relationship rules with bounded queries inside
  the same transaction;
- :mod:`.reads`: reads with pages run in one snapshot, so the root and every
  page agree; every page is a bounded index range scan on ``(thread key,
  position)``;
- :mod:`.lifecycle`: the updated-at index, whole-thread loads, restores and
  forks inside the database;
- :mod:`.thread_rows`: a thread's key and row columns, and the queries
  commits and reads share. The indexes are those of :mod:`.schema`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import Select, and_, bindparam, func, or_, select

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
    ForkRequest,
    ListPlan,
    StoreURL,
    ThreadAggregate,
    ThreadIndexEntry,
    WarningCallback,
    run_read,
)
from pai_storage.root_cache import RootCache
from pai_storage.rows import ListCursor, ListRow, list_page

from . import lifecycle
from .client import Operation, SqlClient, Statement
from .commit import commit_once
from .reads import _Snapshot
from .schema import ORDER_BYTES, SCHEMA_VERSION, Tables, digest
from .thread_rows import thread_key

__all__ = ["SqlThreadStore", "thread_key"]


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
        self.roots: RootCache[tuple[str, str]] = RootCache()
        """The roots this store committed (document and facts text): on SQLite,
        the next commit of a thread may be optimistic (:mod:`.commit`)."""

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

        return await self._client.run_read(read, snapshot=paged and not combined)

    # ------------------------------------------------------------ listing

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self.selections.plan_list(request)
        return await self._client.run_read(
            lambda op: self._list(op, plan), snapshot=plan.include_hidden
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
        """Insert the root and every row in one write transaction, if the thread is missing."""
        return await self._client.retrying(lambda: lifecycle.restore_once(self, aggregate))

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        """The fork in one write transaction (see :func:`.lifecycle.fork_once`)."""
        return await self._client.retrying(lambda: lifecycle.fork_once(self, fork))

    # ------------------------------------------------------------ commits

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        return await self._client.retrying(lambda: commit_once(self, request))
