"""Post-commit relationship facts of a SQL thread, queried inside the commit's transaction.

The rows come from bounded probes of the ``(thread key, id digest)`` and
``(thread key, run digest)`` indexes; the core folds them
(:func:`~pai_storage.backend.run_facts_from_rows`) and names the spans to look
inside for a foreign message (:func:`~pai_storage.backend.gapped_spans`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, exists, or_, select

from pai_storage.backend import (
    MessageRef,
    RunRef,
    RunRelations,
    gapped_spans,
    message_ref_from_row,
    run_facts_from_rows,
    run_ref_from_row,
)

from .client import Operation, Statement
from .schema import digest
from .thread_rows import _connection

if TYPE_CHECKING:
    from .store import SqlThreadStore


class _Reader:
    """Post-commit relationship facts, queried inside the commit's transaction.

    Each answer is kept: the check and the facts read back after it
    (:func:`~pai_storage.root_facts.read_facts`) ask once.
    """

    def __init__(self, op: Operation, store: SqlThreadStore, key: bytes) -> None:
        self._op = op
        self._conn = _connection(op, store)
        self._store = store
        self._t = store.tables
        self._key = key
        self._open: Sequence[RunRef] | None = None
        self._tail: tuple[MessageRef | None] | None = None
        self._runs: dict[str, RunRelations] = {}

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        ids = list(dict.fromkeys(run_ids))
        missing = [i for i in ids if i not in self._runs]
        if missing:
            self._runs.update(await self._query_run_facts(missing))
        return {i: self._runs[i] for i in ids if i in self._runs}

    async def _query_run_facts(self, ids: list[str]) -> dict[str, RunRelations]:
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
        if self._open is None:
            self._open = await self._query_open_runs()
        return self._open

    async def tail(self) -> MessageRef | None:
        if self._tail is None:
            self._tail = (await self._query_tail(),)
        return self._tail[0]

    async def _query_open_runs(self) -> list[RunRef]:
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

    async def _query_tail(self) -> MessageRef | None:
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
