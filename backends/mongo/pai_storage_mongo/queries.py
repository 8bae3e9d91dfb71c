"""The filter, sort and index hint of each thread-store query.

Pure functions of a plan (no I/O): the store sends what they return, and
``tests/mongo/test_explain.py`` asks the server to explain each one, so every
query is a bounded range of the index it hints, in that index's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pymongo import ASCENDING, DESCENDING

from pai_storage.backend import ChildPagePlan, ListPlan, ThreadIndexEntry, Window

from .indexes import Doc, Keys, key_pattern

if TYPE_CHECKING:
    pass


__all__ = ["heads_queries", "list_query", "live_ranges", "ms_to_datetime", "page_queries"]

_A, _D = ASCENDING, DESCENDING

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def page_queries(
    family: str, key: Doc, plan: ChildPagePlan, window: Window
) -> list[tuple[Doc, Keys, Keys]]:
    """The filter, sort and index hint of each scan of one child page.

    Each is a bounded ``_order`` range read in index order (``limit`` page+1).
    A run page filtered by several statuses is one scan per status, merged
    by position; every other page is one scan.
    """
    query: Doc = {**key, "_order": {"$gt": window.lower, "$lt": window.upper}}
    hint = key_pattern(family, "scope_thread_order_unique")
    sort = [("_order", _A if window.order == "oldest" else _D)]
    if family == "messages" and plan.view in ("transcript", "context"):
        query[f"visibility.{plan.view}"] = True
        hint = key_pattern(family, f"scope_thread_{plan.view}_order")
    elif family == "runs" and plan.statuses is not None:
        hint = key_pattern(family, "scope_thread_status_order")
        return [({**query, "status": status}, sort, hint) for status in sorted(plan.statuses)]
    elif family == "queuedItems" and plan.run_id is not None:
        query["runId"] = plan.run_id
        hint = key_pattern(family, "scope_thread_run_order")
    return [(query, sort, hint)]


def list_query(plan: ListPlan) -> tuple[Doc, Keys]:
    """The filter and index hint serving a list plan (sorted by :data:`LIST_SORT`).

    ``listVisibility`` is always bound (``"visible"`` or ``$in`` both values)
    so the ``updatedAt`` order comes from the index; the keyset cursor
    bounds ``updatedAt`` and filters the tie on ``threadId``.
    """
    query: Doc = {
        "scopeKey": plan.scope_key,
        "listVisibility": {"$in": ["visible", "hidden"]} if plan.include_hidden else "visible",
    }
    if plan.agent is not None:
        query["agent"] = plan.agent
        if plan.parent_thread_id is not None:
            index = "scope_agent_visibility_parent_updated"
        elif plan.category is not None:
            index = "scope_agent_visibility_category_updated"
        else:
            index = "scope_agent_visibility_updated"
    else:
        index = "scope_updated" if plan.include_hidden else "scope_visibility_updated"
    if plan.parent_thread_id is not None:
        query["parentThreadId"] = plan.parent_thread_id
    if plan.category is not None:
        query["category"] = plan.category
    if plan.cursor is not None:
        updated_ms, thread_id = plan.cursor
        updated = ms_to_datetime(updated_ms)
        query["updatedAt"] = {"$lte": updated}
        query["$or"] = [{"updatedAt": {"$lt": updated}}, {"threadId": {"$gt": thread_id}}]
    return query, key_pattern("threads", index)


def heads_queries(
    scope_key: str | None, updated_before: datetime | None, after: ThreadIndexEntry | None
) -> tuple[list[Doc], Keys, Keys]:
    """The filters (read in turn), sort and index hint of one ``_thread_heads`` call.

    The keyset bound "strictly after ``after``" is split into index ranges:
    the rest of ``after``'s millisecond (its scope's later thread ids, then,
    across scopes, the later scopes), then the later milliseconds up to the
    cutoff. Each is one bounded range of the hinted index in its order.
    """
    ranges: list[Doc] = []
    later: Doc = {}
    if after is not None:
        later["$gt"] = after.updated_at
    if updated_before is not None:
        later["$lt"] = updated_before
    if scope_key is not None:
        if after is not None:
            ranges.append(
                {
                    "scopeKey": scope_key,
                    "updatedAt": after.updated_at,
                    "threadId": {"$gt": after.thread_id},
                }
            )
        ranges.append({"scopeKey": scope_key, **({"updatedAt": later} if later else {})})
        sort: Keys = [("updatedAt", _A), ("threadId", _A)]
        return ranges, sort, key_pattern("threads", "scope_updated_asc")
    if after is not None:
        at = after.updated_at
        ranges.append(
            {"updatedAt": at, "scopeKey": after.scope_key, "threadId": {"$gt": after.thread_id}}
        )
        ranges.append({"updatedAt": at, "scopeKey": {"$gt": after.scope_key}})
    ranges.append({"updatedAt": later} if later else {})
    sort = [("updatedAt", _A), ("scopeKey", _A), ("threadId", _A)]
    return ranges, sort, key_pattern("threads", "updated_scope_asc")


def live_ranges(ranges: Sequence[Doc], updated_before: datetime | None) -> list[Doc]:
    """The ranges of ``_thread_heads`` left once the rest of a millisecond at or after
    the cutoff is dropped."""
    return [
        query
        for query in ranges
        if updated_before is None
        or not isinstance(query.get("updatedAt"), datetime)
        or query["updatedAt"] < updated_before
    ]
