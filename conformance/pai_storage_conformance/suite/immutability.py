"""Records handed out are deeply immutable: changing one raises ``TypeError``.

Every container of a record a store returns (a thread root's metadata, a
message's parts, a run's input ids, a queued item's input, at any depth) is
read-only, and so are the pages around them; a store may therefore share what
it reads between readers. Whatever a caller tries, later reads give the stored
JSON form, with or without the codec's cache.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import pytest

from pai_storage import (
    CommittedResult,
    DataPart,
    TextPart,
    ThreadReadResult,
    ThreadStore,
    ToolCallPart,
    codec,
)
from pai_storage import builders as b

from ._support import assert_same_values, new_scope

_EVERY_PART: list[dict[str, Any]] = [
    {"type": "text", "text": "hi", "providerMetadata": {"p": [1]}},
    {
        "type": "tool-call",
        "toolCallId": "c1",
        "toolName": "search",
        "input": {"q": ["a"]},
        "state": "output-available",
        "output": {"hits": [{"id": 1}]},
        "callProviderMetadata": {"c": {}},
    },
    {
        "type": "tool-call",
        "toolCallId": "c2",
        "toolName": "search",
        "input": "text input",
        "state": "input-available",
    },
    {"type": "data", "name": "d", "data": [{"x": 1}]},
]
"""One part of every kind, a tool call with and one without its output."""


async def _thread_of_every_kind(store: ThreadStore, scope: str) -> dict[str, Any]:
    """Create thread ``t1`` holding a message with every kind of part, runs and a
    queued item; the read of all of them by ids."""
    message = b.message("m1", run_id="r1", metadata={"k": {"n": [1]}})
    message["parts"] = copy.deepcopy(_EVERY_PART)
    run = b.run("r1", "completed", inputs=["m1"], metadata={"m": [1]})
    queued = b.run("r2", "queued", queue_item_id="q1")
    created = await store.commit_thread(
        b.create(
            scope,
            "t1",
            {
                "messages": [b.insert(message)],
                "runs": [b.insert(run), b.insert(queued)],
                "queuedItems": [b.insert(b.queued_item("q1", "r2", {"input": [1]}))],
            },
            metadata={"a": {"b": [1]}},
            privateMetadata={"p": [1]},
        )
    )
    assert isinstance(created, CommittedResult)
    return b.read(
        scope,
        "t1",
        messages={"type": "ids", "messageIds": ["m1"]},
        runs={"type": "ids", "runIds": ["r1", "r2"]},
        queuedItems={"type": "ids", "queueItemIds": ["q1"]},
    )


def _every_change(read: ThreadReadResult) -> list[Callable[[], object]]:
    """One attempt to change each kind of container a read's records hold."""
    thread, messages, runs, queued = read.thread, read.messages, read.runs, read.queued_items
    assert thread is not None
    assert messages is not None
    assert runs is not None
    assert queued is not None
    message = messages.items[0]
    text, call, bare, data = message.parts
    assert isinstance(text, TextPart)
    assert isinstance(call, ToolCallPart)
    assert isinstance(bare, ToolCallPart)
    assert isinstance(data, DataPart)
    assert text.provider_metadata is not None
    assert call.call_provider_metadata is not None
    run = runs.items[0]
    item = queued.items[0]
    return [
        lambda: thread.metadata.__setitem__("new", 1),
        lambda: thread.metadata["a"]["b"].append("changed"),
        lambda: thread.metadata["a"].pop("b"),
        lambda: thread.private_metadata.clear(),
        lambda: thread.private_metadata["p"].extend([2]),
        lambda: message.metadata["k"]["n"].append("changed"),
        lambda: message.metadata.update({"k": 1}),
        lambda: message.parts.append(text),
        lambda: message.parts.reverse(),
        lambda: message.parts.__setitem__(0, text),
        lambda: text.provider_metadata["p"].__setitem__(0, 2),  # type: ignore[index]
        lambda: call.input["q"].append("changed"),
        lambda: call.output["hits"][0].__setitem__("id", "changed"),
        lambda: call.call_provider_metadata["c"].setdefault("new", 1),  # type: ignore[index]
        lambda: data.data.append("changed"),
        lambda: data.data[0].popitem(),
        lambda: run.input_message_ids.append("changed"),
        lambda: run.metadata["m"].sort(),
        lambda: run.private_metadata.__delitem__("x"),
        lambda: item.input["input"].insert(0, 2),
        lambda: item.metadata.__ior__({"new": 1}),
        lambda: messages.items.clear(),
        lambda: runs.items.pop(),
    ]


