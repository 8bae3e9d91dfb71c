"""A small LangGraph app for the end-to-end tests: plan, then (after a human's
approval: an interrupt before ``act``) act. The model is scripted: no network.

Run as a script it resumes a thread from another process:
``python -m tests.integrations.langgraph_app '<json: url, options, thread_id>'``
opens a new saver on the URL, checks the thread waits before ``act``, resumes
it and prints the messages as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from pai_storage.integrations.langgraph import PaiCheckpointSaver

SCOPE = "tenant-1"


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    steps: int


def plan(state: State) -> dict[str, Any]:
    asked = state["messages"][-1].content
    return {"messages": [AIMessage(f"plan: answer {asked!r}")], "steps": state.get("steps", 0) + 1}


def act(state: State) -> dict[str, Any]:
    return {"messages": [AIMessage(f"done after {state['steps']} plans")]}


def build(saver: PaiCheckpointSaver) -> Any:
    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("act", act)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "act")
    graph.add_edge("act", END)
    return graph.compile(checkpointer=saver, interrupt_before=["act"])


def ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


async def resume(url: str, options: dict[str, Any], thread_id: str) -> list[str]:
    async with PaiCheckpointSaver.from_url(url, scope_key=SCOPE, **options) as saver:
        app = build(saver)
        config = {"configurable": {"thread_id": thread_id}}
        waiting = await app.aget_state(config)
        if waiting.next != ("act",):
            raise SystemExit(f"expected to wait before act, not {waiting.next}")
        result = await app.ainvoke(None, config)
        return [str(m.content) for m in result["messages"]]


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(resume(args["url"], args["options"], args["thread_id"]))))
