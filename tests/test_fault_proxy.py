"""The fault tests' loopback proxy: a cut on a forwarded marker stays undone once restored."""

from __future__ import annotations

import asyncio

import pytest
from support.proxy import FaultProxy

pytestmark = pytest.mark.asyncio


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_restore_right_after_a_swallowed_reply_lets_new_connections_through() -> None:
    """A driver's retry reconnects as soon as the proxy accepts again: a restore made in the
    first loop turn after the cut must not be undone by the proxy's own clean-up."""
    upstream = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = FaultProxy(upstream.sockets[0].getsockname()[1])
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        proxy.cut_on(b"marker", forward=True)
        writer.write(b"the marker")
        await writer.drain()
        while not proxy.refusing:  # noqa: ASYNC110 - the proxy has no event for the cut
            await asyncio.sleep(0)
        proxy.restore()
        assert await reader.read(65536) == b""  # the reply was swallowed, the line cut
        writer.close()
        for _ in range(20):  # let every task of the cut connection finish
            await asyncio.sleep(0)
        assert not proxy.refusing
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"again")
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(5), 5) == b"again"
        writer.close()
    finally:
        await proxy.stop()
        upstream.close()
        await upstream.wait_closed()
