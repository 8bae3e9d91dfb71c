"""The key-value store: round trips, versions, expiry, pages, isolation, limits, errors, a model.

Consumed by subclassing :class:`KeyValueStoreTests` and providing one
fixture, ``kv_store``: an initialized :class:`~pai_storage.kv.KeyValueStore`
made with the suite's ``clock`` (a :class:`~pai_storage.ManualClock`), which
drives every expiry. Every test works under a namespace root of its own, so a
store over a shared database is fine.

The expected order of items is computed here independently of the store: a
namespace's path is each segment followed by U+001F, and items are ordered by
(path, key) comparing code points.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
)

from pai_storage import Conflict, ManualClock, raise_on_conflict
from pai_storage.errors import (
    ConfigurationError,
    ConflictError,
    InvalidInputError,
    PageTokenError,
    SerializationError,
    StorageError,
    ThreadStoreError,
)
from pai_storage.kv import Item, KeyValueStore, KVConflict

from ._support import BAD_DURATIONS, BAD_NAMES, HOSTILE_NAMES, run_model, token_of, token_parts

__all__ = ["KeyValueStoreTests"]

pytestmark = pytest.mark.asyncio

T = TypeVar("T")
Namespace = tuple[str, ...]

MIB = 1024 * 1024
RACERS = 16

BAD_VERSIONS: tuple[object, ...] = (0, -1, True, 1.0, "1", 2**63)
BAD_LIMITS: tuple[object, ...] = (0, -1, 1001, True, 1.5, "10", None)


def _cyclic() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


BAD_VALUES: tuple[tuple[str, Any], ...] = (
    ("nan", math.nan),
    ("infinity", math.inf),
    ("negative zero", -0.0),
    ("int over 64 bits", 2**63),
    ("non-str key", {1: "a"}),
    ("tuple", (1, 2)),
    ("set", {"a"}),
    ("bytes", b"x"),
    ("datetime", datetime(2030, 1, 1, tzinfo=UTC)),
    ("decimal", Decimal("1.5")),
    ("object", object()),
    ("lone surrogate", "a\ud800"),
    ("nested nan", {"a": [1, {"b": math.nan}]}),
    ("too deep", _deep(65)),
    ("cycle", _cyclic()),
)

ROUND_TRIP_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    1,
    -1,
    1.0,
    1.5,
    -2.5e-7,
    1e300,
    5e-324,
    2**63 - 1,
    -(2**63),
    2**53 + 1,
    "",
    "text",
    "nul \x00 inside",
    "\u00e9\U0001f600",
    [],
    {},
    {"b": 1, "a": 2},
    {"z": [1, {"y": None, "x": 1.0}], "a": "1"},
    [1, 1.0, "1", [], {}],
)


# ---------------------------------------------------------------- helpers


def _root(tag: str = "") -> str:
    return f"kv-{tag}{'-' if tag else ''}{uuid.uuid4().hex}"


def _path(namespace: Namespace) -> str:
    return "".join(segment + "\x1f" for segment in namespace)


def _order(namespace: Namespace, key: str) -> tuple[str, str]:
    return (_path(namespace), key)


def _canon(value: Any) -> str:
    """Exact JSON identity: key order, 1 vs 1.0, and types all show."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _same_value(item: Item | None, value: Any) -> None:
    assert item is not None
    assert _canon(item.value) == _canon(value), "the value must round-trip exactly"


async def _refused(call: Awaitable[Any], error: type[Exception], *words: str) -> Exception:
    with pytest.raises(error) as info:
        await call
    assert isinstance(info.value, StorageError)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"
    return info.value


async def _walk_search(
    store: KeyValueStore, prefix: Namespace, *, limit: int, key_prefix: str = ""
) -> list[Item]:
    items: list[Item] = []
    token: str | None = None
    for _ in range(1000):
        page = await store.search(prefix, key_prefix=key_prefix, limit=limit, page_token=token)
        assert len(page.items) <= limit
        items.extend(page.items)
        token = page.next_page_token
        if token is None:
            return items
        assert page.items, "a page with a next token must not be empty"
    raise AssertionError("search pagination does not terminate")


async def _walk_keys(
    store: KeyValueStore, namespace: Namespace, *, limit: int, prefix: str = ""
) -> list[str]:
    keys: list[str] = []
    token: str | None = None
    for _ in range(1000):
        page = await store.list_keys(namespace, prefix=prefix, limit=limit, page_token=token)
        assert len(page.items) <= limit
        keys.extend(page.items)
        token = page.next_page_token
        if token is None:
            return keys
        assert page.items, "a page with a next token must not be empty"
    raise AssertionError("list_keys pagination does not terminate")


async def _walk_namespaces(
    store: KeyValueStore, prefix: Namespace, *, limit: int, max_depth: int | None = None
) -> list[Namespace]:
    found: list[Namespace] = []
    token: str | None = None
    for _ in range(1000):
        page = await store.list_namespaces(
            prefix, max_depth=max_depth, limit=limit, page_token=token
        )
        assert len(page.items) <= limit
        found.extend(page.items)
        token = page.next_page_token
        if token is None:
            return found
        assert page.items, "a page with a next token must not be empty"
    raise AssertionError("list_namespaces pagination does not terminate")


def _addresses(items: list[Item]) -> list[tuple[Namespace, str]]:
    return [(item.namespace, item.key) for item in items]


async def _nothing_under(store: KeyValueStore, root: str) -> None:
    assert (await store.search((root,))).items == []
    assert (await store.list_namespaces((root,))).items == []


def _tampered(token: str) -> str:
    head, body, mac = token_parts(token)
    payload = json.loads(body)
    payload["p"] = {"ns": ["elsewhere"], "key": "k"}
    return token_of(head, json.dumps(payload, separators=(",", ":")).encode(), mac)


# ---------------------------------------------------------------- the topic


