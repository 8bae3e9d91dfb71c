"""The agent-state topic on the memory store, plus what only the memory store can show."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_conformance.suite.state import AgentStateStoreTests
from pai_storage_memory.state import MemoryAgentStateStore

from pai_storage import ManualClock
from pai_storage.errors import ConfigurationError, InvalidInputError, UnavailableError
from pai_storage.runtime import canonical_json
from pai_storage.state import (
    ANONYMOUS_USER,
    EMPTY_LIST_HASH,
    ListConflict,
    ListHead,
    ListWrite,
    SessionKey,
    extend_list_hash,
)


@pytest_asyncio.fixture
async def state_store(clock: ManualClock) -> AsyncIterator[MemoryAgentStateStore]:
    async with MemoryAgentStateStore(clock=clock) as store:
        yield store


class TestMemoryAgentStateStore(AgentStateStoreTests):
    """The conformance topic, consumed the way a third-party backend would."""


class _Recording(MemoryAgentStateStore):
    """Records every list write the core plans."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.writes: list[ListWrite] = []

    async def _write_list(self, session: SessionKey, key: str, write: ListWrite) -> Any:
        self.writes.append(write)
        return await super()._write_list(session, key, write)


async def test_save_list_writes_only_new_items_after_an_unchanged_prefix() -> None:
    store = _Recording(clock=ManualClock())
    await store.save_list("u", "s", "l", ["a", "b"])
    assert store.writes[-1].replace
    assert store.writes[-1].items == ("a", "b")
    await store.save_list("u", "s", "l", ["a", "b", "c", {"d": 1}])
    last = store.writes[-1]
    assert not last.replace
    assert last.items == ("c", {"d": 1})
    assert last.expect == ListHead(2, extend_list_hash(EMPTY_LIST_HASH, ['"a"', '"b"']))
    await store.save_list("u", "s", "l", ["a", "b", "c", {"d": 1}])
    assert not store.writes[-1].replace
    assert store.writes[-1].items == ()
    await store.save_list("u", "s", "l", ["a", "X", "c", {"d": 1}, "e"])
    assert store.writes[-1].replace
    assert len(store.writes[-1].items) == 5
    await store.save_list("u", "s", "l", ["a"])
    assert store.writes[-1].replace


async def test_append_list_sends_only_the_new_items_and_extends_the_hash() -> None:
    store = _Recording(clock=ManualClock())
    await store.save_list("u", "s", "l", [1, 2, 3])
    assert await store.append_list("u", "s", "l", [4.0]) == 4
    last = store.writes[-1]
    assert not last.replace
    assert last.items == (4.0,)
    assert last.texts == ("4.0",)
    texts = [canonical_json(v) for v in (1, 2, 3, 4.0)]
    assert last.head == ListHead(4, extend_list_hash(EMPTY_LIST_HASH, texts))
    # The hash after an append equals the hash of saving the whole list at once.
    await store.save_list("u", "s", "l", [1, 2, 3, 4.0, 5])
    assert not store.writes[-1].replace
    assert store.writes[-1].items == (5,)


async def test_list_hash_tells_int_from_float_and_key_order() -> None:
    one = extend_list_hash(EMPTY_LIST_HASH, [canonical_json(1)])
    assert one != extend_list_hash(EMPTY_LIST_HASH, [canonical_json(1.0)])
    ab = extend_list_hash(EMPTY_LIST_HASH, [canonical_json({"a": 1, "b": 2})])
    assert ab != extend_list_hash(EMPTY_LIST_HASH, [canonical_json({"b": 2, "a": 1})])
    # Item boundaries count: ["ab"] is not ["a", "b"].
    assert extend_list_hash(EMPTY_LIST_HASH, ["ab"]) != extend_list_hash(
        EMPTY_LIST_HASH, ["a", "b"]
    )
    assert extend_list_hash(one, []) == one


async def test_racing_list_write_is_replanned() -> None:
    """A write that finds another one got there first re-reads and re-plans."""

    class Racy(MemoryAgentStateStore):
        interfere = False

        async def _list_head(self, session: SessionKey, key: str) -> Any:
            head = await super()._list_head(session, key)
            if self.interfere:
                self.interfere = False
                # Another writer appends between our read and our write.
                await MemoryAgentStateStore._write_list(
                    self,
                    session,
                    key,
                    ListWrite(
                        head,  # type: ignore[arg-type]
                        False,
                        ("other",),
                        ('"other"',),
                        ListHead(head.length + 1, extend_list_hash(head.hash, ['"other"'])),  # type: ignore[union-attr]
                    ),
                )
            return head

    store = Racy(clock=ManualClock())
    await store.save_list("u", "s", "l", ["first"])
    store.interfere = True
    assert await store.append_list("u", "s", "l", ["mine"]) == 3
    assert await store.get_list("u", "s", "l") == ["first", "other", "mine"]
    store.interfere = True
    assert await store.append_list("u", "s", "l", ["late"], expected_length=3) == ListConflict(
        current_length=4
    )
    assert await store.get_list("u", "s", "l") == ["first", "other", "mine", "other"]


