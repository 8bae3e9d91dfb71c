"""The one workload every system runs, and the interface each peer implements.

A conversation grows turn by turn; a turn is one user message followed by one
assistant reply, persisted the way the system's own runtime persists a turn
(each peer module says how). Measured, per system:

* ``turn@L`` — wall time of one turn's persistence when the transcript holds
  ``L`` messages (``L`` = 10, 100, 1,000, 10,000). Lengths 10, 100 and 1,000
  come from one conversation grown turn by turn from empty: the median of the
  ``window`` turns that start at ``L`` messages. For 10,000 a second
  conversation is fast-forwarded to 10,000 messages with the system's own bulk
  path (not timed) and then grown by ``window`` turns, within a wall-time cap.
* ``read@L`` — reading the newest 20 messages of a conversation of ``L``
  messages (``L`` = 1,000 and 10,000).
* ``list`` — listing the 20 most recently updated conversations of one tenant
  that holds 10,000 conversations (populated concurrently, not timed).
* ``bytes/msg`` — storage of the grown conversation at exactly 1,000 messages
  minus the storage of the freshly initialized empty schema, divided by 1,000
  (PostgreSQL: ``pg_total_relation_size`` of every table, after ``VACUUM FULL``
  and as written; MongoDB: ``collStats`` ``storageSize + totalIndexSize`` after
  ``fsync``, and the uncompressed BSON ``size``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

READ_LIMIT = 20
LIST_LIMIT = 20


@dataclass(frozen=True)
class Msg:
    """One transcript message, in neutral form; each peer converts it."""

    id: str
    role: str  # "user" | "assistant"
    text: str


_VOCAB_RNG = random.Random(20261129)
_VOCAB = [
    "".join(
        _VOCAB_RNG.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_VOCAB_RNG.randint(2, 9))
    )
    for _ in range(2000)
]


def _text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    out = " ".join(rng.choice(_VOCAB) for _ in range(words))
    return out[0].upper() + out[1:] + "."


def turn_messages(conv: str, turn: int) -> tuple[Msg, Msg]:
    """The user message and assistant reply of ``turn`` (deterministic text).

    User messages are 24 words (about 150 characters), replies 90 words (about
    560 characters), drawn from a fixed pseudo-word vocabulary so that
    compression behaves like prose rather than like repeated text.
    """
    base = zlib.crc32(f"{conv}/{turn}".encode())
    return (
        Msg(f"m{2 * turn}", "user", _text(base, 24)),
        Msg(f"m{2 * turn + 1}", "assistant", _text(base + 1, 90)),
    )


@dataclass
class Infra:
    """What a peer may ask for: fresh databases on the shared servers."""

    postgres: Any = None  # _infra.Postgres
    mongo: Any = None  # _infra.Mongo
    sqlite_dir: str | None = None  # a temporary directory for SQLite files
    redis: Any = None  # _infra.Redis

    def redis_database(self) -> str:
        if self.redis is None or self.redis.url is None:
            raise RuntimeError("no Redis configured")
        return str(self.redis.fresh_database())

    def redis_storage(self) -> Storage:
        used = int(self.redis.memory_bytes())
        return Storage(used, {"used_memory": used})

    def sqlite_file(self, tag: str) -> str:
        """The path of a new SQLite database file (not created yet)."""
        if self.sqlite_dir is None:
            raise RuntimeError("no SQLite directory configured")
        return os.path.join(self.sqlite_dir, f"{tag}.db")

    def sqlite_storage(self, path: str) -> Storage:
        """The file and its write-ahead log after a checkpoint that copies what the
        log held into the file and empties the log."""
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes = {
            name: os.path.getsize(path + suffix)
            for name, suffix in (("file", ""), ("wal", "-wal"))
            if os.path.exists(path + suffix)
        }
        return Storage(sum(sizes.values()), sizes)

    def pg_database(self, tag: str) -> str:
        if self.postgres is None:
            raise RuntimeError("no PostgreSQL configured")
        return str(self.postgres.fresh_database(tag))

    def pg_storage(self, url: str) -> Storage:
        as_written = int(self.postgres.table_bytes(url))
        compacted = int(self.postgres.table_bytes(url, vacuum_full=True))
        return Storage(compacted, {"as_written": as_written, "vacuum_full": compacted})

    def pg_analyze(self, url: str) -> None:
        self.postgres.analyze(url)

    def mongo_storage(self, name: str) -> Storage:
        sizes = self.mongo.database_bytes(name)
        on_disk = int(sizes["storageSize"]) + int(sizes["totalIndexSize"])
        return Storage(on_disk, {"on_disk": on_disk, **{k: int(v) for k, v in sizes.items()}})

    def mongo_database(self, tag: str) -> tuple[str, str]:
        if self.mongo is None or self.mongo.url is None:
            raise RuntimeError("no MongoDB configured")
        name, url = self.mongo.fresh_database(tag)
        return str(name), str(url)


@dataclass
class Storage:
    """Storage of a system's database at one moment, in bytes."""

    primary: int  # what the table reports (pg: after VACUUM FULL; mongo: storage+indexes)
    detail: dict[str, int] = field(default_factory=dict)


