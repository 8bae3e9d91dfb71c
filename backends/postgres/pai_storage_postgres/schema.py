"""The PostgreSQL schema: table names, DDL, and the schema-version record.

Four tables hold the data (``<prefix>`` defaults to ``pai_threads``):

``<prefix>``
    Thread roots: the key ``(scope_key, thread_id)``, the columns the list
    queries filter and order by, the version, the three child-family
    position counters and the record's JSON text (``doc``).
``<prefix>_messages`` / ``<prefix>_runs`` / ``<prefix>_queued_items``
    Child records keyed by ``(scope_key, thread_id, position)``, unique by
    record id, with the columns their pages and the relationship checks
    filter on, and the record's JSON text.

Identifiers (scope keys, thread ids, record ids, agent, category) are stored
as ``bytea`` holding UTF-8: PostgreSQL ``text`` cannot hold U+0000, and the
byte order of UTF-8 is code-point order, which is the order the list's
``threadId`` tie-break needs. Records are stored as JSON *text* (not
``jsonb``), so key order, ``1`` versus ``1.0`` and ``\\u0000`` survive exactly.

``<prefix>_schema`` records the schema version. :data:`SCHEMA_VERSION` is
what this code writes; a database with a newer one is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SCHEMA_VERSION", "Tables", "quote_ident", "validate_identifier"]

SCHEMA_VERSION = 1
"""The schema version this package creates and understands."""

_PREFIX = re.compile(r"[a-z_][a-z0-9_]*\Z")
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_PREFIX_LENGTH = 40  # the longest index name adds 22 characters; PostgreSQL allows 63


def validate_identifier(kind: str, value: object) -> str:
    """Check a table prefix or schema name; the error names the rule broken."""
    from pai_storage import ThreadStoreConfigurationError

    pattern, limit = (_PREFIX, MAX_PREFIX_LENGTH) if kind == "table_prefix" else (_SCHEMA, 63)
    if not isinstance(value, str) or not pattern.match(value) or len(value) > limit:
        rule = (
            "lower-case letters, digits and '_', not starting with a digit"
            if kind == "table_prefix"
            else "letters, digits and '_', not starting with a digit"
        )
        raise ThreadStoreConfigurationError(
            f"option {kind} must be 1 to {limit} characters of {rule}"
        )
    return value


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class Tables:
    """Qualified table names for one ``(schema, prefix)`` pair."""

    prefix: str
    schema: str | None = None

    def _q(self, name: str) -> str:
        table = quote_ident(name)
        return f"{quote_ident(self.schema)}.{table}" if self.schema else table

    @property
    def threads(self) -> str:
        return self._q(self.prefix)

    @property
    def messages(self) -> str:
        return self._q(f"{self.prefix}_messages")

    @property
    def runs(self) -> str:
        return self._q(f"{self.prefix}_runs")

    @property
    def queued(self) -> str:
        return self._q(f"{self.prefix}_queued_items")

    @property
    def version_table(self) -> str:
        return self._q(f"{self.prefix}_schema")

    @property
    def lock_key(self) -> str:
        """The advisory-lock key text that serializes schema creation."""
        return f"pai_storage:{self.schema or ''}.{self.prefix}"

    def ddl(self) -> list[str]:
        """Idempotent DDL for every table and index (run under the advisory lock)."""
        p = self.prefix
        t, m, r, q, v = self.threads, self.messages, self.runs, self.queued, self.version_table
        idx = quote_ident
        key = "scope_key bytea NOT NULL, thread_id bytea NOT NULL"
        statements = []
        if self.schema:
            statements.append(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(self.schema)}")
        statements += [
            f"""CREATE TABLE IF NOT EXISTS {v} (
                singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                version integer NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                upgraded_at timestamptz NOT NULL DEFAULT now())""",
            f"""CREATE TABLE IF NOT EXISTS {t} (
                {key},
                instance_id text NOT NULL,
                revision bigint NOT NULL,
                agent bytea NOT NULL,
                list_visibility text NOT NULL,
                parent_thread_id bytea,
                category bytea,
                updated_at timestamptz NOT NULL,
                sort_key bigint NOT NULL,
                messages_next bigint NOT NULL DEFAULT 1,
                runs_next bigint NOT NULL DEFAULT 1,
                queued_next bigint NOT NULL DEFAULT 1,
                doc text NOT NULL,
                PRIMARY KEY (scope_key, thread_id))""",
            # Every list form binds list_visibility (include_hidden reads both
            # values as two bounded index scans), so these mirror the MongoDB
            # provider's indexes with sort_key = -epoch_ms(updated_at) standing
            # in for updatedAt descending.
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_list_vis')} ON {t} "
            "(scope_key, list_visibility, sort_key, thread_id)",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_list_agent')} ON {t} "
            "(scope_key, agent, list_visibility, sort_key, thread_id)",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_list_agent_parent')} ON {t} "
            "(scope_key, agent, list_visibility, parent_thread_id, sort_key, thread_id) "
            "WHERE parent_thread_id IS NOT NULL",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_list_agent_category')} ON {t} "
            "(scope_key, agent, list_visibility, category, sort_key, thread_id) "
            "WHERE category IS NOT NULL",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_list_parent')} ON {t} "
            "(scope_key, list_visibility, parent_thread_id, sort_key, thread_id) "
            "WHERE parent_thread_id IS NOT NULL",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_list_category')} ON {t} "
            "(scope_key, list_visibility, category, sort_key, thread_id) "
            "WHERE category IS NOT NULL",
            f"""CREATE TABLE IF NOT EXISTS {m} (
                {key},
                position bigint NOT NULL,
                message_id bytea NOT NULL,
                run_id bytea,
                relation text,
                transcript boolean NOT NULL,
                context boolean NOT NULL,
                doc text NOT NULL,
                PRIMARY KEY (scope_key, thread_id, position),
                UNIQUE (scope_key, thread_id, message_id))""",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_messages_transcript')} ON {m} "
            "(scope_key, thread_id, position) WHERE transcript",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_messages_context')} ON {m} "
            "(scope_key, thread_id, position) WHERE context",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_messages_run')} ON {m} "
            "(scope_key, thread_id, run_id, position) WHERE run_id IS NOT NULL",
            f"""CREATE TABLE IF NOT EXISTS {r} (
                {key},
                position bigint NOT NULL,
                run_id bytea NOT NULL,
                status text NOT NULL,
                doc text NOT NULL,
                PRIMARY KEY (scope_key, thread_id, position),
                UNIQUE (scope_key, thread_id, run_id))""",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_runs_status')} ON {r} "
            "(scope_key, thread_id, status, position)",
            f"""CREATE TABLE IF NOT EXISTS {q} (
                {key},
                position bigint NOT NULL,
                queue_item_id bytea NOT NULL,
                run_id bytea NOT NULL,
                doc text NOT NULL,
                PRIMARY KEY (scope_key, thread_id, position),
                UNIQUE (scope_key, thread_id, queue_item_id))""",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_queued_run')} ON {q} "
            "(scope_key, thread_id, run_id, position)",
        ]
        return statements
