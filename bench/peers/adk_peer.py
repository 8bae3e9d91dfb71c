"""Google ADK: ``DatabaseSessionService`` on PostgreSQL (``postgresql+asyncpg``).

ADK's runner persists every event as it happens, so a turn is two
``append_event`` calls — the user's event, then the model's reply event — on
the ``Session`` object the application holds (each call locks the session row
``FOR UPDATE``, checks it is not stale, inserts the event, and updates the
session's ``update_time``).

Reading the newest 20 messages: ``get_session(config=GetSessionConfig(
num_recent_events=20))`` (served by the ``(app, user, session, timestamp
desc, id desc)`` index).

Listing: ``list_sessions(app_name=tenant)`` — the tenant is the ADK app.
There is no limit or pagination: it returns every session of the app (without
events), ordered by ``update_time`` ascending; the application slices the
newest 20. The tenant is populated with ``create_session`` (sessions without
events, which ``list_sessions`` does not read anyway).

Fast-forward (untimed) inserts events in bulk through ADK's own ORM mapping
(``StorageEvent.from_event``), 1,000 per transaction.

Storage: every table of the database (``sessions``, ``events``,
``app_states``, ``user_states``, ``adk_internal_metadata``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from google.adk.events import Event
from google.adk.sessions import DatabaseSessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from .workload import Infra, Msg, Peer, Storage

USER_ID = "user"


def _event(msg: Msg, invocation: str) -> Event:
    role = "user" if msg.role == "user" else "model"
    return Event(
        author="user" if msg.role == "user" else "assistant",
        invocation_id=invocation,
        content=types.Content(role=role, parts=[types.Part(text=msg.text)]),
    )


class AdkPeer(Peer):
    key = "adk-postgres"
    system = "Google ADK"
    component = "DatabaseSessionService"
    database = "postgresql"
    distributions = ("google-adk",)
    turn_shape = "2 `append_event` calls (user event, model event), each one transaction"
    read_shape = "`get_session(num_recent_events=20)`"
    list_shape = (
        "`list_sessions(app_name=tenant)`: no limit or pagination, returns every session "
        "of the tenant (populated without events); newest 20 sliced by the caller"
    )

    def __init__(self) -> None:
        self.service: Any = None
        self.infra: Infra | None = None
        self.url = ""
        self.sessions: dict[str, Any] = {}
        self.apps: dict[str, str] = {}

    async def open(self, infra: Infra) -> None:
        self.infra = infra
        self.url = infra.pg_database("adk")
        async_url = self.url.replace("postgresql://", "postgresql+asyncpg://", 1)
        self.service = DatabaseSessionService(db_url=async_url)
        await self.service.prepare_tables()

    async def close(self) -> None:
        if self.service is not None:
            await self.service.close()

    async def start(self, conv: str, tenant: str, variant: str = "") -> None:
        self.apps[conv] = tenant
        self.sessions[conv] = await self.service.create_session(
            app_name=tenant, user_id=USER_ID, session_id=conv
        )

    async def turn(self, conv: str, turn: int, user: Msg, reply: Msg) -> None:
        session = self.sessions[conv]
        invocation = f"inv-{turn}"
        await self.service.append_event(session, _event(user, invocation))
        await self.service.append_event(session, _event(reply, invocation))
        # A runner keeps the Session object but not an ever-growing event list
        # in memory between requests; keep the list short so the client side
        # does not grow with the benchmark.
        del session.events[:-2]

    async def seed(self, conv: str, turns: list[tuple[Msg, Msg]]) -> None:
        session = self.sessions[conv]
        schema = self.service._get_schema_classes()
        factory = self.service.database_session_factory
        events = []
        for user, reply in turns:
            invocation = f"inv-{int(user.id[1:]) // 2}"
            for msg in (user, reply):
                event = _event(msg, invocation)
                event.id = Event.new_id()
                events.append(event)
        for start in range(0, len(events), 1000):
            async with factory() as sql:
                sql.add_all(
                    [
                        schema.StorageEvent.from_event(session, e)
                        for e in events[start : start + 1000]
                    ]
                )
                await sql.commit()

    async def read_recent(self, conv: str) -> int:
        session = await self.service.get_session(
            app_name=self.apps[conv],
            user_id=USER_ID,
            session_id=conv,
            config=GetSessionConfig(num_recent_events=20),
        )
        return len(session.events)

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

    async def list_recent(self, tenant: str) -> int:
        response = await self.service.list_sessions(app_name=tenant)
        newest = response.sessions[-20:]
        return len(newest)

    async def storage(self) -> Storage | None:
        assert self.infra is not None
        return await asyncio.to_thread(self.infra.pg_storage, self.url)
