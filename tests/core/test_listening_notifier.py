"""ListeningNotifier: ready() starts one listener task and waits briefly for it."""

from __future__ import annotations

import asyncio
import time

from pai_storage.watch import ListeningNotifier


class _Listener(ListeningNotifier):
    ready_wait = 0.05

    def __init__(self, *, hears: bool) -> None:
        super().__init__()
        self.hears = hears
        self.starts = 0

    async def _listen(self, stop: asyncio.Event, listening: asyncio.Event) -> None:
        self.starts += 1
        if self.hears:
            listening.set()
        await stop.wait()

    def idle(self) -> None:
        self._stop.set()


async def test_one_listener_for_every_watcher_and_named() -> None:
    notifier = _Listener(hears=True)
    await notifier.ready()
    await notifier.ready()
    assert notifier.starts == 1
    assert notifier._task is not None
    assert notifier._task.get_name() == "pai-storage listener"
    notifier.idle()
    await asyncio.wait({notifier._task})


async def test_a_listener_told_to_stop_is_replaced_by_a_new_one() -> None:
    notifier = _Listener(hears=True)
    await notifier.ready()
    first = notifier._task
    notifier.idle()
    await notifier.ready()
    assert notifier.starts == 2
    assert notifier._task is not first
    assert first is not None
    await asyncio.wait({first})  # its own stop event was set: it ended
    notifier.idle()


async def test_a_listener_that_never_listens_holds_the_watcher_only_ready_wait() -> None:
    notifier = _Listener(hears=False)
    began = time.monotonic()
    await notifier.ready()
    assert time.monotonic() - began < 1.0
    notifier.idle()


async def test_a_listener_that_will_not_listen_does_not_hold_the_watcher() -> None:
    class _Declines(ListeningNotifier):
        ready_wait = 3600.0  # were ready() to wait for `listening`, the test would hang

        async def _listen(self, stop: asyncio.Event, listening: asyncio.Event) -> None:
            return  # it will not listen (a pool's only connection): the watchers poll

        def idle(self) -> None:
            self._stop.set()

    notifier = _Declines()
    async with asyncio.timeout(30):
        await notifier.ready()
        await notifier.ready()  # started again, ended again
    assert notifier._task is not None
    assert notifier._task.done()
