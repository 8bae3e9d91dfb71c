"""The conversation handle's own rules: flushing, fields, bad inputs, giving up.

Its behaviour on every backend is the conformance topic ``TestConversation``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import pai_storage.conversation as conversation_module
from pai_storage import ConflictResult, ConversationConflictError, ThreadStore, open_store
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError


async def _revision(store: ThreadStore) -> int:
    thread = await store.conversation("s", "t").get()
    assert thread is not None
    return thread.version.revision


async def test_a_reply_commits_at_most_every_flush_every() -> None:
    async with open_store("memory://") as store:
        chat = store.conversation("s", "t", flush_every=3600)
        async with chat.reply() as answer:
            for i in range(50):
                await answer.write(f"{i} ")
            assert await _revision(store) == 1  # opened; nothing flushed yet
            await answer.flush()
            assert await _revision(store) == 2
            await answer.flush()  # nothing new: no commit
            assert await _revision(store) == 2
        assert await _revision(store) == 3  # closed with the whole text
        (message,) = await chat.messages()
        assert message.text == "".join(f"{i} " for i in range(50))


async def test_flush_every_zero_commits_every_chunk() -> None:
    async with open_store("memory://") as store:
        chat = store.conversation("s", "t", flush_every=0)
        async with chat.reply() as answer:
            for chunk in "abc":
                await answer.write(chunk)
                (streaming,) = await chat.messages()
                assert (streaming.status, streaming.text) == ("streaming", answer.text)
        assert await _revision(store) == 1 + 3 + 1


async def test_add_takes_message_fields_and_messages_shows_the_transcript() -> None:
    async with open_store("memory://") as store:
        chat = store.conversation("s", "t")
        hidden = {"transcript": False, "context": True}
        note = await chat.add("system", "be brief", visibility=hidden, messageId="sys-1")
        said = await chat.add("user", "hi", metadata={"lang": "en"})
        assert (note.message_id, note.producer.kind) == ("sys-1", "system")
        assert said.metadata == {"lang": "en"}
        assert [m.message_id for m in await chat.messages()] == [said.message_id]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda chat: chat.add("robot", "hi"), "role is one of"),
        (lambda chat: chat.add("user", 42), "text is a str"),
        (lambda chat: chat.messages(last=-1), "last is a count"),
        (lambda chat: chat.add("user", "hi", status="streaming"), "complete message"),
    ],
)
async def test_bad_inputs_are_refused_before_anything_is_written(call: Any, words: str) -> None:
    async with open_store("memory://") as store:
        chat = store.conversation("s", "t")
        with pytest.raises(ThreadStoreInvariantError, match=words):
            await call(chat)
        assert await chat.get() is None


async def test_bad_handle_options_and_chunks_are_refused() -> None:
    async with open_store("memory://") as store:
        with pytest.raises(ThreadStoreInvariantError, match="scope_key"):
            store.conversation("", "t")
        with pytest.raises(ThreadStoreInvariantError, match="flush_every"):
            store.conversation("s", "t", flush_every=-1)
        with pytest.raises(ThreadStoreInvariantError, match="lease_ttl"):
            store.conversation("s", "t", lease_ttl=timedelta(0))
        chat = store.conversation("s", "t")
        reply = chat.reply()
        with pytest.raises(ThreadStoreInvariantError, match="inside the reply"):
            await reply.write("early")
        async with chat.reply() as answer:
            with pytest.raises(ThreadStoreInvariantError, match="chunk is a str"):
                await answer.write(b"bytes")  # type: ignore[arg-type]


async def test_a_run_opened_through_the_full_contract_is_respected() -> None:
    async with open_store("memory://") as store:
        changes = {
            "messages": [b.insert(b.message("m1", "hi", run_id="r1"))],
            "runs": [b.insert(b.run("r1", inputs=["m1"]))],
        }
        await store.commit_thread(b.create("s", "t", changes, title="kept"))
        chat = store.conversation("s", "t")
        late = await chat.add("user", "and also")  # joins the open run as context
        assert (late.run_id, late.association.relation) == ("r1", "context")  # type: ignore[union-attr]
        with pytest.raises(ConversationConflictError, match="run r1 is open"):
            async with chat.reply():
                pass
        thread = await chat.get()
        assert thread is not None
        assert thread.title == "kept"


async def test_endless_conflicts_end_in_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store("memory://") as store:
        chat = store.conversation("s", "t")
        await chat.add("user", "hi")

        async def always_conflicts(request: Any) -> ConflictResult:
            return ConflictResult(type="conflict", current_version=None)

        monkeypatch.setattr(conversation_module, "MAX_ATTEMPTS", 3)
        monkeypatch.setattr(store, "commit_thread", always_conflicts)
        with pytest.raises(ConversationConflictError, match="3 commits"):
            await chat.add("user", "never lands")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"flush_every": "0.25"}, "flush_every"),
        ({"flush_every": True}, "flush_every"),
        ({"lease_ttl": 60}, "lease_ttl"),
    ],
)
async def test_bad_handle_options_of_another_type_are_refused(
    options: dict[str, Any], words: str
) -> None:
    async with open_store("memory://") as store:
        with pytest.raises(ThreadStoreInvariantError, match=words):
            store.conversation("s", "t", **options)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda chat: chat.add("user", "hi", messageId=""), "messageId"),
        (lambda chat: chat.messages(last=True), "last is a count"),
    ],
)
async def test_bad_values_are_not_taken_for_defaults(call: Any, words: str) -> None:
    async with open_store("memory://") as store:
        chat = store.conversation("s", "t")
        with pytest.raises(ThreadStoreInvariantError, match=words):
            await call(chat)
        assert await chat.get() is None


async def test_a_reply_s_metadata_must_be_a_mapping() -> None:
    async with open_store("memory://") as store:
        with pytest.raises(ThreadStoreInvariantError, match="metadata"):
            store.conversation("s", "t").reply(metadata="x")  # type: ignore[arg-type]
