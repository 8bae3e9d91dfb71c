"""Lease rules: the active-run lease is owner-fenced and expires on the provider clock.

A lease is *expired* at ``now`` when ``expires_at <= now``. The rules, each a
conflict (not an error) when false at commit time:

- ``acquire`` needs no unexpired lease (an expired one is replaced);
- ``renew`` needs an unexpired lease of the same run held by the same owner;
- ``release`` needs a lease of the same run held by the same owner, and with
  ``expiry="unexpired"`` it must also be unexpired.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from .models import AcquireLease, LeaseChange, ReleaseLease, RenewLease, ThreadLease

__all__ = ["LEASE_CONFLICT", "LeaseConflict", "apply_lease_change", "is_expired"]


class LeaseConflict:
    """Marker: the lease precondition of a commit is false."""

    def __repr__(self) -> str:
        return "LEASE_CONFLICT"


LEASE_CONFLICT: Final = LeaseConflict()


def is_expired(lease: ThreadLease, now: datetime) -> bool:
    return lease.expires_at <= now


def _holds(lease: ThreadLease | None, change: RenewLease | ReleaseLease) -> bool:
    return (
        lease is not None
        and lease.run_id == change.lease.run_id
        and lease.owner_id == change.lease_owner_id
    )


def apply_lease_change(
    current: ThreadLease | None, change: LeaseChange | None, now: datetime
) -> ThreadLease | LeaseConflict | None:
    """The lease after ``change`` at ``now``, or :data:`LEASE_CONFLICT`."""
    if change is None:
        return current
    if isinstance(change, AcquireLease):
        if current is not None and not is_expired(current, now):
            return LEASE_CONFLICT
        return ThreadLease(
            kind="run",
            run_id=change.lease.run_id,
            owner_id=change.lease_owner_id,
            operation=change.operation,
            acquired_at=now,
            expires_at=now + timedelta(milliseconds=change.duration_ms),
        )
    if isinstance(change, RenewLease):
        if current is None or not _holds(current, change) or is_expired(current, now):
            return LEASE_CONFLICT
        return ThreadLease.trusted(
            {
                **current.__dict__,
                "renewed_at": now,
                "expires_at": now + timedelta(milliseconds=change.duration_ms),
            }
        )
    if not _holds(current, change):
        return LEASE_CONFLICT
    assert current is not None
    if change.expiry == "unexpired" and is_expired(current, now):
        return LEASE_CONFLICT
    return None
