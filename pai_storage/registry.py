"""Backend registry: entry points, chosen by URL scheme, loaded lazily.

A backend package exposes a :class:`Backend` object and registers it in the
``pai_storage.backends`` entry-point group, exactly as the built-in ones do::

    [project.entry-points."pai_storage.backends"]
    mystore = "my_package:backend"

Entry points are imported only when a store is first opened (or the suite asks
for a backend by name). :func:`register_backend` adds one in-process.
"""

from __future__ import annotations

import difflib
import importlib.util
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from .clock import Clock
from .errors import ThreadStoreConfigurationError
from .store import ThreadStore
from .url import StoreURL, make_url

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "TestHarness",
    "available_backends",
    "backend_for_url",
    "get_backend",
    "open_store",
    "register_backend",
    "unregister_backend",
]

ENTRY_POINT_GROUP = "pai_storage.backends"


class TestHarness(ABC):
    """Makes isolated stores of one backend for the conformance suite.

    Every store it creates lives in its own namespace (a fresh collection
    prefix, schema or table prefix) and is cleaned up by :meth:`aclose`.
    """

    __test__ = False  # not a pytest test class

    @abstractmethod
    def store(self, clock: Clock | None = None) -> AbstractAsyncContextManager[ThreadStore]:
        """An initialized store in a fresh namespace, removed on exit."""

    async def start(self) -> None:
        """Connect, or start a throwaway server; fail loudly if unreachable."""

    async def aclose(self) -> None:
        """Stop anything :meth:`start` started."""

    def describe(self) -> str:
        """One line for the pytest header: backend and server."""
        return type(self).__name__


class Backend(ABC):
    """A storage backend: its name, URL schemes and how to open stores.

    Attributes
    ----------
    name:
        Short name, used by ``pytest --pai-backend=NAME``.
    url_schemes:
        Schemes it serves (``"postgresql"``; ``scheme+driver`` URLs match on
        the part before ``+``).
    extra:
        The ``pai-storage`` extra that installs its driver, if any.
    requires:
        Importable driver modules; missing ones make :meth:`open` fail with an
        install hint instead of an ``ImportError``.
    """

    name: str
    url_schemes: tuple[str, ...]
    extra: str | None = None
    requires: tuple[str, ...] = ()

    def check_driver(self) -> None:
        """Raise a configuration error naming the extra when a driver is missing."""
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            hint = (
                f"pip install 'pai-storage[{self.extra}]'"
                if self.extra
                else f"pip install {' '.join(missing)}"
            )
            raise ThreadStoreConfigurationError(
                f"the {self.name} backend needs {', '.join(missing)}, which is not "
                f"installed: {hint}"
            )

    def check_options(
        self, url: StoreURL, options: Mapping[str, Any], valid: Iterable[str]
    ) -> None:
        """Raise a configuration error naming any option not in ``valid``."""
        allowed = set(valid)
        unknown = set(options) - allowed
        if unknown:
            raise ThreadStoreConfigurationError(
                f"unknown option(s) for {url.full_scheme}://: {', '.join(sorted(unknown))}; "
                f"valid: {', '.join(sorted(allowed))}"
            )

    def open(self, url: StoreURL, **options: Any) -> ThreadStore:
        """Open a store for ``url`` (not yet initialized)."""
        self.check_driver()
        return self._open(url, **options)

    @abstractmethod
    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        """Create the store; the driver is known to be importable."""

    @abstractmethod
    def test_harness(self, url: str | None = None) -> TestHarness:
        """A harness for the conformance suite against ``url`` or a default server."""


