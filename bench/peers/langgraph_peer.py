"""LangGraph: a trivial graph whose state is a message list, on a checkpointer.

* PostgreSQL: ``langgraph.checkpoint.postgres.aio.AsyncPostgresSaver`` on a
  ``psycopg_pool.AsyncConnectionPool`` (max 10 connections, ``autocommit``,
  ``prepare_threshold=0``, ``dict_row`` — the settings its docs require).
* MongoDB: ``langgraph.checkpoint.mongodb.MongoDBSaver`` (its async methods run
  the synchronous PyMongo calls in a thread pool; the package ships no native
  async saver).
* SQLite: ``langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver`` on one
  ``aiosqlite`` connection to a file.

The graph is ``START -> respond -> END`` over ``MessagesState`` (the
``add_messages`` reducer); ``respond`` returns the turn's assistant message. A
turn is one ``graph.ainvoke({"messages": [user]}, config)`` with the default
durability (``"async"``): LangGraph loads the latest checkpoint and writes one
checkpoint per super-step (input, ``__start__``, ``respond`` — three per turn)
plus their pending writes. With the default channel the whole message list is
serialized into a new blob (PostgreSQL) or into the checkpoint document
(MongoDB) at every version, so a turn costs O(transcript) and storage grows
O(n^2). (The beta ``DeltaChannel`` of langgraph 1.2 stores deltas instead; it
is opt-in and not what ``MessagesState`` uses; it is measured as a separate
system on PostgreSQL, ``langgraph-delta-postgres``: the same graph over a state
whose ``messages`` channel is ``DeltaChannel`` with the ``add_messages``
reducer and the default ``snapshot_frequency=100``. Reads then go through
``graph.aget_state`` (which replays the writes since the last snapshot).
``MongoDBSaver`` has no native delta-history query — it would fall back to a
walk of ``aget_tuple`` calls — so the delta variant is not run on MongoDB.)

The cost measured includes LangGraph's graph runtime (small against the
persistence at any real length; compare the 10-message column).

Reading the newest 20 = ``saver.aget_tuple(config)`` (the latest checkpoint,
whose channel values hold the whole list) and slicing the last 20: there is
no paged read of a channel.

Listing a tenant's conversations: a checkpointer has no notion of a
conversation list. The closest call is ``saver.alist(None, filter={"tenant":
t}, limit=20)``, a metadata filter across all threads (PostgreSQL: ``metadata
@> ...`` with no index; MongoDB: ``metadata.tenant`` with no index) that returns
checkpoints, not threads — several per thread in real use. To keep that
favourable to LangGraph, the tenant is populated with one checkpoint per
thread (``aput`` directly), so 20 checkpoints are 20 threads.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages

from .workload import Infra, Msg, Peer, Storage, turn_messages


def _add_messages_batch(state: Any, writes: Any) -> Any:
    """``add_messages`` folded over a batch of writes (the DeltaChannel reducer shape)."""
    for write in writes:
        state = add_messages(state, write)
    return state


class DeltaMessagesState(TypedDict):
    """``MessagesState`` with the beta ``DeltaChannel`` instead of the default channel."""

    messages: Annotated[list[Any], DeltaChannel(_add_messages_batch)]


def _lc(msg: Msg) -> Any:
    if msg.role == "user":
        return HumanMessage(content=msg.text, id=msg.id)
    return AIMessage(content=msg.text, id=msg.id)


class LangGraphPeer(Peer):
    system = "LangGraph"
    distributions: tuple[str, ...] = ("langgraph", "langgraph-checkpoint")
    turn_shape = (
        "1 `graph.ainvoke` (trivial graph over `MessagesState`, default durability): reads "
        "the latest checkpoint, writes 3 checkpoints + pending writes; the whole message list is "
        "re-serialized per new channel version"
    )
    read_shape = "`aget_tuple` (latest checkpoint, whole list deserialized), last 20 sliced"
    list_shape = (
        "`alist(None, filter={tenant}, limit=20)`: unindexed metadata filter over all "
        "checkpoints of all threads; returns checkpoints, not threads (tenant populated with "
        "one checkpoint per thread, which favours it)"
    )

    def __init__(self, database: str, *, delta: bool = False) -> None:
        self.database = database
        self.delta = delta
        if delta:
            if database != "postgresql":
                raise ValueError("the DeltaChannel variant runs on PostgreSQL only")
            self.key = "langgraph-delta-postgres"
            self.component = "AsyncPostgresSaver + DeltaChannel (beta)"
            self.distributions += ("langgraph-checkpoint-postgres",)
            self.turn_shape = (
                "1 `graph.ainvoke` over a `DeltaChannel` message list (beta): 3 checkpoints; "
                "each update stored as a write, a full snapshot every 100 updates; the state "
                "is rebuilt by replaying writes since the last snapshot"
            )
            self.read_shape = "`graph.aget_state` (snapshot + replayed writes), last 20 sliced"
        elif database == "postgresql":
            self.key = "langgraph-postgres"
            self.component = "AsyncPostgresSaver"
            self.distributions += ("langgraph-checkpoint-postgres",)
        elif database == "sqlite":
            self.key = "langgraph-sqlite"
            self.component = "AsyncSqliteSaver"
            self.distributions += ("langgraph-checkpoint-sqlite",)
        else:
            self.key = "langgraph-mongo"
            self.component = "MongoDBSaver"
            self.distributions += ("langgraph-checkpoint-mongodb",)
        self.saver: Any = None
        self.pool: Any = None
        self.conn: Any = None
        self.client: Any = None
        self.infra: Infra | None = None
        self.url = ""
        self.db_name = ""
        self.tenants: dict[str, str] = {}
        self.replies: dict[str, Any] = {}

    async def open(self, infra: Infra) -> None:
        self.infra = infra
        if self.database == "postgresql":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            self.url = infra.pg_database("langgraph")
            self.pool = AsyncConnectionPool(
                self.url,
                max_size=10,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                open=False,
            )
            await self.pool.open()
            self.saver = AsyncPostgresSaver(self.pool)
            await self.saver.setup()
        elif self.database == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            self.db_name = infra.sqlite_file("langgraph")
            self.conn = await aiosqlite.connect(self.db_name)
            self.saver = AsyncSqliteSaver(self.conn)
            await self.saver.setup()
        else:
            from langgraph.checkpoint.mongodb import MongoDBSaver
            from pymongo import MongoClient

            self.db_name, self.url = infra.mongo_database("langgraph")
            self.client = MongoClient(self.url)
            self.saver = await asyncio.to_thread(MongoDBSaver, self.client, db_name=self.db_name)

        def respond(state: Any, config: RunnableConfig) -> dict[str, Any]:
            return {"messages": [self.replies[config["configurable"]["thread_id"]]]}

        builder: Any = StateGraph(DeltaMessagesState if self.delta else MessagesState)
        builder.add_node("respond", respond)
        builder.add_edge(START, "respond")
        builder.add_edge("respond", END)
        self.graph = builder.compile(checkpointer=self.saver)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
        if self.pool is not None:
            await self.pool.close()
        if self.client is not None:
            self.client.close()

    def _config(self, conv: str) -> dict[str, Any]:
        return {
            "configurable": {"thread_id": conv},
            "metadata": {"tenant": self.tenants[conv]},
        }

    async def start(self, conv: str, tenant: str, variant: str = "") -> None:
        self.tenants[conv] = tenant  # a thread exists from its first checkpoint

    async def turn(self, conv: str, turn: int, user: Msg, reply: Msg) -> None:
        self.replies[conv] = _lc(reply)
        await self.graph.ainvoke({"messages": [_lc(user)]}, self._config(conv))

    async def seed(self, conv: str, turns: list[tuple[Msg, Msg]]) -> None:
        # One invocation whose input is the whole history but the last reply,
        # which the node returns: three checkpoints holding the full list.
        history = [_lc(m) for pair in turns for m in pair]
        self.replies[conv] = history[-1]
        await self.graph.ainvoke({"messages": history[:-1]}, self._config(conv))

    async def read_recent(self, conv: str) -> int:
        if self.delta:
            state = await self.graph.aget_state(self._config(conv))
            return len(state.values["messages"][-20:])
        tup = await self.saver.aget_tuple(
            {"configurable": {"thread_id": conv, "checkpoint_ns": ""}}
        )
        messages = tup.checkpoint["channel_values"]["messages"][-20:]
        return len(messages)

    async def populate(self, tenant: str, count: int, concurrency: int) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                conv = f"{tenant}-c{i:05d}"
                user, reply = turn_messages(conv, 0)
                checkpoint = empty_checkpoint()
                version = self.saver.get_next_version(None, None)
                checkpoint["channel_values"] = {"messages": [_lc(user), _lc(reply)]}
                checkpoint["channel_versions"] = {"messages": version}
                await self.saver.aput(
                    {"configurable": {"thread_id": conv, "checkpoint_ns": ""}},
                    checkpoint,
                    {"source": "loop", "step": 1, "parents": {}, "tenant": tenant},
                    {"messages": version},
                )

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def list_recent(self, tenant: str) -> int:
        found = [t async for t in self.saver.alist(None, filter={"tenant": tenant}, limit=20)]
        return len(found)

    async def storage(self) -> Storage | None:
        assert self.infra is not None
        if self.database == "postgresql":
            return await asyncio.to_thread(self.infra.pg_storage, self.url)
        if self.database == "sqlite":
            return self.infra.sqlite_storage(self.db_name)
        return await asyncio.to_thread(self.infra.mongo_storage, self.db_name)
