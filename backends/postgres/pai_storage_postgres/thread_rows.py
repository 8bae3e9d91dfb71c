"""Queries over one thread's rows on one connection, shared by commits and reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pai_storage import ThreadRecord, ThreadVersion, codec
from pai_storage.backend import Entry, FamilyName, FamilySpec, ThreadAggregate
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.rows import dec, enc, parse_root, thread_from_rows

from .layout import _Layout
from .statements import by_keys, whole_family_statement

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]


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
        return parse_root(doc, self._scope_key, self._thread_id)

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
        rows: dict[FamilyName, Sequence[Any]] = {}
        for name, table in self._families.items():
            rows[name] = await self._conn.fetch(
                whole_family_statement(table.table), self._scope, self._thread
            )
        return thread_from_rows(root, self._positions(head), rows)

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
        return dict(self._entry(spec, r) for r in rows)

    def _entry(self, spec: FamilySpec, row: Any) -> tuple[str, Entry[Any]]:
        """A row ``(position, id, doc)`` of one family as ``(record id, entry)``."""
        record = codec.decode(spec.model, row["doc"])
        rid = dec(row["id"])
        if spec.record_id(record) != rid:
            raise ThreadStoreInvariantError(
                f"stored {spec.noun} record does not match its id column"
            )
        return rid, Entry(int(row["position"]), record)


def _version(row: Any) -> ThreadVersion:
    return ThreadVersion(thread_instance_id=row["instance_id"], revision=int(row["revision"]))
