"""The agent-state store topic: sessions of named single values and lists.

Uses one fixture for the store under test, ``state_store`` (an initialized
:class:`~pai_storage.state.AgentStateStore` made with the suite's ``clock``,
a :class:`~pai_storage.ManualClock`), plus ``clock`` and ``pai_examples``.
Every test works in users and sessions of its own, so a shared database is
fine.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
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
from pai_storage.state import AgentStateStore, ListConflict, StateConflict, VersionedState

from ._support import BAD_NAMES, HOSTILE_NAMES, run_model, tampered_token

__all__ = ["AgentStateStoreTests"]

pytestmark = pytest.mark.asyncio

T = TypeVar("T")
RACERS = 12
MS = timedelta(milliseconds=1)


BAD_VALUES: tuple[tuple[object, str], ...] = (
    (float("nan"), "NaN"),
    (float("inf"), "Infinity"),
    (-0.0, "negative zero"),
    (2**63, "64-bit"),
    ({1, 2}, "set"),
    (b"raw", "bytes"),
    ((1, 2), "tuple"),
    ({"a": [1, {"b": float("nan")}]}, "a[1].b"),
    ({1: "int key"}, "not a string"),
    ("lone \ud800", "surrogate"),
)

# Values whose exact form must survive: key order, 1 vs 1.0, 64-bit ints, U+0000.
EXACT_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    1,
    1.0,
    -1.5,
    2**63 - 1,
    -(2**63),
    1e308,
    5e-324,
    "",
    "text with \x00 and \u00e9 and \U0001f600",
    [],
    {},
    {"b": 1, "a": 2, "": [1, 1.0, {"z": None, "y": [True]}]},
    [[[]], {"nested": {"deeper": ["x"]}}],
)


def _ids(tag: str = "") -> tuple[str, str]:
    token = uuid.uuid4().hex
    return f"user-{tag}-{token}", f"session-{tag}-{token}"


def _same(a: Any, b: Any) -> bool:
    """Exact JSON equality: key order and ``1`` vs ``1.0`` included."""
    return json.dumps(a) == json.dumps(b)


async def _all_sessions(store: AgentStateStore, user: str | None, limit: int = 100) -> list[str]:
    out: list[str] = []
    token: str | None = None
    for _ in range(10_000):
        page = await store.list_session_ids(user, limit=limit, page_token=token)
        assert len(page.items) <= limit
        out.extend(page.items)
        assert len(set(out)) == len(out), f"a page repeated a session: {out}"
        token = page.next_page_token
        if token is None:
            return out
    raise AssertionError("pages never ended")


async def _enumerate_from(
    store: AgentStateStore, after: tuple[str | None, str], prefix: str, limit: int
) -> list[tuple[str | None, str]]:
    """Every live session of the users starting with ``prefix``, one page at a time."""
    out: list[tuple[str | None, str]] = []
    position: tuple[str | None, str] | None = after
    for _ in range(10_000):
        page = await store._list_sessions(position, limit)
        assert len(page) <= limit
        mine = [(u, s) for u, s in page if u is not None and u.startswith(prefix)]
        out.extend(mine)
        assert len(set(out)) == len(out), f"a page repeated a session: {out}"
        if len(page) < limit or len(mine) < len(page):
            return out
        position = page[-1]
    raise AssertionError("pages never ended")


def _ttl(store: AgentStateStore) -> timedelta | None:
    return store.session_ttl


class AgentStateStoreTests:
    """Round trips, versions, lists, sessions, expiry, pages, isolation, sizes, errors."""

    pytestmark = pytest.mark.asyncio

    # ------------------------------------------------------------ single values

    async def test_state_value_round_trip_is_exact(self, state_store: AgentStateStore) -> None:
        user, session = _ids("exact")
        for i, value in enumerate(EXACT_VALUES):
            assert await state_store.save(user, session, f"k{i}", value) == 1
        for i, value in enumerate(EXACT_VALUES):
            got = await state_store.get_versioned(user, session, f"k{i}")
            assert isinstance(got, VersionedState)
            assert got.version == 1
            assert _same(got.value, value), (i, got.value, value)
            assert _same(await state_store.get(user, session, f"k{i}"), value)
        await state_store.save(user, session, "int", 1)
        await state_store.save(user, session, "float", 1.0)
        await state_store.save(user, session, "big", 2**63 - 1)
        assert type(await state_store.get(user, session, "int")) is int
        assert type(await state_store.get(user, session, "float")) is float
        big = await state_store.get(user, session, "big")
        assert type(big) is int
        assert big == 2**63 - 1

    async def test_state_save_counts_versions(self, state_store: AgentStateStore) -> None:
        user, session = _ids("versions")
        assert await state_store.save(user, session, "k", "a") == 1
        assert await state_store.save(user, session, "k", "b") == 2
        assert await state_store.save(user, session, "k", "b") == 3
        assert await state_store.save(user, session, "other", 0) == 1
        got = await state_store.get_versioned(user, session, "k")
        assert got is not None
        assert (got.value, got.version) == ("b", 3)

    async def test_state_null_value_is_not_absent(self, state_store: AgentStateStore) -> None:
        user, session = _ids("null")
        assert await state_store.get(user, session, "k") is None
        assert await state_store.get_versioned(user, session, "k") is None
        await state_store.save(user, session, "k", None)
        got = await state_store.get_versioned(user, session, "k")
        assert got is not None
        assert got.value is None
        assert got.version == 1
        assert await state_store.exists(user, session)

    async def test_state_values_are_copies(self, state_store: AgentStateStore) -> None:
        user, session = _ids("copies")
        value: dict[str, Any] = {"items": [1, 2], "meta": {"a": "b"}}
        await state_store.save(user, session, "k", value)
        value["items"].append(3)
        value["meta"]["a"] = "changed"
        first = await state_store.get(user, session, "k")
        assert first == {"items": [1, 2], "meta": {"a": "b"}}
        first["items"].append(99)
        assert await state_store.get(user, session, "k") == {"items": [1, 2], "meta": {"a": "b"}}
        items: list[Any] = [{"n": 1}]
        await state_store.save_list(user, session, "l", items)
        items[0]["n"] = 2
        items.append("late")
        listed = await state_store.get_list(user, session, "l")
        assert listed == [{"n": 1}]
        listed[0]["n"] = 3
        assert await state_store.get_list(user, session, "l") == [{"n": 1}]

    async def test_state_save_if_version(self, state_store: AgentStateStore) -> None:
        user, session = _ids("cas")
        assert await state_store.save_if_version(user, session, "k", "v1", 1) == StateConflict(
            current_version=0
        )
        assert not await state_store.exists(user, session)
        assert await state_store.save_if_version(user, session, "k", "v1", 0) == 1
        assert await state_store.save_if_version(user, session, "k", "again", 0) == StateConflict(
            current_version=1
        )
        assert await state_store.save_if_version(user, session, "k", "v2", 1) == 2
        stale = await state_store.save_if_version(user, session, "k", "stale", 1)
        assert isinstance(stale, Conflict)
        assert isinstance(stale, StateConflict)
        assert stale.current_version == 2
        ahead = await state_store.save_if_version(user, session, "k", "ahead", 3)
        assert ahead == StateConflict(current_version=2)
        with pytest.raises(ConflictError, match="current version is 2") as raised:
            raise_on_conflict(ahead)
        assert raised.value.conflict is ahead
        got = await state_store.get_versioned(user, session, "k")
        assert got is not None
        assert (got.value, got.version) == ("v2", 2)
        assert await state_store.save(user, session, "k", "v3") == 3
        assert await state_store.save_if_version(user, session, "k", "v4", 3) == 4

    async def test_state_racing_creators_one_winner(self, state_store: AgentStateStore) -> None:
        user, session = _ids("race-create")
        results = await asyncio.gather(
            *(state_store.save_if_version(user, session, "k", i, 0) for i in range(RACERS))
        )
        winners = [i for i, r in enumerate(results) if r == 1]
        assert len(winners) == 1, results
        assert all(r == StateConflict(current_version=1) for r in results if r != 1), results
        got = await state_store.get_versioned(user, session, "k")
        assert got is not None
        assert (got.value, got.version) == (winners[0], 1)

    async def test_state_racing_updates_one_winner_per_version(
        self, state_store: AgentStateStore
    ) -> None:
        user, session = _ids("race-update")
        await state_store.save(user, session, "k", "start")
        for version in range(1, 4):
            results = await asyncio.gather(
                *(
                    state_store.save_if_version(user, session, "k", f"{version}-{i}", version)
                    for i in range(RACERS)
                )
            )
            assert results.count(version + 1) == 1, results
            lost = [r for r in results if r != version + 1]
            assert len(lost) == RACERS - 1, results
            assert all(
                isinstance(r, StateConflict) and r.current_version >= version + 1 for r in lost
            )

    async def test_state_racing_saves_get_distinct_versions(
        self, state_store: AgentStateStore
    ) -> None:
        user, session = _ids("race-save")
        results = await asyncio.gather(
            *(state_store.save(user, session, "k", i) for i in range(RACERS))
        )
        assert sorted(results) == list(range(1, RACERS + 1))
        got = await state_store.get_versioned(user, session, "k")
        assert got is not None
        assert got.version == RACERS
        assert got.value == results.index(RACERS)

    # ------------------------------------------------------------ lists

    async def test_state_list_round_trip(self, state_store: AgentStateStore) -> None:
        user, session = _ids("list")
        assert await state_store.get_list(user, session, "l") == []
        await state_store.save_list(user, session, "l", list(EXACT_VALUES))
        got = await state_store.get_list(user, session, "l")
        assert _same(got, list(EXACT_VALUES))
        await state_store.save_list(user, session, "t", ("a", 1))  # a tuple is a list of items
        assert await state_store.get_list(user, session, "t") == ["a", 1]
        await state_store.save_list(user, session, "empty", [])
        assert await state_store.get_list(user, session, "empty") == []
        other_user, other_session = _ids("list-empty")
        await state_store.save_list(other_user, other_session, "only", [])
        assert await state_store.exists(other_user, other_session)  # an empty list is a state

    async def test_state_save_list_appends_or_rewrites(self, state_store: AgentStateStore) -> None:
        user, session = _ids("save-list")

        async def check(values: list[Any]) -> None:
            await state_store.save_list(user, session, "l", values)
            assert _same(await state_store.get_list(user, session, "l"), values), values

        await check(["a", "b"])
        await check(["a", "b", "c"])  # the stored list is a prefix: extended
        await check(["a", "b", "c"])  # unchanged
        await check(["x"])  # shorter: rewritten
        await check(["a", "b"])  # same length 1 prefix differs: rewritten
        await check([])
        await check([1, {"a": 1, "b": 2}])
        await check([1.0, {"a": 1, "b": 2}, 3])  # 1 -> 1.0 is a change, not a prefix
        await check([1.0, {"b": 2, "a": 1}, 3])  # key order is a change too
        await check([1.0, {"b": 2, "a": 1}, 3, 4, 5])
        assert await state_store.append_list(user, session, "l", [6]) == 6
        await check([1.0, {"b": 2, "a": 1}, 3, 4, 5, 6, 7])  # after an append too
        await check([1.0, {"b": 2, "a": 1}, 3, 4, 5, 6, 8])

    async def test_state_append_list(self, state_store: AgentStateStore) -> None:
        user, session = _ids("append")
        assert await state_store.append_list(user, session, "l", ["a"]) == 1
        assert await state_store.append_list(user, session, "l", ["b", {"c": [1.0]}]) == 3
        assert await state_store.append_list(user, session, "l", []) == 3
        assert _same(await state_store.get_list(user, session, "l"), ["a", "b", {"c": [1.0]}])
        assert await state_store.append_list(user, session, "new", []) == 0
        assert await state_store.get_list(user, session, "new") == []
        assert await state_store.append_list(user, session, "tuple", ("x", "y")) == 2

    async def test_state_append_with_expected_length(self, state_store: AgentStateStore) -> None:
        user, session = _ids("append-cas")
        absent = await state_store.append_list(user, session, "l", ["a"], expected_length=1)
        assert absent == ListConflict(current_length=0)
        assert not await state_store.exists(user, session)
        assert await state_store.append_list(user, session, "l", ["a"], expected_length=0) == 1
        taken = await state_store.append_list(user, session, "l", ["x"], expected_length=0)
        assert isinstance(taken, Conflict)
        assert taken == ListConflict(current_length=1)
        assert await state_store.append_list(user, session, "l", ["b"], expected_length=1) == 2
        ahead = await state_store.append_list(user, session, "l", ["x"], expected_length=3)
        assert ahead == ListConflict(current_length=2)
        with pytest.raises(ConflictError, match="current length is 2"):
            raise_on_conflict(ahead)
        assert await state_store.get_list(user, session, "l") == ["a", "b"]

    async def test_state_racing_appends_with_expected_length(
        self, state_store: AgentStateStore
    ) -> None:
        user, session = _ids("race-append")
        await state_store.save_list(user, session, "l", ["start"])
        for length in range(1, 4):
            results = await asyncio.gather(
                *(
                    state_store.append_list(user, session, "l", [i, i], expected_length=length)
                    for i in range(RACERS)
                )
            )
            conflicts = [r for r in results if isinstance(r, ListConflict)]
            assert len(conflicts) == RACERS - 1, results
            assert all(c.current_length >= length + 2 for c in conflicts), results
            assert [r for r in results if not isinstance(r, ListConflict)] == [length + 2]
            await state_store.save_list(
                user, session, "l", ["start"] + ["pad"] * length
            )  # back to length + 1 for the next round

    async def test_state_racing_appends_all_land(self, state_store: AgentStateStore) -> None:
        user, session = _ids("race-append-all")
        results = await asyncio.gather(
            *(state_store.append_list(user, session, "l", [i]) for i in range(RACERS))
        )
        assert sorted(results) == list(range(1, RACERS + 1))
        stored = await state_store.get_list(user, session, "l")
        assert sorted(stored) == list(range(RACERS))
        for i, length in enumerate(results):
            assert stored[length - 1] == i  # each append saw its own position
        # The stored hash followed every append: an extension is still recognised.
        await state_store.save_list(user, session, "l", [*stored, "more"])
        assert await state_store.get_list(user, session, "l") == [*stored, "more"]

    async def test_state_kind_mismatch_is_an_error(self, state_store: AgentStateStore) -> None:
        user, session = _ids("kinds")
        await state_store.save(user, session, "single", {"v": 1})
        await state_store.save_list(user, session, "many", [1, 2])
        with pytest.raises(InvalidInputError, match="single value"):
            await state_store.get_list(user, session, "single")
        with pytest.raises(InvalidInputError, match="single value"):
            await state_store.save_list(user, session, "single", [1])
        with pytest.raises(InvalidInputError, match="single value"):
            await state_store.append_list(user, session, "single", [1])
        with pytest.raises(InvalidInputError, match="single value"):
            await state_store.append_list(user, session, "single", [1], expected_length=0)
        with pytest.raises(InvalidInputError, match="holds a list"):
            await state_store.get(user, session, "many")
        with pytest.raises(InvalidInputError, match="holds a list"):
            await state_store.get_versioned(user, session, "many")
        with pytest.raises(InvalidInputError, match="holds a list"):
            await state_store.save(user, session, "many", 3)
        with pytest.raises(InvalidInputError, match="holds a list"):
            await state_store.save_if_version(user, session, "many", 3, 0)
        got = await state_store.get_versioned(user, session, "single")
        assert got is not None
        assert (got.value, got.version) == ({"v": 1}, 1)
        assert await state_store.get_list(user, session, "many") == [1, 2]
        # Deleting a state frees its key for the other kind.
        assert await state_store.delete_state(user, session, "many")
        assert await state_store.save(user, session, "many", "now single") == 1
        assert await state_store.delete_state(user, session, "single")
        assert await state_store.append_list(user, session, "single", ["now a list"]) == 1

    # ------------------------------------------------------------ sessions

    async def test_state_exists_and_deletes(self, state_store: AgentStateStore) -> None:
        user, session = _ids("delete")
        assert not await state_store.exists(user, session)
        assert not await state_store.delete(user, session)
        assert not await state_store.delete_state(user, session, "k")
        await state_store.save(user, session, "k", 1)
        await state_store.save(user, session, "k", 2)
        await state_store.save_list(user, session, "l", [1])
        assert await state_store.exists(user, session)
        assert await state_store.delete_state(user, session, "k")
        assert not await state_store.delete_state(user, session, "k")
        assert await state_store.get_versioned(user, session, "k") is None
        assert await state_store.exists(user, session)
        assert await state_store.save(user, session, "k", 3) == 1  # a new key starts again
        assert await state_store.delete_state(user, session, "k")
        assert await state_store.delete_state(user, session, "l")
        assert not await state_store.exists(user, session)  # the last state took the session
        assert session not in await _all_sessions(state_store, user)
        await state_store.save(user, session, "a", 1)
        await state_store.save_list(user, session, "b", [1])
        assert await state_store.delete(user, session)
        assert not await state_store.delete(user, session)
        assert not await state_store.exists(user, session)
        assert await state_store.get(user, session, "a") is None
        assert await state_store.get_list(user, session, "b") == []
        assert await state_store.save(user, session, "a", 1) == 1

    async def test_state_list_session_ids_pages(self, state_store: AgentStateStore) -> None:
        user, _ = _ids("pages")
        sessions = ["b", "a", "a b", "ab", "B", "\u00e9", "e\u0301", "z" * 1024, "%", "_"]
        for session in sessions:
            await state_store.save(user, session, "k", session)
        other, _ = _ids("pages-other")
        await state_store.save(other, "not-mine", "k", 1)
        expected = sorted(sessions)  # code-point order
        for limit in (1, 3, len(sessions), 1000):
            assert await _all_sessions(state_store, user, limit) == expected
        page = await state_store.list_session_ids(user, limit=len(sessions))
        assert page.items == expected
        assert page.next_page_token is None
        page = await state_store.list_session_ids(user, limit=4)
        assert page.items == expected[:4]
        assert page.next_page_token is not None
        # Only limit may change between pages.
        rest = await state_store.list_session_ids(user, limit=100, page_token=page.next_page_token)
        assert rest.items == expected[4:]
        assert await _all_sessions(state_store, other) == ["not-mine"]
        fresh, _ = _ids("pages-none")
        empty = await state_store.list_session_ids(fresh)
        assert empty.items == []
        assert empty.next_page_token is None

    async def test_state_page_tokens(self, state_store: AgentStateStore) -> None:
        user, _ = _ids("tokens")
        other, _ = _ids("tokens-other")
        for session in ("s1", "s2", "s3"):
            await state_store.save(user, session, "k", 1)
            await state_store.save(other, session, "k", 1)
        token = (await state_store.list_session_ids(user, limit=1)).next_page_token
        assert token is not None
        with pytest.raises(PageTokenError, match="another"):
            await state_store.list_session_ids(other, limit=1, page_token=token)
        with pytest.raises(PageTokenError, match="another"):
            await state_store.list_session_ids(None, limit=1, page_token=token)
        tampered = tampered_token(token)
        for bad in ("", "garbage", "a.b.c", tampered, token + "x"):
            with pytest.raises(PageTokenError, match="page token"):
                await state_store.list_session_ids(user, limit=1, page_token=bad)
        with pytest.raises(PageTokenError, match="page token"):
            await state_store.list_session_ids(user, page_token=123)  # type: ignore[arg-type]
        for limit in (0, 1001, -1, True, "5", 1.0, None):
            with pytest.raises(InvalidInputError, match="limit"):
                await state_store.list_session_ids(user, limit=limit)  # type: ignore[arg-type]
        assert len((await state_store.list_session_ids(user, limit=1000)).items) == 3

    async def test_state_anonymous_user(self, state_store: AgentStateStore) -> None:
        _, session = _ids("anonymous")
        await state_store.save(None, session, "k", "anonymous value")
        assert await state_store.get(None, session, "k") == "anonymous value"
        assert await state_store.exists(None, session)
        for named in ("anonymous", "None", "null", " ", "\x1eanonymous"):
            assert not await state_store.exists(named, session)
            assert await state_store.get(named, session, "k") is None
            assert session not in await _all_sessions(state_store, named)
        assert session in await _all_sessions(state_store, None)
        await state_store.save("anonymous", session, "k", "named value")
        assert await state_store.get(None, session, "k") == "anonymous value"
        assert await state_store.delete(None, session)
        assert await state_store.get("anonymous", session, "k") == "named value"

    # ------------------------------------------------------------ expiry

    async def test_state_session_expires_all_at_once(
        self, state_store: AgentStateStore, clock: ManualClock
    ) -> None:
        ttl = _ttl(state_store)
        user, session = _ids("expiry")
        await state_store.save(user, session, "v", 1)
        await state_store.save_list(user, session, "l", [1, 2])
        if ttl is None:
            clock.advance(timedelta(days=3650))
            assert await state_store.exists(user, session)
            assert await state_store.purge_expired() >= 0
            assert await state_store.get(user, session, "v") == 1
            return
        clock.advance(ttl - MS)
        assert await state_store.exists(user, session)
        assert await state_store.get_list(user, session, "l") == [1, 2]
        clock.advance(MS)  # exactly ttl after the last write: gone, everywhere
        assert not await state_store.exists(user, session)
        assert await state_store.get(user, session, "v") is None
        assert await state_store.get_versioned(user, session, "v") is None
        assert await state_store.get_list(user, session, "l") == []
        assert session not in await _all_sessions(state_store, user)
        assert not await state_store.delete_state(user, session, "v")
        assert not await state_store.delete(user, session)

    async def test_state_write_refreshes_whole_session(
        self, state_store: AgentStateStore, clock: ManualClock
    ) -> None:
        ttl = _ttl(state_store)
        if ttl is None:
            return  # sessions never expire: test_state_session_expires_all_at_once covers it
        user, session = _ids("refresh")
        await state_store.save(user, session, "old", "kept")
        writes: list[Callable[[], Awaitable[Any]]] = [
            lambda: state_store.save(user, session, "v", 1),
            lambda: state_store.save_if_version(user, session, "cas", 1, 0),
            lambda: state_store.save_list(user, session, "l", [1]),
            lambda: state_store.append_list(user, session, "l", [2]),
            lambda: state_store.delete_state(user, session, "v"),
        ]
        for write in writes:
            clock.advance(ttl - MS)
            assert await state_store.get(user, session, "old") == "kept"
            await write()  # without it, the next step (ttl - 1 ms later) finds nothing
        clock.advance(ttl - MS)
        assert await state_store.get(user, session, "old") == "kept"
        clock.advance(MS)
        assert not await state_store.exists(user, session)

    async def test_state_failed_writes_do_not_refresh(
        self, state_store: AgentStateStore, clock: ManualClock
    ) -> None:
        ttl = _ttl(state_store)
        if ttl is None:
            return  # sessions never expire: test_state_session_expires_all_at_once covers it
        user, session = _ids("no-refresh")
        await state_store.save(user, session, "v", 1)
        await state_store.save_list(user, session, "l", [1])
        clock.advance(ttl - MS)
        assert await state_store.save_if_version(user, session, "v", 2, 5) == StateConflict(
            current_version=1
        )
        assert await state_store.append_list(
            user, session, "l", [2], expected_length=7
        ) == ListConflict(current_length=1)
        assert not await state_store.delete_state(user, session, "missing")
        with pytest.raises(InvalidInputError):
            await state_store.save(user, session, "l", "wrong kind")
        clock.advance(MS)
        assert not await state_store.exists(user, session)

    async def test_state_expired_session_is_not_resurrected(
        self, state_store: AgentStateStore, clock: ManualClock
    ) -> None:
        ttl = _ttl(state_store)
        if ttl is None:
            return  # sessions never expire: test_state_session_expires_all_at_once covers it
        user, session = _ids("fresh")
        await state_store.save(user, session, "v", "old")
        await state_store.save(user, session, "v", "old")
        await state_store.save_list(user, session, "l", ["old"])
        await state_store.save(user, session, "single", "old")
        clock.advance(ttl)
        assert await state_store.save_if_version(user, session, "v", "new", 0) == 1
        assert await state_store.append_list(user, session, "l", ["new"], expected_length=0) == 1
        assert await state_store.get_list(user, session, "l") == ["new"]
        assert await state_store.get(user, session, "single") is None
        assert await state_store.append_list(user, session, "single", ["list now"]) == 1
        assert await _all_sessions(state_store, user) == [session]

    async def test_state_purge_expired(
        self, state_store: AgentStateStore, clock: ManualClock
    ) -> None:
        ttl = _ttl(state_store)
        user, _ = _ids("purge")
        for i in range(3):
            await state_store.save(user, f"old-{i}", "k", i)
        if ttl is None:
            clock.advance(timedelta(days=3650))
            await state_store.purge_expired()
            assert len(await _all_sessions(state_store, user)) == 3
            return
        clock.advance(ttl - MS)
        await state_store.save_list(user, "young", "k", [1])
        clock.advance(MS)
        assert await state_store.purge_expired() >= 3
        assert await _all_sessions(state_store, user) == ["young"]
        assert await state_store.get_list(user, "young", "k") == [1]
        assert await state_store.purge_expired() >= 0
        assert await state_store.get_list(user, "young", "k") == [1]

    # ------------------------------------------------------------ isolation

    async def test_state_hostile_names_are_isolated(self, state_store: AgentStateStore) -> None:
        base_user, base_session = _ids("hostile")
        for i, name in enumerate(HOSTILE_NAMES):
            await state_store.save(base_user, base_session, name, i)
            await state_store.save_list(base_user, name, "k", [i])
            await state_store.save(name, base_session, "k", i)
        for i, name in enumerate(HOSTILE_NAMES):
            assert await state_store.get(base_user, base_session, name) == i, name
            assert await state_store.get_list(base_user, name, "k") == [i], name
            assert await state_store.get(name, base_session, "k") == i, name
        assert await _all_sessions(state_store, base_user) == sorted([base_session, *HOSTILE_NAMES])
        # Deleting one name touches nothing else.
        assert await state_store.delete_state(base_user, base_session, ".")
        assert await state_store.delete(base_user, "a")
        assert await state_store.delete("a", base_session)
        for i, name in enumerate(HOSTILE_NAMES):
            if name != ".":
                assert await state_store.get(base_user, base_session, name) == i, name
            if name != "a":
                assert await state_store.get_list(base_user, name, "k") == [i], name
                assert await state_store.get(name, base_session, "k") == i, name
        assert await state_store.get(base_user, base_session, ".") is None
        assert not await state_store.exists(base_user, "a")
        assert not await state_store.exists("a", base_session)

    async def test_state_prefix_names_are_isolated(self, state_store: AgentStateStore) -> None:
        user, session = _ids("prefix")
        await state_store.save(user + "x", session, "k", "longer user")
        await state_store.save(user, session + "x", "k", "longer session")
        await state_store.save(user, session, "kx", "longer key")
        assert await state_store.get(user, session, "k") is None
        assert not await state_store.delete_state(user, session, "k")
        assert await _all_sessions(state_store, user) == sorted([session, session + "x"])
        assert await _all_sessions(state_store, user + "x") == [session]
        assert await state_store.delete(user, session)
        assert await state_store.get(user, session + "x", "k") == "longer session"
        assert await state_store.get(user + "x", session, "k") == "longer user"

    # ------------------------------------------------------------ sizes

    async def test_state_value_size_limit(self, state_store: AgentStateStore) -> None:
        user, session = _ids("size")
        limit = state_store.max_value_bytes
        fits = "x" * (limit - 2)  # canonical JSON adds the two quotes
        assert await state_store.save(user, session, "k", fits) == 1
        assert await state_store.get(user, session, "k") == fits
        too_big = fits + "y"
        with pytest.raises(InvalidInputError, match=rf"{limit + 1:,} bytes.*{limit:,}"):
            await state_store.save(user, session, "k", too_big)
        with pytest.raises(InvalidInputError, match=f"{limit:,}"):
            await state_store.save_if_version(user, session, "k", too_big, 1)
        with pytest.raises(InvalidInputError, match=rf"values\[1\].*{limit:,}"):
            await state_store.save_list(user, session, "l", ["ok", too_big])
        with pytest.raises(InvalidInputError, match=rf"values\[0\].*{limit:,}"):
            await state_store.append_list(user, session, "l", [too_big])
        got = await state_store.get_versioned(user, session, "k")
        assert got is not None
        assert got.version == 1
        assert await state_store.get_list(user, session, "l") == []
        # Each item has the limit, not the list.
        assert await state_store.append_list(user, session, "l", [fits, fits]) == 2

    # ------------------------------------------------------------ errors

    async def test_state_bad_names_write_nothing(self, state_store: AgentStateStore) -> None:
        user, session = _ids("bad-names")

        def calls(u: Any, s: Any, k: Any) -> list[Callable[[], Awaitable[Any]]]:
            return [
                lambda: state_store.save(u, s, k, 1),
                lambda: state_store.save_if_version(u, s, k, 1, 0),
                lambda: state_store.get(u, s, k),
                lambda: state_store.get_versioned(u, s, k),
                lambda: state_store.save_list(u, s, k, [1]),
                lambda: state_store.append_list(u, s, k, [1]),
                lambda: state_store.get_list(u, s, k),
                lambda: state_store.delete_state(u, s, k),
            ]

        for bad, words in BAD_NAMES:
            if bad is None:  # user_id=None is the anonymous user; None elsewhere: below
                continue
            for position in range(3):
                args: list[Any] = [user, session, "k"]
                args[position] = bad
                for call in calls(*args):
                    with pytest.raises(InvalidInputError, match=re.escape(words)):
                        await call()
            session_calls: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = [
                (state_store.exists, (bad, session)),
                (state_store.exists, (user, bad)),
                (state_store.delete, (bad, session)),
                (state_store.delete, (user, bad)),
                (state_store.list_session_ids, (bad,)),
            ]
            for method, call_args in session_calls:
                with pytest.raises(InvalidInputError, match=re.escape(words)):
                    await method(*call_args)
        with pytest.raises(InvalidInputError, match="session_id"):
            await state_store.save(user, None, "k", 1)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="key"):
            await state_store.save(user, session, None, 1)  # type: ignore[arg-type]
        assert not await state_store.exists(user, session)
        assert await _all_sessions(state_store, user) == []

    async def test_state_bad_values_write_nothing(self, state_store: AgentStateStore) -> None:
        user, session = _ids("bad-values")
        await state_store.save(user, session, "k", "before")
        await state_store.save_list(user, session, "l", ["before"])
        for bad, words in BAD_VALUES:
            with pytest.raises(SerializationError, match=re.escape(words)):
                await state_store.save(user, session, "k", bad)
            with pytest.raises(SerializationError, match=re.escape(words)):
                await state_store.save_if_version(user, session, "k", bad, 1)
            with pytest.raises(SerializationError, match=re.escape(words)):
                await state_store.save_list(user, session, "l", ["ok", bad])
            with pytest.raises(SerializationError, match=re.escape(words)):
                await state_store.append_list(user, session, "l", [bad])
            with pytest.raises(SerializationError, match=re.escape(words)):
                await state_store.save(user, session, "new", bad)
        with pytest.raises(SerializationError, match=r"values\[1\]") as raised:
            await state_store.append_list(user, session, "l", ["ok", float("nan")])
        # The general class: ThreadStore* errors belong to the thread store.
        assert not isinstance(raised.value, ThreadStoreError)
        for not_a_list in ("abc", {"a": 1}, None, 5, {1, 2}, (x for x in [1])):
            with pytest.raises(InvalidInputError, match="list or tuple"):
                await state_store.save_list(user, session, "l", not_a_list)  # type: ignore[arg-type]
            with pytest.raises(InvalidInputError, match="list or tuple"):
                await state_store.append_list(user, session, "l", not_a_list)  # type: ignore[arg-type]
        got = await state_store.get_versioned(user, session, "k")
        assert got is not None
        assert (got.value, got.version) == ("before", 1)
        assert await state_store.get_list(user, session, "l") == ["before"]
        assert await state_store.get_versioned(user, session, "new") is None

    async def test_state_bad_conditions_write_nothing(self, state_store: AgentStateStore) -> None:
        user, session = _ids("bad-conditions")
        for bad in (-1, True, False, "1", 1.0, None, 2**63):
            with pytest.raises(InvalidInputError, match="expected_version"):
                await state_store.save_if_version(user, session, "k", 1, bad)  # type: ignore[arg-type]
        for bad in (-1, True, "0", 0.0, 2**63):
            with pytest.raises(InvalidInputError, match="expected_length"):
                await state_store.append_list(
                    user,
                    session,
                    "l",
                    [1],
                    expected_length=bad,  # type: ignore[arg-type]
                )
        assert not await state_store.exists(user, session)

    async def test_state_errors_are_storage_errors(self, state_store: AgentStateStore) -> None:
        user, session = _ids("roots")
        with pytest.raises(StorageError):
            await state_store.save(user, session, "", 1)
        with pytest.raises(ValueError, match="key"):
            await state_store.save(user, session, "", 1)
        with pytest.raises(StorageError):
            await state_store.list_session_ids(user, page_token="nope")

    async def test_state_closed_store_refuses_every_call(
        self, state_store: AgentStateStore
    ) -> None:
        user, session = _ids("closed")
        await state_store.save(user, session, "k", 1)
        await state_store.close()
        calls: list[Coroutine[Any, Any, Any]] = [
            state_store.save(user, session, "k", 1),
            state_store.save_if_version(user, session, "k", 1, 1),
            state_store.get(user, session, "k"),
            state_store.get_versioned(user, session, "k"),
            state_store.save_list(user, session, "l", [1]),
            state_store.append_list(user, session, "l", [1]),
            state_store.get_list(user, session, "l"),
            state_store.exists(user, session),
            state_store.delete(user, session),
            state_store.delete_state(user, session, "k"),
            state_store.list_session_ids(user),
            state_store.purge_expired(),
        ]
        for call in calls:
            with pytest.raises(ConfigurationError, match="closed"):
                await call

    # ------------------------------------------------------------ enumeration

    async def test_state_enumerates_sessions_in_code_point_order(
        self, enumerating_state_store: AgentStateStore
    ) -> None:
        store = enumerating_state_store
        prefix = f"enum-{uuid.uuid4().hex}"
        users = [f"{prefix}-{tail}" for tail in ("A", "a", "\u00e9", "\uffee", "\U0001f600")]
        sessions = ("s-b", "s-a", "s-\U0001f600", "s-\uffee")
        for user in reversed(users):
            for session in sessions:
                await store.save(user, session, "k", 1)
        expected = sorted((user, session) for user in users for session in sessions)
        for limit in (1, 3, 1000):
            found = await _enumerate_from(store, (prefix, "s"), prefix, limit)
            assert found == expected, f"limit {limit}"
        # ``after`` is strictly after, also from inside a user's sessions.
        after = expected[5]
        assert await store._list_sessions(after, 2) == expected[6:8]
        assert await store._list_sessions(expected[-2], 1) == expected[-1:]

    async def test_state_enumeration_puts_the_anonymous_user_first(
        self, enumerating_state_store: AgentStateStore
    ) -> None:
        store = enumerating_state_store
        tag = uuid.uuid4().hex
        anonymous = [f"anon-{tag}-1", f"anon-{tag}-2"]
        # A real user id may sort before the stored key of the anonymous user.
        early, late = f"\x01early-{tag}", f"zz-late-{tag}"
        for session in anonymous:
            await store.save(None, session, "k", "anonymous")
        await store.save(early, "s", "k", "early")
        await store.save(late, "s", "k", "late")
        first = await store._list_sessions(None, 1)
        assert len(first) == 1
        assert first[0][0] is None, first
        assert await store._list_sessions((None, f"anon-{tag}"), 2) == [
            (None, anonymous[0]),
            (None, anonymous[1]),
        ]
        # After every anonymous session come the named users.
        named = await store._list_sessions((None, "\U0010ffff"), 1)
        assert len(named) == 1
        assert named[0][0] is not None, named
        assert await store._list_sessions((f"\x01early-{tag}", ""), 1) == [(early, "s")]
        assert (late, "s") in await _enumerate_from(store, (late, ""), late, 10)

    async def test_state_enumeration_skips_expired_and_deleted_sessions(
        self, enumerating_state_store: AgentStateStore, clock: ManualClock
    ) -> None:
        store = enumerating_state_store
        ttl = _ttl(store)
        prefix = f"enum-expiry-{uuid.uuid4().hex}"
        old, young, gone = f"{prefix}-1", f"{prefix}-2", f"{prefix}-3"
        await store.save(old, "s", "v", 1)
        await store.save_list(old, "s", "l", [1])
        await store.save(gone, "s", "v", 1)
        assert await store.delete(gone, "s")
        assert await store._session_keys(gone, "s") == ([], [])
        if ttl is None:
            clock.advance(timedelta(days=3650))
            assert await _enumerate_from(store, (prefix, ""), prefix, 10) == [(old, "s")]
            return
        clock.advance(ttl - MS)
        await store.save(young, "s", "v", 2)
        assert await _enumerate_from(store, (prefix, ""), prefix, 10) == [(old, "s"), (young, "s")]
        clock.advance(MS)  # exactly ttl after its last write: the old session is gone
        assert await _enumerate_from(store, (prefix, ""), prefix, 10) == [(young, "s")]
        assert await store._session_keys(old, "s") == ([], [])
        assert await store._session_keys(young, "s") == (["v"], [])

    async def test_state_session_keys_split_values_and_lists(
        self, enumerating_state_store: AgentStateStore
    ) -> None:
        store = enumerating_state_store
        user, session = _ids("keys")
        for key in ("b", "a", "\U0001f600", "\uffee", "A"):
            await store.save(user, session, key, key)
        for key in ("y", "x", "\u00e9"):
            await store.save_list(user, session, key, [key])
        await store.append_list(user, session, "w", [])
        assert await store._session_keys(user, session) == (
            ["A", "a", "b", "\uffee", "\U0001f600"],
            ["w", "x", "y", "\u00e9"],
        )
        assert await store.delete_state(user, session, "a")
        assert await store.delete_state(user, session, "x")
        assert await store._session_keys(user, session) == (
            ["A", "b", "\uffee", "\U0001f600"],
            ["w", "y", "\u00e9"],
        )
        assert await store._session_keys(user, "missing") == ([], [])
        assert await store._session_keys(None, session) == ([], [])
        await store.save_list(None, session, "l", [1])
        assert await store._session_keys(None, session) == ([], ["l"])
        assert await store.delete(None, session)

    # ------------------------------------------------------------ defaults and fresh starts

    async def test_state_defaults(self, state_store: AgentStateStore) -> None:
        assert state_store.session_ttl == timedelta(days=30), "sessions expire after 30 days"
        user, _ = _ids("default-limit")
        sessions = [f"s{i:03d}" for i in range(101)]
        await asyncio.gather(*(state_store.save(user, s, "k", 1) for s in sessions))
        first = await state_store.list_session_ids(user)
        assert first.items == sessions[:100]
        assert first.next_page_token is not None
        rest = await state_store.list_session_ids(user, page_token=first.next_page_token)
        assert rest.items == sessions[100:]
        assert rest.next_page_token is None

    async def test_state_expired_session_starts_again_whatever_the_write(
        self, state_store: AgentStateStore, clock: ManualClock
    ) -> None:
        ttl = _ttl(state_store)
        if ttl is None:
            return  # sessions never expire: test_state_session_expires_all_at_once covers it
        s = state_store
        # (label, the write after expiry, its answer, then the value v, the list l)
        cases: list[tuple[str, Callable[[str, str], Awaitable[Any]], Any, Any, list[Any]]] = [
            ("save", lambda u, i: s.save(u, i, "v", "new"), 1, ("new", 1), []),
            (
                "stale cas",
                lambda u, i: s.save_if_version(u, i, "v", "new", 2),
                StateConflict(current_version=0),
                None,
                [],
            ),
            ("append", lambda u, i: s.append_list(u, i, "l", ["c"]), 1, None, ["c"]),
            (
                "stale append",
                lambda u, i: s.append_list(u, i, "l", ["c"], expected_length=2),
                ListConflict(current_length=0),
                None,
                [],
            ),
            (
                "extend",
                lambda u, i: s.save_list(u, i, "l", ["a", "b", "c"]),
                None,
                None,
                ["a", "b", "c"],
            ),
            ("same list", lambda u, i: s.save_list(u, i, "l", ["a", "b"]), None, None, ["a", "b"]),
            ("rewrite", lambda u, i: s.save_list(u, i, "l", ["c"]), None, None, ["c"]),
        ]
        for label, write, answer, value, items in cases:
            user, session = _ids("restart")
            await s.save(user, session, "v", "old")
            await s.save(user, session, "v", "old")
            await s.save(user, session, "other", "old")
            await s.save_list(user, session, "l", ["a", "b"])
            clock.advance(ttl)
            assert await write(user, session) == answer, label
            assert await s.get(user, session, "other") is None, label
            got = await s.get_versioned(user, session, "v")
            assert (None if got is None else (got.value, got.version)) == value, label
            assert await s.get_list(user, session, "l") == items, label
            written = value is not None or items != []
            assert await s.exists(user, session) is written, label
            assert await _all_sessions(s, user) == ([session] if written else []), label

    # ------------------------------------------------------------ model-based

    async def test_state_agrees_with_model(
        self, state_store: AgentStateStore, clock: ManualClock, pai_examples: int
    ) -> None:
        loop = asyncio.get_running_loop()
        machine = _machine(state_store, clock, loop)
        await run_model(machine, examples=pai_examples, steps=STEPS)


# ---------------------------------------------------------------- the model

STEPS = 40
KEYS = ("k", "l", ".", "$x")


def _finite(x: float) -> bool:
    return not (x == 0 and math.copysign(1.0, x) < 0)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(_finite)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@dataclass
class _ModelSession:
    expires_at: datetime | None
    values: dict[str, tuple[Any, int]] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)


class _StateWorkload(RuleBasedStateMachine):
    """The store under test beside a dict-of-dicts model of the contract."""

    store: AgentStateStore
    clock: ManualClock
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        super().__init__()
        token = uuid.uuid4().hex[:12]
        self.users: tuple[str | None, ...] = (None, f"model-{token}")
        self.session_ids = (f"s-{token}-a", f"s-{token}-b")
        self.model: dict[tuple[str | None, str], _ModelSession] = {}

    # ------------------------------------------------------------ plumbing

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def outcome(self, coro: Coroutine[Any, Any, Any]) -> tuple[str, Any]:
        try:
            got = self.run(coro)
        except StorageError as exc:
            return type(exc).__name__, None
        if isinstance(got, StateConflict | ListConflict):
            return type(got).__name__, got.model_dump(mode="json")
        return "ok", got

    def ttl(self) -> timedelta | None:
        return self.store.session_ttl

    def live(self, ref: tuple[str | None, str]) -> _ModelSession | None:
        found = self.model.get(ref)
        now = self.clock()
        if found is None or (found.expires_at is not None and found.expires_at <= now):
            return None
        return found

    def touch(self, ref: tuple[str | None, str]) -> _ModelSession:
        current = self.live(ref)
        if current is None:
            current = self.model[ref] = _ModelSession(expires_at=None)
        ttl = self.ttl()
        current.expires_at = None if ttl is None else self.clock() + ttl
        return current

    def kind(self, ref: tuple[str | None, str], key: str) -> str | None:
        current = self.live(ref)
        if current is None:
            return None
        if key in current.values:
            return "value"
        if key in current.lists:
            return "list"
        return None

    def expect(self, got: tuple[str, Any], wanted: tuple[str, Any], what: str) -> None:
        assert got[0] == wanted[0], f"{what}: store {got!r}, model {wanted!r}"
        assert _same(got[1], wanted[1]), f"{what}: store {got!r}, model {wanted!r}"

    # ------------------------------------------------------------ rules

    refs = st.tuples(st.sampled_from((0, 1)), st.sampled_from((0, 1)))

    def ref(self, pick: tuple[int, int]) -> tuple[str | None, str]:
        return self.users[pick[0]], self.session_ids[pick[1]]

    @rule(pick=refs, key=st.sampled_from(KEYS), value=JSON_VALUES)
    def save(self, pick: tuple[int, int], key: str, value: Any) -> None:
        ref = self.ref(pick)
        got = self.outcome(self.store.save(*ref, key, copy.deepcopy(value)))
        if self.kind(ref, key) == "list":
            wanted: tuple[str, Any] = ("InvalidInputError", None)
        else:
            current = self.live(ref)
            version = current.values[key][1] + 1 if current and key in current.values else 1
            self.touch(ref).values[key] = (value, version)
            wanted = ("ok", version)
        self.expect(got, wanted, f"save {ref} {key!r}")

    @rule(
        pick=refs,
        key=st.sampled_from(KEYS),
        value=JSON_VALUES,
        offset=st.sampled_from((0, 0, 0, 1, -1, "zero")),
    )
    def save_if_version(self, pick: tuple[int, int], key: str, value: Any, offset: Any) -> None:
        ref = self.ref(pick)
        current = self.live(ref)
        version = current.values[key][1] if current and key in current.values else 0
        expected = 0 if offset == "zero" else max(0, version + offset)
        got = self.outcome(self.store.save_if_version(*ref, key, copy.deepcopy(value), expected))
        if self.kind(ref, key) == "list":
            wanted: tuple[str, Any] = ("InvalidInputError", None)
        elif expected != version:
            wanted = ("StateConflict", {"currentVersion": version})
        else:
            self.touch(ref).values[key] = (value, version + 1)
            wanted = ("ok", version + 1)
        self.expect(got, wanted, f"save_if_version {ref} {key!r} {expected}")

    @rule(pick=refs, key=st.sampled_from(KEYS))
    def get_versioned(self, pick: tuple[int, int], key: str) -> None:
        ref = self.ref(pick)
        got = self.outcome(self.store.get_versioned(*ref, key))
        if got[0] == "ok" and got[1] is not None:
            got = ("ok", [got[1].value, got[1].version])
        kind = self.kind(ref, key)
        if kind == "list":
            wanted: tuple[str, Any] = ("InvalidInputError", None)
        elif kind is None:
            wanted = ("ok", None)
        else:
            current = self.live(ref)
            assert current is not None
            wanted = ("ok", list(current.values[key]))
        self.expect(got, wanted, f"get_versioned {ref} {key!r}")

    @rule(
        pick=refs,
        key=st.sampled_from(KEYS),
        extend=st.booleans(),
        values=st.lists(JSON_VALUES, max_size=4),
    )
    def save_list(self, pick: tuple[int, int], key: str, extend: bool, values: list[Any]) -> None:
        ref = self.ref(pick)
        current = self.live(ref)
        if extend and current is not None and key in current.lists:
            values = copy.deepcopy(current.lists[key]) + values
        got = self.outcome(self.store.save_list(*ref, key, copy.deepcopy(values)))
        if self.kind(ref, key) == "value":
            wanted: tuple[str, Any] = ("InvalidInputError", None)
        else:
            self.touch(ref).lists[key] = values
            wanted = ("ok", None)
        self.expect(got, wanted, f"save_list {ref} {key!r}")

    @rule(
        pick=refs,
        key=st.sampled_from(KEYS),
        values=st.lists(JSON_VALUES, max_size=3),
        condition=st.sampled_from((None, None, "current", "wrong")),
    )
    def append_list(
        self, pick: tuple[int, int], key: str, values: list[Any], condition: str | None
    ) -> None:
        ref = self.ref(pick)
        current = self.live(ref)
        length = len(current.lists[key]) if current and key in current.lists else 0
        expected = {None: None, "current": length, "wrong": length + 1}[condition]
        got = self.outcome(
            self.store.append_list(*ref, key, copy.deepcopy(values), expected_length=expected)
        )
        if self.kind(ref, key) == "value":
            wanted: tuple[str, Any] = ("InvalidInputError", None)
        elif expected is not None and expected != length:
            wanted = ("ListConflict", {"currentLength": length})
        else:
            stored = self.touch(ref).lists.setdefault(key, [])
            stored.extend(values)
            wanted = ("ok", len(stored))
        self.expect(got, wanted, f"append_list {ref} {key!r} {expected}")

    @rule(pick=refs, key=st.sampled_from(KEYS))
    def get_list(self, pick: tuple[int, int], key: str) -> None:
        ref = self.ref(pick)
        got = self.outcome(self.store.get_list(*ref, key))
        kind = self.kind(ref, key)
        if kind == "value":
            wanted: tuple[str, Any] = ("InvalidInputError", None)
        else:
            current = self.live(ref)
            wanted = ("ok", current.lists[key] if current and kind == "list" else [])
        self.expect(got, wanted, f"get_list {ref} {key!r}")

    @rule(pick=refs, key=st.sampled_from(KEYS))
    def delete_state(self, pick: tuple[int, int], key: str) -> None:
        ref = self.ref(pick)
        got = self.outcome(self.store.delete_state(*ref, key))
        existed = self.kind(ref, key) is not None
        if existed:
            current = self.touch(ref)
            current.values.pop(key, None)
            current.lists.pop(key, None)
            if not current.values and not current.lists:
                del self.model[ref]
        self.expect(got, ("ok", existed), f"delete_state {ref} {key!r}")

    @rule(pick=refs)
    def delete(self, pick: tuple[int, int]) -> None:
        ref = self.ref(pick)
        got = self.outcome(self.store.delete(*ref))
        existed = self.live(ref) is not None
        self.model.pop(ref, None)
        self.expect(got, ("ok", existed), f"delete {ref}")

    @rule(step=st.sampled_from(("1ms", "ttl-1ms", "ttl", "day")))
    def advance(self, step: str) -> None:
        ttl = self.ttl() or timedelta(days=30)
        delta = {"1ms": MS, "ttl-1ms": ttl - MS, "ttl": ttl, "day": timedelta(days=1)}[step]
        self.clock.advance(delta)

    @precondition(lambda self: bool(self.model))
    @rule()
    def purge_expired(self) -> None:
        expired = [ref for ref in self.model if self.live(ref) is None]
        count = self.run(self.store.purge_expired())
        assert count >= len(expired), (count, expired)
        for ref in expired:
            del self.model[ref]

    # ------------------------------------------------------------ invariants

    @invariant()
    def sessions_agree(self) -> None:
        for user in self.users:
            # The anonymous user is shared with every other test: big pages for it.
            limit = 1000 if user is None else 1
            listed = self.run(_all_sessions(self.store, user, limit=limit))
            mine = [s for s in listed if s in self.session_ids]
            wanted = sorted(s for s in self.session_ids if self.live((user, s)) is not None)
            assert mine == wanted, (user, mine, wanted)
            for session in self.session_ids:
                exists = self.run(self.store.exists(user, session))
                assert exists == (self.live((user, session)) is not None), (user, session)


def _machine(
    store: AgentStateStore, clock: ManualClock, loop: asyncio.AbstractEventLoop
) -> type[_StateWorkload]:
    class StateWorkload(_StateWorkload):
        pass

    StateWorkload.store = store
    StateWorkload.clock = clock
    StateWorkload.loop = loop
    return StateWorkload
