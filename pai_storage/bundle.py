"""``connect()``: every store an agent product needs, from one connection string.

::

    async with pai_storage.connect("memory://") as stores:
        stores.threads     # ThreadStore
        stores.kv          # KeyValueStore
        stores.state       # AgentStateStore
        stores.snapshots   # SnapshotStore
        stores.guard       # ExecutionGuard

:func:`connect` opens every component the URL's backend provides; a component
can come from another URL (``connect(url, snapshots="postgresql://...")``).
Each component can also be opened alone (:func:`open_kv_store`,
:func:`open_state_store`, :func:`open_snapshot_store`, :func:`open_guard`,
and :func:`~pai_storage.open_store` for threads). The components of one URL
are opened together by their backend, which shares one client or pool among
them; the bundle closes everything it opened (the guard first, releasing its
locks) and never a client the caller passed in. See ``docs/bundle.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from .errors import ConfigurationError, InvalidInputError, general_errors
from .lifecycle import ManagedStore
from .registry import backend_for_url
from .url import StoreURL

if TYPE_CHECKING:
    from .guard import ExecutionGuard
    from .kv import KeyValueStore
    from .snapshots import SnapshotStore
    from .state import AgentStateStore
    from .store import ThreadStore

__all__ = [
    "COMMON_OPTIONS",
    "COMPONENTS",
    "ScopeErasure",
    "Stores",
    "connect",
    "open_guard",
    "open_kv_store",
    "open_snapshot_store",
    "open_state_store",
]

COMPONENTS: Final = ("threads", "kv", "state", "snapshots", "guard")
"""The components of a bundle, in the order they are opened (closed in reverse)."""

COMMON_OPTIONS: Final = frozenset({"clock", "on_warning", "token_secret"})
"""Options every component of every backend accepts; ``connect`` passes them to each URL."""


@dataclass(frozen=True, slots=True)
class ScopeErasure:
    """What :meth:`Stores.erase_scope` deleted (this call; a resumed call counts the rest)."""

    threads: int = 0
    kv_items: int = 0
    sessions: int = 0
    snapshots: int = 0


class Stores:
    """The stores :func:`connect` opened, one attribute per component.

    Asking for a component no URL provided raises
    :class:`~pai_storage.ConfigurationError` naming the backend and
    the component. An async context manager: entering initializes every
    component (so a bad URL fails at once), leaving closes them.
    """

    def __init__(self, stores: Mapping[str, ManagedStore], backends: Mapping[str, str]) -> None:
        self._stores = dict(stores)
        self._backends = dict(backends)

    def _get(self, component: str) -> Any:
        store = self._stores.get(component)
        if store is None:
            backend = self._backends.get(component, "chosen")
            raise ConfigurationError(
                f"the {backend} backend does not provide the {component} component; open it "
                f"from another URL: connect(url, {component}='...')"
            )
        return store

    @property
    def threads(self) -> ThreadStore:
        return self._get("threads")  # type: ignore[no-any-return]

    @property
    def kv(self) -> KeyValueStore:
        return self._get("kv")  # type: ignore[no-any-return]

    @property
    def state(self) -> AgentStateStore:
        return self._get("state")  # type: ignore[no-any-return]

    @property
    def snapshots(self) -> SnapshotStore:
        return self._get("snapshots")  # type: ignore[no-any-return]

    @property
    def guard(self) -> ExecutionGuard:
        return self._get("guard")  # type: ignore[no-any-return]

    @property
    def provided(self) -> frozenset[str]:
        """The components this bundle holds."""
        return frozenset(self._stores)

    def __contains__(self, component: object) -> bool:
        return component in self._stores

    def __repr__(self) -> str:
        parts = ", ".join(f"{c}={self._backends[c]}" for c in COMPONENTS if c in self._stores)
        return f"Stores({parts})"

    async def erase_scope(self, scope_key: str) -> ScopeErasure:
        """Erase everything this bundle keeps for one tenant, ``scope_key``.

        - threads: every thread of the scope (:meth:`ThreadStore.erase_scope
          <pai_storage.ThreadStore.erase_scope>`);
        - key-value store: every item whose namespace begins with
          ``(scope_key,)``;
        - agent state: every session of the user ``scope_key``;
        - snapshots: every snapshot of the scope ``scope_key``.

        Expired items, sessions and snapshots are erased too (no read sees
        them, but they are still stored until a purge or the TTL monitor
        removes them), so once this returns nothing of the tenant is left in
        these stores; the counts include them. Locks are not erased: their
        names are the caller's, not scoped, and they expire. Components the
        bundle does not hold are left out. An interrupted erasure is finished
        by calling it again. A scope key that is not a valid runtime-store
        name (it holds U+0000 or U+001F) cannot key runtime data, so only
        threads are erased for it.

        Raises
        ------
        ConfigurationError
            The thread store does not provide the lifecycle capability
            (nothing is erased).
        """
        from .runtime import check_name

        threads = kv_items = sessions = snapshots = 0
        if "threads" in self._stores:
            threads = await self.threads.erase_scope(scope_key)
        try:
            name = check_name("scope_key", scope_key)
        except InvalidInputError:
            if "threads" in self._stores:
                return ScopeErasure(threads=threads)
            raise
        # Each store's scoped delete (its _erase_scope primitive) removes expired
        # data too: listing would skip it.
        if "kv" in self._stores:
            await self.kv.initialize()
            kv_items = await self.kv._erase_scope(name)
        if "state" in self._stores:
            await self.state.initialize()
            sessions = await self.state._erase_scope(name)
        if "snapshots" in self._stores:
            await self.snapshots.initialize()
            snapshots = await self.snapshots._erase_scope(name)
        return ScopeErasure(threads, kv_items, sessions, snapshots)

    async def initialize(self) -> None:
        """Initialize every component (each is also initialized lazily on first use).

        Raises the general error classes (``ConfigurationError``,
        ``UnavailableError``, ...), the thread store's failures included.
        """
        with general_errors():
            for component in COMPONENTS:
                if component in self._stores:
                    await self._stores[component].initialize()

    async def close(self) -> None:
        """Close every component, the guard first (its locks are released while
        the connections still work). Idempotent; the first failure is raised
        after every component was closed."""
        first: BaseException | None = None
        for component in reversed(COMPONENTS):
            store = self._stores.get(component)
            if store is None:
                continue
            try:
                await store.close()
            except BaseException as exc:  # even a cancellation: close the rest, then raise
                first = first or exc
        if first is not None:
            raise first

    async def __aenter__(self) -> Self:
        try:
            await self.initialize()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def connect(
    url: str | StoreURL,
    *,
    threads: str | StoreURL | None = None,
    kv: str | StoreURL | None = None,
    state: str | StoreURL | None = None,
    snapshots: str | StoreURL | None = None,
    guard: str | StoreURL | None = None,
    **options: Any,
) -> Stores:
    """Open every component ``url``'s backend provides, as one :class:`Stores`.

    Parameters
    ----------
    url:
        The connection string; its scheme chooses the backend.
    threads, kv, state, snapshots, guard:
        Another URL for that component (a hybrid set-up: e.g. large
        snapshots on PostgreSQL beside MongoDB for the rest).
    **options:
        Options of ``url``'s backend (``client=``, ``names=``, table or
        collection settings, ...). The common options (``clock``,
        ``on_warning``, ``token_secret``) go to every URL.

    Raises
    ------
    ConfigurationError
        Unknown scheme, missing driver, bad options (also options of ``url``'s
        backend when every component comes from another URL), or a component
        URL whose backend does not provide that component. The password of a URL never
        appears in a message.
    """
    with general_errors():  # the URL parser and the registry serve open_store too
        return _connect(url, threads, kv, state, snapshots, guard, options)


def _connect(
    url: str | StoreURL,
    threads: str | StoreURL | None,
    kv: str | StoreURL | None,
    state: str | StoreURL | None,
    snapshots: str | StoreURL | None,
    guard: str | StoreURL | None,
    options: dict[str, Any],
) -> Stores:
    overrides = {
        "threads": threads,
        "kv": kv,
        "state": state,
        "snapshots": snapshots,
        "guard": guard,
    }
    common = {k: v for k, v in options.items() if k in COMMON_OPTIONS}
    main_backend, main_url = backend_for_url(url)
    own = sorted(set(options) - COMMON_OPTIONS)
    groups: dict[StoreURL, list[str]] = {}
    for component in COMPONENTS:
        other = overrides[component]
        if other is not None:
            groups.setdefault(backend_for_url(other)[1], []).append(component)
        elif component in main_backend.components:
            groups.setdefault(main_url, []).append(component)
    if own and main_url not in groups:
        # Never drop an option silently: these belong to a backend that opens nothing.
        raise ConfigurationError(
            f"option(s) {', '.join(own)} apply to {main_url.full_scheme}://, from which no "
            "component is opened (every component was given another URL)"
        )
    # Opening is lazy (nothing connects before first use), so a failure here
    # leaves nothing to release.
    stores: dict[str, ManagedStore] = {}
    names: dict[str, str] = dict.fromkeys(COMPONENTS, main_backend.name)
    for where, components in groups.items():
        backend, parsed = backend_for_url(where)
        for component in components:
            names[component] = backend.name
        group_options = options if where == main_url else common
        stores.update(backend.open_components(parsed, components, **group_options))
    return Stores(stores, names)


def _open_one(component: str, url: str | StoreURL, options: dict[str, Any]) -> Any:
    with general_errors():
        backend, parsed = backend_for_url(url)
        return backend.open_components(parsed, [component], **options)[component]


def open_kv_store(url: str | StoreURL, **options: Any) -> KeyValueStore:
    """Open only the key-value store of ``url``'s backend (see :func:`connect`)."""
    return _open_one("kv", url, options)  # type: ignore[no-any-return]


def open_state_store(url: str | StoreURL, **options: Any) -> AgentStateStore:
    """Open only the agent-state store of ``url``'s backend."""
    return _open_one("state", url, options)  # type: ignore[no-any-return]


def open_snapshot_store(url: str | StoreURL, **options: Any) -> SnapshotStore:
    """Open only the snapshot store of ``url``'s backend."""
    return _open_one("snapshots", url, options)  # type: ignore[no-any-return]


def open_guard(url: str | StoreURL, **options: Any) -> ExecutionGuard:
    """Open only the execution guard of ``url``'s backend."""
    return _open_one("guard", url, options)  # type: ignore[no-any-return]
