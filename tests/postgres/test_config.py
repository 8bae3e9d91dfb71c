"""URL and option validation, schema creation and the schema-version guard."""

from __future__ import annotations

import asyncio
import random
import string

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import SCHEMA_VERSION, PostgresThreadStore, backend

import pai_storage
from pai_storage import CommittedResult, open_store
from pai_storage import builders as b
from pai_storage.errors import (
    ThreadStoreConfigurationError,
    ThreadStoreInvariantError,
    ThreadStorePageTokenError,
    ThreadStoreUnavailableError,
)

from .helpers import URL

SECRET = "pa55-w0rd-s3cret"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1/db",
        "postgres://u@127.0.0.1/db",
        "postgresql+asyncpg://u@127.0.0.1/db",
    ],
)
def test_schemes_open_postgres_stores(url: str) -> None:
    store = open_store(url)
    assert isinstance(store, PostgresThreadStore)
    assert backend.name == "postgres"
    assert backend.requires == ("asyncpg",)
    assert backend.extra == "postgres"


def test_unknown_option_names_the_valid_ones() -> None:
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        open_store(f"postgresql://u:{SECRET}@127.0.0.1/db", tabel_prefix="x")
    message = str(caught.value)
    assert "tabel_prefix" in message
    assert "table_prefix" in message
    assert "max_pool_size" in message
    assert SECRET not in message


@pytest.mark.parametrize("name", ["Bad-Name", 5, "x" * 41])
def test_a_bad_table_name_in_names_is_reported_as_names(name: object) -> None:
    with pytest.raises(pai_storage.ConfigurationError) as caught:
        pai_storage.open_kv_store(URL, names={"kv": name})
    assert str(caught.value).startswith("option names: the table name of kv must be ")
    assert "table_prefix" not in str(caught.value)


def test_other_driver_is_rejected() -> None:
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        open_store(f"postgresql+psycopg://u:{SECRET}@127.0.0.1/db")
    assert "postgresql+asyncpg" in str(caught.value)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"table_prefix": "Bad-Name"}, "table_prefix"),
        ({"table_prefix": "x" * 41}, "table_prefix"),
        ({"schema": "no spaces"}, "schema"),
        ({"min_pool_size": 5, "max_pool_size": 2}, "min_pool_size"),
        ({"max_pool_size": 0}, "max_pool_size"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"statement_cache_size": "many"}, "statement_cache_size"),
    ],
)
def test_bad_options_are_configuration_errors(options: dict[str, object], words: str) -> None:
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        open_store(f"postgresql://u:{SECRET}@127.0.0.1/db", **options)
    assert words in str(caught.value)
    assert SECRET not in str(caught.value)


TOKEN_SECRET = "t0ken-hunter2"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"clock": 5}, "clock"),
        ({"clock": "2026-01-01T00:00:00Z"}, "clock"),
        ({"on_warning": "log"}, "on_warning"),
        ({"token_secret": TOKEN_SECRET}, "token_secret"),
        ({"token_secret": b""}, "token_secret"),
    ],
)
def test_bad_common_options_fail_when_the_store_is_opened(
    options: dict[str, object], words: str
) -> None:
    # Raised by open_store itself, not at the first operation; the same for the class.
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        open_store(f"postgresql://u:{SECRET}@127.0.0.1/db", **options)
    assert words in str(caught.value)
    assert SECRET not in str(caught.value)
    assert TOKEN_SECRET not in str(caught.value)
    with pytest.raises(ThreadStoreConfigurationError, match=words):
        PostgresThreadStore("postgresql://u@127.0.0.1/db", **options)


async def test_token_secret_reaches_the_page_tokens(pg_schema: str) -> None:
    one = PostgresThreadStore(URL, schema=pg_schema, token_secret=b"key-one")
    two = PostgresThreadStore(URL, schema=pg_schema, token_secret=b"key-two")
    page_of_one = {"type": "page", "view": "raw", "page": {"limit": 1}}
    try:
        messages = [b.insert(b.message(f"m{i}")) for i in range(3)]
        assert isinstance(
            await one.commit_thread(b.create("scope", "t", {"messages": messages})),
            CommittedResult,
        )
        first = await one.read_thread(b.read("scope", "t", messages=page_of_one))
        assert first.messages is not None
        token = first.messages.next_page_token
        assert token is not None
        assert one.selections.codec.payload(token)["k"] == "messages"  # this store's prefix
        more = {"type": "page", "view": "raw", "page": {"limit": 1, "pageToken": token}}
        second = await one.read_thread(b.read("scope", "t", messages=more))
        assert second.messages is not None
        assert [m.message_id for m in second.messages.items] == ["m1"]
        # A store with another secret refuses the token: the option is really used.
        with pytest.raises(ThreadStorePageTokenError, match="integrity"):
            await two.read_thread(b.read("scope", "t", messages=more))
    finally:
        await one.close()
        await two.close()


