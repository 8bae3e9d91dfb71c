"""The PostgreSQL execution guard: one row per held lock, fencing tokens from a sequence.

The table (``Tables.locks``) is keyed by the resource (UTF-8 ``bytea``); an
index on ``expires_at`` serves ``purge_expired``. Fencing tokens come from the
sequence ``Tables.lock_sequence``, which purges never reset. See
``docs/postgres.md``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ddl"]


class Names(Protocol):
    """The table names this module needs (:class:`~pai_storage_postgres.schema.Tables` has them)."""

    @property
    def locks(self) -> str: ...

    @property
    def lock_sequence(self) -> str: ...


def _bare(qualified: str) -> str:
    """The unquoted last part of a quoted, possibly schema-qualified table name."""
    last = qualified.rsplit('"."', 1)[-1]
    return last.strip('"').replace('""', '"')


def ddl(tables: Names) -> list[str]:
    """Idempotent DDL for the lock table, its index and the fencing sequence."""
    from .schema import quote_ident

    locks = tables.locks
    return [
        f"CREATE SEQUENCE IF NOT EXISTS {tables.lock_sequence} AS bigint MINVALUE 1 NO CYCLE",
        f"""CREATE TABLE IF NOT EXISTS {locks} (
            resource bytea PRIMARY KEY,
            token text NOT NULL,
            owner text NOT NULL,
            fencing_token bigint NOT NULL,
            acquired_at timestamptz NOT NULL,
            expires_at timestamptz NOT NULL)""",
        f"CREATE INDEX IF NOT EXISTS {quote_ident(_bare(locks) + '_expiry')} ON {locks} "
        "(expires_at)",
    ]
