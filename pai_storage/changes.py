"""Mechanical application of one child family's changes, in list order.

:func:`apply_family_changes` is shared by aggregate and normalized backends. It
needs only the *previous rows the changes name* (by id, with their positions),
never the whole family, and returns the net effect as a :class:`FamilyWrite`:
rows to insert, rows to update, ids to delete and an optional range truncation.

Rules (each broken one raises :class:`ThreadStoreInvariantError`): ``insert``
needs a new id and appends at the end; ``replace`` needs an existing id and
keeps its position and ``created_at``; ``delete`` needs an existing id;
``truncate`` needs an existing boundary (or ``None`` for all) and removes every
record after it, including records inserted earlier in the same commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from .aggregate import Entry, FamilyName
from .errors import ThreadStoreInvariantError
from .families import TERMINAL_STATUSES, stamp_message, stamp_queued_item, stamp_run
from .families import family as family_spec
from .models import (
    DeleteChange,
    InsertChange,
    Message,
    QueuedItem,
    ReplaceChange,
    RunRecord,
    TruncateChange,
)

__all__ = [
    "TERMINAL_STATUSES",
    "FamilyWrite",
    "apply_family_changes",
    "change_ids",
    "duplicate_insert_error",
    "record_id",
    "stamp_message",
    "stamp_queued_item",
    "stamp_run",
]

R = TypeVar("R", Message, RunRecord, QueuedItem)


@dataclass(slots=True)
class FamilyWrite(Generic[R]):
    """The net effect of one family's changes.

    Apply in this order: ``truncate_after`` (delete every *previous* row with a
    greater position), ``deletes``, ``updates``, ``inserts``.

    Attributes
    ----------
    final:
        Every id the changes touched, mapped to its final entry or ``None`` when
        it no longer exists.
    inserts:
        New rows, in position order.
    updates:
        Previous rows replaced (same position), by id.
    deletes:
        Ids of previous rows deleted one by one and not covered by the truncation.
    truncate_after:
        Previous rows with a position above this are removed (``None``: no truncation).
    next_position:
        The family's high-water counter after the changes.
    """

    final: dict[str, Entry[R] | None] = field(default_factory=dict)
    inserts: list[Entry[R]] = field(default_factory=list)
    updates: dict[str, Entry[R]] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    truncate_after: int | None = None
    next_position: int = 1

    @property
    def changed(self) -> bool:
        return bool(self.final) or self.truncate_after is not None


def change_ids(changes: Sequence[Any] | None) -> set[str]:
    """Every record id named by a family's changes (records, delete ids, boundaries)."""
    ids: set[str] = set()
    for change in changes or ():
        if isinstance(change, InsertChange | ReplaceChange):
            ids.add(record_id(change.record))
        elif isinstance(change, DeleteChange):
            ids.add(change.id)
        elif isinstance(change, TruncateChange) and change.after_id is not None:
            ids.add(change.after_id)
    return ids


def duplicate_insert_error(
    family: FamilyName, changes: Sequence[Any] | None, rid: str | None
) -> ThreadStoreInvariantError:
    """The error :func:`apply_family_changes` gives for an insert of an existing id.

    For a backend whose unique index, not a lookup, found the duplicate
    (``rid`` is the id the index reported, ``None`` when unknown).
    """
    noun = family_spec(family).noun
    for index, change in enumerate(changes or ()):
        if isinstance(change, InsertChange) and (rid is None or record_id(change.record) == rid):
            return ThreadStoreInvariantError(
                f"changes.{family}[{index}]: insert of {noun} "
                f"{record_id(change.record)!r}, which already exists"
            )
    return ThreadStoreInvariantError(f"changes.{family}: insert of a {noun} that already exists")


