"""Backend registry and URL handling (SPEC section 3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pai_storage import (
    ENTRY_POINT_GROUP,
    Backend,
    StoreURL,
    TestHarness,
    ThreadStore,
    ThreadStoreConfigurationError,
    available_backends,
    backend_for_url,
    get_backend,
    make_url,
    open_store,
    redact,
    register_backend,
    unregister_backend,
)

SECRET = "s3cr3t-Pa55"


class FakeStore(ThreadStore):
    backend_name = "fake"

    def __init__(self, url: StoreURL, **options: Any) -> None:
        super().__init__()
        self.url = url
        self.options = options
        self.initialized = 0

    async def _initialize(self) -> None:
        self.initialized += 1

    async def _read_thread(self, request: Any) -> Any:
        raise NotImplementedError

    async def _list_threads(self, request: Any) -> Any:
        raise NotImplementedError

    async def _commit_thread(self, request: Any) -> Any:
        raise NotImplementedError


class FakeBackend(Backend):
    def __init__(
        self,
        name: str = "fakedb",
        schemes: tuple[str, ...] = ("fakedb",),
        requires: tuple[str, ...] = (),
        extra: str | None = None,
    ) -> None:
        self.name = name
        self.url_schemes = schemes
        self.requires = requires
        self.extra = extra

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        return FakeStore(url, **options)

    def test_harness(self, url: str | None = None) -> TestHarness:
        raise NotImplementedError


@pytest.fixture
def registered() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        unregister_backend(name)


def _register(names: list[str], backend: Backend, **kw: Any) -> Backend:
    register_backend(backend, **kw)
    names.append(backend.name)
    return backend


def test_entry_point_group_and_builtin_memory() -> None:
    assert ENTRY_POINT_GROUP == "pai_storage.backends"
    backend = get_backend("memory")
    assert backend.name == "memory"
    assert "memory" in backend.url_schemes
    assert available_backends()["memory"] is backend
    assert backend_for_url("memory://")[0] is backend


def test_unknown_scheme_lists_installed_schemes() -> None:
    with pytest.raises(ThreadStoreConfigurationError) as err:
        open_store(f"nosuchdb://user:{SECRET}@host/db")
    text = str(err.value)
    assert "nosuchdb" in text
    assert "installed schemes" in text
    assert "memory" in text
    assert SECRET not in text


def test_unknown_scheme_did_you_mean() -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="did you mean 'memory'"):
        open_store("memroy://")


@pytest.mark.parametrize("url", ["not a url", "", "://nothing"])
def test_malformed_url(url: str) -> None:
    with pytest.raises(ThreadStoreConfigurationError):
        open_store(url)


def test_scheme_plus_driver_resolution(registered: list[str]) -> None:
    backend = _register(registered, FakeBackend())
    store = open_store(f"FakeDB+AsyncDrv://alice:{SECRET}@db.example:6543/agents?x=1", opt=2)
    assert isinstance(store, FakeStore)
    url = store.url
    assert (url.scheme, url.driver, url.full_scheme) == ("fakedb", "asyncdrv", "fakedb+asyncdrv")
    assert (url.username, url.password, url.host, url.port) == ("alice", SECRET, "db.example", 6543)
    assert url.database == "agents"
    assert url.query == (("x", "1"),)
    assert store.options == {"opt": 2}
    assert backend_for_url("fakedb+other://h")[0] is backend
    assert backend_for_url("postgresql+asyncpg://u@h/db")[0].name == "postgres"


def test_missing_driver_names_the_extra(registered: list[str]) -> None:
    _register(registered, FakeBackend(requires=("definitely_missing_mod",), extra="x"))
    with pytest.raises(ThreadStoreConfigurationError) as err:
        open_store(f"fakedb://u:{SECRET}@h/db")
    text = str(err.value)
    assert "pip install 'pai-storage[x]'" in text
    assert "definitely_missing_mod" in text
    assert SECRET not in text


def test_missing_driver_without_extra(registered: list[str]) -> None:
    _register(registered, FakeBackend(requires=("definitely_missing_mod", "json")))
    with pytest.raises(ThreadStoreConfigurationError, match=r"pip install definitely_missing_mod$"):
        open_store("fakedb://h")


async def test_third_party_registration_open_and_unregister(registered: list[str]) -> None:
    _register(registered, FakeBackend())
    assert get_backend("fakedb").name == "fakedb"
    assert "fakedb" in available_backends()
    store = open_store("fakedb://h")
    assert isinstance(store, FakeStore)
    async with store as entered:
        assert entered is store
        await store.initialize()
    assert store.initialized == 1
    unregister_backend("fakedb")
    with pytest.raises(ThreadStoreConfigurationError, match="installed schemes"):
        open_store("fakedb://h")
    with pytest.raises(ThreadStoreConfigurationError, match="unknown backend"):
        get_backend("fakedb")
    unregister_backend("fakedb")  # removing twice is harmless


def test_duplicate_name_and_scheme(registered: list[str]) -> None:
    first = _register(registered, FakeBackend())
    register_backend(first)  # the same object again is fine
    with pytest.raises(ThreadStoreConfigurationError, match="'fakedb' is registered"):
        register_backend(FakeBackend(schemes=("fakedb2",)))
    with pytest.raises(ThreadStoreConfigurationError, match="already belongs to backend 'fakedb'"):
        register_backend(FakeBackend(name="fakedb-b", schemes=("FAKEDB",)))
    with pytest.raises(ThreadStoreConfigurationError, match="already belongs to backend 'memory'"):
        register_backend(FakeBackend(name="fakedb-c", schemes=("memory",)))
    assert get_backend("fakedb") is first
    replacement = FakeBackend(schemes=("fakedb3",))
    register_backend(replacement, replace=True)
    assert get_backend("fakedb") is replacement
    assert backend_for_url("fakedb3://h")[0] is replacement
    with pytest.raises(ThreadStoreConfigurationError, match="installed schemes"):
        backend_for_url("fakedb://h")  # the replaced backend's schemes are gone


def test_backend_needs_name_and_scheme() -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="name"):
        register_backend(FakeBackend(name=""))
    with pytest.raises(ThreadStoreConfigurationError, match="scheme"):
        register_backend(FakeBackend(name="fakedb-none", schemes=()))


def test_get_backend_unknown_with_did_you_mean() -> None:
    with pytest.raises(ThreadStoreConfigurationError) as err:
        get_backend("memroy")
    text = str(err.value)
    assert "unknown backend 'memroy'" in text
    assert "did you mean 'memory'" in text
    assert "installed backends" in text
    assert "memory" in text


# ---------------------------------------------------------------- passwords


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://alice:{SECRET}@db:5432/app",
        f"mongodb://alice:{SECRET}@h1:27017,h2:27018/app?replicaSet=rs0",
        f"postgresql+asyncpg://alice:{SECRET}@[::1]:5432/app",
    ],
)
def test_store_url_never_shows_password(url: str) -> None:
    parsed = make_url(url)
    assert parsed.password == SECRET
    for text in (repr(parsed), str(parsed), parsed.render(), f"{parsed!r}", f"{[parsed]}"):
        assert SECRET not in text
        assert "***" in text
    assert SECRET in parsed.render(hide_password=False)
    assert make_url(parsed.render(hide_password=False)).password == SECRET


def test_percent_encoded_password_hidden_and_redacted() -> None:
    parsed = make_url("postgresql://alice:p%40ss%3Aw0rd@db/app")
    assert parsed.password == "p@ss:w0rd"
    for text in (repr(parsed), str(parsed)):
        assert "p@ss" not in text
        assert "p%40ss" not in text
    assert redact("failed: p@ss:w0rd / p%40ss%3Aw0rd", parsed) == "failed: *** / ***"
    assert redact("nothing secret", None) == "nothing secret"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://alice:{SECRET}@db:notaport/app",
        f"postgresql://alice:{SECRET}@db:99999/app",
        f"memory://alice:{SECRET}@host",
        f"nosuch://alice:{SECRET}@host",
    ],
)
def test_no_password_in_configuration_errors(url: str) -> None:
    with pytest.raises(ThreadStoreConfigurationError) as err:
        open_store(url)
    assert SECRET not in str(err.value)
    assert SECRET not in repr(err.value)


def test_no_password_in_unknown_option_error() -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="unknown option") as err:
        open_store(f"memory://alice:{SECRET}@", bogus=1)
    assert SECRET not in str(err.value)


def test_password_with_comma_hidden() -> None:
    parsed = make_url("postgresql://alice:pa,ss@db:5433/app")
    assert parsed.password == "pa,ss"
    assert "pa,ss" not in repr(parsed)
    assert "pa,ss" not in str(parsed)
    assert "db" in str(parsed)
