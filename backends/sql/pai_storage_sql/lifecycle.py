"""The lifecycle primitives of the SQL thread store, run inside the database.

The updated-at index's entries, a whole thread from one snapshot, a restore
and a fork each in one write transaction (see ``docs/lifecycle.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, insert, literal, or_, select, tuple_

from pai_storage import ThreadRecord, ThreadVersion
from pai_storage.backend import (
    FAMILIES,
    FamilyName,
    ForkRequest,
    SourceChanged,
    ThreadAggregate,
    ThreadConflict,
    ThreadIndexEntry,
    timestamp_ms,
)
from pai_storage.rows import dec, enc, insert_thread, thread_from_rows

from .commit import _RESTORE, _Transaction
from .reads import _Snapshot
from .schema import digest
from .thread_rows import _ThreadRows, _version

if TYPE_CHECKING:
    from .store import SqlThreadStore


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


async def thread_heads(
    store: SqlThreadStore,
    scope_key: str | None,
    *,
    updated_before: datetime | None,
    after: ThreadIndexEntry | None,
    limit: int,
) -> Sequence[ThreadIndexEntry]:
    """A bounded range scan of ``<p>_scope_updated`` (one scope) or ``<p>_updated``."""
    t = store.tables.threads
    cols = (t.c.scope_key, t.c.thread_id, t.c.instance_id, t.c.revision, t.c.updated_ms)
    where: list[Any] = []
    order: list[Any] = [t.c.updated_ms]
    if scope_key is not None:
        where.append(t.c.scope_h == digest(scope_key))
    else:
        order.append(t.c.scope_ord)
    order.append(t.c.thread_ord)
    if updated_before is not None:
        where.append(t.c.updated_ms < timestamp_ms(updated_before))
    tie: list[Any] = []
    if after is not None and store._ord_bytes is None:
        # SQLite keeps whole ids in the ord columns: a strict row-value bound.
        at = timestamp_ms(after.updated_at)
        bound = [
            at,
            *([enc(after.scope_key)] if scope_key is None else []),
            enc(after.thread_id),
        ]
        columns = [
            t.c.updated_ms,
            *([t.c.scope_ord] if scope_key is None else []),
            t.c.thread_ord,
        ]
        where.append(tuple_(*columns) > tuple_(*bound))
    elif after is not None:
        # Inclusive on the ord columns (they may be cut on MySQL); rows not
        # strictly after `after` are dropped below by their full ids.
        at = timestamp_ms(after.updated_at)
        s_ord, t_ord = store._ord(enc(after.scope_key)), store._ord(enc(after.thread_id))
        if scope_key is not None:
            tie = [t.c.updated_ms == at, t.c.thread_ord == t_ord]
            later = and_(t.c.updated_ms == at, t.c.thread_ord >= t_ord)
        else:
            tie = [t.c.updated_ms == at, t.c.scope_ord == s_ord]
            later = and_(
                t.c.updated_ms == at,
                or_(
                    t.c.scope_ord > s_ord,
                    and_(t.c.scope_ord == s_ord, t.c.thread_ord >= t_ord),
                )
                if len(s_ord) == len(enc(after.scope_key))
                else t.c.scope_ord >= s_ord,
            )
        where.append(or_(t.c.updated_ms > at, later))
    async with store._client.read() as conn:
        fetch = limit
        if tie:
            count = select(func.count()).where(*where[: 1 if scope_key else 0], *tie)
            fetch += int((await conn.execute(count)).scalar_one())
        index = f"{t.name}_updated" if scope_key is None else f"{t.name}_scope_updated"
        stmt = (
            select(*cols, t.c.scope_ord, t.c.thread_ord)
            .where(*where)
            .order_by(*order)
            .with_hint(t, f"FORCE INDEX ({index})", "mysql")
        )
        rows = list((await conn.execute(stmt.limit(fetch))).all())
        if len(rows) == fetch and rows:
            last = rows[-1]
            if store._ord_bytes is not None and (
                len(last.thread_ord) == store._ord_bytes or len(last.scope_ord) == store._ord_bytes
            ):
                # Ids longer than the ord columns tie on them: read the whole tie.
                same = [
                    *where,
                    t.c.updated_ms == last.updated_ms,
                    t.c.scope_ord == last.scope_ord,
                    t.c.thread_ord == last.thread_ord,
                ]
                rows += (
                    await conn.execute(select(*cols, t.c.scope_ord, t.c.thread_ord).where(*same))
                ).all()
    after_key = (
        None
        if after is None
        else (timestamp_ms(after.updated_at), enc(after.scope_key), enc(after.thread_id))
    )
    keyed = {(int(r.updated_ms), bytes(r.scope_key), bytes(r.thread_id)): r for r in rows}
    heads = []
    for key in sorted(k for k in keyed if after_key is None or k > after_key)[:limit]:
        r = keyed[key]
        heads.append(
            ThreadIndexEntry(
                dec(r.scope_key),
                dec(r.thread_id),
                _version(r),
                _EPOCH + timedelta(milliseconds=int(r.updated_ms)),
            )
        )
    return heads


async def load_thread(
    store: SqlThreadStore, scope_key: str, thread_id: str
) -> ThreadAggregate | None:
    """The root and every row of the thread, from one read snapshot."""
    async with store._client.reading() as op:
        conn = op.conn
        rows = _ThreadRows(op, store, scope_key, thread_id)
        t = store.tables.threads
        head = (
            await conn.execute(
                select(t.c.doc, t.c.messages_next, t.c.runs_next, t.c.queued_next).where(
                    t.c.tkey == rows.key
                )
            )
        ).first()
        if head is None:
            return None
        root = rows.parse_root(head.doc)
        found: dict[FamilyName, Sequence[Any]] = {}
        for spec in FAMILIES:
            table = rows.table(spec.name)
            found[spec.name] = (
                await conn.execute(
                    select(table.c.position, table.c.doc)
                    .where(table.c.tkey == rows.key)
                    .order_by(table.c.position)
                )
            ).all()
        return thread_from_rows(root, _ThreadRows._positions(head), found)


async def restore_once(store: SqlThreadStore, aggregate: ThreadAggregate) -> ThreadVersion | None:
    """One attempt of a restore: the root and every row, only if the thread is missing."""
    root = aggregate.root
    try:
        async with store._client.writing() as op:
            tx = _Transaction(op, store, root.scope_key, root.thread_id, _RESTORE)
            await tx.hold()
            await insert_thread(tx, aggregate)
    except ThreadConflict as conflict:
        return conflict.current
    return None


async def fork_once(store: SqlThreadStore, request: ForkRequest) -> ThreadRecord:
    """The fork in one write transaction; the copied rows never leave the database.

    The source root is held (``FOR UPDATE`` on MySQL; SQLite's write
    transaction holds the database), the fork's plan made from reads in the
    same transaction (so at the held version), its root inserted, then
    one ``INSERT ... SELECT`` per family copies the rows the plan keeps.
    """
    async with store._client.writing() as op:
        conn = op.conn
        source = _Transaction(op, store, request.scope_key, request.source_thread_id)
        held = await source.hold()
        snapshot = _Snapshot(op, store, request.scope_key, request.source_thread_id)
        plan = await request.plan_in(store, snapshot)  # a missing source raises
        if held.root is None or held.root.version != plan.source_version:
            raise SourceChanged
        now = None if plan.test_now is not None else await store._client.server_time(conn)
        root = plan.root(now)
        fork = _Transaction(op, store, plan.scope_key, plan.thread_id, _RESTORE)
        await fork.hold()
        await fork.write_root(root, held.next_positions, created=True)
        dropped = [digest(i) for i in sorted(plan.dropped_run_ids)]
        m, r = store.tables.messages, store.tables.runs
        keep_messages: list[Any] = [m.c.tkey == source.key]
        if plan.through_message_id is not None:
            cut = (
                await conn.execute(
                    select(m.c.position).where(
                        m.c.tkey == source.key, m.c.id_h == digest(plan.through_message_id)
                    )
                )
            ).scalar()
            if cut is None:  # the plan was made from this very version
                raise SourceChanged
            keep_messages.append(m.c.position <= int(cut))
        keep_runs: list[Any] = [r.c.tkey == source.key]
        if dropped:
            keep_messages.append(or_(m.c.run_h.is_(None), m.c.run_h.not_in(dropped)))
            keep_runs.append(r.c.id_h.not_in(dropped))
        for table, keep in ((m, keep_messages), (r, keep_runs)):
            names = [c.name for c in table.columns if c.name != "tkey"]
            rows = select(
                literal(fork.key, type_=table.c.tkey.type).label("tkey"),
                *(table.c[n] for n in names),
            ).where(*keep)
            await conn.execute(insert(table).from_select(["tkey", *names], rows))
        return root
