"""close() while a lazy initialize is still running leaves nothing of the store open.

The first operation on a store starts the initialize (pool, then schema set-up).
When that operation is cancelled and the store is closed before the initialize
finished, ``close()`` must return only once every connection the store opened
is gone, and every operation, the one still waiting included, must raise the
typed "closed" error instead of running on a closed store.

Connections are counted on the server by the store's own ``application_name``.
Two deterministic stops hold the initialize at a known await: a proxy that lets
the pool's first connection through and holds the others (the pool is being
created), and the advisory lock of the schema set-up, held by the test (the
pool is open and a DDL transaction is waiting).

The last test cancels a read and a commit while their statement waits for a
table lock: the caller sees the cancellation, nothing is applied, and the
store goes on working.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from pai_storage_postgres import PostgresThreadStore, Tables

from pai_storage import builders as b
from pai_storage import make_url
from pai_storage.errors import ThreadStoreConfigurationError

from .helpers import URL, dsn, proxied_url

READ = b.read("scope", "thread")


def _app_url(app: str, base: str = URL) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}application_name={app}"


async def _connections(app: str) -> int:
    conn = await asyncpg.connect(dsn(), timeout=10)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app
        )
    finally:
        await conn.close()
    return int(count)


async def _settled(app: str, expected: int, within: float = 5.0) -> int:
    """The store's connection count once it reaches ``expected`` (or ``within`` s pass).

    The server notices a closed socket asynchronously; a leaked connection
    stays open for good, so waiting a little only removes that race.
    """
    deadline = time.monotonic() + within
    while True:
        count = await _connections(app)
        if count == expected or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.05)


async def _waiting_on_lock(app: str, within: float = 10.0) -> None:
    conn = await asyncpg.connect(dsn(), timeout=10)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                app,
            )
            if waiting:
                return
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    raise AssertionError("the initialize never reached the schema lock")


async def _cancel_close_and_check(
    store: PostgresThreadStore, first: asyncio.Task[object], second: asyncio.Task[object], app: str
) -> None:
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await store.close()
    assert await _settled(app, 0) == 0, "close() returned with connections of the store open"
    # The operation that was waiting for the initialize gets the typed error, not a result.
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await second
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.read_thread(READ)
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.commit_thread(b.create("scope", "thread"))
    assert await _connections(app) == 0


class _HoldingProxy:
    """Forwards the first ``through`` connections to the server; holds later ones unanswered."""

    def __init__(self, through: int) -> None:
        self.through = through
        self.accepted = 0
        self.port = 0
        self.held = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        try:
            if self.accepted > self.through:
                self.held.set()
                await reader.read()  # never answered; ends when the client goes away
                return
            target = make_url(URL)
            up_reader, up_writer = await asyncio.open_connection(
                target.host or "127.0.0.1", target.port or 5432
            )

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()

            try:
                _, pending = await asyncio.wait(
                    {
                        asyncio.ensure_future(pipe(reader, up_writer)),
                        asyncio.ensure_future(pipe(up_reader, writer)),
                    },
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for p in pending:
                    p.cancel()
            finally:
                up_writer.close()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)


@pytest_asyncio.fixture
async def holding_proxy() -> AsyncIterator[_HoldingProxy]:
    proxy = _HoldingProxy(through=1)
    await proxy.start()
    yield proxy
    await proxy.stop()


async def test_close_while_the_pool_connects_leaves_nothing_open(
    holding_proxy: _HoldingProxy, pg_schema: str
) -> None:
    app = f"pai_close_{uuid.uuid4().hex[:10]}"
    url = _app_url(app, proxied_url(holding_proxy.port))
    store = PostgresThreadStore(url, schema=pg_schema, min_pool_size=3, max_pool_size=3)
    first = asyncio.create_task(store.read_thread(READ))
    second = asyncio.create_task(store.read_thread(READ))
    await asyncio.wait_for(holding_proxy.held.wait(), 10)
    # The pool's first connection is open on the server; the others are held.
    assert await _settled(app, 1) == 1
    await _cancel_close_and_check(store, first, second, app)


async def test_close_during_schema_set_up_leaves_nothing_open(pg_schema: str) -> None:
    app = f"pai_close_{uuid.uuid4().hex[:10]}"
    store = PostgresThreadStore(_app_url(app), schema=pg_schema, min_pool_size=2)
    blocker = await asyncpg.connect(dsn(), timeout=10)
    try:
        # The schema set-up takes this lock before its DDL: hold it, so the
        # initialize stops there with its pool open and a transaction waiting.
        await blocker.execute(
            "SELECT pg_advisory_lock(hashtextextended($1, 0))",
            Tables("pai_threads", pg_schema).lock_key,
        )
        first = asyncio.create_task(store.read_thread(READ))
        second = asyncio.create_task(store.read_thread(READ))
        await _waiting_on_lock(app)
        assert await _connections(app) == 2
        await _cancel_close_and_check(store, first, second, app)
    finally:
        await blocker.close()


@pytest.mark.parametrize("delay_ms", [0, 1, 2, 4, 8, 16, 32])
async def test_close_at_any_point_of_initialize_leaves_nothing_open(
    pg_schema: str, delay_ms: int
) -> None:
    """Wherever the cancellation lands (connect, version check, DDL), nothing stays open."""
    app = f"pai_close_{uuid.uuid4().hex[:10]}"
    store = PostgresThreadStore(_app_url(app), schema=pg_schema, min_pool_size=3)
    first = asyncio.create_task(store.read_thread(READ))
    await asyncio.sleep(delay_ms / 1000)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await store.close()
    assert await _settled(app, 0) == 0
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.read_thread(READ)


async def test_close_after_use_closes_the_pool(pg_schema: str) -> None:
    app = f"pai_close_{uuid.uuid4().hex[:10]}"
    store = PostgresThreadStore(_app_url(app), schema=pg_schema, min_pool_size=2)
    assert (await store.read_thread(READ)).thread is None
    assert await _connections(app) == 2
    await store.close()
    await store.close()  # idempotent
    assert await _settled(app, 0) == 0
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.list_threads({"scopeKey": "scope", "limit": 5})


@pytest.mark.parametrize("kind", ["read", "commit"])
async def test_a_cancelled_operation_applies_nothing_and_the_store_recovers(
    pg_schema: str, kind: str
) -> None:
    """Cancelled while its statement waits on the server: the caller sees the
    cancellation (not a store error), a commit applies nothing, the pool recovers."""
    page = {"type": "page", "view": "raw", "page": {"limit": 5}}
    async with PostgresThreadStore(URL, schema=pg_schema, max_pool_size=1) as store:
        created = await store.commit_thread(
            b.create("scope", "thread", {"messages": [b.insert(b.message("m1"))]})
        )
        assert created.type == "committed"
        assert created.thread is not None
        blocker = await asyncpg.connect(dsn(), timeout=10)
        try:
            lock = blocker.transaction()
            await lock.start()
            await blocker.execute(f"LOCK TABLE {store.tables.messages} IN ACCESS EXCLUSIVE MODE")
            if kind == "read":
                operation = store.read_thread(b.read("scope", "thread", messages=page))
            else:
                operation = store.commit_thread(
                    b.update_at(
                        "scope",
                        "thread",
                        created.thread.version,
                        {"messages": [b.insert(b.message("m2"))]},
                        root=b.root(title="after"),
                    )
                )
            task = asyncio.ensure_future(operation)
            await asyncio.sleep(0.3)  # the statement now waits for the lock
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await lock.rollback()
        finally:
            await blocker.close()
        read = await store.read_thread(b.read("scope", "thread", messages=page))
        assert read.thread is not None
        assert read.thread.version == created.thread.version
        assert read.thread.title is None
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["m1"]
