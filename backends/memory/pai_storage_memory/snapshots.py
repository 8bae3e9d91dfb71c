"""The in-memory snapshot store: the reference model of the contract."""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from pai_storage.backend import ENUMERATE, system_clock, truncate_ms
from pai_storage.snapshots import Snapshot, SnapshotDraft, SnapshotInfo, SnapshotStore

__all__ = ["MemorySnapshotStore"]


@dataclass
class _Stored:
    info: SnapshotInfo
    data: bytes

    def live(self, now: datetime) -> bool:
        return self.info.expires_at is None or self.info.expires_at > now

    def order(self) -> tuple[datetime, str]:
        return self.info.created_at, self.info.snapshot_id


class MemorySnapshotStore(SnapshotStore):
    """Snapshots kept in process memory; the reference backend. No size limit.

    Every operation runs under one per-store lock. Expiry is exact on the
    store's clock (the test clock, else the process clock); an expired
    snapshot stays in memory until :meth:`purge_expired` (or a ``put`` with
    its id) removes it, but no operation sees it. The data is ``bytes``
    (immutable), metadata is copied in and out. Nothing survives the process.

    Accepts the options of :class:`~pai_storage.snapshots.SnapshotStore`
    (``clock``, ``on_warning``, ``token_secret``, ``snapshot_ttl``).
    """

    backend_name = "memory"
    token_prefix = "pai-memory"
    max_snapshot_bytes: ClassVar[int | None] = None
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._scopes: dict[str, dict[str, _Stored]] = {}
        self._lock = threading.Lock()

    def _clock(self) -> datetime:
        return self.now() or truncate_ms(system_clock())

    def _live(self, scope: str, now: datetime) -> list[_Stored]:
        return [s for s in self._scopes.get(scope, {}).values() if s.live(now)]

    @staticmethod
    def _out(stored: _Stored) -> Snapshot:
        return Snapshot.model_construct(info=copy.deepcopy(stored.info), data=stored.data)

    async def _put(self, draft: SnapshotDraft) -> SnapshotInfo:
        with self._lock:
            now = self._clock()
            info = draft.info(now, self.snapshot_expiry(now))
            self._scopes.setdefault(draft.scope, {})[draft.snapshot_id] = _Stored(info, draft.data)
            return copy.deepcopy(info)

    async def _get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        with self._lock:
            stored = self._scopes.get(scope, {}).get(snapshot_id)
            return self._out(stored) if stored and stored.live(self._clock()) else None

    async def _latest(self, scope: str) -> Snapshot | None:
        with self._lock:
            live = self._live(scope, self._clock())
            return self._out(max(live, key=_Stored.order)) if live else None

    async def _list(
        self, scope: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[SnapshotInfo]:
        with self._lock:
            live = sorted(self._live(scope, self._clock()), key=_Stored.order, reverse=True)
            if after is not None:
                live = [s for s in live if s.order() < after]
            return [copy.deepcopy(s.info) for s in live[:limit]]

    async def _delete(self, scope: str, snapshot_id: str) -> bool:
        with self._lock:
            snapshots = self._scopes.get(scope, {})
            stored = snapshots.pop(snapshot_id, None)  # an expired one goes too: garbage either way
            if not snapshots:
                self._scopes.pop(scope, None)
            return stored is not None and stored.live(self._clock())

    async def _erase_scope(self, scope: str) -> int:
        with self._lock:
            return len(self._scopes.pop(scope, {}))

    async def _purge_expired(self) -> int:
        with self._lock:
            now = self._clock()
            count = 0
            for scope in list(self._scopes):
                snapshots = self._scopes[scope]
                for snapshot_id in [i for i, s in snapshots.items() if not s.live(now)]:
                    del snapshots[snapshot_id]
                    count += 1
                if not snapshots:
                    del self._scopes[scope]
            return count

    async def _list_scopes(self, after: str | None, limit: int) -> list[str]:
        with self._lock:
            now = self._clock()
            scopes = sorted(
                scope
                for scope in self._scopes
                if (after is None or scope > after) and self._live(scope, now)
            )
            return scopes[:limit]
