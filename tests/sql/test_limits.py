"""MariaDB's max_allowed_packet: records beyond it are refused whole, before
anything is sent; a commit whose records fit one by one is split into
statements that each fit."""

from __future__ import annotations

import pytest

from pai_storage import CommittedResult
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from .conftest import Target

pytestmark = pytest.mark.asyncio


async def test_records_beyond_max_allowed_packet(mysql_target: Target) -> None:
    async with mysql_target.store() as store:
        await store.initialize()
        packet = store.client.max_packet
        assert packet is not None
        huge = "x" * (packet + 1)
        with pytest.raises(ThreadStoreInvariantError, match="max_allowed_packet"):
            await store.commit_thread(
                b.create("s", "big", {"messages": [b.insert(b.message("m1", huge))]})
            )
        assert (await store.read_thread(b.read("s", "big"))).thread is None
        # Three records of 40% of a packet each: together more than one packet.
        part = "y" * (packet * 2 // 5)
        messages = [b.insert(b.message(f"m{i}", part)) for i in range(3)]
        created = await store.commit_thread(b.create("s", "split", {"messages": messages}))
        assert isinstance(created, CommittedResult)
        read = await store.read_thread(
            b.read("s", "split", messages={"type": "page", "view": "raw", "page": {"limit": 3}})
        )
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["m0", "m1", "m2"]
        assert all(m.parts[0].text == part for m in read.messages.items)  # type: ignore[union-attr]
