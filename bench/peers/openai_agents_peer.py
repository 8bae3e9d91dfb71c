"""OpenAI Agents SDK sessions: ``SQLAlchemySession``, ``SQLiteSession``, ``MongoDBSession``.

The SDK's runner saves the turn's input items before calling the model and the
new items after it, so a turn is two ``add_items`` calls: ``[user message]``
then ``[assistant message]`` (Responses-API input-item dicts).

* ``SQLAlchemySession(session_id, engine=create_async_engine(
  "postgresql+asyncpg://..."), create_tables=True)``: each ``add_items`` is one
  transaction that locks/creates the session row, bulk-inserts the items
  (one row each) and touches ``updated_at``.
* ``MongoDBSession(session_id, client=AsyncMongoClient(url), database=...)``:
  each ``add_items`` reserves sequence numbers on the session document and
  inserts one document holding the batch.

* ``SQLiteSession(session_id, db_path)``, the SDK's default session: one
  SQLite file, one row per item, each ``add_items`` one transaction.

Reading the newest 20: ``get_items(limit=20)``.

Listing: neither session class has an API to list sessions (a session is
addressed only by its id), so the list column is "not supported".

Fast-forward (untimed): ``add_items`` with 1,000 items per call.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .workload import Infra, Msg, Peer, Storage


def _item(msg: Msg) -> dict[str, Any]:
    if msg.role == "user":
        return {"role": "user", "content": msg.text}
    return {
        "type": "message",
        "id": f"msg_{msg.id}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": msg.text, "annotations": []}],
    }


class OpenAIAgentsPeer(Peer):
    system = "OpenAI Agents SDK"
    distributions = ("openai-agents",)
    turn_shape = "2 `add_items` calls (input item, output item), each one transaction/batch"
    read_shape = "`get_items(limit=20)`"
    list_shape = None

    def __init__(self, database: str) -> None:
        self.database = database
        if database == "postgresql":
            self.key = "openai-postgres"
            self.component = "SQLAlchemySession"
        elif database == "sqlite":
            self.key = "openai-sqlite"
            self.component = "SQLiteSession"
        else:
            self.key = "openai-mongo"
            self.component = "MongoDBSession"
        self.engine: Any = None
        self.client: Any = None
        self.infra: Infra | None = None
        self.url = ""
        self.db_name = ""
        self.sessions: dict[str, Any] = {}

    async def open(self, infra: Infra) -> None:
        self.infra = infra
        if self.database == "postgresql":
            from sqlalchemy.ext.asyncio import create_async_engine

            self.url = infra.pg_database("openai")
            self.engine = create_async_engine(
                self.url.replace("postgresql://", "postgresql+asyncpg://", 1)
            )
        elif self.database == "sqlite":
            self.db_name = infra.sqlite_file("openai")
        else:
            from pymongo import AsyncMongoClient

            self.db_name, self.url = infra.mongo_database("openai")
            self.client = AsyncMongoClient(self.url)
        # Create the schema / indexes now, so the empty baseline includes them.
        probe = self._session("__probe__")
        await probe.get_items(limit=1)

    def _session(self, conv: str) -> Any:
        if self.database == "postgresql":
            from agents.extensions.memory import SQLAlchemySession

            return SQLAlchemySession(conv, engine=self.engine, create_tables=True)
        if self.database == "sqlite":
            from agents import SQLiteSession

            return SQLiteSession(conv, self.db_name)
        from agents.extensions.memory import MongoDBSession

        return MongoDBSession(conv, client=self.client, database=self.db_name)

    async def close(self) -> None:
        if self.database == "sqlite":
            for session in self.sessions.values():
                session.close()
        if self.engine is not None:
            await self.engine.dispose()
        if self.client is not None:
            await self.client.close()

    async def start(self, conv: str, tenant: str, variant: str = "") -> None:
        self.sessions[conv] = self._session(conv)

    async def turn(self, conv: str, turn: int, user: Msg, reply: Msg) -> None:
        session = self.sessions[conv]
        await session.add_items([_item(user)])
        await session.add_items([_item(reply)])

    async def seed(self, conv: str, turns: list[tuple[Msg, Msg]]) -> None:
        session = self.sessions[conv]
        items = [_item(m) for pair in turns for m in pair]
        for start in range(0, len(items), 1000):
            await session.add_items(items[start : start + 1000])

    async def read_recent(self, conv: str) -> int:
        return len(await self.sessions[conv].get_items(limit=20))

    async def storage(self) -> Storage | None:
        assert self.infra is not None
        if self.database == "postgresql":
            return await asyncio.to_thread(self.infra.pg_storage, self.url)
        if self.database == "sqlite":
            return self.infra.sqlite_storage(self.db_name)
        return await asyncio.to_thread(self.infra.mongo_storage, self.db_name)
