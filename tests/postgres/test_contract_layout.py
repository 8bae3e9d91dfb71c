"""The PostgreSQL layout of ``docs/postgres.md`` (Schema, Indexes, Commits), checked on the server.

Normalized tables for roots, messages, runs and queued items under a configurable
prefix, with the documented columns and types (identifiers ``bytea``, records
JSON text, never ``jsonb``), no foreign keys, the documented index set, one
transaction per commit holding the root row, and a schema that ``initialize()``
records but does not re-create on later start-ups.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from pai_storage_postgres import SCHEMA_VERSION, PostgresThreadStore
from support.threads import every_family_create

from pai_storage import CommittedResult, ManualClock, ThreadVersion, make_url, open_store
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreUnavailableError

from .helpers import URL

pytestmark = pytest.mark.asyncio

PREFIX = "app_threads"

# (column, type, nullable) per table, in column order, as docs/postgres.md#schema lists them.
COLUMNS: dict[str, list[tuple[str, str, bool]]] = {
    PREFIX: [
        ("scope_key", "bytea", False),
        ("thread_id", "bytea", False),
        ("instance_id", "text", False),
        ("revision", "bigint", False),
        ("agent", "bytea", False),
        ("list_visibility", "text", False),
        ("parent_thread_id", "bytea", True),
        ("category", "bytea", True),
        ("updated_at", "timestamp with time zone", False),
        ("sort_key", "bigint", False),
        ("messages_next", "bigint", False),
        ("runs_next", "bigint", False),
        ("queued_next", "bigint", False),
        ("doc", "text", False),
        ("facts", "text", True),
    ],
    f"{PREFIX}_messages": [
        ("scope_key", "bytea", False),
        ("thread_id", "bytea", False),
        ("position", "bigint", False),
        ("message_id", "bytea", False),
        ("run_id", "bytea", True),
        ("relation", "text", True),
        ("transcript", "boolean", False),
        ("context", "boolean", False),
        ("doc", "text", False),
    ],
    f"{PREFIX}_runs": [
        ("scope_key", "bytea", False),
        ("thread_id", "bytea", False),
        ("position", "bigint", False),
        ("run_id", "bytea", False),
        ("status", "text", False),
        ("doc", "text", False),
    ],
    f"{PREFIX}_queued_items": [
        ("scope_key", "bytea", False),
        ("thread_id", "bytea", False),
        ("position", "bigint", False),
        ("queue_item_id", "bytea", False),
        ("run_id", "bytea", False),
        ("doc", "text", False),
    ],
}

# Index name (without the prefix) -> its definition after ``USING``.
INDEXES: dict[str, str] = {
    "_pkey": "btree (scope_key, thread_id)",
    "_list_vis": "btree (scope_key, list_visibility, sort_key, thread_id)",
    "_list_agent": "btree (scope_key, agent, list_visibility, sort_key, thread_id)",
    "_list_agent_parent": "btree (scope_key, agent, list_visibility, parent_thread_id, "
    "sort_key, thread_id) WHERE (parent_thread_id IS NOT NULL)",
    "_list_agent_category": "btree (scope_key, agent, list_visibility, category, sort_key, "
    "thread_id) WHERE (category IS NOT NULL)",
    "_list_parent": "btree (scope_key, list_visibility, parent_thread_id, sort_key, thread_id) "
    "WHERE (parent_thread_id IS NOT NULL)",
    "_list_category": "btree (scope_key, list_visibility, category, sort_key, thread_id) "
    "WHERE (category IS NOT NULL)",
    "_scope_updated": "btree (scope_key, updated_at, thread_id)",
    "_updated": "btree (updated_at, scope_key, thread_id)",
    "_messages_pkey": 'btree (scope_key, thread_id, "position")',
    "_messages_transcript": 'btree (scope_key, thread_id, "position") WHERE transcript',
    "_messages_context": 'btree (scope_key, thread_id, "position") WHERE context',
    "_messages_run": 'btree (scope_key, thread_id, run_id, "position") WHERE (run_id IS NOT NULL)',
    "_runs_pkey": 'btree (scope_key, thread_id, "position")',
    "_runs_status": 'btree (scope_key, thread_id, status, "position")',
    "_queued_items_pkey": 'btree (scope_key, thread_id, "position")',
    "_queued_run": 'btree (scope_key, thread_id, run_id, "position")',
}
UNIQUE: dict[str, str] = {
    f"{PREFIX}_messages": "message_id",
    f"{PREFIX}_runs": "run_id",
    f"{PREFIX}_queued_items": "queue_item_id",
}


def _turn(thread_id: str = "t1") -> dict[str, Any]:
    return every_family_create(
        thread_id, title="hello", metadata={"k": [1, 1.0, "2030-01-01T00:00:00Z"]}
    )


async def _committed(store: Any, request: dict[str, Any]) -> ThreadVersion | None:
    result = await store.commit_thread(request)
    assert isinstance(result, CommittedResult), result
    return None if result.thread is None else result.thread.version


async def test_tables_and_columns_follow_the_documented_layout(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    # The schema does not exist yet: initialize() creates it.
    assert await pg_conn.fetchval("SELECT to_regnamespace($1)", pg_schema) is None
    async with open_store(URL, schema=pg_schema, table_prefix=PREFIX) as store:
        await store.initialize()
    for table, expected in COLUMNS.items():
        rows = await pg_conn.fetch(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
            pg_schema,
            table,
        )
        found = [(r["column_name"], r["data_type"], r["is_nullable"] == "YES") for r in rows]
        assert found == expected, table
    schema_columns = await pg_conn.fetch(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = $1 AND table_name = $2",
        pg_schema,
        f"{PREFIX}_schema",
    )
    assert {"version", "created_at", "upgraded_at"} <= {r["column_name"] for r in schema_columns}
    rows = await pg_conn.fetch(f'SELECT * FROM "{pg_schema}".{PREFIX}_schema')
    assert len(rows) == 1
    assert rows[0]["version"] == SCHEMA_VERSION
    assert isinstance(rows[0]["created_at"], datetime)
    # No jsonb anywhere in the thread tables, and no foreign keys between them.
    kinds = await pg_conn.fetch(
        "SELECT c.conrelid::regclass::text AS tab, c.contype FROM pg_constraint c "
        "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = $1",
        pg_schema,
    )
    thread_tables = {f'"{pg_schema}".{t}' for t in COLUMNS} | {f"{pg_schema}.{t}" for t in COLUMNS}
    assert not [k for k in kinds if k["tab"] in thread_tables and k["contype"] == b"f"]


async def test_indexes_follow_the_documented_set(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with open_store(URL, schema=pg_schema, table_prefix=PREFIX) as store:
        await store.initialize()
    rows = await pg_conn.fetch(
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = $1 "
        "AND tablename = ANY($2::text[])",
        pg_schema,
        list(COLUMNS),
    )
    found = {r["indexname"]: r["indexdef"].split(" USING ", 1)[1] for r in rows}
    for suffix, definition in INDEXES.items():
        assert found.get(PREFIX + suffix) == definition, suffix
    # The unique (scope_key, thread_id, <id>) constraint of each child table.
    for table, id_column in UNIQUE.items():
        unique = [
            r
            for r in rows
            if r["tablename"] == table
            and r["indexdef"].startswith("CREATE UNIQUE INDEX")
            and r["indexdef"].endswith(f"btree (scope_key, thread_id, {id_column})")
        ]
        assert len(unique) == 1, table
    # Nothing undocumented besides those constraints.
    unique_names = {
        r["indexname"]
        for r in rows
        if r["tablename"] in UNIQUE
        and r["indexdef"].startswith("CREATE UNIQUE INDEX")
        and not r["indexname"].endswith("_pkey")
    }
    assert set(found) == {PREFIX + s for s in INDEXES} | unique_names


async def test_rows_carry_the_query_columns_and_the_record_as_json_text(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix=PREFIX) as store:
        await _committed(store, _turn())
        read = await store.read_thread(
            b.read("scope", "t1", runs={"type": "ids", "runIds": ["r1", "r2"]})
        )
    assert read.thread is not None
    assert read.runs is not None
    root = await pg_conn.fetchrow(f'SELECT * FROM "{pg_schema}".{PREFIX}')
    assert bytes(root["scope_key"]) == b"scope"
    assert bytes(root["agent"]) == b"assistant"
    assert root["list_visibility"] == "visible"
    assert root["revision"] == 1
    assert root["instance_id"] == read.thread.version.thread_instance_id
    epoch_ms = (read.thread.updated_at - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000
    assert root["sort_key"] == -round(epoch_ms)
    assert root["updated_at"] == read.thread.updated_at
    assert (root["messages_next"], root["runs_next"], root["queued_next"]) == (2, 3, 2)
    # ``doc`` is the record's JSON form as text: parsed, it is the JSON form read back.
    assert json.loads(root["doc"]) == read.thread.to_json()
    assert '"k":[1,1.0,"2030-01-01T00:00:00Z"]' in root["doc"].replace(" ", "")
    runs = await pg_conn.fetch(
        f'SELECT position, run_id, status, doc FROM "{pg_schema}".{PREFIX}_runs ORDER BY position'
    )
    assert [(r["position"], bytes(r["run_id"]), r["status"]) for r in runs] == [
        (1, b"r1", "running"),
        (2, b"r2", "queued"),
    ]
    assert [json.loads(r["doc"]) for r in runs] == [run.to_json() for run in read.runs.items]
    message = await pg_conn.fetchrow(f'SELECT * FROM "{pg_schema}".{PREFIX}_messages')
    assert bytes(message["run_id"]) == b"r1"
    assert message["relation"] == "input"
    assert (message["transcript"], message["context"]) == (True, True)
    item = await pg_conn.fetchrow(f'SELECT * FROM "{pg_schema}".{PREFIX}_queued_items')
    assert bytes(item["run_id"]) == b"r2"
    assert json.loads(item["doc"])["input"] == {"n": 1}


async def _writers(conn: asyncpg.Connection, schema: str) -> dict[str, set[int]]:
    """The transaction ids that wrote the rows of each thread table (``xmin``)."""
    found: dict[str, set[int]] = {}
    for table in COLUMNS:
        rows = await conn.fetch(f'SELECT xmin::text::bigint AS x FROM "{schema}".{table}')
        found[table] = {r["x"] for r in rows}
    return found


async def test_every_commit_is_one_transaction(pg_schema: str, pg_conn: asyncpg.Connection) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix=PREFIX) as store:
        version = await _committed(store, _turn())
        created = await _writers(pg_conn, pg_schema)
        # The root and every child row of the create: written by one transaction.
        assert all(len(xids) == 1 for xids in created.values()), created
        assert len(set().union(*created.values())) == 1
        version = await _committed(
            store,
            b.update_at(
                "scope",
                "t1",
                version,
                {
                    "messages": [
                        {
                            "type": "insert",
                            "record": b.message("m2", run_id="r1", relation="output"),
                        }
                    ],
                    "runs": [
                        {"type": "replace", "record": b.run("r1", "completed", inputs=["m1"])}
                    ],
                    "lease": b.release("r1", "w1"),
                },
                root=b.root(),
            ),
        )
        (first,) = set().union(*created.values())
        rows = await pg_conn.fetch(
            f'SELECT xmin::text::bigint AS x FROM "{pg_schema}".{PREFIX} UNION ALL '
            f'SELECT xmin::text::bigint FROM "{pg_schema}".{PREFIX}_messages '
            f"WHERE message_id = 'm2'::bytea UNION ALL "
            f'SELECT xmin::text::bigint FROM "{pg_schema}".{PREFIX}_runs '
            f"WHERE run_id = 'r1'::bytea"
        )
        second = {r["x"] for r in rows}
        assert len(second) == 1
        assert second != {first}
        # A delete removes the thread's rows from all four tables.
        assert await _committed(store, b.delete("scope", "t1", version)) is None
        for table in COLUMNS:
            assert await pg_conn.fetchval(f'SELECT count(*) FROM "{pg_schema}".{table}') == 0


async def test_an_update_waits_for_the_root_row_lock(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    clock = ManualClock()
    async with PostgresThreadStore(
        URL, schema=pg_schema, table_prefix=PREFIX, clock=clock
    ) as store:
        version = await _committed(store, b.create("scope", "t1"))
        holder = await asyncpg.connect(URL, timeout=10)
        try:
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute(
                f'SELECT 1 FROM "{pg_schema}".{PREFIX} WHERE thread_id = $1 FOR UPDATE', b"t1"
            )
            commit = asyncio.create_task(
                store.commit_thread(b.update_at("scope", "t1", version, root=b.root(title="next")))
            )
            done, _ = await asyncio.wait({commit}, timeout=1.0)
            assert not done, "the commit did not wait for the root row"
            await transaction.rollback()
            result = await asyncio.wait_for(commit, timeout=10)
        finally:
            await holder.close()
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        assert result.thread.title == "next"
        assert result.thread.version.revision == 2


async def test_a_table_dropped_after_initialize_is_a_configuration_error(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix=PREFIX) as store:
        await _committed(store, b.create("scope", "t1"))
    await pg_conn.execute(f'DROP TABLE "{pg_schema}".{PREFIX}_messages')
    # A later start-up only reads the recorded version; the missing table is a
    # configuration problem when a statement needs it, never a silent success.
    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix=PREFIX) as again:
        with pytest.raises(ThreadStoreConfigurationError):
            await again.commit_thread(
                b.create(
                    "scope", "t2", {"messages": [{"type": "insert", "record": b.message("m")}]}
                )
            )


async def test_prefixes_keep_deployments_apart(pg_schema: str, pg_conn: asyncpg.Connection) -> None:
    async with (
        PostgresThreadStore(URL, schema=pg_schema, table_prefix="one") as one,
        PostgresThreadStore(URL, schema=pg_schema, table_prefix="two") as two,
    ):
        await _committed(one, b.create("scope", "t1", title="one"))
        assert (await two.read_thread(b.read("scope", "t1"))).thread is None
        await _committed(two, b.create("scope", "t1", title="two"))
        read = await one.read_thread(b.read("scope", "t1"))
        assert read.thread is not None
        assert read.thread.title == "one"
    for prefix in ("one", "two"):
        assert await pg_conn.fetchval(f'SELECT count(*) FROM "{pg_schema}".{prefix}') == 1
        assert await pg_conn.fetchval(f'SELECT version FROM "{pg_schema}".{prefix}_schema') == (
            SCHEMA_VERSION
        )


async def test_no_password_in_log_lines_errors_or_repr(caplog: pytest.LogCaptureFixture) -> None:
    secret = "pw-Secr3t-pg"
    caplog.set_level(logging.DEBUG)
    store = open_store(f"postgresql://postgres:{secret}@127.0.0.1:1/test", connect_timeout=2)
    assert secret not in repr(store)
    assert secret not in str(store)
    with pytest.raises(ThreadStoreUnavailableError) as caught:
        await store.initialize()
    await store.close()
    error = caught.value
    assert "127.0.0.1:1" in str(error)
    for text in (str(error), repr(error), str(error.__cause__), repr(error.__cause__)):
        assert secret not in text
    assert secret not in caplog.text


async def test_lazy_initialize_idempotent_initialize_and_close(pg_schema: str) -> None:
    store = open_store(URL, schema=pg_schema, table_prefix=PREFIX)
    # The first operation initializes the store (creates the schema).
    await _committed(store, b.create("scope", "t1"))
    await store.initialize()
    await store.initialize()
    assert (await store.read_thread(b.read("scope", "t1"))).thread is not None
    await store.close()
    await store.close()
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.read_thread(b.read("scope", "t1"))
    async with open_store(URL, schema=pg_schema, table_prefix=PREFIX) as scoped:
        assert (await scoped.read_thread(b.read("scope", "t1"))).thread is not None
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await scoped.read_thread(b.read("scope", "t1"))


async def test_a_role_without_privileges_or_an_unknown_role_is_a_configuration_error(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix=PREFIX) as owner:
        await _committed(owner, b.create("scope", "t1"))
    role = f"pai_noprivs_{uuid.uuid4().hex[:10]}"
    await pg_conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        base = make_url(URL)
        url = f"postgresql://{role}@{base.host}:{base.port or 5432}{base.path}"
        # No USAGE on the schema, then USAGE but no rights on the tables.
        for grant in (None, f'GRANT USAGE ON SCHEMA "{pg_schema}" TO "{role}"'):
            if grant is not None:
                await pg_conn.execute(grant)
            store = PostgresThreadStore(url, schema=pg_schema, table_prefix=PREFIX)
            try:
                with pytest.raises(ThreadStoreConfigurationError):
                    await store.read_thread(b.read("scope", "t1"))
            finally:
                await store.close()
        missing = PostgresThreadStore(
            f"postgresql://{role}_missing@{base.host}:{base.port or 5432}{base.path}",
            schema=pg_schema,
        )
        try:
            with pytest.raises(ThreadStoreConfigurationError):
                await missing.initialize()
        finally:
            await missing.close()
    finally:
        await pg_conn.execute(f'DROP OWNED BY "{role}"')
        await pg_conn.execute(f'DROP ROLE "{role}"')


async def test_without_on_warning_a_skipped_root_is_logged_without_its_contents(
    pg_schema: str, pg_conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    async with PostgresThreadStore(URL, schema=pg_schema, table_prefix=PREFIX) as store:
        await _committed(store, b.create("scope", "bad", metadata={"note": "personal"}))
        doc = json.loads(await pg_conn.fetchval(f'SELECT doc FROM "{pg_schema}".{PREFIX}'))
        del doc["privateMetadata"]
        await pg_conn.execute(f'UPDATE "{pg_schema}".{PREFIX} SET doc = $1', json.dumps(doc))
        with caplog.at_level(logging.WARNING, logger="pai_storage"):
            page = await store.list_threads({"scopeKey": "scope", "limit": 10})
    assert page.items == []
    logged = [r for r in caplog.records if r.name == "pai_storage"]
    assert len(logged) == 1
    assert logged[0].levelno == logging.WARNING
    assert "invalid_thread_skipped" in logged[0].getMessage()
    assert "personal" not in caplog.text
