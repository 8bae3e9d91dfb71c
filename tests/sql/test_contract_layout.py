"""The SQL layout of ``docs/sql.md`` (Schema, SQLite, MariaDB / MySQL), checked on the databases.

Four thread tables and ``<p>_schema`` per ``table_prefix``, with the documented
columns, keys and index set on both dialects; identifiers keyed by 16-byte
BLAKE2b digests with the full id stored beside them; ``sort_key`` and
``updated_ms`` the commit time in epoch milliseconds; records as JSON text;
SQLite files in WAL mode; MariaDB tables
InnoDB with ``utf8mb4_bin``, identifiers as binary and records as ``LONGTEXT``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_sql import SqlThreadStore
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from support.threads import every_family_create

from pai_storage import CommittedResult, open_store
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreUnavailableError

from .conftest import Target, mysql_engine

pytestmark = pytest.mark.asyncio

# Columns of each table (``<p>`` stands for the prefix), as docs/sql.md#schema lists them.
COLUMNS: dict[str, set[str]] = {
    "<p>": {
        "tkey",
        "scope_key",
        "thread_id",
        "scope_h",
        "agent_h",
        "hidden",
        "parent_h",
        "category_h",
        "sort_key",
        "updated_ms",
        "scope_ord",
        "thread_ord",
        "instance_id",
        "revision",
        "messages_next",
        "runs_next",
        "queued_next",
        "doc",
        "facts",
    },
    "<p>_messages": {
        "tkey",
        "position",
        "id_h",
        "message_id",
        "run_h",
        "run_id",
        "relation",
        "transcript",
        "context",
        "doc",
    },
    "<p>_runs": {"tkey", "position", "id_h", "run_id", "status", "doc"},
    "<p>_queued_items": {"tkey", "position", "id_h", "queue_item_id", "run_h", "run_id", "doc"},
}

PRIMARY: dict[str, list[str]] = {
    "<p>": ["tkey"],
    "<p>_messages": ["tkey", "position"],
    "<p>_runs": ["tkey", "position"],
    "<p>_queued_items": ["tkey", "position"],
}

INDEXES: dict[str, dict[str, list[str]]] = {
    "<p>": {
        "<p>_list_vis": ["scope_h", "hidden", "sort_key", "thread_ord"],
        "<p>_list_agent": ["scope_h", "agent_h", "hidden", "sort_key", "thread_ord"],
        "<p>_list_agent_parent": [
            "scope_h",
            "agent_h",
            "hidden",
            "parent_h",
            "sort_key",
            "thread_ord",
        ],
        "<p>_list_agent_category": [
            "scope_h",
            "agent_h",
            "hidden",
            "category_h",
            "sort_key",
            "thread_ord",
        ],
        "<p>_list_parent": ["scope_h", "hidden", "parent_h", "sort_key", "thread_ord"],
        "<p>_list_category": ["scope_h", "hidden", "category_h", "sort_key", "thread_ord"],
        "<p>_scope_updated": ["scope_h", "updated_ms", "thread_ord"],
        "<p>_updated": ["updated_ms", "scope_ord", "thread_ord"],
    },
    "<p>_messages": {
        "<p>_messages_transcript": ["tkey", "transcript", "position"],
        "<p>_messages_context": ["tkey", "context", "position"],
        "<p>_messages_run": ["tkey", "run_h", "position"],
    },
    "<p>_runs": {"<p>_runs_status": ["tkey", "status", "position"]},
    "<p>_queued_items": {"<p>_queued_run": ["tkey", "run_h", "position"]},
}


def _prefix(target: Target) -> str:
    return str(target.options.get("table_prefix", "pai_threads"))


def _name(template: str, prefix: str) -> str:
    return template.replace("<p>", prefix)


@pytest_asyncio.fixture
async def engine(target: Target) -> AsyncIterator[AsyncEngine]:
    """A plain engine on the target's database, for looking at what the store made."""
    if target.dialect == "sqlite":
        made = create_async_engine(target.url.replace("sqlite://", "sqlite+aiosqlite://", 1))
    else:
        made = mysql_engine()
    try:
        yield made
    finally:
        await made.dispose()


def _turn(thread_id: str = "t1") -> dict[str, Any]:
    return every_family_create(
        thread_id,
        parentThreadId="p",
        category="c",
        metadata={"k": [1, 1.0, "2030-01-01T00:00:00Z"]},
    )


def _h(value: str) -> bytes:
    return hashlib.blake2b(value.encode(), digest_size=16).digest()


