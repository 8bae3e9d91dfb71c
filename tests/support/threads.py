"""Thread contents the backends' layout tests write."""

from __future__ import annotations

from typing import Any

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