class TestImmutableRecords:
    """Records handed out cannot be changed, at any depth (``TypeError``)."""

    async def test_every_container_of_a_read_refuses_changes(self, store: ThreadStore) -> None:
        scope = new_scope()
        request = await _thread_of_every_kind(store, scope)
        for _ in range(3):  # read again: a store may share what it read before
            read = await store.read_thread(request)
            for attempt in _every_change(read):
                with pytest.raises(TypeError):
                    attempt()

    async def test_committed_and_listed_records_refuse_changes(self, store: ThreadStore) -> None:
        scope = new_scope()
        result = await store.commit_thread(
            b.create(
                scope,
                "t1",
                {"messages": [b.insert(b.message("m1", metadata={"k": [1]}))]},
                metadata={"a": {"b": [1]}},
            )
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        committed = result.thread
        with pytest.raises(TypeError):
            committed.metadata["a"]["b"].append("committed")
        with pytest.raises(TypeError):
            committed.private_metadata["new"] = 1
        listed = await store.list_threads({"scopeKey": scope, "limit": 5})
        with pytest.raises(TypeError):
            listed.items[0].metadata["a"] = "listed"
        with pytest.raises(TypeError):
            listed.items.clear()
        assert listed.items[0].metadata == {"a": {"b": [1]}}

    async def test_reads_after_attempted_changes_give_the_stored_json_form(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        request = await _thread_of_every_kind(store, scope)

        def json_forms(read: ThreadReadResult) -> tuple[Any, ...]:
            assert read.thread is not None
            pages = (read.messages, read.runs, read.queued_items)
            return (
                read.thread.to_json(),
                *([item.to_json() for item in page.items] for page in pages if page is not None),
            )

        expected = json_forms(await store.read_thread(request))
        assert expected[1][0]["parts"] == _EVERY_PART  # no output: none read
        for _ in range(3):
            read = await store.read_thread(request)
            assert json_forms(read) == expected
            for attempt in _every_change(read):
                with contextlib.suppress(TypeError):
                    attempt()
            assert read.messages is not None
            bare = read.messages.items[0].parts[2]
            bare.model_fields_set.add("output")  # a copy: would write "output": null
            assert json_forms(read) == expected
        assert json_forms(await store.read_thread(request)) == expected

    async def test_a_changed_record_is_a_new_record(self, store: ThreadStore) -> None:
        # What the docs show: build a new value, and a new record around it.
        scope = new_scope()
        request = await _thread_of_every_kind(store, scope)
        read = await store.read_thread(request)
        assert read.thread is not None
        metadata = {**read.thread.metadata, "pinned": True}
        changed = read.thread.model_copy(update={"metadata": metadata})
        assert changed.metadata == {"a": {"b": [1]}, "pinned": True}
        assert read.thread.metadata == {"a": {"b": [1]}}
        plain = read.thread.metadata.copy()
        plain["new"] = 1  # copy() gives a plain, changeable dict
        assert "new" not in read.thread.metadata

    async def test_records_read_back_are_the_same_with_or_without_the_cache(
        self, store: ThreadStore
    ) -> None:
        # The codec shares records decoded before, by their stored form: what it
        # gives from them is what decoding that form gives, value for value.
        scope = new_scope()
        by_ids = await _thread_of_every_kind(store, scope)
        first = await store.read_thread(by_ids)
        assert first.thread is not None
        assert first.messages is not None
        later = b.message("m2", metadata={"n": None}, run_id="r1", relation="output")
        later["parts"] = [{"type": "text", "text": "t", "providerMetadata": None}]
        later["producer"] = {"kind": "agent", "id": None}
        replaced = {**first.messages.items[0].to_draft().to_json(), "metadata": {"replaced": [1.5]}}
        updated = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                first.thread.version,
                {"messages": [b.replace(replaced), b.insert(later)]},
                root=b.root(metadata={"root": [1.0, {"x": None}]}, category=None),
            )
        )
        assert isinstance(updated, CommittedResult)
        newest = b.read(
            scope,
            "t1",
            messages={"type": "page", "view": "raw", "order": "newest", "page": {"limit": 1}},
        )
        listing = {"scopeKey": scope, "limit": 5}

        async def read_all() -> tuple[Any, ...]:
            read, page = await store.read_thread(by_ids), await store.read_thread(newest)
            listed = await store.list_threads(listing)
            return (read.thread, read.messages, read.runs, read.queued_items, page.messages, listed)

        cached = [await read_all() for _ in range(3)]  # written, then read again
        entries, size = codec.cache.limits
        codec.cache.resize(entries=0, size=0)
        try:
            decoded = await read_all()
        finally:
            codec.cache.resize(entries=entries, size=size)
        assert decoded[1] is not None
        assert decoded[1].items[0].metadata == {"replaced": [1.5]}
        assert decoded[4] is not None
        assert decoded[4].items[0].producer.id is None
        for values in cached:
            assert_same_values(values, decoded)
