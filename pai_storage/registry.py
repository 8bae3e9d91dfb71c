"""Backend registry: entry points, chosen by URL scheme, imported only when used.

A backend package exposes a :class:`Backend` object and declares it in two
entry-point groups, exactly as the built-in ones do::

    [project.entry-points."pai_storage.backends"]   # name -> backend
    mystore = "my_package:backend"

    [project.entry-points."pai_storage.schemes"]    # URL scheme -> the same backend
    mystore = "my_package:backend"
    mystore-legacy = "my_package:backend"

The names in ``pai_storage.schemes`` are the URL schemes the backend serves
(its ``url_schemes``; ``scheme+driver`` URLs match on the part before ``+``),
and each value names the same object as the backend's ``pai_storage.backends``
entry. Entry-point metadata is read without importing anything, so opening
``memory://`` imports the memory backend and no other one, and asking for a
backend by name (``pytest --pai-backend=NAME``) imports only that one -- the
way SQLAlchemy loads one dialect and fsspec one implementation.

A scheme that no entry point declares makes the registry import every
installed backend before it gives up: a backend that declares no schemes is
still found (at that cost), and the error lists every installed scheme and
every backend that failed to load. :func:`available_backends` imports them all
too. :func:`register_backend` adds a backend in-process. See
``docs/backend-authors.md``.
"""

from __future__ import annotations

import difflib
import importlib.util
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .errors import ThreadStoreConfigurationError
from .url import StoreURL, make_url

if TYPE_CHECKING:
    # Test provisioning lives beside the conformance suite; the core only names it.
    from pai_storage_conformance.provision import TestHarness

    from .lifecycle import ManagedStore
    from .store import StoreInfo, ThreadStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "SCHEME_ENTRY_POINT_GROUP",
    "Backend",
    "available_backends",
    "backend_for_url",
    "get_backend",
    "open_store",
    "register_backend",
    "unregister_backend",
]

ENTRY_POINT_GROUP = "pai_storage.backends"
"""Entry-point group naming each backend: ``NAME = "package:backend"``."""

SCHEME_ENTRY_POINT_GROUP = "pai_storage.schemes"
"""Entry-point group naming the backend for each URL scheme: ``SCHEME = "package:backend"``."""


