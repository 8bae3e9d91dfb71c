"""Every list form and child page is an index scan with no blocking sort.

The indexes are listed in ``docs/mongodb.md#data-model``; ``docs/performance.md`` states
the cost model (a page read costs O(page), not O(thread)).
"""

from __future__ import annotations

from typing import Any

import pytest
from pai_storage_mongo.store import LIST_SORT, MongoThreadStore

from pai_storage import (
    CommittedResult,
    ListThreadsInput,
    ManualClock,
    ReadThreadInput,
)
from pai_storage import builders as b
from pai_storage.backend import IdsPlan

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
    read_plan = mongo_store.selections.plan_read(request)
    sub = {
        "messages": read_plan.messages,
        "runs": read_plan.runs,
        "queuedItems": read_plan.queued_items,
    }[family]
    assert sub is not None
    assert not isinstance(sub, type(None))
    window = sub.window(created.thread.version, 20)  # type: ignore[union-attr]
    key = {"scopeKey": "scope", "threadId": "t"}
    scans = mongo_store.page_queries(family, key, sub, window)  # type: ignore[arg-type]
    assert scans
    col = _plain(mongo_store, family)
    for query, sort, hint in scans:
        explained = await col.find(query, sort=sort, hint=hint).limit(window.fetch).explain()
        stages = _stages(explained["queryPlanner"]["winningPlan"])
        assert "IXSCAN" in stages, stages
        assert "SORT" not in stages, stages


async def _explain_page(
    store: MongoThreadStore, family: str, selection: dict[str, Any]
) -> tuple[list[list[str]], int]:
    """Each scan's plan stages for a child page, and the documents they examined in all."""
    request = ReadThreadInput.model_validate(b.read("scope", "t", **{family: selection}))
    read = await store.read_thread(request)
    assert read.thread is not None
    read_plan = store.selections.plan_read(request)
    sub = {"runs": read_plan.runs, "queuedItems": read_plan.queued_items}[family]
    assert sub is not None
    assert not isinstance(sub, IdsPlan)
    high_water = await _plain(store, family).count_documents({"scopeKey": "scope"})
    window = sub.window(read.thread.version, high_water)
    key = {"scopeKey": "scope", "threadId": "t"}
    stages: list[list[str]] = []
    examined = 0
    for query, sort, hint in store.page_queries(family, key, sub, window):
        cursor = _plain(store, family).find(query, sort=sort, hint=hint).limit(window.fetch)
        explained = await cursor.explain()
        stages.append(_stages(explained["queryPlanner"]["winningPlan"]))
        examined += explained["executionStats"]["totalDocsExamined"]
    return stages, examined


async def test_status_filtered_run_pages_examine_only_the_page(
    mongo_store: MongoThreadStore,
) -> None:
    """One failed and one cancelled run, then 3,000 completed ones: the old runs are
    found without walking the completed ones (one bounded index scan per status)."""
    runs = [b.insert(b.run("f0", "failed")), b.insert(b.run("c0", "cancelled"))]
    runs += [b.insert(b.run(f"r{i:04d}", "completed")) for i in range(3000)]
    created = await mongo_store.commit_thread(b.create("scope", "t", {"runs": runs}))
    assert isinstance(created, CommittedResult)

    selection = {"type": "page", "statuses": ["failed"], "order": "newest", "page": {"limit": 1}}
    stages, examined = await _explain_page(mongo_store, "runs", selection)
    assert len(stages) == 1
    assert "IXSCAN" in stages[0], stages
    assert "SORT" not in stages[0], stages
    assert examined <= 2, examined
    read = await mongo_store.read_thread(b.read("scope", "t", runs=selection))
    assert read.runs is not None
    assert [r.run_id for r in read.runs.items] == ["f0"]
    assert read.runs.next_page_token is None

    both = {
        "type": "page",
        "statuses": ["failed", "cancelled"],
        "order": "newest",
        "page": {"limit": 1},
    }
    stages, examined = await _explain_page(mongo_store, "runs", both)
    assert len(stages) == 2
    assert all("IXSCAN" in s and "SORT" not in s for s in stages), stages
    assert examined <= 4, examined
    first = await mongo_store.read_thread(b.read("scope", "t", runs=both))
    assert first.runs is not None
    assert [r.run_id for r in first.runs.items] == ["c0"]
    assert first.runs.next_page_token is not None
    second = await mongo_store.read_thread(
        b.read(
            "scope",
            "t",
            runs={**both, "page": {"limit": 1, "pageToken": first.runs.next_page_token}},
        )
    )
    assert second.runs is not None
    assert [r.run_id for r in second.runs.items] == ["f0"]
    assert second.runs.next_page_token is None
    oldest = await mongo_store.read_thread(
        b.read("scope", "t", runs={**both, "order": "oldest", "page": {"limit": 5}})
    )
    assert oldest.runs is not None
    assert [r.run_id for r in oldest.runs.items] == ["f0", "c0"]
    mixed = await mongo_store.read_thread(
        b.read(
            "scope",
            "t",
            runs={"type": "page", "statuses": ["completed", "failed"], "page": {"limit": 3}},
        )
    )
    assert mixed.runs is not None
    assert [r.run_id for r in mixed.runs.items] == ["f0", "r0000", "r0001"]


