"""The three ordered child families of a thread, described once.

Every fact a backend or helper needs about a family lives in one
:class:`FamilySpec`: its JSON name, the attribute names it has on
:class:`~pai_storage.models.ThreadChanges` and :class:`~pai_storage.ThreadReadResult`,
the noun error messages use, the id attribute and JSON field of its records,
the stored record model and the function that stamps a draft into that record
at commit time. Backends keep only what is theirs (a table or collection
name) and look the rest up here, so no two places can disagree.

Stamping rules (see ``docs/data-model.md``): ``created_at`` is set on insert
and kept by replace; a message's ``updated_at`` is the commit that last wrote
it; a run's ``admission.admitted_at`` is stamped when ``admitted`` turns true
and kept while it stays true; its ``finished_at`` is stamped when the status
enters a terminal status from another one, kept while terminal and removed
when the status leaves them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .aggregate import FamilyName
from .models import (
    Admission,
    Message,
    MessageDraft,
    QueuedItem,
    QueuedItemDraft,
    RunDraft,
    RunRecord,
    ThreadChanges,
)

__all__ = [
    "FAMILIES",
    "TERMINAL_STATUSES",
    "FamilySpec",
    "family",
    "stamp_message",
    "stamp_queued_item",
    "stamp_run",
]

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


def stamp_message(previous: Message | None, draft: MessageDraft, now: datetime) -> Message:
    """The stored message for ``draft``: ``created_at`` kept on replace."""
    # Every field is the validated draft's or a stamp: built without validation.
    return Message.trusted(
        {
            **draft.__dict__,
            "created_at": previous.created_at if previous else now,
            "updated_at": now,
        }
    )


def stamp_run(previous: RunRecord | None, draft: RunDraft, now: datetime) -> RunRecord:
    """The stored run for ``draft`` with ``admitted_at`` and ``finished_at`` stamped."""
    admitted_at = None
    if draft.admission.admitted:
        was = previous.admission if previous else None
        admitted_at = was.admitted_at if was and was.admitted and was.admitted_at else now
    finished_at = None
    if draft.status in TERMINAL_STATUSES:
        if previous is not None and previous.status in TERMINAL_STATUSES:
            finished_at = previous.finished_at or now
        else:
            finished_at = now
    return RunRecord.trusted(
        {
            **draft.__dict__,
            "admission": Admission.trusted(
                {
                    "queue_item_id": draft.admission.queue_item_id,
                    "admitted": draft.admission.admitted,
                    "admitted_at": admitted_at,
                }
            ),
            "created_at": previous.created_at if previous else now,
            "updated_at": now,
            "finished_at": finished_at,
        }
    )


def stamp_queued_item(
    previous: QueuedItem | None, draft: QueuedItemDraft, now: datetime
) -> QueuedItem:
    """The stored queued item for ``draft``: ``created_at`` kept on replace."""
    return QueuedItem.trusted(
        {**draft.__dict__, "created_at": previous.created_at if previous else now}
    )


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """What every part of pai-storage knows about one child family.

    Attributes
    ----------
    name:
        The JSON name (``"messages"``, ``"runs"``, ``"queuedItems"``).
    attr:
        The Python attribute on :class:`~pai_storage.models.ThreadChanges`,
        :class:`~pai_storage.backend.ThreadAggregate` and read results.
    noun:
        How error messages name one record (``"queued item"``).
    id_attr, id_field:
        The record id's Python attribute and JSON field.
    model:
        The stored record model.
    stamp:
        ``stamp(previous_record_or_None, draft, now)``: the stored record.
    truncatable:
        Whether a ``truncate`` change is allowed (not for queued items).
    """

    name: FamilyName
    attr: str
    noun: str
    id_attr: str
    id_field: str
    model: type[Message] | type[RunRecord] | type[QueuedItem]
    stamp: Callable[[Any, Any, datetime], Any]
    truncatable: bool

    def changes(self, changes: ThreadChanges | None) -> Sequence[Any] | None:
        """This family's list of changes in ``changes`` (``None`` when absent)."""
        return getattr(changes, self.attr) if changes is not None else None

    def record_id(self, record: Any) -> str:
        """The id of one of this family's records or drafts."""
        return str(getattr(record, self.id_attr))


MESSAGES = FamilySpec(
    "messages", "messages", "message", "message_id", "messageId", Message, stamp_message, True
)
RUNS = FamilySpec("runs", "runs", "run", "run_id", "runId", RunRecord, stamp_run, True)
QUEUED_ITEMS = FamilySpec(
    "queuedItems",
    "queued_items",
    "queued item",
    "queue_item_id",
    "queueItemId",
    QueuedItem,
    stamp_queued_item,
    False,
)

FAMILIES: tuple[FamilySpec, ...] = (MESSAGES, RUNS, QUEUED_ITEMS)
"""The families in the order a commit applies them: messages, runs, queued items."""

_BY_NAME = {spec.name: spec for spec in FAMILIES}


def family(name: FamilyName) -> FamilySpec:
    """The :class:`FamilySpec` of a family by its JSON name."""
    return _BY_NAME[name]