class Backend(ABC):
    """A storage backend: its name, URL schemes and how to open stores.

    Attributes
    ----------
    name:
        Short name, used by ``pytest --pai-backend=NAME``.
    url_schemes:
        Schemes it serves (``"postgresql"``; ``scheme+driver`` URLs match on
        the part before ``+``). Declare each one in the
        ``pai_storage.schemes`` entry-point group too.
    extra:
        The ``pai-storage`` extra that installs its driver, if any.
    requires:
        Importable driver modules; missing ones make :meth:`open` fail with an
        install hint instead of an ``ImportError``.
    components:
        The stores it provides: ``"threads"`` and any of ``"kv"``, ``"state"``,
        ``"snapshots"``, ``"guard"`` (see ``docs/bundle.md``). A backend that
        provides more than threads implements :meth:`_open_components`.
    """

    name: str
    url_schemes: tuple[str, ...]
    extra: str | None = None
    requires: tuple[str, ...] = ()
    components: frozenset[str] = frozenset({"threads"})

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

    def split_options(
        self,
        url: StoreURL,
        options: Mapping[str, Any],
        accepted: Mapping[str, Iterable[str]],
    ) -> dict[str, dict[str, Any]]:
        """Each component's share of ``options``; any option no component accepts is an error.

        ``accepted`` maps each component being opened to the options it takes;
        an option goes to every component that takes it (``max_value_bytes``
        to both the key-value and the agent-state store, say).
        """
        self.check_options(url, options, {o for names in accepted.values() for o in names})
        return {
            component: {k: v for k, v in options.items() if k in set(names)}
            for component, names in accepted.items()
        }

    def open_sharing_client(
        self,
        url: StoreURL,
        components: Sequence[str],
        options: Mapping[str, Any],
        *,
        package: str,
        stores: Mapping[str, tuple[str, str, Iterable[str]]],
        client_options: Iterable[str],
        make_client: Callable[..., object],
    ) -> dict[str, ManagedStore]:
        """Open ``components`` on one client made for them all: a typical :meth:`_open_components`.

        ``stores`` maps each component the backend provides to its module in
        ``package`` (``"kv"``: imported only when opened), the store class in it
        and that store's own options; ``client_options`` are the options of
        the shared client, which every store also takes. ``make_client(client,
        **given)`` makes the one client from the application's ``client=``
        (or ``None``) and the client options given; each store is then made as
        ``StoreClass(client=that_client, **its_share)``. An option no
        component nor the client takes is an error, before anything is made.
        """
        shared = set(client_options) - {"client"}
        accepted = {c: tuple(stores[c][2]) for c in components}
        everything = {o for names in accepted.values() for o in names}
        self.check_options(url, options, everything | shared | {"client"})
        given = {k: v for k, v in options.items() if k in shared}
        rest = {k: v for k, v in options.items() if k not in shared and k != "client"}
        shares = self.split_options(url, rest, accepted)
        client = make_client(options.get("client"), **given)
        opened: dict[str, ManagedStore] = {}
        for component in components:
            module, cls, _ = stores[component]
            factory = getattr(importlib.import_module(f"{package}.{module}"), cls)
            opened[component] = factory(client=client, **shares[component])
        return opened

    def open(self, url: StoreURL, **options: Any) -> ThreadStore:
        """Open a store for ``url`` (not yet initialized)."""
        self.check_driver()
        return self._open(url, **options)

    @abstractmethod
    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        """Create the store; the driver is known to be importable."""

    def open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        """Open several components of ``url`` together (not yet initialized).

        What :func:`pai_storage.connect` calls once per URL: the backend may
        share one client or pool among the components it opens here. Raises
        :class:`ThreadStoreConfigurationError` naming this backend and the
        component for one it does not provide.
        """
        for component in components:
            if component not in self.components:
                raise ThreadStoreConfigurationError(
                    f"the {self.name} backend does not provide the {component} component "
                    f"(it provides: {', '.join(sorted(self.components))})"
                )
        self.check_driver()
        if list(components) == ["threads"]:
            return {"threads": self._open(url, **options)}
        return self._open_components(url, components, **options)

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        """Open the components (each one this backend provides).

        The default serves a threads-only backend.
        """
        return {"threads": self._open(url, **options)}

    async def server_info(self, url: StoreURL, **options: Any) -> StoreInfo:
        """What ``pai-storage check`` reports about the server behind ``url``.

        The default opens the thread store and returns its
        :meth:`~pai_storage.ThreadStore.info`; a backend without threads
        overrides it.
        """
        async with self.open(url, **options) as store:
            return await store.info()

    @abstractmethod
    def test_harness(self, url: str | None = None) -> TestHarness:
        """A harness for the conformance suite against ``url`` or a default server.

        Return a :class:`pai_storage_conformance.provision.TestHarness`; import
        it where the harness is built, so opening a store never imports test
        provisioning.
        """


@dataclass
class _Installed:
    """What installed distributions declare, read from metadata (nothing imported)."""

    backends: dict[str, EntryPoint] = field(default_factory=dict)
    """Backend name -> its entry point (the first one found wins)."""
    schemes: dict[str, list[EntryPoint]] = field(default_factory=dict)
    """URL scheme -> the entry points declaring it."""
    names: dict[str, str] = field(default_factory=dict)
    """Object reference (``package:backend``) -> backend name."""

    @classmethod
    def read(cls) -> _Installed:
        found = cls()
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in found.backends:
                found.backends[ep.name] = ep
                found.names.setdefault(_ref(ep), ep.name)
        for ep in entry_points(group=SCHEME_ENTRY_POINT_GROUP):
            found.schemes.setdefault(ep.name.lower(), []).append(ep)
        return found

    def key(self, ep: EntryPoint) -> str:
        """The backend name a scheme entry point refers to (its reference if none)."""
        return self.names.get(_ref(ep), _ref(ep))


def _ref(ep: EntryPoint) -> str:
    return "".join(ep.value.split())


# Loading imports backend modules; a module that registers something while it
# is imported re-enters the lock from the same thread, hence RLock.
_lock = threading.RLock()
_backends: dict[str, Backend] = {}
_schemes: dict[str, str] = {}
_installed: _Installed | None = None
_attempted: set[str] = set()
_everything_loaded = False
_load_errors: dict[str, str] = {}
_scheme_errors: dict[str, str] = {}
BACKENDS: Mapping[str, Backend] = MappingProxyType(_backends)
"""Read-only view of the backends registered so far (entry points load lazily)."""


def _declared() -> _Installed:
    global _installed
    if _installed is None:
        _installed = _Installed.read()
    return _installed


def _load(key: str, ep: EntryPoint) -> None:
    """Import one declared backend (once) and register it; record why it failed."""
    if key in _attempted or key in _backends:
        return  # an in-process registration under that name takes precedence
    _attempted.add(key)
    try:
        backend = ep.load()
        if not isinstance(backend, Backend):
            raise TypeError(f"{ep.value} is not a pai_storage Backend")
        _register(backend, replace=False)
    except Exception as exc:  # one broken plugin must not hide the others
        _load_errors[key] = f"{type(exc).__name__}: {exc}"


