"""Names compare byte by byte (code point by code point) in every runtime store.

Prefixes and pages are ranges of UTF-8 bytes, never ``LIKE`` patterns and
never a collation: ``%`` and ``_`` match themselves, ``"a"``, ``"A"`` and
``"a "`` are three names (MariaDB's ``PAD SPACE`` collations would make
``"a" = "a "``), a prefix ending in U+FFFF or U+10FFFF (the last code point:
its range has no upper bound of the same length) covers exactly what starts
with it. Names longer than an index head (MariaDB: 3,000 bytes of a sort key,
2,900 of a snapshot id) that share it come back in exact order across pages,
whatever the page size.

Every expectation is computed here with Python's ``sorted`` (code-point order).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_sql.client import SqlClient
from pai_storage_sql.kv import SqlKeyValueStore
from pai_storage_sql.snapshots import SqlSnapshotStore
from pai_storage_sql.state import SqlAgentStateStore

from pai_storage import ManualClock

from .conftest import Target

pytestmark = pytest.mark.asyncio

NAMES = (
    "a",
    "A",
    "a ",
    "a  ",
    "ab",
    "a%",
    "a%b",
    "a_",
    "a_b",
    "%",
    "_",
    "a\\",
    "a\x01",
    "a\x1e",
    "a\x7f",
    "a\x80",
    "a\ud7ff",
    "a\ue000",
    "a\uffff",
    "a\uffffb",
    "a\U0010fffe",
    "a\U0010ffff",
    "a\U0010ffff\U0010ffff",
    "a\U0010ffffb",
    "\U0010ffff",
    "\U0010ffffx",
    "\u00e9",
    "e\u0301",
)
"""Distinct names around every boundary a prefix range or a collation could blur."""

PREFIXES = ("a", "a%", "a_", "%", "_", "a\uffff", "a\U0010ffff", "\U0010ffff", "a ", "A", "e")

HEAD = "\U0001f642" * 800
"""3,200 bytes of UTF-8: longer than every index head on MariaDB."""


def namespace_order(name: str) -> str:
    """Namespaces order by their path: each segment followed by U+001F."""
    return name + "\x1f"


@pytest_asyncio.fixture
async def stores(target: Target) -> AsyncIterator[dict[str, Any]]:
    clock = ManualClock()
    client = SqlClient.shared(target.url, **target.options)
    opened = {
        "kv": SqlKeyValueStore(client=client, clock=clock),
        "state": SqlAgentStateStore(client=client, clock=clock),
        "snapshots": SqlSnapshotStore(client=client, clock=clock, snapshot_ttl=timedelta(days=1)),
    }
    try:
        for store in opened.values():
            await store.initialize()
        yield opened
    finally:
        for store in opened.values():
            await store.close()


def item_order(pair: tuple[tuple[str, ...], str]) -> tuple[str, str]:
    """Items order by (namespace path, key)."""
    return "".join(s + "\x1f" for s in pair[0]), pair[1]


async def all_pages(fetch: Any, limit: int) -> list[Any]:
    """Every item of a paged listing, ``limit`` at a time."""
    items: list[Any] = []
    token = None
    while True:
        page = await fetch(limit=limit, page_token=token)
        items += page.items
        token = page.next_page_token
        if token is None:
            return items


async def test_kv_prefixes_are_byte_ranges(stores: dict[str, Any]) -> None:
    kv: SqlKeyValueStore = stores["kv"]
    root = "order"
    for name in NAMES:
        await kv.put((root,), name, name)
        await kv.put((root, name), "k", name)
    assert await all_pages(partial(kv.list_keys, (root,)), 3) == sorted(NAMES)
    for prefix in PREFIXES:
        expected = sorted(n for n in NAMES if n.startswith(prefix))
        keys = await all_pages(partial(kv.list_keys, (root,), prefix=prefix), 2)
        assert keys == expected, prefix
        items = await all_pages(partial(kv.search, (root,), key_prefix=prefix), 2)
        assert [(i.namespace, i.key) for i in items] == [((root,), k) for k in expected], prefix
        # A namespace segment matches whole: (root, prefix) covers nothing but itself.
        under = await all_pages(partial(kv.search, (root, prefix)), 2)
        assert [i.namespace for i in under] == ([(root, prefix)] if prefix in NAMES else [])
    spaces = await all_pages(partial(kv.list_namespaces, (root,)), 4)
    assert spaces == [(root,)] + [(root, n) for n in sorted(NAMES, key=namespace_order)]
    by_depth = await all_pages(partial(kv.list_namespaces, (), max_depth=1), 1)
    assert (root,) in by_depth
    assert len(by_depth) == len(set(by_depth))
    everything = await all_pages(partial(kv.search, (root,)), 5)
    expected_all = sorted(
        [((root,), n) for n in NAMES] + [((root, n), "k") for n in NAMES], key=item_order
    )
    assert [(i.namespace, i.key) for i in everything] == expected_all
    for name in NAMES:  # each name reads its own item only
        item = await kv.get((root,), name)
        assert item is not None
        assert item.value == name


async def test_kv_long_keys_sharing_an_index_head(stores: dict[str, Any]) -> None:
    kv: SqlKeyValueStore = stores["kv"]
    keys = [HEAD + n for n in NAMES if len(HEAD + n) <= 1024]
    for i, key in enumerate(keys):
        await kv.put(("long",), key, i)
        await kv.put(("long", key), key, i)
    for limit in (1, 2, 7):
        listed = await all_pages(partial(kv.list_keys, ("long",)), limit)
        assert listed == sorted(keys)
    for prefix in (HEAD + "a", HEAD + "a\U0010ffff", HEAD + "%", HEAD):
        expected = sorted(k for k in keys if k.startswith(prefix))
        assert await all_pages(partial(kv.list_keys, ("long",), prefix=prefix), 2) == (expected)
        found = await all_pages(partial(kv.search, ("long",), key_prefix=prefix), 3)
        pairs = [(("long",), k) for k in expected] + [(("long", k), k) for k in expected]
        assert [(i.namespace, i.key) for i in found] == sorted(pairs, key=item_order)
    spaces = await all_pages(partial(kv.list_namespaces, ("long",)), 2)
    assert spaces == [("long",)] + [("long", k) for k in sorted(keys, key=namespace_order)]
    # Exactly one item under each long namespace, found by its whole path.
    for key in keys:
        under = await kv.search(("long", key))
        assert [i.key for i in under.items] == [key]
    got = await kv.get_many(("long",), keys)
    assert list(got) == keys


async def test_session_ids_order_by_bytes(stores: dict[str, Any]) -> None:
    state: SqlAgentStateStore = stores["state"]
    for name in NAMES:
        await state.save("user", name, "k", name)
        await state.save(name, "session", "k", name)  # users as hostile as sessions
    assert await all_pages(partial(state.list_session_ids, "user"), 3) == sorted(NAMES)
    for name in NAMES:
        assert await state.get(name, "session", "k") == name
        assert await all_pages(partial(state.list_session_ids, name), 2) == ["session"]
    long_ids = [HEAD + n for n in NAMES if len(HEAD + n) <= 1024]
    for name in long_ids:
        await state.save("long-user", name, "k", 1)
    for limit in (1, 2, 5):
        listed = await all_pages(partial(state.list_session_ids, "long-user"), limit)
        assert listed == sorted(long_ids)


async def test_snapshot_ids_break_ties_by_bytes(stores: dict[str, Any]) -> None:
    snapshots: SqlSnapshotStore = stores["snapshots"]
    # The test clock stands still: every snapshot has the same created_at.
    for name in NAMES:
        await snapshots.put("scope", name, name.encode())
    listed = await all_pages(partial(snapshots.list, "scope"), 3)
    assert [i.snapshot_id for i in listed] == sorted(NAMES, reverse=True)
    latest = await snapshots.latest("scope")
    assert latest is not None
    assert latest.info.snapshot_id == max(NAMES)
    long_ids = [HEAD + n for n in NAMES if len(HEAD + n) <= 1024]
    for name in long_ids:
        await snapshots.put("long", name, b"x")
    for limit in (1, 2, 5):
        listed = await all_pages(partial(snapshots.list, "long"), limit)
        assert [i.snapshot_id for i in listed] == sorted(long_ids, reverse=True)
    latest = await snapshots.latest("long")
    assert latest is not None
    assert latest.info.snapshot_id == max(long_ids)
