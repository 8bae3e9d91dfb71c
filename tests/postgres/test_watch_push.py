"""PostgreSQL watchers are woken by ``NOTIFY`` (docs/watch.md): another process
follows 200 chunk commits to the end, a waiting watcher is woken long before its
interval, and killing the listening connection (``pg_terminate_backend``) loses
no final version."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.watch import MAX_PAYLOAD, payload, watch_channel, watch_key
from support.watching import check_chain, start_watcher, stream_reply, until_final

from pai_storage import CommitThreadInput, ThreadChange, ThreadVersion, builders

from .helpers import URL

CHUNKS = 200
LONG = 3600.0  # seconds between polls: only NOTIFY (or the listener's reconnect) wakes a watcher
WAIT = 20.0  # seconds a pushed change may take on a loaded machine (far below LONG)


async def _head(store: PostgresThreadStore, scope: str, thread: str) -> ThreadVersion:
    root = await store.conversation(scope, thread).get()
    assert root is not None
    return root.version


async def _until(changes: AsyncIterator[ThreadChange], final: ThreadVersion) -> ThreadChange:
    async with asyncio.timeout(WAIT):
        async for change in changes:
            if change.version == final:
                return change
    raise AssertionError("the watch ended")  # pragma: no cover - it is endless


async def _listener_pid(conn: asyncpg.Connection, channel: str) -> int | None:
    pid: int | None = await conn.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %' || $1 || '%'", channel
    )
    return pid


async def _next_look(conn: asyncpg.Connection, channel: str) -> int | None:
    """The listener's pid a moment later (the server's view changes on its own time)."""
    await asyncio.sleep(0.05)
    return await _listener_pid(conn, channel)


async def test_a_watcher_in_another_process_sees_every_chunk_commit(pg_schema: str) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        chat = store.conversation("tenant", "chat")
        await chat.add("user", "tell me a long story")
        start = await _head(store, "tenant", "chat")
        watcher = await start_watcher(
            PostgresThreadStore,
            [URL],
            {"schema": pg_schema},
            scope="tenant",
            thread="chat",
            after=start,
            interval=LONG,
        )
        try:
            await asyncio.sleep(1.0)  # the watcher process starts and listens
            final = await stream_reply(store, "tenant", "chat", CHUNKS)
            seen = await until_final(watcher, final)
        finally:
            watcher.terminate()
            await watcher.wait()
    assert final.revision > start.revision + CHUNKS  # every chunk was its own commit
    check_chain(seen, start, final)
    assert len(seen) > 10  # woken by the commits, not once an hour
    told = [c["changed"] for c in seen if c["changed"] is not None]
    assert any(c["messages"]["updated"] for c in told)  # the chunks replaced the reply


async def test_killing_the_listening_connection_loses_no_final_version(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        chat = store.conversation("s", "t")
        await chat.add("user", "first")
        start = await _head(store, "s", "t")
        changes = store.watch("s", "t", after=start, interval=LONG)
        channel = watch_channel(store.tables)
        watching = asyncio.create_task(anext(changes))
        await chat.add("user", "pushed")
        async with asyncio.timeout(WAIT):
            await watching
        pid = await _listener_pid(pg_conn, channel)
        assert pid is not None
        assert await pg_conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        for i in range(3):  # while the listener is gone or reconnecting: not notified to it
            await chat.add("user", f"during the cut {i}")
        final = await _head(store, "s", "t")
        await _until(changes, final)
        async with asyncio.timeout(WAIT):  # listening again, on another connection
            again = await _listener_pid(pg_conn, channel)
            while again in (None, pid):
                again = await _next_look(pg_conn, channel)
        assert again != pid
        watching = asyncio.create_task(anext(changes))
        await chat.add("user", "after the reconnect")
        async with asyncio.timeout(WAIT):
            change = await watching
        assert change.commits == 1
        await changes.aclose()


async def test_the_listener_leaves_when_the_last_watcher_does(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        await store.conversation("s", "t").add("user", "hi")
        start = await _head(store, "s", "t")
        channel = watch_channel(store.tables)
        changes = store.watch("s", "t", after=start, interval=LONG)
        watching = asyncio.create_task(anext(changes))
        async with asyncio.timeout(WAIT):
            while await _next_look(pg_conn, channel) is None:
                pass
        watching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watching
        await changes.aclose()
        async with asyncio.timeout(WAIT):
            while await _next_look(pg_conn, channel) is not None:
                pass


def test_a_payload_names_threads_by_hash_and_fits_postgres() -> None:
    commit = CommitThreadInput.model_validate(builders.create("tenant-secret", "chat-1"))
    text = payload(commit, None)
    assert "tenant-secret" not in text
    assert "chat-1" not in text
    assert watch_key("tenant-secret", "chat-1") in text
    assert watch_key("tenant-secret", None) in text
    assert watch_key("a", "b\x00c") != watch_key("a\x00b", "c")


async def test_a_commit_too_large_to_describe_is_notified_without_what_changed(
    pg_schema: str,
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        chat = store.conversation("s", "t")
        await chat.add("user", "hi")
        root = await chat.get()
        assert root is not None
        changes = store.watch("s", "t", after=root.version, interval=LONG)
        watching = asyncio.create_task(anext(changes))
        ids = [f"message-{i:04d}-{'x' * 40}" for i in range(MAX_PAYLOAD // 40)]
        inserts = [builders.insert(builders.message(i)) for i in ids]
        commit = builders.update(root, {"messages": inserts})
        assert len(payload(CommitThreadInput.model_validate(commit), root).encode()) < MAX_PAYLOAD
        await store.commit_thread(commit)
        async with asyncio.timeout(WAIT):
            change = await watching
        assert change.commits == 1
        assert change.changed is None  # too many ids for one NOTIFY: re-read the thread
        await changes.aclose()


async def test_an_application_pool_of_one_connection_is_not_taken_by_the_listener(
    pg_schema: str,
) -> None:
    # The listener would hold the pool's only connection while anyone watches:
    # every read and commit of the store would wait for it. Watchers poll instead.
    pool = await asyncpg.create_pool(URL, min_size=1, max_size=1)
    try:
        async with PostgresThreadStore(client=pool, schema=pg_schema) as store:
            chat = store.conversation("s", "t")
            await chat.add("user", "first")
            start = await _head(store, "s", "t")
            changes = store.watch("s", "t", after=start, interval=0.05)
            watching = asyncio.create_task(anext(changes))
            await asyncio.sleep(0.5)  # the watcher has started (and would listen)
            async with asyncio.timeout(WAIT):
                await chat.add("user", "second")
                change = await watching
            assert change.commits == 1
            await changes.aclose()
    finally:
        await pool.close()
