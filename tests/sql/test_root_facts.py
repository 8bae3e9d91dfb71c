"""The thread's relationship facts on the root (schema version 3), on SQLite and MariaDB.

Every commit writes the root once, with the facts after it and the revision
they belong to (``facts``: ``{"revision": n, "facts": {...}}``); a commit uses
the stored facts only when ``n`` is the held root's revision, so a root that
an older version of the package updated without them is judged from the
children, never from stale facts. A version 2 database gains the column (and,
on SQLite, the partial parent and category list indexes) on its first
connect.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pai_storage_sql import SqlThreadStore
from pai_storage_sql.schema import SCHEMA_VERSION
from pai_storage_sql.thread_rows import thread_key
from sqlalchemy import bindparam, inspect, select, text, update

from pai_storage import CommittedResult, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .conftest import Target

pytestmark = pytest.mark.asyncio

_START = {
    "messages": [b.insert(b.message("u1", "question", run_id="r1", relation="input"))],
    "runs": [b.insert(b.run("r1", inputs=["u1"]))],
}
_FINISH = {
    "messages": [
        b.insert(b.message("a1", "answer", role="assistant", run_id="r1", relation="output"))
    ],
    "runs": [b.replace(b.run("r1", "completed", inputs=["u1"]))],
}
_START_2 = {
    "messages": [b.insert(b.message("u2", "again", run_id="r2", relation="input"))],
    "runs": [b.insert(b.run("r2", inputs=["u2"]))],
}
_PARTIAL = {
    "list_agent_parent": "parent_h",
    "list_agent_category": "category_h",
    "list_parent": "parent_h",
    "list_category": "category_h",
    "messages_run": "run_h",
}


async def _commit(
    store: SqlThreadStore, version: ThreadVersion | None, changes: dict[str, Any] | None = None
) -> ThreadVersion:
    if version is None:
        result = await store.commit_thread(b.create("s", "t"))
    else:
        result = await store.commit_thread(b.update_at("s", "t", version, changes, root=b.root()))
    assert isinstance(result, CommittedResult), result
    assert result.thread is not None
    return result.thread.version


async def _facts(store: SqlThreadStore) -> Any:
    t = store.tables.threads
    engines = await store.client.ready()
    async with engines.reader.connect() as conn:
        stored = (
            await conn.execute(select(t.c.facts).where(t.c.tkey == thread_key("s", "t")))
        ).scalar_one()
    return None if stored is None else json.loads(stored)


async def _set_facts(store: SqlThreadStore, value: str | None) -> None:
    t = store.tables.threads
    engines = await store.client.ready()
    async with engines.writer.begin() as conn:
        await conn.execute(
            update(t).where(t.c.tkey == thread_key("s", "t")).values(facts=bindparam("f")),
            {"f": value},
        )


async def test_every_commit_stores_the_facts_of_its_revision(target: Target) -> None:
    async with target.store() as store:
        version = await _commit(store, None)
        assert await _facts(store) == {"revision": 1, "facts": {"tail": None, "open": []}}
        version = await _commit(store, version, _START)
        stored = await _facts(store)
        assert stored["revision"] == version.revision == 2
        assert stored["facts"]["tail"]["messageId"] == "u1"
        assert [o["runId"] for o in stored["facts"]["open"]] == ["r1"]
        version = await _commit(store, version, _FINISH)
        stored = await _facts(store)
        assert stored["revision"] == 3
        assert stored["facts"]["tail"]["messageId"] == "a1"
        assert stored["facts"]["open"] == []


async def test_facts_of_an_older_revision_are_never_used(target: Target) -> None:
    async with target.store() as store:
        version = await _commit(store, await _commit(store, None), _START)
        stale = json.dumps(await _facts(store))  # r1 open, at revision 2
        version = await _commit(store, version, _FINISH)
        # A root updated without its facts (an older pai-storage): they stay at
        # revision 2, where r1 was open; taken as current, they would refuse a
        # second open run.
        await _set_facts(store, stale)
        version = await _commit(store, version, _START_2)
        stored = await _facts(store)
        assert stored["revision"] == version.revision == 4
        assert [o["runId"] for o in stored["facts"]["open"]] == ["r2"]
        # Without facts at all the commit reads them from the children too.
        await _set_facts(store, None)
        version = await _commit(
            store,
            version,
            {"messages": [b.insert(b.message("m3", run_id="r2", relation="output"))]},
        )
        stored = await _facts(store)
        assert stored["revision"] == version.revision
        assert stored["facts"]["tail"]["messageId"] == "m3"


async def test_malformed_facts_are_an_invalid_stored_thread(target: Target) -> None:
    async with target.store() as store:
        version = await _commit(store, None)
        await _set_facts(store, json.dumps({"revision": version.revision, "facts": 5}))
        with pytest.raises(ThreadStoreInvariantError, match="relationship facts"):
            await store.commit_thread(
                b.update_at(
                    "s", "t", version, {"messages": [b.insert(b.message("m1"))]}, root=b.root()
                )
            )


async def test_a_version_2_database_gains_the_facts_and_partial_indexes(target: Target) -> None:
    async with target.store() as store:
        version = await _commit(store, await _commit(store, None), _START)
        t = store.tables.threads
        engines = await store.client.ready()
        # Back to what schema version 2 created: no facts, full indexes.
        async with engines.writer.begin() as conn:
            await conn.exec_driver_sql(f"ALTER TABLE {t.name} DROP COLUMN facts")
            if target.dialect == "sqlite":
                for name in _PARTIAL:
                    index = next(
                        i
                        for table in (t, store.tables.messages)
                        for i in table.indexes
                        if i.name == f"{t.name}_{name}"
                    )
                    columns = ", ".join(c.name for c in index.columns)
                    await conn.exec_driver_sql(f"DROP INDEX {index.name}")
                    await conn.exec_driver_sql(
                        f"CREATE INDEX {index.name} ON {index.table.name} ({columns})"
                    )
            await conn.execute(update(store.client.tables.version).values(version=2))

    async with target.store() as store:
        version = await _commit(store, version, _FINISH)
        stored = await _facts(store)
        assert stored["revision"] == version.revision
        assert stored["facts"]["open"] == []
        t = store.tables.threads
        engines = await store.client.ready()
        async with engines.reader.connect() as conn:
            recorded = (
                await conn.execute(select(store.client.tables.version.c.version))
            ).scalar_one()
            columns = await conn.run_sync(
                lambda sync: {c["name"] for c in inspect(sync).get_columns(t.name)}
            )
            if target.dialect == "sqlite":
                made = dict(
                    (
                        await conn.execute(
                            text("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
                        )
                    ).all()
                )
        assert recorded == SCHEMA_VERSION == 3
        assert "facts" in columns
        if target.dialect == "sqlite":
            for name, column in _PARTIAL.items():
                assert f"WHERE {column} IS NOT NULL" in made[f"{t.name}_{name}"]
