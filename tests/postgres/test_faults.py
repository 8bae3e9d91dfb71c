"""Connection faults around a commit, injected by a loopback TCP proxy.

After every cut the thread is re-read through a direct connection: it shows
the whole commit or none of it, and the error raised is the one
``docs/errors.md`` promises for that moment:

- cut before ``COMMIT`` is sent (mid-transaction): ``ThreadStoreUnavailableError``,
  nothing applied;
- cut while ``COMMIT`` is in flight (dropped before the server sees it):
  ``ThreadStoreCommitUnknownError``, nothing applied;
- cut after the server committed (its reply swallowed):
  ``ThreadStoreCommitUnknownError``, everything applied.

An optimistic commit (the store committed the version it expects: one
statement, which commits itself) has only the last two moments: a cut while
its statement is in flight or its reply is swallowed is
``ThreadStoreCommitUnknownError``, with none or all of it applied.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pai_storage_postgres import PostgresThreadStore
from support.proxy import FaultProxy

from pai_storage import CommittedResult, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import (
    ThreadStoreCommitUnknownError,
    ThreadStoreError,
    ThreadStoreUnavailableError,
)

from .helpers import URL, proxied_url

pytestmark = pytest.mark.asyncio

SCOPE = "faults"


async def _setup(
    proxy: FaultProxy, schema: str, *, optimistic: bool = False
) -> tuple[PostgresThreadStore, PostgresThreadStore, ThreadVersion]:
    """The faulty store, a direct one, and the version of thread ``t1``: created by
    the direct store, or with ``optimistic`` by the faulty one (which then knows
    the version and commits the append optimistically)."""
    # One connection and no statement cache: every statement's SQL text
    # crosses the proxy, so the triggers below always see it. The optimistic
    # store keeps its own clock, so its write is guarded by the root alone:
    # guarded by the server's clock too, a slow moment on the way through the
    # proxy (which runs in this event loop) would let the clock pass the
    # prediction's window, and the write would rightly apply nothing.
    faulty = PostgresThreadStore(
        proxied_url(proxy.port),
        schema=schema,
        min_pool_size=1,
        max_pool_size=1,
        statement_cache_size=0,
        clock=(lambda: datetime.now(UTC)) if optimistic else None,
    )
    direct = PostgresThreadStore(URL, schema=schema)
    await faulty.initialize()
    await direct.initialize()
    created = await (faulty if optimistic else direct).commit_thread(
        b.create(SCOPE, "t1", {"messages": [b.insert(b.message("m1", "first"))]})
    )
    assert isinstance(created, CommittedResult)
    assert created.thread is not None
    return faulty, direct, created.thread.version


def _append(version: ThreadVersion) -> dict[str, Any]:
    return b.update_at(
        SCOPE,
        "t1",
        version,
        {"messages": [b.insert(b.message("m2", "second")), b.insert(b.message("m3", "third"))]},
        root=b.root(title="after"),
    )


async def _state(store: PostgresThreadStore) -> tuple[int, list[str], str | None]:
    read = await store.read_thread(
        b.read(SCOPE, "t1", messages={"type": "page", "view": "raw", "page": {"limit": 10}})
    )
    assert read.thread is not None
    assert read.messages is not None
    return (
        read.thread.version.revision,
        [m.message_id for m in read.messages.items],
        read.thread.title,
    )


NONE_APPLIED = (1, ["m1"], None)
ALL_APPLIED = (2, ["m1", "m2", "m3"], "after")


@pytest.mark.parametrize(
    ("optimistic", "trigger", "forward", "error", "expected"),
    [
        pytest.param(
            False,
            b"INSERT INTO",
            False,
            ThreadStoreUnavailableError,
            NONE_APPLIED,
            id="before-commit",
        ),
        pytest.param(
            False, b"COMMIT", False, ThreadStoreCommitUnknownError, NONE_APPLIED, id="during-commit"
        ),
        pytest.param(
            False, b"COMMIT", True, ThreadStoreCommitUnknownError, ALL_APPLIED, id="after-commit"
        ),
        # The optimistic commit's one statement, cut at its parameters (sent after
        # its text is parsed): while it is in flight, and once it was applied.
        pytest.param(
            True, b"third", False, ThreadStoreCommitUnknownError, NONE_APPLIED, id="optimistic"
        ),
        pytest.param(
            True,
            b"third",
            True,
            ThreadStoreCommitUnknownError,
            ALL_APPLIED,
            id="optimistic-applied",
        ),
    ],
)
async def test_cut_connection_applies_all_or_nothing(
    fault_proxy: FaultProxy,
    pg_schema: str,
    optimistic: bool,
    trigger: bytes,
    forward: bool,
    error: type[ThreadStoreError],
    expected: tuple[int, list[str], str | None],
) -> None:
    faulty, direct, version = await _setup(fault_proxy, pg_schema, optimistic=optimistic)
    try:
        fault_proxy.cut_on(trigger, forward=forward)
        with pytest.raises(error) as caught:
            await faulty.commit_thread(_append(version))
        assert fault_proxy.triggered.is_set()
        assert caught.value.__cause__ is not None  # the driver error is chained
        assert type(caught.value) is error
        assert await _state(direct) == expected
        # The store recovers: the pool replaces the dead connection.
        fault_proxy.restore()
        assert await _state(faulty) == expected
    finally:
        await faulty.close()
        await direct.close()


async def test_server_unreachable_is_unavailable(pg_schema: str) -> None:
    store = PostgresThreadStore(
        "postgresql://app:s3cr3t-pw@127.0.0.1:1/test", schema=pg_schema, connect_timeout=2
    )
    with pytest.raises(ThreadStoreUnavailableError) as caught:
        await store.initialize()
    assert "s3cr3t-pw" not in str(caught.value)
    assert "s3cr3t-pw" not in repr(store)


async def test_proxy_down_after_start_is_unavailable(
    fault_proxy: FaultProxy, pg_schema: str
) -> None:
    faulty, direct, version = await _setup(fault_proxy, pg_schema)
    try:
        await fault_proxy.stop()
        with pytest.raises(ThreadStoreUnavailableError):
            await faulty.commit_thread(_append(version))
        assert await _state(direct) == NONE_APPLIED
    finally:
        await faulty.close()
        await direct.close()


async def test_read_cut_is_unavailable(fault_proxy: FaultProxy, pg_schema: str) -> None:
    faulty, direct, _ = await _setup(fault_proxy, pg_schema)
    try:
        fault_proxy.cut_on(b"SELECT position, doc", forward=False)
        with pytest.raises(ThreadStoreUnavailableError):
            await _state(faulty)
        assert fault_proxy.triggered.is_set()
        fault_proxy.restore()
        assert await _state(faulty) == NONE_APPLIED
    finally:
        await faulty.close()
        await direct.close()
