"""A loopback TCP proxy in front of mongod that can cut connections on cue.

``cut_on(marker)`` arms the proxy: when a client→server chunk contains
``marker`` (a command name as a BSON key, e.g. ``b"commitTransaction\\x00"``),
the proxy either drops that chunk (``forward=False``: the command never reaches
the server) or forwards it and drops the reply (``forward=True``: the server
runs it, the client never hears back). Either way every connection is then cut
and new ones are refused until :meth:`restore`.
"""

from __future__ import annotations

import asyncio
import contextlib


class FaultProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.refusing = False
        self._marker: bytes | None = None
        self._forward = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.triggered = asyncio.Event()

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, **options: str) -> str:
        query = "&".join([f"{k}={v}" for k, v in {"directConnection": "true", **options}.items()])
        return f"mongodb://127.0.0.1:{self.port}/?{query}"

    def cut_on(self, marker: bytes, *, forward: bool) -> None:
        self._marker, self._forward = marker, forward
        self.triggered.clear()

    def cut(self) -> None:
        """Cut every connection now and refuse new ones."""
        self.refusing = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.refusing = False
        self._marker = None

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pump(reader, up_writer, upstream=True),
            self._pump(up_reader, writer, upstream=False),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            with contextlib.suppress(Exception):
                w.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        while True:
            data = await reader.read(65536)
            if not data or self.refusing:
                break
            if upstream and self._marker is not None and self._marker in data:
                self._marker = None
                self.refusing = True  # from here on, replies are dropped
                if self._forward:
                    writer.write(data)
                    await writer.drain()
                    await asyncio.sleep(0.2)  # let the server read it before the cut
                self.triggered.set()
                self.cut()
                break
            writer.write(data)
            await writer.drain()
