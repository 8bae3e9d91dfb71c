"""Thread contents the backends' layout tests write."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pai_storage import StoreWarning, ThreadStore
from pai_storage import builders as b


def every_family_create(thread_id: str = "t1", **root: Any) -> dict[str, Any]:
    """A create of ``scope``/``thread_id`` touching every family and the lease: m1
    and running r1, r2 queued with q1, the lease held for r1; ``root`` adds root
    fields (``b.create``'s keywords)."""
    return b.create(
        "scope",
        thread_id,
        {
            "messages": [{"type": "insert", "record": b.message("m1", run_id="r1")}],
            "runs": [
                {"type": "insert", "record": b.run("r1", inputs=["m1"])},
                {"type": "insert", "record": b.run("r2", "queued", queue_item_id="q1")},
            ],
            "queuedItems": [{"type": "insert", "record": b.queued_item("q1", "r2", {"n": 1})}],
            "lease": b.acquire("r1", "w1"),
        },
        **root,
    )


async def check_first_list_batch_invalid(
    store: ThreadStore,
    warnings: list[StoreWarning],
    corrupt: Callable[[str], Awaitable[None]],
    *,
    include_hidden: bool,
    stem: str = "",
) -> None:
    """A list whose whole first batch (limit 2: three rows) is invalid roots.

    Creates ``{stem}t0`` .. ``{stem}t7`` in scope ``s`` (two hidden), lets
    ``corrupt(thread_id)`` spoil the first three listed behind the store's
    back, and checks that the page comes from the next batch, after the last of
    them, that ``warnings`` (the store's ``on_warning`` list) names the three,
    and that the next page follows.
    """
    for i in range(8):
        hidden = "hidden" if i % 4 == 3 else "visible"
        await store.commit_thread(b.create("s", f"{stem}t{i}", visibility=hidden))
    request = {"scopeKey": "s", "limit": 10, "includeHidden": include_hidden}
    listed = [t.thread_id for t in (await store.list_threads(request)).items]
    assert len(listed) == (8 if include_hidden else 6)
    for thread_id in listed[:3]:
        await corrupt(thread_id)
    page = await store.list_threads(request | {"limit": 2})
    assert [t.thread_id for t in page.items] == listed[3:5]
    assert [w.thread_id for w in warnings] == listed[:3]
    rest = await store.list_threads(request | {"pageToken": page.next_page_token})
    assert [t.thread_id for t in rest.items] == listed[5:]
    assert rest.next_page_token is None
