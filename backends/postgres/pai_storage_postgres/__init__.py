"""The PostgreSQL backend (``postgresql://``, ``postgres://``, ``postgresql+asyncpg://``).

Install with ``pip install 'pai-storage[postgres]'`` (asyncpg). See
``docs/postgres.md`` for set-up, schema, indexes and operations. The
conformance harness is :mod:`pai_storage_postgres.harness`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pai_storage import ThreadStore
from pai_storage.backend import Backend, ManagedStore, StoreURL

from .client import POOL_OPTIONS, PgClient
from .kv import PostgresKeyValueStore
from .schema import SCHEMA_VERSION, Tables
from .state import PostgresAgentStateStore
from .store import PostgresThreadStore

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

__all__ = [
    "SCHEMA_VERSION",
    "PgClient",
    "PostgresAgentStateStore",
    "PostgresBackend",
    "PostgresKeyValueStore",
    "PostgresThreadStore",
    "Tables",
    "backend",
]

_COMMON = ("clock", "on_warning", "token_secret")

_COMPONENTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "threads": ("store", "PostgresThreadStore", _COMMON),
    "kv": ("kv", "PostgresKeyValueStore", (*_COMMON, "max_value_bytes")),
    "state": ("state", "PostgresAgentStateStore", (*_COMMON, "session_ttl", "max_value_bytes")),
    "snapshots": ("snapshots", "PostgresSnapshotStore", (*_COMMON, "snapshot_ttl")),
    "guard": (
        "guard",
        "PostgresExecutionGuard",
        (*_COMMON, "lock_timeout", "lease_ttl", "retry_interval"),
    ),
}
"""Each component's module, store class and its own options (beside the pool's)."""

OPTIONS = frozenset({*POOL_OPTIONS, "client", *_COMMON})
"""The options of the thread store opened alone."""


def _available() -> frozenset[str]:
    """The components whose modules this installation ships."""
    found = set()
    for component, (module, cls, _) in _COMPONENTS.items():
        try:
            loaded = importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError:
            continue
        if hasattr(loaded, cls):
            found.add(component)
    return frozenset(found)


class PostgresBackend(Backend):
    """Opens the PostgreSQL stores by URL; the stores of one call share one pool."""

    name = "postgres"
    url_schemes = ("postgresql", "postgres")
    extra = "postgres"
    requires = ("asyncpg",)
    components = _available()

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, OPTIONS)
        return PostgresThreadStore(url, **options)

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        """One :class:`PgClient` for every component (``client=`` an ``asyncpg.Pool``
        is wrapped, never closed); each store gets its share of the options."""
        return self.open_sharing_client(
            url,
            components,
            options,
            package=__name__,
            stores=_COMPONENTS,
            client_options=POOL_OPTIONS,
            make_client=lambda pool, **given: PgClient(url, pool=pool, **given),
        )

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import PostgresHarness  # test provisioning, imported only by the suite

        return PostgresHarness(url)


backend = PostgresBackend()
