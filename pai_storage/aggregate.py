"""A whole thread held in memory: the root plus its three ordered child families.

Aggregate-style backends (a key-value backend) keep one :class:`ThreadAggregate`
per thread and commit through :func:`pai_storage.backend.apply_thread_changes`; it is
also the reference model the conformance suite compares every backend against.
A :class:`ThreadAggregate` is a value: a commit builds a new one.

The memory backend keeps an :class:`IndexedThread` instead: the same content
in structures it updates in place, so that a commit costs the size of the
change and a page the size of the page, however long the transcript grows
(:class:`IndexedFamily`).

Each child record carries its *position*: an integer assigned at insert from a
per-thread high-water counter (one more than the highest position the family
ever held), kept by ``replace`` and never renumbered. Positions are dense as
written, never reused after deletes, which makes page upper anchors exact.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, cast

from sortedcontainers import SortedDict  # type: ignore[import-untyped]

from .errors import ThreadStoreInvariantError
from .models import Message, QueuedItem, RunRecord, ThreadRecord

if TYPE_CHECKING:
    from .changes import FamilyWrite

__all__ = [
    "Entry",
    "Family",
    "FamilyName",
    "FamilyView",
    "IndexedFamily",
    "IndexedThread",
    "ThreadAggregate",
]

R = TypeVar("R", Message, RunRecord, QueuedItem)

FamilyName = Literal["messages", "runs", "queuedItems"]
"""The JSON name of a child family."""


@dataclass(frozen=True, slots=True)
class Entry(Generic[R]):
    """One stored child record and its position in its family."""

    position: int
    record: R


@dataclass(slots=True)
class Family(Generic[R]):
    """An ordered child family: entries by id in position order, plus the counter."""

    entries: dict[str, Entry[R]] = field(default_factory=dict)
    next_position: int = 1

    def __iter__(self) -> Iterator[Entry[R]]:
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, record_id: str) -> Entry[R] | None:
        return self.entries.get(record_id)

    def high_water(self) -> int:
        """The highest position this family has ever assigned (0 when none)."""
        return self.next_position - 1

    def between(self, lower: int, upper: int, *, newest: bool) -> Iterator[Entry[R]]:
        """Entries with ``lower < position < upper``, oldest or newest first.

        Walks the entries from the chosen end, so it costs the entries skipped
        outside the window plus the ones taken (see :class:`IndexedFamily` for
        a family that starts at the window).
        """
        if newest:
            for entry in reversed(self.entries.values()):
                if entry.position <= lower:
                    return
                if entry.position < upper:
                    yield entry
        else:
            for entry in self.entries.values():
                if entry.position >= upper:
                    return
                if entry.position > lower:
                    yield entry


class FamilyView(Protocol[R]):
    """What a read needs of a family held in memory (:class:`Family`, :class:`IndexedFamily`)."""

    @property
    def next_position(self) -> int:
        """The next position to assign (one more than the high-water position)."""
        ...

    def get(self, record_id: str) -> Entry[R] | None:
        """The entry with this id, if it exists."""
        ...

    def high_water(self) -> int:
        """The highest position this family has ever assigned (0 when none)."""
        ...

    def between(self, lower: int, upper: int, *, newest: bool) -> Iterator[Entry[R]]:
        """Entries with ``lower < position < upper``, oldest or newest first."""
        ...


@dataclass(slots=True)
class ThreadAggregate:
    """A thread root with every message, run and queued item it owns."""

    root: ThreadRecord
    messages: Family[Message] = field(default_factory=Family)
    runs: Family[RunRecord] = field(default_factory=Family)
    queued_items: Family[QueuedItem] = field(default_factory=Family)

    def deep_copy(self) -> ThreadAggregate:
        """A copy sharing no mutable state with this aggregate."""
        return copy.deepcopy(self)

    # ---------------------------------------------------------------- JSON form

    def to_json(self) -> dict[str, Any]:
        """The aggregate's JSON form (positions and counters included)."""

        def family(fam: Family[Any]) -> dict[str, Any]:
            return {
                "nextPosition": fam.next_position,
                "items": [{"position": e.position, "record": e.record.to_json()} for e in fam],
            }

        return {
            "thread": self.root.to_json(),
            "messages": family(self.messages),
            "runs": family(self.runs),
            "queuedItems": family(self.queued_items),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ThreadAggregate:
        """Strictly parse the JSON form; any flaw raises ``ThreadStoreInvariantError``."""
        if not isinstance(data, Mapping) or set(data) != {
            "thread",
            "messages",
            "runs",
            "queuedItems",
        }:
            raise ThreadStoreInvariantError("invalid aggregate: unexpected top-level fields")
        return cls(
            root=ThreadRecord.model_validate(data["thread"]),
            messages=_parse_family(data["messages"], Message, "message_id"),
            runs=_parse_family(data["runs"], RunRecord, "run_id"),
            queued_items=_parse_family(data["queuedItems"], QueuedItem, "queue_item_id"),
        )


def _parse_family(data: Any, model: type[R], id_attr: str) -> Family[R]:
    if not isinstance(data, Mapping) or set(data) != {"nextPosition", "items"}:
        raise ThreadStoreInvariantError(f"invalid aggregate: bad {model.__name__} family")
    next_position = data["nextPosition"]
    if type(next_position) is not int or next_position < 1:
        raise ThreadStoreInvariantError("invalid aggregate: bad nextPosition")
    fam: Family[R] = Family(next_position=next_position)
    last = 0
    for item in data["items"]:
        if not isinstance(item, Mapping) or set(item) != {"position", "record"}:
            raise ThreadStoreInvariantError(f"invalid aggregate: bad {model.__name__} entry")
        position = item["position"]
        if type(position) is not int or not last < position < next_position:
            raise ThreadStoreInvariantError("invalid aggregate: positions out of order")
        record = model.model_validate(item["record"])
        record_id = getattr(record, id_attr)
        if record_id in fam.entries:
            raise ThreadStoreInvariantError(f"invalid aggregate: duplicate id {record_id!r}")
        fam.entries[record_id] = Entry(position, record)
        last = position
    return fam


# ---------------------------------------------------------------- indexed form

_OPEN_STATUSES = frozenset({"running", "waiting"})  # relationships.OPEN_STATUSES (imports us)


class IndexedFamily(Generic[R]):
    """A child family updated in place, with the indexes a commit and a page need.

    Entries are kept by id and in a sorted map by position, so a row costs
    O(log n) to add, replace or remove and a window of positions is reached in
    O(log n) from either end. Two secondary indexes serve the relationship
    rules without a scan: the positions of each run's rows (messages and
    queued items name their run) and the open (``running``/``waiting``) runs.

    Only :meth:`put`, :meth:`remove` and :meth:`apply` change it; they keep
    every index in step.
    """

    __slots__ = ("_by_id", "_by_position", "_by_run", "_id_attr", "_open", "next_position")

    def __init__(self, id_attr: str, next_position: int = 1) -> None:
        self._id_attr = id_attr
        self._by_id: dict[str, Entry[R]] = {}
        self._by_position: Any = SortedDict()  # position -> Entry
        # run id -> positions of the rows naming it, in insertion order (mostly
        # ascending: rows are appended); sorted when read.
        self._by_run: dict[str, dict[int, None]] = {}
        self._open: dict[str, int] = {}  # open run id -> position (runs only)
        self.next_position = next_position

    # ------------------------------------------------------------------ reads

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Entry[R]]:
        return iter(cast("Iterator[Entry[R]]", self._by_position.values()))

    def get(self, record_id: str) -> Entry[R] | None:
        return self._by_id.get(record_id)

    def high_water(self) -> int:
        """The highest position this family has ever assigned (0 when none)."""
        return self.next_position - 1

    def record_id(self, entry: Entry[R]) -> str:
        return cast(str, getattr(entry.record, self._id_attr))

    def between(self, lower: int, upper: int, *, newest: bool) -> Iterator[Entry[R]]:
        """Entries with ``lower < position < upper``, oldest or newest first, from O(log n)."""
        by_position = self._by_position
        keys = by_position.irange(lower, upper, inclusive=(False, False), reverse=newest)
        for position in keys:
            yield by_position[position]

    def count_between(self, first: int, last: int) -> int:
        """How many entries have ``first <= position <= last`` (O(log n))."""
        if first > last:
            return 0
        by_position = self._by_position
        return cast(int, by_position.bisect_right(last) - by_position.bisect_left(first))

    def run_rows(self, run_id: str) -> list[Entry[R]]:
        """The entries naming run ``run_id``, in position order (O(rows of the run))."""
        positions = self._by_run.get(run_id)
        if not positions:
            return []
        by_position = self._by_position
        return [by_position[p] for p in sorted(positions)]

    def open_runs(self) -> list[Entry[R]]:
        """The ``running``/``waiting`` runs, in position order (runs only)."""
        by_position = self._by_position
        return [by_position[p] for p in sorted(self._open.values())]

    # ------------------------------------------------------------------ writes

    def put(self, entry: Entry[R]) -> None:
        """Add ``entry``, replacing the entry with the same id if there is one."""
        rid = self.record_id(entry)
        if rid in self._by_id:
            self.remove(rid)
        self._by_id[rid] = entry
        self._by_position[entry.position] = entry
        record: Any = entry.record
        if isinstance(record, RunRecord):
            if record.status in _OPEN_STATUSES:
                self._open[rid] = entry.position
        elif record.run_id is not None:
            self._by_run.setdefault(record.run_id, {})[entry.position] = None

    def remove(self, record_id: str) -> Entry[R] | None:
        """Remove the entry with this id and return it (``None``: there was none)."""
        entry = self._by_id.pop(record_id, None)
        if entry is None:
            return None
        del self._by_position[entry.position]
        record: Any = entry.record
        if isinstance(record, RunRecord):
            self._open.pop(record_id, None)
        elif record.run_id is not None:
            positions = self._by_run[record.run_id]
            del positions[entry.position]
            if not positions:
                del self._by_run[record.run_id]
        return entry

    def after(self, position: int) -> list[Entry[R]]:
        """The entries above ``position``, in position order (what a truncation removes)."""
        return list(self.between(position, self.next_position, newest=False))

    def apply(self, write: FamilyWrite[R]) -> None:
        """Apply a :class:`~pai_storage.backend.FamilyWrite` in its documented order.

        Truncation, deletes, updates, inserts; then the counter. Costs
        O(rows written x log n).
        """
        if write.truncate_after is not None:
            for entry in self.after(write.truncate_after):
                self.remove(self.record_id(entry))
        for rid in write.deletes:
            self.remove(rid)
        for entry in write.updates.values():
            self.put(entry)
        for entry in write.inserts:
            self.put(entry)
        self.next_position = write.next_position


