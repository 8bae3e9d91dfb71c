"""``client=`` and ``names=``: an application's own engine or client, renamed tables.

An application's SQLAlchemy ``AsyncEngine`` serves every store of a
``connect()`` call and is never disposed; a :class:`SqlClient` the application
makes is never closed by its stores; ``names`` gives a runtime component's
tables a base name of its own. Everything runs on a real SQLite file and a
real MariaDB.
"""

from __future__ import annotations

import asyncio
import importlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_sql.client import SqlClient
from pai_storage_sql.schema import MAX_PREFIX_LENGTH, Tables
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import pai_storage
from pai_storage import CommittedResult, ConfigurationError, make_url
from pai_storage import builders as b

from .conftest import Target, drop_tables


def engine_for(target: Target) -> AsyncEngine:
    """An application's engine on the target's database."""
    if target.dialect == "sqlite":
        return create_async_engine(target.url.replace("sqlite://", "sqlite+aiosqlite://"))
    url = make_url(target.url).render(hide_password=False, scheme="mysql+asyncmy")
    return create_async_engine(f"{url}?charset=utf8mb4")


@pytest_asyncio.fixture
async def engine(target: Target) -> AsyncIterator[AsyncEngine]:
    made = engine_for(target)
    yield made
    await made.dispose()


async def tables_of(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))


async def use_every_store(stores: Any) -> None:
    created = await stores.threads.commit_thread(b.create("s", "t", title="engine"))
    assert created.thread.version.revision >= 1
    await stores.kv.put(("ns",), "k", {"v": 1})
    await stores.state.save("u", "s", "k", [1, 2])
    await stores.snapshots.put("scope", "id", b"data")
    async with stores.guard.hold("r", owner="me", lease_ttl=timedelta(minutes=1)) as lock:
        assert lock.fencing_token >= 1


async def test_connect_over_an_application_engine(target: Target, engine: AsyncEngine) -> None:
    prefix = target.options.get("table_prefix", "pai_threads")
    async with pai_storage.connect(target.url, client=engine, **target.options) as stores:
        await use_every_store(stores)
        client = stores.kv._db.client  # type: ignore[attr-defined]
        assert not client.owns_engine
        assert stores.threads._client is client  # type: ignore[attr-defined]
    assert client.closed
    # The engine was not disposed of: it still serves the application ...
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    assert f"{prefix}_messages" in await tables_of(engine)
    # ... and another bundle over it sees what the first one wrote.
    async with pai_storage.connect(target.url, client=engine, **target.options) as stores:
        item = await stores.kv.get(("ns",), "k")
        assert item is not None
        assert item.value == {"v": 1}
        assert await stores.state.get("u", "s", "k") == [1, 2]
        read = await stores.threads.read_thread(b.read("s", "t"))
        assert read.thread is not None
        assert read.thread.title == "engine"
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1


async def test_store_alone_over_an_application_engine(target: Target, engine: AsyncEngine) -> None:
    kv = pai_storage.open_kv_store(target.url, client=engine, **target.options)
    try:
        await kv.put(("alone",), "k", 1)
        item = await kv.get(("alone",), "k")
        assert item is not None
        assert item.value == 1
    finally:
        await kv.close()
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1


async def test_sqlite_engine_connections_get_foreign_keys(tmp_path: Any) -> None:
    # A session's states go with it (ON DELETE CASCADE needs foreign keys on).
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/app.db")
    try:
        async with pai_storage.connect(f"sqlite:///{tmp_path}/app.db", client=engine) as stores:
            await stores.state.save("u", "s", "k", 1)
            assert await stores.state.delete("u", "s")
            engines = await stores.state._db.client.ready()  # type: ignore[attr-defined]
            async with engines.writer.connect() as conn:
                pragma = await conn.exec_driver_sql("PRAGMA foreign_keys")
                assert pragma.scalar_one() == 1
            async with engine.connect() as conn:
                left = await conn.execute(text("SELECT count(*) FROM pai_agent_sessions_values"))
                assert left.scalar_one() == 0
    finally:
        await engine.dispose()


async def test_application_sql_client_is_not_closed_by_its_stores(target: Target) -> None:
    async with SqlClient(target.url, **target.options) as client:
        async with pai_storage.connect(target.url, client=client) as stores:
            await use_every_store(stores)
        assert not client.closed
        kv = pai_storage.open_kv_store(target.url, client=client)
        try:
            item = await kv.get(("ns",), "k")
            assert item is not None
            assert item.value == {"v": 1}
        finally:
            await kv.close()
        assert not client.closed
        engines = await client.ready()
    assert client.closed
    # Its engines were disposed of with it (a new checkout opens a new connection).
    assert engines.writer.sync_engine.pool.checkedout() == 0


async def test_client_is_closed_by_its_last_store_after_the_application(target: Target) -> None:
    client = SqlClient(target.url, **target.options)
    kv = pai_storage.open_kv_store(target.url, client=client)
    await kv.put(("ns",), "k", 1)
    await client.close()
    await client.close()  # once only
    assert not client.closed
    assert (await kv.get(("ns",), "k")) is not None
    await kv.close()
    assert client.closed


