"""One type for every conditional write that found something else current.

A conditional write (``commit_thread``, ``kv.put_if_version``,
``state.save_if_version``, ``state.append_list(..., expected_length=...)``)
whose condition does not hold writes nothing and *returns* a conflict: an
expected outcome, not an exception. Every such result is a :class:`Conflict`::

    Conflict
    ├── ConflictResult   commit_thread: the thread's current version
    ├── KVConflict       kv.put_if_version: the current item
    ├── StateConflict    state.save_if_version: the current version
    └── ListConflict     state.append_list(expected_length=...): the current length

Code that prefers an exception wraps the call in :func:`raise_on_conflict`,
which returns the written result or raises :class:`ConflictError` carrying the
conflict. The user guide is ``docs/errors.md``.
"""

from __future__ import annotations

from typing import TypeVar

from .errors import ConflictError

__all__ = ["Conflict", "ConflictError", "raise_on_conflict"]

_T = TypeVar("_T")


class Conflict:
    """Base of every conflict result: nothing was written, and it says what is current.

    Each subclass carries what is stored now (a version, an item, a length),
    so the caller can re-read or re-plan and try again.
    """

    __slots__ = ()

    def describe(self) -> str:
        """What is current, in plain words (never a stored value)."""
        # The default serves the thread store's ConflictResult, defined with the
        # records (pai_storage.models); the runtime stores' conflicts override it.
        current = getattr(self, "current_version", None)
        if current is None:
            return "the thread does not exist (or was deleted)"
        return f"the thread is at revision {getattr(current, 'revision', '?')}"

    def error(self) -> ConflictError:
        """This conflict as an exception (:class:`ConflictError`), to raise."""
        error = ConflictError(
            f"{type(self).__name__}: the conditional write was not applied, "
            f"{self.describe()}; re-read and try again"
        )
        error.conflict = self
        return error


def raise_on_conflict(result: _T | Conflict) -> _T:
    """``result`` unless it is a :class:`Conflict`; then raise its :class:`ConflictError`.

    One call turns the "returns a conflict" style into the "raises" style::

        item = raise_on_conflict(await kv.put_if_version(ns, key, value, 3))
    """
    if isinstance(result, Conflict):
        raise result.error()
    return result
