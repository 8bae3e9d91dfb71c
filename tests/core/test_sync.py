"""pai_storage.sync: the blocking API from plain threads and from inside a running loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import pai_storage
from pai_storage import ConversationConflictError, ThreadStore, sync
from pai_storage import builders as b
from pai_storage.errors import ConfigurationError, StorageError, ThreadStoreConfigurationError


class _ModelDown(Exception):
    pass


def _chat_loop(url: str) -> list[tuple[str, str, str]]:
    """The ten-line loop, blocking; returns the transcript and checks the failed reply."""
    with sync.connect(url) as stores:
        chat = stores.threads.conversation("tenant-42", "chat-1", flush_every=0)
        chat.add("user", "What is the capital of France?")
        with chat.reply() as answer:
            for chunk in ("The capital ", "is ", "Paris."):
                answer.write(chunk)

        def failing_reply() -> None:
            with chat.reply() as failing:
                failing.write("half")
                raise _ModelDown

        with pytest.raises(_ModelDown):
            failing_reply()
        runs = stores.threads.read_thread(
            b.read("tenant-42", "chat-1", runs={"type": "page", "page": {"limit": 10}})
        ).runs.items
        assert [run.status for run in runs] == ["completed", "failed"]
        return [(m.role, m.text, m.status) for m in chat.messages(last=20)]


EXPECTED = [
    ("user", "What is the capital of France?", "complete"),
    ("assistant", "The capital is Paris.", "complete"),
    ("assistant", "half", "error"),
]


def _in_thread(work: Callable[[], Any]) -> Any:
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    return results[0]


def test_the_chat_loop_blocking_in_a_plain_thread() -> None:
    assert _in_thread(lambda: _chat_loop("memory://")) == EXPECTED


def test_the_chat_loop_blocking_from_a_coroutine_inside_asyncio_run() -> None:
    async def handler() -> list[tuple[str, str, str]]:  # an async framework calling sync code
        loop = asyncio.get_running_loop()
        transcript = _chat_loop("memory://")
        assert asyncio.get_running_loop() is loop
        return transcript

    assert asyncio.run(handler()) == EXPECTED


def test_a_sqlite_file_keeps_what_the_blocking_api_wrote(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/chat.db"
    assert _chat_loop(url) == EXPECTED
    with sync.open_store(url) as store:  # a second portal, a fresh connection
        chat = store.conversation("tenant-42", "chat-1")
        assert [m.text for m in chat.messages()] == [text for _, text, _ in EXPECTED]
        assert chat.update(title="France").title == "France"


def test_threads_share_one_bundle() -> None:
    with sync.connect("memory://") as stores:

        def writer(name: str) -> None:
            chat = stores.threads.conversation("s", "shared")
            for i in range(10):
                chat.add("user", f"{name}-{i}")

        threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        texts = [m.text for m in stores.threads.conversation("s", "shared").messages(last=None)]
        assert len(texts) == 30
        for n in range(3):
            assert [t for t in texts if t.startswith(f"w{n}-")] == [f"w{n}-{i}" for i in range(10)]


def test_guard_hold_is_a_with_block_whose_watchdog_keeps_renewing() -> None:
    with sync.connect("memory://") as stores:
        ttl = timedelta(seconds=1.5)
        with stores.guard.hold("sandbox-1", owner="w1", lease_ttl=ttl) as lock:
            first_deadline = lock.expires_at
            time.sleep(2.5)  # blocking: only the portal's loop can renew meanwhile
            assert not lock.lost.is_set()
            assert lock.expires_at > first_deadline
            held = stores.guard.inspect("sandbox-1")
            assert held is not None
            assert held.owner == "w1"
        assert stores.guard.inspect("sandbox-1") is None


def test_errors_cross_the_portal_unchanged() -> None:
    with sync.connect("memory://") as stores:
        chat = stores.threads.conversation("s", "t")
        other = stores.threads.conversation("s", "t")
        with chat.reply(), pytest.raises(ConversationConflictError, match="one reply at a time"):
            other.reply().__enter__()


def test_typed_calls_async_iterators_and_close() -> None:
    store = sync.open_store("memory://")
    try:
        created = store.call(ThreadStore.commit_thread, b.create("s", "t", title="typed"))
        assert created.type == "committed"
        read = store.call(ThreadStore.read_thread, b.read("s", "t"))
        assert read.thread is not None
        assert read.thread.title == "typed"
        lines = list(store.export_threads("s"))
        assert len(lines) >= 2
        assert all(line.endswith("\n") for line in lines)
    finally:
        store.close()


def test_a_bundle_never_closed_does_not_keep_the_interpreter_from_exiting() -> None:
    script = (
        "from pai_storage import sync\n"
        "stores = sync.connect('memory://')\n"
        "print(stores.threads.conversation('s', 't').add('user', 'kept').text)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "kept"), done.stderr


# ------------------------------------------------------------ after close()

Call = Callable[[Any], Any]
"""One call on a bundle, written once for both APIs: :func:`_blocking_call` makes it
on a blocking view, :func:`_awaited_error` awaits (or drains) what it returns."""

AFTER_CLOSE: dict[str, Call] = {
    "kv.get": lambda stores: stores.kv.get(("a",), "k"),
    "threads.list_threads": lambda s: s.threads.list_threads({"scopeKey": "s", "limit": 1}),
    "threads.export_threads": lambda stores: stores.threads.export_threads("s"),
    "conversation.add": lambda s: s.threads.conversation("s", "t").add("user", "late"),
    "state.get": lambda stores: stores.state.get("u", "s", "k"),
    "snapshots.open": lambda stores: stores.snapshots.open("sc", "id"),
    "guard.inspect": lambda stores: stores.guard.inspect("r"),
    "enter again": lambda stores: stores.__aenter__(),
}


def _awaited_error(url: str, call: Call) -> StorageError:
    """What the async API raises for ``call`` on a bundle that was closed."""

    async def run(result: Any) -> None:
        if hasattr(result, "__anext__"):
            _ = [item async for item in result]
        else:
            await result

    async def main() -> StorageError:
        async with pai_storage.connect(url) as stores:
            pass
        with pytest.raises(StorageError) as raised:
            await run(call(stores))
        return raised.value

    return asyncio.run(main())


def _blocking_call(stores: Any, name: str) -> None:
    if name == "enter again":
        stores.__enter__()
        return
    result = AFTER_CLOSE[name](stores)
    if isinstance(result, Iterator):
        list(result)


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/closed.db"


@pytest.mark.parametrize("name", list(AFTER_CLOSE))
def test_a_closed_bundle_raises_what_the_async_api_raises(url: str, name: str) -> None:
    expected = _awaited_error(url, AFTER_CLOSE[name])
    assert str(expected) == "this store is closed; open a new one"
    stores = sync.connect(url)
    with stores:
        pass
    with pytest.raises(StorageError) as raised:
        _blocking_call(stores, name)
    assert (type(raised.value), str(raised.value)) == (type(expected), str(expected))
    stores.close()  # still idempotent


def test_views_and_iterators_taken_before_close_raise_after_it(url: str) -> None:
    stores = sync.connect(url)
    kv = stores.kv
    chat = stores.threads.conversation("s", "t")
    chat.add("user", "before")
    exported = stores.threads.export_threads("s")
    stores.close()
    with pytest.raises(
        ConfigurationError, match=r"^this store is closed; open a new one$"
    ) as kv_raised:
        kv.put(("a",), "k", {"v": 1})
    assert kv_raised.type is ConfigurationError
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        chat.messages()
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        list(exported)  # an iterator made before close() and first stepped after it


def test_a_closed_single_store_raises_the_thread_store_error(url: str) -> None:
    async def awaited() -> StorageError:
        store = pai_storage.open_store(url)
        await store.close()
        with pytest.raises(StorageError) as raised:
            await store.read_thread(b.read("s", "t"))
        return raised.value

    expected_error = asyncio.run(awaited())
    assert type(expected_error) is ThreadStoreConfigurationError
    with sync.open_store(url) as store:
        store.commit_thread(b.create("s", "t"))
    for late in (
        lambda: store.read_thread(b.read("s", "t")),
        lambda: store.call(ThreadStore.read_thread, b.read("s", "t")),
        lambda: list(store.export_threads("s")),
        store.__enter__,
    ):
        with pytest.raises(ThreadStoreConfigurationError) as raised:
            late()
        assert str(raised.value) == str(expected_error)


# ------------------------------------------------------------ snapshot readers

DATA = bytes(range(256)) * 10_000  # 2.4 MiB: three chunks on every backend


def test_a_snapshot_reader_is_iterated_with_for(url: str) -> None:
    with sync.connect(url) as stores:
        stores.snapshots.put("sc", "id", DATA)
        reader = stores.snapshots.open("sc", "id")
        assert reader.info.size == len(DATA)
        chunks = list(reader)
        assert len(chunks) > 1
        assert b"".join(chunks) == DATA
        with stores.snapshots.open("sc", "id") as opened:
            assert b"".join(chunk for chunk in opened) == DATA
        with stores.snapshots.open("sc", "id") as opened:
            assert opened.read() == DATA


def test_a_snapshot_reader_read_twice_raises_a_storage_error(url: str) -> None:
    async def awaited() -> StorageError:
        async with pai_storage.connect(url) as stores:
            await stores.snapshots.put("sc", "id", DATA)
            reader = await stores.snapshots.open("sc", "id")
            assert reader is not None
            assert await reader.read() == DATA
            with pytest.raises(StorageError) as raised:
                await reader.read()
            return raised.value

    expected = asyncio.run(awaited())
    assert type(expected) is ConfigurationError
    assert str(expected) == "a snapshot reader is read once; open the snapshot again"
    with sync.connect(url) as stores:
        stores.snapshots.put("sc", "id", DATA)
        with stores.snapshots.open("sc", "id") as reader:
            for _ in reader:
                break
            with pytest.raises(ConfigurationError) as raised:
                list(reader)
            assert (type(raised.value), str(raised.value)) == (type(expected), str(expected))
        closed = stores.snapshots.open("sc", "id")
        closed.aclose()
        with pytest.raises(ConfigurationError, match="the snapshot reader is closed"):
            list(closed)
