"""A record over MongoDB's 16 MiB document limit is an invariant error, whoever refuses it.

The driver refuses a document only beyond the limit plus its 16 KiB command
allowance; between the two the server does (code 2 for an insert, 17419 for a
replacement). Every size over the limit must give the same typed error, and
nothing is applied.
"""

from __future__ import annotations

from typing import Any

import pytest
from pai_storage_mongo.store import MongoThreadStore

from pai_storage import CommittedResult, InvalidInputError, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

LIMIT = 16 * 1024 * 1024
# Just over the limit (the server refuses), inside the driver's allowance, and far beyond it
# (the driver refuses). A record's own fields add well under 2 KiB to its padding.
OVER = {"just-over": LIMIT + 2048, "allowance": LIMIT + 12 * 1024, "far": 17 * 1024 * 1024}


def _padded(size: int) -> dict[str, Any]:
    return {"pad": "x" * size}


def _changes(where: str, size: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The child changes and root fields that put a record of about ``size`` bytes in ``where``."""
    big = _padded(size)
    if where == "message-insert":  # insert_one
        return {"messages": [b.insert(b.message("m2", metadata=big))]}, {}
    if where == "message-inserts":  # insert_many
        return {
            "messages": [b.insert(b.message("m2")), b.insert(b.message("m3", metadata=big))]
        }, {}
    if where == "message-replace":  # bulk write with a replacement
        return {"messages": [b.replace(b.message("m1", metadata=big))]}, {}
    if where == "run-insert":
        return {"runs": [b.insert(b.run("r1", "completed", metadata=big))]}, {}
    return None, {"metadata": big}  # the root: replace_one


async def _thread(store: MongoThreadStore) -> ThreadVersion:
    created = await store.commit_thread(
        b.create("s", "t", {"messages": [b.insert(b.message("m1"))]})
    )
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    return created.thread.version


@pytest.mark.parametrize(
    "where", ["message-insert", "message-inserts", "message-replace", "run-insert", "root"]
)
async def test_a_record_over_16_mib_is_an_invariant_error(
    mongo_store: MongoThreadStore, where: str
) -> None:
    version = await _thread(mongo_store)
    for size in OVER.values():
        changes, root = _changes(where, size)
        with pytest.raises(ThreadStoreInvariantError, match="16 MiB document limit") as err:
            await mongo_store.commit_thread(
                b.update_at("s", "t", version, changes, root=b.root(**root))
            )
        assert isinstance(err.value, InvalidInputError)
        assert "nothing was applied" in str(err.value)
        assert "xxxx" not in str(err.value)
        read = await mongo_store.read_thread(
            b.read("s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 10}})
        )
        assert read.thread is not None
        assert read.thread.version == version
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["m1"]


async def test_a_record_just_under_the_limit_is_stored(mongo_store: MongoThreadStore) -> None:
    version = await _thread(mongo_store)
    changes, _ = _changes("message-insert", LIMIT - 4096)
    done = await mongo_store.commit_thread(b.update_at("s", "t", version, changes, root=b.root()))
    assert isinstance(done, CommittedResult)
