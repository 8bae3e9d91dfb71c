"""The execution guard: exclusion, leases, expiry, the watchdog, lost locks and fencing.

Consumed by subclassing :class:`ExecutionGuardTests` and providing one
fixture, ``guard``: an :class:`~pai_storage.guard.ExecutionGuard` made with
the suite's ``clock`` (a :class:`~pai_storage.ManualClock`). Expiry is driven
with that clock; the watchdog runs on the event loop's real time, so the
tests that need it use leases of 0.3 to 1.5 s. Every test works
on resources of its own, so a guard over a shared database is fine.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from pai_storage import ManualClock
from pai_storage.errors import (
    ConfigurationError,
    InvalidInputError,
    LockTimeoutError,
    StorageError,
)
from pai_storage.guard import ExecutionGuard, Lock, LockInfo

from ._support import BAD_DURATIONS, BAD_NAMES, HOSTILE_NAMES, run_model

__all__ = ["ExecutionGuardTests"]

pytestmark = pytest.mark.asyncio

T = TypeVar("T")

WATCHDOG_TASK_PREFIX = "pai-storage-guard-watchdog"
"""The name prefix of the core's watchdog tasks (one per held lock)."""
RACERS = 16
SHORT_LEASE = timedelta(milliseconds=300)
"""A lease the watchdog must renew several times within a test (every 100 ms)."""
WAIT = 5.0
"""Seconds to wait for something the watchdog does within a lease or two.

Only a bound on failure: a test that passes never waits this long, so it is
generous enough for a database round trip stalled by a busy machine, yet far
below the 30 s ``retry_interval`` the timeout tests must not sit out.
"""


EXPRESSION_NAMES = (
    "$",
    "$$",
    "$$ROOT",
    "$$CURRENT",
    "$$NOW",
    "$$REMOVE",
    "$.a",
    "$a.b",
    "$worker",
    "$token",
    "$owner",
    "$_id",
    "$expiresAt",
    "$fencingToken",
    "$literal",
    "$$ROOT.token",
    "{$literal: 1}",
)
"""Valid names a database could take for field paths, variables or operators.

MongoDB reads a string starting with ``$`` in an aggregation expression as a
field path (``$$`` as a variable); a guard must store each exactly as given.
"""


class _LateGrants:
    """Holds back the answer of acquisitions by :attr:`OWNER` after the server granted them.

    With ``delay`` the answer comes that many seconds late; without it, it waits
    for :meth:`past_the_lease`. Only the first acquisition is held back; later
    ones set :attr:`retried`.
    """

    OWNER = "late"

    def __init__(
        self, guard: ExecutionGuard, monkeypatch: pytest.MonkeyPatch, delay: float | None = None
    ) -> None:
        self.granted = asyncio.Event()
        self.retried = asyncio.Event()
        self.answer = asyncio.Event()
        self.sent: list[float] = []
        acquire = guard._acquire

        async def late_answer(
            resource: str, owner: str, token: str, lease_ttl: timedelta
        ) -> LockInfo | None:
            if owner != self.OWNER:
                return await acquire(resource, owner, token, lease_ttl)
            if self.sent:
                self.retried.set()
                return await acquire(resource, owner, token, lease_ttl)
            self.sent.append(asyncio.get_running_loop().time())  # after the guard's own "sent"
            info = await acquire(resource, owner, token, lease_ttl)
            self.granted.set()
            if delay is None:
                await self.answer.wait()
            else:
                await asyncio.sleep(
                    max(self.sent[0] + delay - asyncio.get_running_loop().time(), 0)
                )
            return info

        monkeypatch.setattr(guard, "_acquire", late_answer)

    async def past_the_lease(self, lease: timedelta) -> None:
        """Answer once the first request's lease has surely ended as seen from here."""
        await asyncio.wait_for(self.granted.wait(), WAIT)
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(self.sent[0] + lease.total_seconds() - loop.time(), 0) + 0.01)
        self.answer.set()


_REAL_TIME_ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)
"""Tests on names shared between runs move their clock by the real time since this."""


def _resource(tag: str) -> str:
    return f"guard-{tag}-{uuid.uuid4().hex}"


def _watchdogs() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t.get_name().startswith(WATCHDOG_TASK_PREFIX)}


async def _held(guard: ExecutionGuard, resource: str, *, owner: str = "w1") -> Lock:
    lock = await guard.try_acquire(resource, owner=owner)
    assert lock is not None, f"{resource!r} should have been free"
    return lock


