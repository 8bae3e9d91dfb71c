"""The commit and read pipelines: the judgement every backend runs, written once.

A backend does not re-implement the contract. It implements a few primitives
over its database — a :class:`CommitTransaction` for one commit, a
:class:`ReadSnapshot` for one read — and hands them to :func:`run_commit` and
:func:`run_read`, which run the whole algorithm in one fixed order. The
in-memory reference (:func:`pai_storage.backend.apply_thread_changes`) runs the very
same pipeline over an aggregate, so a backend and the reference can only
disagree about what their primitives return, never about the rules.

Every commit is judged in this order (``docs/commits.md``):

1. hold the thread (:meth:`CommitTransaction.hold`) and check the condition
   (thread missing for a create, the exact version for an update or delete),
   else a conflict;
2. read the commit time while holding the thread, never earlier than the
   thread's last commit (``committed_at`` never goes backwards in a thread);
3. apply each family's changes mechanically (messages, runs, queued items,
   each in list order) to the rows they name, else an invariant error;
4. check the lease precondition, else a conflict;
5. stamp the root, write the families and the root;
6. check the relationship rules on the post-commit state, through bounded
   queries the backend answers, else an invariant error.

The backend owns the transaction around the pipeline: it commits when
:func:`run_commit` returns a :class:`~pai_storage.CommittedResult` and rolls
back on a :class:`~pai_storage.ConflictResult` or an exception. Nothing is
applied unless every step passes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from .aggregate import Entry, FamilyName
from .changes import FamilyWrite, apply_family_changes, change_ids
from .families import FAMILIES, FamilySpec, family
from .fields import truncate_ms
from .leases import LeaseConflict, apply_lease_change
from .models import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    DeleteMutation,
    ThreadChanges,
    ThreadLease,
    ThreadPage,
    ThreadReadResult,
    ThreadRecord,
    ThreadVersion,
)
from .relationships import RelationshipCheck, RelationshipReader, relationship_check
from .roots import apply_thread_root_update, check_condition, new_instance_id
from .selection import ChildPagePlan, IdsPlan, ReadPlan, Window

__all__ = [
    "CommitTransaction",
    "HeldThread",
    "ReadSnapshot",
    "RelationshipContext",
    "SnapshotRoot",
    "ThreadConflict",
    "commit_time",
    "named_ids",
    "run_commit",
    "run_read",
    "run_sync",
]

T = TypeVar("T")

_NO_POSITIONS: Mapping[FamilyName, int] = {"messages": 1, "runs": 1, "queuedItems": 1}


# ------------------------------------------------------------------ commits


@dataclass(frozen=True, slots=True)
class HeldThread:
    """What :meth:`CommitTransaction.hold` found.

    Attributes
    ----------
    root:
        The stored root, or ``None`` when the thread does not exist.
    next_positions:
        Each family's position counter (the next position to assign); all 1
        for a missing thread.
    """

    root: ThreadRecord | None
    next_positions: Mapping[FamilyName, int] = field(default_factory=lambda: _NO_POSITIONS)
    rows: Mapping[FamilyName, Mapping[str, Entry[Any]]] | None = None
    """The stored rows the commit's changes name (:func:`named_ids`), when the
    hold read them with the root; ``None``: the pipeline loads them through
    :meth:`CommitTransaction.load_rows`."""


def named_ids(changes: ThreadChanges | None) -> dict[FamilyName, list[str]]:
    """The record ids each family's changes name, sorted: the rows a commit loads.

    A backend that reads them with the root in :meth:`CommitTransaction.hold`
    (one round trip fewer) returns them in :attr:`HeldThread.rows`.
    """
    changes = changes or ThreadChanges()
    return {spec.name: sorted(change_ids(spec.changes(changes))) for spec in FAMILIES}


class ThreadConflict(Exception):
    """Raised by a primitive when the database itself finds the condition false.

    For example a create whose root insert finds that a concurrent create won
    the key. :func:`run_commit` turns it into a
    :class:`~pai_storage.ConflictResult` with ``current``.
    """

    def __init__(self, current: ThreadVersion | None = None) -> None:
        super().__init__("the commit's condition is false")
        self.current = current


@dataclass(frozen=True, slots=True)
class RelationshipContext:
    """What a backend may use to answer the relationship check cheaply.

    Attributes
    ----------
    check:
        The runs to check and whether the tail rule needs a look.
    changes:
        The commit's changes.
    writes:
        Each family's net write, as applied.
    lease:
        The lease after the commit.
    """

    check: RelationshipCheck
    changes: ThreadChanges
    writes: Mapping[FamilyName, FamilyWrite[Any]]
    lease: ThreadLease | None


class CommitTransaction(ABC):
    """One commit's primitives over one thread, inside the backend's transaction.

    Every method acts on the thread the commit names, inside one transaction
    (or under one lock): reads see the transaction's own earlier writes.
    """

    @abstractmethod
    async def hold(self) -> HeldThread:
        """Hold the thread against concurrent commits and return its stored state.

        A row lock, a conditional write of the root or a per-thread lock:
        whatever makes this commit the only one that can apply to the version
        it read. For an update or delete a backend may hold the root only when
        it is at the expected version; it still returns the stored root (or
        ``None``) so the conflict can report it.

        It may also return the rows the changes name (:func:`named_ids`) in
        :attr:`HeldThread.rows`; they must be the rows of the returned root's
        version. Rows read before a wait for the lock are not, when the commit
        waited for moved the root: a client that pipelines its commits can
        name the version that commit wrote. Return ``rows=None`` then, and the
        pipeline loads them.
        """

    @abstractmethod
    async def server_time(self) -> datetime:
        """The provider's clock, read while holding the thread (called once).

        Not called when the store runs on a test clock.
        """

    @abstractmethod
    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        """The stored rows of one family with these ids (missing ids omitted)."""

    @abstractmethod
    async def write_root(
        self,
        root: ThreadRecord,
        next_positions: Mapping[FamilyName, int],
        *,
        created: bool,
    ) -> None:
        """Write the stamped root and the families' counters.

        ``created`` is true for a create. Raise :class:`ThreadConflict` when
        the database finds the key taken by a concurrent create.
        """

    @abstractmethod
    async def write_family(self, spec: FamilySpec, write: FamilyWrite[Any]) -> Iterable[str]:
        """Apply one family's net write; return the run ids a truncation removed.

        Apply in the order :class:`~pai_storage.backend.FamilyWrite` documents:
        truncation, deletes, updates, inserts. The returned ids are, for
        messages, the run ids of the removed messages (standalone ones
        omitted); for runs, the removed runs' ids; empty without a truncation.
        """

    @abstractmethod
    async def delete_thread(self) -> None:
        """Remove the thread's root and every one of its child records."""

    @abstractmethod
    def relationship_reader(self, context: RelationshipContext) -> RelationshipReader:
        """Bounded post-commit queries for the relationship check."""

    async def check_relationships(self, context: RelationshipContext) -> None:
        """Assert the relationship rules on the post-commit state.

        The default loads only the facts the check names through
        :meth:`relationship_reader`; the in-memory reference overrides it.
        """
        await context.check.check(self.relationship_reader(context))


