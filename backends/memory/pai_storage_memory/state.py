"""The in-memory agent-state store: the reference model of the contract."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from pai_storage.backend import ENUMERATE, system_clock, truncate_ms
from pai_storage.state import (
    ANONYMOUS_USER,
    AgentStateStore,
    ListHead,
    ListWrite,
    SessionKey,
    StaleVersion,
    StoredKind,
    VersionedState,
)

__all__ = ["MemoryAgentStateStore"]


@dataclass
class _List:
    texts: list[str]
    hash: str


@dataclass
class _Session:
    expires_at: datetime | None
    # Every state is kept as its canonical JSON text: reading parses a fresh
    # copy, so no caller ever shares an object with the store.
    values: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (text, version)
    lists: dict[str, _List] = field(default_factory=dict)

    def empty(self) -> bool:
        return not self.values and not self.lists


class MemoryAgentStateStore(AgentStateStore):
    """Agent state kept in process memory; the reference backend.

    Every operation runs under one per-store lock, so each is atomic. Expiry
    is exact on the store's clock (the test clock, else the process clock);
    an expired session stays in memory until :meth:`purge_expired` (or a
    write to it) removes it, but no operation sees it. Nothing survives the
    process.

    Accepts the options of :class:`~pai_storage.state.AgentStateStore`
    (``clock``, ``on_warning``, ``token_secret``, ``session_ttl``,
    ``max_value_bytes``).
    """

    backend_name = "memory"
    token_prefix = "pai-memory"
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._users: dict[str, dict[str, _Session]] = {}
        # A threading lock: every critical section is synchronous, so the store
        # is also safe when shared by several event loops or threads.
        self._lock = threading.Lock()

    def _clock(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    @staticmethod
    def _live(stored: _Session | None, now: datetime) -> _Session | None:
        if stored is None or (stored.expires_at is not None and stored.expires_at <= now):
            return None
        return stored

    def _read(self, session: SessionKey) -> _Session | None:
        return self._live(self._users.get(session.user, {}).get(session.session), self._clock())

    def _for_write(self, session: SessionKey) -> _Session:
        """The live session, or a fresh one in place of an absent or expired one."""
        now = self._clock()
        sessions = self._users.setdefault(session.user, {})
        current = self._live(sessions.get(session.session), now)
        if current is None:
            current = sessions[session.session] = _Session(expires_at=None)
        current.expires_at = self.session_expiry(now)
        return current

    def _drop(self, session: SessionKey) -> None:
        sessions = self._users.get(session.user, {})
        sessions.pop(session.session, None)
        if not sessions:
            self._users.pop(session.user, None)

    # ------------------------------------------------------------ single values

    async def _save_value(
        self,
        session: SessionKey,
        key: str,
        value: Any,
        text: str,
        expected_version: int | None,
    ) -> int | StoredKind | StaleVersion:
        with self._lock:
            current = self._read(session)
            if current is not None and key in current.lists:
                return StoredKind.LIST
            stored = None if current is None else current.values.get(key)
            version = 0 if stored is None else stored[1]
            if expected_version is not None and expected_version != version:
                return StaleVersion(version)
            self._for_write(session).values[key] = (text, version + 1)
            return version + 1

    async def _get_value(self, session: SessionKey, key: str) -> VersionedState | StoredKind | None:
        with self._lock:
            current = self._read(session)
            if current is None:
                return None
            if key in current.lists:
                return StoredKind.LIST
            stored = current.values.get(key)
            if stored is None:
                return None
            return VersionedState.model_construct(value=json.loads(stored[0]), version=stored[1])

    # ------------------------------------------------------------ lists

    async def _list_head(self, session: SessionKey, key: str) -> ListHead | StoredKind | None:
        with self._lock:
            current = self._read(session)
            if current is None:
                return None
            if key in current.values:
                return StoredKind.VALUE
            stored = current.lists.get(key)
            return None if stored is None else ListHead(len(stored.texts), stored.hash)

    async def _write_list(
        self, session: SessionKey, key: str, write: ListWrite
    ) -> bool | StoredKind:
        with self._lock:
            current = self._read(session)
            if current is not None and key in current.values:
                return StoredKind.VALUE
            stored = None if current is None else current.lists.get(key)
            head = None if stored is None else ListHead(len(stored.texts), stored.hash)
            if head != write.expect:
                return False
            lists = self._for_write(session).lists
            if stored is None or write.replace:
                lists[key] = _List(list(write.texts), write.head.hash)
            else:
                stored.texts.extend(write.texts)
                stored.hash = write.head.hash
            return True

    async def _get_list(self, session: SessionKey, key: str) -> list[Any] | StoredKind | None:
        with self._lock:
            current = self._read(session)
            if current is None:
                return None
            if key in current.values:
                return StoredKind.VALUE
            stored = current.lists.get(key)
            return None if stored is None else [json.loads(text) for text in stored.texts]

    # ------------------------------------------------------------ sessions

    async def _exists(self, session: SessionKey) -> bool:
        with self._lock:
            return self._read(session) is not None

    async def _delete(self, session: SessionKey) -> bool:
        with self._lock:
            existed = self._read(session) is not None
            self._drop(session)  # an expired one goes too: it is garbage either way
            return existed

    async def _delete_state(self, session: SessionKey, key: str) -> bool:
        with self._lock:
            current = self._read(session)
            if current is None or (key not in current.values and key not in current.lists):
                return False
            current = self._for_write(session)
            current.values.pop(key, None)
            current.lists.pop(key, None)
            if current.empty():
                self._drop(session)
            return True

    async def _list_session_ids(self, user: str, after: str | None, limit: int) -> list[str]:
        with self._lock:
            now = self._clock()
            ids = sorted(
                session_id
                for session_id, stored in self._users.get(user, {}).items()
                if self._live(stored, now) is not None and (after is None or session_id > after)
            )
            return ids[:limit]

    async def _erase_scope(self, user: str) -> int:
        with self._lock:
            return len(self._users.pop(user, {}))

    async def _purge_expired(self) -> int:
        with self._lock:
            now = self._clock()
            count = 0
            for user in list(self._users):
                sessions = self._users[user]
                for session_id in [s for s, v in sessions.items() if self._live(v, now) is None]:
                    del sessions[session_id]
                    count += 1
                if not sessions:
                    del self._users[user]
            return count

    # ------------------------------------------------------------ enumeration

    async def _list_sessions(
        self, after: tuple[str | None, str] | None, limit: int
    ) -> list[tuple[str | None, str]]:
        # The anonymous user first, then users by code point: a real user id
        # may sort before the anonymous key ("\x01..."), so order by _order.
        start = None if after is None else _order(after)
        with self._lock:
            now = self._clock()
            found: list[tuple[str | None, str]] = []
            for user in sorted(self._users, key=lambda u: _order((_user_id(u), ""))):
                user_id = _user_id(user)
                if start is not None and _order((user_id, "")) < start[:2]:
                    continue
                sessions = self._users[user]
                for session_id in sorted(sessions):
                    if start is not None and _order((user_id, session_id)) <= start:
                        continue
                    if self._live(sessions[session_id], now) is None:
                        continue
                    found.append((user_id, session_id))
                    if len(found) >= limit:
                        return found
            return found

    async def _session_keys(
        self, user_id: str | None, session_id: str
    ) -> tuple[list[str], list[str]]:
        with self._lock:
            user = ANONYMOUS_USER if user_id is None else user_id
            current = self._read(SessionKey(user, session_id))
            if current is None:
                return [], []
            return sorted(current.values), sorted(current.lists)


def _user_id(user: str) -> str | None:
    return None if user == ANONYMOUS_USER else user


def _order(pair: tuple[str | None, str]) -> tuple[bool, str, str]:
    """The enumeration order of a ``(user_id, session_id)`` pair: ``None`` first."""
    return (pair[0] is not None, pair[0] or "", pair[1])
