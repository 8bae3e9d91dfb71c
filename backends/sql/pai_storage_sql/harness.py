"""Conformance provisioning for the SQL backend: every store in its own namespace.

SQLite: a fresh database file per store, beside the file the URL names (or in
a temporary directory), removed afterwards; each is a copy of one file whose
schema the harness created at start (creating it costs more than copying it);
``sqlite:///:memory:`` gives each store its own in-memory database.
MySQL/MariaDB: a fresh table prefix per store in the URL's database. Creating
a prefix's tables costs MariaDB about half a second of DDL, so a prefix whose
store is done is emptied (every row deleted, auto-increment counters reset)
and handed to the next store: to that store it is indistinguishable from a
fresh one. Every prefix is dropped when the harness closes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pai_storage_conformance.provision import TestHarness

from pai_storage import ThreadStore
from pai_storage.backend import Clock, StoreURL, make_url, redact
from pai_storage.errors import ThreadStoreUnavailableError

from . import backend as sql_backend
from .client import SqlClient
from .store import SqlThreadStore

__all__ = ["DEFAULT_TEST_URL", "SqlHarness"]

DEFAULT_TEST_URL = "sqlite:///:memory:"
"""Where the conformance harness puts stores when no URL is given."""


class SqlHarness(TestHarness):
    """Conformance stores, each in a fresh SQLite file or MySQL table prefix."""

    def __init__(self, url: str | None = None) -> None:
        self.url: StoreURL = make_url(url or DEFAULT_TEST_URL)
        probe = SqlClient.shared(self.url)
        self.dialect = probe.dialect
        self.memory = probe.memory
        self._directory: str | None = None
        self._template: str | None = None
        """SQLite: a database file with a fresh schema, copied for each store."""
        self._server: str | None = None
        self._free: list[str] = []
        """MySQL prefixes whose tables exist and are empty, ready for the next store."""
        self._made: list[str] = []
        """Every MySQL prefix this harness created (dropped by :meth:`aclose`)."""

    @property
    def components(self) -> frozenset[str]:  # type: ignore[override]
        """Every component this installation ships."""
        return sql_backend.components

    async def start(self) -> None:
        if self.dialect == "sqlite" and not self.memory:
            self._directory = _scratch_directory(self.url.path[1:])
        url = self._url()
        options = {"table_prefix": self._prefix()} if self.dialect == "mysql" else {}
        client = SqlClient.attached(url, **options)
        try:
            await client.ready()
            self._server = client.server_version
            if self.dialect == "mysql":
                await self._drop_prefix(client)
        except Exception as exc:
            raise ThreadStoreUnavailableError(
                f"cannot reach the database at {self.url} "
                f"({type(exc).__name__}: {redact(str(exc), self.url)}); start the server or "
                "pass --pai-url / PAI_TEST_SQL_URL"
            ) from None
        finally:
            await client.release()
        if self._directory is not None:
            # The probe's file holds a fresh schema: each store gets a copy of it
            # (its last connection closed, everything is in the main file).
            path = url.path[1:]
            if _settled(path):
                self._template = path

    async def aclose(self) -> None:
        made, self._made, self._free = self._made, [], []
        for prefix in made:
            client = SqlClient.attached(self.url, table_prefix=prefix)
            try:
                await self._drop_prefix(client)
            finally:
                await client.release()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = self._template = None

    def describe(self) -> str:
        return f"{self._server or '?'} at {self.url}"

    def _url(self) -> StoreURL:
        """A fresh database for one store (SQLite), or the server's database (MySQL)."""
        if self.dialect == "sqlite" and self._directory is not None:
            path = os.path.join(self._directory, f"{uuid.uuid4().hex[:16]}.db")
            if self._template is not None:
                shutil.copyfile(self._template, path)
            return make_url(f"sqlite:///{path}")
        return self.url

    def _prefix(self) -> str:
        return f"t{uuid.uuid4().hex[:16]}"

    @asynccontextmanager
    async def _namespace(self) -> AsyncIterator[dict[str, Any]]:
        url = self._url()
        options: dict[str, Any] = {}
        if self.dialect == "mysql":
            if self._free:
                options["table_prefix"] = self._free.pop()
            else:
                options["table_prefix"] = self._prefix()
                self._made.append(options["table_prefix"])
        try:
            yield {"url": url, **options}
        finally:
            if self.dialect == "mysql":
                await self._recycle(url, options["table_prefix"])
            elif url.path and url is not self.url:
                _remove_database(url.path[1:])

    async def _recycle(self, url: StoreURL, prefix: str) -> None:
        """Empty a used prefix's tables and offer it to the next store."""
        from sqlalchemy import delete, text

        client = SqlClient.attached(url, table_prefix=prefix)
        try:
            engines = await client.ready()
            version = client.tables.version
            async with engines.writer.begin() as conn:
                for table in reversed(client.tables.metadata.sorted_tables):
                    if table is version:
                        continue
                    await conn.execute(delete(table))
                    if table.autoincrement_column is not None:
                        await conn.execute(text(f"ALTER TABLE `{table.name}` AUTO_INCREMENT = 1"))
        except Exception:
            return  # left out of the pool (aclose drops it)
        finally:
            await client.release()
        self._free.append(prefix)

    async def _drop_prefix(self, client: SqlClient) -> None:
        engines = await client.ready()
        async with engines.writer.begin() as conn:
            await conn.run_sync(client.tables.metadata.drop_all)

    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        async with self._namespace() as ns:
            url = ns.pop("url")
            async with SqlThreadStore(url, clock=clock, **ns) as store:
                yield store

    @asynccontextmanager
    async def component(self, name: str, clock: Clock | None = None) -> AsyncIterator[Any]:
        if name == "threads":
            async with self.store(clock) as store:
                yield store
            return
        async with self._namespace() as ns:
            url = ns.pop("url")
            opened = sql_backend.open_components(url, [name], clock=clock, **ns)[name]
            async with opened:
                yield opened


def _scratch_directory(path: str) -> str:
    """A new directory beside the database file ``path`` names, for the stores' files."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="pai-sql-", dir=parent)


def _settled(path: str) -> bool:
    """Whether a closed SQLite database is whole in its main file (no WAL left)."""
    wal = path + "-wal"
    return not os.path.exists(wal) or os.path.getsize(wal) == 0


def _remove_database(path: str) -> None:
    """Remove a SQLite database file and its WAL and shared-memory files."""
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