async def test_tables_keys_and_indexes_follow_the_documented_layout(
    target: Target, engine: AsyncEngine
) -> None:
    async with target.store() as store:
        await store.initialize()
    prefix = _prefix(target)

    def layout(sync_conn: Any) -> dict[str, Any]:
        inspector = inspect(sync_conn)
        found: dict[str, Any] = {"tables": set(inspector.get_table_names())}
        for template in COLUMNS:
            table = _name(template, prefix)
            found[template] = {
                "columns": {c["name"] for c in inspector.get_columns(table)},
                "primary": inspector.get_pk_constraint(table)["constrained_columns"],
                "unique": [u["column_names"] for u in inspector.get_unique_constraints(table)],
                "indexes": {
                    i["name"]: list(i["column_names"])
                    for i in inspector.get_indexes(table)
                    if not i.get("unique")
                },
            }
        found["schema"] = {c["name"] for c in inspector.get_columns(f"{prefix}_schema")}
        return found

    async with engine.connect() as conn:
        found = await conn.run_sync(layout)
    expected_tables = {_name(t, prefix) for t in COLUMNS} | {f"{prefix}_schema"}
    assert expected_tables <= found["tables"]
    assert "version" in found["schema"]
    for template, columns in COLUMNS.items():
        assert found[template]["columns"] == columns, template
        assert found[template]["primary"] == PRIMARY[template], template
        indexes = {_name(n, prefix): cols for n, cols in INDEXES[template].items()}
        assert found[template]["indexes"] == indexes, template
        if template != "<p>":
            assert found[template]["unique"] == [["tkey", "id_h"]], template


