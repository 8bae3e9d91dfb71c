"""The stand-in database of the example backend: byte maps and sorted indexes, one lock."""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right, insort
from datetime import datetime
from typing import TypeVar

from pai_storage import ThreadRecord
from pai_storage.backend import KVRecord

__all__ = ["Server", "UpdatedIndex"]

K = TypeVar("K", tuple[datetime, str, str], tuple[datetime, str])


def _between(keys: list[K], after: K | None, before: K | None, limit: int) -> list[K]:
    """Up to ``limit`` keys strictly after ``after`` and before ``before`` (``None``: open)."""
    start = 0 if after is None else bisect_right(keys, after)
    stop = len(keys) if before is None else bisect_left(keys, before)
    return keys[start : min(stop, start + limit)]


def _remove(keys: list[K], key: K) -> None:
    index = bisect_left(keys, key)
    if index < len(keys) and keys[index] == key:
        del keys[index]


class UpdatedIndex:
    """Every thread in ``updatedAt`` order, across scopes and per scope.

    A real key-value database keeps this as sorted keys (a key range, a sorted
    set, a sort key) and answers a range read at the cost of the entries it
    returns; here a binary search over sorted lists finds the range the same way.
    """

    def __init__(self) -> None:
        self.everywhere: list[tuple[datetime, str, str]] = []  # (updatedAt, scope, thread id)
        self.scopes: dict[str, list[tuple[datetime, str]]] = {}  # scope -> (updatedAt, thread id)

    def move(self, before: ThreadRecord | None, after: ThreadRecord | None) -> None:
        """A thread's root went from ``before`` to ``after`` (``None``: no thread)."""
        if before is not None:
            _remove(self.everywhere, (before.updated_at, before.scope_key, before.thread_id))
            scope = self.scopes.get(before.scope_key, [])
            _remove(scope, (before.updated_at, before.thread_id))
            if not scope:
                self.scopes.pop(before.scope_key, None)
        if after is not None:
            insort(self.everywhere, (after.updated_at, after.scope_key, after.thread_id))
            insort(self.scopes.setdefault(after.scope_key, []), (after.updated_at, after.thread_id))

    def range(
        self,
        scope_key: str | None,
        after: tuple[datetime, str, str] | None,
        updated_before: datetime | None,
        limit: int,
    ) -> list[tuple[datetime, str, str]]:
        """Up to ``limit`` ``(updatedAt, scope, thread id)`` entries after ``after``, ascending."""
        # Ids are never empty, so ``(t, "")`` sorts before every entry updated at ``t``.
        if scope_key is None:
            high = None if updated_before is None else (updated_before, "", "")
            return _between(self.everywhere, after, high, limit)
        low = None if after is None else (after[0], after[2])
        top = None if updated_before is None else (updated_before, "")
        found = _between(self.scopes.get(scope_key, []), low, top, limit)
        return [(updated, scope_key, thread_id) for updated, thread_id in found]


class Server:
    """What a real key-value database would be: thread values, key-value items, one lock.

    The lock serializes transactions (a real database gives isolation
    itself). One :func:`pai_storage.connect` call shares one server among
    the components it opens, as a production backend shares one client.
    """

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.updated = UpdatedIndex()
        self.items: dict[tuple[tuple[str, ...], str], KVRecord] = {}
        self.lock = asyncio.Lock()
