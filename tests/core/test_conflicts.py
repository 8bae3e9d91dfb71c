"""One conflict type: every conditional write's conflict is a pai_storage.Conflict."""

from __future__ import annotations

import pytest

import pai_storage
from pai_storage import (
    Conflict,
    ConflictError,
    ConflictResult,
    KVConflict,
    ListConflict,
    StateConflict,
    builders,
    raise_on_conflict,
)


@pytest.mark.asyncio
async def test_every_conditional_write_returns_a_conflict() -> None:
    async with pai_storage.connect("memory://") as stores:
        created = await stores.threads.commit_thread(builders.create("t", "chat"))
        assert created.type == "committed"
        stale = await stores.threads.commit_thread(builders.create("t", "chat"))
        assert isinstance(stale, ConflictResult)
        assert isinstance(stale, Conflict)

        await stores.kv.put(("ns",), "k", "v")
        kv = await stores.kv.put_if_version(("ns",), "k", "w", 5)
        assert isinstance(kv, KVConflict)
        assert isinstance(kv, Conflict)

        await stores.state.save("u", "s", "k", "v")
        state = await stores.state.save_if_version("u", "s", "k", "w", 5)
        assert state == StateConflict(current_version=1)
        assert isinstance(state, Conflict)

        await stores.state.append_list("u", "s", "l", [1, 2])
        listed = await stores.state.append_list("u", "s", "l", [3], expected_length=5)
        assert listed == ListConflict(current_length=2)
        assert isinstance(listed, Conflict)

        for conflict, words in (
            (stale, "the thread is at revision 1"),
            (kv, "the item's current version is 1"),
            (state, "the key's current version is 1"),
            (listed, "the list's current length is 2"),
        ):
            with pytest.raises(ConflictError, match=words) as raised:
                raise_on_conflict(conflict)
            assert raised.value.conflict is conflict
            assert "not applied" in str(raised.value)
            assert isinstance(raised.value, pai_storage.StorageError)


@pytest.mark.asyncio
async def test_raise_on_conflict_passes_a_written_result_through() -> None:
    async with pai_storage.connect("memory://") as stores:
        assert raise_on_conflict(await stores.state.save_if_version("u", "s", "k", 1, 0)) == 1
        assert raise_on_conflict(await stores.state.append_list("u", "s", "l", [1])) == 1
        item = raise_on_conflict(await stores.kv.put_if_version(("ns",), "k", "v", None))
        assert item.version == 1
        absent = await stores.state.save_if_version("u", "s", "other", 1, 3)
        assert absent == StateConflict(current_version=0)
        with pytest.raises(ConflictError, match="the key is absent"):
            raise_on_conflict(absent)


def test_conflicts_are_json_and_never_show_a_stored_value() -> None:
    assert StateConflict(current_version=3).model_dump(mode="json") == {"currentVersion": 3}
    assert ListConflict(current_length=0).model_dump(mode="json") == {"currentLength": 0}
    with pytest.raises(pai_storage.InvalidInputError):
        StateConflict(current_version=-1)