async def test_wrong_client_names_what_is_accepted(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    sync_engine = create_engine("sqlite://")
    try:
        for wrong in (object(), "sqlite:///other.db", sync_engine):
            with pytest.raises(ConfigurationError, match=r"AsyncEngine .* or a pai_storage_sql"):
                pai_storage.connect(url, client=wrong)
            with pytest.raises(ConfigurationError, match="AsyncEngine"):
                pai_storage.open_kv_store(url, client=wrong)
    finally:
        sync_engine.dispose()
    other = create_async_engine("postgresql+asyncpg://postgres@127.0.0.1/test")
    try:
        with pytest.raises(ConfigurationError, match="not an engine for postgresql"):
            pai_storage.connect(url, client=other)
    finally:
        await other.dispose()


async def test_engine_options_and_mismatched_url(tmp_path: Any) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/x.db")
    try:
        with pytest.raises(ConfigurationError, match=r"pool_size .*own pool settings"):
            pai_storage.connect(f"sqlite:///{tmp_path}/x.db", client=engine, pool_size=3)
        with pytest.raises(ConfigurationError, match="different databases"):
            pai_storage.connect("mysql://root@127.0.0.1/test", client=engine)
    finally:
        await engine.dispose()


async def test_mysql_engine_needs_utf8mb4(mysql_target: Target) -> None:
    url = make_url(mysql_target.url).render(hide_password=False, scheme="mysql+asyncmy")
    engine = create_async_engine(f"{url}?charset=latin1")
    try:
        kv = pai_storage.open_kv_store(mysql_target.url, client=engine, **mysql_target.options)
        try:
            with pytest.raises(ConfigurationError, match="utf8mb4"):
                await kv.put(("ns",), "k", 1)
        finally:
            await kv.close()
    finally:
        await engine.dispose()


async def test_mysql_engine_at_another_isolation_level(mysql_target: Target) -> None:
    url = make_url(mysql_target.url).render(hide_password=False, scheme="mysql+asyncmy")
    engine = create_async_engine(f"{url}?charset=utf8mb4", isolation_level="READ COMMITTED")
    try:
        async with pai_storage.connect(
            mysql_target.url, client=engine, **mysql_target.options
        ) as stores:
            client = stores.kv._db.client  # type: ignore[attr-defined]
            await use_every_store(stores)
            engines = await client.ready()
            async with engines.writer.connect() as conn:
                assert await conn.get_isolation_level() == "REPEATABLE READ"
        async with engine.connect() as conn:
            assert await conn.get_isolation_level() == "READ COMMITTED"
    finally:
        await engine.dispose()


@pytest_asyncio.fixture
async def renamed(target: Target) -> AsyncIterator[dict[str, Any]]:
    names = {"kv": "app_items", "guard": "app_leases"}
    yield names
    if target.dialect == "mysql":
        await drop_tables_named(target, names)


async def drop_tables_named(target: Target, names: dict[str, str]) -> None:
    engine = engine_for(target)
    try:
        tables = Tables.define(target.options["table_prefix"], names)
        async with engine.begin() as conn:
            await conn.run_sync(tables.metadata.drop_all)
    finally:
        await engine.dispose()
    await drop_tables(target.options["table_prefix"])


async def test_names_rename_a_components_tables(
    target: Target, renamed: dict[str, str], engine: AsyncEngine
) -> None:
    # The schema first created without names ...
    async with pai_storage.connect(target.url, **target.options) as stores:
        await stores.kv.put(("ns",), "k", "default")
    # ... gets the renamed tables when a bundle asks for them.
    async with pai_storage.connect(target.url, names=renamed, **target.options) as stores:
        assert stores.kv.table.name == "app_items"  # type: ignore[attr-defined]
        assert await stores.kv.get(("ns",), "k") is None
        await stores.kv.put(("ns",), "k", "renamed")
        async with stores.guard.hold("r", owner="me", lease_ttl=timedelta(minutes=1)):
            pass
    found = await tables_of(engine)
    assert {"app_items", "app_leases", "app_leases_fencing"} <= found
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT count(*) FROM app_items"))
        assert rows.scalar_one() == 1
    kv = pai_storage.open_kv_store(target.url, names=renamed, **target.options)
    try:
        item = await kv.get(("ns",), "k")
        assert item is not None
        assert item.value == "renamed"
    finally:
        await kv.close()


@pytest.mark.parametrize(
    ("module", "cls", "component"),
    [
        ("kv", "SqlKeyValueStore", "kv"),
        ("state", "SqlAgentStateStore", "state"),
        ("snapshots", "SqlSnapshotStore", "snapshots"),
        ("guard", "SqlExecutionGuard", "guard"),
    ],
)
def test_every_runtime_store_opened_alone_takes_every_client_option(
    tmp_path: Any, module: str, cls: str, component: str
) -> None:
    # The client's options are the same for the four stores (one constructor).
    store_class = getattr(importlib.import_module(f"pai_storage_sql.{module}"), cls)
    store = store_class(
        f"sqlite:///{tmp_path}/alone.db",
        table_prefix="mine",
        names={component: "renamed"},
        busy_timeout=2,
        pool_size=2,
        connect_timeout=3,
        retry_attempts=2,
    )
    assert "'renamed" in repr(store)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ("my_kv", "must be a dict"),
        ({"threads": "x"}, "unknown component 'threads'"),
        ({"kv": "My-KV"}, "table name of kv"),
        ({"kv": "k" * 50}, "1 to 49 characters"),
        ({"kv": 3}, "table name of kv"),
        ({"kv": "same", "snapshots": "same"}, "same name"),
        ({"kv": "pai_threads_messages"}, "same name"),
    ],
)
async def test_bad_names_are_refused(tmp_path: Any, names: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        pai_storage.connect(f"sqlite:///{tmp_path}/x.db", names=names)


async def test_longest_table_prefix_names_every_mysql_table_and_index() -> None:
    from .conftest import MYSQL_URL

    prefix = ("p" + uuid.uuid4().hex)[:MAX_PREFIX_LENGTH].ljust(MAX_PREFIX_LENGTH, "_")
    try:
        async with pai_storage.connect(MYSQL_URL, table_prefix=prefix) as stores:
            await use_every_store(stores)
    finally:
        await drop_tables(prefix)
    with pytest.raises(ConfigurationError, match=f"1 to {MAX_PREFIX_LENGTH} characters"):
        pai_storage.connect(MYSQL_URL, table_prefix=prefix + "x")


async def test_thread_store_alone_over_an_application_engine(
    target: Target, engine: AsyncEngine
) -> None:
    async with pai_storage.open_store(target.url, client=engine, **target.options) as store:
        created = await store.commit_thread(b.create("s", "alone", title="t"))
        assert isinstance(created, CommittedResult)
        read = await store.read_thread(b.read("s", "alone"))
        assert read.thread is not None
        assert read.thread.title == "t"
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    with pytest.raises(ConfigurationError, match="unknown option"):
        pai_storage.open_store(target.url, names={"kv": "x"})


async def test_concurrent_operations_over_an_application_sqlite_engine(tmp_path: Any) -> None:
    # No dedicated writer connection: writers of the engine's pool queue on the
    # database lock (BEGIN IMMEDIATE) while readers read.
    url = f"sqlite:///{tmp_path}/app.db"
    engine = create_async_engine(url.replace("sqlite://", "sqlite+aiosqlite://"))
    try:
        async with pai_storage.connect(url, client=engine) as stores:

            async def work(i: int) -> None:
                created = await stores.threads.commit_thread(b.create("s", f"t{i}"))
                assert isinstance(created, CommittedResult)
                await stores.kv.put(("ns",), f"k{i}", i)
                item = await stores.kv.get(("ns",), f"k{i}")
                assert item is not None
                assert item.value == i
                await stores.state.append_list("u", "s", "l", [i])

            await asyncio.gather(*(work(i) for i in range(20)))
            assert sorted(await stores.state.get_list("u", "s", "l")) == list(range(20))
            page = await stores.threads.list_threads({"scopeKey": "s", "limit": 50})
            assert len(page.items) == 20
    finally:
        await engine.dispose()


async def test_store_classes_are_exported_lazily() -> None:
    import pai_storage_sql
    from pai_storage_sql import guard, kv, snapshots, state

    assert pai_storage_sql.SqlKeyValueStore is kv.SqlKeyValueStore
    assert pai_storage_sql.SqlAgentStateStore is state.SqlAgentStateStore
    assert pai_storage_sql.SqlSnapshotStore is snapshots.SqlSnapshotStore
    assert pai_storage_sql.SqlExecutionGuard is guard.SqlExecutionGuard
    with pytest.raises(AttributeError):
        _ = pai_storage_sql.SqlNothing


@pytest.mark.parametrize("query", ["?mode=ro", "?bogus=1&timeout=abc", "?password=S3cretPW"])
@pytest.mark.parametrize("opener", ["open_store", "open_kv_store", "open_state_store"])
async def test_a_sqlite_url_with_query_parameters_is_refused(
    tmp_path: Any, query: str, opener: str
) -> None:
    """SQLite takes no URL query parameters: each is refused by name, never
    ignored (``?mode=ro`` would otherwise open the file writable) nor handed to
    the driver to fail untyped; no value is shown."""
    url = f"sqlite:///{tmp_path}/q.db{query}"
    with pytest.raises(ConfigurationError, match="takes no query parameters") as caught:
        async with getattr(pai_storage, opener)(url):
            pass
    for name in (p.split("=")[0] for p in query[1:].split("&")):
        assert name in str(caught.value)
    assert "S3cretPW" not in str(caught.value)
    assert not (tmp_path / "q.db").exists()
