"""One thread's rows in the SQL thread store: its key, its row columns, the queries
commits and reads share (:class:`_ThreadRows`).

A thread is found by its 16-byte key (:func:`thread_key`, a digest of its
scope key and thread id); a record by the digest of its id (``id_h``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import bindparam, select

from pai_storage import Message, QueuedItem, RunRecord, ThreadRecord, ThreadVersion, codec
from pai_storage.backend import Entry, FamilyName, FamilySpec
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.rows import enc, parse_root

from .client import Operation
from .schema import DIGEST_BYTES, digest

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .store import SqlThreadStore


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
    data = len(scope).to_bytes(4, "big") + scope + enc(thread_id)
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def _opt_digest(text: str | None) -> bytes | None:
    return None if text is None else digest(text)


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
    row["doc"] = codec.encode(entry.record)
    return row


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
        return parse_root(doc, self._scope_key, self._thread_id)

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
            record = codec.decode(spec.model, doc)
            if spec.record_id(record) != rid:
                raise ThreadStoreInvariantError(
                    f"stored {spec.noun} record does not match its id column"
                )
            found[rid] = Entry(int(position), record)
        return found