def record_id(record: Any) -> str:
    """The id of a child record or draft."""
    cls = type(record)
    attr = _ID_ATTRS.get(cls)
    if attr is None:
        fields = getattr(cls, "model_fields", {})
        found = [a for a in ("queue_item_id", "message_id", "run_id") if a in fields]
        if not found:
            raise TypeError(f"not a child record: {cls.__name__}")
        attr = _ID_ATTRS[cls] = found[0]
    return str(getattr(record, attr))


_ID_ATTRS: dict[type, str] = {}
"""The id field of each child record and draft class, found once per class."""


def apply_family_changes(
    family: FamilyName,
    changes: Sequence[Any] | None,
    previous: Mapping[str, Entry[R]],
    next_position: int,
    now: datetime,
    stamp: Callable[[Any, Any, datetime], R] | None = None,
) -> FamilyWrite[R]:
    """Apply ``changes`` to a family and return the net write.

    Parameters
    ----------
    family:
        ``"messages"``, ``"runs"`` or ``"queuedItems"`` (the latter cannot truncate).
    previous:
        The family's existing rows by id: at least every id in
        :func:`change_ids` that exists (a whole family works too).
    next_position:
        The family's high-water counter before the commit.
    stamp:
        ``stamp(previous_record_or_None, draft, now)`` builds the stored record;
        default: the family's own (:attr:`FamilySpec.stamp`).
    """
    spec = family_spec(family)
    if not changes:
        return FamilyWrite(next_position=next_position)
    noun = spec.noun
    if stamp is None:
        stamp = spec.stamp
    state: dict[str, Entry[R] | None] = {}
    cut: int | None = None
    position = next_position

    def current(rid: str) -> Entry[R] | None:
        if rid in state:
            return state[rid]
        entry = previous.get(rid)
        if entry is None or (cut is not None and entry.position > cut):
            return None
        return entry

    for index, change in enumerate(changes or ()):
        where = f"changes.{family}[{index}]"
        if isinstance(change, InsertChange):
            rid = record_id(change.record)
            if current(rid) is not None:
                raise ThreadStoreInvariantError(
                    f"{where}: insert of {noun} {rid!r}, which already exists"
                )
            state[rid] = Entry(position, stamp(None, change.record, now))
            position += 1
        elif isinstance(change, ReplaceChange):
            rid = record_id(change.record)
            existing = current(rid)
            if existing is None:
                raise ThreadStoreInvariantError(
                    f"{where}: replace of {noun} {rid!r}, which does not exist"
                )
            state[rid] = Entry(existing.position, stamp(existing.record, change.record, now))
        elif isinstance(change, DeleteChange):
            if current(change.id) is None:
                raise ThreadStoreInvariantError(
                    f"{where}: delete of {noun} {change.id!r}, which does not exist"
                )
            state[change.id] = None
        elif isinstance(change, TruncateChange):
            if family == "queuedItems":  # unreachable through the models; kept for callers
                raise ThreadStoreInvariantError(f"{where}: queued items cannot be truncated")
            boundary = 0
            if change.after_id is not None:
                anchor = current(change.after_id)
                if anchor is None:
                    raise ThreadStoreInvariantError(
                        f"{where}: truncation boundary {noun} {change.after_id!r} does not exist"
                    )
                boundary = anchor.position
            cut = boundary if cut is None else min(cut, boundary)
            for rid, entry in state.items():
                if entry is not None and entry.position > boundary:
                    state[rid] = None
        else:  # pragma: no cover - the models admit nothing else
            raise ThreadStoreInvariantError(f"{where}: unknown change")

    write: FamilyWrite[R] = FamilyWrite(final=state, truncate_after=cut, next_position=position)
    for rid, entry in state.items():
        old = previous.get(rid)
        old_alive = old is not None and (cut is None or old.position <= cut)
        if entry is None or entry.position >= next_position:
            # Gone, or deleted and inserted again (a new row at a new position).
            if old_alive:
                write.deletes.append(rid)
            if entry is not None:
                write.inserts.append(entry)
        else:
            write.updates[rid] = entry
    write.inserts.sort(key=lambda e: e.position)
    return write