class Peer(ABC):
    """One system under test, bound to one database.

    Conversation state that a real application keeps in memory between turns
    (a version token, a session object, a config) is kept by the peer too, so a
    turn costs what it costs in the application.
    """

    key: str  # e.g. "langgraph-pg"
    system: str  # e.g. "LangGraph"
    component: str  # e.g. "AsyncPostgresSaver"
    database: str  # "postgresql" | "mongodb" | "sqlite" | "redis" | "memory"
    distributions: tuple[str, ...] = ()  # whose versions the report names
    turn_shape: str = ""  # how one turn is persisted
    read_shape: str = ""  # how the newest 20 messages are read
    list_shape: str | None = None  # how a tenant's conversations are listed; None: can't
    variants: tuple[str, ...] = ("",)  # turn variants (pai-storage: 2 commits or 1)

    @abstractmethod
    async def open(self, infra: Infra) -> None:
        """Create a fresh database and initialize the system's schema in it."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections."""

    @abstractmethod
    async def start(self, conv: str, tenant: str, variant: str = "") -> None:
        """Create an empty conversation (not timed)."""

    @abstractmethod
    async def turn(self, conv: str, turn: int, user: Msg, reply: Msg) -> None:
        """Persist one turn (timed)."""

    @abstractmethod
    async def seed(self, conv: str, turns: list[tuple[Msg, Msg]]) -> None:
        """Fast-forward ``conv`` by ``turns`` with the system's bulk path (not timed)."""

    @abstractmethod
    async def read_recent(self, conv: str) -> int:
        """Read the newest 20 messages (timed); return how many came back."""

    async def populate(self, tenant: str, count: int, concurrency: int) -> None:
        """Create ``count`` one-turn conversations in ``tenant`` (not timed)."""
        raise NotImplementedError

    async def list_recent(self, tenant: str) -> int:
        """List the 20 most recently updated conversations of ``tenant`` (timed)."""
        raise NotImplementedError

    async def storage(self) -> Storage | None:
        """Bytes used by the system's database now (None: not measurable)."""
        return None

    async def settle(self) -> None:
        """Bring planner statistics up to date (PostgreSQL ``ANALYZE``; untimed).

        Called before each timed window and after bulk loads, for every
        system alike, so that plans are those of a database in steady state
        rather than of tables that autovacuum has not analyzed yet.
        """
        infra: Infra | None = getattr(self, "infra", None)
        url: str = getattr(self, "url", "")
        if self.database == "postgresql" and infra is not None and url:
            await asyncio.to_thread(infra.pg_analyze, url)

    def label(self, variant: str = "") -> str:
        return f"{self.system} {self.component}" + (f" ({variant})" if variant else "")
