"""Lease rules (docs/commits.md#leases), through the pure ``apply_thread_changes``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pai_storage import CommitThreadInput
from pai_storage import builders as b
from pai_storage.backend import (
    LEASE_CONFLICT,
    ThreadAggregate,
    apply_lease_change,
    apply_thread_changes,
    is_expired,
)
from pai_storage.errors import ThreadStoreInvariantError

T0 = datetime(2030, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def _thread(lease: dict[str, Any] | None = None, now: datetime = T0) -> ThreadAggregate:
    changes: dict[str, Any] = {
        "runs": [
            {"type": "insert", "record": b.run("r1", "running")},
            {"type": "insert", "record": b.run("r0", "completed")},
        ]
    }
    if lease is not None:
        changes["lease"] = lease
    outcome = apply_thread_changes(None, b.create("s", "t", changes), now)
    assert outcome.result.type == "committed"
    assert outcome.aggregate is not None
    return outcome.aggregate


def _commit(agg: ThreadAggregate, lease: dict[str, Any], now: datetime) -> Any:
    return apply_thread_changes(
        agg, b.update_at("s", "t", agg.root.version, {"lease": lease}, root=b.root()), now
    )


def _leased(owner: str = "w1", ms: int = 1000) -> ThreadAggregate:
    return _thread(b.acquire("r1", owner, ms=ms, operation="send"))


def _assert_conflict(agg: ThreadAggregate, outcome: Any) -> None:
    assert outcome.result.type == "conflict"
    assert outcome.result.current_version == agg.root.version
    assert outcome.aggregate is agg
    assert agg.root.version.revision == 1


# ---------------------------------------------------------------- acquire


def test_acquire_without_lease() -> None:
    agg = _leased(ms=1500)
    lease = agg.root.lease
    assert lease is not None
    assert (lease.kind, lease.run_id, lease.owner_id, lease.operation) == (
        "run",
        "r1",
        "w1",
        "send",
    )
    assert lease.acquired_at == T0
    assert lease.expires_at == T0 + 1500 * MS
    assert lease.renewed_at is None
    assert "renewedAt" not in lease.to_json()


@pytest.mark.parametrize("owner", ["w1", "w2"])
def test_acquire_while_unexpired_lease_conflicts(owner: str) -> None:
    agg = _leased(ms=1000)
    _assert_conflict(agg, _commit(agg, b.acquire("r1", owner), T0 + 999 * MS))


def test_acquire_replaces_lease_expiring_exactly_now() -> None:
    agg = _leased(ms=1000)
    now = T0 + 1000 * MS
    outcome = _commit(agg, b.acquire("r1", "w2", ms=50, operation="resume"), now)
    assert outcome.result.type == "committed"
    lease = outcome.aggregate.root.lease
    assert (lease.owner_id, lease.operation, lease.acquired_at) == ("w2", "resume", now)
    assert lease.expires_at == now + 50 * MS


def test_create_with_acquire_and_max_duration() -> None:
    agg = _thread(b.acquire("r1", "w1", ms=86_400_000))
    assert agg.root.lease.expires_at == T0 + timedelta(days=1)


# ---------------------------------------------------------------- renew


def test_renew_by_holder() -> None:
    agg = _leased(ms=1000)
    now = T0 + 999 * MS
    outcome = _commit(agg, b.renew("r1", "w1", ms=2000), now)
    assert outcome.result.type == "committed"
    lease = outcome.aggregate.root.lease
    assert lease.acquired_at == T0
    assert lease.renewed_at == now
    assert lease.expires_at == now + 2000 * MS
    assert lease.owner_id == "w1"
    assert lease.operation == "send"


def test_renew_of_lease_expiring_exactly_now_conflicts() -> None:
    agg = _leased(ms=1000)
    _assert_conflict(agg, _commit(agg, b.renew("r1", "w1"), T0 + 1000 * MS))


@pytest.mark.parametrize(("run_id", "owner"), [("r1", "w2"), ("r0", "w1"), ("r9", "w1")])
def test_renew_fenced_by_owner_and_run(run_id: str, owner: str) -> None:
    agg = _leased()
    _assert_conflict(agg, _commit(agg, b.renew(run_id, owner), T0 + MS))


def test_renew_without_lease_conflicts() -> None:
    agg = _thread()
    _assert_conflict(agg, _commit(agg, b.renew("r1", "w1"), T0 + MS))


def test_renew_on_create_conflicts_with_null_version() -> None:
    outcome = apply_thread_changes(
        None,
        b.create(
            "s",
            "t",
            {"runs": [{"type": "insert", "record": b.run("r1")}], "lease": b.renew("r1", "w1")},
        ),
        T0,
    )
    assert outcome.result.type == "conflict"
    assert outcome.result.current_version is None
    assert outcome.aggregate is None


# ---------------------------------------------------------------- release


@pytest.mark.parametrize("expiry", ["unexpired", "any"])
def test_release_unexpired_by_holder(expiry: str) -> None:
    agg = _leased(ms=1000)
    outcome = _commit(agg, b.release("r1", "w1", expiry), T0 + 999 * MS)
    assert outcome.result.type == "committed"
    assert outcome.aggregate.root.lease is None
    assert "lease" not in outcome.result.thread.to_json()


def test_release_unexpired_of_lease_expiring_exactly_now_conflicts() -> None:
    agg = _leased(ms=1000)
    _assert_conflict(agg, _commit(agg, b.release("r1", "w1", "unexpired"), T0 + 1000 * MS))


def test_release_any_of_expired_lease() -> None:
    agg = _leased(ms=1000)
    outcome = _commit(agg, b.release("r1", "w1", "any"), T0 + 5000 * MS)
    assert outcome.result.type == "committed"
    assert outcome.aggregate.root.lease is None


@pytest.mark.parametrize("expiry", ["unexpired", "any"])
@pytest.mark.parametrize(("run_id", "owner"), [("r1", "w2"), ("r0", "w1")])
def test_release_fenced_by_owner_and_run(run_id: str, owner: str, expiry: str) -> None:
    agg = _leased()
    _assert_conflict(agg, _commit(agg, b.release(run_id, owner, expiry), T0 + MS))


def test_release_without_lease_conflicts() -> None:
    agg = _thread()
    _assert_conflict(agg, _commit(agg, b.release("r1", "w1", "any"), T0))


# ---------------------------------------------------------------- interplay


def test_lease_survives_commits_without_lease_change() -> None:
    agg = _leased()
    outcome = apply_thread_changes(
        agg, b.update_at("s", "t", agg.root.version, root=b.root(title="x")), T0 + MS
    )
    assert outcome.result.type == "committed"
    assert outcome.aggregate.root.lease == agg.root.lease


def test_lease_conflict_applies_nothing_even_with_other_changes() -> None:
    agg = _leased()
    changes = {
        "messages": [{"type": "insert", "record": b.message("m1", run_id="r1", relation="output")}],
        "lease": b.acquire("r1", "w2"),
    }
    outcome = apply_thread_changes(
        agg, b.update_at("s", "t", agg.root.version, changes, root=b.root()), T0 + MS
    )
    _assert_conflict(agg, outcome)
    assert len(agg.messages) == 0


def test_mechanical_error_is_raised_before_lease_is_judged() -> None:
    agg = _leased()
    changes = {"messages": [{"type": "delete", "id": "nope"}], "lease": b.acquire("r1", "w2")}
    with pytest.raises(ThreadStoreInvariantError, match="does not exist"):
        apply_thread_changes(
            agg, b.update_at("s", "t", agg.root.version, changes, root=b.root()), T0 + MS
        )


def test_is_expired_boundary_and_apply_lease_change() -> None:
    lease = _leased(ms=10).root.lease
    assert not is_expired(lease, T0 + 9 * MS)
    assert is_expired(lease, T0 + 10 * MS)
    assert apply_lease_change(lease, None, T0) is lease
    agg = _leased(ms=10)
    commit = b.update_at(
        "s", "t", agg.root.version, {"lease": b.acquire("r1", "w2")}, root=b.root()
    )
    parsed = CommitThreadInput.model_validate(commit)
    assert apply_lease_change(lease, parsed.mutation.changes.lease, T0 + 9 * MS) is LEASE_CONFLICT
    replaced = apply_lease_change(lease, parsed.mutation.changes.lease, T0 + 10 * MS)
    assert replaced is not LEASE_CONFLICT
    assert replaced.owner_id == "w2"