def commit_time(server_time: datetime, previous: ThreadRecord | None) -> datetime:
    """The commit time: the provider's time, never before the thread's last commit."""
    now = truncate_ms(server_time)
    if previous is not None and now < previous.updated_at:
        return previous.updated_at
    return now


async def run_commit(
    tx: CommitTransaction,
    commit: CommitThreadInput,
    *,
    clock: Callable[[], datetime | None] | None = None,
    instance_id: Callable[[], str] = new_instance_id,
) -> CommittedResult | ConflictResult:
    """Judge and apply one validated commit through a backend's primitives.

    Parameters
    ----------
    tx:
        The backend's primitives for this commit, inside its transaction.
    commit:
        The validated commit input.
    clock:
        The store's test clock reader (pass :meth:`ThreadStore.now`), called
        once the thread is held: a commit that waited for the thread judges
        leases at the moment it applies. When it gives ``None`` (no test
        clock), the provider's clock is read through
        :meth:`CommitTransaction.server_time`.
    instance_id:
        Source of fresh thread instance ids (for a create).

    Returns
    -------
    CommittedResult or ConflictResult
        The backend commits its transaction on the first and rolls back on
        the second.

    Raises
    ------
    ThreadStoreInvariantError
        A mechanical change error or a broken relationship rule.
    """
    try:
        return await _judge(tx, commit, clock, instance_id)
    except ThreadConflict as conflict:
        return ConflictResult(type="conflict", current_version=conflict.current)