@dataclass(slots=True, eq=False)
class IndexedThread:
    """A thread root with its three :class:`IndexedFamily` families (the memory store's form)."""

    root: ThreadRecord
    messages: IndexedFamily[Message] = field(
        default_factory=lambda: IndexedFamily[Message]("message_id")
    )
    runs: IndexedFamily[RunRecord] = field(
        default_factory=lambda: IndexedFamily[RunRecord]("run_id")
    )
    queued_items: IndexedFamily[QueuedItem] = field(
        default_factory=lambda: IndexedFamily[QueuedItem]("queue_item_id")
    )

    @classmethod
    def from_aggregate(cls, aggregate: ThreadAggregate) -> IndexedThread:
        """The indexed form of an aggregate (records are shared: they are immutable)."""
        thread = cls(aggregate.root)
        _fill(thread.messages, aggregate.messages)
        _fill(thread.runs, aggregate.runs)
        _fill(thread.queued_items, aggregate.queued_items)
        return thread

    def to_aggregate(self) -> ThreadAggregate:
        """The same content as a :class:`ThreadAggregate` (records are shared)."""

        def family(source: IndexedFamily[R]) -> Family[R]:
            entries = {source.record_id(e): e for e in source}
            return Family(entries=entries, next_position=source.next_position)

        return ThreadAggregate(
            root=self.root,
            messages=family(self.messages),
            runs=family(self.runs),
            queued_items=family(self.queued_items),
        )


def _fill(target: IndexedFamily[R], source: Family[R]) -> None:
    for entry in source:
        target.put(entry)
    target.next_position = source.next_position
