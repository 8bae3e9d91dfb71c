"""The PostgreSQL snapshot store: one row per snapshot, the data in ``bytea``.

The table (``Tables.snapshots``) is keyed ``(scope, snapshot_id)``; both are
UTF-8 ``bytea``, whose byte order is code-point order (the ``list`` tie-break).
A second index ``(scope, created_at DESC, snapshot_id DESC)`` serves ``list``
and ``latest`` as a bounded index range scan; a partial index on
``expires_at`` serves ``purge_expired``. See ``docs/postgres.md``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ddl"]


class Names(Protocol):
    """The table names this module needs (:class:`~pai_storage_postgres.schema.Tables` has them)."""

    @property
    def snapshots(self) -> str: ...


def _bare(qualified: str) -> str:
    """The unquoted last part of a quoted, possibly schema-qualified table name."""
    last = qualified.rsplit('"."', 1)[-1]
    return last.strip('"').replace('""', '"')


def _index(tables: Names, suffix: str) -> str:
    from .schema import quote_ident

    return quote_ident(f"{_bare(tables.snapshots)}_{suffix}")


def ddl(tables: Names) -> list[str]:
    """Idempotent DDL for the snapshot table and its indexes."""
    s = tables.snapshots
    return [
        f"""CREATE TABLE IF NOT EXISTS {s} (
            scope bytea NOT NULL,
            snapshot_id bytea NOT NULL,
            created_at timestamptz NOT NULL,
            expires_at timestamptz,
            size bigint NOT NULL,
            sha256 text NOT NULL,
            metadata text NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (scope, snapshot_id))""",
        f"ALTER TABLE {s} ALTER COLUMN data SET STORAGE EXTERNAL",
        f"CREATE INDEX IF NOT EXISTS {_index(tables, 'newest')} ON {s} "
        "(scope, created_at DESC, snapshot_id DESC)",
        f"CREATE INDEX IF NOT EXISTS {_index(tables, 'expiry')} ON {s} "
        "(expires_at) WHERE expires_at IS NOT NULL",
    ]
