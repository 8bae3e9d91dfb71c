"""Lease rules (docs/commits.md#leases): acquire, renew, release, expiry and the provider clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pai_storage import (
    CommittedResult,
    ConflictResult,
    ManualClock,
    ThreadRecord,
    ThreadStore,
    ThreadVersion,
)
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from ._support import new_scope

__all__ = ["TestLeases"]

pytestmark = pytest.mark.asyncio

MAX_DURATION_MS = 86_400_000


def _turn(lease: dict[str, Any] | None = None) -> dict[str, Any]:
    """One running turn (r1 owning m1) plus an optional lease change."""
    changes: dict[str, Any] = {
        "messages": [b.insert(b.message("m1", "hello", run_id="r1"))],
        "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
    }
    if lease is not None:
        changes["lease"] = lease
    return changes


@dataclass(frozen=True)
class _Committed:
    thread: ThreadRecord
    committed_at: datetime


def _committed(result: Any) -> _Committed:
    assert isinstance(result, CommittedResult), f"expected a committed result, got {result!r}"
    assert result.type == "committed"
    assert result.thread is not None
    return _Committed(result.thread, result.committed_at)


def _conflict(result: Any, current: ThreadVersion | None) -> ConflictResult:
    assert isinstance(result, ConflictResult), f"expected a conflict, got {result!r}"
    assert result.type == "conflict"
    assert result.current_version == current
    return result


async def _root(store: ThreadStore, scope: str, tid: str) -> ThreadRecord:
    read = await store.read_thread(b.read(scope, tid))
    assert read.thread is not None
    return read.thread


class TestLeases:
    """Owner-fenced, expiring run leases judged at commit time on the provider clock."""

    # ------------------------------------------------------------------ acquire

    @pytest.mark.parametrize("operation", ["send", "trigger", "regenerate", "resume"])
    async def test_acquire_on_create_stamps_commit_time(
        self, store: ThreadStore, clock: ManualClock, operation: str
    ) -> None:
        scope, now = new_scope(), clock()
        result = _committed(
            await store.commit_thread(
                b.create(scope, "t", _turn(b.acquire("r1", "w1", 45_000, operation)))
            )
        )
        assert result.committed_at == now
        lease = result.thread.lease
        assert lease is not None
        assert lease.kind == "run"
        assert lease.run_id == "r1"
        assert lease.owner_id == "w1"
        assert lease.operation == operation
        assert lease.acquired_at == now
        assert lease.expires_at == now + timedelta(milliseconds=45_000)
        assert lease.renewed_at is None
        stored = await _root(store, scope, "t")
        assert stored.lease == lease
        as_json = stored.to_json()["lease"]
        assert as_json == {
            "kind": "run",
            "runId": "r1",
            "ownerId": "w1",
            "operation": operation,
            "acquiredAt": "2030-01-01T00:00:00.000Z",
            "expiresAt": "2030-01-01T00:00:45.000Z",
        }

    async def test_acquire_on_update_uses_that_commits_time(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = _committed(await store.commit_thread(b.create(scope, "t", _turn())))
        assert created.thread.lease is None
        later = clock.advance(ms=12_345)
        result = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.acquire("r1", "w9", 1_500)},
                    root=b.root(),
                )
            )
        )
        assert result.committed_at == later
        assert result.thread.version.revision == 2
        lease = result.thread.lease
        assert lease is not None
        assert (lease.owner_id, lease.run_id, lease.operation) == ("w9", "r1", "send")
        assert lease.acquired_at == later
        assert lease.expires_at == later + timedelta(milliseconds=1_500)
        assert (await _root(store, scope, "t")).lease == lease

    @pytest.mark.parametrize("owner", ["w1", "w2"])
    async def test_acquire_while_unexpired_lease_exists_conflicts(
        self, store: ThreadStore, clock: ManualClock, owner: str
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        version = created.thread.version
        for advance in (0, 1, 29_998):  # up to expiresAt - 1ms: still unexpired
            clock.advance(ms=advance)
            result = await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    version,
                    {"lease": b.acquire("r1", owner, 60_000, "resume")},
                    root=b.root(title="must not apply"),
                )
            )
            _conflict(result, version)
        stored = await _root(store, scope, "t")
        assert stored.version == version
        assert stored.lease == created.thread.lease
        assert stored.title is None

    async def test_acquire_replaces_an_expired_lease(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        expiry = clock.advance(ms=30_000)  # expiresAt == now: expired
        result = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.acquire("r1", "w2", 10_000, "resume")},
                    root=b.root(),
                )
            )
        )
        lease = result.thread.lease
        assert lease is not None
        assert (lease.owner_id, lease.operation) == ("w2", "resume")
        assert lease.acquired_at == expiry
        assert lease.expires_at == expiry + timedelta(seconds=10)
        assert lease.renewed_at is None
        assert (await _root(store, scope, "t")).lease == lease

    # -------------------------------------------------------------------- renew

    async def test_renew_by_holder(self, store: ThreadStore, clock: ManualClock) -> None:
        scope = new_scope()
        start = clock()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        renewed_at = clock.advance(ms=29_999)
        result = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.renew("r1", "w1", 60_000)},
                    root=b.root(),
                )
            )
        )
        lease = result.thread.lease
        assert lease is not None
        assert lease.renewed_at == renewed_at
        assert lease.expires_at == renewed_at + timedelta(minutes=1)
        assert lease.acquired_at == start
        assert (lease.run_id, lease.owner_id, lease.operation) == ("r1", "w1", "send")
        assert result.thread.version.revision == 2
        stored = await _root(store, scope, "t")
        assert stored.lease == lease
        assert stored.to_json()["lease"]["renewedAt"] == "2030-01-01T00:00:29.999Z"
        # a second renewal moves renewedAt again and may shorten the lease
        again_at = clock.advance(ms=1_000)
        again = _committed(
            await store.commit_thread(
                b.update_at(
                    scope, "t", stored.version, {"lease": b.renew("r1", "w1", 5)}, root=b.root()
                )
            )
        )
        assert again.thread.lease is not None
        assert again.thread.lease.renewed_at == again_at
        assert again.thread.lease.expires_at == again_at + timedelta(milliseconds=5)
        assert again.thread.lease.acquired_at == start

    @pytest.mark.parametrize("past_expiry_ms", [0, 1, 3_600_000])
    async def test_renew_of_expired_lease_conflicts(
        self, store: ThreadStore, clock: ManualClock, past_expiry_ms: int
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        clock.advance(ms=30_000 + past_expiry_ms)  # 0: expiresAt == now counts as expired
        result = await store.commit_thread(
            b.update_at(
                scope,
                "t",
                created.thread.version,
                {"lease": b.renew("r1", "w1", 30_000)},
                root=b.root(),
            )
        )
        _conflict(result, created.thread.version)
        stored = await _root(store, scope, "t")
        assert stored.version == created.thread.version
        assert stored.lease == created.thread.lease

    async def test_renew_of_missing_lease_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = _committed(await store.commit_thread(b.create(scope, "t", _turn())))
        result = await store.commit_thread(
            b.update_at(
                scope, "t", created.thread.version, {"lease": b.renew("r1", "w1")}, root=b.root()
            )
        )
        _conflict(result, created.thread.version)
        stored = await _root(store, scope, "t")
        assert stored.lease is None
        assert stored.version.revision == 1

    async def test_renew_on_create_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        result = await store.commit_thread(b.create(scope, "t", _turn(b.renew("r1", "w1"))))
        _conflict(result, None)
        assert (await store.read_thread(b.read(scope, "t"))).thread is None

    @pytest.mark.parametrize(("run_id", "owner"), [("r2", "w1"), ("r1", "w2"), ("r2", "w2")])
    async def test_renew_by_non_holder_conflicts(
        self, store: ThreadStore, run_id: str, owner: str
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1"))))
        )
        result = await store.commit_thread(
            b.update_at(
                scope, "t", created.thread.version, {"lease": b.renew(run_id, owner)}, root=b.root()
            )
        )
        _conflict(result, created.thread.version)
        assert (await _root(store, scope, "t")).lease == created.thread.lease

    # ------------------------------------------------------------------ release

    @pytest.mark.parametrize("expiry", ["unexpired", "any"])
    async def test_release_by_holder(
        self, store: ThreadStore, clock: ManualClock, expiry: str
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        released_at = clock.advance(ms=29_999)
        result = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {
                        "runs": [b.replace(b.run("r1", "completed", inputs=["m1"]))],
                        "lease": b.release("r1", "w1", expiry),
                    },
                    root=b.root(),
                )
            )
        )
        assert result.thread.lease is None
        assert "lease" not in result.thread.to_json()
        assert result.committed_at == released_at
        stored = await _root(store, scope, "t")
        assert stored.lease is None
        assert "lease" not in stored.to_json()
        assert stored.version.revision == 2
        # released: anyone may acquire again at once (the run must be open again)
        again = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    stored.version,
                    {
                        "runs": [b.replace(b.run("r1", "running", inputs=["m1"]))],
                        "lease": b.acquire("r1", "w2", 1_000, "regenerate"),
                    },
                    root=b.root(),
                )
            )
        )
        assert again.thread.lease is not None
        assert again.thread.lease.owner_id == "w2"

    @pytest.mark.parametrize("expiry", ["unexpired", "any"])
    @pytest.mark.parametrize(("run_id", "owner"), [("r2", "w1"), ("r1", "w2"), ("r2", "w2")])
    async def test_release_by_non_holder_conflicts(
        self, store: ThreadStore, clock: ManualClock, run_id: str, owner: str, expiry: str
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        for advance in (0, 60_000):  # unexpired, then expired: never a non-holder's to release
            clock.advance(ms=advance)
            result = await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.release(run_id, owner, expiry)},
                    root=b.root(),
                )
            )
            _conflict(result, created.thread.version)
            assert (await _root(store, scope, "t")).lease == created.thread.lease

    async def test_release_without_lease_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = _committed(await store.commit_thread(b.create(scope, "t", _turn())))
        for expiry in ("unexpired", "any"):
            result = await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.release("r1", "w1", expiry)},
                    root=b.root(),
                )
            )
            _conflict(result, created.thread.version)
        assert (await _root(store, scope, "t")).version.revision == 1

    @pytest.mark.parametrize("past_expiry_ms", [0, 1, 600_000])
    async def test_release_unexpired_of_expired_lease_conflicts_but_any_succeeds(
        self, store: ThreadStore, clock: ManualClock, past_expiry_ms: int
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        version = created.thread.version
        clock.advance(ms=30_000 + past_expiry_ms)
        result = await store.commit_thread(
            b.update_at(
                scope, "t", version, {"lease": b.release("r1", "w1", "unexpired")}, root=b.root()
            )
        )
        _conflict(result, version)
        assert (await _root(store, scope, "t")).lease == created.thread.lease
        released = _committed(
            await store.commit_thread(
                b.update_at(
                    scope, "t", version, {"lease": b.release("r1", "w1", "any")}, root=b.root()
                )
            )
        )
        assert released.thread.lease is None
        assert released.thread.version.revision == 2
        assert (await _root(store, scope, "t")).lease is None

    # ----------------------------------------------------------------- takeover

    async def test_takeover_after_expiry_fences_the_old_owner(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        # w2 cannot take over early
        clock.advance(ms=20_000)
        early = await store.commit_thread(
            b.update_at(
                scope,
                "t",
                created.thread.version,
                {"lease": b.acquire("r1", "w2", 30_000, "resume")},
                root=b.root(),
            )
        )
        _conflict(early, created.thread.version)
        taken_at = clock.advance(ms=15_000)
        taken = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.acquire("r1", "w2", 30_000, "resume")},
                    root=b.root(),
                )
            )
        )
        lease = taken.thread.lease
        assert lease is not None
        assert (lease.owner_id, lease.operation, lease.acquired_at) == ("w2", "resume", taken_at)
        version = taken.thread.version
        # the old owner is fenced: renew, release (either expiry) and re-acquire all conflict
        for change in (
            b.renew("r1", "w1"),
            b.release("r1", "w1", "unexpired"),
            b.release("r1", "w1", "any"),
            b.acquire("r1", "w1"),
        ):
            _conflict(
                await store.commit_thread(
                    b.update_at(scope, "t", version, {"lease": change}, root=b.root())
                ),
                version,
            )
        # the new owner renews normally
        clock.advance(ms=1)
        renewed = _committed(
            await store.commit_thread(
                b.update_at(
                    scope, "t", version, {"lease": b.renew("r1", "w2", 5_000)}, root=b.root()
                )
            )
        )
        assert renewed.thread.lease is not None
        assert renewed.thread.lease.owner_id == "w2"
        assert renewed.thread.lease.acquired_at == taken_at
        assert renewed.thread.lease.renewed_at == taken_at + timedelta(milliseconds=1)

    # --------------------------------------------------------- nothing applied

    async def test_lease_conflict_applies_nothing_else(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 30_000))))
        )
        version = created.thread.version
        clock.advance(ms=1_000)
        result = await store.commit_thread(
            b.update_at(
                scope,
                "t",
                version,
                {
                    "messages": [
                        b.insert(
                            b.message(
                                "m2", "partial", role="assistant", run_id="r1", relation="output"
                            )
                        )
                    ],
                    "lease": b.renew("r1", "intruder"),
                },
                root=b.root(title="changed", metadata={"k": 1}),
            )
        )
        _conflict(result, version)
        read = await store.read_thread(
            b.read(
                scope,
                "t",
                messages={"type": "page", "view": "raw", "page": {"limit": 10}},
                runs={"type": "page", "page": {"limit": 10}},
            )
        )
        assert read.thread is not None
        assert read.thread.version == version
        assert read.thread.title is None
        assert read.thread.metadata == {}
        assert read.thread.updated_at == created.thread.updated_at
        assert read.thread.lease == created.thread.lease
        assert read.messages is not None
        assert read.runs is not None
        assert [m.message_id for m in read.messages.items] == ["m1"]
        assert [r.run_id for r in read.runs.items] == ["r1"]
        # a create whose lease precondition fails creates nothing
        _conflict(
            await store.commit_thread(b.create(scope, "u", _turn(b.release("r1", "w1")))), None
        )
        assert (await store.read_thread(b.read(scope, "u"))).thread is None

    # ------------------------------------------------------- a lease as stored

    async def test_commits_without_a_lease_change_keep_the_lease(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        # Expiry never removes a lease: it stays, unchanged, until a release or a
        # new acquire replaces it, and while it names a run that run must stay open.
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 1_000))))
        )
        lease = created.thread.lease
        assert lease is not None
        version = created.thread.version
        for advance in (10, 5_000):  # unexpired, then long expired
            clock.advance(ms=advance)
            result = _committed(
                await store.commit_thread(
                    b.update_at(scope, "t", version, root=b.root(title=f"after {advance} ms"))
                )
            )
            assert result.thread.lease == lease
            assert result.thread.to_json()["lease"] == lease.to_json()
            stored = await _root(store, scope, "t")
            assert stored.lease == lease
            version = result.thread.version
        # the expired lease still names r1: finishing r1 needs the release too
        with pytest.raises(ThreadStoreInvariantError, match=r"\brule 7\b"):
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    version,
                    {"runs": [b.replace(b.run("r1", "failed", inputs=["m1"]))]},
                    root=b.root(),
                )
            )
        assert (await _root(store, scope, "t")).version == version
        finished = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    version,
                    {
                        "runs": [b.replace(b.run("r1", "failed", inputs=["m1"]))],
                        "lease": b.release("r1", "w1", "any"),
                    },
                    root=b.root(),
                )
            )
        )
        assert finished.thread.lease is None

    async def test_acquire_for_the_next_run_waits_for_the_stored_lease(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        # The precondition is judged on the lease as stored before the commit: finishing
        # r1 in the same commit does not free its unexpired lease for r2.
        scope = new_scope()
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 1_000))))
        )
        version = created.thread.version
        handover = {
            "messages": [b.insert(b.message("m2", run_id="r2"))],
            "runs": [
                b.replace(b.run("r1", "completed", inputs=["m1"])),
                b.insert(b.run("r2", "running", inputs=["m2"])),
            ],
            "lease": b.acquire("r2", "w2", 2_000, "trigger"),
        }
        clock.advance(ms=999)
        _conflict(
            await store.commit_thread(b.update_at(scope, "t", version, handover, root=b.root())),
            version,
        )
        assert (await _root(store, scope, "t")).lease == created.thread.lease
        expired_at = clock.advance(ms=1)
        taken = _committed(
            await store.commit_thread(b.update_at(scope, "t", version, handover, root=b.root()))
        )
        lease = taken.thread.lease
        assert lease is not None
        assert (lease.run_id, lease.owner_id, lease.operation) == ("r2", "w2", "trigger")
        assert lease.acquired_at == expired_at
        assert lease.renewed_at is None
        assert lease.expires_at == expired_at + timedelta(seconds=2)

    async def test_lease_times_are_milliseconds_of_the_commit_clock(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        clock.set(datetime(2031, 5, 6, 7, 8, 9, 123_999, tzinfo=UTC))
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 1_000))))
        )
        lease = created.thread.lease
        assert lease is not None
        assert lease.acquired_at == datetime(2031, 5, 6, 7, 8, 9, 123_000, tzinfo=UTC)
        assert lease.expires_at == datetime(2031, 5, 6, 7, 8, 10, 123_000, tzinfo=UTC)
        assert created.thread.to_json()["lease"]["expiresAt"] == "2031-05-06T07:08:10.123Z"
        # set between milliseconds: just before expiresAt the lease is live, at it expired
        clock.set(datetime(2031, 5, 6, 7, 8, 10, 122_999, tzinfo=UTC))
        renewed = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.renew("r1", "w1", 1)},
                    root=b.root(),
                )
            )
        )
        assert renewed.thread.lease is not None
        assert renewed.thread.lease.renewed_at == datetime(
            2031, 5, 6, 7, 8, 10, 122_000, tzinfo=UTC
        )
        assert renewed.thread.lease.expires_at == datetime(
            2031, 5, 6, 7, 8, 10, 123_000, tzinfo=UTC
        )
        clock.set(datetime(2031, 5, 6, 7, 8, 10, 123_500, tzinfo=UTC))
        _conflict(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    renewed.thread.version,
                    {"lease": b.renew("r1", "w1")},
                    root=b.root(),
                )
            ),
            renewed.thread.version,
        )

    # ---------------------------------------------------------------- durations

    @pytest.mark.parametrize("duration", [0, -1, MAX_DURATION_MS + 1])
    async def test_duration_out_of_bounds_is_invariant_error(
        self, store: ThreadStore, duration: int
    ) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError, match="durationMs"):
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", duration))))
        assert (await store.read_thread(b.read(scope, "t"))).thread is None
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1"))))
        )
        for change in (b.renew("r1", "w1", duration), b.acquire("r1", "w2", duration)):
            with pytest.raises(ThreadStoreInvariantError, match="durationMs"):
                await store.commit_thread(
                    b.update_at(
                        scope, "t", created.thread.version, {"lease": change}, root=b.root()
                    )
                )
        stored = await _root(store, scope, "t")
        assert stored.version == created.thread.version
        assert stored.lease == created.thread.lease

    @pytest.mark.parametrize("duration", [1.5, "1000", True, None])
    async def test_duration_must_be_an_integer(self, store: ThreadStore, duration: Any) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError, match="durationMs"):
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", duration))))
        assert (await store.read_thread(b.read(scope, "t"))).thread is None

    async def test_duration_bounds_are_inclusive(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        now = clock()
        created = _committed(
            await store.commit_thread(
                b.create(scope, "t", _turn(b.acquire("r1", "w1", MAX_DURATION_MS)))
            )
        )
        assert created.thread.lease is not None
        assert created.thread.lease.expires_at == now + timedelta(days=1)
        renewed = _committed(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    created.thread.version,
                    {"lease": b.renew("r1", "w1", 1)},
                    root=b.root(),
                )
            )
        )
        assert renewed.thread.lease is not None
        assert renewed.thread.lease.expires_at == now + timedelta(milliseconds=1)
        clock.advance(ms=1)  # the 1 ms lease is now expired
        _conflict(
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t",
                    renewed.thread.version,
                    {"lease": b.renew("r1", "w1", 1)},
                    root=b.root(),
                )
            ),
            renewed.thread.version,
        )

    # --------------------------------------------------------------- real clock

    async def test_provider_clock_stamps_commits_and_leases(
        self, real_clock_store: ThreadStore
    ) -> None:
        store = real_clock_store
        scope = new_scope()
        slack = timedelta(seconds=5)
        before = datetime.now(UTC)
        created = _committed(
            await store.commit_thread(b.create(scope, "t", _turn(b.acquire("r1", "w1", 600_000))))
        )
        after = datetime.now(UTC)
        committed_at = created.committed_at
        assert committed_at.tzinfo is not None
        assert committed_at.utcoffset() == timedelta(0)
        assert committed_at.microsecond % 1000 == 0
        assert before - slack <= committed_at <= after + slack
        lease = created.thread.lease
        assert lease is not None
        assert lease.acquired_at == committed_at
        assert lease.expires_at - lease.acquired_at == timedelta(minutes=10)
        assert created.thread.created_at == created.thread.updated_at == committed_at

        # Each renewal is for a minute: a read and a commit that stall for seconds on a
        # busy machine must not let the lease run out between renewals.
        renewal_ms = 60_000
        previous_observed = None
        previous_committed = committed_at
        version = created.thread.version
        for _ in range(5):
            read = await store.read_thread(b.read(scope, "t"))
            assert read.thread is not None
            assert abs(read.observed_at - datetime.now(UTC)) <= slack
            if previous_observed is not None:
                assert read.observed_at >= previous_observed
            previous_observed = read.observed_at
            result = _committed(
                await store.commit_thread(
                    b.update_at(
                        scope,
                        "t",
                        version,
                        {"lease": b.renew("r1", "w1", renewal_ms)},
                        root=b.root(),
                    )
                )
            )
            assert result.committed_at >= previous_committed
            assert abs(result.committed_at - datetime.now(UTC)) <= slack
            assert result.thread.updated_at == result.committed_at
            renewed = result.thread.lease
            assert renewed is not None
            assert renewed.renewed_at == result.committed_at
            assert renewed.expires_at - result.committed_at == timedelta(milliseconds=renewal_ms)
            assert renewed.acquired_at == committed_at
            previous_committed = result.committed_at
            version = result.thread.version
        # a real-clock lease is live now: another owner cannot take it
        _conflict(
            await store.commit_thread(
                b.update_at(scope, "t", version, {"lease": b.acquire("r1", "w2")}, root=b.root())
            ),
            version,
        )
