"""Watching threads beyond the conformance topic: the memory backend's in-process
signal, retries of an unavailable backend, the JSON form, and the ``pai-storage
watch`` command following a stream of commits from another process."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pai_storage_memory import MemoryThreadStore

import pai_storage
from pai_storage import ReadThreadInput, ThreadChange, ThreadReadResult, ThreadVersion
from pai_storage.cli import main
from pai_storage.errors import ThreadStoreUnavailableError
from pai_storage.watch import MAX_FAILURES

HANG_GUARD = 60.0  # seconds: reached only when a change is never reported
CHUNKS = 50


async def _version(store: pai_storage.ThreadStore, scope: str, thread_id: str) -> ThreadVersion:
    root = await store.conversation(scope, thread_id).get()
    assert root is not None
    return root.version


async def _next(changes: AsyncIterator[ThreadChange]) -> ThreadChange:
    return await anext(changes)


async def test_memory_watchers_are_woken_by_the_commit_not_the_interval() -> None:
    store = MemoryThreadStore()
    chat = store.conversation("s", "t")
    await chat.add("user", "one")
    start = await _version(store, "s", "t")
    # An hour between polls: only the in-process signal can report the commit.
    changes = store.watch("s", "t", after=start, interval=3600)
    watching = asyncio.create_task(_next(changes))
    await asyncio.sleep(0.01)
    await chat.add("user", "two")
    async with asyncio.timeout(HANG_GUARD):
        change = await watching
    assert change.commits == 1
    assert change.previous == start
    await changes.aclose()


async def test_a_memory_watcher_is_forgotten_when_it_ends() -> None:
    store = MemoryThreadStore()
    await store.conversation("s", "t").add("user", "one")
    changes = store.watch("s", "t", interval=3600)
    watching = asyncio.create_task(_next(changes))
    await asyncio.sleep(0.01)
    watching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watching
    await changes.aclose()
    signals = store._watchers  # the backend's own notifier
    assert signals.signal("s", "t") is not None
    waiting = len(signals._signals[("s", "t")])
    assert waiting == 1  # only the one just made; the ended watcher's is gone


class _Flaky(MemoryThreadStore):
    """A memory store whose reads fail ``failures`` times first (a dropped connection)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        if self.failures:
            self.failures -= 1
            raise ThreadStoreUnavailableError("connection lost")
        return await super()._read_thread(request)


async def test_a_watcher_rereads_the_head_after_the_backend_was_unavailable() -> None:
    store = _Flaky(0)
    await store.conversation("s", "t").add("user", "one")
    start = await _version(store, "s", "t")
    await store.conversation("s", "t").add("user", "two")
    store.failures = MAX_FAILURES - 1
    async with asyncio.timeout(HANG_GUARD):
        change = await _next(store.watch("s", "t", after=start, interval=0.001))
    assert change.previous == start
    assert change.commits == 1
    assert store.failures == 0


async def test_a_watcher_gives_up_when_the_backend_stays_unavailable() -> None:
    store = _Flaky(MAX_FAILURES)
    with pytest.raises(ThreadStoreUnavailableError, match="connection lost"):
        async with asyncio.timeout(HANG_GUARD):
            await _next(store.watch("s", "t", interval=0.001))


async def test_the_json_form_has_no_private_metadata() -> None:
    store = MemoryThreadStore()
    chat = store.conversation("s", "t")
    await chat.add("user", "one")
    start = await _version(store, "s", "t")
    await chat.update(metadata={"topic": "x"})
    root = await chat.get()
    assert root is not None
    await store.commit_thread(pai_storage.builders.update(root, privateMetadata={"secret": "k"}))
    change = await _next(store.watch("s", "t", after=start, interval=0.01))
    document = json.loads(json.dumps(change.to_json()))
    assert document["scopeKey"] == "s"
    assert document["threadId"] == "t"
    assert document["previous"] == start.to_json()
    assert document["version"]["revision"] == start.revision + 2
    assert document["commits"] == 2
    assert document["deleted"] is False
    assert document["committedAt"].endswith("Z")
    assert document["thread"]["metadata"] == {"topic": "x"}
    assert "privateMetadata" not in document["thread"]
    assert "secret" not in json.dumps(document)


def test_the_command_refuses_a_bad_after(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "memory://", "s", "t", "--after", "{not json"]) == 1
    assert "after must be a version" in capsys.readouterr().err
    assert main(["watch", "memory://", "s", "t", "--after", "5"]) == 1
    assert "after must be a ThreadVersion" in capsys.readouterr().err
    assert main(["watch", "memory://", "s", "t", "--interval", "0"]) == 1
    assert "interval" in capsys.readouterr().err


async def test_a_watcher_in_another_process_follows_a_streamed_reply_to_the_end(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/watch.db"
    store = pai_storage.open_store(url)
    async with store:
        chat = store.conversation("tenant", "chat", flush_every=0)
        await chat.add("user", "tell me a long story")
        start = await _version(store, "tenant", "chat")
        watcher = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "pai_storage", "watch", url, "tenant", "chat"),
            *("--interval", "0.005", "--after", json.dumps(start.to_json())),
            stdout=asyncio.subprocess.PIPE,
        )
        assert watcher.stdout is not None
        try:
            async with chat.reply() as answer:  # one commit per chunk (flush_every=0)
                for i in range(CHUNKS):
                    await answer.write(f"chunk {i} ")
            final = await _version(store, "tenant", "chat")
            seen: list[dict[str, Any]] = []
            async with asyncio.timeout(HANG_GUARD):
                while not seen or seen[-1]["version"] != final.to_json():
                    seen.append(json.loads(await watcher.stdout.readline()))
        finally:
            watcher.terminate()
            await watcher.wait()
    assert final.revision > start.revision + CHUNKS  # every chunk was its own commit
    revisions = [c["version"]["revision"] for c in seen]
    assert revisions == sorted(set(revisions))  # strictly increasing
    assert seen[0]["previous"] == start.to_json()
    for one, two in itertools.pairwise(seen):
        assert two["previous"] == one["version"]  # every commit is in some change
    assert sum(c["commits"] for c in seen) == final.revision - start.revision
    assert not any(c["deleted"] for c in seen)
