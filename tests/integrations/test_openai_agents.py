"""PaiSession: the OpenAI Agents SDK's Session contract, and Runner.run on it.

The contract cases follow the SDK's documentation of ``Session`` (and its own
session tests): an empty session, order, ``limit`` (the latest N, oldest
first), ``pop_item``, ``clear_session``, isolation, exact round trips.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Model, ModelResponse, RunConfig, Runner, function_tool
from agents.memory.session_settings import SessionSettings
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import pai_storage
from pai_storage import InvalidInputError, SerializationError
from pai_storage.integrations.openai_agents import ITEM_PART, PaiSession

from .conftest import Target

SCOPE = "tenant-1"


def _text(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


async def test_empty_session(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE)
    assert await session.get_items() == []
    assert await session.get_items(limit=3) == []
    assert await session.pop_item() is None
    await session.clear_session()  # nothing to clear is not an error


async def test_items_round_trip_exactly_in_order(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE)
    items: list[Any] = [
        _text("user", "hello"),
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "add",
            "arguments": '{"a": 1}',
            "id": "fc_1",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
        {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "é 🎉", "annotations": [], "n": 1.0}],
        },
    ]
    await session.add_items(items[:2])
    await session.add_items(items[2:])
    got = await session.get_items()
    assert got == items
    assert json.dumps(got) == json.dumps(items)  # key order and 1.0 kept
    assert await session.add_items([]) is None
    assert await session.get_items() == items


async def test_limit_returns_the_latest_in_chronological_order(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE)
    items = [_text("user", f"m{i}") for i in range(250)]
    await session.add_items(items)
    assert await session.get_items(limit=1) == items[-1:]
    assert await session.get_items(limit=3) == items[-3:]
    assert await session.get_items(limit=150) == items[-150:]  # more than one page
    assert await session.get_items(limit=1000) == items
    assert await session.get_items() == items
    assert await session.get_items(limit=0) == []


async def test_session_settings_limit_is_the_default(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE, session_settings=SessionSettings(limit=2))
    await session.add_items([_text("user", str(i)) for i in range(5)])
    assert await session.get_items() == [_text("user", "3"), _text("user", "4")]
    assert len(await session.get_items(limit=4)) == 4


async def test_pop_item_removes_and_returns_the_latest(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE)
    await session.add_items([_text("user", "a"), _text("assistant", "b")])
    assert await session.pop_item() == _text("assistant", "b")
    assert await session.get_items() == [_text("user", "a")]
    assert await session.pop_item() == _text("user", "a")
    assert await session.pop_item() is None
    await session.add_items([_text("user", "c")])
    assert await session.get_items() == [_text("user", "c")]


async def test_pop_item_leaves_messages_it_did_not_write(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE)
    await session.add_items([_text("user", "a")])
    read = await stores.threads.read_thread({"scopeKey": SCOPE, "threadId": "s1"})
    assert read.thread is not None
    note = {
        "messageId": "note-1",
        "role": "system",
        "parts": [{"type": "text", "text": "written by something else"}],
        "producer": {"kind": "system"},
        "association": {"kind": "standalone"},
        "visibility": {"transcript": True, "context": True},
        "status": "complete",
        "metadata": {},
    }
    done = await stores.threads.commit_thread(
        pai_storage.builders.update(read.thread, {"messages": [pai_storage.builders.insert(note)]})
    )
    assert done.type == "committed"
    assert await session.pop_item() == _text("user", "a")  # the note is skipped, not popped
    assert await session.pop_item() is None
    everything = {"type": "page", "view": "raw", "order": "oldest", "page": {"limit": 10}}
    read = await stores.threads.read_thread(
        pai_storage.builders.read(SCOPE, "s1", messages=everything)
    )
    assert read.messages is not None
    assert [m.message_id for m in read.messages.items] == ["note-1"]


async def test_clear_session_deletes_the_thread(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE)
    await session.add_items([_text("user", "a")])
    await session.clear_session()
    assert await session.get_items() == []
    read = await stores.threads.read_thread({"scopeKey": SCOPE, "threadId": "s1"})
    assert read.thread is None
    await session.add_items([_text("user", "again")])
    assert await session.get_items() == [_text("user", "again")]


async def test_sessions_and_scopes_are_isolated(stores: pai_storage.Stores) -> None:
    one = PaiSession("s1", stores, scope_key=SCOPE)
    two = PaiSession("s2", stores, scope_key=SCOPE)
    other_tenant = PaiSession("s1", stores, scope_key="tenant-2")
    await one.add_items([_text("user", "one")])
    await two.add_items([_text("user", "two")])
    assert await one.get_items() == [_text("user", "one")]
    assert await two.get_items() == [_text("user", "two")]
    assert await other_tenant.get_items() == []
    await two.clear_session()
    assert await one.get_items() == [_text("user", "one")]


async def test_two_handles_on_one_session_lose_nothing(stores: pai_storage.Stores) -> None:
    first = PaiSession("s1", stores, scope_key=SCOPE)
    second = PaiSession("s1", stores, scope_key=SCOPE)
    await first.add_items([_text("user", "a")])
    await second.add_items([_text("user", "b")])  # first's view of the version is stale now
    await first.add_items([_text("user", "c")])
    await asyncio.gather(*(h.add_items([_text("user", "x")]) for h in (first, second)))
    items = await first.get_items()
    assert items[:3] == [_text("user", "a"), _text("user", "b"), _text("user", "c")]
    assert items[3:] == [_text("user", "x")] * 2


async def test_bad_input_is_refused(stores: pai_storage.Stores) -> None:
    session = PaiSession("s1", stores, scope_key=SCOPE)
    with pytest.raises(InvalidInputError, match="must be a dict"):
        await session.add_items(["not an item"])  # type: ignore[list-item]
    with pytest.raises(SerializationError, match="NaN is not JSON"):
        await session.add_items([_text("user", "ok"), {"role": "user", "content": float("nan")}])
    assert await session.get_items() == []  # nothing half-written
    with pytest.raises(InvalidInputError, match="session_id"):
        PaiSession("", stores)


async def test_from_url_opens_and_closes_its_stores(target: Target) -> None:
    async with PaiSession.from_url("s1", url=target.url, scope_key=SCOPE, **target.options) as s:
        await s.add_items([_text("user", "persisted")])
        assert await s.get_items() == [_text("user", "persisted")]


# ---------------------------------------------------------------- Runner.run


class ScriptedModel(Model):
    """Answers with a tool call when the last item is a user message, else with text."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        turn = len(self.inputs)
        last = items[-1]
        if last.get("role") == "user":
            call = ResponseFunctionToolCall(
                id=f"fc_{turn}",
                call_id=f"call_{turn}",
                type="function_call",
                name="add",
                arguments=json.dumps({"a": turn, "b": 10}),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        answer = ResponseOutputMessage(
            id=f"msg_{turn}",
            type="message",
            role="assistant",
            status="completed",
            content=[
                ResponseOutputText(type="output_text", text=f"sum={last['output']}", annotations=[])
            ],
        )
        return ModelResponse(output=[answer], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_runner_over_turns_reads_history_back(stores: pai_storage.Stores) -> None:
    model = ScriptedModel()
    agent = Agent(name="calc", instructions="add numbers", model=model, tools=[add])
    session = PaiSession("chat-1", stores, scope_key=SCOPE)
    config = RunConfig(tracing_disabled=True)

    first = await Runner.run(agent, "first", session=session, run_config=config)
    assert first.final_output == "sum=11"
    second = await Runner.run(agent, "second", session=session, run_config=config)
    assert second.final_output == "sum=13"

    # The second turn's first model call saw the first turn, read from the session.
    assert [i.get("content") for i in model.inputs[2] if i.get("role") == "user"] == [
        "first",
        "second",
    ]

    # Through the framework: a fresh handle reads the whole conversation.
    history = await PaiSession("chat-1", stores, scope_key=SCOPE).get_items()
    kinds = [item.get("type", "message") for item in history]
    assert kinds == ["message", "function_call", "function_call_output", "message"] * 2
    assert history[0] == {"content": "first", "role": "user"}
    assert history[2]["output"] == "11"

    # Through pai-storage: one thread, one message per item, roles mapped.
    read = await stores.threads.read_thread(
        {
            "scopeKey": SCOPE,
            "threadId": "chat-1",
            "include": {"messages": {"type": "page", "view": "raw", "page": {"limit": 100}}},
        }
    )
    assert read.thread is not None
    assert read.thread.agent == "openai-agents"
    assert read.messages is not None
    messages = read.messages.items
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"] * 2
    assert [m.parts[0].to_json()["data"] for m in messages] == history
    assert all(m.parts[0].to_json()["name"] == ITEM_PART for m in messages)
    listed = await stores.threads.list_threads({"scopeKey": SCOPE, "limit": 10})
    assert [t.thread_id for t in listed.items] == ["chat-1"]
