"""A whole thread held in memory: the root plus its three ordered child families.

Aggregate-style backends (the memory backend, a key-value backend) keep one
:class:`ThreadAggregate` per thread and commit through
:func:`pai_storage.apply_thread_changes`; it is also the reference model the
conformance suite compares every backend against.

Each child record carries its *position*: an integer assigned at insert from a
per-thread high-water counter (one more than the highest position the family
ever held), kept by ``replace`` and never renumbered. Positions are dense as
written, never reused after deletes, which makes page upper anchors exact.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from .errors import ThreadStoreInvariantError
from .models import Message, QueuedItem, RunRecord, ThreadRecord

__all__ = ["Entry", "Family", "FamilyName", "ThreadAggregate"]

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