def test_repr_and_str_hide_the_password() -> None:
    store = open_store(f"postgresql://u:{SECRET}@127.0.0.1/db")
    assert SECRET not in repr(store)
    assert SECRET not in str(store)


@pytest.mark.asyncio
async def test_wrong_database_is_a_configuration_error_without_password() -> None:
    store = open_store(f"postgresql://postgres:{SECRET}@127.0.0.1:5432/no_such_database_here")
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        await store.initialize()
    assert "3D000" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value)


@pytest.mark.asyncio
async def test_unreachable_port_is_unavailable_without_password() -> None:
    store = open_store(f"postgresql://postgres:{SECRET}@127.0.0.1:9/test", connect_timeout=2)
    with pytest.raises(ThreadStoreUnavailableError) as caught:
        await store.initialize()
    assert SECRET not in str(caught.value)
    assert caught.value.__cause__ is not None


@pytest.mark.asyncio
async def test_initialize_creates_schema_and_records_version(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async def tables() -> dict[str, int]:
        """Each table of the schema with its oid (a table dropped and re-created gets a new one)."""
        rows = await pg_conn.fetch(
            "SELECT c.relname, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relkind = 'r'",
            pg_schema,
        )
        return {r["relname"]: r["oid"] for r in rows}

    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix="app_threads") as store:
        info = await store.info()
        assert info.server_version is not None
        assert info.server_version.startswith("PostgreSQL ")
        await store.initialize()  # idempotent
        assert isinstance(await store.commit_thread(b.create("scope", "kept")), CommittedResult)
    created = await tables()
    assert set(created) == {
        "app_threads",
        "app_threads_messages",
        "app_threads_runs",
        "app_threads_queued_items",
        "app_threads_schema",
        # The runtime stores' tables, created with the same schema version.
        "app_threads_kv",
        "app_threads_agent_sessions",
        "app_threads_agent_sessions_values",
        "app_threads_agent_sessions_items",
        "app_threads_snapshots",
        "app_threads_locks",
    }
    version = await pg_conn.fetchval(f'SELECT version FROM "{pg_schema}".app_threads_schema')
    assert version == SCHEMA_VERSION
    # A second store on the same tables sees the recorded version and creates nothing:
    # the same tables (same oids), one version row, and the first store's data intact.
    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix="app_threads") as again:
        await again.initialize()
        assert (await again.read_thread(b.read("scope", "kept"))).thread is not None
    assert await tables() == created
    rows = await pg_conn.fetch(f'SELECT version FROM "{pg_schema}".app_threads_schema')
    assert [r["version"] for r in rows] == [SCHEMA_VERSION]


@pytest.mark.asyncio
async def test_newer_schema_version_is_refused(pg_schema: str, pg_conn: asyncpg.Connection) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema):
        pass
    await pg_conn.execute(
        f'UPDATE "{pg_schema}".pai_threads_schema SET version = $1', SCHEMA_VERSION + 1
    )
    store = PostgresThreadStore(URL, schema=pg_schema)
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        await store.initialize()
    message = str(caught.value)
    assert "newer" in message
    assert str(SCHEMA_VERSION + 1) in message
    await store.close()


@pytest.mark.asyncio
async def test_concurrent_initialize_from_many_stores(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    stores = [PostgresThreadStore(URL, schema=pg_schema) for _ in range(8)]
    try:
        await asyncio.gather(*(s.initialize() for s in stores))
        rows = await pg_conn.fetch(f'SELECT version FROM "{pg_schema}".pai_threads_schema')
        assert [r["version"] for r in rows] == [SCHEMA_VERSION]
        result = await stores[3].commit_thread(b.create("scope", "t1"))
        assert isinstance(result, CommittedResult)
    finally:
        await asyncio.gather(*(s.close() for s in stores))


@pytest.mark.asyncio
async def test_concurrent_creates_one_wins(pg_schema: str) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema, max_pool_size=16) as store:
        results = await asyncio.gather(
            *(
                store.commit_thread(
                    b.create("scope", "race", {"messages": [b.insert(b.message(f"m{i}"))]})
                )
                for i in range(16)
            )
        )
        committed = [r for r in results if isinstance(r, CommittedResult)]
        assert len(committed) == 1
        assert committed[0].thread is not None
        winner = committed[0].thread.version
        for r in results:
            if not isinstance(r, CommittedResult):
                assert r.current_version in (None, winner)