def _load_name(name: str) -> None:
    ep = _declared().backends.get(name)
    if ep is not None:
        _load(name, ep)


def _load_scheme(scheme: str) -> None:
    installed = _declared()
    for ep in installed.schemes.get(scheme, ()):
        key = installed.key(ep)
        _load(key, installed.backends.get(key, ep))
        if scheme not in _schemes and key in _backends:
            _scheme_errors[scheme] = (
                f"entry point {ep.name!r} in {SCHEME_ENTRY_POINT_GROUP!r} names backend "
                f"{key!r}, whose url_schemes do not include {scheme!r}"
            )


def _load_everything() -> None:
    global _everything_loaded
    if _everything_loaded:
        return
    installed = _declared()
    for name, ep in installed.backends.items():
        _load(name, ep)
    for declaring in installed.schemes.values():  # schemes whose value names no backend entry
        for ep in declaring:
            key = installed.key(ep)
            _load(key, installed.backends.get(key, ep))
    _everything_loaded = True


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Register ``backend`` in-process under its name and URL schemes.

    Raises :class:`ThreadStoreConfigurationError` when the name or a scheme is
    taken by another backend, installed or registered (unless ``replace``).
    """
    with _lock:
        # An installed backend that claims the same name or a scheme is loaded
        # first, so a clash is found whether or not it was used yet.
        _load_name(getattr(backend, "name", None) or "")
        for scheme in getattr(backend, "url_schemes", None) or ():
            _load_scheme(str(scheme).lower())
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
    """Remove an in-process registration (mainly for tests).

    A backend loaded from an entry point stays removed for this process.
    """
    with _lock:
        backend = _backends.pop(name, None)
        if backend is not None:
            for scheme in backend.url_schemes:
                _schemes.pop(scheme.lower(), None)


def available_backends() -> Mapping[str, Backend]:
    """Every backend: all entry points (imported now) plus in-process registrations."""
    with _lock:
        _load_everything()
    return BACKENDS


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; a typed error names the valid ones.

    Imports that backend only; an unknown name imports every installed backend
    first, so the error lists them all.
    """
    with _lock:
        _load_name(name)
        if name not in _backends and name not in _load_errors:
            _load_everything()
        backend = _backends.get(name)
        if backend is not None:
            return backend
        if name in _load_errors:
            raise ThreadStoreConfigurationError(
                f"backend {name!r} failed to load: {_load_errors[name]}"
            )
        known = sorted(_backends)
    raise ThreadStoreConfigurationError(
        f"unknown backend {name!r}{_did_you_mean(name, known)}; "
        f"installed backends: {', '.join(known) or 'none'}"
    )


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def backend_for_url(url: str | StoreURL) -> tuple[Backend, StoreURL]:
    """The backend serving ``url``'s scheme, and the parsed URL.

    Imports only the backend declared for that scheme; an undeclared scheme
    imports every installed backend first (see the module docstring).
    """
    parsed = make_url(url)
    scheme = parsed.scheme
    with _lock:
        if scheme not in _schemes:
            _load_scheme(scheme)
        if scheme not in _schemes:
            _load_everything()
        name = _schemes.get(scheme)
        if name is not None:
            return _backends[name], parsed
        notes = "".join(
            f"; backend {n!r} failed to load ({err})" for n, err in sorted(_load_errors.items())
        )
        if scheme in _scheme_errors:
            notes += f"; {_scheme_errors[scheme]}"
        installed = sorted(_schemes)
    raise ThreadStoreConfigurationError(
        f"no backend serves URL scheme {scheme!r}{_did_you_mean(scheme, installed)}; "
        f"installed schemes: {', '.join(installed) or 'none'}{notes}"
    )


def open_store(url: str | StoreURL, **options: Any) -> ThreadStore:
    """Open a store by URL, e.g. ``open_store("postgresql://app@db/agents")``.

    The backend is chosen by scheme (``scheme+driver`` allowed) and only that
    backend is imported. The store is initialized lazily on first use, or
    explicitly with ``await store.initialize()`` / ``async with store``.

    Raises
    ------
    ThreadStoreConfigurationError
        Unknown scheme (the message lists installed schemes), a backend whose
        driver extra is not installed (the message says what to install), or
        bad options. The password in ``url`` is never shown.
    """
    backend, parsed = backend_for_url(url)
    return backend.open(parsed, **options)
