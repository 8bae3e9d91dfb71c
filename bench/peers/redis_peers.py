"""Redis: the OpenAI Agents SDK's ``RedisSession`` beside pai-storage's agent-state lists.

LangGraph's own Redis saver and store (``langgraph-checkpoint-redis``) need the
RedisJSON and RediSearch modules; plain Redis (``MODULE LIST`` empty, as on
the test server) cannot run them, so the nearest plain-Redis peer is the
SDK's ``RedisSession``. pai-storage's Redis backend has no thread store (see
docs/redis.md), so the pai-storage side is its agent-state store, on the same
operations:

* ``RedisSession(conv, redis_client=...)``: a turn is two ``add_items``, each
  an ``INCR`` of the session's counter and a ``WATCH``/``MULTI`` pipeline that
  ``RPUSH``-es the items and touches the session hash; the newest 20 are one
  ``LRANGE -20 -1``. No listing.
* ``AgentStateStore.append_list(tenant, conv, "items", [...])``: a turn is two
  appends, each one Lua script that checks the list's length and content hash
  and ``RPUSH``-es the new items; the newest 20 are ``get_list`` (the whole
  list: the store has no "last n" read) sliced to the last 20. A tenant's
  sessions are ``list_session_ids`` (keyset pages of an index, in id order:
  not by recency).

Fast-forward (untimed): 1,000 items per call. Storage: the server's
``used_memory`` (a throwaway server; one system writes at a time).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pai_storage

from .openai_agents_peer import _item
from .workload import Infra, Msg, Peer, Storage, turn_messages

KEY = "items"


class RedisSessionPeer(Peer):
    key = "openai-redis"
    system = "OpenAI Agents SDK"
    component = "RedisSession"
    database = "redis"
    distributions = ("openai-agents", "redis")
    turn_shape = "2 `add_items` calls, each an INCR and a WATCH/MULTI pipeline (RPUSH)"
    read_shape = "`get_items(limit=20)` (LRANGE of the last 20)"
    list_shape = None

    def __init__(self) -> None:
        self.infra: Infra | None = None
        self.client: Any = None
        self.sessions: dict[str, Any] = {}

    async def open(self, infra: Infra) -> None:
        import redis.asyncio

        self.infra = infra
        self.client = redis.asyncio.Redis.from_url(infra.redis_database())

    def _session(self, conv: str) -> Any:
        from agents.extensions.memory import RedisSession

        return RedisSession(conv, redis_client=self.client)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def start(self, conv: str, tenant: str, variant: str = "") -> None:
        self.sessions[conv] = self._session(conv)

    async def turn(self, conv: str, turn: int, user: Msg, reply: Msg) -> None:
        session = self.sessions[conv]
        await session.add_items([_item(user)])
        await session.add_items([_item(reply)])

    async def seed(self, conv: str, turns: list[tuple[Msg, Msg]]) -> None:
        items = [_item(m) for pair in turns for m in pair]
        for start in range(0, len(items), 1000):
            await self.sessions[conv].add_items(items[start : start + 1000])

    async def read_recent(self, conv: str) -> int:
        return len(await self.sessions[conv].get_items(limit=20))

    async def storage(self) -> Storage | None:
        assert self.infra is not None
        return await asyncio.to_thread(self.infra.redis_storage)


class PaiStateListPeer(Peer):
    key = "pai-state-redis"
    system = "pai-storage"
    component = "AgentStateStore (lists)"
    database = "redis"
    distributions = ("pai-storage", "redis")
    turn_shape = "2 `append_list` calls, each one Lua script (length/hash check, RPUSH)"
    read_shape = "`get_list` (the whole list), last 20 sliced"
    list_shape = "`list_session_ids(tenant, limit=20)` (keyset page of an index, id order)"

    def __init__(self) -> None:
        self.infra: Infra | None = None
        self.state: pai_storage.AgentStateStore | None = None
        self.tenants: dict[str, str] = {}

    async def open(self, infra: Infra) -> None:
        self.infra = infra
        self.state = pai_storage.open_state_store(infra.redis_database())
        await self.state.initialize()

    async def close(self) -> None:
        if self.state is not None:
            await self.state.close()

    async def start(self, conv: str, tenant: str, variant: str = "") -> None:
        self.tenants[conv] = tenant

    async def turn(self, conv: str, turn: int, user: Msg, reply: Msg) -> None:
        assert self.state is not None
        tenant = self.tenants[conv]
        await self.state.append_list(tenant, conv, KEY, [_item(user)])
        await self.state.append_list(tenant, conv, KEY, [_item(reply)])

    async def seed(self, conv: str, turns: list[tuple[Msg, Msg]]) -> None:
        assert self.state is not None
        items = [_item(m) for pair in turns for m in pair]
        for start in range(0, len(items), 1000):
            await self.state.append_list(self.tenants[conv], conv, KEY, items[start : start + 1000])

    async def read_recent(self, conv: str) -> int:
        assert self.state is not None
        return len((await self.state.get_list(self.tenants[conv], conv, KEY))[-20:])

    async def populate(self, tenant: str, count: int, concurrency: int) -> None:
        assert self.state is not None
        state = self.state
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                conv = f"c{queue.get_nowait():05d}"
                items = [_item(m) for m in turn_messages(conv, 0)]
                await state.append_list(tenant, conv, KEY, items)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def list_recent(self, tenant: str) -> int:
        assert self.state is not None
        return len((await self.state.list_session_ids(tenant, limit=20)).items)

    async def storage(self) -> Storage | None:
        assert self.infra is not None
        return await asyncio.to_thread(self.infra.redis_storage)
