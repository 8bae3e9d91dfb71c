"""The embedded in-memory backend (``memory://``): the reference model, for tests and demos.

It provides every component (see ``docs/bundle.md``): threads, key-value store,
agent state, snapshots and execution guard, each kept in process memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pai_storage import ThreadStore
from pai_storage.backend import Backend, ManagedStore, StoreURL
from pai_storage.errors import ThreadStoreConfigurationError

from .guard import MemoryExecutionGuard
from .kv import MemoryKeyValueStore
from .snapshots import MemorySnapshotStore
from .state import MemoryAgentStateStore
from .store import MemoryThreadStore

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

__all__ = [
    "MemoryAgentStateStore",
    "MemoryBackend",
    "MemoryExecutionGuard",
    "MemoryKeyValueStore",
    "MemorySnapshotStore",
    "MemoryThreadStore",
    "backend",
]

_COMMON = ("clock", "on_warning", "token_secret")

_FACTORIES: dict[str, tuple[Callable[..., ManagedStore], tuple[str, ...]]] = {
    "threads": (MemoryThreadStore, _COMMON),
    "kv": (MemoryKeyValueStore, (*_COMMON, "max_value_bytes")),
    "state": (MemoryAgentStateStore, (*_COMMON, "session_ttl", "max_value_bytes")),
    "snapshots": (MemorySnapshotStore, (*_COMMON, "snapshot_ttl")),
    "guard": (MemoryExecutionGuard, (*_COMMON, "lock_timeout", "lease_ttl", "retry_interval")),
}
"""Each component's store class and the options it takes."""


def _check_url(url: StoreURL) -> None:
    if url.host or url.path.strip("/") or url.query:
        raise ThreadStoreConfigurationError("memory:// takes no host, path or query")


class MemoryBackend(Backend):
    name = "memory"
    url_schemes = ("memory",)
    components = frozenset(_FACTORIES)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        return self._open_components(url, ["threads"], **options)["threads"]  # type: ignore[return-value]

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        _check_url(url)
        shares = self.split_options(url, options, {c: _FACTORIES[c][1] for c in components})
        return {c: _FACTORIES[c][0](**shares[c]) for c in components}

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import MemoryHarness  # test provisioning, imported only by the suite

        return MemoryHarness()


backend = MemoryBackend()
