"""The in-memory reference: the commit and read pipelines over a thread held in memory.

:func:`apply_thread_changes` validates and applies a complete commit to a
:class:`~pai_storage.backend.ThreadAggregate` by running the same pipeline every
backend runs (:func:`~pai_storage.backend.run_commit`) over in-memory
primitives, and :func:`read_aggregate` serves a read the same way.
Aggregate-style backends (one value per thread) call them under their own
lock, and the conformance suite runs :func:`apply_thread_changes` beside every
backend as the reference model. It builds a new aggregate per commit: simple,
and O(thread size).

The memory backend runs the same pipeline through :class:`IndexedTransaction`
over an :class:`~pai_storage.aggregate.IndexedThread` it updates in place:
writes are staged and applied only once the commit is judged, and every
primitive costs the rows it names, so a commit costs the size of the change.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, TypeVar

from .aggregate import (
    Entry,
    Family,
    FamilyName,
    FamilyView,
    IndexedFamily,
    IndexedThread,
    ThreadAggregate,
)
from .changes import FamilyWrite, record_id
from .families import FamilySpec
from .fields import truncate_ms
from .models import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    Message,
    QueuedItem,
    RunRecord,
    ThreadReadResult,
    ThreadRecord,
)
from .pipeline import (
    CommitTransaction,
    HeldThread,
    ReadSnapshot,
    RelationshipContext,
    SnapshotRoot,
    run_commit,
    run_read,
    run_sync,
)
from .relationships import (
    OPEN_STATUSES,
    MessageRef,
    QueueRef,
    RelationshipReader,
    RunRef,
    RunRelations,
    assert_relationships,
    relations_from_aggregate,
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
    "IndexedTransaction",
    "apply_thread_changes",
    "apply_thread_root_update",
    "assert_commit_input",
    "check_condition",
    "new_instance_id",
    "read_aggregate",
]

R = TypeVar("R", Message, RunRecord, QueuedItem)


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


def _rows(family: FamilyView[Any], ids: Sequence[str]) -> dict[str, Entry[Any]]:
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
        # Never asked: check_relationships below reads the aggregate itself.
        raise TypeError("the aggregate transaction checks relationships on the aggregate")

    async def check_relationships(self, context: RelationshipContext) -> None:
        after = self.result()
        assert after is not None
        if self._bounded:
            context.check.check_aggregate(after)
        else:
            assert_relationships(relations_from_aggregate(after))


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


# ------------------------------------------------------------------ indexed commits


def _position(entry: Entry[Any]) -> int:
    return entry.position


def _count(positions: Sequence[int], first: int, last: int) -> int:
    """How many of the sorted ``positions`` lie in ``first..last``."""
    return max(0, bisect_right(positions, last) - bisect_left(positions, first))


class _StagedFamily(Generic[R]):
    """The post-commit view of one stored family: its rows with a staged write on top.

    A stored row is in the post-commit state unless the write touched its id
    (then ``final`` holds its post-commit entry, or ``None``) or a truncation
    cut it; every written entry is. Each question costs the rows it is about
    plus O(log n), never a scan of the family.
    """

    def __init__(self, stored: IndexedFamily[R], write: FamilyWrite[R] | None) -> None:
        self._stored: IndexedFamily[R] = stored
        self._final: Mapping[str, Entry[R] | None] = write.final if write is not None else {}
        self._cut = write.truncate_after if write is not None else None
        self._written: list[Entry[R]] = sorted(
            (e for e in self._final.values() if e is not None), key=_position
        )
        self._written_positions: list[int] = [e.position for e in self._written]
        self._touched_positions = sorted(
            old.position for rid in self._final if (old := stored.get(rid)) is not None
        )
        self._written_by_run: dict[str | None, list[Entry[R]]] = {}
        for entry in self._written:
            self._written_by_run.setdefault(entry.record.run_id, []).append(entry)

    def _kept(self, entry: Entry[R]) -> bool:
        """Whether a stored row is in the post-commit state as it is."""
        cut = self._cut
        return (cut is None or entry.position <= cut) and (
            self._stored.record_id(entry) not in self._final
        )

    def get(self, record_id: str) -> Entry[R] | None:
        if record_id in self._final:
            return self._final[record_id]
        entry = self._stored.get(record_id)
        return entry if entry is not None and self._kept(entry) else None

    def run_rows(self, run_id: str) -> list[Entry[R]]:
        """The post-commit rows naming ``run_id``, in position order."""
        rows = [e for e in self._stored.run_rows(run_id) if self._kept(e)]
        written = self._written_by_run.get(run_id)
        if written:
            rows.extend(written)
            rows.sort(key=_position)
        return rows

    def count_between(self, first: int, last: int) -> int:
        """How many post-commit rows have ``first <= position <= last``."""
        kept_last = last if self._cut is None else min(last, self._cut)
        return (
            self._stored.count_between(first, kept_last)
            - _count(self._touched_positions, first, kept_last)
            + _count(self._written_positions, first, last)
        )

    def last(self) -> Entry[R] | None:
        """The post-commit row with the highest position."""
        written = self._written[-1] if self._written else None
        upper = self._stored.next_position if self._cut is None else self._cut + 1
        # Skips at most the touched rows before finding a kept one.
        for entry in self._stored.between(0, upper, newest=True):
            if self._kept(entry):
                if written is None or entry.position > written.position:
                    return entry
                break
        return written

    def open_runs(self) -> list[Entry[R]]:
        """The post-commit ``running``/``waiting`` runs, in position order."""
        rows = [e for e in self._stored.open_runs() if self._kept(e)]
        rows.extend(
            e
            for e in self._written
            if isinstance(e.record, RunRecord) and e.record.status in OPEN_STATUSES
        )
        rows.sort(key=_position)
        return rows


class _StagedReader:
    """The relationship check's queries, answered from the stored thread plus staged writes."""

    def __init__(
        self,
        stored: Mapping[FamilyName, IndexedFamily[Any]],
        writes: Mapping[FamilyName, FamilyWrite[Any]],
    ) -> None:
        self._messages = _StagedFamily[Message](stored["messages"], writes.get("messages"))
        self._runs = _StagedFamily[RunRecord](stored["runs"], writes.get("runs"))
        self._items = _StagedFamily[QueuedItem](stored["queuedItems"], writes.get("queuedItems"))

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        facts: dict[str, RunRelations] = {}
        for run_id in run_ids:
            run = self._runs.get(run_id)
            messages = self._messages.run_rows(run_id)
            foreign = bool(messages) and self._messages.count_between(
                messages[0].position, messages[-1].position
            ) != len(messages)
            facts[run_id] = RunRelations(
                RunRef.of(run.record) if run is not None else None,
                [MessageRef.of(e.position, e.record) for e in messages],
                foreign,
                [QueueRef.of(e.record) for e in self._items.run_rows(run_id)],
            )
        return facts

    async def open_runs(self) -> Sequence[RunRef]:
        return [RunRef.of(e.record) for e in self._runs.open_runs()]

    async def tail(self) -> MessageRef | None:
        last = self._messages.last()
        return MessageRef.of(last.position, last.record) if last is not None else None