async def _step_clock(clock: ManualClock, seconds: float, step: float = 0.05) -> None:
    """Let real time pass and move the manual clock along with it (never ahead)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (remaining := end - loop.time()) > 0:
        started = loop.time()
        await asyncio.sleep(min(step, remaining))
        clock.advance(ms=int((loop.time() - started) * 1000 * 0.9))


class ExecutionGuardTests:
    """One holder per resource; leases on the server clock; watchdog; fencing."""

    # On the class, so subclasses in other modules run under pytest-asyncio's strict mode too.
    pytestmark = [pytest.mark.asyncio]

    # ------------------------------------------------------------ round trips

    async def test_try_acquire_returns_a_held_lock(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("trip")
        lease = timedelta(seconds=45)
        lock = await guard.try_acquire(resource, owner="worker-7", lease_ttl=lease)
        assert isinstance(lock, Lock)
        try:
            assert (lock.resource, lock.owner, lock.lease_ttl) == (resource, "worker-7", lease)
            assert len(lock.token) == 32
            assert int(lock.token, 16) >= 0
            assert type(lock.fencing_token) is int
            assert lock.fencing_token > 0
            assert lock.acquired_at == clock()
            assert lock.expires_at == clock() + lease
            assert not lock.lost.is_set()
            info = await guard.inspect(resource)
            assert info == LockInfo(
                resource=resource,
                owner="worker-7",
                fencing_token=lock.fencing_token,
                acquired_at=clock(),
                expires_at=clock() + lease,
            )
        finally:
            assert await lock.release() is True

    async def test_inspect_never_shows_the_token(self, guard: ExecutionGuard) -> None:
        lock = await _held(guard, _resource("secret"))
        info = await guard.inspect(lock.resource)
        assert info is not None
        assert "token" not in type(info).model_fields
        for shown in (repr(info), str(info), info.model_dump_json(), repr(lock), str(lock)):
            assert lock.token not in shown
        await lock.release()

    async def test_inspect_a_free_resource(self, guard: ExecutionGuard) -> None:
        assert await guard.inspect(_resource("free")) is None

    async def test_defaults_come_from_the_guard(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        lock = await _held(guard, _resource("defaults"))
        assert lock.lease_ttl == guard.lease_ttl
        assert lock.expires_at == clock() + guard.lease_ttl
        await lock.release()

    async def test_release_frees_the_resource_once(self, guard: ExecutionGuard) -> None:
        resource = _resource("release")
        lock = await _held(guard, resource)
        assert await lock.release() is True
        assert await guard.inspect(resource) is None
        assert await lock.release() is False
        assert not lock.lost.is_set()
        again = await _held(guard, resource, owner="w2")
        assert again.fencing_token > lock.fencing_token
        assert await lock.release() is False  # never releases its successor
        assert (await guard.inspect(resource)) is not None
        await again.release()

    async def test_every_acquisition_gets_a_fresh_token(self, guard: ExecutionGuard) -> None:
        resource = _resource("fresh")
        tokens, fences = set(), []
        for _ in range(3):
            lock = await _held(guard, resource)
            tokens.add(lock.token)
            fences.append(lock.fencing_token)
            await lock.release()
        assert len(tokens) == 3
        assert fences == sorted(set(fences))

    async def test_locks_are_not_reentrant(self, guard: ExecutionGuard) -> None:
        resource = _resource("reentrant")
        lock = await _held(guard, resource, owner="same")
        assert await guard.try_acquire(resource, owner="same") is None
        await lock.release()

    async def test_hold_releases_on_exit(self, guard: ExecutionGuard) -> None:
        resource = _resource("hold")
        async with guard.hold(resource, owner="w1") as lock:
            info = await guard.inspect(resource)
            assert info is not None
            assert info.fencing_token == lock.fencing_token
        assert await guard.inspect(resource) is None
        assert not lock.lost.is_set()

    async def test_hold_releases_when_the_block_fails(self, guard: ExecutionGuard) -> None:
        resource = _resource("hold-error")
        with pytest.raises(RuntimeError, match="boom"):
            async with guard.hold(resource, owner="w1"):
                raise RuntimeError("boom")
        assert await guard.inspect(resource) is None

    # ------------------------------------------------------------ racing workers

    async def test_exactly_one_concurrent_try_acquire_wins(self, guard: ExecutionGuard) -> None:
        resource = _resource("race")
        results = await asyncio.gather(
            *(guard.try_acquire(resource, owner=f"w{i}") for i in range(RACERS))
        )
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        info = await guard.inspect(resource)
        assert info is not None
        assert (info.owner, info.fencing_token) == (winners[0].owner, winners[0].fencing_token)
        await winners[0].release()

    async def test_waiting_workers_take_turns(self, guard: ExecutionGuard) -> None:
        resource = _resource("turns")
        inside: list[str] = []
        order: list[int] = []

        async def worker(name: str) -> None:
            async with guard.hold(
                resource,
                owner=name,
                lock_timeout=timedelta(seconds=10),
                retry_interval=timedelta(milliseconds=10),
            ) as lock:
                inside.append(name)
                assert len(inside) == 1, f"two holders at once: {inside}"
                order.append(lock.fencing_token)
                await asyncio.sleep(0.02)
                inside.remove(name)

        await asyncio.gather(*(worker(f"w{i}") for i in range(5)))
        assert len(order) == 5
        assert order == sorted(set(order))

    # ------------------------------------------------------------ expiry (manual clock)

    async def test_lock_is_free_the_instant_its_lease_ends(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("expiry")
        first = await guard.try_acquire(resource, owner="w1", lease_ttl=timedelta(seconds=10))
        assert first is not None
        clock.advance(ms=9_999)
        assert await guard.try_acquire(resource, owner="w2") is None
        assert await guard.inspect(resource) is not None
        clock.advance(ms=1)
        assert await guard.inspect(resource) is None
        second = await _held(guard, resource, owner="w2")
        assert second.fencing_token > first.fencing_token
        info = await guard.inspect(resource)
        assert info is not None
        assert info.owner == "w2"
        await second.release()
        await first.release()

    async def test_expired_holder_cannot_release_its_successor(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("stale-release")
        stale = await guard.try_acquire(resource, owner="w1", lease_ttl=timedelta(seconds=5))
        assert stale is not None
        clock.advance(timedelta(seconds=5))
        successor = await _held(guard, resource, owner="w2")
        assert successor.fencing_token > stale.fencing_token
        assert await stale.release() is False
        info = await guard.inspect(resource)
        assert info is not None
        assert info.fencing_token == successor.fencing_token
        assert await successor.release() is True

    async def test_expired_holder_cannot_renew(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("stale-renew")
        lost: list[Lock] = []
        stale = await guard.try_acquire(
            resource, owner="w1", lease_ttl=timedelta(seconds=5), on_lost=lost.append
        )
        assert stale is not None
        clock.advance(timedelta(seconds=5))
        assert await stale.renew() is False
        assert stale.lost.is_set()
        assert lost == [stale]
        assert await guard.inspect(resource) is None  # renewing did not revive it
        successor = await _held(guard, resource, owner="w2")
        assert await stale.renew() is False
        info = await guard.inspect(resource)
        assert info is not None
        assert info.expires_at == successor.expires_at
        assert lost == [stale]  # reported once
        await successor.release()

    async def test_renew_extends_the_lease(self, guard: ExecutionGuard, clock: ManualClock) -> None:
        resource = _resource("renew")
        lock = await guard.try_acquire(resource, owner="w1", lease_ttl=timedelta(seconds=10))
        assert lock is not None
        clock.advance(timedelta(seconds=6))
        assert await lock.renew() is True
        assert lock.expires_at == clock() + timedelta(seconds=10)
        clock.advance(timedelta(seconds=9))
        info = await guard.inspect(resource)
        assert info is not None
        assert (info.expires_at, info.acquired_at) == (lock.expires_at, lock.acquired_at)
        assert info.fencing_token == lock.fencing_token
        assert await lock.release() is True

    async def test_acquire_waits_until_the_lease_ends(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("wait")
        first = await guard.try_acquire(resource, owner="w1", lease_ttl=timedelta(seconds=5))
        assert first is not None
        waiter = asyncio.ensure_future(
            guard.acquire(
                resource,
                owner="w2",
                lock_timeout=timedelta(seconds=10),
                retry_interval=timedelta(milliseconds=20),
            )
        )
        await asyncio.sleep(0.1)
        assert not waiter.done()
        clock.advance(timedelta(seconds=5))
        second = await asyncio.wait_for(waiter, WAIT)
        assert second.owner == "w2"
        assert second.fencing_token > first.fencing_token
        await second.release()

    async def test_acquire_waits_until_release(self, guard: ExecutionGuard) -> None:
        resource = _resource("wait-release")
        first = await _held(guard, resource)
        waiter = asyncio.ensure_future(
            guard.acquire(
                resource,
                owner="w2",
                lock_timeout=timedelta(seconds=10),
                retry_interval=timedelta(milliseconds=20),
            )
        )
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await first.release()
        second = await asyncio.wait_for(waiter, WAIT)
        assert second.fencing_token > first.fencing_token
        await second.release()

    async def test_fencing_tokens_increase_across_expiry_and_purge(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        one, two = _resource("fence-1"), _resource("fence-2")
        fences = []
        lock = await guard.try_acquire(one, owner="w1", lease_ttl=timedelta(seconds=1))
        assert lock is not None
        fences.append(lock.fencing_token)
        clock.advance(timedelta(seconds=1))
        assert await guard.purge_expired() >= 1
        for resource in (one, two, one):
            lock = await _held(guard, resource)
            fences.append(lock.fencing_token)
            await lock.release()
        assert fences == sorted(set(fences)), fences

    async def test_purge_expired_keeps_live_locks(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        short, long = _resource("purge-short"), _resource("purge-long")
        expiring = await guard.try_acquire(short, owner="w1", lease_ttl=timedelta(seconds=1))
        live = await guard.try_acquire(long, owner="w2", lease_ttl=timedelta(hours=1))
        assert expiring is not None
        assert live is not None
        assert await guard.inspect(short) is not None
        clock.advance(timedelta(seconds=1))
        purged = await guard.purge_expired()
        assert type(purged) is int
        assert purged >= 1
        assert await guard.inspect(short) is None
        info = await guard.inspect(long)
        assert info is not None
        assert info.fencing_token == live.fencing_token
        assert await expiring.release() is False
        assert await live.release() is True

    # ------------------------------------------------------------ waiting and timeouts

    async def test_lock_timeout_error_names_resource_and_timeout(
        self, guard: ExecutionGuard
    ) -> None:
        resource = _resource("timeout")
        holder = await _held(guard, resource)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(LockTimeoutError) as caught:
            await guard.acquire(
                resource,
                owner="w2",
                lock_timeout=timedelta(milliseconds=200),
                retry_interval=timedelta(milliseconds=20),
            )
        elapsed = loop.time() - started
        assert isinstance(caught.value, StorageError)
        assert resource in str(caught.value)
        assert "0.2 s" in str(caught.value)
        assert "lock_timeout" in str(caught.value)
        assert 0.2 <= elapsed < WAIT
        info = await guard.inspect(resource)
        assert info is not None
        assert info.fencing_token == holder.fencing_token
        await holder.release()

    async def test_hold_times_out_without_entering(self, guard: ExecutionGuard) -> None:
        resource = _resource("hold-timeout")
        holder = await _held(guard, resource)
        entered = False
        with pytest.raises(LockTimeoutError, match="lock_timeout"):
            async with guard.hold(
                resource,
                owner="w2",
                lock_timeout=timedelta(milliseconds=50),
                retry_interval=timedelta(milliseconds=10),
            ):
                entered = True
        assert not entered
        assert await holder.release() is True

    # ------------------------------------------------------------ watchdog and lost locks

    async def test_watchdog_keeps_a_short_lease_alive(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("watchdog")
        # Renewed every 500 ms: a renewal may stall for a second (a busy machine, a
        # database's write lock) before the lease runs out.
        lease = 5 * SHORT_LEASE
        lock = await guard.try_acquire(resource, owner="w1", lease_ttl=lease)
        assert lock is not None
        first_expiry = lock.expires_at
        await _step_clock(clock, 2 * lease.total_seconds())
        assert clock() > first_expiry  # without renewals the lock would be gone
        info = await guard.inspect(resource)
        assert info is not None
        assert info.fencing_token == lock.fencing_token
        assert info.expires_at > clock()
        assert lock.expires_at > first_expiry
        assert not lock.lost.is_set()
        assert await lock.release() is True

    async def test_lost_when_taken_over(self, guard: ExecutionGuard, clock: ManualClock) -> None:
        resource = _resource("takeover")
        reported: list[Lock] = []
        lease = 5 * SHORT_LEASE  # the watchdog renews after 500 ms of real time
        loop = asyncio.get_running_loop()
        # Before the request: the lease, as the watchdog sees it, cannot end sooner
        # than ``lease`` after this.
        started = loop.time()
        lock = await guard.try_acquire(
            resource, owner="w1", lease_ttl=lease, on_lost=reported.append
        )
        assert lock is not None
        clock.advance(lease)  # on the server the lease ends before the first renewal
        thief = await _held(guard, resource, owner="w2")
        await asyncio.wait_for(lock.lost.wait(), WAIT)
        # Noticed by that renewal, not merely given up when the lease ran out here
        # (which is no sooner than ``lease`` after ``started``): the renewal and
        # the takeover may stall for up to a second between them.
        assert loop.time() - started < lease.total_seconds()
        assert reported == [lock]
        assert await lock.release() is False
        info = await guard.inspect(resource)
        assert info is not None
        assert info.fencing_token == thief.fencing_token
        assert await thief.release() is True

    async def test_on_lost_coroutine_is_awaited_and_its_failure_ignored(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("on-lost")
        called = asyncio.Event()

        async def on_lost(lost: Lock) -> None:
            await asyncio.sleep(0)
            called.set()
            raise RuntimeError("a failing hook")

        lock = await guard.try_acquire(resource, owner="w1", lease_ttl=SHORT_LEASE, on_lost=on_lost)
        assert lock is not None
        clock.advance(SHORT_LEASE)
        await asyncio.wait_for(called.wait(), WAIT)
        assert lock.lost.is_set()
        again = await _held(guard, resource, owner="w2")  # the guard still works
        await again.release()

    async def test_release_stops_the_watchdog(self, guard: ExecutionGuard) -> None:
        resource = _resource("stop")
        await guard.inspect(resource)  # any lazy start-up happens first
        before = _watchdogs()
        lock = await _held(guard, resource)
        started = _watchdogs() - before
        assert len(started) == 1
        assert not next(iter(started)).done()
        await lock.release()
        assert all(task.done() for task in started)
        assert not (_watchdogs() - before)

    async def test_hold_exit_stops_the_watchdog(self, guard: ExecutionGuard) -> None:
        resource = _resource("stop-hold")
        await guard.inspect(resource)
        before = _watchdogs()
        async with guard.hold(resource, owner="w1"):
            assert len(_watchdogs() - before) == 1
        assert not (_watchdogs() - before)

    async def test_lost_lock_stops_its_watchdog(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("stop-lost")
        await guard.inspect(resource)
        before = _watchdogs()
        lock = await guard.try_acquire(resource, owner="w1", lease_ttl=SHORT_LEASE)
        assert lock is not None
        clock.advance(SHORT_LEASE)
        await asyncio.wait_for(lock.lost.wait(), WAIT)
        await asyncio.sleep(0.01)
        assert not (_watchdogs() - before)

    async def test_close_releases_every_lock_and_stops_every_watchdog(
        self, guard: ExecutionGuard
    ) -> None:
        await guard.inspect(_resource("close"))
        before = _watchdogs()
        reported: list[Lock] = []
        locks = [
            await guard.try_acquire(_resource("close"), owner=f"w{i}", on_lost=reported.append)
            for i in range(3)
        ]
        assert all(lock is not None for lock in locks)
        assert len(_watchdogs() - before) == 3
        await guard.close()
        assert not (_watchdogs() - before)
        for lock in locks:
            assert lock is not None
            assert lock.lost.is_set()
            assert await lock.release() is False
        assert sorted(id(x) for x in reported) == sorted(id(x) for x in locks)
        await guard.close()  # idempotent
        with pytest.raises(ConfigurationError, match="closed"):
            await guard.inspect(_resource("closed"))
        with pytest.raises(ConfigurationError, match="closed"):
            await guard.try_acquire(_resource("closed"), owner="w1")

    # ------------------------------------------------------------ names and bad inputs

    async def test_hostile_names_lock_independently(self, guard: ExecutionGuard) -> None:
        tag = uuid.uuid4().hex
        names = [f"{tag}{name}" for name in HOSTILE_NAMES[:-1]] + [HOSTILE_NAMES[-1]]
        owners = {name: f"{i}:{name[:64]}" for i, name in enumerate(names)}
        locks = {name: await _held(guard, name, owner=owners[name]) for name in names}
        for name in names:
            info = await guard.inspect(name)
            assert info is not None, name
            assert (info.resource, info.owner) == (name, owners[name])
            assert info.fencing_token == locks[name].fencing_token
        assert await locks[names[0]].release() is True
        for name in names[1:]:
            info = await guard.inspect(name)
            assert info is not None, name
            assert info.owner == owners[name]
            assert await locks[name].release() is True

    @pytest.mark.parametrize(("bad", "words"), BAD_NAMES)
    async def test_bad_resource_is_refused(
        self, guard: ExecutionGuard, bad: object, words: str
    ) -> None:
        name: Any = bad
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "try_acquire": lambda: guard.try_acquire(name, owner="w1"),
            "acquire": lambda: guard.acquire(name, owner="w1"),
            "inspect": lambda: guard.inspect(name),
        }
        for method, call in calls.items():
            with pytest.raises(InvalidInputError) as caught:
                await call()
            assert isinstance(caught.value, ValueError), method
            assert isinstance(caught.value, StorageError), method
            assert "resource" in str(caught.value), method
            assert words in str(caught.value), method
        with pytest.raises(InvalidInputError, match="resource"):
            async with guard.hold(name, owner="w1"):
                pytest.fail("entered the block")

    @pytest.mark.parametrize(("bad", "words"), BAD_NAMES)
    async def test_bad_owner_is_refused_and_nothing_written(
        self, guard: ExecutionGuard, bad: object, words: str
    ) -> None:
        resource = _resource("bad-owner")
        for call in (guard.try_acquire, guard.acquire):
            with pytest.raises(InvalidInputError) as caught:
                await call(resource, owner=bad)  # type: ignore[arg-type]
            assert "owner" in str(caught.value)
            assert words in str(caught.value)
        assert await guard.inspect(resource) is None

    @pytest.mark.parametrize("option", ["lease_ttl", "lock_timeout", "retry_interval"])
    @pytest.mark.parametrize("bad", BAD_DURATIONS, ids=repr)
    async def test_bad_duration_is_refused_and_nothing_written(
        self, guard: ExecutionGuard, option: str, bad: object
    ) -> None:
        resource = _resource("bad-duration")
        options: dict[str, Any] = {option: bad}
        with pytest.raises(InvalidInputError) as caught:
            await guard.acquire(resource, owner="w1", **options)
        assert option in str(caught.value)
        assert "timedelta" in str(caught.value) or "1 ms" in str(caught.value)
        if option == "lease_ttl":
            with pytest.raises(InvalidInputError, match=option):
                await guard.try_acquire(resource, owner="w1", lease_ttl=bad)  # type: ignore[arg-type]
        assert await guard.inspect(resource) is None

    async def test_bad_on_lost_is_refused(self, guard: ExecutionGuard) -> None:
        resource = _resource("bad-callback")
        with pytest.raises(InvalidInputError, match="on_lost"):
            await guard.try_acquire(resource, owner="w1", on_lost=42)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="on_lost"):
            await guard.acquire(resource, owner="w1", on_lost="later")  # type: ignore[arg-type]
        assert await guard.inspect(resource) is None

    # ------------------------------------------------------------ names taken literally

    @pytest.mark.parametrize("name", EXPRESSION_NAMES)
    async def test_expression_like_resource_and_owner_are_taken_literally(
        self, guard: ExecutionGuard, clock: ManualClock, name: str
    ) -> None:
        # The whole name is the resource (a prefix would hide a leading "$"), so it is
        # shared with other runs on the same database. The clock moves on with real
        # time: a lock left by a run that stopped half-way 30 s or more ago has
        # expired, a concurrent run's (on about the same clock) is waited for.
        clock.advance(datetime.now(UTC) - _REAL_TIME_ORIGIN)
        lock = await guard.acquire(
            name,
            owner=name,
            lease_ttl=timedelta(seconds=30),
            lock_timeout=timedelta(seconds=WAIT),
            retry_interval=timedelta(milliseconds=20),
        )
        try:
            info = await guard.inspect(name)
            assert info == LockInfo(
                resource=name,
                owner=name,
                fencing_token=lock.fencing_token,
                acquired_at=lock.acquired_at,
                expires_at=lock.expires_at,
            )
            assert await guard.try_acquire(name, owner="w2") is None
            assert await lock.renew() is True
        finally:
            assert await lock.release() is True
        assert await guard.inspect(name) is None

    async def test_every_allowed_name_is_a_literal_owner(self, guard: ExecutionGuard) -> None:
        tag = uuid.uuid4().hex
        owners = [*HOSTILE_NAMES, *EXPRESSION_NAMES]
        locks = [await _held(guard, f"{tag}-{i}", owner=owner) for i, owner in enumerate(owners)]
        for lock, owner in zip(locks, owners, strict=True):
            info = await guard.inspect(lock.resource)
            assert info is not None, owner
            assert (info.owner, info.fencing_token) == (owner, lock.fencing_token)
            assert await lock.release() is True

    @pytest.mark.parametrize("owner", ["$token", "$owner", "$fencingToken", "$$ROOT", "$"])
    async def test_an_expression_like_owner_over_an_expired_lock(
        self, guard: ExecutionGuard, clock: ManualClock, owner: str
    ) -> None:
        resource = _resource("expired-owner")
        stale = await guard.try_acquire(resource, owner="w1", lease_ttl=timedelta(seconds=1))
        assert stale is not None
        clock.advance(timedelta(seconds=1))
        lock = await _held(guard, resource, owner=owner)
        info = await guard.inspect(resource)
        assert info is not None
        assert (info.owner, info.fencing_token) == (owner, lock.fencing_token)
        assert stale.token not in info.model_dump_json()
        assert await lock.release() is True

    # ------------------------------------------------------------ the lease as seen here

    async def test_a_grant_answered_after_its_lease_is_not_held(
        self, guard: ExecutionGuard, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        resource = _resource("late-grant")
        late = _LateGrants(guard, monkeypatch)
        attempt = asyncio.ensure_future(
            guard.try_acquire(resource, owner=late.OWNER, lease_ttl=SHORT_LEASE)
        )
        await late.past_the_lease(SHORT_LEASE)
        assert await asyncio.wait_for(attempt, WAIT) is None
        # What the server granted was given back: the resource is free (the server's
        # clock, a manual one here, never ended that lease).
        assert await guard.inspect(resource) is None
        lock = await _held(guard, resource, owner="w2")
        assert await lock.release() is True

    async def test_a_late_grant_never_makes_two_holders(
        self, guard: ExecutionGuard, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        resource = _resource("late-takeover")
        late = _LateGrants(guard, monkeypatch)
        waiter = asyncio.ensure_future(
            guard.acquire(
                resource,
                owner=late.OWNER,
                lease_ttl=SHORT_LEASE,
                lock_timeout=timedelta(seconds=60),
                retry_interval=timedelta(milliseconds=20),
            )
        )
        await asyncio.wait_for(late.granted.wait(), WAIT)
        clock.advance(SHORT_LEASE)  # the lease ends on the server before its grant arrives
        thief = await _held(guard, resource, owner="thief")
        await late.past_the_lease(SHORT_LEASE)
        await asyncio.wait_for(late.retried.wait(), WAIT)  # it went on waiting
        assert not waiter.done()
        info = await guard.inspect(resource)
        assert info is not None
        assert (info.owner, info.fencing_token) == ("thief", thief.fencing_token)
        assert await thief.release() is True
        second = await asyncio.wait_for(waiter, WAIT)
        assert second.fencing_token > thief.fencing_token
        assert not thief.lost.is_set()
        assert await second.release() is True

    async def test_a_slow_grant_is_renewed_before_its_lease_ends(
        self, guard: ExecutionGuard, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # The grant takes 80% of the lease: the first renewal is due at once, not a
        # third of the lease after the grant arrived (which is after the lease ended).
        lease = timedelta(seconds=2)
        resource = _resource("slow-grant")
        slow = _LateGrants(guard, monkeypatch, delay=0.8 * lease.total_seconds())
        lock = await guard.try_acquire(resource, owner=slow.OWNER, lease_ttl=lease)
        assert lock is not None
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(slow.sent[0] + 1.5 * lease.total_seconds() - loop.time(), 0))
        assert not lock.lost.is_set()
        assert await lock.release() is True

    async def test_lost_when_the_lease_ends_here_whatever_the_server_does(
        self, guard: ExecutionGuard, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        resource = _resource("stuck-renewal")
        stuck, unblock = asyncio.Event(), asyncio.Event()
        renew = guard._renew

        async def stuck_renewal(resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
            stuck.set()
            while not unblock.is_set():  # like a database call that cannot be interrupted
                with contextlib.suppress(asyncio.CancelledError):
                    await unblock.wait()
            return await renew(resource, token, lease_ttl)

        monkeypatch.setattr(guard, "_renew", stuck_renewal)
        loop = asyncio.get_running_loop()
        before = loop.time()
        lock = await guard.try_acquire(resource, owner="w1", lease_ttl=SHORT_LEASE)
        assert lock is not None
        try:
            await asyncio.wait_for(stuck.wait(), WAIT)
            await asyncio.wait_for(lock.lost.wait(), WAIT)
            # Not before the lease could have ended, counted from before the request.
            assert loop.time() >= before + SHORT_LEASE.total_seconds() - 0.001
            assert not unblock.is_set()
        finally:
            unblock.set()
        assert await lock.release() is False
        # The renewal went through after all (the manual clock never ended the
        # lease): the guard gives that lease back.
        end = loop.time() + WAIT
        while await guard.inspect(resource) is not None:
            assert loop.time() < end, "the renewed lease was never given back"
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------ defaults and edges

    async def test_guard_defaults(self, guard: ExecutionGuard) -> None:
        assert guard.lock_timeout == timedelta(minutes=30)
        assert guard.lease_ttl == timedelta(minutes=30)
        assert guard.retry_interval == timedelta(milliseconds=500)

    async def test_the_token_is_a_random_uuid4(self, guard: ExecutionGuard) -> None:
        lock = await _held(guard, _resource("uuid"))
        assert uuid.UUID(hex=lock.token).version == 4
        assert lock.token == uuid.UUID(hex=lock.token).hex
        await lock.release()

    async def test_an_expired_lock_nobody_took_is_not_released(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("expired-release")
        lock = await guard.try_acquire(resource, owner="w1", lease_ttl=timedelta(seconds=5))
        assert lock is not None
        clock.advance(timedelta(seconds=5))
        assert await lock.release() is False  # the lease had ended: it was no longer held
        assert await guard.inspect(resource) is None
        again = await _held(guard, resource, owner="w2")
        assert again.fencing_token > lock.fencing_token
        assert await again.release() is True

    async def test_lock_timeout_shorter_than_retry_interval(self, guard: ExecutionGuard) -> None:
        resource = _resource("short-timeout")
        holder = await _held(guard, resource)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(LockTimeoutError, match="lock_timeout"):
            await guard.acquire(
                resource,
                owner="w2",
                lock_timeout=timedelta(milliseconds=100),
                retry_interval=timedelta(seconds=30),
            )
        assert 0.1 <= loop.time() - started < WAIT  # the wait ends at lock_timeout
        assert await holder.release() is True

    async def test_acquire_of_a_free_resource_does_not_wait(self, guard: ExecutionGuard) -> None:
        resource = _resource("no-wait")
        await guard.inspect(resource)  # any lazy start-up happens first
        loop = asyncio.get_running_loop()
        started = loop.time()
        lock = await guard.acquire(resource, owner="w1", retry_interval=timedelta(seconds=30))
        assert loop.time() - started < WAIT
        assert await lock.release() is True

    async def test_lock_times_are_utc_whole_milliseconds(
        self, guard: ExecutionGuard, clock: ManualClock
    ) -> None:
        resource = _resource("ms")
        clock.advance(timedelta(microseconds=1_999))  # the clock is now between milliseconds
        now = clock()
        whole = now.replace(microsecond=now.microsecond - now.microsecond % 1000)
        lease = timedelta(seconds=10)
        lock = await guard.try_acquire(resource, owner="w1", lease_ttl=lease)
        assert lock is not None
        assert (lock.acquired_at, lock.expires_at) == (whole, whole + lease)
        assert lock.acquired_at.utcoffset() == timedelta(0)
        info = await guard.inspect(resource)
        assert info is not None
        assert (info.acquired_at, info.expires_at) == (whole, whole + lease)
        assert await lock.renew() is True
        assert lock.expires_at == whole + lease
        assert await lock.release() is True

    # ------------------------------------------------------------ model-based

    async def test_guard_agrees_with_a_model(
        self, guard: ExecutionGuard, clock: ManualClock, pai_examples: int
    ) -> None:
        machine = _machine(guard, clock, asyncio.get_running_loop())
        await run_model(machine, examples=pai_examples, steps=STEPS)


# ---------------------------------------------------------------- model-based test

STEPS = 30
# Leases long enough that no watchdog renews during an example (every 20 s or
# more of real time): the model moves only with the manual clock.
LEASES_MS = st.sampled_from([60_000, 90_000, 120_000])
ADVANCES_MS = st.sampled_from([1, 29_999, 30_000, 59_999, 60_000, 60_001, 90_000, 120_000])
OWNERS = st.sampled_from(["w1", "w2", "w3"])
SUFFIXES = ("a", "ab", "a.b")


@dataclass
class _Held:
    """The model of one stored lock."""

    token: str
    owner: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime


class _GuardModel(RuleBasedStateMachine):
    """try_acquire / renew / release / inspect / purge / clock moves, against a dict."""

    guard: ExecutionGuard
    clock: ManualClock
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        super().__init__()
        tag = uuid.uuid4().hex[:12]
        self.resources = [f"model-{tag}-{suffix}" for suffix in SUFFIXES]
        self.stored: dict[str, _Held] = {}
        self.locks: list[Lock] = []
        self.finished: set[str] = set()  # tokens of locks released or lost locally
        self.last_fence = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def live(self, resource: str) -> _Held | None:
        held = self.stored.get(resource)
        return held if held is not None and self.clock() < held.expires_at else None

    def holds(self, lock: Lock) -> bool:
        held = self.live(lock.resource)
        return held is not None and held.token == lock.token and lock.token not in self.finished

    @rule(index=st.integers(0, len(SUFFIXES) - 1), owner=OWNERS, lease_ms=LEASES_MS)
    def try_acquire(self, index: int, owner: str, lease_ms: int) -> None:
        resource, lease = self.resources[index], timedelta(milliseconds=lease_ms)
        free = self.live(resource) is None
        lock = self.run(self.guard.try_acquire(resource, owner=owner, lease_ttl=lease))
        assert (lock is not None) == free, f"free={free} but try_acquire gave {lock!r}"
        if lock is None:
            return
        now = self.clock()
        assert lock.fencing_token > self.last_fence
        assert (lock.acquired_at, lock.expires_at) == (now, now + lease)
        self.last_fence = lock.fencing_token
        self.stored[resource] = _Held(lock.token, owner, lock.fencing_token, now, now + lease)
        self.locks.append(lock)

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        lock = data.draw(st.sampled_from(self.locks))
        expected = self.holds(lock)
        renewed = self.run(lock.renew())
        assert renewed is expected
        if renewed:
            expires_at = self.clock() + lock.lease_ttl
            assert lock.expires_at == expires_at
            self.stored[lock.resource].expires_at = expires_at
        elif lock.token not in self.finished:
            assert lock.lost.is_set()
            self.finished.add(lock.token)

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lock = data.draw(st.sampled_from(self.locks))
        expected = self.holds(lock)
        assert self.run(lock.release()) is expected
        self.finished.add(lock.token)
        if expected:
            del self.stored[lock.resource]
        assert not lock.lost.is_set() or not expected

    @rule(delta=ADVANCES_MS)
    def advance(self, delta: int) -> None:
        self.clock.advance(ms=delta)

    @rule()
    def purge(self) -> None:
        purged = self.run(self.guard.purge_expired())
        assert type(purged) is int
        assert purged >= 0
        self.stored = {r: h for r, h in self.stored.items() if self.live(r) is not None}

    @invariant()
    def inspect_agrees(self) -> None:
        for resource in self.resources:
            info = self.run(self.guard.inspect(resource))
            held = self.live(resource)
            if held is None:
                assert info is None, f"{resource!r} should be free, got {info!r}"
                continue
            assert info == LockInfo(
                resource=resource,
                owner=held.owner,
                fencing_token=held.fencing_token,
                acquired_at=held.acquired_at,
                expires_at=held.expires_at,
            )

    def teardown(self) -> None:
        for lock in self.locks:  # stops every watchdog this example started
            self.run(lock.release())


def _machine(
    guard: ExecutionGuard, clock: ManualClock, loop: asyncio.AbstractEventLoop
) -> type[_GuardModel]:
    class Machine(_GuardModel):
        pass

    Machine.guard = guard
    Machine.clock = clock
    Machine.loop = loop
    return Machine
