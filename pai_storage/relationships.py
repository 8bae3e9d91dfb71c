"""The relationship rules, checked on the post-commit state (``docs/commits.md``).

The rules are per run, so one checker serves every backend:

1. every run-associated message names an existing run;
2. the messages of an admitted run form one contiguous interval of raw order;
3. that interval starts with exactly the run's ``input_message_ids``, in order,
   each with relation ``input``, and no later message of the run is an input;
4. a run that is not admitted owns no messages and has no input ids;
5. a ``running``/``waiting`` run owns the tail, and at most one run is open;
6. queue admission: a queued item names a ``queued`` run whose
   ``admission.queue_item_id`` is that item; a queued run has exactly that one
   item; an admitted run has none; ``queued`` implies not admitted and
   ``running``/``waiting``/``completed``/``failed`` imply admitted;
7. a lease names an existing ``running`` or ``waiting`` run.

An aggregate backend checks every run (:func:`relations_from_aggregate`). A
normalized backend calls :func:`relationship_check` with the previous
rows its write touches and the truncation impact; the check names the few runs
whose rules the commit can affect, and :meth:`RelationshipCheck.check` loads
their post-commit facts through a :class:`RelationshipReader` (queries inside
the commit's transaction, which see its own writes) and asserts the rules.
Nothing loads the whole transcript: a run's facts are its own messages.

A backend that keeps records as rows answers the reader with its query rows
only: :func:`run_facts_from_rows` folds them into facts, :func:`gapped_spans`
names the few runs it must look inside for a foreign message, and
:func:`run_ref_from_row` / :func:`message_ref_from_row` read the open runs and
the tail, so the fold is written once for every such backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Protocol

from .aggregate import ThreadAggregate
from .errors import ThreadStoreInvariantError
from .models import (
    DeleteChange,
    InsertChange,
    Message,
    QueuedItem,
    ReplaceChange,
    RunRecord,
    ThreadChanges,
    ThreadLease,
)
from .rows import dec, run_ref_fields

__all__ = [
    "OPEN_STATUSES",
    "MessageRef",
    "QueueRef",
    "RelationshipCheck",
    "RelationshipReader",
    "RunRef",
    "RunRelations",
    "ThreadRelations",
    "assert_relationships",
    "gapped_spans",
    "message_ref_from_row",
    "relations_from_aggregate",
    "relationship_check",
    "run_facts_from_rows",
    "run_ref_from_row",
]

OPEN_STATUSES = frozenset({"running", "waiting"})
_ADMITTED_STATUSES = frozenset({"running", "waiting", "completed", "failed"})


@dataclass(frozen=True, slots=True)
class MessageRef:
    """The canonical projection of a message that the rules look at."""

    message_id: str
    position: int
    run_id: str | None
    relation: str | None

    @classmethod
    def of(cls, position: int, message: Message) -> MessageRef:
        assoc = message.association
        relation = getattr(assoc, "relation", None)
        return cls(message.message_id, position, message.run_id, relation)


@dataclass(frozen=True, slots=True)
class RunRef:
    """The canonical projection of a run that the rules look at."""

    run_id: str
    status: str
    admitted: bool
    queue_item_id: str | None
    input_message_ids: tuple[str, ...]

    @classmethod
    def of(cls, run: RunRecord) -> RunRef:
        return cls(
            run.run_id,
            run.status,
            run.admission.admitted,
            run.admission.queue_item_id,
            tuple(run.input_message_ids),
        )


@dataclass(frozen=True, slots=True)
class QueueRef:
    """The canonical projection of a queued item."""

    queue_item_id: str
    run_id: str

    @classmethod
    def of(cls, item: QueuedItem) -> QueueRef:
        return cls(item.queue_item_id, item.run_id)


@dataclass(slots=True)
class RunRelations:
    """Everything the rules need about one run id, post-commit.

    Attributes
    ----------
    run:
        The run, or ``None`` when no run has this id.
    messages:
        Messages associated with this run id, in position order.
    foreign_inside:
        Whether any other message lies between the first and last of ``messages``.
    queued_items:
        Queued items whose ``run_id`` is this id.
    """

    run: RunRef | None
    messages: Sequence[MessageRef] = ()
    foreign_inside: bool = False
    queued_items: Sequence[QueueRef] = ()


@dataclass(slots=True)
class ThreadRelations:
    """Post-commit facts for a set of runs plus the thread-wide ones."""

    runs: Mapping[str, RunRelations]
    open_runs: Sequence[RunRef] = ()
    tail: MessageRef | None = None
    lease: ThreadLease | None = None
    check_tail: bool = True


def _broken(rule: int, detail: str) -> ThreadStoreInvariantError:
    return ThreadStoreInvariantError(f"relationship rule {rule} broken: {detail}")


def _assert_run(run_id: str, facts: RunRelations) -> None:
    run, messages, items = facts.run, facts.messages, facts.queued_items
    if run is None:
        if messages:
            raise _broken(1, f"message {messages[0].message_id!r} names missing run {run_id!r}")
        if items:
            raise _broken(6, f"queued item {items[0].queue_item_id!r} names missing run {run_id!r}")
        return
    if run.status == "queued" and run.admitted:
        raise _broken(6, f"run {run_id!r} is queued but admitted")
    if run.status in _ADMITTED_STATUSES and not run.admitted:
        raise _broken(6, f"run {run_id!r} is {run.status} but not admitted")
    if run.status == "queued":
        if run.queue_item_id is None or [i.queue_item_id for i in items] != [run.queue_item_id]:
            raise _broken(
                6, f"queued run {run_id!r} must have exactly its queued item {run.queue_item_id!r}"
            )
    elif items:
        raise _broken(
            6,
            f"queued item {items[0].queue_item_id!r} names run {run_id!r}, "
            f"which is {run.status}, not queued",
        )
    if not run.admitted:
        if messages:
            raise _broken(4, f"run {run_id!r} is not admitted but owns messages")
        if run.input_message_ids:
            raise _broken(4, f"run {run_id!r} is not admitted but has input message ids")
        return
    if facts.foreign_inside:
        raise _broken(2, f"the messages of run {run_id!r} are not contiguous")
    inputs = run.input_message_ids
    head = messages[: len(inputs)]
    if tuple(m.message_id for m in head) != inputs or any(m.relation != "input" for m in head):
        raise _broken(
            3, f"run {run_id!r} must start with its input messages {list(inputs)!r}, in order"
        )
    for message in messages[len(inputs) :]:
        if message.relation == "input":
            raise _broken(
                3,
                f"input message {message.message_id!r} of run {run_id!r} "
                "is not among its leading input messages",
            )


def assert_relationships(facts: ThreadRelations) -> None:
    """Raise :class:`ThreadStoreInvariantError` if the facts break a relationship rule."""
    for run_id, run_facts in facts.runs.items():
        _assert_run(run_id, run_facts)
    if facts.check_tail:
        if len(facts.open_runs) > 1:
            ids = [r.run_id for r in facts.open_runs]
            raise _broken(5, f"more than one run is running or waiting: {ids!r}")
        for run in facts.open_runs:
            owned = facts.runs.get(run.run_id)
            if owned is None:  # a reader contract violation, not user error
                raise RuntimeError(f"facts for open run {run.run_id!r} were not loaded")
            if owned.messages and (facts.tail is None or facts.tail.run_id != run.run_id):
                raise _broken(5, f"{run.status} run {run.run_id!r} does not own the tail")
    lease = facts.lease
    if lease is not None:
        held = facts.runs.get(lease.run_id)
        if held is None:
            raise RuntimeError(f"facts for lease run {lease.run_id!r} were not loaded")
        if held.run is None or held.run.status not in OPEN_STATUSES:
            raise _broken(
                7, f"the lease names run {lease.run_id!r}, which is not running or waiting"
            )


def relations_from_aggregate(aggregate: ThreadAggregate) -> ThreadRelations:
    """Facts for every run id the aggregate mentions (the full check)."""
    lease = aggregate.root.lease
    run_ids = dict.fromkeys(e.record.run_id for e in aggregate.runs)
    run_ids.update(dict.fromkeys(e.record.run_id for e in aggregate.queued_items))
    run_ids.update(
        dict.fromkeys(rid for e in aggregate.messages if (rid := e.record.run_id) is not None)
    )
    if lease is not None:
        run_ids[lease.run_id] = None
    return ThreadRelations(
        runs=_run_facts(aggregate, run_ids),
        open_runs=_open_runs(aggregate),
        tail=_tail(aggregate),
        lease=lease,
    )


class RelationshipReader(Protocol):
    """Post-commit queries a normalized backend answers inside its transaction."""

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        """Facts for each id (a missing run gives ``RunRelations(run=None, ...)``)."""
        ...

    async def open_runs(self) -> Sequence[RunRef]:
        """Runs whose status is running or waiting (at most two are needed)."""
        ...

    async def tail(self) -> MessageRef | None:
        """The message with the highest position, if any."""
        ...


@dataclass(slots=True)
class RelationshipCheck:
    """Which runs a commit can affect, and whether the thread-wide rules need a look."""

    run_ids: set[str] = field(default_factory=set)
    check_tail: bool = False
    lease: ThreadLease | None = None

    @property
    def needed(self) -> bool:
        return bool(self.run_ids) or self.check_tail or self.lease is not None

    def _run_ids(self, open_runs: Sequence[RunRef]) -> list[str]:
        run_ids = set(self.run_ids)
        run_ids.update(r.run_id for r in open_runs)
        if self.lease is not None:
            run_ids.add(self.lease.run_id)
        return sorted(run_ids)

    def _assert(
        self, runs: Mapping[str, RunRelations], open_runs: Sequence[RunRef], tail: MessageRef | None
    ) -> None:
        assert_relationships(
            ThreadRelations(
                runs=runs,
                open_runs=open_runs,
                tail=tail,
                lease=self.lease,
                check_tail=self.check_tail,
            )
        )

    async def check(self, reader: RelationshipReader) -> None:
        """Load the post-commit facts through ``reader`` and assert the rules."""
        if not self.needed:
            return
        open_runs: Sequence[RunRef] = await reader.open_runs() if self.check_tail else ()
        tail = await reader.tail() if self.check_tail else None
        run_ids = self._run_ids(open_runs)
        self._assert(await reader.run_facts(run_ids) if run_ids else {}, open_runs, tail)

    def check_aggregate(self, aggregate: ThreadAggregate) -> None:
        """The same check against a post-commit aggregate held in memory."""
        if not self.needed:
            return
        open_runs = _open_runs(aggregate) if self.check_tail else []
        tail = _tail(aggregate) if self.check_tail else None
        run_ids = self._run_ids(open_runs)
        self._assert(_run_facts(aggregate, run_ids) if run_ids else {}, open_runs, tail)


def _open_runs(aggregate: ThreadAggregate) -> list[RunRef]:
    return [RunRef.of(e.record) for e in aggregate.runs if e.record.status in OPEN_STATUSES]


def _tail(aggregate: ThreadAggregate) -> MessageRef | None:
    entries = aggregate.messages.entries
    if not entries:
        return None
    last = entries[next(reversed(entries))]
    return MessageRef.of(last.position, last.record)


def _run_facts(aggregate: ThreadAggregate, run_ids: Iterable[str]) -> dict[str, RunRelations]:
    """Facts for ``run_ids`` from one cheap pass over the messages and queued items."""
    facts: dict[str, RunRelations] = {}
    for run_id in run_ids:
        run = aggregate.runs.get(run_id)
        facts[run_id] = RunRelations(RunRef.of(run.record) if run else None, [], False, [])
    spans: dict[str, tuple[int, int]] = {}
    for index, entry in enumerate(aggregate.messages):
        owner = entry.record.run_id
        if owner is not None and owner in facts:
            facts[owner].messages.append(  # type: ignore[attr-defined]
                MessageRef.of(entry.position, entry.record)
            )
            spans[owner] = (spans.get(owner, (index, index))[0], index)
    for run_id, (first, last) in spans.items():
        facts[run_id].foreign_inside = last - first + 1 != len(facts[run_id].messages)
    for item_entry in aggregate.queued_items:
        if item_entry.record.run_id in facts:
            facts[item_entry.record.run_id].queued_items.append(  # type: ignore[attr-defined]
                QueueRef.of(item_entry.record)
            )
    return facts


def relationship_check(
    changes: ThreadChanges | None,
    *,
    previous_message_runs: Mapping[str, str | None],
    previous_item_runs: Mapping[str, str],
    truncated_message_runs: Iterable[str] = (),
    truncated_run_ids: Iterable[str] = (),
    lease: ThreadLease | None,
) -> RelationshipCheck:
    """Plan the bounded relationship check of a normalized commit.

    Parameters
    ----------
    changes:
        The commit's changes.
    previous_message_runs:
        For every previously existing message the changes replace or delete:
        its run id before the commit (``None`` when standalone).
    previous_item_runs:
        For every previously existing queued item the changes replace or
        delete: its run id before the commit.
    truncated_message_runs:
        Run ids of the previous messages a message truncation removed.
    truncated_run_ids:
        Ids of the previous runs a run truncation removed.
    lease:
        The lease after the commit.

    A run's rules can change only if the commit touches the run, one of its
    messages or queued items (before or after the commit), or the lease; the
    tail rule only if messages or runs change. Given a valid previous state,
    checking those runs is equivalent to checking them all.
    """
    check = RelationshipCheck(lease=lease)
    affected = check.run_ids
    if changes is None:
        return check
    for change in changes.messages or ():
        if isinstance(change, InsertChange | ReplaceChange):
            if change.record.run_id is not None:
                affected.add(change.record.run_id)
            old = previous_message_runs.get(change.record.message_id)
        elif isinstance(change, DeleteChange):
            old = previous_message_runs.get(change.id)
        else:
            continue
        if old is not None:
            affected.add(old)
    affected.update(truncated_message_runs)
    for run_change in changes.runs or ():
        if isinstance(run_change, InsertChange | ReplaceChange):
            affected.add(run_change.record.run_id)
        elif isinstance(run_change, DeleteChange):
            affected.add(run_change.id)
    affected.update(truncated_run_ids)
    for item_change in changes.queued_items or ():
        if isinstance(item_change, InsertChange | ReplaceChange):
            affected.add(item_change.record.run_id)
            old_run = previous_item_runs.get(item_change.record.queue_item_id)
        else:
            old_run = previous_item_runs.get(item_change.id)
        if old_run is not None:
            affected.add(old_run)
    check.check_tail = bool(changes.messages or changes.runs)
    return check


# ---------------------------------------------------------------- facts from rows
#
# The rows of a backend that stores records as JSON text (pai_storage.rows): ids
# are their stored UTF-8 bytes, a run's document its stored text. A row is any
# sequence (a driver's record or row) whose columns come in the order named.

_POSITION_OF_MESSAGE = itemgetter(1)
_POSITION_OF_ITEM = itemgetter(2)


def run_ref_from_row(row: Sequence[Any]) -> RunRef:
    """The :class:`RunRef` of a stored run row ``(run_id, doc)``.

    Raises :class:`ThreadStoreInvariantError` when the document is not a run.
    """
    run_id, doc = row
    status, admitted, queue_item_id, inputs = run_ref_fields(doc)
    return RunRef(dec(run_id), status, admitted, queue_item_id, inputs)


def message_ref_from_row(row: Sequence[Any]) -> MessageRef:
    """The :class:`MessageRef` of a stored message row
    ``(position, message_id, run_id or None, relation or None)``."""
    position, message_id, run_id, relation = row
    return MessageRef(
        dec(message_id), int(position), None if run_id is None else dec(run_id), relation
    )


def run_facts_from_rows(
    run_ids: Iterable[str],
    runs: Iterable[Sequence[Any]],
    messages: Iterable[Sequence[Any]],
    items: Iterable[Sequence[Any]],
) -> dict[str, RunRelations]:
    """Fold a normalized backend's rows into the facts of ``run_ids``.

    Parameters
    ----------
    run_ids:
        The runs asked for; every one has an entry (``run=None`` when no run
        row names it), in this order.
    runs:
        Rows ``(run_id, doc)`` of the runs with these ids.
    messages:
        Rows ``(run_id, position, message_id, relation)`` of the messages
        associated with these ids, in any order.
    items:
        Rows ``(run_id, queue_item_id, position)`` of the queued items naming
        these ids, in any order.

    Rows naming an id not asked for are ignored (a backend that finds rows by
    a digest of the id may get another id's). Messages and items come out in
    position order; ``foreign_inside`` is left ``False``: only the runs
    :func:`gapped_spans` names can have a foreign message inside, and the
    backend answers that with a query of its own.
    """
    facts: dict[str, RunRelations] = {i: RunRelations(None, [], False, []) for i in run_ids}
    for row in runs:
        ref = run_ref_from_row(row)
        found = facts.get(ref.run_id)
        if found is not None:
            found.run = ref
    # Sorting rows that already come in order is one linear pass.
    for run_id, position, message_id, relation in sorted(messages, key=_POSITION_OF_MESSAGE):
        rid = dec(run_id)
        found = facts.get(rid)
        if found is not None:
            found.messages.append(  # type: ignore[attr-defined]
                MessageRef(dec(message_id), int(position), rid, relation)
            )
    for run_id, queue_item_id, _position in sorted(items, key=_POSITION_OF_ITEM):
        rid = dec(run_id)
        found = facts.get(rid)
        if found is not None:
            found.queued_items.append(QueueRef(dec(queue_item_id), rid))  # type: ignore[attr-defined]
    return facts


def gapped_spans(facts: Mapping[str, RunRelations]) -> list[tuple[str, int, int]]:
    """``(run_id, first position, last position)`` of each run whose messages have gaps.

    Positions are dense as written, so a run whose span has no gap cannot hold
    a foreign message: only these spans need a look inside (exclusive bounds).
    """
    return [
        (run_id, f.messages[0].position, f.messages[-1].position)
        for run_id, f in facts.items()
        if f.messages and f.messages[-1].position - f.messages[0].position + 1 != len(f.messages)
    ]
