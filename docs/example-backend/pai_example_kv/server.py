"""The stand-in database the example backend talks to: byte maps behind one lock."""

from __future__ import annotations

import asyncio

from pai_storage.backend import KVRecord

__all__ = ["Server"]


class Server:
    """What a real key-value database would be: thread values, key-value items, one lock.

    The lock serializes transactions (a real database gives isolation
    itself). One :func:`pai_storage.connect` call shares one server among
    the components it opens, as a production backend shares one client.
    """

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.items: dict[tuple[tuple[str, ...], str], KVRecord] = {}
        self.lock = asyncio.Lock()
