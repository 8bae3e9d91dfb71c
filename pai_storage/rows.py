"""Row <-> record helpers for backends that keep records as JSON text in rows.

Identifiers are stored as their UTF-8 bytes (byte order is code-point order, and
U+0000 is allowed), records as their exact JSON form (``json`` escapes U+0000,
so a text column holds it; never a JSON column type, which would normalize
it), and stored text is parsed strictly. The PostgreSQL and SQL backends use
them; so may any backend of the same shape.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from . import codec
from .aggregate import Entry, Family, FamilyName, ThreadAggregate
from .changes import FamilyWrite
from .errors import ThreadStoreInvariantError
from .events import StoreWarning
from .families import FAMILIES
from .models import Page, ThreadRecord
from .selection import timestamp_ms

if TYPE_CHECKING:
    from .families import FamilySpec
    from .pipeline import CommitTransaction
    from .selection import ListPlan

__all__ = [
    "ListCursor",
    "ListRow",
    "dec",
    "enc",
    "enc_opt",
    "insert_thread",
    "list_page",
    "listed_roots",
    "page_records",
    "parse_root",
    "run_ref_fields",
    "thread_from_rows",
]


def enc(text: str) -> bytes:
    """An identifier as stored: its UTF-8 bytes."""
    return text.encode("utf-8")


def enc_opt(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")


def dec(data: bytes) -> str:
    return bytes(data).decode("utf-8")


def parse_root(doc: str, scope_key: str, thread_id: str) -> ThreadRecord:
    """Strictly parse a stored thread root read by its key: a root that names another
    key is invalid stored data (``ThreadStoreInvariantError``)."""
    root = codec.decode(ThreadRecord, doc)
    if root.scope_key != scope_key or root.thread_id != thread_id:
        raise ThreadStoreInvariantError(
            "stored thread root does not match its key (scope_key/thread_id)"
        )
    return root


def page_records(spec: FamilySpec, rows: Sequence[Any]) -> list[tuple[int, Any]]:
    """The validated records of a page's ``(position, doc, id column)`` rows.

    A record whose id is not its row's id column (compared as bytes: a damaged
    column need not decode) is invalid stored data, as it is for a read by
    ids; the page's filter columns are checked against the records by the
    plan (:meth:`~pai_storage.backend.ChildPagePlan.finish`).
    """
    if not rows:
        return []
    positions, docs, stored_ids = zip(*rows, strict=True)
    records = codec.decode_many(spec.model, docs)
    # Compared in C, a page at a time: the records' ids as stored, and the rows'.
    if list(map(str.encode, map(attrgetter(spec.id_attr), records))) != list(
        map(bytes, stored_ids)
    ):
        raise ThreadStoreInvariantError(f"stored {spec.noun} record does not match its id column")
    return list(zip(map(int, positions), records, strict=True))


ListRow = tuple[int, bytes, str]
"""A list row: ``(sort key, thread id column, doc)`` (the sort key is
``-timestamp_ms(updated_at)``, the thread id its UTF-8 bytes)."""

ListCursor = tuple[int, bytes]
"""The position after which a list batch starts: ``(sort key, thread id bytes)``."""


def listed_roots(scope_key: str, rows: Sequence[ListRow]) -> Iterator[ThreadRecord | StoreWarning]:
    """The roots of a list page's ``(sort key, thread id column, doc)`` rows of
    ``scope_key``, in row order: each the validated root, or the warning that
    skips it (its text is not a valid root, or the root is not its row's:
    another scope, thread id or order key).

    Each root is decoded as the caller takes it.
    """
    for sort_key, thread_id, doc in rows:
        try:
            root = codec.decode(ThreadRecord, doc)
            if (
                root.scope_key != scope_key
                or root.thread_id.encode() != thread_id
                or -timestamp_ms(root.updated_at) != sort_key
            ):
                raise ThreadStoreInvariantError("stored identity or order key does not match")
        except ThreadStoreInvariantError as exc:
            try:
                tid: str | None = dec(thread_id)
            except UnicodeDecodeError:
                tid = None
            reason = str(exc).split(":", 1)[0][:200]
            yield StoreWarning(
                kind="invalid_thread_skipped",
                reason=f"stored thread root failed validation ({reason})",
                scope_key=scope_key,
                thread_id=tid,
            )
            continue
        yield root


async def list_page(
    plan: ListPlan,
    batch: Callable[[ListCursor | None], Awaitable[Sequence[ListRow]]],
    warn: Callable[[StoreWarning], Awaitable[None]],
) -> Page[ThreadRecord]:
    """A list page of a text backend, from its ordered batches of rows.

    ``batch(cursor)`` returns up to ``plan.fetch`` rows of the plan's scope,
    visibility (``include_hidden``) and filters, in list order (sort key, then
    thread id bytes), strictly after ``cursor`` (``None``: from the first row).
    The first batch starts at the plan's own cursor. Each row gives its root
    (:func:`listed_roots`), or a warning that skips it, passed to ``warn``; a
    root :meth:`ListPlan.matches` refuses is left out. When a full batch leaves
    the page short, the next batch starts after the last row seen.
    """
    cursor = None if plan.cursor is None else (-plan.cursor[0], enc(plan.cursor[1]))
    found: list[ThreadRecord] = []
    while True:
        rows = await batch(cursor)
        for root in listed_roots(plan.scope_key, rows):
            if isinstance(root, StoreWarning):
                await warn(root)
            elif plan.matches(root):
                found.append(root)
                if len(found) == plan.fetch:
                    return plan.finish(found)
        if len(rows) < plan.fetch:
            return plan.finish(found)
        cursor = (rows[-1][0], rows[-1][1])


def run_ref_fields(doc: str) -> tuple[str, bool, str | None, tuple[str, ...]]:
    """``(status, admitted, queue_item_id, input_message_ids)`` of a stored run."""
    try:
        data = json.loads(doc)
        admission = data["admission"]
        return (
            str(data["status"]),
            bool(admission["admitted"]),
            admission.get("queueItemId"),
            tuple(data["inputMessageIds"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ThreadStoreInvariantError(
            "a stored run is invalid (impossible persisted state)"
        ) from None


def thread_from_rows(
    root: ThreadRecord,
    next_positions: Mapping[FamilyName, int],
    rows: Mapping[FamilyName, Iterable[Sequence[Any]]],
) -> ThreadAggregate:
    """A whole thread from its root, its position counters and each family's
    ``(position, doc)`` rows (what a lifecycle load returns).

    Every document is parsed strictly (:func:`pai_storage.codec.decode`); read the rows from one
    snapshot, so the root and the families agree.
    """
    families: dict[FamilyName, Family[Any]] = {}
    for spec in FAMILIES:
        entries: dict[str, Entry[Any]] = {}
        for position, doc in rows[spec.name]:
            record = codec.decode(spec.model, doc)
            entries[spec.record_id(record)] = Entry(int(position), record)
        families[spec.name] = Family(entries, next_positions[spec.name])
    return ThreadAggregate(root, families["messages"], families["runs"], families["queuedItems"])


async def insert_thread(tx: CommitTransaction, aggregate: ThreadAggregate) -> None:
    """Write a whole thread as new through the commit primitives (a restore): its root,
    created with the aggregate's position counters, then every family's rows.

    Raises :class:`~pai_storage.backend.ThreadConflict` (from ``write_root``)
    when the key is taken; run it in one transaction, so nothing is left then.
    """
    families = {spec.name: getattr(aggregate, spec.attr) for spec in FAMILIES}
    positions = {name: family.next_position for name, family in families.items()}
    await tx.write_root(aggregate.root, positions, created=True)
    for spec in FAMILIES:
        entries = list(families[spec.name])
        if entries:
            await tx.write_family(spec, FamilyWrite(inserts=entries))
