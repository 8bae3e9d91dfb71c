"""The scope-erasure scenario every backend's test runs, checked against the raw database.

:func:`check_erasure` fills a bundle with two tenants' data — threads with
messages, runs and queued items; key-value items, sessions with values and
lists, snapshots — lets part of the erased tenant's runtime data expire (the
clock moves 31 days: past the items' TTL, the default 30-day session TTL and
the 2-day snapshot TTL of :data:`BUNDLE_OPTIONS`), writes some live data
after that, and erases the tenant with :meth:`Stores.erase_scope`. ``dump``
reads every table or collection the bundle uses straight from the database
(raw SQL, raw PyMongo, the memory stores' own structures): after the erasure
it must be exactly what it was when only the other tenant had data, so no row
of the erased tenant is left, expired or not, and nothing else was touched.
The other tenant's name begins with the erased one's (``acme``/``acme2``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from pai_storage_conformance.suite.lifecycle import build_conversation

from pai_storage import ManualClock, ScopeErasure, Stores
from pai_storage import builders as b

ERASED = "acme"
KEPT = "acme2"

BUNDLE_OPTIONS: dict[str, Any] = {"snapshot_ttl": timedelta(days=2)}
"""Options :func:`check_erasure` needs of the bundle (with ``clock=`` its clock)."""

Dump = Callable[[], Awaitable[Any]]


async def _fill(stores: Stores, clock: ManualClock, scope: str) -> None:
    await build_conversation(stores.threads, clock, scope, "conv")
    await stores.threads.commit_thread(b.create(scope, "hidden", visibility="hidden"))
    await stores.kv.put((scope,), "k", {"v": 1})
    await stores.kv.put((scope, "deep"), "ttl", 2, ttl=timedelta(days=1))
    await stores.kv.put((scope,), "ttl", 3, ttl=timedelta(hours=1))
    await stores.state.save(scope, "s1", "x", {"v": 1})
    await stores.state.append_list(scope, "s1", "log", [1, 2, 3])
    await stores.state.save(scope, "s2", "y", "text")
    await stores.snapshots.put(scope, "snap1", b"\x00data")


async def check_erasure(stores: Stores, clock: ManualClock, dump: Dump) -> None:
    """Run the scenario on an initialized bundle opened with ``clock`` and
    :data:`BUNDLE_OPTIONS` whose database holds nothing else; ``dump`` reads it raw."""
    await _fill(stores, clock, KEPT)
    baseline = await dump()
    await _fill(stores, clock, ERASED)
    assert await dump() != baseline
    clock.advance(timedelta(days=31))
    # Live data of the erased tenant, written after the rest expired.
    await stores.kv.put((ERASED,), "fresh", 4)
    await stores.state.save(ERASED, "s3", "z", 5)
    await stores.snapshots.put(ERASED, "snap2", b"live")
    # Expired data is invisible to reads, but still stored.
    assert len((await stores.kv.search((ERASED,))).items) == 2
    assert (await stores.state.list_session_ids(ERASED)).items == ["s3"]
    assert [i.snapshot_id for i in (await stores.snapshots.list(ERASED)).items] == ["snap2"]

    erased = await stores.erase_scope(ERASED)

    assert erased == ScopeErasure(threads=2, kv_items=4, sessions=3, snapshots=2)
    assert await dump() == baseline
    again = await stores.erase_scope(ERASED)
    assert again == ScopeErasure()
