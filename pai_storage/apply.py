"""Commit semantics as pure functions: the reference model of SPEC section 8.

:func:`apply_thread_changes` validates and applies a complete commit to an
in-memory aggregate. Aggregate-style backends call it under their own lock, and
the conformance suite runs it beside every backend as the reference model.

Every commit is judged in the same order, by every backend:

1. the input is well formed (:func:`assert_commit_input`), else an invariant error;
2. the condition holds (thread missing for a create, the exact version for an
   update or delete), else a conflict;
3. the child changes apply mechanically (messages, then runs, then queued
   items, each in list order), else an invariant error;
4. the lease precondition holds, else a conflict;
5. the post-commit state obeys every relationship rule, else an invariant error.

Nothing is applied unless all five pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .aggregate import Family, ThreadAggregate
from .changes import (
    FamilyWrite,
    apply_family_changes,
    change_ids,
    record_id,
    stamp_message,
    stamp_queued_item,
    stamp_run,
)
from .errors import ThreadStoreInvariantError
from .leases import LeaseConflict, apply_lease_change
from .models import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    CreateMutation,
    DeleteMutation,
    ThreadChanges,
    ThreadLease,
    ThreadRecord,
    ThreadVersion,
    truncate_ms,
)
from .relationships import (
    assert_relationships,
    facts_from_aggregate,
    plan_relationship_validation,
)

__all__ = [
    "ApplyResult",
    "apply_thread_changes",
    "apply_thread_root_update",
    "assert_commit_input",
    "check_condition",
    "new_instance_id",
]


def new_instance_id() -> str:
    """A fresh thread instance id (random UUID, hex)."""
    return uuid.uuid4().hex


def assert_commit_input(commit: CommitThreadInput | Mapping[str, Any]) -> CommitThreadInput:
    """Validate a commit input mechanically and return it as a model.

    Accepts the model or its JSON form. Raises :class:`ThreadStoreInvariantError`
    (or :class:`ThreadStoreSerializationError` for a value that is not strict
    JSON) naming the path of the first problem.
    """
    if isinstance(commit, CommitThreadInput):
        return commit
    if not isinstance(commit, Mapping):
        raise ThreadStoreInvariantError(
            f"a commit input must be a CommitThreadInput or its JSON form, "
            f"not {type(commit).__name__}"
        )
    return CommitThreadInput.model_validate(commit)


def check_condition(
    commit: CommitThreadInput, current: ThreadVersion | None
) -> ConflictResult | None:
    """The conflict for a false commit condition, or ``None`` when it holds."""
    if commit.condition.type == "missing":
        if current is None:
            return None
    elif current is not None and current == commit.condition.version:
        return None
    return ConflictResult(type="conflict", current_version=current)


def apply_thread_root_update(
    previous: ThreadRecord | None,
    commit: CommitThreadInput,
    now: datetime,
    lease: ThreadLease | None,
    instance_id: Callable[[], str] = new_instance_id,
) -> ThreadRecord:
    """Stamp the root a create or update commits at ``now`` (normalized backends).

    A create gets revision 1 and a fresh instance id; an update keeps the
    creation-only fields, replaces every mutable one (an omitted ``category``
    or ``title`` is removed) and adds 1 to the revision. ``updated_at`` is
    ``now`` either way.
    """
    mutation = commit.mutation
    if isinstance(mutation, DeleteMutation):
        raise ValueError("a delete commits no root")
    root = mutation.root
    if isinstance(mutation, CreateMutation):
        return ThreadRecord.model_construct(
            scope_key=commit.scope_key,
            thread_id=commit.thread_id,
            version=ThreadVersion.model_construct(thread_instance_id=instance_id(), revision=1),
            agent=mutation.root.agent,
            direct_execution_allowed=mutation.root.direct_execution_allowed,
            parent_thread_id=mutation.root.parent_thread_id,
            list_visibility=root.list_visibility,
            category=root.category,
            title=root.title,
            metadata=root.metadata,
            private_metadata=root.private_metadata,
            lease=lease,
            created_at=now,
            updated_at=now,
        )
    if previous is None:
        raise ValueError("an update needs the previous root")
    return previous.model_copy(
        update={
            "version": ThreadVersion.model_construct(
                thread_instance_id=previous.version.thread_instance_id,
                revision=previous.version.revision + 1,
            ),
            "list_visibility": root.list_visibility,
            "category": root.category,
            "title": root.title,
            "metadata": root.metadata,
            "private_metadata": root.private_metadata,
            "lease": lease,
            "updated_at": now,
        }
    )


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """The outcome of :func:`apply_thread_changes`.

    ``aggregate`` is the state after the commit (``None`` after a delete), or
    the unchanged input state after a conflict.
    """

    result: CommittedResult | ConflictResult
    aggregate: ThreadAggregate | None


def _apply_family(family: Family[Any], write: FamilyWrite[Any]) -> Family[Any]:
    entries = dict(family.entries)
    if write.truncate_after is not None:
        cut = write.truncate_after
        entries = {k: e for k, e in entries.items() if e.position <= cut}
    for rid in write.deletes:
        entries.pop(rid, None)
    for rid, entry in write.updates.items():
        entries[rid] = entry
    for entry in write.inserts:
        entries[record_id(entry.record)] = entry
    return Family(entries=entries, next_position=write.next_position)


def _previous_runs(family: Family[Any], changes: Sequence[Any] | None) -> dict[str, Any]:
    """The run ids, before the commit, of the existing records the changes name."""
    return {
        rid: entry.record.run_id
        for rid in change_ids(changes)
        if (entry := family.get(rid)) is not None
    }


def _truncated(
    family: Family[Any], write: FamilyWrite[Any], key: Callable[[Any], str | None]
) -> set[str]:
    """``key`` of every previous record a truncation removed (scans only the cut tail)."""
    found: set[str] = set()
    cut = write.truncate_after
    if cut is None:
        return found
    entries = family.entries
    for rid in reversed(entries):
        entry = entries[rid]
        if entry.position <= cut:
            break
        if (value := key(entry.record)) is not None:
            found.add(value)
    return found


def apply_thread_changes(
    aggregate: ThreadAggregate | None,
    commit: CommitThreadInput | Mapping[str, Any],
    now: datetime,
    *,
    instance_id: Callable[[], str] = new_instance_id,
    bounded: bool = False,
) -> ApplyResult:
    """Validate and apply a complete commit to an aggregate (the reference model).

    Parameters
    ----------
    aggregate:
        The thread's current state, or ``None`` when it does not exist. It is
        not modified.
    commit:
        The commit input (model or JSON form).
    now:
        The commit time from the provider's clock, read while holding the
        thread; truncated to milliseconds.
    instance_id:
        Source of fresh thread instance ids (for a create).
    bounded:
        Check the relationship rules only for the runs the commit can affect
        (:func:`plan_relationship_validation`), trusting that ``aggregate``
        obeys them, as every state a store committed does. The default checks
        every run: the reference model.

    Returns
    -------
    ApplyResult
        The committed result and new aggregate, or the conflict.

    Raises
    ------
    ThreadStoreInvariantError
        For a malformed input, a mechanical change error or a broken
        relationship rule; nothing is applied.
    """
    commit = assert_commit_input(commit)
    now = truncate_ms(now)
    current = aggregate.root if aggregate is not None else None
    conflict = check_condition(commit, current.version if current else None)
    if conflict is not None:
        return ApplyResult(conflict, aggregate)
    mutation = commit.mutation
    if isinstance(mutation, DeleteMutation):
        return ApplyResult(CommittedResult(type="committed", thread=None, committed_at=now), None)

    old_messages: Family[Any] = aggregate.messages if aggregate else Family()
    old_runs: Family[Any] = aggregate.runs if aggregate else Family()
    old_queued: Family[Any] = aggregate.queued_items if aggregate else Family()
    changes = mutation.changes or ThreadChanges()
    messages = apply_family_changes(
        "messages",
        changes.messages,
        old_messages.entries,
        old_messages.next_position,
        now,
        stamp_message,
    )
    runs = apply_family_changes(
        "runs", changes.runs, old_runs.entries, old_runs.next_position, now, stamp_run
    )
    queued = apply_family_changes(
        "queuedItems",
        changes.queued_items,
        old_queued.entries,
        old_queued.next_position,
        now,
        stamp_queued_item,
    )
    lease = apply_lease_change(current.lease if current else None, changes.lease, now)
    if isinstance(lease, LeaseConflict):
        return ApplyResult(
            ConflictResult(type="conflict", current_version=current.version if current else None),
            aggregate,
        )
    root = apply_thread_root_update(current, commit, now, lease, instance_id)
    result = ThreadAggregate(
        root=root,
        messages=_apply_family(old_messages, messages),
        runs=_apply_family(old_runs, runs),
        queued_items=_apply_family(old_queued, queued),
    )
    if bounded:
        plan_relationship_validation(
            changes,
            previous_message_runs=_previous_runs(old_messages, changes.messages),
            previous_item_runs=_previous_runs(old_queued, changes.queued_items),
            truncated_message_runs=_truncated(old_messages, messages, lambda r: r.run_id),
            truncated_run_ids=_truncated(old_runs, runs, lambda r: r.run_id),
            lease=lease,
        ).check_aggregate(result)
    else:
        assert_relationships(facts_from_aggregate(result))
    return ApplyResult(CommittedResult(type="committed", thread=root, committed_at=now), result)
