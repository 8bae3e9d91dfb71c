"""The key-value component of the example backend, on the same stand-in server.

The core's :class:`~pai_storage.KeyValueStore` validates every argument,
checks values, sizes and page tokens, and builds the results; a backend only
stores and finds :class:`~pai_storage.backend.KVRecord` values. Here they live
in one map keyed by ``(namespace path, key)``; a real key-value database would
keep them sorted and answer the range scans with an index.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from pai_storage.backend import (
    KeyValueStore,
    KVRecord,
    VersionMismatch,
    namespace_path,
    system_clock,
    truncate_ms,
)

from .server import Server

__all__ = ["KeyValueItemStore"]


class KeyValueItemStore(KeyValueStore):
    """Items of the example's server; options: the common ones and ``max_value_bytes``."""

    backend_name = "examplekv"
    token_prefix = "pai-kv"

    def __init__(self, *, server: Server | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.server = server or Server()

    def _now(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    def _live(self, now: datetime) -> list[KVRecord]:
        """Every live record, in (namespace path, key) order."""
        live = (r for r in self.server.items.values() if r.expires_at is None or now < r.expires_at)
        return sorted(live, key=lambda r: (namespace_path(r.namespace), r.key))

    def _find(self, namespace: tuple[str, ...], key: str, now: datetime) -> KVRecord | None:
        record = self.server.items.get((namespace, key))
        if record is None or (record.expires_at is not None and record.expires_at <= now):
            return None
        return record

    def _write(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None, now: datetime
    ) -> KVRecord:
        old = self._find(namespace, key, now)
        record = KVRecord(
            namespace=namespace,
            key=key,
            text=text,
            version=old.version + 1 if old else 1,
            created_at=old.created_at if old else now,
            updated_at=now,
            expires_at=now + ttl if ttl is not None else None,
            ttl=ttl,
        )
        self.server.items[(namespace, key)] = record
        return record

    async def _get_many(self, namespace: tuple[str, ...], keys: list[str]) -> list[KVRecord]:
        async with self.server.lock:
            now = self._now()
            return [r for k in keys if (r := self._find(namespace, k, now)) is not None]

    async def _refresh_ttl(self, namespace: tuple[str, ...], key: str) -> KVRecord | None:
        async with self.server.lock:
            now = self._now()
            record = self._find(namespace, key, now)
            if record is not None and record.ttl is not None:
                record = replace(record, expires_at=now + record.ttl)
                self.server.items[(namespace, key)] = record
            return record

    async def _put(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None
    ) -> KVRecord:
        async with self.server.lock:
            return self._write(namespace, key, text, ttl, self._now())

    async def _put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        expected_version: int | None,
    ) -> KVRecord | VersionMismatch:
        async with self.server.lock:  # check and write under one lock: one winner per version
            now = self._now()
            current = self._find(namespace, key, now)
            if (current.version if current else None) != expected_version:
                return VersionMismatch(current)
            return self._write(namespace, key, text, ttl, now)

    async def _delete(
        self, namespace: tuple[str, ...], key: str, expected_version: int | None
    ) -> bool:
        async with self.server.lock:
            current = self._find(namespace, key, self._now())
            if current is None or expected_version not in (None, current.version):
                return False
            del self.server.items[(namespace, key)]
            return True

    async def _search(
        self,
        prefix: tuple[str, ...],
        key_prefix: str,
        after: tuple[tuple[str, ...], str] | None,
        limit: int,
    ) -> list[KVRecord]:
        start = namespace_path(prefix)
        position = None if after is None else (namespace_path(after[0]), after[1])
        async with self.server.lock:
            rows = self._live(self._now())
        found = [
            r
            for r in rows
            if namespace_path(r.namespace).startswith(start)
            and r.key.startswith(key_prefix)
            and (position is None or (namespace_path(r.namespace), r.key) > position)
        ]
        return found[:limit]

    async def _list_keys(
        self, namespace: tuple[str, ...], prefix: str, after: str | None, limit: int
    ) -> list[str]:
        async with self.server.lock:
            rows = self._live(self._now())
        keys = [
            r.key
            for r in rows
            if r.namespace == namespace
            and r.key.startswith(prefix)
            and (after is None or r.key > after)
        ]
        return keys[:limit]

    async def _list_namespaces(
        self,
        prefix: tuple[str, ...],
        max_depth: int | None,
        after: tuple[str, ...] | None,
        limit: int,
    ) -> list[tuple[str, ...]]:
        async with self.server.lock:
            rows = self._live(self._now())
        found = {r.namespace[:max_depth] for r in rows if r.namespace[: len(prefix)] == prefix}
        ordered = sorted(found, key=namespace_path)
        if after is not None:
            ordered = [ns for ns in ordered if namespace_path(ns) > namespace_path(after)]
        return ordered[:limit]

    async def _purge_expired(self) -> int:
        async with self.server.lock:
            now = self._now()
            expired = [
                k for k, r in self.server.items.items() if r.expires_at and r.expires_at <= now
            ]
            for k in expired:
                del self.server.items[k]
            return len(expired)
