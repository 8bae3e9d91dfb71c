"""A loopback TCP proxy between a store and its database server that cuts connections on cue.

Both server backends' fault tests use it: the store under test connects to
:attr:`FaultProxy.port` instead of the server, and the test decides when the
connection dies.

``cut_on(marker, forward=...)`` arms the proxy: the next client-to-server chunk
that contains ``marker`` (bytes of an SQL statement, or a MongoDB command name
as a BSON key such as ``b"commitTransaction\\x00"``) either

- is dropped (``forward=False``): the server never sees it; or
- is forwarded and the server's reply on that connection is swallowed
  (``forward=True``): the server acts, the client never hears back.

Either way every connection is then cut and new ones are refused until
:meth:`restore`, so a driver cannot quietly retry the command on a fresh
connection. :meth:`cut` does the same at once, without a marker.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FaultProxy"]

# How long a forwarded marker waits for the server's reply before the cut
# happens anyway (a server that never answers must not hang the test).
_REPLY_WAIT_S = 5.0


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``host:target_port`` until told to cut."""

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.port = 0
        self.refusing = False
        self.triggered = asyncio.Event()
        """Set when an armed marker was seen (and the cut happened)."""
        self._marker: bytes | None = None
        self._forward = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = asyncio.Event()

    async def start(self) -> int:
        """Listen on a free loopback port; returns it (also :attr:`port`)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def cut_on(self, marker: bytes, *, forward: bool) -> None:
        """Cut every connection at the next client chunk containing ``marker``."""
        self._marker, self._forward = marker, forward
        self.triggered.clear()

    def cut(self) -> None:
        """Cut every connection now and refuse new ones until :meth:`restore`."""
        self.refusing = True
        self._cut.set()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        """Accept connections again (and disarm any marker)."""
        self.refusing = False
        self._cut.clear()
        self._marker = None

    async def stop(self) -> None:
        """Cut everything and stop listening: the server is gone for good."""
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        swallow = asyncio.Event()  # a marker was forwarded on this connection
        directions = [
            asyncio.create_task(self._client_to_server(reader, up_writer, swallow)),
            asyncio.create_task(self._server_to_client(up_reader, writer, swallow)),
        ]
        # Either side closing ends the connection: a client that said goodbye
        # waits for the server's close, which must reach it at once.
        await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
        for task in directions:
            task.cancel()
        await asyncio.gather(*directions, return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            with contextlib.suppress(Exception):
                w.transport.abort()

    async def _client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, swallow: asyncio.Event
    ) -> None:
        while True:
            data = await reader.read(65536)
            if not data or self.refusing:
                return
            if self._marker is not None and self._marker in data:
                self._marker = None
                self.triggered.set()
                if not self._forward:
                    self.cut()
                    return
                swallow.set()
                writer.write(data)
                await writer.drain()
                # The reply (see _server_to_client) cuts; this is only the fallback
                # for a server that never answers. Cutting again after the reply's cut
                # would undo a restore() that ran in between and refuse for good.
                try:
                    await asyncio.wait_for(self._cut.wait(), _REPLY_WAIT_S)
                except TimeoutError:
                    self.cut()
                return
            writer.write(data)
            await writer.drain()

    async def _server_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, swallow: asyncio.Event
    ) -> None:
        while True:
            data = await reader.read(65536)
            if not data or self.refusing:
                return
            if swallow.is_set():
                self.cut()  # the server answered the marker; the client never hears it
                return
            writer.write(data)
            await writer.drain()