async def test_rows_hold_digests_ids_times_and_json_text(
    target: Target, engine: AsyncEngine
) -> None:
    async with target.store() as store:
        result = await store.commit_thread(_turn())
        assert isinstance(result, CommittedResult)
        read = await store.read_thread(
            b.read("scope", "t1", runs={"type": "ids", "runIds": ["r1", "r2"]})
        )
    assert read.thread is not None
    assert read.runs is not None
    prefix = _prefix(target)
    async with engine.connect() as conn:
        root = (await conn.execute(text(f"SELECT * FROM {prefix}"))).mappings().one()
        messages = (await conn.execute(text(f"SELECT * FROM {prefix}_messages"))).mappings().all()
        runs = (
            (await conn.execute(text(f"SELECT * FROM {prefix}_runs ORDER BY position")))
            .mappings()
            .all()
        )
        items = (await conn.execute(text(f"SELECT * FROM {prefix}_queued_items"))).mappings().all()
    assert bytes(root["scope_key"]) == b"scope"
    assert bytes(root["thread_id"]) == b"t1"
    assert len(bytes(root["tkey"])) == 16
    assert bytes(root["scope_h"]) == _h("scope")
    assert bytes(root["agent_h"]) == _h("assistant")
    assert bytes(root["parent_h"]) == _h("p")
    assert bytes(root["category_h"]) == _h("c")
    assert root["hidden"] in (0, False)
    assert root["revision"] == 1
    assert root["instance_id"] == read.thread.version.thread_instance_id
    epoch_ms = round(
        (read.thread.updated_at - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000
    )
    assert root["updated_ms"] == epoch_ms
    assert root["sort_key"] == -epoch_ms
    assert (root["messages_next"], root["runs_next"], root["queued_next"]) == (2, 3, 2)
    assert json.loads(root["doc"]) == read.thread.to_json()
    assert '"k":[1,1.0,"2030-01-01T00:00:00Z"]' in root["doc"].replace(" ", "")
    (message,) = messages
    assert bytes(message["tkey"]) == bytes(root["tkey"])
    assert bytes(message["id_h"]) == _h("m1")
    assert bytes(message["message_id"]) == b"m1"
    assert bytes(message["run_h"]) == _h("r1")
    assert message["relation"] == "input"
    assert [(r["position"], bytes(r["run_id"]), r["status"]) for r in runs] == [
        (1, b"r1", "running"),
        (2, b"r2", "queued"),
    ]
    assert [json.loads(r["doc"]) for r in runs] == [run.to_json() for run in read.runs.items]
    (item,) = items
    assert bytes(item["id_h"]) == _h("q1")
    assert bytes(item["run_h"]) == _h("r2")
    assert json.loads(item["doc"])["input"] == {"n": 1}


async def test_the_thread_key_digests_scope_and_thread_together(
    target: Target, engine: AsyncEngine
) -> None:
    # "ab" + "c" and "a" + "bc" must be two keys, and a thread id equal to
    # another scope's key must not collide either.
    async with target.store() as store:
        for scope, thread in (("ab", "c"), ("a", "bc"), ("c", "ab")):
            assert isinstance(await store.commit_thread(b.create(scope, thread)), CommittedResult)
        for scope, thread in (("ab", "c"), ("a", "bc"), ("c", "ab")):
            read = await store.read_thread(b.read(scope, thread))
            assert read.thread is not None
            assert (read.thread.scope_key, read.thread.thread_id) == (scope, thread)
    async with engine.connect() as conn:
        keys = (await conn.execute(text(f"SELECT tkey FROM {_prefix(target)}"))).scalars().all()
    assert len({bytes(k) for k in keys}) == 3
    assert all(len(bytes(k)) == 16 for k in keys)


async def test_a_sqlite_file_is_in_wal_mode(sqlite_target: Target) -> None:
    async with sqlite_target.store() as store:
        assert isinstance(await store.commit_thread(b.create("scope", "t1")), CommittedResult)
        path = sqlite_target.url.removeprefix("sqlite:///")
        # WAL is recorded in the file itself: any connection sees it.
        with sqlite3.connect(path) as probe:
            assert probe.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    async with open_store(sqlite_target.url) as again:
        read = await again.read_thread(b.read("scope", "t1"))
        assert read.thread is not None


async def test_mariadb_tables_are_innodb_binary_utf8mb4(mysql_target: Target) -> None:
    prefix = _prefix(mysql_target)
    async with mysql_target.store() as store:
        await store.initialize()
    engine = mysql_engine()
    try:
        async with engine.connect() as conn:
            tables = (
                (
                    await conn.execute(
                        text(
                            "SELECT table_name AS name, engine, table_collation AS collation "
                            "FROM information_schema.tables WHERE table_schema = DATABASE() "
                            "AND table_name IN :names"
                        ).bindparams(names=tuple(_name(t, prefix) for t in COLUMNS)),
                    )
                )
                .mappings()
                .all()
            )
            columns = (
                (
                    await conn.execute(
                        text(
                            "SELECT table_name AS tab, column_name AS col, data_type AS type "
                            "FROM information_schema.columns WHERE table_schema = DATABASE() "
                            "AND table_name IN :names"
                        ).bindparams(names=tuple(_name(t, prefix) for t in COLUMNS)),
                    )
                )
                .mappings()
                .all()
            )
    finally:
        await engine.dispose()
    assert len(tables) == len(COLUMNS)
    for table in tables:
        assert table["engine"] == "InnoDB", table["name"]
        assert table["collation"] == "utf8mb4_bin", table["name"]
    types = {(c["tab"], c["col"]): c["type"].lower() for c in columns}
    for (table, column), kind in types.items():
        if column == "doc":
            assert kind == "longtext", (table, column)
        if column in {"scope_key", "thread_id", "message_id", "run_id", "queue_item_id"}:
            assert kind == "varbinary", (table, column)
        if column == "tkey" or column.endswith("_h"):
            assert kind in {"binary", "varbinary"}, (table, column)


async def test_the_default_and_a_custom_prefix_name_the_tables() -> None:
    store = SqlThreadStore("sqlite:///:memory:")
    assert store.tables.threads.name == "pai_threads"
    prefix = f"app_{uuid.uuid4().hex[:8]}"
    custom = SqlThreadStore("sqlite:///:memory:", table_prefix=prefix)
    assert custom.tables.threads.name == prefix
    assert custom.tables.messages.name == f"{prefix}_messages"
    assert custom.tables.runs.name == f"{prefix}_runs"
    assert custom.tables.queued.name == f"{prefix}_queued_items"
    await store.close()
    await custom.close()


async def test_no_password_in_log_lines_errors_or_repr(caplog: pytest.LogCaptureFixture) -> None:
    secret = "pw-Secr3t-sql"
    caplog.set_level(logging.DEBUG)
    store = open_store(f"mysql://root:{secret}@127.0.0.1:1/test", connect_timeout=2)
    assert secret not in repr(store)
    assert secret not in str(store)
    with pytest.raises(ThreadStoreUnavailableError) as caught:
        await store.initialize()
    await store.close()
    error = caught.value
    for shown in (str(error), repr(error), str(error.__cause__), repr(error.__cause__)):
        assert secret not in shown
    assert secret not in caplog.text


async def test_lazy_initialize_idempotent_initialize_and_close(target: Target) -> None:
    store = target.store()
    # The first operation initializes the store (creates the tables).
    assert isinstance(await store.commit_thread(b.create("scope", "t1")), CommittedResult)
    await store.initialize()
    await store.initialize()
    assert (await store.read_thread(b.read("scope", "t1"))).thread is not None
    await store.close()
    await store.close()
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.read_thread(b.read("scope", "t1"))
    async with target.store() as scoped:
        assert (await scoped.read_thread(b.read("scope", "t1"))).thread is not None
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await scoped.read_thread(b.read("scope", "t1"))


async def test_without_on_warning_a_skipped_root_is_logged_without_its_contents(
    target: Target, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = _prefix(target)
    async with target.store() as store:
        created = await store.commit_thread(b.create("scope", "bad", metadata={"note": "personal"}))
        assert isinstance(created, CommittedResult)
        async with engine.begin() as conn:
            doc = json.loads((await conn.execute(text(f"SELECT doc FROM {prefix}"))).scalar_one())
            del doc["privateMetadata"]
            await conn.execute(text(f"UPDATE {prefix} SET doc = :doc"), {"doc": json.dumps(doc)})
        with caplog.at_level(logging.WARNING, logger="pai_storage"):
            page = await store.list_threads({"scopeKey": "scope", "limit": 10})
    assert page.items == []
    logged = [r for r in caplog.records if r.name == "pai_storage"]
    assert len(logged) == 1
    assert logged[0].levelno == logging.WARNING
    assert "invalid_thread_skipped" in logged[0].getMessage()
    assert "personal" not in caplog.text
