"""The MongoDB backend (``mongodb://``, ``mongodb+srv://``) on PyMongo's asyncio API.

Split collections keyed by ``{scopeKey, threadId}``, flat documents, one
multi-document transaction per commit. Needs a replica set or a sharded
cluster. Install with ``pip install 'pai-storage[mongo]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pai_storage import ThreadStore
from pai_storage.backend import Backend, StoreURL

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

    from .store import MongoThreadStore

__all__ = ["MongoBackend", "MongoThreadStore", "backend"]

OPTIONS = frozenset({"db_name", "collection_name", "clock", "on_warning", "token_secret"})


class MongoBackend(Backend):
    """Opens :class:`MongoThreadStore` for ``mongodb://`` and ``mongodb+srv://`` URLs."""

    name = "mongo"
    url_schemes = ("mongodb",)  # "mongodb+srv" is the mongodb scheme with driver "srv"
    extra = "mongo"
    requires = ("pymongo",)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, OPTIONS)
        from .store import MongoThreadStore

        return MongoThreadStore(url, **options)

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import MongoHarness  # test provisioning, imported only by the suite

        return MongoHarness(url)


def __getattr__(name: str) -> Any:
    if name == "MongoThreadStore":
        from .store import MongoThreadStore

        return MongoThreadStore
    raise AttributeError(name)


backend = MongoBackend()
