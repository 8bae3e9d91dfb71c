"""The tables of a PostgreSQL thread store and the rows a commit writes to them.

:class:`_Layout` names the roots table and, per family, a :class:`_Table`:
its record id column, its position counter on the root row, the columns
beside ``doc`` that pages and relationship checks filter on, and its
``unnest`` insert and update statements (made once per table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pai_storage import Message, QueuedItem, RunRecord, codec
from pai_storage.backend import Entry, FamilyName, FamilySpec
from pai_storage.rows import enc, enc_opt

from .schema import Tables

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


def _columns(spec: FamilySpec, entries: Sequence[Entry[Any]]) -> list[list[Any]]:
    """Column arrays ``position, id, <extra columns>, doc`` for ``unnest``."""
    positions = [e.position for e in entries]
    ids = [enc(spec.record_id(e.record)) for e in entries]
    docs = [codec.encode(e.record) for e in entries]
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


def _unnest_params(table: _Table, first: int = 3) -> str:
    types = ["bigint", "bytea", *(t for _, t in table.extra), "text"]
    return ", ".join(f"${i + first}::{t}[]" for i, t in enumerate(types))


def column_count(table: _Table) -> int:
    """How many arrays :func:`_columns` gives for ``table`` (parameters of its insert
    or update)."""
    return 3 + len(table.extra)


def _insert_sql(table: _Table, first: int = 3, only_if: str = "") -> str:
    """Insert the ``unnest`` of ``_columns``' arrays, passed from parameter ``first``
    on (and only if the condition ``only_if`` holds, when given)."""
    names = ["position", table.id_col, *(c for c, _ in table.extra), "doc"]
    return (
        f"INSERT INTO {table.table} (scope_key, thread_id, {', '.join(names)}) "
        f"SELECT $1, $2, * FROM unnest({_unnest_params(table, first)})"
        + (f" WHERE {only_if}" if only_if else "")
    )


def _update_sql(table: _Table, first: int = 3) -> str:
    """Update rows by position and id from the arrays, passed from parameter ``first`` on."""
    names = ["position", "id", *(c for c, _ in table.extra), "doc"]
    sets = ", ".join(f"{c} = u.{c}" for c in [*(c for c, _ in table.extra), "doc"])
    return (
        f"UPDATE {table.table} AS t SET {sets} "
        f"FROM unnest({_unnest_params(table, first)}) AS u({', '.join(names)}) "
        f"WHERE t.scope_key = $1 AND t.thread_id = $2 AND t.position = u.position "
        f"AND t.{table.id_col} = u.id"
    )