async def _judge(
    tx: CommitTransaction,
    commit: CommitThreadInput,
    clock: Callable[[], datetime | None] | None,
    instance_id: Callable[[], str],
) -> CommittedResult | ConflictResult:
    held = await tx.hold()
    previous = held.root
    conflict = check_condition(commit, previous.version if previous else None)
    if conflict is not None:
        return conflict
    test_now = clock() if clock is not None else None
    now = commit_time(test_now if test_now is not None else await tx.server_time(), previous)
    mutation = commit.mutation
    if isinstance(mutation, DeleteMutation):
        await tx.delete_thread()
        return CommittedResult.trusted({"type": "committed", "thread": None, "committed_at": now})

    changes = mutation.changes or ThreadChanges()
    loaded: dict[FamilyName, Mapping[str, Entry[Any]]] = {}
    writes: dict[FamilyName, FamilyWrite[Any]] = {}
    for spec in FAMILIES:
        named = spec.changes(changes)
        if previous is None:
            loaded[spec.name] = {}
        elif held.rows is not None:
            loaded[spec.name] = held.rows.get(spec.name, {})
        else:
            ids = sorted(change_ids(named))
            loaded[spec.name] = await tx.load_rows(spec, ids) if ids else {}
        writes[spec.name] = apply_family_changes(
            spec.name, named, loaded[spec.name], held.next_positions[spec.name], now
        )
    lease = apply_lease_change(previous.lease if previous else None, changes.lease, now)
    if isinstance(lease, LeaseConflict):
        return ConflictResult(
            type="conflict", current_version=previous.version if previous else None
        )
    root = apply_thread_root_update(previous, commit, now, lease, instance_id)
    counters = {name: write.next_position for name, write in writes.items()}
    await tx.write_root(root, counters, created=previous is None)
    truncated: dict[FamilyName, list[str]] = {}
    for spec in FAMILIES:
        write = writes[spec.name]
        if write.changed:
            truncated[spec.name] = list(await tx.write_family(spec, write))
    check = relationship_check(
        changes,
        previous_message_runs={k: e.record.run_id for k, e in loaded["messages"].items()},
        previous_item_runs={k: e.record.run_id for k, e in loaded["queuedItems"].items()},
        truncated_message_runs=truncated.get("messages", ()),
        truncated_run_ids=truncated.get("runs", ()),
        lease=lease,
    )
    await tx.check_relationships(RelationshipContext(check, changes, writes, lease))
    # The root and the time were stamped here: no second validation of the result.
    return CommittedResult.trusted({"type": "committed", "thread": root, "committed_at": now})


# ------------------------------------------------------------------ reads


@dataclass(frozen=True, slots=True)
class SnapshotRoot:
    """The root of a read snapshot and the time it was observed.

    Attributes
    ----------
    observed_at:
        The provider's time of the snapshot.
    root:
        The stored root, or ``None`` when the thread does not exist.
    next_positions:
        Each family's position counter in the snapshot (pages are bounded by
        the highest position assigned, ``next - 1``).
    """

    observed_at: datetime
    root: ThreadRecord | None
    next_positions: Mapping[FamilyName, int] = field(default_factory=lambda: _NO_POSITIONS)


