"""pai-storage itself, through ``pai_storage.open_store(url)`` only.

A turn is persisted the way an agent runtime drives the store (the worked
example of ``docs/commits.md#worked-example-one-turn``):

* **2 commits/turn** (the baseline, 1.0 in every ratio): commit 1 inserts the
  user message and its ``running`` run and acquires the run's lease; commit 2
  inserts the assistant reply, completes the run and releases the lease. The
  version token comes from the previous commit's result (no read per turn).
* **1 commit/turn**: one commit inserts the user message, the assistant reply
  and the ``completed`` run together (what a runtime that persists only at the
  end of a turn would do).
* **messages only**: one commit inserts the two messages and nothing else: the
  records every other system of the comparison stores for a turn (an agent
  SDK's session keeps no runs), so the like-for-like lane.

Seeding (fast-forward) uses ordinary commits of 100 turns each, as the variant
stores them (the messages-only lane without runs).
Listing is ``list_threads(scopeKey=tenant, limit=20)``; reading is a
``transcript`` page, ``order: newest``, ``limit: 20``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pai_storage
from pai_storage import builders as b

from .workload import Infra, Msg, Peer, Storage

TWO = "2 commits/turn"
ONE = "1 commit/turn"
MESSAGES = "messages only"
OWNER = "bench-worker"
SEED_TURNS_PER_COMMIT = 100


def _turn_index(user: Msg) -> int:
    return int(user.id[1:]) // 2


def _user(msg: Msg, run_id: str) -> dict[str, Any]:
    return b.message(msg.id, msg.text, role="user", run_id=run_id, relation="input")


def _reply(msg: Msg, run_id: str) -> dict[str, Any]:
    return b.message(msg.id, msg.text, role="assistant", run_id=run_id, relation="output")


def _completed_turn(user: Msg, reply: Msg) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    run_id = f"r{_turn_index(user)}"
    messages = [
        {"type": "insert", "record": _user(user, run_id)},
        {"type": "insert", "record": _reply(reply, run_id)},
    ]
    run = {"type": "insert", "record": b.run(run_id, "completed", inputs=[user.id])}
    return messages, run


def _one_commit(variant: str, user: Msg, reply: Msg) -> dict[str, Any]:
    """The changes of a turn in one commit: the two messages alone
    (:data:`MESSAGES`), or with their completed run (every other variant)."""
    if variant == MESSAGES:
        return {
            "messages": [
                {"type": "insert", "record": b.message(user.id, user.text, role="user")},
                {"type": "insert", "record": b.message(reply.id, reply.text, role="assistant")},
            ]
        }
    messages, run = _completed_turn(user, reply)
    return {"messages": messages, "runs": [run]}


class PaiStoragePeer(Peer):
    system = "pai-storage"
    distributions = ("pai-storage",)
    variants = (TWO, ONE, MESSAGES)
    read_shape = "read_thread: transcript page, newest first, limit 20"
    list_shape = "list_threads(scopeKey=tenant, limit=20): keyset page, newest update first"

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.key = f"pai-{backend}"
        self.component = {
            "postgres": "postgres",
            "mongo": "mongo",
            "sql": "sqlite",
            "memory": "memory",
        }[backend]
        self.database = {
            "postgres": "postgresql",
            "mongo": "mongodb",
            "sql": "sqlite",
            "memory": "memory",
        }[backend]
        self.turn_shape = (
            "2 commits/turn: (user message + running run + lease acquire), "
            "(assistant message + run completed + lease release); "
            "1 commit/turn: user + assistant + completed run at once; "
            "messages only: user + assistant message in 1 commit"
        )
        self.store: pai_storage.ThreadStore | None = None
        self.infra: Infra | None = None
        self.url = ""
        self.db_name = ""
        self.versions: dict[str, Any] = {}
        self.scopes: dict[str, str] = {}
        self.variant: dict[str, str] = {}

    async def open(self, infra: Infra) -> None:
        self.infra = infra
        if self.backend == "postgres":
            self.url = infra.pg_database("pai")
        elif self.backend == "mongo":
            self.db_name, self.url = infra.mongo_database("pai")
        elif self.backend == "sql":
            self.db_name = infra.sqlite_file("pai")
            self.url = f"sqlite:///{self.db_name}"
        else:
            self.url = "memory://"
        self.store = pai_storage.open_store(self.url)
        await self.store.initialize()

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()

    def _s(self) -> pai_storage.ThreadStore:
        assert self.store is not None
        return self.store

    async def _commit(self, request: dict[str, Any]) -> Any:
        result = await self._s().commit_thread(request)
        if result.type != "committed":
            raise RuntimeError(f"unexpected conflict on {request['threadId']}")
        return result.thread.version if result.thread is not None else None

    async def start(self, conv: str, tenant: str, variant: str = "") -> None:
        self.scopes[conv] = tenant
        self.variant[conv] = variant or TWO
        self.versions[conv] = await self._commit(b.create(tenant, conv, title=conv))

    async def turn(self, conv: str, turn: int, user: Msg, reply: Msg) -> None:
        scope = self.scopes[conv]
        run_id = f"r{turn}"
        if self.variant[conv] != TWO:
            self.versions[conv] = await self._commit(
                b.update_at(
                    scope,
                    conv,
                    self.versions[conv],
                    _one_commit(self.variant[conv], user, reply),
                    root=b.root(title=conv),
                )
            )
            return
        opened = {
            "messages": [{"type": "insert", "record": _user(user, run_id)}],
            "runs": [{"type": "insert", "record": b.run(run_id, "running", inputs=[user.id])}],
            "lease": b.acquire(run_id, OWNER, 60_000),
        }
        self.versions[conv] = await self._commit(
            b.update_at(scope, conv, self.versions[conv], opened, root=b.root(title=conv))
        )
        closed = {
            "messages": [{"type": "insert", "record": _reply(reply, run_id)}],
            "runs": [{"type": "replace", "record": b.run(run_id, "completed", inputs=[user.id])}],
            "lease": b.release(run_id, OWNER),
        }
        self.versions[conv] = await self._commit(
            b.update_at(scope, conv, self.versions[conv], closed, root=b.root(title=conv))
        )

    async def seed(self, conv: str, turns: list[tuple[Msg, Msg]]) -> None:
        scope = self.scopes[conv]
        for start in range(0, len(turns), SEED_TURNS_PER_COMMIT):
            messages: list[dict[str, Any]] = []
            runs: list[dict[str, Any]] = []
            for user, reply in turns[start : start + SEED_TURNS_PER_COMMIT]:
                changes = _one_commit(self.variant[conv], user, reply)
                messages.extend(changes["messages"])
                runs.extend(changes.get("runs", ()))
            self.versions[conv] = await self._commit(
                b.update_at(
                    scope,
                    conv,
                    self.versions[conv],
                    {"messages": messages, "runs": runs},
                    root=b.root(title=conv),
                )
            )

    async def read_recent(self, conv: str) -> int:
        result = await self._s().read_thread(
            b.read(
                self.scopes[conv],
                conv,
                messages={
                    "type": "page",
                    "view": "transcript",
                    "order": "newest",
                    "page": {"limit": 20},
                },
            )
        )
        assert result.messages is not None
        return len(result.messages.items)

    async def populate(self, tenant: str, count: int, concurrency: int) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)
        from .workload import turn_messages

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                conv = f"c{i:05d}"
                user, reply = turn_messages(conv, 0)
                messages, run = _completed_turn(user, reply)
                await self._commit(
                    b.create(tenant, conv, {"messages": messages, "runs": [run]}, title=conv)
                )

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def list_recent(self, tenant: str) -> int:
        page = await self._s().list_threads({"scopeKey": tenant, "limit": 20})
        return len(page.items)

    async def storage(self) -> Storage | None:
        assert self.infra is not None
        if self.backend == "postgres":
            return await asyncio.to_thread(self.infra.pg_storage, self.url)
        if self.backend == "mongo":
            return await asyncio.to_thread(self.infra.mongo_storage, self.db_name)
        if self.backend == "sql":
            return self.infra.sqlite_storage(self.db_name)
        return None
