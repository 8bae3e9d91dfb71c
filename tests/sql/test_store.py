"""The SQL thread store on real databases: identity, schema versions, stored rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pai_storage_sql import SqlThreadStore
from pai_storage_sql.schema import SCHEMA_VERSION
from sqlalchemy import select, update

from pai_storage import CommittedResult, ConfigurationError, open_store
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreUnavailableError

from .conftest import Target

pytestmark = pytest.mark.asyncio


async def test_ids_differing_in_case_and_trailing_space_are_distinct(
    store: SqlThreadStore,
) -> None:
    # MariaDB's utf8mb4_bin is PAD SPACE: "a" and "a " would collide in a
    # VARCHAR key. Ids are bytes here, so all three are separate threads.
    for thread_id in ("a", "A", "a "):
        created = await store.commit_thread(
            b.create("s", thread_id, {"messages": [b.insert(b.message("m", thread_id))]})
        )
        assert isinstance(created, CommittedResult)
    for thread_id in ("a", "A", "a "):
        read = await store.read_thread(
            b.read("s", thread_id, messages={"type": "page", "view": "raw", "page": {"limit": 5}})
        )
        assert read.thread is not None
        assert read.thread.thread_id == thread_id
        assert read.messages is not None
        assert [m.parts[0].text for m in read.messages.items] == [thread_id]  # type: ignore[union-attr]
    listed = await store.list_threads({"scopeKey": "s", "limit": 10})
    assert sorted(t.thread_id for t in listed.items) == ["A", "a", "a "]
    # The same holds for scope keys and record ids.
    for scope in ("x", "X", "x "):
        await store.commit_thread(b.create(scope, "t"))
    for scope in ("x", "X", "x "):
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert [(t.scope_key, t.thread_id) for t in listed.items] == [(scope, "t")]


async def test_list_tie_break_is_code_point_order(store: SqlThreadStore) -> None:
    ids = ["b", "a", "\U0001f600", "\uffff", "a ", "A", "é"]
    for thread_id in ids:
        await store.commit_thread(b.create("order", thread_id))
    listed = await store.list_threads({"scopeKey": "order", "limit": 100})
    # Updated at different milliseconds or not, equal timestamps must tie-break by
    # code point; compare against the order the contract defines.
    expected = sorted(listed.items, key=lambda t: (-t.updated_at.timestamp(), t.thread_id))
    assert [t.thread_id for t in listed.items] == [t.thread_id for t in expected]
    assert sorted(t.thread_id for t in listed.items) == sorted(ids)


async def test_schema_version_is_recorded(target: Target) -> None:
    async with target.store() as store:
        await store.commit_thread(b.create("s", "t"))
        engines = await store.client.ready()
        version = store.client.tables.version
        async with engines.reader.connect() as conn:
            stored = (await conn.execute(select(version.c.version))).scalar_one()
    assert stored == SCHEMA_VERSION
    # Opening again is idempotent: same tables, same data.
    async with target.store() as again:
        read = await again.read_thread(b.read("s", "t"))
        assert read.thread is not None


async def test_newer_schema_version_is_a_configuration_error(target: Target) -> None:
    async with target.store() as store:
        await store.commit_thread(b.create("s", "t"))
        engines = await store.client.ready()
        version = store.client.tables.version
        async with engines.writer.begin() as conn:
            await conn.execute(update(version).values(version=SCHEMA_VERSION + 1))
    with pytest.raises(ThreadStoreConfigurationError, match="newer than this pai-storage"):
        async with target.store() as newer:
            await newer.read_thread(b.read("s", "t"))


async def test_open_store_by_url(sqlite_target: Target) -> None:
    async with open_store(sqlite_target.url) as store:
        assert isinstance(store, SqlThreadStore)
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        info = await store.info()
        assert info.backend == "sql"
        assert info.server_version is not None
        assert info.server_version.startswith("SQLite")


@pytest.mark.parametrize(
    "url",
    ["sqlite+pysqlite:///x.db", "mysql+mysqldb://h/db", "postgresql://h/db"],
)
async def test_other_schemes_and_drivers_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError):
        SqlThreadStore(url)


@pytest.mark.parametrize(
    ("option", "value"),
    [("table_prefix", "Bad-Prefix"), ("busy_timeout", 0), ("pool_size", 0)],
)
async def test_bad_options_are_refused(option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option):
        SqlThreadStore("sqlite:///:memory:", **{option: value})


async def test_a_missing_driver_names_what_to_install() -> None:
    # aiomysql is accepted but installed by no extra of pai-storage.
    with pytest.raises(ConfigurationError, match="pip install aiomysql"):
        SqlThreadStore("mysql+aiomysql://root@127.0.0.1/test")


async def test_password_never_in_messages() -> None:
    store = SqlThreadStore("mysql://root:s3cr3t-pw@127.0.0.1:1/test", connect_timeout=1)
    with pytest.raises(ThreadStoreUnavailableError) as caught:
        await store.read_thread(b.read("s", "t"))
    await store.close()
    assert "s3cr3t-pw" not in str(caught.value)
    assert "s3cr3t-pw" not in repr(store)


async def test_memory_database(tmp_path: object) -> None:
    async with SqlThreadStore("sqlite:///:memory:") as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        read = await store.read_thread(b.read("s", "t"))
        assert read.thread is not None


async def test_unopenable_sqlite_files_are_configuration_errors(tmp_path: Path) -> None:
    missing = SqlThreadStore(f"sqlite:///{tmp_path}/no/such/dir/pai.db")
    with pytest.raises(ThreadStoreConfigurationError, match="unable to open"):
        await missing.read_thread(b.read("s", "t"))
    await missing.close()
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database " * 100)
    wrong = SqlThreadStore(f"sqlite:///{not_sqlite}")
    with pytest.raises(ThreadStoreConfigurationError, match="not a database"):
        await wrong.read_thread(b.read("s", "t"))
    await wrong.close()


async def test_unknown_mysql_url_parameters_are_a_configuration_error() -> None:
    # Store options are keyword arguments; a URL parameter the driver does not take
    # is named in a typed error before any connection is made (never a TypeError).
    store = SqlThreadStore("mysql://root:secret@127.0.0.1/test?table_prefix=x&charset=utf8mb4")
    with pytest.raises(ConfigurationError, match="table_prefix") as caught:
        await store.read_thread(b.read("s", "t"))
    assert "secret" not in str(caught.value)
    assert "charset" not in str(caught.value)
    await store.close()