_lock = threading.Lock()
_backends: dict[str, Backend] = {}
_schemes: dict[str, str] = {}
_entry_points_loaded = False
_load_errors: dict[str, str] = {}
BACKENDS: Mapping[str, Backend] = MappingProxyType(_backends)
"""Read-only view of the backends registered so far (entry points load lazily)."""


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Register ``backend`` in-process under its name and URL schemes.

    Raises :class:`ThreadStoreConfigurationError` when the name or a scheme is
    taken by another backend (unless ``replace``).
    """
    with _lock:
        _register(backend, replace)


def _register(backend: Backend, replace: bool) -> None:
    if not getattr(backend, "name", None) or not getattr(backend, "url_schemes", None):
        raise ThreadStoreConfigurationError("a backend needs a name and at least one URL scheme")
    existing = _backends.get(backend.name)
    if existing is not None and existing is not backend and not replace:
        raise ThreadStoreConfigurationError(f"a backend named {backend.name!r} is registered")
    for scheme in backend.url_schemes:
        owner = _schemes.get(scheme.lower())
        if owner is not None and owner != backend.name and not replace:
            raise ThreadStoreConfigurationError(
                f"URL scheme {scheme!r} already belongs to backend {owner!r}"
            )
    if existing is not None:
        for scheme in existing.url_schemes:
            _schemes.pop(scheme.lower(), None)
    _backends[backend.name] = backend
    for scheme in backend.url_schemes:
        _schemes[scheme.lower()] = backend.name


def unregister_backend(name: str) -> None:
    """Remove an in-process registration (mainly for tests)."""
    with _lock:
        backend = _backends.pop(name, None)
        if backend is not None:
            for scheme in backend.url_schemes:
                _schemes.pop(scheme.lower(), None)


def _load_entry_points() -> None:
    global _entry_points_loaded
    with _lock:
        if _entry_points_loaded:
            return
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in _backends:
                continue
            try:
                backend = ep.load()
                if not isinstance(backend, Backend):
                    raise TypeError(f"{ep.value} is not a pai_storage.Backend")
                _register(backend, replace=False)
            except Exception as exc:  # one broken plugin must not hide the others
                _load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
        _entry_points_loaded = True


def available_backends() -> Mapping[str, Backend]:
    """Every backend: entry points (loaded now) plus in-process registrations."""
    _load_entry_points()
    return BACKENDS


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; a typed error names the valid ones."""
    backends = available_backends()
    if name in backends:
        return backends[name]
    if name in _load_errors:
        raise ThreadStoreConfigurationError(
            f"backend {name!r} failed to load: {_load_errors[name]}"
        )
    raise ThreadStoreConfigurationError(
        f"unknown backend {name!r}{_did_you_mean(name, backends)}; "
        f"installed backends: {', '.join(sorted(backends)) or 'none'}"
    )


def _did_you_mean(word: str, choices: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def backend_for_url(url: str | StoreURL) -> tuple[Backend, StoreURL]:
    """The backend serving ``url``'s scheme, and the parsed URL."""
    parsed = make_url(url)
    available_backends()
    name = _schemes.get(parsed.scheme)
    if name is None:
        failed = "".join(
            f"; backend {n!r} failed to load ({err})" for n, err in sorted(_load_errors.items())
        )
        raise ThreadStoreConfigurationError(
            f"no backend serves URL scheme {parsed.scheme!r}"
            f"{_did_you_mean(parsed.scheme, _schemes)}; installed schemes: "
            f"{', '.join(sorted(_schemes)) or 'none'}{failed}"
        )
    return _backends[name], parsed


def open_store(url: str | StoreURL, **options: Any) -> ThreadStore:
    """Open a store by URL, e.g. ``open_store("postgresql://app@db/agents")``.

    The backend is chosen by scheme (``scheme+driver`` allowed). The store is
    initialized lazily on first use, or explicitly with ``await
    store.initialize()`` / ``async with store``.

    Raises
    ------
    ThreadStoreConfigurationError
        Unknown scheme (the message lists installed schemes), a backend whose
        driver extra is not installed (the message says what to install), or
        bad options. The password in ``url`` is never shown.
    """
    backend, parsed = backend_for_url(url)
    return backend.open(parsed, **options)
