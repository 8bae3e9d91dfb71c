"""Every statement the thread store runs is an index lookup or a bounded index range scan.

A realistic workload (threads of several agents, parents, categories and
visibilities; a thread with runs, queued items and hundreds of messages)
runs through the store while every statement it sends is recorded; each one
is then explained on the same database. SQLite (``EXPLAIN QUERY PLAN``): a
``SEARCH`` through an index or the primary key, never a ``SCAN`` of a table
nor a temporary b-tree for ORDER BY. MariaDB (``EXPLAIN``): access type
``const``/``eq_ref``/``ref``/``range`` through a named key, never ``ALL`` or a
full ``index`` walk, never a filesort or temporary table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from pai_storage_sql import SqlThreadStore
from sqlalchemy import event

from pai_storage import CommittedResult
from pai_storage import builders as b

from .conftest import Target

pytestmark = pytest.mark.asyncio

SCOPE = "explain"
MESSAGES = 300


@contextmanager
def recorded(store: SqlThreadStore, engines: Any) -> Iterator[list[tuple[str, Any]]]:
    """Every single-row-set statement sent while the block runs, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool):  # type: ignore[no-untyped-def]
        if not many and statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
            seen.append((statement, params))

    targets = {id(e): e for e in (engines.writer, engines.reader)}.values()
    for engine in targets:
        event.listen(engine.sync_engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        for engine in targets:
            event.remove(engine.sync_engine, "before_cursor_execute", before)


async def _fill(store: SqlThreadStore) -> Any:
    for i in range(60):
        extra: dict[str, Any] = {}
        if i % 3 == 0:
            extra["parentThreadId"] = f"p{i % 4}"
        if i % 7 == 0:
            extra["category"] = f"c{i % 3}"
        created = await store.commit_thread(
            b.create(
                SCOPE,
                f"t{i:03}",
                agent=f"agent{i % 5}",
                visibility="hidden" if i % 6 == 0 else "visible",
                **extra,
            )
        )
        assert isinstance(created, CommittedResult)
    messages = [
        b.insert(b.message(f"m{i:04}", transcript=i % 2 == 0, context=i % 3 != 0))
        for i in range(MESSAGES)
    ]
    created = await store.commit_thread(b.create(SCOPE, "big", {"messages": messages}))
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    changes = {
        "messages": [b.insert(b.message("in1", run_id="r1", relation="input"))],
        "runs": [
            b.insert(b.run("r1", "running", inputs=["in1"])),
            b.insert(b.run("r2", "queued", queue_item_id="q2")),
        ],
        "queuedItems": [b.insert(b.queued_item("q2", "r2"))],
    }
    updated = await store.commit_thread(
        b.update_at(SCOPE, "big", created.thread.version, changes, root=b.root())
    )
    assert isinstance(updated, CommittedResult), updated
    assert updated.thread is not None
    return updated.thread.version


async def _workload(store: SqlThreadStore, version: Any) -> None:
    page = {"limit": 20}
    for view in ("raw", "transcript", "context"):
        for order in ("oldest", "newest"):
            read = await store.read_thread(
                b.read(
                    SCOPE,
                    "big",
                    messages={"type": "page", "view": view, "order": order, "page": page},
                )
            )
            assert read.messages is not None
            assert read.messages.next_page_token is not None
            await store.read_thread(
                b.read(
                    SCOPE,
                    "big",
                    messages={
                        "type": "page",
                        "view": view,
                        "order": order,
                        "page": {**page, "pageToken": read.messages.next_page_token},
                    },
                )
            )
    await store.read_thread(
        b.read(
            SCOPE,
            "big",
            messages={"type": "page", "view": "raw", "afterMessageId": "m0100", "page": page},
        )
    )
    await store.read_thread(
        b.read(SCOPE, "big", messages={"type": "ids", "messageIds": ["m0001", "m0200"]})
    )
    await store.read_thread(
        b.read(SCOPE, "big", runs={"type": "page", "statuses": ["running", "queued"], "page": page})
    )
    await store.read_thread(
        b.read(SCOPE, "big", queuedItems={"type": "page", "runId": "r2", "page": page})
    )
    for query in (
        {},
        {"agent": "agent1"},
        {"agent": "agent1", "parentThreadId": "p1"},
        {"agent": "agent2", "category": "c1"},
        {"parentThreadId": "p0"},
        {"category": "c0"},
        {"includeHidden": True},
    ):
        listed = await store.list_threads({"scopeKey": SCOPE, "limit": 5, **query})
        if listed.next_page_token is not None:
            await store.list_threads(
                {"scopeKey": SCOPE, "limit": 5, "pageToken": listed.next_page_token, **query}
            )
    # The updated-at index of the lifecycle sweeps, in one scope and across scopes.
    for scope in (SCOPE, None):
        heads = await store._thread_heads(scope, updated_before=None, after=None, limit=5)
        assert len(heads) == 5
        await store._thread_heads(
            scope, updated_before=heads[-1].updated_at, after=heads[1], limit=5
        )
    loaded = await store._load_thread(SCOPE, "big")
    assert loaded is not None
    # Commits: appends, a replacement, a deletion, a truncation, run changes.
    changes = {
        "messages": [
            b.insert(b.message("out1", run_id="r1", relation="output", role="assistant")),
            b.replace(b.message("m0005", "edited")),
            b.delete_record("m0007"),
        ],
        "runs": [b.replace(b.run("r1", "completed", inputs=["in1"]))],
    }
    committed = await store.commit_thread(
        b.update_at(SCOPE, "big", version, changes, root=b.root())
    )
    assert isinstance(committed, CommittedResult), committed
    assert committed.thread is not None
    cut = await store.commit_thread(
        b.create(SCOPE, "cut", {"messages": [b.insert(b.message(f"c{i}")) for i in range(10)]})
    )
    assert isinstance(cut, CommittedResult)
    assert cut.thread is not None
    truncated = await store.commit_thread(
        b.update_at(
            SCOPE, "cut", cut.thread.version, {"messages": [b.truncate("c4")]}, root=b.root()
        )
    )
    assert isinstance(truncated, CommittedResult), truncated


def _unfiltered_page(sql: str) -> bool:
    """A first page over a whole index (the oldest threads of every scope): its
    ordered index walk stops at the LIMIT, so it costs what it returns."""
    return "LIMIT" in sql and "WHERE" not in sql


def _sqlite_problems(plan: Sequence[Any], limited: bool) -> list[str]:
    problems = []
    for row in plan:
        detail = str(row[-1])
        # An ordered walk of an index that a LIMIT stops costs what it returns.
        walk = limited and "USING" in detail and "INDEX" in detail
        if detail.startswith("SCAN") and "CONSTANT ROW" not in detail and not walk:
            problems.append(detail)
        if "TEMP B-TREE" in detail:
            problems.append(detail)
    return problems


def _mysql_problems(plan: Sequence[Any], limited: bool) -> list[str]:
    problems = []
    for row in plan:
        info = dict(row._mapping)
        access, extra = info.get("type"), str(info.get("Extra") or "")
        if info.get("table") is None or "No tables used" in extra or "Impossible" in extra:
            continue
        if "Select tables optimized away" in extra or access == "system":
            continue  # no table read (the one-row derived table of a read's head)
        walk = access == "index" and limited  # an ordered index walk a LIMIT stops
        if access == "ALL" or (access == "index" and not walk) or info.get("key") is None:
            problems.append(f"{info.get('table')}: type={access} key={info.get('key')}")
        if "filesort" in extra or "temporary" in extra:
            problems.append(f"{info.get('table')}: {extra}")
    return problems


async def test_every_statement_uses_an_index(target: Target) -> None:
    async with target.store() as store:
        version = await _fill(store)
        engines = await store.client.ready()
        with recorded(store, engines) as seen:
            await _workload(store, version)
        statements = {
            (sql, tuple(params) if isinstance(params, list) else params) for sql, params in seen
        }
        statements = {s for s in statements if store.tables.prefix in s[0]}
        assert len(statements) >= 20  # the workload really ran the store's statements
        problems: dict[str, list[str]] = {}
        async with engines.reader.connect() as conn:
            for sql, params in sorted(statements, key=lambda s: s[0]):
                if target.dialect == "sqlite":
                    plan = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)).all()
                    found = _sqlite_problems(plan, _unfiltered_page(sql))
                else:
                    plan = (await conn.exec_driver_sql(f"EXPLAIN {sql}", params)).all()
                    found = _mysql_problems(plan, _unfiltered_page(sql))
                if found:
                    problems[sql] = found
            await conn.rollback()
        assert problems == {}


