"""What the framework adapters share: the stores they are given, sync calls
from worker threads, and pages walked to the end.

Imports no framework.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..bundle import Stores
from ..errors import ConfigurationError, InvalidInputError
from ..kv import Item, KeyValueStore
from ..lifecycle import to_the_end
from ..models import Page

T = TypeVar("T")

GET_MANY_LIMIT = 1000
"""The most keys :meth:`KeyValueStore.get_many` takes in one call."""


def missing_framework(module: str, framework: str, extra: str) -> ImportError:
    """The error an adapter raises when its framework is not installed."""
    return ImportError(
        f"{module} needs {framework}, which is not installed: pip install 'pai-storage[{extra}]'"
    )


def kv_of(stores: Stores | KeyValueStore, adapter: str) -> KeyValueStore:
    """The key-value store of a :func:`~pai_storage.connect` bundle, or the store itself."""
    if isinstance(stores, KeyValueStore):
        return stores
    if isinstance(stores, Stores):
        return stores.kv
    raise ConfigurationError(
        f"{adapter} needs a pai_storage.connect() bundle or a KeyValueStore, "
        f"not {type(stores).__qualname__}"
    )


def text_id(kind: str, value: object) -> str:
    """A framework id (often any object with a ``str``) as a non-empty ``str``."""
    if value is None:
        raise InvalidInputError(f"{kind} is required")
    text = value if isinstance(value, str) else str(value)
    if not text:
        raise InvalidInputError(f"{kind} must not be empty")
    return text


async def run_to_end(write: Coroutine[Any, Any, T]) -> T:
    """Await a write to its end even if the caller is cancelled meanwhile (then
    re-raise the cancellation): a cancelled caller never leaves it half-done."""
    task, cancelled = await to_the_end(write)
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller gets
        raise cancelled
    return task.result()


class LoopBridge:
    """Runs the adapter's coroutines for callers on other threads.

    The stores are bound to the event loop that opened them (a connection pool
    belongs to one loop), so a framework's synchronous method -- called from a
    worker thread, as LangGraph does for sync nodes -- hands its coroutine to
    that loop and waits. Called on the loop's own thread it would deadlock, so
    it raises instead.
    """

    def __init__(self, adapter: str) -> None:
        self._adapter = adapter
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):  # opened outside a loop: bound on first use
            self._loop = asyncio.get_running_loop()

    def bind(self) -> None:
        """Remember the running loop (called by every async method)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or not loop.is_running():
            coro.close()
            raise InvalidInputError(
                f"{self._adapter}: a synchronous method must be called from another thread "
                "while the event loop that opened the stores runs; on that loop use the "
                "async methods (ainvoke, astream, aget_tuple, ...)"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def every_page(
    fetch: Callable[[str | None], Awaitable[Page[T]]],
) -> AsyncIterator[T]:
    """Every item of a paged listing, following its keyset tokens."""
    token: str | None = None
    while True:
        page = await fetch(token)
        for item in page.items:
            yield item
        token = page.next_page_token
        if token is None:
            return


async def get_all(
    kv: KeyValueStore, namespace: tuple[str, ...], keys: list[str]
) -> dict[str, Item]:
    """:meth:`KeyValueStore.get_many` for any number of keys."""
    found: dict[str, Item] = {}
    for start in range(0, len(keys), GET_MANY_LIMIT):
        found.update(await kv.get_many(namespace, keys[start : start + GET_MANY_LIMIT]))
    return found


async def delete_under(kv: KeyValueStore, prefix: tuple[str, ...]) -> int:
    """Delete every item under a namespace prefix, one keyset page at a time."""
    deleted = 0
    namespaces = [
        ns
        async for ns in every_page(
            lambda token: kv.list_namespaces(prefix, limit=1000, page_token=token)
        )
    ]
    for namespace in namespaces:
        keys = [key async for key in every_key(kv, namespace)]
        for key in keys:
            deleted += await kv.delete(namespace, key)
    return deleted


def every_key(kv: KeyValueStore, namespace: tuple[str, ...]) -> AsyncIterator[str]:
    """Every key of one namespace, in key order."""
    return every_page(lambda token: kv.list_keys(namespace, limit=1000, page_token=token))


def every_item(kv: KeyValueStore, namespace: tuple[str, ...]) -> AsyncIterator[Item]:
    """Every item under a namespace prefix, in (namespace, key) order."""
    return every_page(lambda token: kv.search(namespace, limit=1000, page_token=token))
