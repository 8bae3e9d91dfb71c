"""Stored runtime data that was damaged after it was written: SQLite and PostgreSQL.

The conformance topics cannot reach a store's rows, so these tests damage
them with plain SQL and check what the runtime stores promise for damaged
data: a key-value item or agent state that no longer decodes as strict JSON
is reported through ``on_warning`` (kind ``invalid_record``, names only, never
the stored text) and treated as absent; a snapshot whose bytes no longer match
their digest raises :class:`CorruptSnapshotError` and is never returned. No
other exception escapes.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from pai_storage import StoreWarning
from pai_storage.errors import CorruptSnapshotError
from pai_storage.kv import KeyValueStore, KVConflict
from pai_storage.snapshots import SnapshotStore
from pai_storage.state import AgentStateStore

pytestmark = pytest.mark.asyncio

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
SECRET = "hunter2"

Damage = Callable[[str, tuple[Any, ...]], Awaitable[None]]


@dataclass
class Stores:
    """One backend's key-value, state and snapshot stores, and a way to damage their rows."""

    kv: KeyValueStore
    state: AgentStateStore
    snapshots: SnapshotStore
    run: Damage
    """Runs one statement (``?`` placeholders) on the stores' database."""
    tables: dict[str, str]
    """The table of each kind of row: kv, value, item, snapshot."""
    blob: Callable[[str], Any]
    """How a JSON text is written into a value column."""
    warnings: list[StoreWarning] = field(default_factory=list)


async def _sqlite(tmp_path: Path) -> AsyncIterator[Stores]:
    from pai_storage_sql.kv import SqlKeyValueStore
    from pai_storage_sql.snapshots import SqlSnapshotStore
    from pai_storage_sql.state import SqlAgentStateStore

    path = tmp_path / "damage.db"
    url = f"sqlite:///{path}"
    warnings: list[StoreWarning] = []

    async def run(statement: str, args: tuple[Any, ...]) -> None:
        with sqlite3.connect(path) as db:
            db.execute(statement, args)

    stores = Stores(
        kv=SqlKeyValueStore(url, on_warning=warnings.append),
        state=SqlAgentStateStore(url, on_warning=warnings.append),
        snapshots=SqlSnapshotStore(url, on_warning=warnings.append),
        run=run,
        tables={
            "kv": "pai_kv",
            "value": "pai_agent_sessions_values",
            "item": "pai_agent_sessions_items",
            "snapshot": "pai_snapshots",
        },
        blob=lambda text: text.encode(),
        warnings=warnings,
    )
    try:
        yield stores
    finally:
        for store in (stores.kv, stores.state, stores.snapshots):
            await store.close()


async def _postgres() -> AsyncIterator[Stores]:
    asyncpg = pytest.importorskip("asyncpg")
    from pai_storage_postgres.kv import PostgresKeyValueStore
    from pai_storage_postgres.snapshots import PostgresSnapshotStore
    from pai_storage_postgres.state import PostgresAgentStateStore

    schema = f"pai_damage_{uuid.uuid4().hex[:12]}"
    warnings: list[StoreWarning] = []
    kv = PostgresKeyValueStore(PG_URL, schema=schema, on_warning=warnings.append)
    state = PostgresAgentStateStore(PG_URL, schema=schema, on_warning=warnings.append)
    snapshots = PostgresSnapshotStore(PG_URL, schema=schema, on_warning=warnings.append)
    conn = await asyncpg.connect(PG_URL, timeout=10)

    async def run(statement: str, args: tuple[Any, ...]) -> None:
        numbered = statement
        for i in range(len(args)):
            numbered = numbered.replace("?", f"${i + 1}", 1)
        await conn.execute(numbered, *args)

    tables = {
        "kv": kv.tables.kv,
        "value": state.tables.state_values,
        "item": state.tables.state_items,
        "snapshot": snapshots.tables.snapshots,
    }
    stores = Stores(kv, state, snapshots, run, tables, blob=lambda text: text, warnings=warnings)
    try:
        yield stores
    finally:
        for store in (kv, state, snapshots):
            await store.close()
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    opened = _sqlite(tmp_path) if request.param == "sqlite" else _postgres()
    async for made in opened:
        yield made


