"""The in-memory reference: the commit and read pipelines over an aggregate.

:func:`apply_thread_changes` validates and applies a complete commit to a
:class:`~pai_storage.ThreadAggregate` by running the same pipeline every
backend runs (:func:`~pai_storage.backend.run_commit`) over in-memory
primitives, and :func:`read_aggregate` serves a read the same way.
Aggregate-style backends (one value per thread) call them under their own
lock, and the conformance suite runs :func:`apply_thread_changes` beside every
backend as the reference model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .aggregate import Entry, Family, FamilyName, ThreadAggregate
from .changes import FamilyWrite, record_id
from .families import FamilySpec
from .models import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ThreadReadResult,
    ThreadRecord,
    truncate_ms,
)
from .pipeline import (
    CommitTransaction,
    HeldThread,
    ReadHead,
    ReadSnapshot,
    RelationshipContext,
    run_commit,
    run_read,
    run_sync,
)
from .relationships import (
    RelationshipReader,
    assert_relationships,
    facts_from_aggregate,
)
from .roots import (
    apply_thread_root_update,
    assert_commit_input,
    check_condition,
    new_instance_id,
)
from .selection import ChildPagePlan, ReadPlan, Window

__all__ = [
    "AggregateSnapshot",
    "ApplyResult",
    "apply_thread_changes",
    "apply_thread_root_update",
    "assert_commit_input",
    "check_condition",
    "new_instance_id",
    "read_aggregate",
]


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """The outcome of :func:`apply_thread_changes`.

    ``aggregate`` is the state after the commit (``None`` after a delete), or
    the unchanged input state after a conflict.
    """

    result: CommittedResult | ConflictResult
    aggregate: ThreadAggregate | None


def _families(aggregate: ThreadAggregate | None) -> dict[FamilyName, Family[Any]]:
    if aggregate is None:
        return {"messages": Family(), "runs": Family(), "queuedItems": Family()}
    return {
        "messages": aggregate.messages,
        "runs": aggregate.runs,
        "queuedItems": aggregate.queued_items,
    }


def _rows(family: Family[Any], ids: Sequence[str]) -> dict[str, Entry[Any]]:
    return {i: entry for i in ids if (entry := family.get(i)) is not None}


class _AggregateTransaction(CommitTransaction):
    """Commit primitives over an aggregate; the result is built, never mutated in place."""

    def __init__(self, aggregate: ThreadAggregate | None, now: datetime, bounded: bool) -> None:
        self._before = aggregate
        self._now = now
        self._bounded = bounded
        self._families = _families(aggregate)
        self.root: ThreadRecord | None = None
        self.deleted = False

    async def hold(self) -> HeldThread:
        if self._before is None:
            return HeldThread(None)
        positions = {name: fam.next_position for name, fam in self._families.items()}
        return HeldThread(self._before.root, positions)

    async def server_time(self) -> datetime:
        return self._now

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        return _rows(self._families[spec.name], ids)

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        self.root = root
        for name, position in next_positions.items():
            fam = self._families[name]
            self._families[name] = Family(entries=fam.entries, next_position=position)

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        old = self._families[spec.name]
        entries = dict(old.entries)
        removed: set[str] = set()
        cut = write.truncate_after
        if cut is not None:
            # Scan only the cut tail: entries are kept in position order.
            for rid in reversed(old.entries):
                entry = old.entries[rid]
                if entry.position <= cut:
                    break
                del entries[rid]
                if entry.record.run_id is not None:
                    removed.add(entry.record.run_id)
        for rid in write.deletes:
            entries.pop(rid, None)
        entries.update(write.updates)
        for entry in write.inserts:
            entries[record_id(entry.record)] = entry
        self._families[spec.name] = Family(entries=entries, next_position=write.next_position)
        return removed

    async def delete_thread(self) -> None:
        self.deleted = True

    def result(self) -> ThreadAggregate | None:
        if self.deleted or self.root is None:
            return None
        return ThreadAggregate(
            root=self.root,
            messages=self._families["messages"],
            runs=self._families["runs"],
            queued_items=self._families["queuedItems"],
        )

    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        raise NotImplementedError  # pragma: no cover - check_relationships is overridden

    async def check_relationships(self, context: RelationshipContext) -> None:
        after = self.result()
        assert after is not None
        if self._bounded:
            context.plan.check_aggregate(after)
        else:
            assert_relationships(facts_from_aggregate(after))


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
        The provider's time, read while holding the thread. The commit time is
        this, truncated to milliseconds, or the thread's last commit time if
        that is later.
    instance_id:
        Source of fresh thread instance ids (for a create).
    bounded:
        Check the relationship rules only for the runs the commit can affect,
        trusting that ``aggregate`` obeys them, as every state a store
        committed does. The default checks every run: the reference model.

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
    tx = _AggregateTransaction(aggregate, truncate_ms(now), bounded)
    result = run_sync(run_commit(tx, commit, instance_id=instance_id))
    if isinstance(result, ConflictResult):
        return ApplyResult(result, aggregate)
    return ApplyResult(result, tx.result())


class AggregateSnapshot(ReadSnapshot):
    """Read primitives over an aggregate held in memory (or ``None``: missing)."""

    def __init__(self, aggregate: ThreadAggregate | None, observed_at: datetime) -> None:
        self._aggregate = aggregate
        self._observed_at = observed_at
        self._families = _families(aggregate)

    async def head(self) -> ReadHead:
        if self._aggregate is None:
            return ReadHead(self._observed_at, None)
        positions = {name: fam.next_position for name, fam in self._families.items()}
        return ReadHead(self._observed_at, self._aggregate.root, positions)

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        return _rows(self._families[spec.name], ids)

    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        return {i: e.position for i, e in _rows(self._families["messages"], message_ids).items()}

    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        entries: Iterable[Entry[Any]] = self._families[spec.name]
        if window.order == "newest":
            entries = reversed(list(entries))
        rows: list[tuple[int, Any]] = []
        for entry in entries:
            if window.contains(entry.position) and plan.matches(entry.record):
                rows.append((entry.position, entry.record))
                if len(rows) == window.fetch:
                    break
        return rows


def read_aggregate(
    aggregate: ThreadAggregate | None, plan: ReadPlan, observed_at: datetime
) -> ThreadReadResult:
    """Serve a planned read from an aggregate (``None``: the thread is missing)."""
    return run_sync(run_read(AggregateSnapshot(aggregate, observed_at), plan))
