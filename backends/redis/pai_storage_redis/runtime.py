"""What the four Redis runtime stores share: the client, their keys, the clock argument.

:class:`RedisRuntimeStore` sits before the contract class in each store's bases
(``class RedisKeyValueStore(RedisRuntimeStore, KeyValueStore)``): its
constructor passes the contract's options on and attaches the
:class:`~pai_storage_redis.client.RedisClient` the store runs on (a new one
from the URL, an application's own client wrapped, or the holder shared by the
stores of one ``connect()`` call); ``initialize`` connects it and ``close``
releases it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pai_storage.errors import general_errors
from pai_storage.runtime import RuntimeStore

from .client import CLIENT_OPTIONS, RedisClient, to_ms

__all__ = ["RedisRuntimeStore", "split_client_options"]


def split_client_options(options: dict[str, Any]) -> dict[str, Any]:
    """Remove and return the client options among a store's keyword arguments."""
    return {k: options.pop(k) for k in list(options) if k in CLIENT_OPTIONS}


class RedisRuntimeStore(RuntimeStore):
    """A runtime store on a shared :class:`RedisClient`; ``component`` names its keys."""

    backend_name = "redis"
    token_prefix = "pai-redis"
    component: ClassVar[str]

    def __init__(self, url: Any, client: object, **options: Any) -> None:
        client_options = split_client_options(options)
        super().__init__(**options)
        with general_errors():  # a runtime store raises the general classes
            self._client = RedisClient.attached(url, client, **client_options)
        self.url = self._client.url
        self.root: str = self._client.root(self.component)
        """The hash-tagged start of every key of this store."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.url)!r}, keys={self.root!r})"

    async def _initialize(self) -> None:
        await self._client.ready()

    async def _close(self) -> None:
        await self._client.release()

    def clock_arg(self) -> str:
        """The first argument of every script: the test clock in ms, ``""`` for the server's."""
        now = self.now()
        return "" if now is None else str(to_ms(now))

    def native_expiry(self) -> str:
        """``"1"`` when Redis itself may expire keys (the server's clock is the store's)."""
        return "1" if self.clock is None else "0"

    async def read(self, script: str, keys: Sequence[str], *args: str | bytes | int) -> Any:
        """Run a script that writes nothing (the clock is its first argument)."""
        return await self._client.run(script, keys, (self.clock_arg(), *args), write=False)

    async def write(self, script: str, keys: Sequence[str], *args: str | bytes | int) -> Any:
        """Run a script that may write (the clock is its first argument)."""
        return await self._client.run(script, keys, (self.clock_arg(), *args), write=True)