async def test_ids_beyond_the_index_entry_limit_are_invariant_errors(pg_schema: str) -> None:
    # Three 1,024-character ids in one message key exceed PostgreSQL's 2,704-byte
    # b-tree entry: a typed invariant error, nothing written, store still usable.
    rng = random.Random(7)  # incompressible: PostgreSQL compresses repetitive index entries
    long_id = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(1024))
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        with pytest.raises(ThreadStoreInvariantError, match="cannot store this input"):
            await store.commit_thread(
                b.create(long_id, long_id, {"messages": [b.insert(b.message(long_id))]})
            )
        assert (await store.read_thread(b.read(long_id, long_id))).thread is None
        result = await store.commit_thread(b.create(long_id, long_id))
        assert isinstance(result, CommittedResult)


async def test_query_string_password_never_shown() -> None:
    store = open_store(f"postgresql://127.0.0.1:1/db?password={SECRET}&connect_timeout=1")
    assert SECRET not in repr(store)
    with pytest.raises(ThreadStoreUnavailableError) as caught:
        await store.initialize()
    assert SECRET not in str(caught.value)


UPDATED_INDEXES = {
    "pai_threads_scope_updated": "(scope_key, updated_at, thread_id)",
    "pai_threads_updated": "(updated_at, scope_key, thread_id)",
}


async def _indexes(conn: asyncpg.Connection, schema: str) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1", schema
    )
    return {r["indexname"]: r["indexdef"] for r in rows}


@pytest.mark.asyncio
async def test_version_2_database_is_migrated_in_place(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    """A database as schema version 2 left it (no updated-at indexes) gets them, keeps its data
    and serves the lifecycle operations; concurrent openers migrate it once."""
    assert SCHEMA_VERSION == 4
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        for i in range(5):
            assert isinstance(
                await store.commit_thread(b.create("scope", f"t{i}")), CommittedResult
            )
    # Back to version 2: the same tables without the version-3 indexes and the facts column.
    for name in UPDATED_INDEXES:
        await pg_conn.execute(f'DROP INDEX "{pg_schema}"."{name}"')
    await pg_conn.execute(f'ALTER TABLE "{pg_schema}".pai_threads DROP COLUMN facts')
    await pg_conn.execute(
        f'UPDATE "{pg_schema}".pai_threads_schema SET version = 2, '
        "upgraded_at = now() - interval '1 day'"
    )
    assert not set(UPDATED_INDEXES) & set(await _indexes(pg_conn, pg_schema))

    stores = [PostgresThreadStore(URL, schema=pg_schema) for _ in range(4)]
    try:
        await asyncio.gather(*(s.initialize() for s in stores))
        rows = await pg_conn.fetch(
            f"SELECT version, upgraded_at > now() - interval '1 hour' AS fresh FROM \"{pg_schema}\""
            ".pai_threads_schema"
        )
        assert [(r["version"], r["fresh"]) for r in rows] == [(SCHEMA_VERSION, True)]
        indexes = await _indexes(pg_conn, pg_schema)
        for name, columns in UPDATED_INDEXES.items():
            assert indexes[name].endswith(f"USING btree {columns}"), indexes[name]
        # The old threads are there, and the lifecycle operations find them through the index.
        exported = [line async for line in stores[0].export_threads("scope")]
        assert sum('"kind":"thread"' in line for line in exported) == 5
        assert await stores[1].erase_scope("scope") == 5
        assert (await stores[2].read_thread(b.read("scope", "t0"))).thread is None
    finally:
        await asyncio.gather(*(s.close() for s in stores))


@pytest.mark.asyncio
async def test_version_1_database_is_migrated_to_the_current_version(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    """Version 1 (thread tables only, no updated-at indexes) gains the runtime tables and
    the indexes in one step."""
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        assert isinstance(await store.commit_thread(b.create("scope", "old")), CommittedResult)
    for name in UPDATED_INDEXES:
        await pg_conn.execute(f'DROP INDEX "{pg_schema}"."{name}"')
    await pg_conn.execute(f'ALTER TABLE "{pg_schema}".pai_threads DROP COLUMN facts')
    runtime = await pg_conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename LIKE 'pai\\_%' "
        "AND tablename NOT LIKE 'pai\\_threads%'",
        pg_schema,
    )
    assert runtime
    for r in runtime:
        await pg_conn.execute(f'DROP TABLE "{pg_schema}"."{r["tablename"]}" CASCADE')
    await pg_conn.execute(f'UPDATE "{pg_schema}".pai_threads_schema SET version = 1')
    async with PostgresThreadStore(URL, schema=pg_schema) as store:
        heads = await store._thread_heads(None, updated_before=None, after=None, limit=10)
        assert [(h.scope_key, h.thread_id) for h in heads] == [("scope", "old")]
    assert (
        await pg_conn.fetchval(f'SELECT version FROM "{pg_schema}".pai_threads_schema')
        == SCHEMA_VERSION
    )
    assert set(UPDATED_INDEXES) <= set(await _indexes(pg_conn, pg_schema))
    tables = await pg_conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", pg_schema)
    assert {r["tablename"] for r in runtime} <= {r["tablename"] for r in tables}
