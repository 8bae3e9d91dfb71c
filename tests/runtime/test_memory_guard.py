"""The execution guard on the memory backend: the conformance topic, plus the core's loops.

The topic runs by subclassing, as a third party would. The extra tests drive
the parts of the core no healthy backend can show: an unreachable server
during renewal, a cancelled waiter, the retry cadence, option checks.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_conformance.suite.guard import ExecutionGuardTests
from pai_storage_memory.guard import MemoryExecutionGuard

from pai_storage import ManualClock
from pai_storage.errors import ConfigurationError, LockTimeoutError, UnavailableError
from pai_storage.guard import ExecutionGuard, Lock, LockInfo

SHORT = timedelta(milliseconds=300)


class TestMemoryExecutionGuard(ExecutionGuardTests):
    @pytest_asyncio.fixture
    async def guard(self, clock: ManualClock) -> AsyncIterator[ExecutionGuard]:
        async with MemoryExecutionGuard(clock=clock) as guard:
            yield guard


class _FlakyGuard(MemoryExecutionGuard):
    """A memory guard whose server can be made unreachable or slow, and counted."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.renew_failure: BaseException | None = None
        self.renew_failures_left = 0  # with renew_failure: fail only this many renewals
        self.renew_delay = 0.0
        self.acquire_delay = 0.0
        self.attempt_times: list[float] = []
        self.acquired: list[LockInfo | None] = []  # what each finished attempt obtained
        self.renew_calls = 0

    async def _acquire(
        self, resource: str, owner: str, token: str, lease_ttl: timedelta
    ) -> LockInfo | None:
        self.attempt_times.append(asyncio.get_running_loop().time())
        if self.acquire_delay:
            await asyncio.sleep(self.acquire_delay)
        info = await super()._acquire(resource, owner, token, lease_ttl)
        self.acquired.append(info)
        return info

    async def _renew(self, resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
        self.renew_calls += 1
        failure = self.renew_failure
        if failure is not None:
            if self.renew_failures_left:
                self.renew_failures_left -= 1
                if not self.renew_failures_left:
                    self.renew_failure = None
            raise failure
        if self.renew_delay:
            await asyncio.sleep(self.renew_delay)
        return await super()._renew(resource, token, lease_ttl)


@pytest_asyncio.fixture
async def flaky() -> AsyncIterator[_FlakyGuard]:
    async with _FlakyGuard() as guard:  # the process clock: real leases
        yield guard


async def test_unreachable_server_loses_the_lock_when_the_lease_ends(flaky: _FlakyGuard) -> None:
    reported: list[Lock] = []
    lock = await flaky.try_acquire("r", owner="w1", lease_ttl=SHORT, on_lost=reported.append)
    assert lock is not None
    flaky.renew_failure = UnavailableError("server unreachable")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(lock.lost.wait(), 2)
    elapsed = loop.time() - started
    # Not before the lease could have ended, and retried meanwhile (the upper
    # bound leaves room for a busy machine; the lease is 0.3 s, the wait 2 s).
    assert SHORT.total_seconds() * 0.9 <= elapsed < 1.5
    assert flaky.renew_calls >= 2
    assert reported == [lock]
    assert await lock.release() is False


async def test_failed_renewals_are_retried_and_recover() -> None:
    # Renewed every 500 ms, a failure retried after 50 ms: three failures in a row
    # and the fourth attempt (at about 650 ms) may still come some 800 ms late on a
    # busy machine before the lease runs out. Renewing only every 500 ms would lose it.
    lease = timedelta(milliseconds=1500)
    async with _FlakyGuard(retry_interval=timedelta(milliseconds=50)) as flaky:
        loop = asyncio.get_running_loop()
        started = loop.time()
        lock = await flaky.try_acquire("r", owner="w1", lease_ttl=lease)
        assert lock is not None
        first_expiry = lock.expires_at
        flaky.renew_failure = UnavailableError("blip")
        flaky.renew_failures_left = 3  # then the server answers again
        deadline = started + 10 * lease.total_seconds()
        while lock.expires_at == first_expiry and not lock.lost.is_set():
            assert loop.time() < deadline, "never renewed"
            await asyncio.sleep(0.01)
        assert flaky.renew_calls >= 4
        assert lock.expires_at > first_expiry  # a retry renewed it
        # Past the first lease: still held.
        await asyncio.sleep(max(started + lease.total_seconds() - loop.time(), 0) + 0.05)
        assert not lock.lost.is_set()
        info = await flaky.inspect("r")
        assert info is not None
        assert info.fencing_token == lock.fencing_token
        assert info.expires_at > first_expiry
        assert await lock.release() is True


async def test_a_renewal_that_hangs_past_the_lease_loses_the_lock(flaky: _FlakyGuard) -> None:
    lock = await flaky.try_acquire("r", owner="w1", lease_ttl=SHORT)
    assert lock is not None
    flaky.renew_delay = 10.0
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(lock.lost.wait(), 9)
    assert loop.time() - started < 5  # gave up when the lease ended, not after 10 s


async def test_the_event_loop_keeps_running_while_renewing(flaky: _FlakyGuard) -> None:
    # Renewals every 100 ms; a loaded machine only stretches the loop (more renewals).
    lock = await flaky.try_acquire("r", owner="w1", lease_ttl=SHORT)
    assert lock is not None
    ticks = 0
    while flaky.renew_calls < 3 and ticks < 500:
        await asyncio.sleep(0.01)
        ticks += 1
    assert flaky.renew_calls >= 3
    assert ticks >= 3  # the loop ran between renewals
    assert await lock.release() is True


async def _wait_in_vain(flaky: _FlakyGuard) -> tuple[float, list[float]]:
    """Wait 0.5 s for a held resource, retrying every 50 ms; (start, attempt times)."""
    holder = await flaky.try_acquire("r", owner="w1")
    assert holder is not None
    flaky.attempt_times.clear()
    started = asyncio.get_running_loop().time()
    with pytest.raises(LockTimeoutError, match=r"lock_timeout 0\.5 s"):
        await flaky.acquire(
            "r",
            owner="w2",
            lock_timeout=timedelta(milliseconds=500),
            retry_interval=timedelta(milliseconds=50),
        )
    await holder.release()
    return started, list(flaky.attempt_times)


def _gaps(times: list[float]) -> list[float]:
    """Sorted pauses between attempts, but the last one (cut short by the deadline)."""
    return sorted(b - a for a, b in itertools.pairwise(times[:-1]))


async def test_waiting_retries_at_the_retry_interval(flaky: _FlakyGuard) -> None:
    started, times = await _wait_in_vain(flaky)
    gaps = _gaps(times)
    # The first attempt at once: before the shortest pause (40 ms), with room for a
    # late wake-up on a busy machine.
    assert times[0] - started < 0.03
    assert times[-1] - started >= 0.5  # the last one at the deadline
    assert gaps[0] >= 0.035  # never sooner than 50 ms - 20%
    assert gaps[len(gaps) // 2] <= 0.08  # the median near 50 ms, robust to late wake-ups


async def test_waiting_pauses_are_jittered_by_20_percent(
    flaky: _FlakyGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    bounds: list[tuple[float, float]] = []

    def longest(low: float, high: float) -> float:
        bounds.append((low, high))
        return high

    monkeypatch.setattr("pai_storage.guard.random.uniform", longest)
    _, times = await _wait_in_vain(flaky)
    assert bounds
    assert set(bounds) == {(0.8, 1.2)}
    assert _gaps(times)[0] >= 0.059  # every pause scaled by the drawn factor


async def test_a_cancelled_waiter_leaves_no_lock_behind(flaky: _FlakyGuard) -> None:
    flaky.acquire_delay = 0.05
    waiter = asyncio.ensure_future(flaky.acquire("r", owner="w1"))
    await asyncio.sleep(0.01)  # the acquisition request is in flight
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # The request completes (50 ms) with a lock, released at once, not at the end of
    # its 30 minute lease: waited for, so a late wake-up is no failure.
    for _ in range(500):
        if flaky.acquired and await flaky.inspect("r") is None:
            break
        await asyncio.sleep(0.01)
    assert len(flaky.acquired) == 1
    assert flaky.acquired[0] is not None
    assert await flaky.inspect("r") is None
    assert not flaky._held


async def test_close_releases_on_the_server(clock: ManualClock) -> None:
    guard = MemoryExecutionGuard(clock=clock)
    for name in ("a", "b"):
        assert await guard.try_acquire(name, owner="w1") is not None
    assert len(guard._locks) == 2
    await guard.close()
    assert guard._locks == {}


async def test_release_is_not_blocked_by_an_on_lost_that_releases(clock: ManualClock) -> None:
    async with MemoryExecutionGuard(clock=clock) as guard:
        outcomes: list[bool] = []

        async def on_lost(lock: Lock) -> None:
            outcomes.append(await lock.release())

        lock = await guard.try_acquire("r", owner="w1", lease_ttl=SHORT, on_lost=on_lost)
        assert lock is not None
        clock.advance(SHORT)
        await asyncio.wait_for(lock.lost.wait(), 5)
        for _ in range(500):  # the hook runs right after; a release that hung never ends
            if outcomes:
                break
            await asyncio.sleep(0.01)
        assert outcomes == [False]


async def test_hold_reports_the_body_error_when_release_fails(clock: ManualClock) -> None:
    class BrokenRelease(MemoryExecutionGuard):
        async def _release(self, resource: str, token: str) -> bool:
            raise UnavailableError("server unreachable")

    async with BrokenRelease(clock=clock) as guard:
        with pytest.raises(KeyError):
            async with guard.hold("r", owner="w1"):
                raise KeyError("the body's own error")
        with pytest.raises(UnavailableError, match="unreachable"):
            async with guard.hold("r2", owner="w1"):
                pass


@pytest.mark.parametrize("option", ["lock_timeout", "lease_ttl", "retry_interval"])
@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-5), 30, None], ids=repr)
def test_bad_duration_options_are_configuration_errors(option: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=f"option {option}"):
        MemoryExecutionGuard(**{option: bad})