class KeyValueStoreTests:
    """Namespaced JSON items: versions, exact expiry, keyset pages, isolation, limits."""

    # ------------------------------------------------------------ round trips

    async def test_put_then_get_round_trips_every_json_value(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("json"), "values")
        for i, value in enumerate(ROUND_TRIP_VALUES):
            written = await kv_store.put(ns, f"v{i}", value)
            _same_value(written, value)
            assert (written.namespace, written.key, written.version) == (ns, f"v{i}", 1)
            assert written.created_at == written.updated_at == clock()
            assert written.expires_at is None
            assert written.ttl is None
            read = await kv_store.get(ns, f"v{i}")
            _same_value(read, value)
            assert read == written

    async def test_get_of_a_missing_key_is_none(self, kv_store: KeyValueStore) -> None:
        ns = (_root("missing"),)
        assert await kv_store.get(ns, "nothing") is None
        assert await kv_store.get_many(ns, ["nothing"]) == {}

    async def test_values_are_copies_in_and_out(self, kv_store: KeyValueStore) -> None:
        ns = (_root("copies"),)
        value: dict[str, Any] = {"list": [1, 2], "inner": {"a": 1}}
        written = await kv_store.put(ns, "k", value)
        value["list"].append(3)
        value["inner"]["a"] = 2
        written.value["list"].append(4)
        read = await kv_store.get(ns, "k")
        _same_value(read, {"list": [1, 2], "inner": {"a": 1}})
        assert read is not None
        read.value["inner"]["b"] = 1
        _same_value(await kv_store.get(ns, "k"), {"list": [1, 2], "inner": {"a": 1}})

    async def test_item_is_frozen_and_its_repr_hides_the_value(
        self, kv_store: KeyValueStore
    ) -> None:
        ns = (_root("frozen"),)
        item = await kv_store.put(ns, "k", {"secret": "hunter2"})
        with pytest.raises((TypeError, ValueError)):
            item.version = 7  # type: ignore[misc]
        assert "hunter2" not in repr(item)
        assert "hunter2" not in repr(KVConflict(current=item))

    async def test_get_many_returns_live_items_in_the_order_asked(
        self, kv_store: KeyValueStore
    ) -> None:
        root = _root("many")
        ns = (root, "a")
        for key in ("k1", "k2", "k3"):
            await kv_store.put(ns, key, key.upper())
        await kv_store.put((root, "b"), "k1", "other")
        found = await kv_store.get_many(ns, ["k3", "missing", "k1", "k3"])
        assert list(found) == ["k3", "k1"]
        assert {k: v.value for k, v in found.items()} == {"k3": "K3", "k1": "K1"}
        assert all(item.namespace == ns for item in found.values())
        assert await kv_store.get_many(ns, []) == {}
        assert list(await kv_store.get_many(ns, ("k2",))) == ["k2"]

    async def test_get_many_takes_up_to_1000_keys(self, kv_store: KeyValueStore) -> None:
        ns = (_root("many-limit"),)
        await kv_store.put(ns, "k7", 7)
        await kv_store.put(ns, "k999", 999)
        found = await kv_store.get_many(ns, [f"k{i}" for i in range(1000)])
        assert sorted(found) == ["k7", "k999"]
        await _refused(
            kv_store.get_many(ns, [f"k{i}" for i in range(1001)]),
            InvalidInputError,
            "1,000",
            "1,001",
        )

    # ------------------------------------------------------------ versions

    async def test_versions_start_at_one_and_grow_by_one(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("versions"),)
        created = clock()
        first = await kv_store.put(ns, "k", 1)
        clock.advance(ms=5)
        second = await kv_store.put(ns, "k", 2)
        clock.advance(ms=5)
        third = await kv_store.put_if_version(ns, "k", 3, 2)
        assert isinstance(third, Item)
        assert [first.version, second.version, third.version] == [1, 2, 3]
        assert third.created_at == created
        assert third.updated_at == clock() == created + timedelta(milliseconds=10)
        assert await kv_store.get(ns, "k") == third

    async def test_put_if_version_none_creates_only_when_absent(
        self, kv_store: KeyValueStore
    ) -> None:
        ns = (_root("create-only"),)
        created = await kv_store.put_if_version(ns, "k", "first", None)
        assert isinstance(created, Item)
        assert created.version == 1
        conflict = await kv_store.put_if_version(ns, "k", "second", None)
        assert isinstance(conflict, KVConflict)
        assert isinstance(conflict, Conflict)
        assert conflict.current == created
        _same_value(await kv_store.get(ns, "k"), "first")
        with pytest.raises(ConflictError, match="current version is 1") as raised:
            raise_on_conflict(conflict)
        assert raised.value.conflict is conflict
        assert "first" not in str(raised.value)  # never the stored value
        assert raise_on_conflict(await kv_store.put_if_version(ns, "k2", "x", None)).version == 1

    async def test_put_if_version_writes_only_at_the_expected_version(
        self, kv_store: KeyValueStore
    ) -> None:
        ns = (_root("cas"),)
        absent = await kv_store.put_if_version(ns, "k", "x", 1)
        assert absent == KVConflict(current=None)
        assert await kv_store.get(ns, "k") is None
        await kv_store.put(ns, "k", "v1")
        second = await kv_store.put_if_version(ns, "k", "v2", 1)
        assert isinstance(second, Item)
        assert second.version == 2
        for stale in (1, 3, 2**62):
            conflict = await kv_store.put_if_version(ns, "k", "lost", stale)
            assert isinstance(conflict, KVConflict)
            assert conflict.current == second
        _same_value(await kv_store.get(ns, "k"), "v2")

    async def test_racing_conditional_writers_exactly_one_wins(
        self, kv_store: KeyValueStore
    ) -> None:
        ns = (_root("race"),)
        for expected in (None, 1, 2):
            outcomes = await asyncio.gather(
                *(kv_store.put_if_version(ns, "k", {"writer": i}, expected) for i in range(RACERS))
            )
            winners = [o for o in outcomes if isinstance(o, Item)]
            assert len(winners) == 1, f"expected version {expected}: {len(winners)} winners"
            won = winners[0]
            assert won.version == (expected or 0) + 1
            for outcome in outcomes:
                if isinstance(outcome, KVConflict):
                    assert outcome.current == won
            assert await kv_store.get(ns, "k") == won

    async def test_racing_puts_get_distinct_versions(self, kv_store: KeyValueStore) -> None:
        ns = (_root("race-put"),)
        items = await asyncio.gather(*(kv_store.put(ns, "k", i) for i in range(RACERS)))
        assert sorted(item.version for item in items) == list(range(1, RACERS + 1))
        last = max(items, key=lambda item: item.version)
        assert await kv_store.get(ns, "k") == last

    async def test_delete_is_idempotent(self, kv_store: KeyValueStore) -> None:
        ns = (_root("delete"),)
        await kv_store.put(ns, "k", 1)
        await kv_store.put(ns, "other", 2)
        assert await kv_store.delete(ns, "k") is True
        assert await kv_store.delete(ns, "k") is False
        assert await kv_store.delete(ns, "never") is False
        assert await kv_store.get(ns, "k") is None
        assert (await kv_store.get(ns, "other")) is not None

    async def test_delete_at_an_expected_version(self, kv_store: KeyValueStore) -> None:
        ns = (_root("delete-cas"),)
        await kv_store.put(ns, "k", 1)
        await kv_store.put(ns, "k", 2)
        assert await kv_store.delete(ns, "k", expected_version=1) is False
        assert await kv_store.delete(ns, "k", expected_version=3) is False
        kept = await kv_store.get(ns, "k")
        assert kept is not None
        assert kept.version == 2
        assert await kv_store.delete(ns, "k", expected_version=2) is True
        assert await kv_store.get(ns, "k") is None
        assert await kv_store.delete(ns, "k", expected_version=2) is False

    async def test_racing_deletes_exactly_one_is_true(self, kv_store: KeyValueStore) -> None:
        ns = (_root("race-delete"),)
        await kv_store.put(ns, "k", 1)
        outcomes = await asyncio.gather(*(kv_store.delete(ns, "k") for _ in range(RACERS)))
        assert outcomes.count(True) == 1

    async def test_a_write_after_delete_starts_again_at_version_one(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("recreate"),)
        await kv_store.put(ns, "k", 1)
        await kv_store.put(ns, "k", 2)
        await kv_store.delete(ns, "k")
        clock.advance(ms=7)
        again = await kv_store.put(ns, "k", 3)
        assert again.version == 1
        assert again.created_at == clock()

    # ------------------------------------------------------------ expiry

    async def test_expiry_is_exact_at_read_time_everywhere(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        root = _root("expiry")
        ns = (root, "a")
        ttl = timedelta(seconds=10)
        item = await kv_store.put(ns, "k", "v", ttl=ttl)
        assert item.ttl == ttl
        assert item.expires_at == clock() + ttl
        await kv_store.put(ns, "stays", "v")
        clock.advance(ttl - timedelta(milliseconds=1))
        assert await kv_store.get(ns, "k") == item
        assert list(await kv_store.get_many(ns, ["k"])) == ["k"]
        clock.advance(ms=1)  # the expiry instant: absent from here on, swept or not
        assert await kv_store.get(ns, "k") is None
        assert await kv_store.get(ns, "k", refresh_ttl=True) is None
        assert await kv_store.get_many(ns, ["k", "stays"]) == {
            "stays": await kv_store.get(ns, "stays")
        }
        assert _addresses(await _walk_search(kv_store, (root,), limit=10)) == [(ns, "stays")]
        assert (await kv_store.list_keys(ns)).items == ["stays"]
        assert await kv_store.delete(ns, "k") is False
        assert await kv_store.put_if_version(ns, "k", "x", 1) == KVConflict(current=None)
        await kv_store.delete(ns, "stays")
        assert (await kv_store.list_namespaces((root,))).items == []

    async def test_a_write_over_an_expired_item_starts_again_at_version_one(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("expired-write"),)
        await kv_store.put(ns, "k", 1, ttl=timedelta(seconds=1))
        await kv_store.put(ns, "k", 2, ttl=timedelta(seconds=1))
        clock.advance(timedelta(seconds=1))
        again = await kv_store.put(ns, "k", 3)
        assert (again.version, again.created_at, again.expires_at) == (1, clock(), None)
        await kv_store.put(ns, "c", 1, ttl=timedelta(seconds=1))
        clock.advance(timedelta(seconds=2))
        created = await kv_store.put_if_version(ns, "c", 2, None)
        assert isinstance(created, Item)
        assert (created.version, created.created_at) == (1, clock())

    async def test_put_without_ttl_removes_the_expiry(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("ttl-removed"),)
        await kv_store.put(ns, "k", 1, ttl=timedelta(seconds=1))
        kept = await kv_store.put(ns, "k", 2)
        assert (kept.expires_at, kept.ttl, kept.version) == (None, None, 2)
        clock.advance(timedelta(days=400))
        assert await kv_store.get(ns, "k") == kept

    async def test_a_new_ttl_replaces_the_old_one(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("ttl-replaced"),)
        await kv_store.put(ns, "k", 1, ttl=timedelta(hours=1))
        clock.advance(ms=10)
        item = await kv_store.put(ns, "k", 2, ttl=timedelta(seconds=1))
        assert item.expires_at == clock() + timedelta(seconds=1)
        clock.advance(timedelta(seconds=1))
        assert await kv_store.get(ns, "k") is None

    async def test_refresh_ttl_extends_the_expiry(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("refresh"),)
        ttl = timedelta(seconds=10)
        written = await kv_store.put(ns, "k", "v", ttl=ttl)
        clock.advance(timedelta(seconds=6))
        assert await kv_store.get(ns, "k") == written  # a plain get changes nothing
        refreshed = await kv_store.get(ns, "k", refresh_ttl=True)
        assert refreshed is not None
        assert refreshed.expires_at == clock() + ttl
        assert (refreshed.version, refreshed.updated_at, refreshed.ttl) == (
            1,
            written.updated_at,
            ttl,
        )
        clock.advance(timedelta(seconds=6))  # past the original expiry
        assert await kv_store.get(ns, "k") == refreshed
        clock.advance(timedelta(seconds=4))
        assert await kv_store.get(ns, "k") is None

    async def test_refresh_ttl_leaves_items_without_ttl_alone(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("refresh-none"),)
        written = await kv_store.put(ns, "k", "v")
        clock.advance(ms=100)
        assert await kv_store.get(ns, "k", refresh_ttl=True) == written
        assert await kv_store.get(ns, "missing", refresh_ttl=True) is None

    async def test_ttl_is_kept_to_whole_milliseconds(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("ttl-ms"),)
        item = await kv_store.put(ns, "k", 1, ttl=timedelta(microseconds=2500))
        assert item.ttl == timedelta(milliseconds=2)
        assert item.expires_at == clock() + timedelta(milliseconds=2)
        assert await kv_store.get(ns, "k") == item

    async def test_purge_expired_deletes_only_what_expired(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("purge"),)
        start = clock()
        await kv_store.put(ns, "short", 1, ttl=timedelta(seconds=1))
        await kv_store.put(ns, "short2", 1, ttl=timedelta(seconds=1))
        await kv_store.put(ns, "long", 2, ttl=timedelta(hours=1))
        await kv_store.put(ns, "forever", 3)
        clock.advance(timedelta(seconds=2))
        assert await kv_store.purge_expired() >= 2
        # Back before the expiry: a purged item stays gone, the others are there.
        clock.set(start)
        assert await kv_store.get(ns, "short") is None
        assert (await kv_store.list_keys(ns)).items == ["forever", "long"]

    # ------------------------------------------------------------ pages

    async def test_search_orders_by_namespace_path_then_key(self, kv_store: KeyValueStore) -> None:
        root = _root("order")
        suffixes: list[Namespace] = [
            ("ab",),
            ("a", "b"),
            ("a",),
            ("a\x1e",),
            ("a ",),
            ("a\uffff",),
            ("a\U0001f600",),
            ("a", "b", "c"),
            ("a\x01", "z"),
            ("B",),
            ("\u00e9",),
        ]
        expected: list[tuple[Namespace, str]] = []
        for suffix in suffixes:
            for key in ("k2", "k10", "k", "K", "k\x1e", "k\uffff"):
                ns = (root, *suffix)
                await kv_store.put(ns, key, [list(ns), key])
                expected.append((ns, key))
        expected.sort(key=lambda address: _order(*address))
        for limit in (1, 2, 7, 1000):
            items = await _walk_search(kv_store, (root,), limit=limit)
            assert _addresses(items) == expected, f"limit {limit}"
            for item in items:
                _same_value(item, [list(item.namespace), item.key])

    async def test_search_matches_whole_segments(self, kv_store: KeyValueStore) -> None:
        root = _root("segments")
        for suffix in (("a",), ("a", "b"), ("ab",), ("a b",), ("a\x1e",)):
            await kv_store.put((root, *suffix), "k", 1)
        found = await _walk_search(kv_store, (root, "a"), limit=10)
        assert _addresses(found) == [((root, "a"), "k"), ((root, "a", "b"), "k")]
        found = await _walk_search(kv_store, (root, "a", "b"), limit=10)
        assert _addresses(found) == [((root, "a", "b"), "k")]
        assert await _walk_search(kv_store, (root, "a", "b", "c"), limit=10) == []
        assert await _walk_search(kv_store, (root[:-1],), limit=10) == []

    async def test_search_with_a_key_prefix(self, kv_store: KeyValueStore) -> None:
        root = _root("key-prefix")
        for suffix in (("a",), ("b", "c")):
            for key in ("doc-1", "doc-2", "docs", "do", "img-1", "Doc-3"):
                await kv_store.put((root, *suffix), key, key)
        found = await _walk_search(kv_store, (root,), key_prefix="doc-", limit=3)
        assert _addresses(found) == [
            ((root, "a"), "doc-1"),
            ((root, "a"), "doc-2"),
            ((root, "b", "c"), "doc-1"),
            ((root, "b", "c"), "doc-2"),
        ]

    async def test_search_pages_are_keyset_pages(self, kv_store: KeyValueStore) -> None:
        ns = (_root("keyset"),)
        for key in ("b", "d", "f", "h"):
            await kv_store.put(ns, key, key)
        first = await kv_store.search(ns, limit=2)
        assert [item.key for item in first.items] == ["b", "d"]
        assert first.next_page_token is not None
        # Between pages: one item before the position, one after, and the last seen removed.
        await kv_store.put(ns, "a", "a")
        await kv_store.put(ns, "e", "e")
        await kv_store.delete(ns, "d")
        rest = await kv_store.search(ns, limit=10, page_token=first.next_page_token)
        assert [item.key for item in rest.items] == ["e", "f", "h"]
        assert rest.next_page_token is None

    async def test_the_last_page_has_no_token(self, kv_store: KeyValueStore) -> None:
        ns = (_root("last-page"),)
        for key in ("a", "b"):
            await kv_store.put(ns, key, 1)
        exact = await kv_store.search(ns, limit=2)
        assert len(exact.items) == 2
        assert exact.next_page_token is None
        keys = await kv_store.list_keys(ns, limit=2)
        assert keys.items == ["a", "b"]
        assert keys.next_page_token is None
        names = await kv_store.list_namespaces(ns, limit=1)
        assert names.items == [ns]
        assert names.next_page_token is None
        empty = await kv_store.search((_root("empty"),))
        assert empty.items == []
        assert empty.next_page_token is None

    async def test_list_keys_lists_one_namespace_exactly(self, kv_store: KeyValueStore) -> None:
        root = _root("keys")
        ns = (root, "a")
        keys = ["img", "doc/2", "doc/1", "doc", "do", "doc\x1e", "doc\uffff", "Doc"]
        for key in keys:
            await kv_store.put(ns, key, 1)
        await kv_store.put((root, "a", "b"), "doc/3", 1)
        await kv_store.put((root, "ab"), "doc/4", 1)
        await kv_store.put((root,), "doc/5", 1)
        assert (await kv_store.list_keys(ns)).items == sorted(keys)
        for limit in (1, 3):
            assert await _walk_keys(kv_store, ns, limit=limit) == sorted(keys)
        assert await _walk_keys(kv_store, ns, prefix="doc/", limit=1) == ["doc/1", "doc/2"]
        assert await _walk_keys(kv_store, ns, prefix="doc", limit=2) == sorted(
            k for k in keys if k.startswith("doc")
        )
        assert await _walk_keys(kv_store, ns, prefix="zzz", limit=2) == []

    async def test_list_namespaces_distinct_and_truncated(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        r = _root("namespaces")
        stored: list[Namespace] = [
            (r, "a"),
            (r, "a", "b"),
            (r, "a", "b", "c"),
            (r, "ab"),
            (r, "b", "c"),
            (r, "a\x1e"),
        ]
        for ns in stored:
            await kv_store.put(ns, "k1", 1)
            await kv_store.put(ns, "k2", 1)
        await kv_store.put((r, "gone"), "k", 1, ttl=timedelta(seconds=1))
        clock.advance(timedelta(seconds=1))
        by_path = sorted(stored, key=_path)
        for limit in (1, 2, 100):
            assert await _walk_namespaces(kv_store, (r,), limit=limit) == by_path
            assert await _walk_namespaces(kv_store, (r,), limit=limit, max_depth=2) == sorted(
                {ns[:2] for ns in stored}, key=_path
            )
        assert await _walk_namespaces(kv_store, (r,), limit=5, max_depth=1) == [(r,)]
        assert await _walk_namespaces(kv_store, (r, "a"), limit=1) == [
            (r, "a"),
            (r, "a", "b"),
            (r, "a", "b", "c"),
        ]
        assert await _walk_namespaces(kv_store, (r, "a"), limit=1, max_depth=2) == [(r, "a")]
        assert await _walk_namespaces(kv_store, (r, "a", "b", "c", "d"), limit=5) == []

    async def test_a_page_token_is_bound_to_its_query(self, kv_store: KeyValueStore) -> None:
        root = _root("tokens")
        ns = (root, "a")
        for key in ("k1", "k2", "k3"):
            await kv_store.put(ns, key, 1)
            await kv_store.put((root, "b"), key, 1)
        search = (await kv_store.search((root,), limit=1)).next_page_token
        keys = (await kv_store.list_keys(ns, limit=1)).next_page_token
        names = (await kv_store.list_namespaces((root,), limit=1)).next_page_token
        assert search
        assert keys
        assert names
        # Only the limit may change between pages.
        assert (await kv_store.search((root,), limit=5, page_token=search)).items
        misuse: list[Awaitable[Any]] = [
            kv_store.search((root, "a"), limit=1, page_token=search),
            kv_store.search((root,), key_prefix="k", limit=1, page_token=search),
            kv_store.search((root,), limit=1, page_token=keys),
            kv_store.list_keys((root, "b"), limit=1, page_token=keys),
            kv_store.list_keys(ns, prefix="k", limit=1, page_token=keys),
            kv_store.list_keys(ns, limit=1, page_token=search),
            kv_store.list_namespaces((root, "a"), limit=1, page_token=names),
            kv_store.list_namespaces((root,), max_depth=2, limit=1, page_token=names),
            kv_store.list_namespaces((root,), limit=1, page_token=search),
        ]
        for call in misuse:
            await _refused(call, PageTokenError, "page token")
        for bad in ("", "garbage", "a.b.c", _tampered(search), 42, b"token"):
            await _refused(
                kv_store.search((root,), limit=1, page_token=bad),  # type: ignore[arg-type]
                PageTokenError,
                "page token",
            )

    async def test_page_limits_are_1_to_1000(self, kv_store: KeyValueStore) -> None:
        ns = (_root("limits"),)
        await kv_store.put(ns, "k", 1)
        assert len((await kv_store.search(ns, limit=1000)).items) == 1
        assert (await kv_store.list_keys(ns, limit=1000)).items == ["k"]
        assert (await kv_store.list_namespaces(ns, limit=1000)).items == [ns]
        for bad in BAD_LIMITS:
            for call in (
                kv_store.search(ns, limit=bad),  # type: ignore[arg-type]
                kv_store.list_keys(ns, limit=bad),  # type: ignore[arg-type]
                kv_store.list_namespaces(ns, limit=bad),  # type: ignore[arg-type]
            ):
                await _refused(call, InvalidInputError, "limit", "1000")

    async def test_default_limits(self, kv_store: KeyValueStore) -> None:
        ns = (_root("defaults"),)
        keys = [f"k{i:04d}" for i in range(101)]
        await asyncio.gather(*(kv_store.put(ns, key, 1) for key in keys))
        searched = await kv_store.search(ns)
        assert len(searched.items) == 100
        assert searched.next_page_token is not None
        listed = await kv_store.list_keys(ns)
        assert listed.items == keys
        assert listed.next_page_token is None

    # ------------------------------------------------------------ isolation

    async def test_hostile_namespace_segments_stay_apart(self, kv_store: KeyValueStore) -> None:
        root = _root("hostile-ns")
        for name in HOSTILE_NAMES:
            await kv_store.put((root, name), "k", name)
        everything = await _walk_search(kv_store, (root,), limit=50)
        expected = sorted(((root, name), "k") for name in HOSTILE_NAMES)
        expected.sort(key=lambda address: _order(*address))
        assert _addresses(everything) == expected
        for name in HOSTILE_NAMES:
            ns = (root, name)
            _same_value(await kv_store.get(ns, "k"), name)
            assert _addresses(await _walk_search(kv_store, ns, limit=5)) == [(ns, "k")]
            assert (await kv_store.list_keys(ns)).items == ["k"]
            assert (await kv_store.list_namespaces(ns)).items == [ns]
        for name in HOSTILE_NAMES:
            assert await kv_store.delete((root, name), "k") is True
            remaining = {
                item.namespace[1] for item in await _walk_search(kv_store, (root,), limit=100)
            }
            assert name not in remaining
            assert len(remaining) == len(HOSTILE_NAMES) - HOSTILE_NAMES.index(name) - 1

    async def test_hostile_keys_stay_apart(self, kv_store: KeyValueStore) -> None:
        ns = (_root("hostile-keys"),)
        for name in HOSTILE_NAMES:
            await kv_store.put(ns, name, name)
        assert (await kv_store.list_keys(ns)).items == sorted(HOSTILE_NAMES)
        for name in HOSTILE_NAMES:
            _same_value(await kv_store.get(ns, name), name)
            expected = sorted(k for k in HOSTILE_NAMES if k.startswith(name))
            assert (await kv_store.list_keys(ns, prefix=name)).items == expected, name
            found = await _walk_search(kv_store, ns, key_prefix=name, limit=50)
            assert [item.key for item in found] == expected, name
        many = await kv_store.get_many(ns, list(HOSTILE_NAMES))
        assert list(many) == list(HOSTILE_NAMES)
        assert await kv_store.delete(ns, "a") is True
        assert "a" not in (await kv_store.list_keys(ns)).items
        assert len((await kv_store.list_keys(ns)).items) == len(HOSTILE_NAMES) - 1

    async def test_namespaces_that_prefix_each_other(self, kv_store: KeyValueStore) -> None:
        root = _root("prefixes")
        await kv_store.put((root, "a"), "k", "a")
        await kv_store.put((root, "ab"), "k", "ab")
        await kv_store.put((root, "a", "b"), "k", "a/b")
        _same_value(await kv_store.get((root, "a"), "k"), "a")
        assert (await kv_store.list_keys((root, "a"))).items == ["k"]
        assert await kv_store.delete((root, "a"), "k") is True
        _same_value(await kv_store.get((root, "ab"), "k"), "ab")
        _same_value(await kv_store.get((root, "a", "b"), "k"), "a/b")

    async def test_names_at_the_length_and_depth_limits(self, kv_store: KeyValueStore) -> None:
        root = _root("bounds")
        deep = (root, *(f"s{i}" for i in range(15)))
        long_name = "\U0001f600" * 1024
        await kv_store.put(deep, long_name, 1)
        _same_value(await kv_store.get(deep, long_name), 1)
        assert (await kv_store.list_namespaces((root,))).items == [deep]
        await _refused(
            kv_store.put((*deep, "one-more"), "k", 1), InvalidInputError, "1 to 16", "17"
        )

    # ------------------------------------------------------------ size limit

    async def test_value_size_limit_counts_canonical_json_bytes(
        self, kv_store: KeyValueStore
    ) -> None:
        ns = (_root("size"),)
        limit = kv_store.max_value_bytes
        assert limit == 4 * MIB, "the default size limit is 4 MiB"
        at_limit = "x" * (limit - 2)  # plus two quotes
        written = await kv_store.put(ns, "k", at_limit)
        assert written.version == 1
        _same_value(await kv_store.get(ns, "k"), at_limit)
        over = "x" * (limit - 1)
        error = await _refused(
            kv_store.put(ns, "k", over), InvalidInputError, f"{limit + 1:,}", f"{limit:,}"
        )
        assert "xxxx" not in str(error)
        # UTF-8 bytes count, not characters.
        wide = "\u00e9" * (limit // 2)
        await _refused(kv_store.put(ns, "k", wide), InvalidInputError, f"{limit:,}")
        await _refused(
            kv_store.put_if_version(ns, "k", {"a": over}, 1), InvalidInputError, f"{limit:,}"
        )
        await _refused(kv_store.put(ns, "new", [over]), InvalidInputError, f"{limit:,}")
        kept = await kv_store.get(ns, "k")
        assert kept is not None
        assert kept.version == 1
        assert await kv_store.get(ns, "new") is None

    # ------------------------------------------------------------ errors

    async def test_bad_namespaces_are_refused_and_nothing_written(
        self, kv_store: KeyValueStore
    ) -> None:
        root = _root("bad-ns")
        cases: list[tuple[object, str]] = [
            (root, "tuple of strings"),
            (b"root", "tuple of strings"),
            ({root: 1}, "tuple of strings"),
            (None, "tuple of strings"),
            ((), "1 to 16 segments"),
            ((root, *("s" for _ in range(16))), "16 segments"),
        ]
        cases += [((root, bad), words) for bad, words in BAD_NAMES]
        for bad_ns, words in cases:
            ns: Any = bad_ns
            calls: list[Awaitable[Any]] = [
                kv_store.get(ns, "k"),
                kv_store.get_many(ns, ["k"]),
                kv_store.put(ns, "k", 1),
                kv_store.put_if_version(ns, "k", 1, None),
                kv_store.delete(ns, "k"),
                kv_store.list_keys(ns),
            ]
            for call in calls:
                await _refused(call, InvalidInputError, "namespace", words)
            if ns != ():  # the empty prefix is valid: it covers everything
                await _refused(kv_store.search(ns), InvalidInputError, "namespace_prefix", words)
                await _refused(kv_store.list_namespaces(ns), InvalidInputError, "prefix", words)
        await _nothing_under(kv_store, root)

    async def test_bad_keys_are_refused_and_nothing_written(self, kv_store: KeyValueStore) -> None:
        root = _root("bad-key")
        ns = (root,)
        for bad, words in BAD_NAMES:
            key: Any = bad
            for call in (
                kv_store.get(ns, key),
                kv_store.put(ns, key, 1),
                kv_store.put_if_version(ns, key, 1, None),
                kv_store.delete(ns, key),
            ):
                await _refused(call, InvalidInputError, "key", words)
            await _refused(kv_store.get_many(ns, ["ok", key]), InvalidInputError, "keys[1]", words)
            if bad != "":  # the empty prefix is valid
                await _refused(
                    kv_store.list_keys(ns, prefix=key), InvalidInputError, "prefix", words
                )
                await _refused(
                    kv_store.search(ns, key_prefix=key), InvalidInputError, "key_prefix", words
                )
        for keys in ("k", {"k"}, None, 42):
            await _refused(kv_store.get_many(ns, keys), InvalidInputError, "keys")  # type: ignore[arg-type]
        await _nothing_under(kv_store, root)

    async def test_values_that_are_not_strict_json_are_refused(
        self, kv_store: KeyValueStore
    ) -> None:
        ns = (_root("bad-value"),)
        await kv_store.put(ns, "existing", "kept")
        for label, value in BAD_VALUES:
            for key in ("existing", "new"):
                for call in (
                    kv_store.put(ns, key, value),
                    kv_store.put_if_version(ns, key, value, None),
                    kv_store.put_if_version(ns, key, value, 1),
                ):
                    with pytest.raises(SerializationError) as info:
                        await call
                    assert isinstance(info.value, InvalidInputError), label
                    # The general class: ThreadStore* errors belong to the thread store.
                    assert not isinstance(info.value, ThreadStoreError), label
                    assert "value" in str(info.value), label
        assert (await kv_store.list_keys(ns)).items == ["existing"]
        kept = await kv_store.get(ns, "existing")
        assert kept is not None
        assert kept.version == 1

    async def test_bad_ttls_are_refused_and_nothing_written(self, kv_store: KeyValueStore) -> None:
        ns = (_root("bad-ttl"),)
        for bad in BAD_DURATIONS:
            ttl: Any = bad
            await _refused(kv_store.put(ns, "k", 1, ttl=ttl), InvalidInputError, "ttl")
            await _refused(
                kv_store.put_if_version(ns, "k", 1, None, ttl=ttl), InvalidInputError, "ttl"
            )
        await _nothing_under(kv_store, ns[0])

    async def test_bad_expected_versions_are_refused_and_nothing_changed(
        self, kv_store: KeyValueStore
    ) -> None:
        ns = (_root("bad-version"),)
        await kv_store.put(ns, "k", 1)
        for bad in BAD_VERSIONS:
            version: Any = bad
            await _refused(
                kv_store.put_if_version(ns, "k", 2, version), InvalidInputError, "expected_version"
            )
            await _refused(
                kv_store.delete(ns, "k", expected_version=version),
                InvalidInputError,
                "expected_version",
            )
        kept = await kv_store.get(ns, "k")
        assert kept is not None
        assert kept.version == 1

    async def test_bad_flags_and_depths_are_refused(self, kv_store: KeyValueStore) -> None:
        ns = (_root("bad-flags"),)
        for bad_flag in (1, "yes", None):
            flag: Any = bad_flag
            await _refused(
                kv_store.get(ns, "k", refresh_ttl=flag), InvalidInputError, "refresh_ttl"
            )
        for bad_depth in (0, 17, True, 1.5, "2"):
            depth: Any = bad_depth
            await _refused(
                kv_store.list_namespaces(ns, max_depth=depth), InvalidInputError, "max_depth"
            )

    async def test_a_closed_store_refuses_every_call(self, kv_store: KeyValueStore) -> None:
        ns = (_root("closed"),)
        await kv_store.put(ns, "k", 1)
        await kv_store.close()
        for call in (
            kv_store.get(ns, "k"),
            kv_store.get_many(ns, ["k"]),
            kv_store.put(ns, "k", 1),
            kv_store.put_if_version(ns, "k", 1, 1),
            kv_store.delete(ns, "k"),
            kv_store.search(ns),
            kv_store.list_keys(ns),
            kv_store.list_namespaces(ns),
            kv_store.purge_expired(),
        ):
            await _refused(call, ConfigurationError, "closed")

    # ------------------------------------------------------------ more rules

    async def test_put_if_version_sets_and_removes_the_ttl(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("cas-ttl"),)
        ttl = timedelta(seconds=5)
        created = await kv_store.put_if_version(ns, "k", 1, None, ttl=ttl)
        assert isinstance(created, Item)
        assert (created.ttl, created.expires_at) == (ttl, clock() + ttl)
        assert await kv_store.get(ns, "k") == created
        clock.advance(ms=10)
        kept = await kv_store.put_if_version(ns, "k", 2, 1)  # no ttl: the expiry goes
        assert isinstance(kept, Item)
        assert (kept.version, kept.ttl, kept.expires_at) == (2, None, None)
        clock.advance(timedelta(days=400))
        assert await kv_store.get(ns, "k") == kept
        again = await kv_store.put_if_version(ns, "k", 3, 2, ttl=ttl)
        assert isinstance(again, Item)
        assert again.expires_at == clock() + ttl
        clock.advance(ttl)
        assert await kv_store.get(ns, "k") is None

    async def test_delete_at_an_expected_version_of_an_expired_item(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("delete-expired"),)
        await kv_store.put(ns, "k", 1, ttl=timedelta(seconds=1))
        clock.advance(timedelta(seconds=1))
        assert await kv_store.delete(ns, "k", expected_version=1) is False
        assert await kv_store.get(ns, "k") is None
        assert (await kv_store.put(ns, "k", 2)).version == 1

    async def test_timestamps_are_utc_whole_milliseconds(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("ms"),)
        clock.advance(timedelta(microseconds=1_999))  # the clock is now between milliseconds
        now = clock()
        assert now.microsecond % 1000 != 0
        whole = now.replace(microsecond=now.microsecond - now.microsecond % 1000)
        ttl = timedelta(seconds=3)
        item = await kv_store.put(ns, "k", 1, ttl=ttl)
        assert (item.created_at, item.updated_at, item.expires_at) == (whole, whole, whole + ttl)
        for moment in (item.created_at, item.updated_at, item.expires_at):
            assert moment is not None
            assert moment.utcoffset() == timedelta(0)
        assert await kv_store.get(ns, "k") == item
        refreshed = await kv_store.get(ns, "k", refresh_ttl=True)
        assert refreshed is not None
        assert refreshed.expires_at == whole + ttl

    async def test_the_longest_ttl_round_trips(
        self, kv_store: KeyValueStore, clock: ManualClock
    ) -> None:
        ns = (_root("long-ttl"),)
        ttl = timedelta(days=365_000)  # the largest duration a store takes
        item = await kv_store.put(ns, "k", 1, ttl=ttl)
        assert (item.ttl, item.expires_at) == (ttl, clock() + ttl)
        assert await kv_store.get(ns, "k") == item
        clock.advance(timedelta(days=36_500))
        refreshed = await kv_store.get(ns, "k", refresh_ttl=True)
        assert refreshed is not None
        assert refreshed.expires_at == clock() + ttl
        assert await kv_store.get(ns, "k") == refreshed

    async def test_list_namespaces_pages_100_by_default(self, kv_store: KeyValueStore) -> None:
        root = _root("ns-default")
        names = [(root, f"n{i:03d}") for i in range(101)]
        await asyncio.gather(*(kv_store.put(ns, "k", 1) for ns in names))
        first = await kv_store.list_namespaces((root,))
        assert first.items == names[:100]
        assert first.next_page_token is not None
        rest = await kv_store.list_namespaces((root,), page_token=first.next_page_token)
        assert rest.items == names[100:]
        assert rest.next_page_token is None

    async def test_list_keys_pages_1000_by_default(self, kv_store: KeyValueStore) -> None:
        ns = (_root("keys-default"),)
        keys = [f"k{i:04d}" for i in range(1001)]
        for start in range(0, len(keys), 100):
            await asyncio.gather(*(kv_store.put(ns, key, 1) for key in keys[start : start + 100]))
        first = await kv_store.list_keys(ns)
        assert first.items == keys[:1000]
        assert first.next_page_token is not None
        rest = await kv_store.list_keys(ns, page_token=first.next_page_token)
        assert rest.items == keys[1000:]
        assert rest.next_page_token is None

    async def test_prefixes_next_to_the_surrogates_and_the_last_code_point(
        self, kv_store: KeyValueStore
    ) -> None:
        # A prefix's range ends at the prefix with its last code point incremented:
        # U+D7FF is followed by the surrogates (not valid text), U+10FFFF by nothing.
        root = _root("top")
        ns = (root,)
        keys = ["a\ud7ff", "a\ud7ffz", "a\ue000", "a\U0010fffe", "a\U0010ffff", "a\U0010ffffb", "b"]
        for key in keys:
            await kv_store.put(ns, key, key)
        for prefix, expected in (
            ("a\ud7ff", ["a\ud7ff", "a\ud7ffz"]),
            ("a\U0010fffe", ["a\U0010fffe"]),
            ("a\U0010ffff", ["a\U0010ffff", "a\U0010ffffb"]),
            ("\U0010ffff", []),
        ):
            assert (await kv_store.list_keys(ns, prefix=prefix)).items == expected, prefix
            found = await _walk_search(kv_store, ns, key_prefix=prefix, limit=1)
            assert [item.key for item in found] == expected, prefix
        for segment in ("s\ud7ff", "s\U0010ffff"):
            await kv_store.put((root, segment, "x"), "k", 1)
            await kv_store.put((root, segment + "y"), "k", 1)
            found = await _walk_search(kv_store, (root, segment), limit=1)
            assert _addresses(found) == [((root, segment, "x"), "k")], segment
            assert (await kv_store.list_namespaces((root, segment))).items == [(root, segment, "x")]

    # ------------------------------------------------------------ model-based

    async def test_store_agrees_with_a_model(
        self, kv_store: KeyValueStore, clock: ManualClock, pai_examples: int
    ) -> None:
        machine = _machine(kv_store, clock, asyncio.get_running_loop())
        await run_model(machine, examples=pai_examples, steps=STEPS)


# ---------------------------------------------------------------- model-based test

STEPS = 40
# Few addresses, so that steps meet each other's items; the neighbours of
# U+001F and a prefix-of-each-other pair make the order and isolation rules bite.
SUFFIXES: tuple[Namespace, ...] = ((), ("a",), ("a", "b"), ("a\x1e",), ("ab",))
KEYS = ("k", "k\x1e", "k ")
TTLS = st.sampled_from([None, 1, 1000, 60_000, 3_600_000])
ADVANCES_MS = st.sampled_from([1, 999, 1000, 59_999, 60_000, 120_000])
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: not (f == 0 and math.copysign(1.0, f) < 0)
    )
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@dataclass(frozen=True)
class _Stored:
    """The model of one stored item."""

    text: str
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    ttl: timedelta | None


def _view(item: Item | None) -> tuple[Any, ...] | None:
    if item is None:
        return None
    return (
        item.namespace,
        item.key,
        _canon(item.value),
        item.version,
        item.created_at,
        item.updated_at,
        item.expires_at,
        item.ttl,
    )


class _KVModel(RuleBasedStateMachine):
    """Writes, reads, listings, purges and clock moves, against a dict."""

    store: KeyValueStore
    clock: ManualClock
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        super().__init__()
        self.root = f"kv-model-{uuid.uuid4().hex[:12]}"
        self.stored: dict[tuple[Namespace, str], _Stored] = {}
        self.log: list[str] = []

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def ns(self, suffix: Namespace) -> Namespace:
        return (self.root, *suffix)

    def live(self, address: tuple[Namespace, str]) -> _Stored | None:
        entry = self.stored.get(address)
        if entry is None or (entry.expires_at is not None and entry.expires_at <= self.clock()):
            return None
        return entry

    def expect(self, address: tuple[Namespace, str]) -> tuple[Any, ...] | None:
        entry = self.live(address)
        if entry is None:
            return None
        return (
            address[0],
            address[1],
            entry.text,
            entry.version,
            entry.created_at,
            entry.updated_at,
            entry.expires_at,
            entry.ttl,
        )

    def write(self, address: tuple[Namespace, str], value: Any, ttl_ms: int | None) -> None:
        now = self.clock()
        previous = self.live(address)
        ttl = None if ttl_ms is None else timedelta(milliseconds=ttl_ms)
        self.stored[address] = _Stored(
            text=_canon(value),
            version=1 if previous is None else previous.version + 1,
            created_at=now if previous is None else previous.created_at,
            updated_at=now,
            expires_at=None if ttl is None else now + ttl,
            ttl=ttl,
        )

    def live_addresses(self) -> list[tuple[Namespace, str]]:
        return [address for address in self.stored if self.live(address) is not None]

    # ------------------------------------------------------------ rules

    def pick(self, data: st.DataObject) -> tuple[Namespace, str]:
        """An address: often one holding a live item, so steps act on each other's data."""
        live = self.live_addresses()
        existing: bool = bool(live) and data.draw(st.booleans(), label="existing")
        if existing:
            return data.draw(st.sampled_from(live), label="address")
        suffix = data.draw(st.sampled_from(SUFFIXES), label="suffix")
        return (self.ns(suffix), data.draw(st.sampled_from(KEYS), label="key"))

    @initialize(ttls=st.lists(TTLS, min_size=len(SUFFIXES), max_size=len(SUFFIXES)))
    def seed(self, ttls: list[int | None]) -> None:
        """One item in every namespace, so that listings and reads meet data at once."""
        for suffix, ttl in zip(SUFFIXES, ttls, strict=True):
            self.do_put((self.ns(suffix), KEYS[0]), list(suffix), ttl)

    def do_put(self, address: tuple[Namespace, str], value: Any, ttl: int | None) -> None:
        self.log.append(f"put {address} ttl={ttl}")
        duration = None if ttl is None else timedelta(milliseconds=ttl)
        item = self.run(self.store.put(address[0], address[1], value, ttl=duration))
        self.write(address, value, ttl)
        assert _view(item) == self.expect(address), self.log[-5:]

    @rule(data=st.data(), value=JSON_VALUES, ttl=TTLS)
    def put(self, data: st.DataObject, value: Any, ttl: int | None) -> None:
        self.do_put(self.pick(data), value, ttl)

    @rule(
        data=st.data(),
        value=JSON_VALUES,
        ttl=TTLS,
        which=st.sampled_from(["none", "current", "stale", "ahead"]),
    )
    def put_if_version(self, data: st.DataObject, value: Any, ttl: int | None, which: str) -> None:
        address = self.pick(data)
        current = self.live(address)
        version = 0 if current is None else current.version
        # Every choice is a valid input; the model decides whether it matches.
        expected = {
            "none": None,
            "current": version or None,
            "stale": max(version - 1, 1),
            "ahead": version + 1,
        }[which]
        self.log.append(f"put_if_version {address} expected={expected} ttl={ttl}")
        duration = None if ttl is None else timedelta(milliseconds=ttl)
        outcome = self.run(
            self.store.put_if_version(address[0], address[1], value, expected, ttl=duration)
        )
        if (None if current is None else current.version) == expected:
            assert isinstance(outcome, Item), self.log[-5:]
            self.write(address, value, ttl)
            assert _view(outcome) == self.expect(address), self.log[-5:]
        else:
            assert isinstance(outcome, KVConflict), self.log[-5:]
            assert _view(outcome.current) == self.expect(address), self.log[-5:]

    @rule(data=st.data(), which=st.sampled_from(["any", "current", "other"]))
    def delete(self, data: st.DataObject, which: str) -> None:
        address = self.pick(data)
        current = self.live(address)
        version = 0 if current is None else current.version
        expected = {"any": None, "current": max(version, 1), "other": version + 1}[which]
        self.log.append(f"delete {address} expected={expected}")
        deleted = self.run(self.store.delete(address[0], address[1], expected_version=expected))
        should = current is not None and expected in (None, current.version)
        assert deleted is should, self.log[-5:]
        if should:
            del self.stored[address]

    @rule(data=st.data(), refresh=st.booleans())
    def get(self, data: st.DataObject, refresh: bool) -> None:
        address = self.pick(data)
        self.log.append(f"get {address} refresh={refresh}")
        item = self.run(self.store.get(address[0], address[1], refresh_ttl=refresh))
        entry = self.live(address)
        if refresh and entry is not None and entry.ttl is not None:
            self.stored[address] = replace(entry, expires_at=self.clock() + entry.ttl)
        assert _view(item) == self.expect(address), self.log[-5:]

    @rule(suffix=st.sampled_from(SUFFIXES), keys=st.lists(st.sampled_from(KEYS), max_size=5))
    def get_many(self, suffix: Namespace, keys: list[str]) -> None:
        ns = self.ns(suffix)
        self.log.append(f"get_many {ns} {keys}")
        found = self.run(self.store.get_many(ns, keys))
        expected = {
            key: self.expect((ns, key)) for key in dict.fromkeys(keys) if self.live((ns, key))
        }
        assert list(found) == list(expected), self.log[-5:]
        assert {k: _view(v) for k, v in found.items()} == expected, self.log[-5:]

    @rule(ms=ADVANCES_MS)
    def advance(self, ms: int) -> None:
        self.log.append(f"advance {ms} ms")
        self.clock.advance(ms=ms)

    @rule(offset_ms=st.sampled_from([-1, 0]))
    def advance_to_an_expiry(self, offset_ms: int) -> None:
        """Move the clock to the next expiry instant (or just before it): the edge that matters."""
        now = self.clock()
        ahead = [
            entry.expires_at
            for entry in self.stored.values()
            if entry.expires_at is not None and entry.expires_at > now
        ]
        if ahead:
            target = min(ahead) + timedelta(milliseconds=offset_ms)
            self.log.append(f"advance to {target}")
            self.clock.set(max(target, now))

    @rule()
    def purge(self) -> None:
        self.log.append("purge")
        expired = [address for address in self.stored if self.live(address) is None]
        # The store may hold expired items of earlier examples too.
        assert self.run(self.store.purge_expired()) >= len(expired), self.log[-5:]
        for address in expired:
            del self.stored[address]

    @rule(
        suffix=st.sampled_from(SUFFIXES),
        key_prefix=st.sampled_from(["", "k", "k ", "k\x1e", "K"]),
        limit=st.sampled_from([1, 2, 5, 1000]),
    )
    def search(self, suffix: Namespace, key_prefix: str, limit: int) -> None:
        prefix = self.ns(suffix)
        self.log.append(f"search {prefix} key_prefix={key_prefix!r} limit={limit}")
        items = self.run(_walk_search(self.store, prefix, key_prefix=key_prefix, limit=limit))
        expected = sorted(
            (
                address
                for address in self.live_addresses()
                if address[0][: len(prefix)] == prefix and address[1].startswith(key_prefix)
            ),
            key=lambda address: _order(*address),
        )
        assert [_view(item) for item in items] == [self.expect(a) for a in expected], self.log[-5:]

    @rule(
        suffix=st.sampled_from(SUFFIXES),
        prefix=st.sampled_from(["", "k", "k ", "K"]),
        limit=st.sampled_from([1, 3, 1000]),
    )
    def list_keys(self, suffix: Namespace, prefix: str, limit: int) -> None:
        ns = self.ns(suffix)
        self.log.append(f"list_keys {ns} prefix={prefix!r} limit={limit}")
        keys = self.run(_walk_keys(self.store, ns, prefix=prefix, limit=limit))
        expected = sorted(
            key for (space, key) in self.live_addresses() if space == ns and key.startswith(prefix)
        )
        assert keys == expected, self.log[-5:]

    @rule(
        suffix=st.sampled_from([(), ("a",), ("a", "b")]),
        max_depth=st.sampled_from([None, 1, 2, 3]),
        limit=st.sampled_from([1, 2, 100]),
    )
    def list_namespaces(self, suffix: Namespace, max_depth: int | None, limit: int) -> None:
        prefix = self.ns(suffix)
        self.log.append(f"list_namespaces {prefix} max_depth={max_depth} limit={limit}")
        found = self.run(_walk_namespaces(self.store, prefix, max_depth=max_depth, limit=limit))
        expected = sorted(
            {
                space[:max_depth]
                for (space, _key) in self.live_addresses()
                if space[: len(prefix)] == prefix
            },
            key=_path,
        )
        assert found == expected, self.log[-5:]


def _machine(
    store: KeyValueStore, clock: ManualClock, loop: asyncio.AbstractEventLoop
) -> type[_KVModel]:
    class Machine(_KVModel):
        pass

    Machine.store = store
    Machine.clock = clock
    Machine.loop = loop
    return Machine
