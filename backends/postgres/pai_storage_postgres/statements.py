"""The SQL of a PostgreSQL thread store's reads, holds, forks and relationship checks.

Each statement is built once per table name (``functools.lru_cache``) and
sent as prepared text; every one is a bounded index range scan or probe
(``tests/postgres/test_explain.py`` checks the plans).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pai_storage.backend import FamilyName

from .layout import _ID_COLUMN, _insert_sql, _Table, _update_sql, column_count
from .schema import Tables

_NOW_SQL = "SELECT date_trunc('milliseconds', clock_timestamp())"


@functools.lru_cache(maxsize=64)
def create_hold_statement(threads: str) -> str:
    """The server's clock (``now``) and, when the key is taken, the stored version
    (``instance_id`` and ``revision``, NULL when the thread is missing): a
    create holds nothing yet (its insert finds a concurrent winner)."""
    return (
        "SELECT date_trunc('milliseconds', clock_timestamp()) AS now, t.instance_id, "
        f"t.revision FROM (VALUES (1)) AS one LEFT JOIN {threads} t "
        "ON t.scope_key = $1 AND t.thread_id = $2"
    )


@functools.lru_cache(maxsize=64)
def head_statement(threads: str) -> str:
    """The root row of a read (``$1`` scope, ``$2`` thread) and the snapshot's time."""
    return (
        "SELECT date_trunc('milliseconds', clock_timestamp()) AS now, t.doc, "
        "t.messages_next, t.runs_next, t.queued_next "
        f"FROM (VALUES (1)) AS one LEFT JOIN {threads} t "
        "ON t.scope_key = $1 AND t.thread_id = $2"
    )


@functools.lru_cache(maxsize=512)
def head_page_statement(
    threads: str,
    table: str,
    next_col: str,
    family: FamilyName,
    order: str,
    view: str | None,
    run_filter: bool,
    statuses: int,
) -> str:
    """The root row and one child page in one statement: one snapshot, one round trip.

    The root is :func:`head_statement` (always one row, its ``position`` NULL),
    materialized once; the page is :func:`page_statement` run ``LATERAL`` to it
    with a second upper bound, ``position < <family counter>``, so a first page
    (whose ``$4`` is only a cap) stays inside what the root's version had
    committed and a missing thread (a NULL counter) yields no rows. The page's
    rows carry NULL root columns. ``UNION ALL`` promises no order: the caller
    sorts the page by position.
    """
    page = page_statement(table, family, order, view, run_filter, statuses, f"h.{next_col}")
    return (
        f"WITH h AS MATERIALIZED ({head_statement(threads)}) "
        "SELECT h.now, h.doc, h.messages_next, h.runs_next, h.queued_next, "
        "NULL::bigint AS position, NULL::bytea AS id FROM h "
        "UNION ALL (SELECT NULL, p.doc, NULL, NULL, NULL, p.position, p.id "
        f"FROM h, LATERAL ({page}) AS p)"
    )


@functools.lru_cache(maxsize=512)
def page_statement(
    table: str,
    family: FamilyName,
    order: str,
    view: str | None = None,
    run_filter: bool = False,
    statuses: int = 0,
    counter: str | None = None,
) -> str:
    """The SQL of a child page of ``table`` (see :meth:`PostgresThreadStore.page_statement`);
    ``counter``, when given, is a second exclusive upper bound (the family's counter)."""
    direction = "ASC" if order == "oldest" else "DESC"
    base = (
        f"SELECT position, doc, {_ID_COLUMN[family]} AS id FROM {table} "
        "WHERE scope_key = $1 AND thread_id = $2 AND position > $3 AND position < $4"
    )
    if counter is not None:
        base += f" AND position < {counter}"
    tail = f" ORDER BY position {direction} LIMIT $5"
    if family == "messages":
        views = {"transcript": " AND transcript", "context": " AND context"}
        return base + views.get(view or "raw", "") + tail
    if run_filter:
        return base + " AND run_id = $6" + tail
    if statuses == 0:
        return base + tail
    if statuses == 1:
        return base + " AND status = $6" + tail
    branches = [f"({base} AND status = ${6 + i}{tail})" for i in range(statuses)]
    return " UNION ALL ".join(branches)