class IndexedTransaction(CommitTransaction):
    """Commit primitives over an :class:`~pai_storage.aggregate.IndexedThread` that stage writes.

    Nothing touches the stored thread until :meth:`apply`, which the caller
    runs only after :func:`~pai_storage.backend.run_commit` returned a
    committed result: a conflict or an error leaves the thread as it was,
    without having copied it. Rows are loaded by id, a truncation reads only
    the rows it removes, and the relationship check reads the post-commit
    state of the runs it names through the stored rows with the staged writes
    on top. A commit costs the rows it changes plus the rows of the runs it
    affects (each O(log n)), however long the thread is.

    Parameters
    ----------
    thread:
        The stored thread, or ``None`` when it does not exist.
    now:
        The provider's time (returned by :meth:`server_time`).
    """

    def __init__(self, thread: IndexedThread | None, now: datetime) -> None:
        self._thread = thread
        self._now = now
        # A missing thread answers from empty families, which a create then fills.
        self._families: dict[FamilyName, IndexedFamily[Any]] = (
            {
                "messages": IndexedFamily[Message]("message_id"),
                "runs": IndexedFamily[RunRecord]("run_id"),
                "queuedItems": IndexedFamily[QueuedItem]("queue_item_id"),
            }
            if thread is None
            else {
                "messages": thread.messages,
                "runs": thread.runs,
                "queuedItems": thread.queued_items,
            }
        )
        self._root: ThreadRecord | None = None
        self._positions: Mapping[FamilyName, int] = {}
        self._writes: dict[FamilyName, FamilyWrite[Any]] = {}
        self._deleted = False

    async def hold(self) -> HeldThread:
        if self._thread is None:
            return HeldThread(None)
        positions = {name: fam.next_position for name, fam in self._families.items()}
        return HeldThread(self._thread.root, positions)

    async def server_time(self) -> datetime:
        return self._now

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        return _rows(self._families[spec.name], ids)

    async def write_root(
        self, root: ThreadRecord, next_positions: Mapping[FamilyName, int], *, created: bool
    ) -> None:
        self._root = root
        self._positions = dict(next_positions)

    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        self._writes[spec.name] = write
        if write.truncate_after is None:
            return ()
        removed = self._families[spec.name].after(write.truncate_after)
        return {rid for e in removed if (rid := e.record.run_id) is not None}

    async def delete_thread(self) -> None:
        self._deleted = True

    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        return _StagedReader(self._families, context.writes)

    def apply(self) -> IndexedThread | None:
        """Apply the staged writes to the stored thread; the thread after the commit.

        Call only when the pipeline returned a committed result. Returns
        ``None`` after a delete, the stored thread (updated in place) after an
        update, and a new thread after a create.
        """
        if self._deleted:
            return None
        if self._root is None:
            raise RuntimeError("apply() called before the pipeline wrote the root")
        for name, family in self._families.items():
            write = self._writes.get(name)
            if write is not None:
                family.apply(write)
            family.next_position = self._positions[name]
        if self._thread is None:
            return IndexedThread(
                self._root,
                self._families["messages"],
                self._families["runs"],
                self._families["queuedItems"],
            )
        self._thread.root = self._root
        return self._thread


