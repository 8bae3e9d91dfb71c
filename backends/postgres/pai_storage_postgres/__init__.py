"""The PostgreSQL backend (``postgresql://``, ``postgres://``, ``postgresql+asyncpg://``).

Install with ``pip install 'pai-storage[postgres]'`` (asyncpg). See
``docs/postgres.md`` for set-up, schema, indexes and operations. The
conformance harness is :mod:`pai_storage_postgres.harness`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pai_storage import ThreadStore
from pai_storage.backend import Backend, StoreURL

from .schema import SCHEMA_VERSION, Tables
from .store import PostgresThreadStore

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

__all__ = [
    "SCHEMA_VERSION",
    "PostgresBackend",
    "PostgresThreadStore",
    "Tables",
    "backend",
]

OPTIONS = frozenset(
    {
        "table_prefix",
        "schema",
        "min_pool_size",
        "max_pool_size",
        "connect_timeout",
        "command_timeout",
        "statement_cache_size",
        "clock",
        "on_warning",
        "token_secret",
    }
)


class PostgresBackend(Backend):
    """Opens :class:`PostgresThreadStore` instances by URL."""

    name = "postgres"
    url_schemes = ("postgresql", "postgres")
    extra = "postgres"
    requires = ("asyncpg",)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, OPTIONS)
        return PostgresThreadStore(url, **options)

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import PostgresHarness  # test provisioning, imported only by the suite

        return PostgresHarness(url)


backend = PostgresBackend()
