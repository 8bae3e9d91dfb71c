"""The key-value store on the memory backend: the conformance topic, plus memory-only checks.

The topic runs by subclassing, as a third party would. The extra tests cover
what the topic cannot reach through a store it did not make: the options, a
stored value that no longer decodes, exact purge counts.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from pai_storage_conformance.suite.kv import KeyValueStoreTests
from pai_storage_memory.kv import MemoryKeyValueStore

from pai_storage import ManualClock, StoreWarning
from pai_storage.backend import truncate_ms
from pai_storage.errors import ConfigurationError, InvalidInputError
from pai_storage.kv import (
    DEFAULT_MAX_VALUE_BYTES,
    Item,
    KeyValueStore,
    KVConflict,
    namespace_from_path,
    namespace_path,
    prefix_upper_bound,
)


class TestMemoryKeyValueStore(KeyValueStoreTests):
    @pytest_asyncio.fixture
    async def kv_store(self, clock: ManualClock) -> AsyncIterator[KeyValueStore]:
        async with MemoryKeyValueStore(clock=clock) as store:
            yield store


class _CorruptibleStore(MemoryKeyValueStore):
    """A memory store whose stored text a test can damage, as a bad migration might."""

    def corrupt(self, namespace: tuple[str, ...], key: str, text: str) -> None:
        address = (namespace, key)
        self._entries[address] = replace(self._entries[address], text=text)


PREFIX_ALPHABET = st.sampled_from(["a", "b", " ", "\x1e", "\x1f", "\ud7ff", "\ue000", "\U0010ffff"])

CORRUPT_TEXTS = (
    "",
    "{not json",
    "NaN",
    '{"a": NaN}',
    "1e999",
    '"\\ud800"',
    "[1,",
    '{"a":1} trailing',
    "[" * 65 + "]" * 65,
    "[" * 100_000 + "]" * 100_000,
)


@pytest.mark.parametrize("text", CORRUPT_TEXTS)
async def test_a_stored_value_that_no_longer_decodes_is_absent_and_reported(text: str) -> None:
    warnings: list[StoreWarning] = []
    ns = ("team", "alice")
    async with _CorruptibleStore(on_warning=warnings.append) as store:
        await store.put(ns, "bad", {"secret": "hunter2"}, ttl=timedelta(hours=1))
        await store.put(ns, "good", 1)
        store.corrupt(ns, "bad", text)
        assert await store.get(ns, "bad") is None
        assert await store.get(ns, "bad", refresh_ttl=True) is None
        assert list(await store.get_many(ns, ["bad", "good"])) == ["good"]
        page = await store.search(("team",), limit=1)
        assert [item.key for item in page.items] == []  # the page skipped "bad"
        assert page.next_page_token is not None
        rest = await store.search(("team",), page_token=page.next_page_token)
        assert [item.key for item in rest.items] == ["good"]
        conflict = await store.put_if_version(ns, "bad", 2, None)
        assert conflict == KVConflict(current=None)
        # Keys are listed (nothing about them is damaged) and the item can be replaced.
        assert (await store.list_keys(ns)).items == ["bad", "good"]
        # One warning per read that met it: get, get with refresh, get_many, search, conflict.
        assert len(warnings) == 5
        for warning in warnings:
            assert warning.kind == "invalid_record"
            assert (warning.namespace, warning.key) == (ns, "bad")
            assert "hunter2" not in repr(warning)
            assert "no longer decodes" in warning.reason
        replaced = await store.put(ns, "bad", "fine")
        assert replaced.version == 2
        assert (await store.get(ns, "bad")) == replaced
        assert await store.delete(ns, "bad", expected_version=2) is True
    assert len(warnings) == 5


async def test_without_on_warning_a_corrupt_value_is_logged_without_its_contents(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _CorruptibleStore() as store:
        await store.put(("ns",), "k", "hunter2")
        store.corrupt(("ns",), "k", '"hunter2')
        with caplog.at_level(logging.WARNING, logger="pai_storage"):
            assert await store.get(("ns",), "k") is None
    assert "invalid_record" in caplog.text
    assert "hunter2" not in caplog.text


async def test_max_value_bytes_option() -> None:
    async with MemoryKeyValueStore(max_value_bytes=10) as store:
        assert store.max_value_bytes == 10
        await store.put(("ns",), "k", "12345678")  # 10 bytes with its quotes
        with pytest.raises(InvalidInputError, match=r"11 bytes.*limit of 10 bytes"):
            await store.put(("ns",), "k", "123456789")
        with pytest.raises(InvalidInputError, match="limit of 10 bytes"):
            await store.put(("ns",), "k", {"a": 1, "b": 2})  # {"a":1,"b":2} is 13 bytes
        item = await store.get(("ns",), "k")
        assert item is not None
        assert item.value == "12345678"
    big = 64 * 1024 * 1024
    assert MemoryKeyValueStore(max_value_bytes=big).max_value_bytes == big
    assert MemoryKeyValueStore().max_value_bytes == DEFAULT_MAX_VALUE_BYTES == 4 * 1024 * 1024


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "4MiB", None])
def test_bad_max_value_bytes_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_value_bytes"):
        MemoryKeyValueStore(max_value_bytes=bad)


def test_a_backend_hard_limit_bounds_max_value_bytes() -> None:
    class Small(MemoryKeyValueStore):
        value_bytes_limit = 1000

    assert Small(max_value_bytes=1000).max_value_bytes == 1000
    with pytest.raises(ConfigurationError, match="1 to 1,000"):
        Small(max_value_bytes=1001)


def test_common_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="clock"):
        MemoryKeyValueStore(clock="now")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_warning"):
        MemoryKeyValueStore(on_warning=42)  # type: ignore[arg-type]


async def test_purge_counts_exactly_what_expired() -> None:
    clock = ManualClock()
    async with MemoryKeyValueStore(clock=clock) as store:
        for i in range(5):
            await store.put(("ns",), f"short{i}", i, ttl=timedelta(seconds=1))
        await store.put(("ns",), "long", 1, ttl=timedelta(seconds=10))
        await store.put(("ns",), "forever", 1)
        assert await store.purge_expired() == 0
        clock.advance(timedelta(seconds=1))
        assert await store.purge_expired() == 5
        assert await store.purge_expired() == 0
        clock.advance(timedelta(days=1))
        assert await store.purge_expired() == 1
        assert (await store.list_keys(("ns",))).items == ["forever"]


async def test_the_process_clock_is_used_without_a_test_clock() -> None:
    async with MemoryKeyValueStore() as store:
        before = truncate_ms(datetime.now(UTC))
        item = await store.put(("ns",), "k", 1, ttl=timedelta(hours=1))
        after = datetime.now(UTC)
        assert before <= item.created_at <= after
        assert item.created_at.microsecond % 1000 == 0
        assert item.expires_at == item.created_at + timedelta(hours=1)


async def test_item_json_form() -> None:
    clock = ManualClock(datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC))
    async with MemoryKeyValueStore(clock=clock) as store:
        item = await store.put(("a", "b"), "k", {"z": 1, "a": 1.0}, ttl=timedelta(seconds=90))
        assert item.to_json() == {
            "namespace": ["a", "b"],
            "key": "k",
            "value": {"z": 1, "a": 1.0},
            "version": 1,
            "createdAt": "2030-01-02T03:04:05.678Z",
            "updatedAt": "2030-01-02T03:04:05.678Z",
            "expiresAt": "2030-01-02T03:05:35.678Z",
            "ttl": "PT1M30S",
        }
        plain = await store.put(("a",), "k", None)
        assert plain.to_json() == {
            "namespace": ["a"],
            "key": "k",
            "value": None,
            "version": 1,
            "createdAt": "2030-01-02T03:04:05.678Z",
            "updatedAt": "2030-01-02T03:04:05.678Z",
        }
        assert Item.model_validate(item.to_json()) == item


def test_namespace_paths_make_segment_prefixes_string_prefixes() -> None:
    assert namespace_path(()) == ""
    assert namespace_path(("a", "b")) == "a\x1fb\x1f"
    assert namespace_from_path("a\x1fb\x1f") == ("a", "b")
    assert namespace_from_path("") == ()
    with pytest.raises(ValueError, match="U\\+001F"):
        namespace_from_path("a")
    assert prefix_upper_bound("") is None
    upper = prefix_upper_bound(namespace_path(("a",)))
    assert upper == "a "
    for inside in (("a",), ("a", "b"), ("a", "\uffff")):
        assert namespace_path(("a",)) <= namespace_path(inside) < upper
    for outside in (("ab",), ("a\x1e",), ("a ",), ("b",)):
        path = namespace_path(outside)
        assert not namespace_path(("a",)) <= path < upper


def test_prefix_upper_bound_is_valid_text_at_the_edges() -> None:
    assert prefix_upper_bound("ab") == "ac"
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound("\U0010ffff\U0010ffff") is None
    assert prefix_upper_bound("a\ud7ff") == "a\ue000"  # the surrogate block is skipped


@given(
    prefix=st.text(alphabet=PREFIX_ALPHABET, max_size=4),
    text=st.text(alphabet=PREFIX_ALPHABET, max_size=6),
)
def test_prefix_upper_bound_makes_a_prefix_a_range(prefix: str, text: str) -> None:
    upper = prefix_upper_bound(prefix)
    in_range = prefix <= text and (upper is None or text < upper)
    assert in_range == text.startswith(prefix)