async def test_sqlite_lists_by_parent_or_category_search_their_partial_index(
    sqlite_target: Target,
) -> None:
    # The parent and category indexes leave out the threads without one; a list
    # that binds a parent or category must still search by it, not walk the
    # scope's visibility index and filter.
    async with sqlite_target.store() as store:
        await _fill(store)
        engines = await store.client.ready()
        with recorded(store, engines) as seen:
            for query in (
                {"agent": "agent1", "parentThreadId": "p1"},
                {"agent": "agent2", "category": "c1"},
                {"parentThreadId": "p0"},
                {"category": "c0"},
            ):
                await store.list_threads({"scopeKey": SCOPE, "limit": 5, **query})
        assert len(seen) == 4
        async with engines.reader.connect() as conn:
            for sql, params in seen:
                column = "parent_h" if "parent_h =" in sql else "category_h"
                plan = (
                    await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", tuple(params))
                ).all()
                (detail,) = [str(row[-1]) for row in plan]
                assert f"{column}=?" in detail, detail
            await conn.rollback()


async def test_sqlite_a_runs_messages_are_searched_in_the_partial_run_index(
    sqlite_target: Target,
) -> None:
    # The run index leaves out the messages outside any run; the relationship
    # check's query for a run's messages (run_h IN ...) must still search it.
    async with sqlite_target.store() as store:
        version = await _fill(store)
        engines = await store.client.ready()
        changes = {
            # A deletion: the facts do not follow from the stored ones, so the
            # rules query the run's messages.
            "messages": [
                b.delete_record("m0007"),
                b.insert(b.message("out1", run_id="r1", relation="output", role="assistant")),
            ],
            "runs": [b.replace(b.run("r1", "completed", inputs=["in1"]))],
        }
        with recorded(store, engines) as seen:
            committed = await store.commit_thread(
                b.update_at(SCOPE, "big", version, changes, root=b.root())
            )
        assert isinstance(committed, CommittedResult), committed
        by_run = [(sql, params) for sql, params in seen if "run_h IN" in sql and "_messages" in sql]
        assert by_run
        async with engines.reader.connect() as conn:
            for sql, params in by_run:
                plan = (
                    await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", tuple(params))
                ).all()
                assert any("_messages_run" in str(row[-1]) for row in plan), plan
            await conn.rollback()
