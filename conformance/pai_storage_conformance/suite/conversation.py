"""The conversation handle on the store under test (docs/conversation.md).

``ThreadStore.conversation()`` is built on ``read_thread`` and
``commit_thread`` only, so these tests check that every backend serves the
everyday chat loop: appends that all land, replies whose run is always
closed, root updates that keep what they do not name, and followers of a
streamed reply that always end with its final text.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from pai_storage import (
    ConversationConflictError,
    ManualClock,
    Message,
    RunRecord,
    ThreadStore,
)
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from ._support import new_scope

__all__ = ["TestConversation"]

pytestmark = pytest.mark.asyncio

WRITERS = 3
MESSAGES = 15
INTERVAL = 0.01  # a follower's polling interval on backends without a push signal
HANG_GUARD = 60.0  # seconds: only ever reached when a follower misses the end of a reply


class _ModelDown(Exception):
    pass


async def _stream(*chunks: str) -> Any:
    for chunk in chunks:
        await asyncio.sleep(0)
        yield chunk


async def _raw(store: ThreadStore, scope: str, thread_id: str) -> list[Message]:
    read = await store.read_thread(
        b.read(scope, thread_id, messages={"type": "page", "view": "raw", "page": {"limit": 100}})
    )
    assert read.messages is not None
    return list(read.messages.items)


async def _runs(store: ThreadStore, scope: str, thread_id: str) -> list[RunRecord]:
    read = await store.read_thread(
        b.read(scope, thread_id, runs={"type": "page", "page": {"limit": 100}})
    )
    assert read.runs is not None
    return list(read.runs.items)


async def _followed(records: AsyncIterator[Message]) -> list[Message]:
    """Everything a follower yields, until it ends by itself."""
    async with asyncio.timeout(HANG_GUARD):
        return [record async for record in records]


def _grows_to(records: list[Message], message_id: str, final: str, status: str) -> None:
    """One message whose text only grew, each record new, the last one final."""
    assert records, "a follower yields at least the final record"
    assert {r.message_id for r in records} == {message_id}
    for one, two in itertools.pairwise(records):
        assert two.text.startswith(one.text)
        assert (one.text, one.status) != (two.text, two.status)
    assert [r.status for r in records[:-1]] == ["streaming"] * (len(records) - 1)
    assert (records[-1].text, records[-1].status) == (final, status)


class TestConversation:
    """``store.conversation(scope, thread)``: add, reply, messages, update, delete."""

    async def test_the_ten_line_chat_loop(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "chat-1", flush_every=0)
        asked = await chat.add("user", "What is the capital of France?")
        async with chat.reply() as answer:
            async for chunk in _stream("The capital ", "is ", "Paris."):
                await answer.write(chunk)
        shown = [(m.role, m.text, m.status) for m in await chat.messages(last=20)]
        assert shown == [
            ("user", "What is the capital of France?", "complete"),
            ("assistant", "The capital is Paris.", "complete"),
        ]
        assert (chat.scope_key, chat.thread_id) == (scope, "chat-1")
        stored = await _raw(store, scope, "chat-1")
        assert stored[0] == asked  # add returns the message as stored
        assert stored[1].message_id == answer.message_id
        assert stored[1].run_id == answer.run_id
        (run,) = await _runs(store, scope, "chat-1")
        assert (run.run_id, run.status) == (answer.run_id, "completed")
        thread = await chat.get()
        assert thread is not None
        assert thread.lease is None

    async def test_three_writers_lose_nothing_and_keep_their_order(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()

        async def writer(name: str) -> None:
            chat = store.conversation(scope, "shared")
            for i in range(MESSAGES):
                await chat.add("user", f"{name}-{i}")

        await asyncio.gather(*(writer(f"w{n}") for n in range(WRITERS)))
        texts = [m.text for m in await store.conversation(scope, "shared").messages(last=None)]
        assert sorted(texts) == sorted(f"w{n}-{i}" for n in range(WRITERS) for i in range(MESSAGES))
        for n in range(WRITERS):
            assert [t for t in texts if t.startswith(f"w{n}-")] == [
                f"w{n}-{i}" for i in range(MESSAGES)
            ]
        thread = await store.conversation(scope, "shared").get()
        assert thread is not None
        assert thread.version.revision == WRITERS * MESSAGES

    async def test_a_reply_whose_body_raises_closes_its_run_and_message(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)
        await chat.add("user", "hello")

        async def failing() -> None:
            async with chat.reply() as answer:
                await answer.write("half an ans")
                raise _ModelDown

        with pytest.raises(_ModelDown):
            await failing()
        (run,) = await _runs(store, scope, "t")
        assert run.status == "failed"
        assert run.error is not None
        assert "_ModelDown" in run.error.message
        message = (await _raw(store, scope, "t"))[-1]
        assert (message.status, message.text) == ("error", "half an ans")
        thread = await chat.get()
        assert thread is not None
        assert thread.lease is None
        async with chat.reply() as again:  # the conversation is free for the next reply
            await again.write("fine")
        assert [m.text for m in await chat.messages()] == ["hello", "half an ans", "fine"]

    async def test_a_cancelled_reply_is_cancelled_not_left_running(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t")
        started = asyncio.Event()

        async def body() -> None:
            async with chat.reply() as answer:
                await answer.write("so far")
                started.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(body())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        (run,) = await _runs(store, scope, "t")
        assert run.status == "cancelled"
        (message,) = await _raw(store, scope, "t")
        assert (message.status, message.text) == ("incomplete", "so far")

    async def test_updates_keep_what_they_do_not_name(self, store: ThreadStore) -> None:
        chat = store.conversation(new_scope(), "t")
        await chat.add("user", "hi")
        await chat.update(title="Trip to Oslo", metadata={"pinned": True})
        retitled = await chat.update(title="Oslo in May")
        assert (retitled.title, retitled.metadata) == ("Oslo in May", {"pinned": True})
        unpinned = await chat.update(metadata={"pinned": False})
        assert (unpinned.title, unpinned.metadata) == ("Oslo in May", {"pinned": False})
        await chat.add("user", "more")
        thread = await chat.get()
        assert thread is not None
        assert (thread.title, thread.metadata) == ("Oslo in May", {"pinned": False})

    async def test_a_message_added_during_a_reply_joins_its_run(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)
        other = store.conversation(scope, "t")
        await chat.add("user", "first")
        async with chat.reply() as answer:
            await answer.write("thinking")
            late = await other.add("user", "one more thing")
            await answer.write(" done")
        assert late.run_id == answer.run_id
        assert late.association.relation == "context"  # type: ignore[union-attr]
        texts = [(m.text, m.status) for m in await chat.messages()]
        assert texts == [
            ("first", "complete"),
            ("thinking done", "complete"),
            ("one more thing", "complete"),
        ]

    async def test_one_reply_at_a_time(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t")
        other = store.conversation(scope, "t")
        async with chat.reply() as answer:
            with pytest.raises(ConversationConflictError, match="one reply at a time"):
                async with other.reply():
                    pass
            await answer.write("mine")
        assert [m.text for m in await chat.messages()] == ["mine"]

    async def test_a_dead_reply_is_taken_over_when_its_lease_expires(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        dead = store.conversation(scope, "t", lease_ttl=timedelta(seconds=30))
        reply = dead.reply()
        await reply.__aenter__()  # the process dies inside the block
        await reply.write("lost")
        await reply.flush()
        successor = store.conversation(scope, "t")
        with pytest.raises(ConversationConflictError, match="one reply at a time"):
            async with successor.reply():
                pass
        clock.advance(timedelta(seconds=31))
        async with successor.reply() as answer:
            await answer.write("recovered")
        runs = {run.run_id: run for run in await _runs(store, scope, "t")}
        assert runs[reply.run_id].status == "failed"
        assert runs[answer.run_id].status == "completed"
        shown = [(m.text, m.status) for m in await successor.messages()]
        assert shown == [("lost", "incomplete"), ("recovered", "complete")]
        with pytest.raises(ConversationConflictError, match="closed by another writer"):
            await reply.__aexit__(None, None, None)

    async def test_a_reply_whose_thread_was_deleted_raises(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)

        async def deleted_meanwhile() -> None:
            async with chat.reply() as answer:
                await answer.write("a")
                assert await store.conversation(scope, "t").delete()
                await answer.write("b")

        with pytest.raises(ConversationConflictError, match="deleted"):
            await deleted_meanwhile()
        assert await chat.get() is None

    async def test_messages_last_pages_past_one_hundred(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t")
        changes = {"messages": [b.insert(b.message(f"m{i:03}", f"{i}")) for i in range(130)]}
        await store.commit_thread(b.create(scope, "t", changes))
        assert [m.text for m in await chat.messages(last=120)] == [str(i) for i in range(10, 130)]
        assert len(await chat.messages(last=None)) == 130
        assert await chat.messages(last=0) == []
        assert await store.conversation(scope, "missing").messages() == []

    async def test_delete_removes_the_thread(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t")
        await chat.add("user", "hi")
        assert await chat.delete() is True
        assert await chat.get() is None
        assert await chat.delete() is False
        await chat.add("user", "again")  # a new incarnation
        assert [m.text for m in await chat.messages()] == ["again"]

    async def test_a_late_follower_sees_the_text_so_far_grow_to_the_final_text(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)
        await chat.add("user", "tell me a story")
        async with chat.reply() as answer:
            await answer.write("Once ")
            records = store.conversation(scope, "t").follow(interval=INTERVAL)
            first = await anext(records)  # joins while the reply streams
            assert (first.text, first.status) == ("Once ", "streaming")
            following = asyncio.create_task(_followed(records))
            for chunk in ("upon ", "a ", "time."):
                await answer.write(chunk)
                await asyncio.sleep(0)
        _grows_to([first, *await following], answer.message_id, "Once upon a time.", "complete")

    async def test_a_follower_that_starts_first_ends_with_the_next_replys_final_text(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        missing = store.conversation(scope, "new").follow(interval=INTERVAL)
        waiting = asyncio.create_task(_followed(missing))  # the thread does not exist yet
        chat = store.conversation(scope, "new", flush_every=0)
        await chat.add("user", "hello")
        async with chat.reply() as answer:
            for chunk in ("Hi", " there", "!"):
                await answer.write(chunk)
                await asyncio.sleep(0)
        _grows_to(await waiting, answer.message_id, "Hi there!", "complete")
        # A thread whose newest run is finished: its reply's final record, once.
        done = await _followed(chat.follow(interval=INTERVAL))
        assert [(m.message_id, m.text, m.status) for m in done] == [
            (answer.message_id, "Hi there!", "complete")
        ]

    async def test_a_follower_of_a_failed_or_cancelled_reply_ends_with_its_record(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)
        await chat.add("user", "hello")
        following: asyncio.Task[list[Message]] | None = None

        async def failing() -> None:
            nonlocal following
            async with chat.reply() as answer:
                await answer.write("half an ans")
                follower = store.conversation(scope, "t").follow(interval=INTERVAL)
                following = asyncio.create_task(_followed(follower))
                await asyncio.sleep(INTERVAL)
                raise _ModelDown

        with pytest.raises(_ModelDown):
            await failing()
        assert following is not None
        failed = await following
        assert (failed[-1].text, failed[-1].status) == ("half an ans", "error")
        started = asyncio.Event()

        async def body() -> None:
            async with chat.reply() as answer:
                await answer.write("so far")
                started.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(body())
        await started.wait()
        follower = asyncio.create_task(_followed(chat.follow(interval=INTERVAL)))
        await asyncio.sleep(INTERVAL)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled = await follower
        assert (cancelled[-1].text, cancelled[-1].status) == ("so far", "incomplete")

    async def test_newer_than_waits_for_the_next_reply(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)
        async with chat.reply() as shown:
            await shown.write("the answer already on screen")
        waiting = asyncio.create_task(
            _followed(chat.follow(newer_than=shown.message_id, interval=INTERVAL))
        )
        await asyncio.sleep(INTERVAL)
        assert not waiting.done()  # the newest reply is the one named: it waits
        async with chat.reply() as answer:
            await answer.write("next")
        _grows_to(await waiting, answer.message_id, "next", "complete")
        with pytest.raises(ThreadStoreInvariantError, match="not both"):
            chat.follow(shown.message_id, newer_than=shown.message_id)

    async def test_a_message_is_followed_by_its_id(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)
        asked = await chat.add("user", "hello")
        async with chat.reply() as first:
            await first.write("one")
        async with chat.reply() as second:
            await second.write("two")
        by_id = await _followed(chat.follow(first.message_id, interval=INTERVAL))
        assert [(m.message_id, m.text, m.status) for m in by_id] == [
            (first.message_id, "one", "complete")
        ]
        standalone = await _followed(chat.follow(asked.message_id, interval=INTERVAL))
        assert [m.text for m in standalone] == ["hello"]
        with pytest.raises(ThreadStoreInvariantError, match="does not name a message"):
            await _followed(chat.follow("no-such-message", interval=INTERVAL))
        missing = store.conversation(scope, "no-such-thread")
        with pytest.raises(ThreadStoreInvariantError, match="does not name a message"):
            await _followed(missing.follow(first.message_id, interval=INTERVAL))
        with pytest.raises(ThreadStoreInvariantError, match="interval"):
            chat.follow(interval=0)  # refused at the call, like watch()

    async def test_a_follower_of_a_deleted_thread_raises(self, store: ThreadStore) -> None:
        scope = new_scope()
        chat = store.conversation(scope, "t", flush_every=0)

        async def deleted_meanwhile() -> None:
            async with chat.reply() as answer:
                await answer.write("a")
                records = store.conversation(scope, "t").follow(interval=INTERVAL)
                assert (await anext(records)).text == "a"
                assert await store.conversation(scope, "t").delete()
                async with asyncio.timeout(HANG_GUARD):
                    with pytest.raises(ConversationConflictError, match="deleted"):
                        await anext(records)

        with pytest.raises(ConversationConflictError, match="deleted"):
            await deleted_meanwhile()  # the reply's own close finds the thread gone too
