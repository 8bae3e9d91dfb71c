"""Backend registry and URL handling (see docs/backends.md and docs/backend-authors.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest
from pai_storage_conformance.provision import TestHarness

from pai_storage import (
    ThreadStore,
    available_backends,
    make_url,
    open_store,
    register_backend,
    unregister_backend,
)
from pai_storage.backend import (
    ENTRY_POINT_GROUP,
    Backend,
    StoreURL,
    backend_for_url,
    get_backend,
    redact,
)
from pai_storage.errors import ThreadStoreConfigurationError
from pai_storage.registry import SCHEME_ENTRY_POINT_GROUP

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
    assert SCHEME_ENTRY_POINT_GROUP == "pai_storage.schemes"
    backend = get_backend("memory")
    assert backend.name == "memory"
    assert "memory" in backend.url_schemes
    assert available_backends()["memory"] is backend
    assert backend_for_url("memory://")[0] is backend


def test_builtin_scheme_entry_points_match_each_backend() -> None:
    # The metadata is what lets the registry import one backend per scheme, so
    # it must say exactly what each backend object serves.
    eps = distribution("pai-storage").entry_points
    backends = {ep.name: ep.value for ep in eps.select(group=ENTRY_POINT_GROUP)}
    declared: dict[str, set[str]] = {}
    for ep in eps.select(group=SCHEME_ENTRY_POINT_GROUP):
        declared.setdefault(ep.value, set()).add(ep.name)
    assert set(backends) == {"memory", "postgres", "mongo", "sql", "redis", "files", "s3"}
    assert set(declared) == set(backends.values())
    for name, value in backends.items():
        assert declared[value] == set(get_backend(name).url_schemes), name


# ------------------------------------------------- lazy loading (fresh interpreters)

BACKEND_MODULES = (
    "pai_storage_memory",
    "pai_storage_postgres",
    "pai_storage_mongo",
    "pai_storage_sql",
    "pai_storage_redis",
)
DRIVERS = ("asyncpg", "pymongo", "bson", "sqlalchemy", "aiosqlite", "asyncmy", "redis")


def _fresh(code: str, *, path: Path | None = None) -> dict[str, Any]:
    """Run ``code`` in a new interpreter; it sets ``out`` (a JSON-able dict)."""
    script = "import json, sys\nout = {}\n" + textwrap.dedent(code)
    script += "\nout['loaded'] = sorted(m for m in sys.modules if m.split('.')[0] in WATCH)"
    script += "\nprint(json.dumps(out))"
    watch = (*BACKEND_MODULES, *DRIVERS, "pai_storage_conformance", "pai_example_kv")
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    run = subprocess.run(
        [sys.executable, "-c", f"WATCH = {watch!r}\n{script}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    result["roots"] = sorted({m.split(".")[0] for m in result["loaded"]})
    return result


def test_importing_pai_storage_imports_no_backend() -> None:
    result = _fresh("import pai_storage\nimport pai_storage.backend")
    assert result["roots"] == []


def test_opening_memory_imports_only_the_memory_backend() -> None:
    result = _fresh(
        """
        import asyncio
        from pai_storage import CommittedResult, open_store
        from pai_storage import builders as b

        async def use() -> None:
            async with open_store("memory://") as store:
                insert = {"type": "insert", "record": b.message("m1", "hi")}
                made = await store.commit_thread(b.create("s", "t", {"messages": [insert]}))
                assert isinstance(made, CommittedResult), made
                read = await store.read_thread({"scopeKey": "s", "threadId": "t"})
                out["thread"] = read.thread.thread_id

        asyncio.run(use())
        """
    )
    assert result["thread"] == "t"
    assert result["roots"] == ["pai_storage_memory"]  # no other backend, driver or test code


def test_resolving_postgresql_imports_only_the_postgres_backend() -> None:
    result = _fresh(
        """
        from pai_storage.backend import backend_for_url, get_backend
        out["backend"] = backend_for_url("postgresql+asyncpg://u@127.0.0.1/db")[0].name
        out["by_name"] = get_backend("postgres").name
        """
    )
    assert (result["backend"], result["by_name"]) == ("postgres", "postgres")
    assert result["roots"] == ["pai_storage_postgres"]  # asyncpg itself waits for a connection


def _fake_distribution(root: Path, dist: str, backends: str, schemes: str) -> None:
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    groups = f"[{ENTRY_POINT_GROUP}]\n{backends}\n[{SCHEME_ENTRY_POINT_GROUP}]\n{schemes}\n"
    (info / "entry_points.txt").write_text(groups)


FAKE_BACKENDS = """
from pai_storage.backend import Backend