async def test_guard_options_are_the_defaults_of_each_call(clock: ManualClock) -> None:
    async with MemoryExecutionGuard(
        clock=clock, lease_ttl=timedelta(seconds=7), lock_timeout=timedelta(milliseconds=30)
    ) as guard:
        assert (guard.lock_timeout, guard.retry_interval) == (
            timedelta(milliseconds=30),
            timedelta(milliseconds=500),
        )
        lock = await guard.acquire("r", owner="w1")
        assert lock.expires_at == clock() + timedelta(seconds=7)
        with pytest.raises(LockTimeoutError, match=r"lock_timeout 0\.03 s"):
            await guard.acquire("r", owner="w2")


def test_defaults_are_thirty_minutes_and_half_a_second() -> None:
    guard = MemoryExecutionGuard()
    assert guard.lock_timeout == timedelta(minutes=30)
    assert guard.lease_ttl == timedelta(minutes=30)
    assert guard.retry_interval == timedelta(milliseconds=500)


async def test_closing_the_guard_stops_its_waiters(clock: ManualClock) -> None:
    guard = MemoryExecutionGuard(clock=clock, retry_interval=timedelta(milliseconds=10))
    holder = await guard.try_acquire("r", owner="w1")
    assert holder is not None
    waiter = asyncio.ensure_future(guard.acquire("r", owner="w2"))
    await asyncio.sleep(0.05)
    await guard.close()
    with pytest.raises(ConfigurationError, match="closed"):
        await asyncio.wait_for(waiter, 5)
    assert guard._locks == {}