async def test_run_filtered_queue_pages_examine_only_the_page(
    mongo_store: MongoThreadStore,
) -> None:
    """The target run's queued item first, then 3,000 items of other runs."""
    runs = [b.insert(b.run(f"r{i:04d}", "queued", queue_item_id=f"q{i:04d}")) for i in range(3001)]
    items = [b.insert(b.queued_item(f"q{i:04d}", f"r{i:04d}")) for i in range(3001)]
    created = await mongo_store.commit_thread(
        b.create("scope", "t", {"runs": runs, "queuedItems": items})
    )
    assert isinstance(created, CommittedResult)
    selection = {"type": "page", "runId": "r0000", "order": "newest", "page": {"limit": 1}}
    stages, examined = await _explain_page(mongo_store, "queuedItems", selection)
    assert len(stages) == 1
    assert "IXSCAN" in stages[0], stages
    assert "SORT" not in stages[0], stages
    assert examined <= 2, examined
    read = await mongo_store.read_thread(b.read("scope", "t", queuedItems=selection))
    assert read.queued_items is not None
    assert [i.queue_item_id for i in read.queued_items.items] == ["q0000"]


def _collect(plan: Any, key: str) -> list[Any]:
    """Every value of ``key`` anywhere in an explain document."""
    found: list[Any] = []
    if isinstance(plan, dict):
        for k, v in plan.items():
            found += [v] if k == key else _collect(v, key)
    elif isinstance(plan, list):
        for item in plan:
            found += _collect(item, key)
    return found


@pytest.mark.parametrize("order", ["newest", "oldest"])
@pytest.mark.parametrize("view", ["transcript", "context", "raw"])
async def test_a_first_page_read_with_the_root_is_bounded(
    mongo_store: MongoThreadStore, view: str, order: str
) -> None:
    from pai_storage_mongo.reads import MongoSnapshot

    created = await mongo_store.commit_thread(b.create("scope", "t"))
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    version = created.thread.version
    for batch in range(6):
        messages = [
            {
                "type": "insert",
                "record": b.message(f"m{batch}.{i}", transcript=i % 3 != 0, context=i % 4 != 0),
            }
            for i in range(50)
        ]
        result = await mongo_store.commit_thread(
            b.update_at("scope", "t", version, {"messages": messages}, root=b.root())
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        version = result.thread.version
    request = ReadThreadInput.model_validate(
        b.read(
            "scope",
            "t",
            messages={"type": "page", "view": view, "order": order, "page": {"limit": 20}},
        )
    )
    plan = mongo_store.selections.plan_read(request)
    key = {"scopeKey": "scope", "threadId": "t"}
    stages, families = MongoSnapshot(mongo_store, None, key, None, plan)._first_pages()  # type: ignore[arg-type]
    assert families == ["messages"]
    pipeline = [{"$match": key}, {"$limit": 1}, *stages]
    explained = await mongo_store.database.command(
        "explain",
        {
            "aggregate": mongo_store.collection_names()["threads"],
            "pipeline": pipeline,
            "cursor": {},
        },
        verbosity="executionStats",
    )
    assert "COLLSCAN" not in str(explained)
    examined = _collect(explained, "totalDocsExamined")
    assert examined
    assert max(examined) <= 21  # the page + 1, never the thread's 300 messages
    read = await mongo_store.read_thread(request)
    assert read.messages is not None
    assert len(read.messages.items) == 20