class ReadSnapshot(ABC):
    """One read's primitives over one thread, all in one consistent snapshot."""

    @abstractmethod
    async def head(self) -> SnapshotRoot:
        """The root, its counters and the observation time."""

    @abstractmethod
    async def load_rows(self, spec: FamilySpec, ids: Sequence[str]) -> Mapping[str, Entry[Any]]:
        """The rows of one family with these ids (missing ids omitted)."""

    @abstractmethod
    async def anchor_positions(self, message_ids: Sequence[str]) -> Mapping[str, int]:
        """The positions of these messages (missing ids omitted)."""

    @abstractmethod
    async def scan(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> Sequence[tuple[int, Any]]:
        """Up to ``window.fetch`` rows of one family inside the window, in its order.

        Only rows that pass the plan's filter (:meth:`ChildPagePlan.matches`:
        message view, run statuses, queued items' run) count; rows come as
        ``(position, record)`` in ``window.order``.
        """

    async def head_and_page(
        self, spec: FamilySpec, plan: ChildPagePlan, window: Window
    ) -> tuple[SnapshotRoot, Sequence[tuple[int, Any]]] | None:
        """The head and one page in one request, or ``None`` when not supported.

        Optional (the default answers ``None``, and :func:`run_read` calls
        :meth:`head` and :meth:`scan`). Called only for a read whose one
        selection is a page without anchors (:meth:`ReadPlan.single_page`),
        with its :meth:`ChildPagePlan.prospective_window`: return the rows
        :meth:`scan` would return for that window *and* below the family's
        position counter in the same snapshot (``position < next``), with the
        head. A missing thread's rows are ignored.
        """
        return None


async def run_read(
    snapshot: ReadSnapshot, plan: ReadPlan, *, clock_now: datetime | None = None
) -> ThreadReadResult:
    """Serve a read plan through a backend's snapshot primitives.

    The root and every requested page come from the one snapshot, so they
    carry the same version. ``clock_now`` replaces the snapshot's observation
    time on a test clock.
    """
    single = plan.single_page()
    if single is not None:
        spec = family(single[0])
        combined = await snapshot.head_and_page(spec, single[1], single[1].prospective_window())
        if combined is not None:
            return _single_page_result(spec, single[1], *combined, clock_now)
    head = await snapshot.head()
    observed = clock_now if clock_now is not None else truncate_ms(head.observed_at)
    root = head.root
    if root is None:
        return ThreadReadResult(observed_at=observed, thread=None)
    version = root.version
    pages: dict[str, ThreadPage[Any]] = {}
    for spec in FAMILIES:
        selection: IdsPlan | ChildPagePlan | None = getattr(plan, spec.attr)
        if isinstance(selection, IdsPlan):
            found = await snapshot.load_rows(spec, selection.ids)
            pages[spec.attr] = selection.finish({k: e.record for k, e in found.items()}, version)
        elif selection is not None:
            high_water = head.next_positions[spec.name] - 1
            pages[spec.attr] = await _read_page(snapshot, spec, selection, version, high_water)
    # Every part is validated or built here: no second validation of the result.
    return ThreadReadResult.trusted(
        {
            "observed_at": observed,
            "thread": root,
            "messages": pages.get("messages"),
            "runs": pages.get("runs"),
            "queued_items": pages.get("queued_items"),
        }
    )


def _single_page_result(
    spec: FamilySpec,
    plan: ChildPagePlan,
    head: SnapshotRoot,
    rows: Sequence[tuple[int, Any]],
    clock_now: datetime | None,
) -> ThreadReadResult:
    observed = clock_now if clock_now is not None else truncate_ms(head.observed_at)
    root = head.root
    if root is None:
        return ThreadReadResult(observed_at=observed, thread=None)
    version = root.version
    # The incarnation check; the rows already lie inside this window (below
    # the counter the head carries).
    window = plan.window(version, head.next_positions[spec.name] - 1)
    return ThreadReadResult.trusted(
        {
            "observed_at": observed,
            "thread": root,
            "messages": None,
            "runs": None,
            "queued_items": None,
        }
        | {spec.attr: plan.finish(window, rows, version)}
    )


async def _read_page(
    snapshot: ReadSnapshot,
    spec: FamilySpec,
    plan: ChildPagePlan,
    version: ThreadVersion,
    high_water: int,
) -> ThreadPage[Any]:
    bounds = plan.bound_ids()
    anchors = [i for i in bounds if i is not None]
    found = await snapshot.anchor_positions(anchors) if anchors else {}
    positions: list[int | None] = []
    for anchor in bounds:
        if anchor is not None and anchor not in found:
            raise plan.missing_anchor(anchor)
        positions.append(found[anchor] if anchor is not None else None)
    window = plan.window(version, high_water, positions[0], positions[1])
    rows: Sequence[tuple[int, Any]] = []
    if window.lower + 1 < window.upper:
        rows = await snapshot.scan(spec, plan, window)
    return plan.finish(window, rows, version)


# ------------------------------------------------------------------ helpers


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run a pipeline over primitives that never suspend, without an event loop.

    The in-memory reference answers every primitive at once, so its pipeline
    finishes on the first step; so does a write a backend runs whole in its
    database's own thread (SQLite). Anything that does suspend is a bug: the
    coroutine is closed and ``RuntimeError`` raised.
    """
    coroutine = awaitable.__await__()
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a pipeline step suspended where nothing may wait")