async def test_a_lock_granted_while_closing_is_given_back(clock: ManualClock) -> None:
    class SlowAcquire(MemoryExecutionGuard):
        async def _acquire(
            self, resource: str, owner: str, token: str, lease_ttl: timedelta
        ) -> LockInfo | None:
            await asyncio.sleep(0.05)
            return await super()._acquire(resource, owner, token, lease_ttl)

    guard = SlowAcquire(clock=clock)
    await guard.initialize()
    attempt = asyncio.ensure_future(guard.try_acquire("r", owner="w1"))
    await asyncio.sleep(0.01)
    await guard.close()
    with pytest.raises(ConfigurationError, match="closed"):
        await attempt
    assert guard._locks == {}


async def test_grants_that_always_come_after_their_lease_time_out_saying_why(
    flaky: _FlakyGuard,
) -> None:
    # Every answer takes longer than the 20 ms lease: no attempt may be returned as
    # held, and the wait ends at lock_timeout with the reason, nothing left behind.
    flaky.acquire_delay = 0.05
    lease = timedelta(milliseconds=20)
    assert await flaky.try_acquire("r", owner="w1", lease_ttl=lease) is None
    with pytest.raises(LockTimeoutError) as caught:
        await flaky.acquire(
            "r",
            owner="w1",
            lease_ttl=lease,
            lock_timeout=timedelta(milliseconds=200),
            retry_interval=timedelta(milliseconds=10),
        )
    message = str(caught.value)
    assert "'r'" in message
    assert "lease_ttl 0.02 s" in message
    assert "round trip" in message
    assert sum(info is not None for info in flaky.acquired) >= 2  # the server granted them
    assert await flaky.inspect("r") is None  # and each was given back
    assert not flaky._held
