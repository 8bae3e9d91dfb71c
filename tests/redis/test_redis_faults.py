"""A connection lost around a script: the error says what may have happened, never twice.

Through a :class:`FaultProxy` that cuts the connection at a chosen command: a
write whose reply is lost is an ``OutcomeUnknownError`` and was applied at most
once (the backend's clients never resend a script); a write cut before it
reached Redis is the same error (the client cannot tell) and changed nothing;
a read is ``UnavailableError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from support.proxy import FaultProxy

from pai_storage import KeyValueStore, OutcomeUnknownError, UnavailableError, open_kv_store


@pytest_asyncio.fixture
async def proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    from pai_storage import make_url

    parsed = make_url(redis_url)
    fault = FaultProxy(parsed.port or 6379, parsed.host or "127.0.0.1")
    await fault.start()
    yield fault
    await fault.stop()


@pytest_asyncio.fixture
async def stores(
    redis_url: str, prefix: str, proxy: FaultProxy
) -> AsyncIterator[tuple[KeyValueStore, KeyValueStore]]:
    """The store through the proxy, and one straight to the server to check with."""
    db = redis_url.rsplit("/", 1)[-1]
    cut = open_kv_store(f"redis://127.0.0.1:{proxy.port}/{db}", key_prefix=prefix)
    direct = open_kv_store(redis_url, key_prefix=prefix)
    async with cut, direct:
        await cut.put(("ns",), "k", "v1")  # connected, scripts loaded
        yield cut, direct


@pytest.mark.parametrize("forward", [True, False], ids=["reply-lost", "never-sent"])
async def test_a_cut_write_is_an_unknown_outcome_applied_at_most_once(
    stores: tuple[KeyValueStore, KeyValueStore], proxy: FaultProxy, forward: bool
) -> None:
    cut, direct = stores
    proxy.cut_on(b"marker-7c1f", forward=forward)
    with pytest.raises(OutcomeUnknownError, match="may or may not have been applied"):
        await cut.put(("ns",), "k", "marker-7c1f")
    assert proxy.triggered.is_set()
    item = await direct.get(("ns",), "k")
    assert item is not None
    if forward:
        assert (item.value, item.version) == ("marker-7c1f", 2)  # applied once, not resent
    else:
        assert (item.value, item.version) == ("v1", 1)
    proxy.restore()
    assert (await cut.put(("ns",), "k", "v3")).version == item.version + 1


async def test_a_cut_read_is_unavailable(
    stores: tuple[KeyValueStore, KeyValueStore], proxy: FaultProxy
) -> None:
    cut, _ = stores
    proxy.cut()
    with pytest.raises(UnavailableError):
        await cut.get(("ns",), "k")
    proxy.restore()
    item = await cut.get(("ns",), "k")
    assert item is not None
    assert item.value == "v1"
