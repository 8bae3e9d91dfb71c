"""Operations on SQLite run whole in their connection's database thread.

On SQLite engines the client made, ``SqlClient.run_write`` runs ``BEGIN
IMMEDIATE``, the commit pipeline's statements and ``COMMIT`` in one call to the
writer's thread (see docs/sql.md) instead of one trip between threads per
statement; ``run_read`` runs a read whole on the event loop, with no trip to
a thread, unless it finds the database locked. These tests pin what that must
keep: one trip per operation (none for a read), every statement still
seen by the engine's ``before_cursor_execute`` listeners, a body that would
wait is refused and rolled back, warnings reach ``on_warning`` on the event
loop, a failed ``COMMIT`` is an unknown outcome, a cancelled commit leaves
nothing half-written and the store usable, and MySQL keeps its own path.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite
import pytest
from pai_storage_sql.client import InlineDriver, Operation
from sqlalchemy import event

from pai_storage import CommittedResult, StoreWarning
from pai_storage import builders as b
from pai_storage.backend import emit_warning
from pai_storage.errors import ThreadStoreCommitUnknownError

from .conftest import Target

pytestmark = pytest.mark.asyncio


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every trip to a database thread: a whole operation handed to the client's
    executor, or a call of aiosqlite's connection (each is one)."""
    from pai_storage_sql import sqlite_thread

    seen: list[str] = []

    def counting(name: str, original: Any) -> Any:
        if asyncio.iscoroutinefunction(original):

            async def counted_call(*args: Any, **kwargs: Any) -> Any:
                seen.append(name)
                return await original(*args, **kwargs)

            return counted_call

        def counted(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return original(*args, **kwargs)

        return counted

    monkeypatch.setattr(sqlite_thread, "in_thread", counting("operation", sqlite_thread.in_thread))
    for name in ("execute", "execute_fetchall", "executemany", "commit", "rollback", "cursor"):
        original = getattr(aiosqlite.Connection, name)
        monkeypatch.setattr(aiosqlite.Connection, name, counting(name, original))
    return seen


def _turn(n: int) -> dict[str, Any]:
    run_id = f"r{n}"
    return {
        "messages": [
            b.insert(b.message(f"u{n}", "question", run_id=run_id, relation="input")),
            b.insert(
                b.message(f"a{n}", "answer", role="assistant", run_id=run_id, relation="output")
            ),
        ],
        "runs": [b.insert(b.run(run_id, "completed", inputs=[f"u{n}"]))],
    }


async def test_a_commit_is_one_trip_to_the_database_thread(
    sqlite_target: Target, trips: list[str]
) -> None:
    async with sqlite_target.store() as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        engine = (await store.client.ready()).writer
        statements: list[tuple[str, str]] = []

        def before(conn: Any, cursor: Any, text: str, *args: Any) -> None:
            statements.append((text.split()[0], threading.current_thread().name))

        event.listen(engine.sync_engine, "before_cursor_execute", before)
        try:
            trips.clear()
            result = await store.commit_thread(
                b.update_at("s", "t", created.thread.version, _turn(1), root=b.root())
            )
        finally:
            event.remove(engine.sync_engine, "before_cursor_execute", before)
        assert isinstance(result, CommittedResult)
        assert len(trips) == 1
        # The listeners still see every statement, in the database thread.
        kinds = [kind for kind, _ in statements]
        assert kinds[0] == "BEGIN"
        assert kinds.count("INSERT") == 2  # messages, runs
        assert "UPDATE" in kinds
        assert {name for _, name in statements} != {threading.current_thread().name}
        read = await store.read_thread(
            b.read("s", "t", messages={"type": "page", "view": "transcript", "page": {"limit": 10}})
        )
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["u1", "a1"]


async def test_a_read_runs_on_the_event_loop(sqlite_target: Target, trips: list[str]) -> None:
    async with sqlite_target.store() as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        await store.commit_thread(
            b.update_at("s", "t", created.thread.version, _turn(1), root=b.root())
        )
        await store.read_thread(b.read("s", "t"))  # the reader connection is open
        engine = (await store.client.ready()).reader
        threads: list[threading.Thread] = []

        def before(*_: Any) -> None:
            threads.append(threading.current_thread())

        event.listen(engine.sync_engine, "before_cursor_execute", before)
        try:
            trips.clear()
            newest = {"type": "page", "view": "transcript", "order": "newest", "page": {"limit": 1}}
            read = await store.read_thread(b.read("s", "t", messages=newest))
            listed = await store.list_threads({"scopeKey": "s", "limit": 10})
            assert read.messages is not None
            assert read.messages.next_page_token is not None
            paged = {**newest, "page": {"limit": 1, "pageToken": read.messages.next_page_token}}
            older = await store.read_thread(b.read("s", "t", messages=paged))
        finally:
            event.remove(engine.sync_engine, "before_cursor_execute", before)
        assert trips == []  # no trip to a database thread
        assert threads
        assert set(threads) == {threading.current_thread()}
        assert [m.message_id for m in read.messages.items] == ["a1"]
        assert older.messages is not None
        assert [m.message_id for m in older.messages.items] == ["u1"]
        assert [t.thread_id for t in listed.items] == ["t"]


@pytest.fixture
def locked_once(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Arm (append ``True``) to have the next statement run on the event loop
    (after its ``BEGIN``, if any) fail as SQLite does when another connection
    holds the lock it needs.

    A WAL reader finds the database locked only while SQLite recovers the log
    or another connection holds it in exclusive locking mode, which it cannot
    take while the store's connections are open: the error is raised here,
    with SQLite's code, where the driver would raise it.
    """
    armed: list[bool] = []
    loop_thread = threading.current_thread()
    original = InlineDriver.execute_fetchall

    async def execute_fetchall(self: InlineDriver, sql: str, args: Any) -> list[Any]:
        if armed and threading.current_thread() is loop_thread and not sql.startswith("BEGIN"):
            armed.clear()
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
            raise error
        return await original(self, sql, args)

    monkeypatch.setattr(InlineDriver, "execute_fetchall", execute_fetchall)
    return armed


async def test_a_read_that_finds_the_database_locked_runs_again_in_the_thread(
    sqlite_target: Target, trips: list[str], locked_once: list[bool]
) -> None:
    """A read on the event loop never waits for a lock (a held reader's
    ``busy_timeout`` is 0 between operations); one that finds the database
    locked is rolled back and runs again in the thread, waiting up to the
    client's ``busy_timeout``, as a read statement by statement does."""
    async with sqlite_target.store(busy_timeout=2.5, pool_size=1) as store:
        await store.commit_thread(b.create("s", "t"))
        loop_thread = threading.current_thread()
        got: list[str] = []

        async def on_warning(warning: StoreWarning) -> None:
            got.append(warning.reason)

        async def busy_timeout(op: Operation) -> tuple[int, bool]:
            await emit_warning(on_warning, StoreWarning("invalid_record", "read"))
            rows = await op.driver.execute_fetchall("PRAGMA busy_timeout", ())
            return int(rows[0][0]), threading.current_thread() is loop_thread

        await store.read_thread(b.read("s", "t"))  # the reader connection is open
        trips.clear()
        assert await store.client.run_read(busy_timeout) == (0, True)  # on the loop
        assert trips == []
        for call in (
            lambda: store.client.run_read(busy_timeout),
            lambda: store.read_thread(b.read("s", "t")),
            lambda: store.list_threads({"scopeKey": "s", "limit": 10}),
        ):
            got.clear()
            trips.clear()
            locked_once.append(True)
            result = await call()
            assert not locked_once  # the lock was met on the loop
            assert trips == ["operation"]  # then the read ran in the thread
            if isinstance(result, tuple):
                assert result == (2500, False)  # waiting up to busy_timeout there
                assert got == ["read"]  # the attempt on the loop was rolled back
        read = await store.read_thread(b.read("s", "t"))
        assert read.thread is not None
        listed = await store.list_threads({"scopeKey": "s", "limit": 10})
        assert [t.thread_id for t in listed.items] == ["t"]
        async with store.client.reading() as op:  # statement by statement
            rows = await op.driver.execute_fetchall("PRAGMA busy_timeout", ())
        assert rows[0][0] == 2500
        assert await store.client.run_read(busy_timeout) == (0, True)  # 0 again


async def test_a_body_that_waits_is_refused_and_rolled_back(sqlite_target: Target) -> None:
    async with sqlite_target.store() as store:
        await store.commit_thread(b.create("s", "t"))

        async def body(op: Operation) -> None:
            assert op.inline
            await op.run_text("CREATE TABLE written_then_waited (x INTEGER)")
            await asyncio.sleep(0)  # a wait: not allowed in the database thread

        with pytest.raises(RuntimeError, match="suspended"):
            await store.client.run_write(body)
        async with store.client.reading() as op:
            tables = await op.driver.execute_fetchall(
                "SELECT name FROM sqlite_master WHERE name = 'written_then_waited'", ()
            )
        assert list(tables) == []
        # The writer is still usable.
        assert isinstance(await store.commit_thread(b.create("s", "t2")), CommittedResult)


async def test_warnings_reach_on_warning_on_the_event_loop(
    sqlite_target: Target, trips: list[str]
) -> None:
    async with sqlite_target.store() as store:
        await store.commit_thread(b.create("s", "t"))
        loop_thread = threading.current_thread()
        got: list[tuple[str, threading.Thread]] = []

        async def on_warning(warning: StoreWarning) -> None:
            await asyncio.sleep(0)  # a callback that waits: only on the loop
            got.append((warning.reason, threading.current_thread()))

        def body(in_loop: bool) -> Callable[[Operation], Awaitable[int]]:
            async def run(op: Operation) -> int:
                assert op.inline
                assert (threading.current_thread() is loop_thread) is in_loop
                for reason in ("first", "second"):
                    await emit_warning(on_warning, StoreWarning("invalid_record", reason))
                assert got == []  # kept, not delivered, until the operation has ended
                rows = await op.driver.execute_fetchall("SELECT 1", ())
                return int(rows[0][0])

            return run

        await store.read_thread(b.read("s", "t"))  # the reader connection is open
        trips.clear()
        assert await store.client.run_write(body(in_loop=False)) == 1  # the database thread
        assert len(trips) == 1
        assert got == [("first", loop_thread), ("second", loop_thread)]
        got.clear()
        assert await store.client.run_read(body(in_loop=True)) == 1  # a read: on the loop
        assert got == [("first", loop_thread), ("second", loop_thread)]

        async def failing(op: Operation) -> None:
            await emit_warning(on_warning, StoreWarning("invalid_record", "third"))
            raise ValueError("the body failed")

        with pytest.raises(ValueError, match="the body failed"):
            await store.client.run_write(failing)
        assert got[-1] == ("third", loop_thread)  # delivered when the operation fails too


async def test_a_failed_commit_is_an_unknown_outcome(
    sqlite_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with sqlite_target.store() as store:
        await store.commit_thread(b.create("s", "t"))

        async def failing_commit(self: InlineDriver) -> None:
            exc = sqlite3.OperationalError("disk I/O error")
            exc.sqlite_errorcode = 10  # SQLITE_IOERR
            raise exc

        with monkeypatch.context() as patch:
            patch.setattr(InlineDriver, "commit", failing_commit)
            with pytest.raises(ThreadStoreCommitUnknownError, match="COMMIT was pending"):
                await store.commit_thread(b.create("s", "t2"))
        # The connection whose COMMIT failed is not reused; nothing was applied here.
        read = await store.read_thread(b.read("s", "t2"))
        assert read.thread is None
        assert isinstance(await store.commit_thread(b.create("s", "t2")), CommittedResult)


async def test_a_cancelled_commit_leaves_the_store_usable(sqlite_target: Target) -> None:
    async with sqlite_target.store() as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        for n in range(20):
            task = asyncio.create_task(
                store.commit_thread(b.update_at("s", "t", version, _turn(n), root=b.root()))
            )
            await asyncio.sleep(0.0002 * (n % 5))
            task.cancel()
            try:
                result = await task
            except asyncio.CancelledError:
                pass  # applied or not: read it back
            else:
                assert isinstance(result, CommittedResult)
            read = await store.read_thread(
                b.read(
                    "s",
                    "t",
                    messages={"type": "page", "view": "transcript", "page": {"limit": 100}},
                )
            )
            assert read.thread is not None
            assert read.messages is not None
            # All of a turn or none of it.
            assert len(read.messages.items) == 2 * (read.thread.version.revision - 1)
            version = read.thread.version
        final = await store.commit_thread(b.update_at("s", "t", version, _turn(99), root=b.root()))
        assert isinstance(final, CommittedResult)


async def test_a_commit_cancelled_while_waiting_for_the_lock_is_not_applied(
    sqlite_target: Target,
) -> None:
    async with sqlite_target.store() as store:
        await store.commit_thread(b.create("s", "t"))
        path = sqlite_target.url.removeprefix("sqlite:///")
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            task = asyncio.create_task(store.commit_thread(b.create("s", "t2")))
            await asyncio.sleep(0.3)  # waiting for the lock, in the database thread
            assert not task.done()
            task.cancel()
            await asyncio.sleep(0.05)
            blocker.execute("ROLLBACK")  # the lock is free: the cancelled commit goes on
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            blocker.close()
        # Its caller gave up before it committed: it rolled back.
        assert (await store.read_thread(b.read("s", "t2"))).thread is None
        assert isinstance(await store.commit_thread(b.create("s", "t3")), CommittedResult)


async def test_mysql_commits_take_the_usual_path(mysql_target: Target) -> None:
    async with mysql_target.store() as store:
        engines = await store.client.ready()
        assert engines.held_writer is None
        seen: list[bool] = []

        async def body(op: Operation) -> None:
            seen.append(op.inline)

        await store.client.run_write(body)
        assert seen == [False]
