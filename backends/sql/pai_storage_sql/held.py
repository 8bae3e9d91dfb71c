"""The connections a :class:`~pai_storage_sql.client.SqlClient` keeps checked out.

Invariants of :class:`Held`: at most ``limit`` connections of its engine are
held (idle, in use, or being connected) at once; a connection is in use by
one operation at a time; callers waiting for one are served in arrival
order; a connection handed over to a waiter that was cancelled meanwhile is
passed on, never lost; a dropped connection frees its slot for the next
waiter (who connects anew).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["Held"]


class Held:
    """Connections of one engine that a client keeps checked out between operations.

    SQLite engines the client made: checking a connection out of SQLAlchemy's
    pool and back in costs more than a short statement, so the client's
    operations take them from here (at most ``limit`` at once, in arrival
    order when all are busy). A connection comes from the engine's pool the
    first time it is needed and goes back when it is dropped (its operation
    failed in the driver or was cancelled: it is then invalidated) or when
    the client is disposed of. The engines keep room beside them for the
    application's direct use of ``ready()``'s engines.
    """

    __slots__ = ("count", "engine", "idle", "limit", "waiters")

    def __init__(self, engine: AsyncEngine, limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self.idle: list[AsyncConnection] = []
        self.count = 0
        """Connections held: idle, in use, or being connected."""
        self.waiters: deque[asyncio.Future[AsyncConnection | None]] = deque()

    async def take(self) -> AsyncConnection:
        """An idle connection, a new one while fewer than ``limit`` are held, else
        the next one given back (or the slot of one dropped)."""
        if self.idle:
            return self.idle.pop()
        if self.count < self.limit:
            self.count += 1
        else:
            waiter: asyncio.Future[AsyncConnection | None] = (
                asyncio.get_running_loop().create_future()
            )
            self.waiters.append(waiter)
            try:
                given = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    # Handed over as this caller was cancelled: pass it on.
                    passed = waiter.result()
                    if passed is None:
                        self.free()
                    else:
                        self.give(passed)
                raise
            if given is not None:
                return given
            # A dropped connection's slot: counted already, connect anew.
        try:
            return await self.engine.connect()
        except BaseException:
            self.free()
            raise

    def give(self, conn: AsyncConnection) -> None:
        """A connection back from a clean operation: to the first waiter, else idle."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    def free(self) -> None:
        """A held connection was dropped: its slot goes to the first waiter."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.count -= 1

    async def close(self) -> None:
        """Give the idle connections back to the engine's pool."""
        idle, self.idle = self.idle, []
        for conn in idle:
            self.count -= 1
            with contextlib.suppress(Exception):
                await conn.close()
