"""The read primitives of the SQL thread store (the core's read pipeline).

Reads with pages run in one snapshot, so the root and every page agree; on
SQLite the root and one page are one ``UNION ALL`` statement (its own
snapshot). Every page is a bounded index range scan on ``(thread key, position)``
or a view's index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import bindparam, func, literal, literal_column, null, select, true, union_all

from pai_storage.backend import (
    ChildPagePlan,
    FamilyName,
    FamilySpec,
    ReadSnapshot,
    SnapshotRoot,
    Window,
)
from pai_storage.rows import dec, page_records

from .schema import digest
from .thread_rows import _ID_COLUMN, _NEXT_COLUMN, _ThreadRows

if TYPE_CHECKING:
    from sqlalchemy import Table


class _Snapshot(_ThreadRows, ReadSnapshot):
    """The read primitives; the caller runs them in one read snapshot."""

    combined = False
    """Whether :meth:`head_and_page` answers (the read then has no explicit snapshot)."""

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        """The root and the page in one ``UNION ALL`` statement (SQLite).

        Its second part reads the page's rows by rowid from a bounded index
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
    # The page's rows by their rowid, which every index entry holds: the
    # scan reads the index alone, and each row is one lookup by rowid.
    page = (
        _page_statement(scanned, family, view, order, run_filter, False)
        .with_only_columns(literal_column("scanned.rowid"))
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
    ).where(literal_column("rowid").in_(page))
    return union_all(head, rows)
