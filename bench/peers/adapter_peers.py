"""The frameworks on pai-storage: each framework's own workload, through the
adapter in ``pai_storage.integrations``, beside the framework's native store.

Each class is the framework's peer with only the storage swapped, so the turn,
the read and the fast-forward are exactly the native peer's calls:

* ``PaiSession`` (OpenAI Agents SDK): two ``add_items`` per turn, each one
  version-checked commit of one message; ``get_items(limit=20)``. It can list
  a tenant's conversations (the thread store's ``list_threads``), which the
  SDK's own sessions cannot.
* ``PaiSessionService`` (Google ADK): two ``append_event`` per turn, each one
  read (the stale check) and one commit of the event; ``get_session(
  num_recent_events=20)``; ``list_sessions`` reads the tenant's sessions from
  an index in keyset pages. Fast-forward: ``append_event`` (the adapter has no
  bulk path).
* ``PaiCheckpointSaver`` (LangGraph): the same graph; every checkpoint is one
  key-value write. The message list is one channel, so like LangGraph's own
  savers a turn re-serializes it (the value limit is raised to the backend's
  ceiling for the 10,000-message conversation).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.runnables import RunnableConfig

import pai_storage

from .adk_peer import USER_ID, AdkPeer
from .langgraph_peer import LangGraphPeer
from .openai_agents_peer import OpenAIAgentsPeer, _item
from .workload import Infra, turn_messages

SCOPE = "bench"
_SHORT = {"postgresql": "postgres", "mongodb": "mongo", "sqlite": "sqlite"}
_CEILING = {"postgresql": 256 << 20, "mongodb": 15 << 20, "sqlite": 64 << 20}
"""The backends' largest values: the 10,000-message list is one checkpoint value."""


def _url(peer: Any, infra: Infra, tag: str) -> str:
    """A fresh database for ``peer`` on its server; sets what its storage() reads."""
    if peer.database == "postgresql":
        peer.url = infra.pg_database(tag)
        return str(peer.url)
    if peer.database == "sqlite":
        peer.db_name = infra.sqlite_file(tag)
        return f"sqlite:///{peer.db_name}"
    peer.db_name, peer.url = infra.mongo_database(tag)
    return str(peer.url)


class PaiSessionPeer(OpenAIAgentsPeer):
    distributions = ("openai-agents", "pai-storage")  # type: ignore[assignment]
    # The native sessions cannot list (None there); the thread store can.
    list_shape = "`list_threads` of the tenant's scope, limit 20 (keyset page of an index)"  # type: ignore[assignment]

    def __init__(self, database: str) -> None:
        super().__init__(database)
        self.key = f"openai-pai-{_SHORT[database]}"
        self.component = "PaiSession (pai-storage)"
        self.turn_shape = "2 `add_items` calls, each one version-checked commit of one message"
        self.stores: pai_storage.Stores | None = None

    async def open(self, infra: Infra) -> None:
        self.infra = infra
        self.stores = pai_storage.connect(_url(self, infra, "openaipai"))
        await self.stores.initialize()

    def _session(self, conv: str, scope: str = SCOPE) -> Any:
        from pai_storage.integrations.openai_agents import PaiSession

        assert self.stores is not None
        return PaiSession(conv, self.stores, scope_key=scope)

    async def close(self) -> None:
        if self.stores is not None:
            await self.stores.close()

    async def populate(self, tenant: str, count: int, concurrency: int) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                conv = f"c{queue.get_nowait():05d}"
                await self._session(conv, tenant).add_items(
                    [_item(m) for m in turn_messages(conv, 0)]
                )

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def list_recent(self, tenant: str) -> int:
        assert self.stores is not None
        page = await self.stores.threads.list_threads({"scopeKey": tenant, "limit": 20})
        return len(page.items)


class PaiSessionServicePeer(AdkPeer):
    key = "adk-pai-postgres"
    component = "PaiSessionService (pai-storage)"
    distributions = ("google-adk", "pai-storage")  # type: ignore[assignment]
    turn_shape = "2 `append_event` calls, each one read (stale check) and one commit"
    list_shape = "`list_sessions(app_name=tenant)`: every session, in keyset pages of an index"

    def __init__(self) -> None:
        super().__init__()
        self.stores: pai_storage.Stores | None = None

    async def open(self, infra: Infra) -> None:
        from pai_storage.integrations.adk import PaiSessionService

        self.infra = infra
        self.stores = pai_storage.connect(_url(self, infra, "adkpai"))
        await self.stores.initialize()
        self.service = PaiSessionService(self.stores)

    async def close(self) -> None:
        if self.stores is not None:
            await self.stores.close()

    async def seed(self, conv: str, turns: list[Any]) -> None:
        session = self.sessions[conv]
        for number, (user, reply) in enumerate(turns):
            await self.turn(conv, number, user, reply)
        del session.events[:-2]

    async def populate(self, tenant: str, count: int, concurrency: int) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await self.service.create_session(
                    app_name=tenant, user_id=USER_ID, session_id=f"c{i:05d}"
                )

        await asyncio.gather(*(worker() for _ in range(concurrency)))


class PaiCheckpointSaverPeer(LangGraphPeer):
    distributions = ("langgraph", "langgraph-checkpoint", "pai-storage")

    def __init__(self, database: str) -> None:
        super().__init__(database)
        self.key = f"langgraph-pai-{_SHORT[database]}"
        self.component = "PaiCheckpointSaver (pai-storage)"
        self.distributions = PaiCheckpointSaverPeer.distributions
        self.turn_shape = (
            "1 `graph.ainvoke` (the same graph): reads the latest checkpoint, writes 3 "
            "checkpoints (one key-value write each) + pending writes"
        )
        self.read_shape = "`aget_tuple` (one read of the latest checkpoint), last 20 sliced"
        self.kv: pai_storage.KeyValueStore | None = None

    async def open(self, infra: Infra) -> None:
        from langgraph.graph import END, START, MessagesState, StateGraph

        from pai_storage.integrations.langgraph import PaiCheckpointSaver

        self.infra = infra
        url = _url(self, infra, "langgraphpai")
        self.kv = pai_storage.open_kv_store(url, max_value_bytes=_CEILING[self.database])
        await self.kv.initialize()
        self.saver = PaiCheckpointSaver(self.kv, scope_key=SCOPE)

        def respond(state: Any, config: RunnableConfig) -> dict[str, Any]:
            return {"messages": [self.replies[config["configurable"]["thread_id"]]]}

        builder: Any = StateGraph(MessagesState)
        builder.add_node("respond", respond)
        builder.add_edge(START, "respond")
        builder.add_edge("respond", END)
        self.graph = builder.compile(checkpointer=self.saver)

    async def close(self) -> None:
        if self.kv is not None:
            await self.kv.close()
