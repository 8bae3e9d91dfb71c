"""A read of the root and one page is one statement, and answers what the two-step read does.

The two-step read is the root, then the page, in one ``REPEATABLE READ READ
ONLY`` transaction (what a read of several families, or of runs under several
statuses, still does). Both are run here on the same data for every family,
view, order and filter, page after page, and must give the same result.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres import reads as pg_reads
from pai_storage_postgres.reads import _PgSnapshot
from pai_storage_postgres.store import SESSION_SETTINGS

from pai_storage import CommittedResult, ReadThreadInput, ThreadReadResult, ThreadRecord
from pai_storage import builders as b
from pai_storage.backend import ChildPagePlan, FamilySpec, SnapshotRoot, Window, run_read
from pai_storage.errors import ThreadStoreInvariantError, ThreadStorePageTokenError
from pai_storage.families import family as family_spec

from .helpers import URL, dsn

pytestmark = pytest.mark.asyncio

SCOPE = "head-page"
ATTR = {"messages": "messages", "runs": "runs", "queuedItems": "queued_items"}
STATUSES = ("completed", "failed", "cancelled", "completed", "running", "failed", "completed")

SELECTIONS: list[tuple[str, dict[str, Any]]] = [
    *[
        ("messages", {"type": "page", "view": view, "order": order})
        for view in ("raw", "transcript", "context")
        for order in ("oldest", "newest")
    ],
    ("messages", {"type": "page", "view": "transcript"}),  # the default order
    *[
        ("runs", {"type": "page", "order": order, **filt})
        for order in ("oldest", "newest")
        for filt in (
            {},
            {"statuses": ["completed"]},
            {"statuses": ["running"]},
            {"statuses": ["failed", "cancelled"]},
        )
    ],
    *[
        ("queuedItems", {"type": "page", "order": order, **filt})
        for order in ("oldest", "newest")
        for filt in ({}, {"runId": "rq3"}, {"runId": "r1"})
    ],
]


class _TwoStep(_PgSnapshot):
    """The snapshot without the one-statement read: the root, then the page."""

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        return None


@pytest_asyncio.fixture
async def store(pg_schema: str) -> AsyncIterator[PostgresThreadStore]:
    s = PostgresThreadStore(URL, schema=pg_schema)
    await s.initialize()
    yield s
    await s.close()


@pytest_asyncio.fixture
async def conn() -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn(), server_settings=dict(SESSION_SETTINGS))
    yield c
    await c.close()


async def _fill(store: PostgresThreadStore, thread: str = "t1") -> ThreadRecord:
    messages = [
        b.insert(b.message(f"m{i}", transcript=i % 2 == 1, context=i % 3 != 0))
        for i in range(1, 12)
    ]
    runs = [b.insert(b.run(f"r{i + 1}", s, operation=None)) for i, s in enumerate(STATUSES)]
    runs += [b.insert(b.run(f"rq{i}", "queued", queue_item_id=f"q{i}")) for i in range(1, 6)]
    queued = [b.insert(b.queued_item(f"q{i}", f"rq{i}", {"n": i})) for i in range(1, 6)]
    result = await store.commit_thread(
        b.create(SCOPE, thread, {"messages": messages, "runs": runs, "queuedItems": queued})
    )
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def _two_step(
    store: PostgresThreadStore, conn: asyncpg.Connection, request: dict[str, Any]
) -> ThreadReadResult:
    parsed = ReadThreadInput.model_validate(request)
    plan = store.selections.plan_read(parsed)
    snapshot = _TwoStep(conn, store._layout, parsed.scope_key, parsed.thread_id)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await run_read(snapshot, plan)


def _same(one: ThreadReadResult, two: ThreadReadResult) -> ThreadReadResult:
    """``one``, checked equal to ``two`` but for the observation time."""
    assert one.model_dump(exclude={"observed_at"}) == two.model_dump(exclude={"observed_at"})
    return one


def _read(thread: str, family: str, selection: dict[str, Any], token: str | None) -> Any:
    page: dict[str, Any] = {"limit": 2}
    if token is not None:
        page["pageToken"] = token
    return b.read(SCOPE, thread, **{family: {**selection, "page": page}})


@pytest.mark.parametrize(("family", "selection"), SELECTIONS)
async def test_one_statement_read_matches_the_transaction_read(
    store: PostgresThreadStore,
    conn: asyncpg.Connection,
    family: str,
    selection: dict[str, Any],
) -> None:
    await _fill(store)
    token: str | None = None
    walked: list[Any] = []
    for _ in range(20):
        request = _read("t1", family, selection, token)
        result = _same(await store.read_thread(request), await _two_step(store, conn, request))
        page = getattr(result, ATTR[family])
        assert page is not None
        walked.extend(page.items)
        token = page.next_page_token
        if token is None:
            break
    else:
        pytest.fail("the walk did not end")
    assert token is None
    # Every matching record once (the filter decides how many).
    full = await store.read_thread(
        b.read(SCOPE, "t1", **{family: {**selection, "page": {"limit": 100}}})
    )
    assert walked == getattr(full, ATTR[family]).items


@pytest.mark.parametrize(("family", "selection"), SELECTIONS[::3])
async def test_missing_thread_reads_alike(
    store: PostgresThreadStore, conn: asyncpg.Connection, family: str, selection: dict[str, Any]
) -> None:
    await _fill(store)
    request = _read("missing", family, selection, None)
    one = await store.read_thread(request)
    assert one.thread is None
    assert getattr(one, ATTR[family]) is None
    _same(one, await _two_step(store, conn, request))


async def test_single_pages_take_one_statement(
    store: PostgresThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every one-page read with at most one status is answered by ``head_and_page``
    (``head`` is never called); runs under several statuses still read the root
    with ``head`` (and the page with ``scan``, in the read's transaction)."""
    await _fill(store)
    calls: list[str] = []

    async def head(self: _PgSnapshot) -> SnapshotRoot:
        calls.append("head")
        return await original_head(self)

    original_head = _PgSnapshot.head
    monkeypatch.setattr(_PgSnapshot, "head", head)
    for family, selection in SELECTIONS:
        calls.clear()
        result = await store.read_thread(_read("t1", family, selection, None))
        assert getattr(result, ATTR[family]) is not None
        several = len(selection.get("statuses", ())) > 1
        assert calls == (["head"] if several else []), (family, selection)


