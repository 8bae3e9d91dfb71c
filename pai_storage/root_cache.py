"""The roots a store last saw, per thread: what lets a commit skip its hold.

A backend that writes a commit guarded by the stored root it expects
(MongoDB's stamped hold, the optimistic commits of PostgreSQL and SQLite)
keeps the last root it committed or read here, as the database stores it,
with its counters and relationship facts. An entry is only a hint: the
guarded write matches the stored root exactly (the whole document), so a
stale or foreign entry writes nothing and the commit takes the usual hold.
:func:`optimistic` says which commits may be judged from an entry alone; a
backend's optimistic commit raises :class:`Unsure` for anything it cannot
settle without the hold (its store then commits the usual way), and its
relationship reader is :class:`NoQueries`.

Entries are immutable: the root is an immutable record, the facts an immutable
value, and :meth:`RootCache.put` keeps its own copy of the counters.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

from .aggregate import FamilyName
from .errors import ThreadStoreError
from .models import (
    CommittedResult,
    CommitThreadInput,
    InsertChange,
    ThreadRecord,
    UpdateMutation,
)
from .pipeline import CommitTransaction, run_commit
from .relationships import MessageRef, RunRef, RunRelations
from .root_facts import RootFacts

__all__ = [
    "CachedRoot",
    "NoQueries",
    "RootCache",
    "TextRoot",
    "Unsure",
    "judge_optimistic",
    "keep_written",
    "optimistic",
]

S = TypeVar("S")


class CachedRoot(NamedTuple, Generic[S]):
    """A root as stored (``stored``: the backend's exact form), parsed, with its
    counters and facts."""

    stored: S
    root: ThreadRecord
    next_positions: Mapping[FamilyName, int]
    facts: RootFacts


TextRoot = CachedRoot[tuple[str, str]]
"""A root kept as the text its store wrote: ``(document, facts)``."""


class RootCache(Generic[S]):
    """The last stored root a store saw per thread (bounded, least recently used)."""

    LIMIT = 4096
    MAX_BYTES = 64 * 1024
    """The largest stored root :meth:`offer` keeps (its ``size``)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str], CachedRoot[S]] = OrderedDict()

    def get(self, key: tuple[str, str]) -> CachedRoot[S] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple[str, str], entry: CachedRoot[S]) -> None:
        self._entries[key] = entry._replace(next_positions=dict(entry.next_positions))
        self._entries.move_to_end(key)
        while len(self._entries) > self.LIMIT:
            self._entries.popitem(last=False)

    def offer(self, key: tuple[str, str], entry: CachedRoot[S], size: int = 0) -> None:
        """Keep ``entry`` unless a newer revision of the same thread is known, or it
        is larger than :data:`MAX_BYTES` (``size``: its stored size, when the
        caller knows it)."""
        if size > self.MAX_BYTES:
            self.drop(key)
            return
        known = self._entries.get(key)
        if known is not None and (
            known.root.version.thread_instance_id == entry.root.version.thread_instance_id
            and known.root.version.revision > entry.root.version.revision
        ):
            return
        self.put(key, entry)

    def drop(self, key: tuple[str, str]) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


def keep_written(
    cache: RootCache[tuple[str, str]], key: tuple[str, str], written: TextRoot | None
) -> None:
    """After a commit: keep the root it wrote as text (:meth:`RootCache.offer`),
    or forget the thread when that is not known (a delete, a root stored
    without facts)."""
    if written is None:
        cache.drop(key)
    else:
        cache.offer(key, written, len(written.stored[0]) + len(written.stored[1]))


def optimistic(commit: CommitThreadInput, known: CachedRoot[Any]) -> bool:
    """Whether ``commit`` may be judged from ``known`` alone and written optimistically.

    It expects exactly that version, inserts only messages and runs (whose
    ids a guarded write's unique keys check), and no lease is held or changed
    (so the commit time judges nothing: it only stamps).
    """
    mutation, condition = commit.mutation, commit.condition
    if not isinstance(mutation, UpdateMutation) or condition.type != "version":
        return False
    version = known.root.version
    if (
        version.revision != condition.version.revision
        or version.thread_instance_id != condition.version.thread_instance_id
        or known.root.lease is not None
    ):
        return False
    changes = mutation.changes
    if changes is None:
        return True
    if changes.lease is not None or changes.queued_items:
        return False
    return all(
        isinstance(c, InsertChange) for c in (*(changes.messages or ()), *(changes.runs or ()))
    )


class Unsure(Exception):
    """Internal: an optimistic commit needs what only the usual hold gives.

    Raised before anything of the commit is applied (or with its transaction
    rolled back); the store then commits the usual way, which judges again.
    """


async def judge_optimistic(
    tx: CommitTransaction,
    commit: CommitThreadInput,
    clock: Callable[[], datetime | None] | None,
) -> CommittedResult:
    """:func:`~pai_storage.backend.run_commit` over an optimistic commit's
    primitives: a conflict or an error of its judgement (made from the known
    root, perhaps no longer the stored one) raises :class:`Unsure` too, so the
    store judges it again, held."""
    try:
        result = await run_commit(tx, commit, clock=clock)
    except ThreadStoreError as exc:
        raise Unsure() from exc
    if not isinstance(result, CommittedResult):
        raise Unsure()
    return result


class NoQueries:
    """The relationship reader of an optimistic commit: a rule that must read the
    thread's rows raises :class:`Unsure` (the known facts did not answer it)."""

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        raise Unsure()

    async def open_runs(self) -> Sequence[RunRef]:
        raise Unsure()

    async def tail(self) -> MessageRef | None:
        raise Unsure()