@functools.lru_cache(maxsize=64)
def heads_statement(threads: str, scoped: bool, before: bool, after: bool) -> str:
    """Entries of the updated-at index: ``$1`` the row count, then the scope key
    (``scoped``), the ``updated_at`` bound (``before``), and the exclusive start
    (``after``: its updated_at, scope key unless ``scoped``, thread id).

    One scope is a range of ``<p>_scope_updated``, every scope one of
    ``<p>_updated``; the row-value comparison is the index order, so the
    start is an index bound, not a filter. (For a scope holding most of the
    threads the planner may walk ``<p>_updated`` instead, checking the scope
    key in the index: then too the walk is about what it returns.)
    """
    order = ["updated_at", "thread_id"] if scoped else ["updated_at", "scope_key", "thread_id"]
    where: list[str] = []
    n = 2
    if scoped:
        where.append(f"scope_key = ${n}")
        n += 1
    if before:
        where.append(f"updated_at < ${n}")
        n += 1
    if after:
        bound = ", ".join(f"${n + i}" for i in range(len(order)))
        where.append(f"({', '.join(order)}) > ({bound})")
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    return (
        f"SELECT scope_key, thread_id, instance_id, revision, updated_at FROM {threads}"
        f"{condition} ORDER BY {', '.join(order)} LIMIT $1"
    )


@functools.lru_cache(maxsize=64)
def whole_family_statement(table: str) -> str:
    """Every row of one thread in one family (``$1`` scope, ``$2`` thread), by position."""
    return (
        f"SELECT position, doc FROM {table} WHERE scope_key = $1 AND thread_id = $2 "
        "ORDER BY position"
    )


@dataclass(frozen=True, slots=True)
class ForkStatements:
    """The statements of a fork (``$1`` scope, ``$2`` source thread, ``$3`` the fork).

    ``hold``: the source root's version and counters, ``FOR SHARE``;
    ``cut``: the cut message's position; ``copy_messages`` (``$4`` the cut
    position, ``$5`` the dropped run ids) and ``copy_runs`` (``$4`` the
    dropped run ids): ``INSERT ... SELECT`` from the source's rows.
    """

    hold: str
    cut: str
    copy_messages: str
    copy_runs: str


@functools.lru_cache(maxsize=16)
def fork_statements(tables: Tables) -> ForkStatements:
    t, m, r = tables.threads, tables.messages, tables.runs
    key = "scope_key = $1 AND thread_id = $2"
    message_cols = "position, message_id, run_id, relation, transcript, context, doc"
    run_cols = "position, run_id, status, doc"
    return ForkStatements(
        hold=(
            f"SELECT instance_id, revision, messages_next, runs_next, queued_next FROM {t} "
            f"WHERE {key} FOR SHARE"
        ),
        cut=f"SELECT position FROM {m} WHERE {key} AND message_id = $3",
        copy_messages=(
            f"INSERT INTO {m} (scope_key, thread_id, {message_cols}) "
            f"SELECT scope_key, $3, {message_cols} FROM {m} WHERE {key} AND position <= $4 "
            "AND (run_id IS NULL OR run_id <> ALL($5::bytea[]))"
        ),
        copy_runs=(
            f"INSERT INTO {r} (scope_key, thread_id, {run_cols}) "
            f"SELECT scope_key, $3, {run_cols} FROM {r} WHERE {key} "
            "AND run_id <> ALL($4::bytea[])"
        ),
    )


@functools.lru_cache(maxsize=64)
def by_keys(table: str, column: str, select: str, keys: int = 3) -> str:
    """Rows of one thread whose ``column`` is in the ``$<keys>`` array (``$3`` unless
    told), one index probe per key.

    A ``LATERAL`` probe per key rather than ``= ANY($3)`` or a plain join: a
    generic plan believes a thread holds a handful of rows (the average), and
    would happily walk the whole thread and filter, O(thread) instead of O(keys).
    """
    cols = ", ".join(c.split(" AS ")[0].removeprefix("t.") for c in select.split(", "))
    where = f"scope_key = $1 AND thread_id = $2 AND {column} = k.id"
    if column == "run_id":
        where += " AND run_id IS NOT NULL"
    return (
        f"SELECT {select} FROM unnest(${keys}::bytea[]) AS k(id) "
        # OFFSET 0 keeps the subquery from being pulled up into a join: it runs
        # once per key, as an equality probe of the (scope, thread, key) index.
        f"CROSS JOIN LATERAL (SELECT {cols} FROM {table} WHERE {where} OFFSET 0) AS t"
    )


HoldLoad = tuple[tuple[FamilyName, str, str], ...]
"""The families whose named rows a hold reads: ``(family, table, id column)`` each."""


