"""The thread store's four collections and their indexes, by name.

:data:`INDEXES` is the documented index set (``docs/mongodb.md``); the store
creates it at ``initialize()`` and every query hints one of its entries by
name (:func:`key_pattern`). :data:`SUFFIXES` names each collection after the
thread collection.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pymongo import ASCENDING, DESCENDING

__all__ = ["INDEXES", "LIST_SORT", "SUFFIXES", "Doc", "Index", "Keys", "key_pattern"]

Doc = dict[str, Any]
Keys = list[tuple[str, int]]

_A, _D = ASCENDING, DESCENDING

# The physical name of each collection: the thread collection's name plus a suffix.
SUFFIXES: dict[str, str] = {
    "threads": "",
    "messages": "_messages",
    "runs": "_runs",
    "queuedItems": "_pending_messages",
}


class Index(NamedTuple):
    """One index: its key pattern and whether it is unique."""

    keys: Keys
    unique: bool = False


_SCOPE_THREAD: Keys = [("scopeKey", _A), ("threadId", _A)]
_UPDATED: Keys = [("updatedAt", _D), ("threadId", _A)]


def _thread_child(*fields: str) -> Keys:
    return [*_SCOPE_THREAD, *((f, _A) for f in fields)]


# The documented index set plus two child-page indexes (docs/mongodb.md), by collection
# and index name. The query hints below are looked up here by name.
INDEXES: dict[str, dict[str, Index]] = {
    "threads": {
        "scope_thread_unique": Index(_SCOPE_THREAD, unique=True),
        "scope_updated": Index([("scopeKey", _A), *_UPDATED]),
        "scope_visibility_updated": Index([("scopeKey", _A), ("listVisibility", _A), *_UPDATED]),
        "scope_agent_visibility_updated": Index(
            [("scopeKey", _A), ("agent", _A), ("listVisibility", _A), *_UPDATED]
        ),
        "scope_agent_visibility_parent_updated": Index(
            [
                ("scopeKey", _A),
                ("agent", _A),
                ("listVisibility", _A),
                ("parentThreadId", _A),
                *_UPDATED,
            ]
        ),
        "scope_agent_visibility_category_updated": Index(
            [("scopeKey", _A), ("agent", _A), ("listVisibility", _A), ("category", _A), *_UPDATED]
        ),
        # Beyond the reference layout: the updated-at index of the lifecycle sweeps
        # (``_thread_heads``), one scope's and every scope's, in ascending order.
        "scope_updated_asc": Index([("scopeKey", _A), ("updatedAt", _A), ("threadId", _A)]),
        "updated_scope_asc": Index([("updatedAt", _A), ("scopeKey", _A), ("threadId", _A)]),
    },
    "messages": {
        "scope_thread_message_unique": Index(_thread_child("messageId"), unique=True),
        "scope_thread_order_unique": Index(_thread_child("_order"), unique=True),
        "scope_thread_transcript_order": Index(_thread_child("visibility.transcript", "_order")),
        "scope_thread_context_order": Index(_thread_child("visibility.context", "_order")),
        "scope_thread_association_order": Index(
            _thread_child("association.kind", "association.runId", "_order")
        ),
        "scope_thread_status_order": Index(_thread_child("status", "_order")),
    },
    "queuedItems": {
        "scope_thread_queue_item_unique": Index(_thread_child("queueItemId"), unique=True),
        "scope_thread_order_unique": Index(_thread_child("_order"), unique=True),
        "scope_thread_run_queue_item": Index(_thread_child("runId", "queueItemId")),
        # Beyond the reference layout: queued-item pages filtered by run, in ``_order`` order.
        "scope_thread_run_order": Index(_thread_child("runId", "_order")),
    },
    "runs": {
        "scope_thread_run_unique": Index(_thread_child("runId"), unique=True),
        "scope_thread_order_unique": Index(_thread_child("_order"), unique=True),
        "scope_thread_status_run": Index(_thread_child("status", "runId")),
        "scope_thread_status_admission_run": Index(
            _thread_child("status", "admission.queueItemId", "runId")
        ),
        # Beyond the reference layout: run pages filtered by status, in ``_order`` order (one
        # bounded scan per status; the reference ``{status, runId}`` index cannot give it).
        "scope_thread_status_order": Index(_thread_child("status", "_order")),
    },
}


def key_pattern(collection: str, name: str) -> Keys:
    """The key pattern of one of :data:`INDEXES` (a query hint)."""
    return INDEXES[collection][name].keys


LIST_SORT: Keys = [("updatedAt", _D), ("threadId", _A)]
