"""A reply cancelled at any point leaves its run closed (docs/conversation.md), on
every backend: memory, a SQLite file, PostgreSQL and MariaDB (real servers).

The store's acknowledgement of a commit is delayed (its ``commit_thread`` is
wrapped: the commit itself is the backend's), so a cancellation lands while a
reply's opening or closing commit is in flight.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from pai_storage import ThreadStore, open_store
from pai_storage import builders as b

PG_URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("PAI_TEST_SQL_MYSQL_URL", "mysql://root@127.0.0.1/test")
HANG_GUARD = 60.0
ACK_DELAY = 0.2  # seconds between a commit landing and its caller hearing of it


@pytest_asyncio.fixture(params=["memory", "sqlite", "postgres", "mariadb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ThreadStore]:
    urls = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path / 'chat.db'}",
        "postgres": PG_URL,
        "mariadb": MYSQL_URL,
    }
    async with open_store(urls[request.param]) as opened:
        yield opened


def _slow(store: ThreadStore, before: asyncio.Event, after: asyncio.Event) -> Callable[..., Any]:
    """``commit_thread`` that sets ``before`` as it sends and ``after`` once it has landed,
    then waits :data:`ACK_DELAY` before it returns."""
    commit: Callable[[Any], Awaitable[Any]] = store.commit_thread

    async def slow(request: Any) -> Any:
        before.set()
        await asyncio.sleep(ACK_DELAY)
        result = await commit(request)
        after.set()
        await asyncio.sleep(ACK_DELAY)
        return result

    return slow


async def _statuses(store: ThreadStore, scope: str) -> tuple[list[str], list[str]]:
    read = await store.read_thread(
        b.read(
            scope,
            "t",
            messages={"type": "page", "view": "raw", "page": {"limit": 10}},
            runs={"type": "page", "order": "oldest", "page": {"limit": 10}},
        )
    )
    assert read.messages is not None
    assert read.runs is not None
    return [m.status for m in read.messages.items], [r.status for r in read.runs.items]


async def test_a_reply_cancelled_while_it_opens_leaves_no_run_open(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = uuid.uuid4().hex
    chat = store.conversation(scope, "t", flush_every=0)
    await chat.add("user", "question")
    sent, landed = asyncio.Event(), asyncio.Event()
    monkeypatch.setattr(store, "commit_thread", _slow(store, sent, landed))

    async def answer() -> None:
        async with chat.reply() as reply:
            await reply.write("never written")

    task = asyncio.create_task(answer())
    async with asyncio.timeout(HANG_GUARD):
        await landed.wait()  # the run is open in the store; reply() has not returned
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    monkeypatch.undo()
    assert await _statuses(store, scope) == (["complete", "incomplete"], ["cancelled"])
    async with store.conversation(scope, "t").reply() as again:  # not "one reply at a time"
        await again.write("answered")


async def test_a_reply_cancelled_again_while_it_closes_still_closes(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = uuid.uuid4().hex
    chat = store.conversation(scope, "t", flush_every=0)
    await chat.add("user", "question")
    started = asyncio.Event()

    async def answer() -> None:
        async with chat.reply() as reply:
            await reply.write("partial")
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(answer())
    async with asyncio.timeout(HANG_GUARD):
        await started.wait()
        sent, landed = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(store, "commit_thread", _slow(store, sent, landed))
        task.cancel()  # the body is cancelled: the closing commit starts
        await sent.wait()
        task.cancel()  # and cancelled again (a task group, a server shutting down)
        with pytest.raises(asyncio.CancelledError):
            await task
    monkeypatch.undo()
    assert await _statuses(store, scope) == (["complete", "incomplete"], ["cancelled"])
