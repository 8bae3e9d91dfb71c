"""The lifecycle primitives of a PostgreSQL thread store, run inside the database.

The updated-at index's entries, a whole thread from one snapshot, a restore
and a fork each in one transaction (see ``docs/lifecycle.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pai_storage import ThreadRecord, ThreadVersion
from pai_storage.backend import (
    ForkRequest,
    SourceChanged,
    ThreadAggregate,
    ThreadConflict,
    ThreadIndexEntry,
)
from pai_storage.rows import dec, enc, insert_thread

from .commit import _PgTransaction
from .reads import _PgSnapshot
from .statements import _NOW_SQL, fork_statements, heads_statement
from .thread_rows import _ThreadRows, _version
from .transactions import _Abort, _Retry

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

    from .store import PostgresThreadStore


_LAST_POSITION = 2**63 - 1
"""The cut of a fork that copies every message (the largest ``bigint``)."""


async def thread_heads(
    store: PostgresThreadStore,
    scope_key: str | None,
    *,
    updated_before: datetime | None,
    after: ThreadIndexEntry | None,
    limit: int,
) -> Sequence[ThreadIndexEntry]:
    """A bounded range scan of ``<p>_scope_updated`` (one scope) or ``<p>_updated``."""
    sql = heads_statement(
        store.tables.threads,
        scope_key is not None,
        updated_before is not None,
        after is not None,
    )
    args: list[Any] = [limit]
    if scope_key is not None:
        args.append(enc(scope_key))
    if updated_before is not None:
        args.append(updated_before)
    if after is not None:
        args.append(after.updated_at)
        if scope_key is None:
            args.append(enc(after.scope_key))
        args.append(enc(after.thread_id))
    async with store._connection() as conn:
        with store._errors("read"):
            if scope_key is None:
                rows = await conn.fetch(sql, *args)
            else:
                # A generic plan knows no scope's size and may walk the global
                # index, stepping over every other scope; a sweep is rare, so
                # it gets a custom plan for its own scope each time.
                async with conn.transaction(readonly=True):
                    await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                    rows = await conn.fetch(sql, *args)
    return [
        ThreadIndexEntry(dec(r["scope_key"]), dec(r["thread_id"]), _version(r), r["updated_at"])
        for r in rows
    ]


async def load_thread(
    store: PostgresThreadStore, scope_key: str, thread_id: str
) -> ThreadAggregate | None:
    """The root and every row of the thread, from one ``REPEATABLE READ`` snapshot."""
    async with store._connection() as conn:
        with store._errors("read"):
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                rows = _ThreadRows(conn, store._layout, scope_key, thread_id)
                return await rows.load_all()


async def restore_thread(
    store: PostgresThreadStore, aggregate: ThreadAggregate
) -> ThreadVersion | None:
    """Insert the root and every row in one transaction, only if the thread is missing."""
    root = aggregate.root

    async def body(conn: asyncpg.Connection) -> ThreadVersion | _Abort | None:
        tx = _PgTransaction(conn, store._layout, root.scope_key, root.thread_id)
        try:
            await insert_thread(tx, aggregate)
        except ThreadConflict as conflict:
            if conflict.current is None:  # the holder was deleted meanwhile: again
                return _Abort(error=_Retry())
            return _Abort(conflict.current)
        return None

    return await store._transaction(body, "restore")


async def fork_copy(store: PostgresThreadStore, fork: ForkRequest) -> ThreadRecord:
    """The fork in one transaction; the copied rows never leave the database.

    The source root is held (``FOR SHARE``: commits to it wait, other
    forks of it do not), the fork's plan made from reads in the same
    transaction (so at the held version), its root inserted, then one
    ``INSERT ... SELECT`` per family copies the rows the plan keeps.
    """
    scope = enc(fork.scope_key)
    source, target = enc(fork.source_thread_id), enc(fork.thread_id)
    sql = fork_statements(store._layout.tables)

    async def body(conn: asyncpg.Connection) -> ThreadRecord | _Abort:
        held = await conn.fetchrow(sql.hold, scope, source)
        snapshot = _PgSnapshot(conn, store._layout, fork.scope_key, fork.source_thread_id)
        try:
            plan = await fork.plan_in(store, snapshot)  # a missing source raises
        except SourceChanged as changed:
            return _Abort(error=changed)
        if held is None or _version(held) != plan.source_version:
            return _Abort(error=SourceChanged())
        dropped = [enc(i) for i in sorted(plan.dropped_run_ids)]
        now = None if plan.test_now is not None else await conn.fetchval(_NOW_SQL)
        root = plan.root(now)
        target_rows = _PgTransaction(conn, store._layout, plan.scope_key, plan.thread_id)
        positions = {name: int(held[t.next_col]) for name, t in store._layout.families.items()}
        try:
            await target_rows.write_root(root, positions, created=True)
        except ThreadConflict as conflict:
            return _Abort(error=conflict)
        cut = _LAST_POSITION
        if plan.through_message_id is not None:
            found = await conn.fetchval(sql.cut, scope, source, enc(plan.through_message_id))
            if found is None:  # the plan was made from this very version
                return _Abort(error=SourceChanged())
            cut = int(found)
        await conn.execute(sql.copy_messages, scope, source, target, cut, dropped)
        await conn.execute(sql.copy_runs, scope, source, target, dropped)
        return root

    return await store._transaction(body, "fork")
