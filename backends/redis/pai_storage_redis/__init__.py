"""The Redis backend (``redis://``, ``rediss://``): the runtime stores, not threads.

Install with ``pip install 'pai-storage[redis]'`` (redis-py). It provides the
key-value store, agent state, snapshots (up to 64 MiB) and the execution
guard, each operation one Lua script on redis-py's asyncio client; it does not
provide the thread store (``connect()`` and the conformance suite report it as
not provided). See ``docs/redis.md`` for the key layout and what each Redis
persistence setting guarantees. The conformance harness is
:mod:`pai_storage_redis.harness`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pai_storage import StoreInfo, ThreadStore
from pai_storage.backend import Backend, ManagedStore, StoreURL
from pai_storage.errors import ThreadStoreConfigurationError

if TYPE_CHECKING:
    from pai_storage_conformance.provision import TestHarness

__all__ = ["RedisBackend", "backend"]

_COMMON = ("clock", "on_warning", "token_secret")

_COMPONENTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "kv": ("kv", "RedisKeyValueStore", (*_COMMON, "max_value_bytes")),
    "state": ("state", "RedisAgentStateStore", (*_COMMON, "session_ttl", "max_value_bytes")),
    "snapshots": ("snapshots", "RedisSnapshotStore", (*_COMMON, "snapshot_ttl")),
    "guard": (
        "guard",
        "RedisExecutionGuard",
        (*_COMMON, "lock_timeout", "lease_ttl", "retry_interval"),
    ),
}
"""Each component's module, store class and its own options (beside the client's)."""

_CLIENT = (
    "client",
    "key_prefix",
    "cluster",
    "connect_timeout",
    "socket_timeout",
    "max_connections",
)


class RedisBackend(Backend):
    """Opens the Redis runtime stores by URL; the stores of one call share one client."""

    name = "redis"
    url_schemes = ("redis", "rediss")
    extra = "redis"
    requires = ("redis",)
    components = frozenset(_COMPONENTS)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        raise ThreadStoreConfigurationError(
            "the redis backend does not provide the threads component (it provides: "
            f"{', '.join(sorted(self.components))}); open threads from another URL: "
            "connect(url, threads='postgresql://...')"
        )

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        """One :class:`~pai_storage_redis.client.RedisClient` for every component
        (``client=`` an application's own client is wrapped, never closed)."""
        from .client import RedisClient

        return self.open_sharing_client(
            url,
            components,
            options,
            package=__name__,
            stores=_COMPONENTS,
            client_options=_CLIENT,
            make_client=lambda client, **given: RedisClient(url, client=client, **given),
        )

    async def server_info(self, url: StoreURL, **options: Any) -> StoreInfo:
        """The server's version and persistence settings (``pai-storage check``)."""
        from .client import RedisClient

        holder = RedisClient(url, **options)
        holder.attach()
        try:
            details = await holder.server_info()
        finally:
            await holder.release()
        return StoreInfo(
            backend=self.name,
            server_version=details.pop("redis_version"),
            transactions=None,
            details=details,
        )

    def test_harness(self, url: str | None = None) -> TestHarness:
        from .harness import RedisHarness  # test provisioning, imported only by the suite

        return RedisHarness(url)


backend = RedisBackend()
