"""Tampered SQLite snapshot rows: any column of any type is damage, never a raw error.

SQLite stores whatever type a statement writes into a column, so a row edited
by hand may hold ``TEXT`` where the store wrote a ``BLOB`` or an integer. A
read must report it (``on_warning``) and raise :class:`CorruptSnapshotError`
(``get``, ``latest``, ``open``) or skip it with the warning (``list``); a raw
``TypeError`` or ``ValueError`` would also abort ``pai-storage copy --all``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from pai_storage_sql.snapshots import SqlSnapshotStore

from pai_storage import StoreWarning
from pai_storage.errors import CorruptSnapshotError

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def tampered(
    tmp_path: Path,
) -> AsyncIterator[tuple[SqlSnapshotStore, Path, list[StoreWarning]]]:
    path = tmp_path / "snapshots.db"
    warnings: list[StoreWarning] = []
    store = SqlSnapshotStore(f"sqlite:///{path}", on_warning=warnings.append)
    await store.put("scope", "old", b"old data")
    await store.put("scope", "new", b"new data!")
    try:
        yield store, path, warnings
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("data", "text, not a blob"),
        ("size", "nine"),
        ("size", 9.5),
        ("sha256", "not a digest"),
        ("metadata", 12),
    ],
)
async def test_a_tampered_column_is_a_corrupt_snapshot(
    tampered: tuple[SqlSnapshotStore, Path, list[StoreWarning]], column: str, value: object
) -> None:
    store, path, warnings = tampered
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE pai_snapshots SET {column} = ? WHERE size = 9", (value,))
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await store.get("scope", "new")
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await store.open("scope", "new")
    with pytest.raises(CorruptSnapshotError, match="damaged"):
        await store.latest("scope")
    listed = await store.list("scope")
    assert "old" in [i.snapshot_id for i in listed.items]
    assert warnings, "the damage is reported"
    assert all(w.kind == "invalid_record" for w in warnings)
    old = await store.get("scope", "old")
    assert old is not None
    assert old.data == b"old data"
