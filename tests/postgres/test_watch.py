"""A watcher whose connection is cut keeps following the thread (docs/watch.md).

The watcher's store reaches PostgreSQL through a fault proxy; the writer's does
not. While the proxy refuses connections the watcher's reads fail, commits go
on, and once the proxy is back the watcher re-reads the head: the changes it
reports still form an unbroken chain that ends at the final version.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from pai_storage_postgres import PostgresThreadStore
from support.proxy import FaultProxy

from pai_storage import ReadThreadInput, ThreadChange, ThreadReadResult
from pai_storage.errors import ThreadStoreUnavailableError

from .helpers import URL, proxied_url

pytestmark = pytest.mark.asyncio

HANG_GUARD = 60.0  # seconds: reached only when a change is never reported


class _Noticing(PostgresThreadStore):
    """Sets ``failed`` when a read finds the backend unavailable."""

    failed: asyncio.Event

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        try:
            return await super()._read_thread(request)
        except ThreadStoreUnavailableError:
            self.failed.set()
            raise


async def test_a_cut_connection_loses_no_version(fault_proxy: FaultProxy, pg_schema: str) -> None:
    watching = _Noticing(proxied_url(fault_proxy.port), schema=pg_schema, max_pool_size=1)
    watching.failed = asyncio.Event()
    writing = PostgresThreadStore(URL, schema=pg_schema)
    async with watching, writing:
        chat = writing.conversation("s", "t")
        await chat.add("user", "first")
        start = await chat.get()
        assert start is not None
        changes = watching.watch("s", "t", after=start.version, interval=0.2)
        seen: list[ThreadChange] = []
        async with asyncio.timeout(HANG_GUARD):
            await chat.add("user", "before the cut")
            seen.append(await anext(changes))
            fault_proxy.cut()
            following = asyncio.create_task(anext(changes))
            await watching.failed.wait()  # a read of the watcher failed
            for i in range(3):
                await chat.add("user", f"during the cut {i}")
            fault_proxy.restore()
            seen.append(await following)
            final = await chat.get()
            assert final is not None
            while seen[-1].version != final.version:
                seen.append(await anext(changes))
        await changes.aclose()
    assert seen[0].previous == start.version
    for one, two in itertools.pairwise(seen):
        assert two.previous == one.version
    assert sum(c.commits or 0 for c in seen) == final.version.revision - start.version.revision