@functools.lru_cache(maxsize=64)
def hold_statement(threads: str, loads: HoldLoad = ()) -> str:
    """The root row of a thread being updated, locked until the commit ends, the
    server's clock (``now``) read once the lock is granted, and the rows the
    commit's changes name (``$3``, ``$4``, ... one id array per family in ``loads``).

    The first row is the root's (``family`` NULL); each named row that exists
    follows (``family`` its name, with ``position``, ``id`` and ``doc``). The
    clock is computed by the outer query over a ``MATERIALIZED`` CTE: once
    per row the CTE hands up, so after ``FOR UPDATE`` has waited for whoever
    held the row. (In a plain ``SELECT clock_timestamp(), ... FOR UPDATE`` the
    target list is computed beneath the lock: a commit that waited for a
    holder that did not change the row would be stamped with the time before
    its wait, earlier than the holder's end. ``test_commit_clock.py`` checks it.)

    The named rows are read in the statement's snapshot, taken before any wait
    for the lock, while the lock returns the root as the last holder left it
    (``READ COMMITTED`` follows the row to its newest version). ``fresh`` says
    whether the snapshot saw that same revision of the root: only then are the
    rows the held version's. Otherwise a commit moved the root meanwhile, and
    a commit naming the version it wrote (a client that pipelines its commits
    can know it) must not be judged on the rows from before it: the caller
    reads them again, in a statement of their own.
    """
    sql = (
        "WITH h AS MATERIALIZED (SELECT revision, messages_next, runs_next, queued_next, doc, "
        f"facts FROM {threads} WHERE scope_key = $1 AND thread_id = $2 FOR UPDATE) "
        "SELECT NULL::text AS family, h.messages_next, h.runs_next, h.queued_next, h.doc, "
        "h.facts, date_trunc('milliseconds', clock_timestamp()) AS now, "
        f"h.revision = (SELECT s.revision FROM {threads} AS s "
        "WHERE s.scope_key = $1 AND s.thread_id = $2) AS fresh, "
        "NULL::bigint AS position, NULL::bytea AS id FROM h"
    )
    for n, (name, table, id_col) in enumerate(loads):
        probe = by_keys(table, id_col, f"t.position, t.{id_col} AS id, t.doc", 3 + n)
        sql += (
            f" UNION ALL (SELECT '{name}', NULL, NULL, NULL, p.doc, NULL, NULL, NULL, "
            f"p.position, p.id FROM h, LATERAL ({probe}) AS p)"
        )
    return sql


ROOT_COLUMNS = 10
"""Parameters ``$3`` to ``$12`` of :func:`write_statement`: the root's columns and its facts."""


GUARD_COLUMNS = 6
"""Parameters of a guarded :func:`write_statement` after the notification's: the
stored root it expects (document, facts, the three counters) and the commit
time it was stamped with (NULL on a test clock)."""

STAMP_WINDOW_MS = 5
"""How far the server's clock may be past a guarded write's predicted commit time."""


