"""Scope erasure on the memory backend: nothing of the tenant is left in the stores'
own structures, expired data included (the scenario: ``support.erasure``)."""

from __future__ import annotations

import copy
from typing import Any

from support.erasure import BUNDLE_OPTIONS, check_erasure

from pai_storage import ManualClock, Stores, connect


def _dump(stores: Stores) -> Any:
    """Everything the memory stores hold, copied (their own structures are the database)."""
    threads: Any = stores.threads
    kv: Any = stores.kv
    state: Any = stores.state
    snapshots: Any = stores.snapshots
    return copy.deepcopy(
        {
            "threads": {scope: sorted(s.threads) for scope, s in threads._scopes.items()},
            "kv": kv._entries,
            "state": state._users,
            "snapshots": {scope: sorted(s) for scope, s in snapshots._scopes.items()},
        }
    )


async def test_erase_scope_leaves_nothing_of_the_tenant() -> None:
    clock = ManualClock()
    async with connect("memory://", clock=clock, **BUNDLE_OPTIONS) as stores:

        async def dump() -> Any:
            return _dump(stores)

        await check_erasure(stores, clock, dump)
