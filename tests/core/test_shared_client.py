"""SharedClient: counted users, one shared cancel-safe connect, close when last and owned."""

from __future__ import annotations

import asyncio

import pytest

from pai_storage import UnavailableError
from pai_storage.backend import SharedClient
from pai_storage.errors import ThreadStoreConfigurationError


class _Conn:
    """A fake driver object: records whether it was closed and how."""

    def __init__(self) -> None:
        self.connected = False
        self.closed: str | None = None


class _FakeClient(SharedClient[_Conn]):
    """Connects through a gate the test opens; can be told to fail once."""

    def __init__(self, given: _Conn | None = None) -> None:
        super().__init__(owned=given is None)
        self.given = given
        self.made: list[_Conn] = []
        self.connects = 0
        self.gate = asyncio.Event()
        self.fail_next = False

    def _make(self) -> _Conn:
        if self.given is not None:
            return self.given
        conn = _Conn()
        self.made.append(conn)
        return conn

    async def _connect(self, made: _Conn) -> None:
        self.connects += 1
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise UnavailableError("the fake server is unreachable")
        made.connected = True

    async def _disconnect(self, made: _Conn, *, failed: bool) -> None:
        made.closed = "dropped" if failed else "closed"

    async def conn(self) -> _Conn:
        return await self._ready()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_concurrent_first_callers_share_one_connect() -> None:
    client = _FakeClient()
    client.attach()
    callers = [asyncio.ensure_future(client.conn()) for _ in range(3)]
    await _settle()
    client.gate.set()
    got = await asyncio.gather(*callers)
    assert client.connects == 1
    assert len(client.made) == 1
    assert all(conn is client.made[0] and conn.connected for conn in got)
    assert await client.conn() is client.made[0]  # connected: no second attempt
    assert client.connects == 1


async def test_a_cancelled_first_caller_does_not_cancel_the_connect() -> None:
    client = _FakeClient()
    client.attach()
    first = asyncio.ensure_future(client.conn())
    await _settle()
    second = asyncio.ensure_future(client.conn())
    await _settle()
    first.cancel()
    await _settle()
    client.gate.set()
    conn = await second
    assert first.cancelled()
    assert conn.connected
    assert conn.closed is None
    assert client.connects == 1


async def test_a_failed_connect_is_forgotten_and_what_it_made_closed() -> None:
    client = _FakeClient()
    client.attach()
    client.fail_next = True
    client.gate.set()
    with pytest.raises(UnavailableError, match="unreachable"):
        await client.conn()
    assert client.made[0].closed == "dropped"
    conn = await client.conn()  # retried from scratch with a fresh object
    assert conn is client.made[1]
    assert conn.connected
    assert conn.closed is None
    assert client.connects == 2


async def test_a_failure_nobody_waits_for_is_still_forgotten() -> None:
    client = _FakeClient()
    client.attach()
    client.fail_next = True
    caller = asyncio.ensure_future(client.conn())
    await _settle()
    caller.cancel()
    await _settle()
    client.gate.set()
    await _settle()
    assert client.made[0].closed == "dropped"
    conn = await client.conn()  # not the stale failure: a new attempt
    assert conn is client.made[1]
    assert conn.connected


async def test_last_release_closes_an_owned_client_once() -> None:
    client = _FakeClient()
    client.attach()
    client.attach()
    client.gate.set()
    conn = await client.conn()
    await client.release()
    assert not client.closed
    assert conn.closed is None
    await client.release()
    assert client.closed
    assert conn.closed == "closed"
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await client.conn()
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        client.attach()


async def test_last_release_never_closes_a_given_client() -> None:
    given = _Conn()
    client = _FakeClient(given)
    client.attach()
    client.gate.set()
    assert await client.conn() is given
    await client.release()
    assert client.closed
    assert given.closed is None


async def test_a_failed_connect_of_a_given_client_does_not_close_it() -> None:
    given = _Conn()
    client = _FakeClient(given)
    client.attach()
    client.fail_next = True
    client.gate.set()
    with pytest.raises(UnavailableError, match="unreachable"):
        await client.conn()
    assert given.closed is None


async def test_release_during_connect_cancels_it_and_leaks_nothing() -> None:
    client = _FakeClient()
    client.attach()
    waiting = asyncio.ensure_future(client.conn())
    await _settle()
    assert client.connects == 1
    await client.release()  # the attempt is cancelled and awaited before this returns
    assert client.closed
    assert client.made[0].closed == "dropped"
    assert not client.made[0].connected
    with pytest.raises(ThreadStoreConfigurationError, match="closed"):
        await waiting
