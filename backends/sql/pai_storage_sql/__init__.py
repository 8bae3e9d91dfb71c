"""The SQL backend: SQLite (``sqlite://``) and MariaDB/MySQL (``mysql://``, ``mariadb://``).

Built on SQLAlchemy 2 Core with its asyncio extension. Install with
``pip install 'pai-storage[sql]'`` (SQLAlchemy, aiosqlite) or
``pip install 'pai-storage[mysql]'`` (adds asyncmy). See ``docs/sql.md`` for
set-up, URLs, options, schema and concurrency. The conformance harness is
:mod:`pai_storage_sql.harness`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pai_storage.backend import Backend, ManagedStore, StoreURL

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

    from pai_storage import ThreadStore

    from .client import SqlClient
    from .guard import SqlExecutionGuard
    from .kv import SqlKeyValueStore
    from .snapshots import SqlSnapshotStore
    from .state import SqlAgentStateStore
    from .store import SqlThreadStore

__all__ = [
    "SqlAgentStateStore",
    "SqlBackend",
    "SqlClient",
    "SqlExecutionGuard",
    "SqlKeyValueStore",
    "SqlSnapshotStore",
    "SqlThreadStore",
    "backend",
]

_LAZY = {
    "SqlThreadStore": "store",
    "SqlClient": "client",
    "SqlKeyValueStore": "kv",
    "SqlAgentStateStore": "state",
    "SqlSnapshotStore": "snapshots",
    "SqlExecutionGuard": "guard",
}


def __getattr__(name: str) -> Any:
    """The store and client classes, imported on first use (they import SQLAlchemy)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


_COMMON = ("clock", "on_warning", "token_secret")

CLIENT_OPTIONS = (
    "table_prefix",
    "names",
    "busy_timeout",
    "pool_size",
    "connect_timeout",
    "retry_attempts",
)
"""The options of the shared client (every SQL store takes them)."""

_COMPONENTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "threads": ("store", "SqlThreadStore", _COMMON),
    "kv": ("kv", "SqlKeyValueStore", (*_COMMON, "max_value_bytes")),
    "state": ("state", "SqlAgentStateStore", (*_COMMON, "session_ttl", "max_value_bytes")),
    "snapshots": ("snapshots", "SqlSnapshotStore", (*_COMMON, "snapshot_ttl")),
    "guard": (
        "guard",
        "SqlExecutionGuard",
        (*_COMMON, "lock_timeout", "lease_ttl", "retry_interval"),
    ),
}
"""Each component's module, store class and its own options (beside the client's)."""


def _available() -> frozenset[str]:
    """The components whose modules this installation ships (found, not imported:
    importing them would import SQLAlchemy)."""
    return frozenset(
        component
        for component, (module, _, _) in _COMPONENTS.items()
        if importlib.util.find_spec(f"{__name__}.{module}") is not None
    )


class SqlBackend(Backend):
    """Opens the SQL stores by URL; the stores of one call share one client."""

    name = "sql"
    url_schemes = ("sqlite", "mysql", "mariadb")
    extra = "sql"
    requires = ("sqlalchemy", "aiosqlite")

    @property
    def components(self) -> frozenset[str]:  # type: ignore[override]
        return _available()

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        from .store import SqlThreadStore

        # ``names`` renames runtime tables only: a thread store alone has no use for it.
        accepted = {*CLIENT_OPTIONS, "client", *_COMMON} - {"names"}
        self.check_options(url, options, accepted)
        return SqlThreadStore(url, **options)

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        """One :class:`~pai_storage_sql.client.SqlClient` for every component;
        each store gets its share of the options."""
        return self.open_sharing_client(
            url,
            components,
            options,
            package=__name__,
            stores=_COMPONENTS,
            client_options=CLIENT_OPTIONS,
            make_client=lambda client, **given: _shared_client(url, client, given),
        )

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import SqlHarness  # test provisioning, imported only by the suite

        return SqlHarness(url)


def _shared_client(url: StoreURL, given: object, options: dict[str, Any]) -> Any:
    """The client the components share: made here (closed by the last store), over
    the application's own ``AsyncEngine`` (never disposed), or the application's
    :class:`~pai_storage_sql.client.SqlClient` (never closed by the stores)."""
    from .client import SqlClient

    return SqlClient.shared(url, given, **options)


backend = SqlBackend()
