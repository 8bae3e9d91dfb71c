"""builders.update keeps the root fields it does not name; the old form is refused."""

from __future__ import annotations

from typing import Any

import pytest

from pai_storage import CommittedResult, ThreadRecord, open_store
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError


async def _created(store: Any, **root: Any) -> ThreadRecord:
    result = await store.commit_thread(b.create("s", "t", **root))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def _commit(store: Any, commit: dict[str, Any]) -> ThreadRecord:
    result = await store.commit_thread(commit)
    assert isinstance(result, CommittedResult), result
    assert result.thread is not None
    return result.thread


async def test_an_update_built_from_a_thread_keeps_its_root_fields() -> None:
    async with open_store("memory://") as store:
        thread = await _created(
            store,
            title="Trip to Oslo",
            category="travel",
            metadata={"pinned": True},
            privateMetadata={"cost": 3},
            visibility="hidden",
        )
        after = await _commit(store, b.update(thread, {"messages": [b.insert(b.message("m1"))]}))
        assert after.version.revision == 2
        assert (after.title, after.category) == ("Trip to Oslo", "travel")
        assert after.metadata == {"pinned": True}
        assert after.private_metadata == {"cost": 3}
        assert after.list_visibility == "hidden"


async def test_an_update_changes_only_what_it_names() -> None:
    async with open_store("memory://") as store:
        thread = await _created(store, title="Trip", metadata={"pinned": True})
        retitled = await _commit(store, b.update(thread, title="Trip to Oslo"))
        assert (retitled.title, retitled.metadata) == ("Trip to Oslo", {"pinned": True})
        pinned = await _commit(store, b.update(retitled, metadata={"pinned": False}))
        assert (pinned.title, pinned.metadata) == ("Trip to Oslo", {"pinned": False})
        shown = await _commit(store, b.update(pinned, visibility="hidden", title=None))
        assert (shown.list_visibility, shown.title, shown.metadata) == (
            "hidden",
            None,
            {"pinned": False},
        )


def test_the_old_positional_form_is_refused_with_the_way_out() -> None:
    with pytest.raises(ThreadStoreInvariantError) as caught:
        b.update("s", "t", {"threadInstanceId": "x", "revision": 1}, {})  # type: ignore[arg-type]
    message = str(caught.value)
    assert "update(thread, changes" in message
    assert "update_at(scope_key, thread_id, version" in message
    assert "keeps every root field" in message


async def test_update_at_writes_the_whole_root_it_is_given() -> None:
    async with open_store("memory://") as store:
        thread = await _created(store, title="Trip", metadata={"pinned": True})
        replaced = await _commit(
            store, b.update_at("s", "t", thread.version, root=b.root(category="c"))
        )
        assert (replaced.title, replaced.metadata, replaced.category) == (None, {}, "c")
