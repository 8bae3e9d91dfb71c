"""Records validated from stored data, remembered by that exact data.

An agent reads the newest messages of its thread on every turn, so a store
reads the same stored records again and again, and validating a record costs
more than fetching it. A record is a function of its stored text (or bytes)
alone, so a store keeps, per process, the records it validated more than
once, keyed by their model and their exact stored data: reading that data
again gives a copy of the record without parsing it (``docs/performance.md``,
"Stored records remembered").

What this keeps:

- **Only what was stored and read twice, or written.** A record read once (a
  history page walked once, a thread read once) is never kept, so it costs
  nothing but a lookup. The second read of the same data keeps a copy. A
  store may also keep what it has just written (:meth:`StoredMemo.keep`): a
  commit's root and records are what the next read reads.
- **Copies only.** The kept value is never handed out: every hit is a copy
  made by ``copy`` (for records, what ``pai_storage.models.detached`` gives:
  every ``dict`` and ``list`` copied, planned once per record kept), so
  mutating a record you read never changes what a later read gives.
- **Valid data only.** Data that fails validation raises each time it is read.
- **A bound.** At most ``entries`` values, built from at most ``size``
  characters (or bytes) of stored data in all, and none from data longer than
  ``size // 64``; the oldest kept go first (a hit does not make a value
  younger: lookups take no lock and change nothing). ``resize(entries=0,
  size=0)`` keeps none. The bound counts stored data, not the Python objects
  kept, which take several times as much memory.
- **``str`` or ``bytes`` data only**; anything else is never kept.

Adding takes a lock, so stores in several threads share a memo safely.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["REMEMBERED", "StoredMemo", "remember"]

V = TypeVar("V")
K = TypeVar("K", bound=Hashable)


REMEMBERED = 8192
"""How many entries a :func:`remember` memory holds by default."""


def remember(memory: dict[K, V], key: K, value: V, limit: int = REMEMBERED) -> V:
    """Put ``value`` in ``memory`` under ``key`` and return it; a memory that
    holds ``limit`` entries starts over first (``dict.clear`` and one item
    set are atomic: threads may share the memory)."""
    if len(memory) >= limit:
        memory.clear()
    memory[key] = value
    return value


_KEYS = frozenset({str, bytes})  # immutable and hashable (not bytearray, not memoryview)


class StoredMemo(Generic[V]):
    """Values built from stored data, by ``(kind, data)``; see the module docstring.

    ``copy`` makes the copy a hit hands out from what is kept. What is kept is
    the value itself, or ``kept(value)`` when given: a form made once per value
    kept (the records' memo keeps each record with its copy planned,
    :func:`pai_storage.models.planned`), which ``copy`` then takes.
    """

    def __init__(
        self,
        copy: Callable[[Any], V],
        *,
        entries: int,
        size: int,
        kept: Callable[[V], Any] | None = None,
    ) -> None:
        self._copy = copy
        self._kept = kept
        # First in, first out: OrderedDict drops its oldest entry in constant time
        # (a dict's first entry is found past the slots of every entry deleted).
        self._values: OrderedDict[tuple[Hashable, str | bytes], Any] = OrderedDict()
        self._seen: set[int] = set()
        self._used = 0
        self._lock = threading.Lock()
        self._entries = self._size = self._largest = 0
        self.resize(entries=entries, size=size)

    def __len__(self) -> int:
        """How many values are kept now."""
        return len(self._values)

    @property
    def used(self) -> int:
        """The length of the stored data the kept values were built from, in all."""
        return self._used

    @property
    def limits(self) -> tuple[int, int]:
        """``(entries, size)`` as last given to :meth:`resize`."""
        return self._entries, self._size

    def resize(self, *, entries: int, size: int) -> None:
        """Keep at most ``entries`` values built from at most ``size`` characters
        (or bytes) of stored data in all; the oldest kept go first. ``0`` keeps none."""
        for name, value in (("entries", entries), ("size", size)):
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an integer >= 0")
        with self._lock:
            self._entries, self._size, self._largest = entries, size, size // 64
            for key in [key for key in self._values if len(key[1]) > self._largest]:
                del self._values[key]
                self._used -= len(key[1])
            self._shrink()
            self._seen.clear()

    def clear(self) -> None:
        """Forget every value."""
        with self._lock:
            self._values.clear()
            self._seen.clear()
            self._used = 0

    def get(self, kind: Hashable, data: str | bytes) -> V | None:
        """A copy of the value built from ``data`` as ``kind``, or ``None``
        (:meth:`get_many` of one data)."""
        return self.get_many(kind, (data,))[0]

    def get_many(self, kind: Hashable, datas: Iterable[str | bytes]) -> list[V | None]:
        """For each of ``datas`` (a page's records), a copy of the value built
        from it as ``kind``, or ``None`` (always for data that is not ``str``
        or ``bytes``, or too long to keep)."""
        values, copy, largest = self._values, self._copy, self._largest
        found: list[V | None] = []
        for data in datas:
            kept = (
                values.get((kind, data)) if type(data) in _KEYS and len(data) <= largest else None
            )
            found.append(None if kept is None else copy(kept))
        return found

    def add(self, kind: Hashable, data: str | bytes, value: V) -> None:
        """Offer ``value``, just built from ``data`` as ``kind`` and handed out by
        the caller: a copy is kept when the same data was offered before."""
        if not self.keeps(data):
            return
        key = (kind, data)
        mark = hash(key)  # a collision only keeps a value early
        seen = self._seen
        if mark not in seen:
            if len(seen) >= 4 * self._entries:
                seen.clear()
            seen.add(mark)
            return
        self._put(key, self._copy(value if self._kept is None else self._kept(value)))

    def keeps(self, data: str | bytes) -> bool:
        """Whether a value built from ``data`` can be kept: ``str`` or ``bytes``
        data within the bounds, with the memo on. A caller that has to make the
        value it would :meth:`keep` asks first, and makes nothing otherwise."""
        return type(data) in _KEYS and len(data) <= self._largest and self._entries > 0

    def keep(self, kind: Hashable, data: str | bytes, value: V) -> None:
        """Keep ``value`` as the value built from ``data`` as ``kind``, at once:
        for data a store has just written, which it reads back next. ``value``
        becomes the memo's own: pass a value nobody else holds."""
        if self.keeps(data):
            self._put((kind, data), value)

    def _put(self, key: tuple[Hashable, str | bytes], value: V) -> None:
        kept = value if self._kept is None else self._kept(value)
        with self._lock:
            if key in self._values:
                return
            self._values[key] = kept
            self._used += len(key[1])
            self._shrink()

    def _shrink(self) -> None:
        values = self._values
        while values and (len(values) > self._entries or self._used > self._size):
            oldest, _ = values.popitem(last=False)
            self._used -= len(oldest[1])
