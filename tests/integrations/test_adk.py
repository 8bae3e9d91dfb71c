"""PaiSessionService: ADK's BaseSessionService contract, and ADK's Runner on it.

ADK publishes no conformance package for session services; the contract cases
follow its documentation of ``BaseSessionService`` and the behaviour of its
own ``DatabaseSessionService``: create (given and generated ids, duplicates),
get with ``GetSessionConfig``, list (per user and per app, least recently
updated first, no events), delete, ``append_event`` with state deltas at app,
user and session scope (``temp:`` never stored), and stale sessions.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import pytest

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools.tool_context import ToolContext
from google.genai import types

import pai_storage
from pai_storage import InvalidInputError
from pai_storage.integrations.adk import EVENT_PART, PaiSessionService

from .conftest import Target

APP = "travel-app"


def _event(author: str, text: str, delta: dict[str, Any] | None = None, **extra: Any) -> Event:
    return Event(
        author=author,
        invocation_id="inv-1",
        content=types.Content(
            role="user" if author == "user" else "model", parts=[types.Part(text=text)]
        ),
        actions=EventActions(state_delta=delta or {}),
        **extra,
    )


@pytest.fixture
def service(stores: pai_storage.Stores) -> PaiSessionService:
    return PaiSessionService(stores)


async def test_create_and_get(service: PaiSessionService) -> None:
    created = await service.create_session(
        app_name=APP,
        user_id="u1",
        session_id="s1",
        state={"city": "Paris", "app:theme": "dark", "user:lang": "fr", "temp:scratch": 1},
    )
    assert (created.id, created.app_name, created.user_id) == ("s1", APP, "u1")
    assert created.state == {"city": "Paris", "app:theme": "dark", "user:lang": "fr"}
    assert created.events == []
    got = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert got is not None
    assert got.state == created.state
    assert got.last_update_time == created.last_update_time
    assert await service.get_session(app_name=APP, user_id="u2", session_id="s1") is None
    assert await service.get_session(app_name="other", user_id="u1", session_id="s1") is None
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"lang": "fr"}
    assert await service.get_user_state(app_name=APP, user_id="nobody") == {}


async def test_generated_ids_and_duplicates(service: PaiSessionService) -> None:
    one = await service.create_session(app_name=APP, user_id="u1")
    two = await service.create_session(app_name=APP, user_id="u1")
    assert one.id
    assert two.id != one.id
    with pytest.raises(AlreadyExistsError, match="already exists"):
        await service.create_session(app_name=APP, user_id="u1", session_id=one.id)
    # the same session id for another user is another session
    other = await service.create_session(app_name=APP, user_id="u2", session_id=one.id)
    assert other.user_id == "u2"


async def test_append_event_state_scopes(service: PaiSessionService) -> None:
    s1 = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    s2 = await service.create_session(app_name=APP, user_id="u1", session_id="s2")
    other_user = await service.create_session(app_name=APP, user_id="u2", session_id="s3")
    event = _event(
        "agent",
        "hi",
        {"step": 1, "app:version": "v2", "user:name": "Ada", "temp:draft": "x"},
    )
    returned = await service.append_event(s1, event)
    assert returned is event
    assert s1.events == [event]
    assert s1.state == {"step": 1, "app:version": "v2", "user:name": "Ada", "temp:draft": "x"}
    assert event.actions.state_delta == {"step": 1, "app:version": "v2", "user:name": "Ada"}

    stored = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert stored is not None
    assert stored.state == {"step": 1, "app:version": "v2", "user:name": "Ada"}  # no temp:
    assert [e.id for e in stored.events] == [event.id]
    assert stored.events[0].content == event.content
    assert stored.events[0].actions.state_delta == event.actions.state_delta
    # app state reaches every session of the app, user state every session of the user
    sibling = await service.get_session(app_name=APP, user_id="u1", session_id=s2.id)
    assert sibling is not None
    assert sibling.state == {"app:version": "v2", "user:name": "Ada"}
    stranger = await service.get_session(app_name=APP, user_id="u2", session_id=other_user.id)
    assert stranger is not None
    assert stranger.state == {"app:version": "v2"}


async def test_partial_events_are_not_stored(service: PaiSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await service.append_event(session, _event("agent", "chunk", {"k": 1}, partial=True))
    stored = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert stored is not None
    assert stored.events == []
    assert stored.state == {}


async def test_get_session_config(service: PaiSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    events = [
        _event("user" if i % 2 else "agent", f"e{i}", timestamp=1000.0 + i) for i in range(105)
    ]
    for event in events:
        await service.append_event(session, event)
    ids = [e.id for e in events]

    def got_ids(session: Any) -> list[str]:
        assert session is not None
        return [e.id for e in session.events]

    everything = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert got_ids(everything) == ids
    recent = GetSessionConfig(num_recent_events=3)
    assert (
        got_ids(
            await service.get_session(app_name=APP, user_id="u1", session_id="s1", config=recent)
        )
        == ids[-3:]
    )
    many = GetSessionConfig(num_recent_events=102)  # more than a page
    assert (
        got_ids(await service.get_session(app_name=APP, user_id="u1", session_id="s1", config=many))
        == ids[-102:]
    )
    none = GetSessionConfig(num_recent_events=0)
    assert (
        got_ids(await service.get_session(app_name=APP, user_id="u1", session_id="s1", config=none))
        == []
    )
    after = GetSessionConfig(after_timestamp=1090.0)
    assert (
        got_ids(
            await service.get_session(app_name=APP, user_id="u1", session_id="s1", config=after)
        )
        == ids[90:]
    )
    both = GetSessionConfig(after_timestamp=1100.0, num_recent_events=5)
    assert (
        got_ids(await service.get_session(app_name=APP, user_id="u1", session_id="s1", config=both))
        == ids[-5:]
    )


async def test_list_sessions(service: PaiSessionService) -> None:
    a = await service.create_session(app_name=APP, user_id="u1", session_id="a", state={"n": 1})
    await service.create_session(app_name=APP, user_id="u2", session_id="b")
    await service.create_session(app_name=APP, user_id="u1", session_id="c")
    await service.create_session(app_name="another-app", user_id="u1", session_id="d")
    await asyncio.sleep(0.01)
    await service.append_event(a, _event("agent", "now a is the most recent", {"user:x": 1}))

    mine = await service.list_sessions(app_name=APP, user_id="u1")
    assert [s.id for s in mine.sessions] == ["c", "a"]  # least recently updated first
    assert all(s.events == [] for s in mine.sessions)
    assert mine.sessions[1].state == {"n": 1, "user:x": 1}
    everyone = await service.list_sessions(app_name=APP)
    assert {(s.user_id, s.id) for s in everyone.sessions} == {("u1", "a"), ("u2", "b"), ("u1", "c")}
    assert everyone.sessions[-1].id == "a"
    assert (await service.list_sessions(app_name="nothing-here")).sessions == []


async def test_delete_session(service: PaiSessionService) -> None:
    session = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"user:keep": True}
    )
    await service.append_event(session, _event("agent", "x"))
    await service.delete_session(app_name=APP, user_id="u1", session_id="s1")
    assert await service.get_session(app_name=APP, user_id="u1", session_id="s1") is None
    await service.delete_session(app_name=APP, user_id="u1", session_id="s1")  # idempotent
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"keep": True}
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, _event("agent", "after delete"))


async def test_stale_session_is_refused(service: PaiSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    first = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    second = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert first is not None
    assert second is not None
    await service.append_event(first, _event("agent", "one"))
    await asyncio.sleep(0.005)  # the stored update time moves past second's
    with pytest.raises(StaleSessionError, match="reload the session"):
        await service.append_event(second, _event("agent", "two"))
    await service.append_event(first, _event("agent", "three"))  # first is current
    stored = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert stored is not None
    assert [e.content.parts[0].text for e in stored.events] == ["one", "three"]  # type: ignore[union-attr, index]


async def test_stale_session_is_refused_whatever_the_clocks(service: PaiSessionService) -> None:
    # The check must not lean on update times: two writers within one clock
    # tick, or on hosts whose clocks differ, still see each other.
    await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    first = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    second = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert first is not None
    assert second is not None
    second.last_update_time += 3600  # its host's clock is an hour ahead
    await service.append_event(first, _event("agent", "one"))
    with pytest.raises(StaleSessionError, match="reload the session"):
        await service.append_event(second, _event("agent", "two"))
    await service.append_event(first, _event("agent", "three"))  # first is current
    created = await service.create_session(app_name=APP, user_id="u1", session_id="s2")
    again = await service.get_session(app_name=APP, user_id="u1", session_id="s2")
    assert again is not None
    again.last_update_time += 3600
    await service.append_event(again, _event("agent", "one"))
    with pytest.raises(StaleSessionError, match="reload the session"):
        await service.append_event(created, _event("agent", "two"))
    stored = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert stored is not None
    assert [e.content.parts[0].text for e in stored.events] == ["one", "three"]  # type: ignore[union-attr, index]


async def test_concurrent_appends_through_one_session_object(service: PaiSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await asyncio.gather(
        *(service.append_event(session, _event("agent", str(i), {f"k{i}": i})) for i in range(8))
    )
    stored = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert stored is not None
    assert len(stored.events) == len(session.events) == 8
    assert stored.state == {f"k{i}": i for i in range(8)}


async def test_the_service_keeps_nothing_of_sessions_gone(service: PaiSessionService) -> None:
    # The version each session object was read at is kept by object, and the
    # lock of a session's appends only while an append holds it.
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    for i in range(20):
        read = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
        assert read is not None
        await service.append_event(read, _event("agent", str(i)))
    del read
    gc.collect()
    assert [service._version_of(session)] == [v for _, v in service._versions.values()]
    del session
    gc.collect()
    assert not service._versions
    assert not service._locks


async def test_bad_input_is_refused(service: PaiSessionService) -> None:
    with pytest.raises(InvalidInputError, match="user_id"):
        await service.create_session(app_name=APP, user_id="")
    with pytest.raises(InvalidInputError, match="app_name"):
        await service.create_session(app_name="bad\x1fname", user_id="u1")
    with pytest.raises(InvalidInputError, match="JSON"):
        await service.create_session(app_name=APP, user_id="u1", state={"f": object()})
    assert (await service.list_sessions(app_name=APP)).sessions == []


class _Gate:
    """A key-value store whose version-checked writes wait to be let through."""

    def __init__(self, kv: pai_storage.KeyValueStore) -> None:
        self.kv, self.entered, self.release = kv, asyncio.Event(), asyncio.Event()

    async def put_if_version(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return await self.kv.put_if_version(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


def _gated(stores: pai_storage.Stores) -> tuple[PaiSessionService, _Gate]:
    """A service whose key-value writes go through a :class:`_Gate`."""
    gate = _Gate(stores.kv)

    class Gated(PaiSessionService):
        @property
        def kv(self) -> Any:
            return gate

    return Gated(stores), gate


async def test_a_cancelled_append_still_stores_its_whole_delta(
    stores: pai_storage.Stores,
) -> None:
    service, gate = _gated(stores)
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    event = _event("agent", "one", {"k": 1, "user:lang": "fr"})
    appending = asyncio.create_task(service.append_event(session, event))
    await gate.entered.wait()  # the event is committed; the user: delta is being merged
    appending.cancel()
    await asyncio.sleep(0.01)
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await appending
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"lang": "fr"}
    assert session.events == [event]
    assert session.state == {"k": 1, "user:lang": "fr"}
    await service.append_event(session, _event("agent", "two"))  # the session is current
    stored = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert stored is not None
    assert [e.id for e in stored.events] == [e.id for e in session.events]


async def test_an_append_cut_off_by_an_anyio_scope_ends_without_spinning(
    stores: pai_storage.Stores,
) -> None:
    # A web server's request timeout is an anyio cancel scope: it cancels the
    # task again at every step until the task leaves the scope. The append must
    # wait for its write (not busy-loop) and still store it whole.
    service, gate = _gated(stores)
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    event = _event("agent", "one", {"user:lang": "fr"})

    async def release_later() -> None:
        await gate.entered.wait()
        await asyncio.sleep(0.3)
        gate.release.set()

    releasing = asyncio.create_task(release_later())
    started = time.thread_time()
    with anyio.move_on_after(0.05) as scope:
        await service.append_event(session, event)
    assert scope.cancel_called
    spent = time.thread_time() - started
    await releasing
    assert spent < 0.15, f"the wait took {spent:.2f} s of CPU"  # spinning: about 0.3 s
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"lang": "fr"}
    assert session.events == [event]


async def test_a_cancelled_create_still_stores_its_whole_state(
    stores: pai_storage.Stores,
) -> None:
    service, gate = _gated(stores)
    state = {"k": 1, "app:v": 2, "user:lang": "fr"}
    creating = asyncio.create_task(
        service.create_session(app_name=APP, user_id="u1", session_id="s1", state=state)
    )
    await gate.entered.wait()  # the session is committed; the app: state is being merged
    creating.cancel()
    await asyncio.sleep(0.01)
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await creating
    stored = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert stored is not None
    assert stored.state == state


async def test_state_too_big_for_its_item_writes_nothing(target: Target) -> None:
    async with target.connect(max_value_bytes=1000) as stores:
        service = PaiSessionService(stores)
        await service.create_session(
            app_name=APP, user_id="u1", session_id="s0", state={"user:a": "x" * 600}
        )
        with pytest.raises(InvalidInputError, match="over this store's limit"):
            await service.create_session(
                app_name=APP, user_id="u1", session_id="s1", state={"k": 1, "user:b": "y" * 600}
            )
        assert await service.get_session(app_name=APP, user_id="u1", session_id="s1") is None
        session = await service.create_session(app_name=APP, user_id="u1", session_id="s2")
        with pytest.raises(InvalidInputError, match="over this store's limit"):
            await service.append_event(
                session, _event("agent", "hi", {"k": 2, "app:c": "z" * 2000})
            )
        stored = await service.get_session(app_name=APP, user_id="u1", session_id="s2")
        assert stored is not None
        assert stored.events == []
        assert stored.state == {"user:a": "x" * 600}
        assert session.events == []
        await service.append_event(session, _event("agent", "hi", {"k": 2}))  # still current


async def test_opened_from_a_url(target: Target) -> None:
    async with PaiSessionService(target.url, **target.options) as service:
        created = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
        await service.append_event(created, _event("agent", "kept"))
    async with PaiSessionService(target.url, **target.options) as again:
        got = await again.get_session(app_name=APP, user_id="u1", session_id="s1")
        if target.backend != "memory":  # a memory:// URL is a new, empty store
            assert got is not None
            assert len(got.events) == 1


# ---------------------------------------------------------------- Runner


class ScriptedLlm(BaseLlm):
    """Calls the ``remember`` tool for each user message, then answers in text."""

    model: str = "scripted"
    requests: list[LlmRequest] = []

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        last = llm_request.contents[-1]
        part = last.parts[0] if last.parts else None
        if part is not None and part.function_response is not None:
            count = part.function_response.response["count"]  # type: ignore[index]
            text = f"remembered {count}"
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
            return
        said = part.text if part is not None else ""
        call = types.FunctionCall(name="remember", args={"fact": said})
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(function_call=call)])
        )


def remember(fact: str, tool_context: ToolContext) -> dict[str, Any]:
    """Remember a fact for this user."""
    facts = [*tool_context.state.get("user:facts", []), fact]
    tool_context.state["user:facts"] = facts
    tool_context.state["app:calls"] = tool_context.state.get("app:calls", 0) + 1
    tool_context.state["temp:last"] = fact
    return {"count": len(facts)}


async def test_runner_over_turns_reads_history_back(stores: pai_storage.Stores) -> None:
    service = PaiSessionService(stores)
    llm = ScriptedLlm(requests=[])
    agent = LlmAgent(
        name="memo", model=llm, instruction="remember facts", tools=[remember], output_key="answer"
    )
    runner = Runner(app_name=APP, agent=agent, session_service=service)
    await service.create_session(app_name=APP, user_id="u1", session_id="chat")

    answers = []
    for said in ("I like tea", "I live in Oslo"):
        message = types.Content(role="user", parts=[types.Part(text=said)])
        async for event in runner.run_async(user_id="u1", session_id="chat", new_message=message):
            if event.is_final_response() and event.content and event.content.parts:
                answers.append(event.content.parts[0].text)
    assert answers == ["remembered 1", "remembered 2"]
    # the second turn's model call saw the first turn, read back from the service
    texts = [p.text for c in llm.requests[-2].contents for p in c.parts or [] if p.text]
    assert "I like tea" in texts

    # Through the framework.
    session = await service.get_session(app_name=APP, user_id="u1", session_id="chat")
    assert session is not None
    authors = [e.author for e in session.events]
    assert authors == ["user", "memo", "memo", "memo"] * 2
    assert session.state["user:facts"] == ["I like tea", "I live in Oslo"]
    assert session.state["app:calls"] == 2
    assert session.state["answer"] == "remembered 2"
    assert not any(k.startswith("temp:") for k in session.state)

    # Through pai-storage: one thread of the app's scope, one message per event.
    listed = await stores.threads.list_threads({"scopeKey": APP, "limit": 10, "category": "u1"})
    assert [t.thread_id for t in listed.items] == ['["u1", "chat"]']
    read = await stores.threads.read_thread(
        {
            "scopeKey": APP,
            "threadId": '["u1", "chat"]',
            "include": {"messages": {"type": "page", "view": "raw", "page": {"limit": 100}}},
        }
    )
    assert read.messages is not None
    messages = read.messages.items
    assert [m.message_id for m in messages] == [e.id for e in session.events]
    assert [m.role for m in messages] == ["user", "assistant", "assistant", "assistant"] * 2
    assert all(m.parts[0].to_json()["name"] == EVENT_PART for m in messages)
    user_state = await stores.kv.get((APP, "google-adk", "user"), "u1")
    assert user_state is not None
    assert user_state.value == {"facts": ["I like tea", "I live in Oslo"]}
