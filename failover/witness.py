"""Independent witnesses: what the load wrote, read back with a client of their own.

After a fault :meth:`failover.load.Load.verify` judges every attempt against
what a :class:`Witness` reads, never against the :class:`pai_storage.Stores`
that wrote it: a bug that made those stores answer from memory (or from the
wrong server) cannot hide a lost write. :class:`PostgresWitness` reads the
tables of one server with asyncpg; :class:`MongoWitness` asks every member of
a replica set which one is primary, over direct connections of its own, and
reads that member's collections with PyMongo (read concern ``majority``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import asyncpg  # type: ignore[import-untyped]
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from pai_storage.backend import namespace_path

T = TypeVar("T")

RETRY_S = 90.0
"""How long a witness retries a server that does not answer (it may still be promoting)."""


class Witness(Protocol):
    """The stored state of the load's data, read without the stores under test."""

    def describe(self) -> str:
        """Which server was read, and how."""
        ...

    async def messages(self, scope_key: str, thread_id: str) -> tuple[int, list[tuple[str, str]]]:
        """The thread's revision and its messages' ``(id, first text part)``, oldest first."""
        ...

    async def kv(self, namespace: Sequence[str], key: str) -> tuple[int, Any] | None:
        """A key-value item's ``(version, value)``, or ``None`` when it is absent."""
        ...

    async def state_list(self, user_key: str, session_id: str, key: str) -> list[Any]:
        """The items of an agent-state list, in order (empty when absent)."""
        ...


async def _retrying(read: Callable[[], Awaitable[T]]) -> T:
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            return await read()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, PyMongoError, LookupError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


class PostgresWitness:
    """Reads one PostgreSQL server's tables with a plain asyncpg connection.

    The default table names of ``pai_storage.connect`` (``docs/postgres.md``);
    every read is one ``REPEATABLE READ`` snapshot.
    """

    def __init__(self, port: int, *, host: str = "127.0.0.1", database: str = "test") -> None:
        self.dsn = f"postgresql://postgres@{host}:{port}/{database}"

    def describe(self) -> str:
        return f"asyncpg on {self.dsn}"

    async def _read(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        async def once() -> T:
            conn = await asyncpg.connect(self.dsn, timeout=10)
            try:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    return await work(conn)
            finally:
                await conn.close()

        return await _retrying(once)

    async def messages(self, scope_key: str, thread_id: str) -> tuple[int, list[tuple[str, str]]]:
        key = (scope_key.encode(), thread_id.encode())

        async def work(conn: asyncpg.Connection) -> tuple[int, list[tuple[str, str]]]:
            revision = await conn.fetchval(
                "SELECT revision FROM pai_threads WHERE scope_key = $1 AND thread_id = $2", *key
            )
            rows = await conn.fetch(
                "SELECT doc FROM pai_threads_messages WHERE scope_key = $1 AND thread_id = $2 "
                "ORDER BY position",
                *key,
            )
            docs = [json.loads(row["doc"]) for row in rows]
            return int(revision or 0), [(d["messageId"], d["parts"][0]["text"]) for d in docs]

        return await self._read(work)

    async def kv(self, namespace: Sequence[str], key: str) -> tuple[int, Any] | None:
        async def work(conn: asyncpg.Connection) -> tuple[int, Any] | None:
            row = await conn.fetchrow(
                "SELECT version, value FROM pai_kv WHERE ns = $1 AND key = $2",
                namespace_path(namespace),
                key,
            )
            return None if row is None else (int(row["version"]), json.loads(row["value"]))

        return await self._read(work)

    async def state_list(self, user_key: str, session_id: str, key: str) -> list[Any]:
        async def work(conn: asyncpg.Connection) -> list[Any]:
            rows = await conn.fetch(
                "SELECT value FROM pai_agent_sessions_items "
                "WHERE user_key = $1 AND session_id = $2 AND key = $3 ORDER BY position",
                user_key,
                session_id,
                key,
            )
            return [json.loads(row["value"]) for row in rows]

        return await self._read(work)


class MongoWitness:
    """Reads the primary of a replica set over direct connections (no replica-set client).

    The default collection names of ``pai_storage.connect`` (``docs/mongodb.md``).
    """

    def __init__(self, hosts: Sequence[str], db_name: str) -> None:
        self.hosts = list(hosts)
        self.db_name = db_name
        self.read_from = "?"

    def describe(self) -> str:
        return f"PyMongo, a direct connection to the primary {self.read_from} of {self.hosts}"

    def _on_primary(self, work: Callable[[Database[dict[str, Any]]], T]) -> T:
        for host in self.hosts:
            client: MongoClient[dict[str, Any]] = MongoClient(
                f"mongodb://{host}/?directConnection=true",
                serverSelectionTimeoutMS=2000,
                connectTimeoutMS=2000,
            )
            try:
                try:
                    primary = client.admin.command("hello").get("isWritablePrimary")
                except PyMongoError:
                    continue  # a member that is down
                if primary:
                    self.read_from = host
                    db = client.get_database(self.db_name, read_concern=ReadConcern("majority"))
                    return work(db)
            finally:
                client.close()
        raise LookupError(f"no member of {self.hosts} is primary")

    async def _read(self, work: Callable[[Database[dict[str, Any]]], T]) -> T:
        return await _retrying(lambda: asyncio.to_thread(self._on_primary, work))

    async def messages(self, scope_key: str, thread_id: str) -> tuple[int, list[tuple[str, str]]]:
        key = {"scopeKey": scope_key, "threadId": thread_id}

        def work(db: Database[dict[str, Any]]) -> tuple[int, list[tuple[str, str]]]:
            root = db["pai_threads"].find_one(key)
            docs = db["pai_threads_messages"].find(key).sort("_order", 1)
            messages = [(d["messageId"], d["parts"][0]["text"]) for d in docs]
            return (0 if root is None else int(root["version"]["revision"])), messages

        return await self._read(work)

    async def kv(self, namespace: Sequence[str], key: str) -> tuple[int, Any] | None:
        def work(db: Database[dict[str, Any]]) -> tuple[int, Any] | None:
            doc = db["pai_kv"].find_one({"ns": namespace_path(namespace), "key": key})
            return None if doc is None else (int(doc["version"]), json.loads(doc["value"]))

        return await self._read(work)

    async def state_list(self, user_key: str, session_id: str, key: str) -> list[Any]:
        if any(c in key for c in "%.$"):  # stored under a percent-encoded field name
            raise ValueError(f"state key {key!r} needs encoding")

        def work(db: Database[dict[str, Any]]) -> list[Any]:
            doc = db["pai_agent_sessions"].find_one(
                {"_id": {"user": user_key, "session": session_id}}
            )
            texts = [] if doc is None else doc.get("states", {}).get(key, [])
            return [json.loads(text) for text in texts]

        return await self._read(work)