async def test_pages_stay_below_the_counter(
    store: PostgresThreadStore, conn: asyncpg.Connection
) -> None:
    """A row at or past the family's counter (never committed by this version)
    is outside every page; a missing thread's rows are never read."""
    await _fill(store)
    t = store.tables
    for thread, position in ((b"t1", 12), (b"gone", 1)):
        await conn.execute(
            f"INSERT INTO {t.messages} (scope_key, thread_id, position, message_id, "
            "transcript, context, doc) VALUES ($1, $2, $3, 'stray', true, true, '{}')",
            SCOPE.encode(),
            thread,
            position,
        )
    for order in ("oldest", "newest"):
        selection = {"type": "page", "view": "raw", "order": order}
        request = b.read(SCOPE, "t1", messages={**selection, "page": {"limit": 50}})
        result = _same(await store.read_thread(request), await _two_step(store, conn, request))
        assert result.messages is not None
        ids = [m.message_id for m in result.messages.items]
        assert sorted(ids, key=lambda i: int(i[1:])) == [f"m{i}" for i in range(1, 12)]
        missing = b.read(SCOPE, "gone", messages={**selection, "page": {"limit": 50}})
        assert (await store.read_thread(missing)).thread is None


async def test_continuation_of_an_earlier_incarnation_is_refused(
    store: PostgresThreadStore, conn: asyncpg.Connection
) -> None:
    root = await _fill(store)
    first = await store.read_thread(_read("t1", "messages", {"type": "page", "view": "raw"}, None))
    assert first.messages is not None
    token = first.messages.next_page_token
    assert token is not None
    deleted = await store.commit_thread(b.delete(SCOPE, "t1", root.version))
    assert isinstance(deleted, CommittedResult)
    await _fill(store)
    request = _read("t1", "messages", {"type": "page", "view": "raw"}, token)
    with pytest.raises(ThreadStorePageTokenError):
        await store.read_thread(request)
    with pytest.raises(ThreadStorePageTokenError):
        await _two_step(store, conn, request)


async def test_a_one_statement_read_gives_its_connection_back_before_validating(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows of a one-statement read are validated (and kept records copied)
    after its connection is back in the pool; a read in a transaction holds
    its connection throughout."""
    async with PostgresThreadStore(URL, schema=pg_schema, max_pool_size=1) as s:
        await _fill(s)
        pool = s._pool
        idle: list[tuple[str, int]] = []

        def page_records(spec: FamilySpec, rows: Sequence[Any]) -> list[tuple[int, Any]]:
            idle.append(("page", pool.get_idle_size()))
            return original_page(spec, rows)

        def parse_root(self: _PgSnapshot, doc: str) -> ThreadRecord:
            idle.append(("root", pool.get_idle_size()))
            return original_root(self, doc)

        original_page, original_root = pg_reads.page_records, _PgSnapshot._parse_root
        monkeypatch.setattr(pg_reads, "page_records", page_records)
        monkeypatch.setattr(_PgSnapshot, "_parse_root", parse_root)
        for family, selection in SELECTIONS:
            idle.clear()
            await s.read_thread(_read("t1", family, selection, None))
            held = len(selection.get("statuses", ())) > 1  # root, then page: a transaction
            assert idle == [("root", 1 - held), ("page", 1 - held)], (family, selection)
        idle.clear()
        assert (await s.read_thread(b.read(SCOPE, "t1"))).thread is not None  # the root alone
        assert idle == [("root", 1)]


async def test_a_one_statement_snapshot_runs_nothing_else(store: PostgresThreadStore) -> None:
    snapshot = pg_reads._StatementSnapshot(store._connection, store._layout, SCOPE, "t1")
    spec = family_spec("messages")
    plan = store.selections.plan_read(
        ReadThreadInput.model_validate(_read("t1", "messages", SELECTIONS[0][1], None))
    ).messages
    assert isinstance(plan, ChildPagePlan)
    for call in (
        snapshot.load_rows(spec, ["m1"]),
        snapshot.anchor_positions(["m1"]),
        snapshot.scan(spec, plan, plan.prospective_window()),
    ):
        with pytest.raises(ThreadStoreInvariantError, match="outside a transaction"):
            await call
