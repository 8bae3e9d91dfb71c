"""Scope erasure on MongoDB after the eraser was killed with an open transaction.

A process killed in the middle of a thread's delete (``kill -9``) leaves its
transaction open on the server, holding that thread, until the server ends it
(``transactionLifetimeLimitSeconds``, 60 s by default, checked periodically).
Every delete of the thread meanwhile is refused (write conflicts, retried by
the store until it gives up as unavailable). ``erase_scope`` skips such a
thread, erases the rest, and comes back to it for at most
``maintenance.HELD_WAIT`` seconds; after that it raises an unavailable error
that says when to call again.

This mongod ends abandoned transactions after 45 s, not 60, to keep the test
shorter; the erasure does not depend on it (it waits up to 150 s).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pai_storage_mongo.harness import MongodProcess
from pai_storage_mongo.store import MongoThreadStore
from pymongo import AsyncMongoClient

from pai_storage import UnavailableError, maintenance
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreUnavailableError

pytestmark = pytest.mark.asyncio

DB = "pai_test"

_HOLDER = """
import sys, time
from pymongo import MongoClient

url, db, threads, messages, scope, thread_id = sys.argv[1:]
client = MongoClient(url)
session = client.start_session()
session.start_transaction()
client[db][messages].delete_many({"scopeKey": scope, "threadId": thread_id}, session=session)
client[db][threads].delete_one({"scopeKey": scope, "threadId": thread_id}, session=session)
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def short_lived_mongod() -> Iterator[MongodProcess]:
    process = MongodProcess(extra_args=["--setParameter", "transactionLifetimeLimitSeconds=45"])
    process.start()
    try:
        yield process
    finally:
        process.stop()


async def _left(url: str, store: MongoThreadStore, scope: str) -> dict[str, list[str]]:
    """The thread ids of ``scope`` in each of the store's collections, read raw."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        out = {}
        for family, name in store.collection_names().items():
            docs = await client[DB][name].find({"scopeKey": scope}).to_list()
            out[family] = sorted({d["threadId"] for d in docs})
        return out
    finally:
        await client.close()


async def test_an_erasure_finishes_after_the_eraser_was_killed(
    short_lived_mongod: MongodProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = short_lived_mongod.url
    store = MongoThreadStore(url, db_name=DB, collection_name=f"pai_test_{uuid.uuid4().hex}")
    scope = "tenant"
    await store.initialize()
    holder: asyncio.subprocess.Process | None = None
    try:
        for i in range(5):
            await store.commit_thread(
                b.create(scope, f"t{i}", {"messages": [b.insert(b.message(f"m{i}", "hi"))]})
            )
        names = store.collection_names()
        args = (url, DB, names["threads"], names["messages"], scope, "t2")
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLDER, *args, stdout=asyncio.subprocess.PIPE
        )
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), timeout=60)
        assert line.strip() == b"held"

        # While the thread is held, past the wait: everything else is erased, and the
        # error says the thread is held and when to call again.
        monkeypatch.setattr(maintenance, "HELD_WAIT", 1.0)
        with pytest.raises(ThreadStoreUnavailableError) as err:
            await store.erase_scope(scope)
        assert isinstance(err.value, UnavailableError)
        message = str(err.value)
        assert "1 thread(s)" in message
        assert "open transaction holds" in message
        assert "call erase_scope again" in message
        left = await _left(url, store, scope)
        assert left["threads"] == ["t2"]
        assert left["messages"] == ["t2"]

        # The eraser dies (kill -9): its transaction stays open on the server.
        holder.kill()
        await asyncio.wait_for(holder.wait(), timeout=30)
        monkeypatch.undo()
        assert maintenance.HELD_WAIT >= 120
        started = time.monotonic()
        assert await asyncio.wait_for(store.erase_scope(scope), timeout=600) == 1
        print(f"re-run after kill -9 finished in {time.monotonic() - started:.1f} s")
        assert await _left(url, store, scope) == {
            "threads": [],
            "messages": [],
            "runs": [],
            "queuedItems": [],
        }
    finally:
        if holder is not None and holder.returncode is None:
            holder.kill()
            await asyncio.wait_for(holder.wait(), timeout=30)
        await store.close()
