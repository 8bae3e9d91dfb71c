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
from .statements import by_keys, open_runs_and_tail_statement

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]


class _Reader:
    """Post-commit relationship facts, queried inside the commit's transaction.

    A reader lives for one relationship check, after every write of the
    commit: the facts it reads cannot change while it lives, so the open runs
    and the tail, read together in one statement, are read once.
    """

    def __init__(self, conn: asyncpg.Connection, tables: Tables, scope: bytes, thread: bytes):
        self._conn = conn
        self._t = tables
        self._scope = scope
        self._thread = thread
        self._open_and_tail: tuple[list[RunRef], MessageRef | None] | None = None

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
        return (await self._runs_and_tail())[0]

    async def tail(self) -> MessageRef | None:
        return (await self._runs_and_tail())[1]

    async def _runs_and_tail(self) -> tuple[list[RunRef], MessageRef | None]:
        """The open runs and the last message, in one round trip (the check asks for both)."""
        if self._open_and_tail is None:
            sql = open_runs_and_tail_statement(self._t.runs, self._t.messages)
            rows = await self._conn.fetch(sql, self._scope, self._thread)
            runs = [run_ref_from_row((r["run_id"], r["doc"])) for r in rows if not r["tail"]]
            tail = [
                message_ref_from_row((r["position"], r["message_id"], r["run_id"], r["relation"]))
                for r in rows
                if r["tail"]
            ]
            self._open_and_tail = (runs, tail[0] if tail else None)
        return self._open_and_tail
