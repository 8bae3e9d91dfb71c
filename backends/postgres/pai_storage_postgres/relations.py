"""Post-commit relationship facts of a PostgreSQL thread, queried inside the commit's transaction.

The rows come from bounded probes (:func:`.statements.by_keys`); the core folds
them (:func:`~pai_storage.backend.run_facts_from_rows`) and names the spans to
look inside for a foreign message (:func:`~pai_storage.backend.gapped_spans`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pai_storage.backend import (
    MessageRef,
    RunRef,
    RunRelations,
    gapped_spans,
    message_ref_from_row,
    run_facts_from_rows,
    run_ref_from_row,
)
from pai_storage.rows import dec, enc

from .schema import Tables
from .statements import by_keys, open_runs_statement, tail_statement

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]


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
