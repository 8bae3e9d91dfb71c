"""ThreadStore lifecycle: lazy initialize, close while initializing, common options."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    Page,
    ReadThreadInput,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
)
from pai_storage.errors import ThreadStoreConfigurationError


class _SlowStore(ThreadStore):
    """A store whose initialize opens a 'connection' and then waits to be let through."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.open_resources = 0
        self.closes = 0

    async def _initialize(self) -> None:
        self.open_resources += 1
        self.started.set()
        try:
            await self.gate.wait()
        except BaseException:
            self.open_resources -= 1  # a backend releases what it made when cancelled
            raise

    async def _close(self) -> None:
        self.closes += 1
        self.open_resources = 0

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        return ThreadReadResult(observed_at=datetime(2026, 1, 1, tzinfo=UTC), thread=None)

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        raise AssertionError("not used")

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        raise AssertionError("not used")


READ = {"scopeKey": "s", "threadId": "t"}


async def test_close_during_lazy_initialize_releases_everything() -> None:
    store = _SlowStore()
    first = asyncio.create_task(store.read_thread(READ))
    second = asyncio.create_task(store.read_thread(READ))
    await store.started.wait()
    first.cancel()  # the caller that started the attempt goes away
    with pytest.raises(asyncio.CancelledError):
        await first
    await store.close()
    assert store.open_resources == 0
    # The operation that was waiting on the attempt gets a typed error, not a result.
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await second
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await store.read_thread(READ)


async def test_close_after_initialize_finished_its_work_still_closes() -> None:
    store = _SlowStore()
    store.gate.set()
    await store.initialize()
    assert store.open_resources == 1
    await store.close()
    await store.close()  # idempotent
    assert store.open_resources == 0
    assert store.closes == 1


async def test_cancelled_caller_does_not_cancel_the_shared_attempt() -> None:
    store = _SlowStore()
    first = asyncio.create_task(store.read_thread(READ))
    second = asyncio.create_task(store.read_thread(READ))
    await store.started.wait()
    first.cancel()
    store.gate.set()
    result = await second
    assert result.thread is None
    assert store.open_resources == 1
    await store.close()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"clock": 5}, "clock"),
        ({"on_warning": "log"}, "on_warning"),
        ({"token_secret": "secret"}, "token_secret"),
    ],
)
def test_bad_common_options_fail_when_the_store_is_made(
    options: dict[str, Any], words: str
) -> None:
    with pytest.raises(ThreadStoreConfigurationError, match=words):
        _SlowStore(**options)


async def test_a_clock_returning_a_naive_datetime_is_a_configuration_error() -> None:
    store = _SlowStore(clock=lambda: datetime(2026, 1, 1))
    with pytest.raises(ThreadStoreConfigurationError, match="clock"):
        store.now()


class _FailingStore(_SlowStore):
    attempts = 0

    async def _initialize(self) -> None:
        type(self).attempts += 1
        await self.gate.wait()
        raise RuntimeError("boom")


async def test_a_failed_attempt_is_forgotten_even_when_its_caller_was_cancelled() -> None:
    store = _FailingStore()
    first = asyncio.create_task(store.initialize())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    store.gate.set()
    for _ in range(5):  # let the shared attempt fail with nobody waiting
        await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="boom"):
        await store.initialize()
    assert _FailingStore.attempts == 2  # the second call retried from scratch
    await store.close()


async def test_a_second_close_returns_only_once_everything_is_released() -> None:
    store = _SlowStore()
    release = asyncio.Event()
    closed: list[str] = []

    async def slow_close() -> None:
        await release.wait()
        closed.append("released")

    store._close = slow_close  # type: ignore[method-assign]
    first = asyncio.create_task(store.close())
    await asyncio.sleep(0)
    second = asyncio.create_task(store.close())
    await asyncio.sleep(0)
    assert not second.done()  # it waits for the release the first close started
    release.set()
    await asyncio.gather(first, second)
    assert closed == ["released"]
