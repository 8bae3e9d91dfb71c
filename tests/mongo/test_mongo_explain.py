"""Every list form and child page is an index scan with no blocking sort (seed, SPEC 12)."""

from __future__ import annotations

from typing import Any

import pytest
from pai_storage_mongo.store import LIST_SORT, MongoThreadStore

from pai_storage import CommittedResult, ListThreadsInput, ManualClock, ReadThreadInput
from pai_storage import builders as b

pytestmark = pytest.mark.asyncio

LIST_FORMS: dict[str, dict[str, Any]] = {
    "visible": {},
    "hidden": {"includeHidden": True},
    "agent": {"agent": "a0"},
    "agent-hidden": {"agent": "a0", "includeHidden": True},
    "agent-parent": {"agent": "a0", "parentThreadId": "p0"},
    "agent-parent-hidden": {"agent": "a0", "parentThreadId": "p0", "includeHidden": True},
    "agent-category": {"agent": "a0", "category": "c0"},
    "agent-category-hidden": {"agent": "a0", "category": "c0", "includeHidden": True},
    "trusted-parent": {"parentThreadId": "p0", "includeHidden": True},
    "trusted-category": {"category": "c1"},
}


def _plain(store: MongoThreadStore, family: str) -> Any:
    """The collection with PyMongo's default codec (explain output as plain dicts)."""
    return store.database.client[store.db_name][store.collection_names()[family]]


def _stages(plan: Any) -> list[str]:
    found: list[str] = []
    if isinstance(plan, dict):
        if "stage" in plan:
            found.append(plan["stage"])
        for key in ("inputStage", "queryPlan", "winningPlan"):
            if key in plan:
                found += _stages(plan[key])
        for child in plan.get("inputStages", []):
            found += _stages(child)
    return found


async def _populate(store: MongoThreadStore, clock: ManualClock) -> None:
    for i in range(40):
        clock.advance(ms=1 + i % 3)
        extra: dict[str, Any] = {}
        if i % 4 == 0:
            extra["parentThreadId"] = f"p{i % 8 // 4}"
        if i % 3 == 0:
            extra["category"] = f"c{i % 2}"
        created = await store.commit_thread(
            b.create(
                "scope",
                f"t{i:02d}",
                agent=f"a{i % 2}",
                visibility="hidden" if i % 5 == 0 else "visible",
                **extra,
            )
        )
        assert isinstance(created, CommittedResult)


async def _explain(store: MongoThreadStore, query: Any, hint: Any) -> list[str]:
    cursor = _plain(store, "threads").find(query, sort=LIST_SORT, hint=hint).limit(3)
    explained = await cursor.explain()
    return _stages(explained["queryPlanner"]["winningPlan"])


@pytest.mark.parametrize("form", sorted(LIST_FORMS))
async def test_list_forms_use_an_index_without_sorting(
    mongo_store: MongoThreadStore, clock: ManualClock, form: str
) -> None:
    await _populate(mongo_store, clock)
    request = {"scopeKey": "scope", "limit": 2, **LIST_FORMS[form]}
    first = await mongo_store.list_threads(request)
    assert first.next_page_token is not None
    for token in (None, first.next_page_token):
        plan = mongo_store.plan_list(
            ListThreadsInput.model_validate({**request, "pageToken": token})
        )
        query, hint = mongo_store.list_query(plan)
        assert query["listVisibility"] in ("visible", {"$in": ["visible", "hidden"]})
        stages = _explain_result = await _explain(mongo_store, query, hint)
        assert "IXSCAN" in stages, (form, stages)
        assert "SORT" not in stages, (form, stages)
        assert "COLLSCAN" not in stages, (form, stages)
        if LIST_FORMS[form].get("includeHidden") and "agent" in LIST_FORMS[form]:
            assert "SORT_MERGE" in _explain_result


@pytest.mark.parametrize(
    ("family", "selection"),
    [
        ("messages", {"type": "page", "view": "raw", "page": {"limit": 5}}),
        (
            "messages",
            {"type": "page", "view": "transcript", "order": "newest", "page": {"limit": 5}},
        ),
        ("messages", {"type": "page", "view": "context", "page": {"limit": 5}}),
        ("runs", {"type": "page", "order": "newest", "page": {"limit": 5}}),
        ("runs", {"type": "page", "statuses": ["completed"], "page": {"limit": 5}}),
        ("queuedItems", {"type": "page", "runId": "r1", "page": {"limit": 5}}),
    ],
)
async def test_child_pages_use_an_index_without_sorting(
    mongo_store: MongoThreadStore, family: str, selection: dict[str, Any]
) -> None:
    messages = [
        {"type": "insert", "record": b.message(f"m{i}", transcript=i % 2 == 0)} for i in range(20)
    ]
    created = await mongo_store.commit_thread(b.create("scope", "t", {"messages": messages}))
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    request = ReadThreadInput.model_validate(b.read("scope", "t", **{family: selection}))
    read_plan = mongo_store._selections.plan_read(request)
    sub = {
        "messages": read_plan.messages,
        "runs": read_plan.runs,
        "queuedItems": read_plan.queued_items,
    }[family]
    assert sub is not None
    assert not isinstance(sub, type(None))
    window = sub.window(created.thread.version, 20)  # type: ignore[union-attr]
    key = {"scopeKey": "scope", "threadId": "t"}
    query, sort, hint = mongo_store.page_query(family, key, sub, window)  # type: ignore[arg-type]
    col = _plain(mongo_store, family)
    explained = await col.find(query, sort=sort, hint=hint).limit(window.fetch).explain()
    stages = _stages(explained["queryPlanner"]["winningPlan"])
    assert "IXSCAN" in stages, stages
    assert "SORT" not in stages, stages
