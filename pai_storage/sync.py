"""The blocking API: the same stores and methods, for code that does not ``await``.

::

    from pai_storage import sync

    with sync.connect("sqlite:///chat.db") as stores:
        chat = stores.threads.conversation("tenant-42", "chat-1")
        chat.add("user", "What is the capital of France?")
        with chat.reply() as answer:
            for chunk in model.stream(...):
                answer.write(chunk)
        for m in chat.messages(last=20):
            print(m.role, m.text)

:func:`connect` and :func:`open_store` start an event loop in a thread of
their own (anyio's blocking portal) and open the stores on it; every object
they hand out is a :class:`Blocking` view that runs each coroutine method on
that loop and waits for it. Async context managers become ``with`` blocks
(``reply()``, ``guard.hold()``; the guard's watchdog keeps renewing on the
loop while the block runs), async iterators become iterators, a view of an
async iterable (a snapshot reader) is iterable with ``for``, and everything
else is returned as it is. It works from any thread, including one already
running an event loop (a notebook cell, an async framework calling sync
code): that loop waits while the call runs on the portal's. Once closed, a
call on any view raises what the async API raises after ``close()``: the
store's :class:`~pai_storage.ConfigurationError` ("this store is closed").
"""

from __future__ import annotations

import atexit
import functools
import inspect
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from . import bundle, registry
from .bundle import Stores
from .conversation import Conversation, Reply
from .errors import ConfigurationError
from .guard import Lock
from .lifecycle import ManagedStore
from .store import ThreadStore