class Fake(Backend):
    def __init__(self, name, schemes):
        self.name, self.url_schemes = name, schemes

    def _open(self, url, **options):
        raise NotImplementedError

    def test_harness(self, url=None):
        raise NotImplementedError


fakekv = Fake("fakekv", ("fake", "fake2"))
liar = Fake("liar", ("honest",))
legacy = Fake("legacy", ("legacy",))
"""


@pytest.fixture
def third_party(tmp_path: Path) -> Path:
    """Installed third-party backends, declared through entry-point metadata only."""
    (tmp_path / "fake_backends.py").write_text(FAKE_BACKENDS)
    (tmp_path / "boom_backend.py").write_text("raise RuntimeError('broken on import')\n")
    _fake_distribution(
        tmp_path,
        "fake_backends",
        "fakekv = fake_backends:fakekv\nliar = fake_backends:liar\nlegacy = fake_backends:legacy",
        "fake = fake_backends:fakekv\nfake2 = fake_backends:fakekv\nliar = fake_backends:liar",
    )
    _fake_distribution(
        tmp_path, "boom", "boom = boom_backend:backend", "boom = boom_backend:backend"
    )
    return tmp_path


def test_a_declared_scheme_imports_only_its_backend(third_party: Path) -> None:
    result = _fresh(
        """
        from pai_storage.backend import backend_for_url, get_backend
        out["fake"] = backend_for_url("fake+drv://h")[0].name
        out["fake2"] = backend_for_url("FAKE2://h")[0].name
        out["by_name"] = get_backend("fakekv").name
        out["boom_imported"] = "boom_backend" in sys.modules
        """,
        path=third_party,
    )
    assert (result["fake"], result["fake2"], result["by_name"]) == ("fakekv",) * 3
    assert result["boom_imported"] is False
    assert result["roots"] == []  # no built-in backend either


def test_undeclared_scheme_falls_back_to_every_backend(third_party: Path) -> None:
    result = _fresh(
        """
        from pai_storage.errors import ThreadStoreConfigurationError
        from pai_storage.backend import backend_for_url
        out["legacy"] = backend_for_url("legacy://h")[0].name  # declares no scheme
        try:
            backend_for_url("liar://h")
        except ThreadStoreConfigurationError as exc:
            out["liar"] = str(exc)
        """,
        path=third_party,
    )
    assert result["legacy"] == "legacy"
    assert "no backend serves URL scheme 'liar'" in result["liar"]
    assert "backend 'boom' failed to load (RuntimeError: broken on import)" in result["liar"]
    assert "names backend 'liar', whose url_schemes do not include 'liar'" in result["liar"]
    assert "honest" in result["liar"]  # listed as installed once everything is loaded


def test_registering_a_declared_scheme_is_a_clash_before_first_use(third_party: Path) -> None:
    result = _fresh(
        """
        from pai_storage import register_backend
        from pai_storage.errors import ThreadStoreConfigurationError
        from fake_backends import Fake
        for name, scheme in (("mine", "fake"), ("fakekv", "other")):
            try:
                register_backend(Fake(name, (scheme,)))
            except ThreadStoreConfigurationError as exc:
                out[name] = str(exc)
        """,
        path=third_party,
    )
    assert result["mine"] == "URL scheme 'fake' already belongs to backend 'fakekv'"
    assert result["fakekv"] == "a backend named 'fakekv' is registered"


def test_unknown_name_lists_installed_backends_and_failures(third_party: Path) -> None:
    result = _fresh(
        """
        from pai_storage.errors import ThreadStoreConfigurationError
        from pai_storage.backend import get_backend
        for name in ("fakvk", "boom"):
            try:
                get_backend(name)
            except ThreadStoreConfigurationError as exc:
                out[name] = str(exc)
        """,
        path=third_party,
    )
    assert "unknown backend 'fakvk' (did you mean 'fakekv'?)" in result["fakvk"]
    installed = set(result["fakvk"].split("installed backends: ")[1].split(", "))
    assert {"fakekv", "legacy", "liar", "memory", "postgres", "mongo"} <= installed
    assert "boom" not in installed  # it failed to load: named in its own error instead
    assert result["boom"] == "backend 'boom' failed to load: RuntimeError: broken on import"


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