class AggregateSnapshot(ReadSnapshot):
    """Read primitives over a thread held in memory (or ``None``: missing).

    Serves a :class:`~pai_storage.backend.ThreadAggregate` or the memory store's
    :class:`~pai_storage.aggregate.IndexedThread` alike; a page costs what its
    family's :meth:`~pai_storage.aggregate.FamilyView.between` costs.
    """

    def __init__(
        self, aggregate: ThreadAggregate | IndexedThread | None, observed_at: datetime
    ) -> None:
        self._aggregate = aggregate
        self._observed_at = observed_at
        self._families: Mapping[FamilyName, FamilyView[Any]] = (
            _families(None)
            if aggregate is None
            else {
                "messages": aggregate.messages,
                "runs": aggregate.runs,
                "queuedItems": aggregate.queued_items,
            }
        )

    async def head(self) -> SnapshotRoot:
        if self._aggregate is None:
            return SnapshotRoot(self._observed_at, None)
        positions = {name: fam.next_position for name, fam in self._families.items()}
        return SnapshotRoot(self._observed_at, self._aggregate.root, positions)

    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        return _rows(self._families[spec.name], ids)

    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        return {i: e.position for i, e in _rows(self._families["messages"], message_ids).items()}

    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        return plan.scan(self._families[spec.name], window)

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        # The reference answer of the one-request primitive: the window capped
        # by the family's counter in the same state as the head.
        head = await self.head()
        if head.root is None:
            return head, ()
        capped = replace(window, upper=min(window.upper, head.next_positions[spec.name]))
        return head, plan.scan(self._families[spec.name], capped)


def read_aggregate(
    aggregate: ThreadAggregate | IndexedThread | None, plan: ReadPlan, observed_at: datetime
) -> ThreadReadResult:
    """Serve a read plan from a thread held in memory (``None``: it is missing)."""
    return run_sync(run_read(AggregateSnapshot(aggregate, observed_at), plan))