async def test_endless_contention_gives_up_without_writing() -> None:
    class Hopeless(MemoryAgentStateStore):
        async def _write_list(self, session: SessionKey, key: str, write: ListWrite) -> Any:
            return False

    store = Hopeless(clock=ManualClock())
    with pytest.raises(UnavailableError, match="nothing was written"):
        await store.append_list("u", "s", "l", [1])
    assert not await store.exists("u", "s")


async def test_anonymous_user_is_stored_under_the_sentinel() -> None:
    store = MemoryAgentStateStore(clock=ManualClock())
    await store.save(None, "s", "k", 1)
    assert list(store._users) == [ANONYMOUS_USER]
    assert "\x1f" in ANONYMOUS_USER  # no real user id can contain it
    with pytest.raises(InvalidInputError, match="U\\+001F"):
        await store.save(ANONYMOUS_USER, "s", "k", 2)


async def test_sessions_can_be_kept_forever() -> None:
    clock = ManualClock()
    store = MemoryAgentStateStore(clock=clock, session_ttl=None)
    await store.save("u", "s", "k", 1)
    clock.advance(timedelta(days=36_500))
    assert await store.get("u", "s", "k") == 1
    assert await store.purge_expired() == 0


async def test_session_ttl_is_configurable() -> None:
    clock = ManualClock()
    store = MemoryAgentStateStore(clock=clock, session_ttl=timedelta(seconds=5))
    await store.save("u", "s", "k", 1)
    clock.advance(timedelta(seconds=5) - timedelta(milliseconds=1))
    assert await store.exists("u", "s")
    clock.advance(ms=1)
    assert not await store.exists("u", "s")
    assert await store.purge_expired() == 1
    assert await store.purge_expired() == 0


async def test_value_limit_is_configurable() -> None:
    store = MemoryAgentStateStore(clock=ManualClock(), max_value_bytes=10)
    assert await store.save("u", "s", "k", "12345678") == 1  # 10 bytes with the quotes
    with pytest.raises(InvalidInputError, match=r"11 bytes.*limit of 10 bytes"):
        await store.save("u", "s", "k", "123456789")
    with pytest.raises(InvalidInputError, match="12 bytes"):
        await store.save("u", "s", "k", "\u00e9" * 5)  # UTF-8 bytes, not characters


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"session_ttl": 30}, "session_ttl must be a datetime.timedelta"),
        ({"session_ttl": timedelta(0)}, "session_ttl must be at least 1 ms"),
        ({"session_ttl": timedelta(microseconds=10)}, "session_ttl must be at least 1 ms"),
        ({"max_value_bytes": 0}, "max_value_bytes must be an integer from 1"),
        ({"max_value_bytes": True}, "max_value_bytes must be an integer"),
        ({"max_value_bytes": "4MiB"}, "max_value_bytes must be an integer"),
        ({"clock": "now"}, "clock"),
    ],
)
def test_bad_options_are_configuration_errors(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        MemoryAgentStateStore(**options)


def test_value_limit_cannot_exceed_the_backend_limit() -> None:
    class Limited(MemoryAgentStateStore):
        value_bytes_limit = 100

    assert Limited(max_value_bytes=100).max_value_bytes == 100
    with pytest.raises(ConfigurationError, match="from 1 to 100 for the memory backend"):
        Limited(max_value_bytes=101)
    with pytest.raises(ConfigurationError, match="max_value_bytes"):
        Limited()  # the 4 MiB default is over this backend's limit


def test_versioned_state_repr_hides_the_value() -> None:
    from pai_storage.state import VersionedState

    state = VersionedState(value={"secret": "hunter2"}, version=3)
    assert "hunter2" not in repr(state)
    assert "version=3" in repr(state)
    assert state.to_json() == {"value": {"secret": "hunter2"}, "version": 3}
    with pytest.raises(InvalidInputError):
        VersionedState(value=1, version=0)
