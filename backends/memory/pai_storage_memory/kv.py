"""The in-memory key-value store: one dict, one lock, values kept as canonical JSON text."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from pai_storage.backend import Clock, WarningCallback, system_clock, truncate_ms
from pai_storage.kv import (
    DEFAULT_MAX_VALUE_BYTES,
    KeyValueStore,
    KVRecord,
    VersionMismatch,
    namespace_path,
)

__all__ = ["MemoryKeyValueStore"]

_Address = tuple[tuple[str, ...], str]


@dataclass(frozen=True, slots=True)
class _Entry:
    text: str
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    ttl: timedelta | None

    def live(self, now: datetime) -> bool:
        return self.expires_at is None or now < self.expires_at


class MemoryKeyValueStore(KeyValueStore):
    """Key-value items kept in process memory; the reference backend.

    Every operation is one critical section under a per-store lock, so
    conditional writes are atomic. Values are stored as their canonical JSON
    text (immutable), so nothing a caller holds is shared with the store.
    Expiry is exact on the store's clock (the test ``clock`` or the process
    clock, in milliseconds); expired entries stay until :meth:`purge_expired`
    but are absent to every operation. Nothing survives the process.

    Options: ``clock``, ``on_warning``, ``token_secret``, ``max_value_bytes``
    (no hard limit).
    """

    backend_name = "memory"
    token_prefix = "pai-memory"

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        super().__init__(
            clock=clock,
            on_warning=on_warning,
            token_secret=token_secret,
            max_value_bytes=max_value_bytes,
        )
        self._entries: dict[_Address, _Entry] = {}
        # A threading lock: every critical section is synchronous, so the store
        # is also safe when shared by several event loops or threads.
        self._lock = threading.Lock()

    def _clock(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    def _live(self, address: _Address, now: datetime) -> _Entry | None:
        entry = self._entries.get(address)
        return entry if entry is not None and entry.live(now) else None

    def _write(
        self, address: _Address, text: str, ttl: timedelta | None, now: datetime
    ) -> KVRecord:
        previous = self._live(address, now)
        entry = _Entry(
            text=text,
            version=1 if previous is None else previous.version + 1,
            created_at=now if previous is None else previous.created_at,
            updated_at=now,
            expires_at=None if ttl is None else now + ttl,
            ttl=ttl,
        )
        self._entries[address] = entry
        return _record(address, entry)

    def _sorted_live(self, now: datetime) -> Iterator[tuple[str, str, _Address, _Entry]]:
        """Live entries as (namespace path, key, address, entry), in the store's order."""
        rows = [
            (namespace_path(address[0]), address[1], address, entry)
            for address, entry in self._entries.items()
            if entry.live(now)
        ]
        rows.sort(key=lambda row: (row[0], row[1]))
        return iter(rows)

    # ------------------------------------------------------------ hooks

    async def _get_many(self, namespace: tuple[str, ...], keys: list[str]) -> list[KVRecord]:
        with self._lock:
            now = self._clock()
            found = ((key, self._live((namespace, key), now)) for key in keys)
            return [_record((namespace, key), entry) for key, entry in found if entry is not None]

    async def _refresh_ttl(self, namespace: tuple[str, ...], key: str) -> KVRecord | None:
        address = (namespace, key)
        with self._lock:
            now = self._clock()
            entry = self._live(address, now)
            if entry is None:
                return None
            if entry.ttl is not None:
                entry = _Entry(
                    entry.text,
                    entry.version,
                    entry.created_at,
                    entry.updated_at,
                    now + entry.ttl,
                    entry.ttl,
                )
                self._entries[address] = entry
            return _record(address, entry)

    async def _put(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None
    ) -> KVRecord:
        with self._lock:
            return self._write((namespace, key), text, ttl, self._clock())

    async def _put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        expected_version: int | None,
    ) -> KVRecord | VersionMismatch:
        address = (namespace, key)
        with self._lock:
            now = self._clock()
            current = self._live(address, now)
            version = None if current is None else current.version
            if version != expected_version:
                return VersionMismatch(None if current is None else _record(address, current))
            return self._write(address, text, ttl, now)

    async def _delete(
        self, namespace: tuple[str, ...], key: str, expected_version: int | None
    ) -> bool:
        address = (namespace, key)
        with self._lock:
            current = self._live(address, self._clock())
            if current is None:
                return False
            if expected_version is not None and current.version != expected_version:
                return False
            del self._entries[address]
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
        out: list[KVRecord] = []
        with self._lock:
            for path, key, address, entry in self._sorted_live(self._clock()):
                if len(out) == limit:
                    break
                if not path.startswith(start) or not key.startswith(key_prefix):
                    continue
                if position is not None and (path, key) <= position:
                    continue
                out.append(_record(address, entry))
        return out

    async def _list_keys(
        self, namespace: tuple[str, ...], prefix: str, after: str | None, limit: int
    ) -> list[str]:
        with self._lock:
            now = self._clock()
            keys = sorted(
                key
                for (ns, key), entry in self._entries.items()
                if ns == namespace and key.startswith(prefix) and entry.live(now)
            )
        if after is not None:
            keys = [key for key in keys if key > after]
        return keys[:limit]

    async def _list_namespaces(
        self,
        prefix: tuple[str, ...],
        max_depth: int | None,
        after: tuple[str, ...] | None,
        limit: int,
    ) -> list[tuple[str, ...]]:
        size = len(prefix)
        with self._lock:
            now = self._clock()
            found = {
                ns[:max_depth]
                for (ns, _key), entry in self._entries.items()
                if ns[:size] == prefix and entry.live(now)
            }
        ordered = sorted(found, key=namespace_path)
        if after is not None:
            bound = namespace_path(after)
            ordered = [ns for ns in ordered if namespace_path(ns) > bound]
        return ordered[:limit]

    async def _erase_scope(self, scope: str) -> int:
        with self._lock:
            erased = [address for address in self._entries if address[0][:1] == (scope,)]
            for address in erased:
                del self._entries[address]
            return len(erased)

    async def _purge_expired(self) -> int:
        with self._lock:
            now = self._clock()
            expired = [address for address, entry in self._entries.items() if not entry.live(now)]
            for address in expired:
                del self._entries[address]
            return len(expired)


def _record(address: _Address, entry: _Entry) -> KVRecord:
    return KVRecord(
        namespace=address[0],
        key=address[1],
        text=entry.text,
        version=entry.version,
        created_at=entry.created_at,
        updated_at=entry.updated_at,
        expires_at=entry.expires_at,
        ttl=entry.ttl,
    )
