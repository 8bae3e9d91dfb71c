"""The MongoDB backend (``mongodb://``, ``mongodb+srv://``) on PyMongo's asyncio API.

Threads: split collections keyed by ``{scopeKey, threadId}``, flat documents,
one multi-document transaction per commit (needs a replica set or a sharded
cluster). Every store of one ``connect()`` call (threads, key-value, agent
state, snapshots, guard) shares one
:class:`~pai_storage_mongo.client.MongoClientHolder`, so one ``AsyncMongoClient``.
Install with ``pip install 'pai-storage[mongo]'``. See ``docs/mongodb.md``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pai_storage import ThreadStore
from pai_storage.backend import Backend, ManagedStore, StoreURL

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

    from .client import MongoClientHolder
    from .guard import MongoExecutionGuard
    from .kv import MongoKeyValueStore
    from .snapshots import MongoSnapshotStore
    from .state import MongoAgentStateStore
    from .store import MongoThreadStore

__all__ = [
    "MongoAgentStateStore",
    "MongoBackend",
    "MongoClientHolder",
    "MongoExecutionGuard",
    "MongoKeyValueStore",
    "MongoSnapshotStore",
    "MongoThreadStore",
    "backend",
]

OPTIONS = frozenset(
    {
        "client",
        "db_name",
        "collection_name",
        "collection_prefix",
        "clock",
        "on_warning",
        "token_secret",
    }
)
"""The options of the thread store opened alone."""

CLIENT_OPTIONS = frozenset({"db_name", "collection_prefix", "names"})
"""The options of the shared client (:class:`MongoClientHolder`), beside ``client``."""

_COMMON = ("clock", "on_warning", "token_secret")

_COMPONENTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "threads": ("store", "MongoThreadStore", (*_COMMON, "collection_name")),
    "kv": ("kv", "MongoKeyValueStore", (*_COMMON, "max_value_bytes")),
    "state": ("state", "MongoAgentStateStore", (*_COMMON, "session_ttl", "max_value_bytes")),
    "snapshots": ("snapshots", "MongoSnapshotStore", (*_COMMON, "snapshot_ttl")),
    "guard": (
        "guard",
        "MongoExecutionGuard",
        (*_COMMON, "lock_timeout", "lease_ttl", "retry_interval"),
    ),
}
"""Each component's module, store class and its own options (beside the client's)."""


class MongoBackend(Backend):
    """Opens the MongoDB stores by URL; the runtime stores of one call share one client."""

    name = "mongo"
    url_schemes = ("mongodb",)  # "mongodb+srv" is the mongodb scheme with driver "srv"
    extra = "mongo"
    requires = ("pymongo",)
    components = frozenset(_COMPONENTS)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, OPTIONS)
        from .store import MongoThreadStore

        return MongoThreadStore(url, **options)

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        """One :class:`MongoClientHolder` for every component, the thread store included
        (``client=`` an ``AsyncMongoClient`` is wrapped, never closed); each store
        gets its share of the options."""
        from .client import MongoClientHolder

        return self.open_sharing_client(
            url,
            components,
            options,
            package=__name__,
            stores=_COMPONENTS,
            client_options=CLIENT_OPTIONS,
            make_client=lambda client, **given: MongoClientHolder(url, client=client, **given),
        )

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import MongoHarness  # test provisioning, imported only by the suite

        return MongoHarness(url)


def __getattr__(name: str) -> Any:
    lazy = {
        "MongoThreadStore": ".store",
        "MongoKeyValueStore": ".kv",
        "MongoAgentStateStore": ".state",
        "MongoClientHolder": ".client",
        "MongoSnapshotStore": ".snapshots",
        "MongoExecutionGuard": ".guard",
    }
    if name in lazy:
        return getattr(importlib.import_module(lazy[name], __name__), name)
    raise AttributeError(name)


backend = MongoBackend()
