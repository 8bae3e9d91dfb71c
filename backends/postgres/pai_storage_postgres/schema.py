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

The runtime stores (key-value, agent state, snapshots, execution guard) have
their own tables, named in :class:`Tables` too (``docs/postgres.md``, "Runtime
stores"). With the default prefix they are ``pai_kv``, ``pai_agent_sessions``
(+ ``_values`` and ``_items``), ``pai_snapshots`` and ``pai_locks``; with
another ``table_prefix`` ``p`` they are ``p_kv``, ``p_agent_sessions``, ...;
``names={"kv": "my_kv", ...}`` renames one component's tables.

``<prefix>_schema`` records the schema version. :data:`SCHEMA_VERSION` is
what this code writes: version 1 held the thread tables, version 2 adds the
runtime tables, version 3 the two updated-at indexes of the thread roots
(``<prefix>_scope_updated`` and ``<prefix>_updated``) that retention sweeps,
scope erasure and export walk, version 4 the roots' ``facts`` column (the
relationship facts a commit keeps for the next one, ``docs/commits.md``).
Every statement is idempotent (``IF NOT EXISTS``), so a database at any
older version is migrated by running them all in one transaction under the
advisory lock; a database with a newer version is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "COMPONENT_TABLES",
    "DEFAULT_PREFIX",
    "SCHEMA_VERSION",
    "Tables",
    "quote_ident",
    "validate_identifier",
    "validate_names",
]

SCHEMA_VERSION = 4
"""The schema version this package creates and understands (1: threads only;
2: the runtime tables; 3: the thread roots' updated-at indexes; 4: the roots'
relationship facts)."""

DEFAULT_PREFIX = "pai_threads"
"""The default ``table_prefix`` (the thread tables' base name)."""

COMPONENT_TABLES = {
    "kv": "kv",
    "state": "agent_sessions",
    "snapshots": "snapshots",
    "guard": "locks",
}
"""Each runtime component's default base table name, after the common prefix."""

_PREFIX = re.compile(r"[a-z_][a-z0-9_]*\Z")
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_PREFIX_LENGTH = 40  # the longest index name adds 22 characters; PostgreSQL allows 63


def validate_identifier(kind: str, value: object, label: str | None = None) -> str:
    """Check a table prefix or schema name (``label``: what the error calls it,
    by default the option ``kind``); the error names the rule broken."""
    from pai_storage.errors import ThreadStoreConfigurationError

    pattern, limit = (_PREFIX, MAX_PREFIX_LENGTH) if kind == "table_prefix" else (_SCHEMA, 63)
    if not isinstance(value, str) or not pattern.match(value) or len(value) > limit:
        rule = (
            "lower-case letters, digits and '_', not starting with a digit"
            if kind == "table_prefix"
            else "letters, digits and '_', not starting with a digit"
        )
        raise ThreadStoreConfigurationError(
            f"option {label or kind} must be 1 to {limit} characters of {rule}"
        )
    return value


def validate_names(value: object) -> tuple[tuple[str, str], ...]:
    """Check the ``names`` option: component name -> base table name."""
    from pai_storage.errors import ThreadStoreConfigurationError

    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ThreadStoreConfigurationError(
            "option names must be a dict from component name to table name"
        )
    out = []
    for component, name in value.items():
        if component not in COMPONENT_TABLES:
            raise ThreadStoreConfigurationError(
                f"option names: unknown component {component!r}; valid: "
                f"{', '.join(sorted(COMPONENT_TABLES))} (the thread tables use table_prefix)"
            )
        validate_identifier("table_prefix", name, f"names: the table name of {component}")
        out.append((str(component), name))
    return tuple(sorted(out))


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class Tables:
    """Qualified table names for one ``(schema, prefix)`` pair."""

    prefix: str
    schema: str | None = None
    names: tuple[tuple[str, str], ...] = field(default=())
    """Per-component base names of the runtime tables (see :data:`COMPONENT_TABLES`)."""

    # The thread tables' qualified names, made once: every statement names them.
    threads: str = field(init=False, repr=False, compare=False)
    messages: str = field(init=False, repr=False, compare=False)
    runs: str = field(init=False, repr=False, compare=False)
    queued: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, suffix in (
            ("threads", ""),
            ("messages", "_messages"),
            ("runs", "_runs"),
            ("queued", "_queued_items"),
        ):
            object.__setattr__(self, name, self._q(self.prefix + suffix))

    def _q(self, name: str) -> str:
        table = quote_ident(name)
        return f"{quote_ident(self.schema)}.{table}" if self.schema else table

    # ---------------------------------------------------------- runtime stores

    def base(self, component: str) -> str:
        """The unquoted base name of a runtime component's tables (and indexes).

        ``names`` wins; else ``pai_<table>`` under the default prefix and
        ``<prefix>_<table>`` under any other.
        """
        chosen: Any = dict(self.names).get(component)
        if chosen is not None:
            return str(chosen)
        stem = "pai" if self.prefix == DEFAULT_PREFIX else self.prefix
        return f"{stem}_{COMPONENT_TABLES[component]}"

    def table(self, component: str, suffix: str = "") -> str:
        """The qualified, quoted name of ``base(component) + suffix``."""
        return self._q(self.base(component) + suffix)

    def index(self, component: str, suffix: str) -> str:
        """The quoted name of an index ``base(component) + suffix`` (indexes live
        in their table's schema, so the name is never qualified)."""
        return quote_ident(self.base(component) + suffix)

    @property
    def kv(self) -> str:
        return self.table("kv")

    @property
    def state_sessions(self) -> str:
        """One row per session: its expiry (the session TTL runs from its last write)."""
        return self.table("state")

    @property
    def state_values(self) -> str:
        """One row per state key: its kind, version or list length and hash."""
        return self.table("state", "_values")

    @property
    def state_items(self) -> str:
        """One row per list item."""
        return self.table("state", "_items")

    @property
    def snapshots(self) -> str:
        return self.table("snapshots")

    @property
    def locks(self) -> str:
        return self.table("guard")

    @property
    def lock_sequence(self) -> str:
        """The sequence fencing tokens come from (never reset by a purge)."""
        return self.table("guard", "_fencing")

    @property
    def version_table(self) -> str:
        return self._q(f"{self.prefix}_schema")

    @property
    def lock_key(self) -> str:
        """The advisory-lock key text that serializes schema creation."""
        return f"pai_storage:{self.schema or ''}.{self.prefix}"

    def ddl(self) -> list[str]:
        """Idempotent DDL for the thread tables and their indexes, run under the advisory lock."""
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
            # The updated-at index of the lifecycle operations (schema version 3):
            # ascending updated_at, then scope key, then thread id, within one
            # scope or across every scope.
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_scope_updated')} ON {t} "
            "(scope_key, updated_at, thread_id)",
            f"CREATE INDEX IF NOT EXISTS {idx(p + '_updated')} ON {t} "
            "(updated_at, scope_key, thread_id)",
            # The root's relationship facts (schema version 4): JSON text naming
            # the revision they belong to; NULL (a root written before) is valid.
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS facts text",
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


def all_ddl(tables: Tables) -> list[str]:
    """Idempotent DDL of the current schema version: the thread tables, then every
    runtime store's.

    Each runtime module (``kv``, ``state``, ``snapshots``, ``guard``) supplies
    ``ddl(tables)`` for its own tables.
    """
    import importlib

    statements = tables.ddl()
    for module in ("kv", "state", "snapshots", "guard"):
        try:
            found = importlib.import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{module}":
                raise
            continue  # a component this installation does not ship
        statements += found.ddl(tables)
    return statements