def _names_only(warning: StoreWarning) -> None:
    assert warning.kind == "invalid_record"
    assert SECRET not in repr(warning)


# ---------------------------------------------------------------- agent state


async def test_a_state_value_that_no_longer_decodes_is_reported_and_absent(
    stores: Stores,
) -> None:
    state = stores.state
    await state.save("u", "s", "v", {"secret": SECRET})
    await state.save("u", "s", "v", {"secret": SECRET})
    await state.save("u", "s", "ok", 1)
    await stores.run(
        f"UPDATE {stores.tables['value']} SET value = ? WHERE version = 2",
        (stores.blob(f'{{"secret": NaN, "x": "{SECRET}"'),),
    )
    assert await state.get("u", "s", "v") is None
    assert await state.get_versioned("u", "s", "v") is None
    assert await state.get("u", "s", "ok") == 1
    assert await state.exists("u", "s")
    assert len(stores.warnings) == 2
    for warning in stores.warnings:
        _names_only(warning)
        assert (warning.scope_key, warning.thread_id, warning.key) == ("u", "s", "v")
    # A new save replaces the damaged text.
    assert await state.save("u", "s", "v", "fresh") == 3
    assert await state.get("u", "s", "v") == "fresh"


async def test_a_list_item_that_no_longer_decodes_is_left_out(stores: Stores) -> None:
    state = stores.state
    await state.save_list("u", "s", "l", ["a", {"secret": SECRET}, "c"])
    await stores.run(
        f"UPDATE {stores.tables['item']} SET value = ? WHERE position = 1",
        (stores.blob(f'{{"secret": "{SECRET}"'),),
    )
    assert await state.get_list("u", "s", "l") == ["a", "c"]
    assert len(stores.warnings) == 1
    _names_only(stores.warnings[0])
    assert (stores.warnings[0].thread_id, stores.warnings[0].key) == ("s", "l")
    assert await state.append_list("u", "s", "l", ["d"]) == 4
    await state.save_list("u", "s", "l", ["x"])  # a rewrite drops the damaged item
    assert await state.get_list("u", "s", "l") == ["x"]


# ---------------------------------------------------------------- key-value store


async def test_a_kv_value_that_no_longer_decodes_is_reported_and_absent(stores: Stores) -> None:
    kv = stores.kv
    await kv.put(("n",), "bad", {"secret": SECRET})
    await kv.put(("n",), "good", 1)
    await stores.run(
        f"UPDATE {stores.tables['kv']} SET value = ? WHERE CAST(key AS TEXT) = ?",
        (stores.blob(f'["{SECRET}", NaN]'), "bad"),
    )
    assert await kv.get(("n",), "bad") is None
    assert list(await kv.get_many(("n",), ["bad", "good"])) == ["good"]
    assert [item.key for item in (await kv.search(("n",))).items] == ["good"]
    assert await kv.put_if_version(("n",), "bad", 2, None) == KVConflict(current=None)
    assert stores.warnings
    for warning in stores.warnings:
        _names_only(warning)
        assert (warning.namespace, warning.key) == (("n",), "bad")


# ---------------------------------------------------------------- snapshots


async def test_a_damaged_snapshot_is_never_returned(stores: Stores) -> None:
    snapshots = stores.snapshots
    await snapshots.put("scope", "snap", b"original bytes")
    await stores.run(f"UPDATE {stores.tables['snapshot']} SET data = ?", (b"0riginal bytes",))
    for read in (snapshots.get("scope", "snap"), snapshots.latest("scope")):
        with pytest.raises(CorruptSnapshotError) as caught:
            await read
        assert "0riginal" not in str(caught.value)
    assert len(stores.warnings) == 2
    for warning in stores.warnings:
        assert warning.kind == "invalid_record"
        assert (warning.scope_key, warning.snapshot_id) == ("scope", "snap")
    listed = (await snapshots.list("scope")).items
    assert [info.snapshot_id for info in listed] == ["snap"]
    await snapshots.put("scope", "snap", b"replaced")
    got = await snapshots.get("scope", "snap")
    assert got is not None
    assert got.data == b"replaced"
