"""The read primitives of a PostgreSQL thread store (the core's read pipeline).

A read of the root alone, or of the root and one page without anchors, is one
statement (:class:`_StatementSnapshot`, its own snapshot); other reads run on
:class:`_PgSnapshot` in one ``REPEATABLE READ READ ONLY`` transaction, so the
root and every page agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from pai_storage.backend import ChildPagePlan, Entry, FamilySpec, ReadSnapshot, SnapshotRoot, Window
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.rows import dec, enc, page_records

from .layout import _Layout
from .statements import by_keys, head_page_statement, head_statement, page_statement
from .thread_rows import _ThreadRows

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]


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