@functools.lru_cache(maxsize=64)
def write_statement(
    threads: str, writes: tuple[tuple[_Table, bool], ...], notify: bool, guarded: bool = False
) -> str:
    """A commit's whole write in one statement: the root, the family writes, the notification.

    ``$3`` to ``$12``: the root's revision, list columns, updated time, sort
    key, counters, document and its relationship facts (``facts``, JSON text
    naming the revision they belong to); then, with ``notify``, the channel
    and the payload; then, when ``guarded``, the :data:`GUARD_COLUMNS`; then
    the column arrays (:func:`.layout._columns`) of each write: ``(table,
    True)`` replaces rows by position and id, ``(table, False)`` inserts. A
    replaced row and an inserted one never share an id (the commit's net
    write), so no two parts touch the same row.

    Every data-modifying ``WITH`` runs once and to completion, whatever the
    outer query reads. Inside a commit's transaction the root is held, and the
    outer query returns one row. A guarded write (an optimistic commit, which
    inserts only, outside a transaction: :mod:`.commit`) first locks the root
    without waiting (``FOR UPDATE NOWAIT``: a root another transaction holds
    fails the statement with ``55P03`` at once, and the commit then queues
    for it the usual way), and only when it is stored exactly as expected and
    the server's clock, read just before the lock is taken, is at most
    :data:`STAMP_WINDOW_MS` past the predicted commit time. It updates the
    root and inserts the rows only if it locked it, and returns one row: the
    server's clock (``now``) and the number of roots written (``written``, 0
    or 1). ``pg_notify`` runs once per updated root, so at most once. A
    ``NOTIFY`` is delivered only if its transaction commits (after its writes
    are visible, in commit order): nobody hears of a commit that was rolled
    back or not written.
    """
    n = 3 + ROOT_COLUMNS + (2 if notify else 0)
    update = (
        f"u AS (UPDATE {threads} SET revision = $3, list_visibility = $4, category = $5, "
        "updated_at = $6, sort_key = $7, messages_next = $8, runs_next = $9, "
        "queued_next = $10, doc = $11, facts = $12 WHERE scope_key = $1 AND thread_id = $2"
    )
    notice = f"pg_notify(${3 + ROOT_COLUMNS}, ${4 + ROOT_COLUMNS})"
    if not guarded:
        parts = [f"{update} RETURNING 1)"]
        for i, (table, replace) in enumerate(writes):
            parts.append(f"w{i} AS ({_update_sql(table, n) if replace else _insert_sql(table, n)})")
            n += column_count(table)
        return f"WITH {', '.join(parts)} SELECT {notice if notify else '1'} FROM u"
    stamp = f"${n + 5}::timestamptz"
    parts = [
        f"l AS MATERIALIZED (SELECT 1 FROM {threads} WHERE scope_key = $1 AND thread_id = $2 "
        f"AND doc = ${n} AND facts = ${n + 1} AND messages_next = ${n + 2} "
        f"AND runs_next = ${n + 3} AND queued_next = ${n + 4} AND ({stamp} IS NULL "
        f"OR date_trunc('milliseconds', clock_timestamp()) - {stamp} "
        f"BETWEEN interval '0' AND interval '{STAMP_WINDOW_MS} milliseconds') "
        "FOR UPDATE NOWAIT)",
        f"{update} AND EXISTS (SELECT FROM l) RETURNING 1)",
    ]
    n += GUARD_COLUMNS
    for i, (table, replace) in enumerate(writes):
        if replace:  # pragma: no cover - optimistic() allows inserts only
            raise ValueError("a guarded write inserts only")
        parts.append(f"w{i} AS ({_insert_sql(table, n, 'EXISTS (SELECT FROM u)')})")
        n += column_count(table)
    written = f"count({notice})" if notify else "count(*)"
    return (
        f"WITH {', '.join(parts)} SELECT clock_timestamp() AS now, "
        f"(SELECT {written} FROM u) AS written"
    )


@functools.lru_cache(maxsize=64)
def open_runs_statement(runs: str) -> str:
    """Up to two running or waiting runs (of the ``runs`` table): one equality
    range scan per status, so no plan can fall back to walking every run of
    the thread."""
    branch = (
        f"SELECT run_id, doc FROM {runs} WHERE scope_key = $1 AND thread_id = $2 "
        "AND status = '{}' LIMIT 2"
    )
    return f"({branch.format('running')}) UNION ALL ({branch.format('waiting')})"


@functools.lru_cache(maxsize=64)
def tail_statement(messages: str) -> str:
    """The last message (of the ``messages`` table)."""
    return (
        f"SELECT position, message_id, run_id, relation FROM {messages} "
        "WHERE scope_key = $1 AND thread_id = $2 ORDER BY position DESC LIMIT 1"
    )


@functools.lru_cache(maxsize=64)
def open_runs_and_tail_statement(runs: str, messages: str) -> str:
    """:func:`open_runs_statement` and :func:`tail_statement` in one round trip.

    Rows ``(tail, run_id, doc, position, message_id, relation)``: the open runs
    (``tail`` false; ``position``, ``message_id`` and ``relation`` NULL), then
    at most one row of the last message (``tail`` true, ``doc`` NULL). Each
    branch is the same bounded index scan as on its own.
    """
    run = (
        f"SELECT false AS tail, run_id, doc, NULL::bigint AS position, "
        f"NULL::bytea AS message_id, NULL::text AS relation FROM {runs} "
        "WHERE scope_key = $1 AND thread_id = $2 AND status = '{}' LIMIT 2"
    )
    last = (
        f"SELECT true, run_id, NULL, position, message_id, relation FROM {messages} "
        "WHERE scope_key = $1 AND thread_id = $2 ORDER BY position DESC LIMIT 1"
    )
    return f"({run.format('running')}) UNION ALL ({run.format('waiting')}) UNION ALL ({last})"
