"""Shared helpers of the PostgreSQL backend tests: the server URL and a fault proxy."""

from __future__ import annotations

import asyncio
import os
from contextlib import suppress

from pai_storage import make_url

URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def dsn(url: str = URL) -> str:
    return make_url(url).render(hide_password=False, scheme="postgresql")


class FaultProxy:
    """A loopback TCP proxy between the store and the server that can cut connections.

    ``arm(trigger, mode)`` makes the next client message containing ``trigger``
    (bytes of the SQL text) cut the connection:

    ``"drop"``
        the message is never forwarded; both sides are closed at once;
    ``"after_reply"``
        the message is forwarded, the server's reply is swallowed, then both
        sides are closed (the server has acted; the client never hears).
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.trigger: bytes | None = None
        self.mode = "drop"
        self.fired = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def url(self, base: str = URL) -> str:
        parsed = make_url(base)
        user = f"{parsed.username}@" if parsed.username else ""
        return f"postgresql://{user}127.0.0.1:{self.port}{parsed.path}"

    def arm(self, trigger: bytes, mode: str) -> None:
        self.trigger, self.mode = trigger, mode
        self.fired.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        swallow = asyncio.Event()
        cut = asyncio.Event()

        def shut() -> None:
            cut.set()
            for w in (writer, up_writer):
                with suppress(Exception):
                    w.transport.abort()

        async def client_to_server() -> None:
            while not cut.is_set():
                data = await reader.read(65536)
                if not data:
                    break
                if self.trigger is not None and self.trigger in data:
                    self.trigger = None
                    self.fired.set()
                    if self.mode == "drop":
                        shut()
                        return
                    swallow.set()
                up_writer.write(data)
                await up_writer.drain()
            shut()

        async def server_to_client() -> None:
            while not cut.is_set():
                data = await up_reader.read(65536)
                if not data:
                    break
                if swallow.is_set():
                    shut()  # the server answered; the client never hears it
                    return
                writer.write(data)
                await writer.drain()
            shut()

        with suppress(Exception):
            await asyncio.gather(client_to_server(), server_to_client())
        shut()