__all__ = ["Blocking", "connect", "open_store"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

_HANDLES: tuple[type, ...] = (ManagedStore, Stores, Conversation, Reply, Lock)
"""What a call's result is wrapped as a :class:`Blocking` view for (plus async context managers)."""

_STOPPED: weakref.WeakSet[BlockingPortal] = weakref.WeakSet()
"""The portals of closed :class:`_Root` views: a call on a view of one raises :func:`_closed`."""


class Blocking(Generic[T]):
    """A blocking view of ``target``: its coroutine methods run on the portal's loop.

    ``view.name(...)`` calls ``target.name(...)`` and waits for it (typed as
    ``Any``); :meth:`call` does the same with full typing:
    ``store.call(ThreadStore.read_thread, request)``. ``target`` is the async
    object itself (use it only on the portal's loop).
    """

    __slots__ = ("_context", "_portal", "target")

    def __init__(self, target: T, portal: BlockingPortal) -> None:
        self.target = target
        self._portal = portal
        self._context: AbstractContextManager[Any] | None = None

    def __repr__(self) -> str:
        return f"Blocking({self.target!r})"

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        if callable(value) and not isinstance(value, type):
            return functools.partial(_invoke, self._portal, self.target, value)
        return _wrap(value, self._portal)

    def call(
        self,
        method: Callable[Concatenate[T, P], Awaitable[R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``method(target, *args, **kwargs)`` on the portal's loop, typed."""
        _check_open(self._portal, self.target)
        awaitable = method(self.target, *args, **kwargs)
        result: R = _wrap(_call(self._portal, self.target, _await, awaitable), self._portal)
        return result

    def __iter__(self) -> Iterator[Any]:
        """``for item in view``: the target's ``async for`` (a snapshot reader's chunks)."""
        if not hasattr(self.target, "__aiter__"):
            raise TypeError(f"{self!r} is not iterable")
        iterator = _call(self._portal, self.target, _aiter, self.target)
        return _iterate(iterator, self._portal, self.target)

    def __enter__(self) -> Any:
        if self._context is not None:
            raise RuntimeError(f"{self!r} is already entered")
        _check_open(self._portal, self.target)
        self._context = self._portal.wrap_async_context_manager(self.target)  # type: ignore[arg-type]
        return _wrap(self._context.__enter__(), self._portal)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        context, self._context = self._context, None
        assert context is not None
        return context.__exit__(exc_type, exc, tb)


class _Root(Blocking[T]):
    """The view :func:`connect` / :func:`open_store` return: it owns the portal's thread.

    One never closed is closed when the interpreter exits (``atexit``): the
    portal's thread would otherwise be stopped only by the garbage collector,
    too late to reach its loop, and the interpreter would hang on exit.
    """

    __slots__ = ("_open", "_stop")

    def __init__(self, target: T, portal: BlockingPortal, stop: Callable[[], object]) -> None:
        super().__init__(target, portal)
        self._stop = stop
        self._open = True
        atexit.register(self.close)

    def _finish(self) -> None:
        if self._open:
            self._open = False
            _STOPPED.add(self._portal)
            atexit.unregister(self.close)
            self._stop()

    def __enter__(self) -> Any:
        try:
            super().__enter__()
        except BaseException:
            self._finish()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            return super().__exit__(exc_type, exc, tb)
        finally:
            self._finish()

    def close(self) -> None:
        """Close the stores and stop the portal's thread (what leaving ``with`` does)."""
        if not self._open:
            return
        try:
            if self._context is not None:
                self.__exit__(None, None, None)
            else:
                close: Callable[[], Awaitable[object]] = self.target.close  # type: ignore[attr-defined]
                self._portal.call(close)
        finally:
            self._finish()


async def _await(awaitable: Awaitable[R]) -> R:
    return await awaitable


async def _aiter(iterable: AsyncIterable[R]) -> AsyncIterator[R]:
    return aiter(iterable)  # on the portal's loop, where the iterator will run


def _closed(target: object) -> ConfigurationError:
    """What the async API raises for a call on ``target`` once its store is closed."""
    if isinstance(target, Reply):
        target = target.conversation
    if isinstance(target, Conversation):
        target = target.store
    kind = target.configuration_error if isinstance(target, ManagedStore) else ConfigurationError
    return kind("this store is closed; open a new one")


def _check_open(portal: BlockingPortal, target: object) -> None:
    if portal in _STOPPED:
        raise _closed(target)


def _call(
    portal: BlockingPortal, target: object, func: Callable[..., Awaitable[R]], *args: Any
) -> R:
    """``portal.call``, raising :func:`_closed` for a portal closed before or during the call."""
    _check_open(portal, target)
    try:
        return portal.call(func, *args)
    except RuntimeError:
        _check_open(portal, target)  # stopped meanwhile: "this portal is not running"
        raise


def _invoke(
    portal: BlockingPortal, target: object, method: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    if inspect.iscoroutinefunction(method):
        call = functools.partial(method, *args, **kwargs)
        return _wrap(_call(portal, target, call), portal)
    return _wrap(method(*args, **kwargs), portal, target)


def _wrap(value: Any, portal: BlockingPortal, owner: object = None) -> Any:
    if isinstance(value, _HANDLES) or hasattr(value, "__aenter__"):
        return Blocking(value, portal)
    if hasattr(value, "__anext__"):
        return _iterate(value, portal, owner)
    return value


def _iterate(iterator: AsyncIterator[Any], portal: BlockingPortal, owner: object) -> Iterator[Any]:
    async def step() -> tuple[bool, Any]:
        try:
            return True, await anext(iterator)
        except StopAsyncIteration:
            return False, None

    while True:
        more, item = _call(portal, owner, step)
        if not more:
            return
        yield _wrap(item, portal)


def _start(open_target: Callable[[], T]) -> _Root[T]:
    """Start a portal, open the target on its loop (nothing is connected until used)."""
    manager = start_blocking_portal()
    portal = manager.__enter__()

    def stop() -> None:
        manager.__exit__(None, None, None)

    try:
        target = portal.call(_opened, open_target)
    except BaseException:
        stop()
        raise
    return _Root(target, portal, stop)


async def _opened(open_target: Callable[[], T]) -> T:
    return open_target()  # on the portal's loop, where the store will live


def connect(url: str, **options: Any) -> _Root[Stores]:
    """:func:`pai_storage.connect`, blocking: ``with sync.connect(url) as stores: ...``.

    Takes the same arguments. Leaving the block (or ``close()``) closes every
    store and stops the portal's thread.
    """
    return _start(functools.partial(bundle.connect, url, **options))


def open_store(url: str, **options: Any) -> _Root[ThreadStore]:
    """:func:`pai_storage.open_store`, blocking: ``with sync.open_store(url) as store: ...``."""
    return _start(functools.partial(registry.open_store, url, **options))
