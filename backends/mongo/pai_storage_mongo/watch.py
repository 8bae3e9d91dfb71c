"""Watching threads on MongoDB: one change stream per store, on the roots collection.

Every commit writes its thread's root (``docs/mongodb.md``), so a change stream
on the roots collection hears every commit once it is majority-committed, in
the order of the oplog. One stream serves every watcher of the store (a change
stream holds a server cursor and a ``getMore`` in flight: one per watcher would
cost a connection of the pool each); it asks for ``updateLookup`` so an update
event carries the root's ``scopeKey`` and ``threadId``, projected down to those
fields, and each event wakes the watchers of that thread and of its scope. A
deleted root's event names only its ``_id``: the stream remembers which thread
each ``_id`` it saw was, and wakes every watcher for an ``_id`` it never saw.

The stream resumes with its resume token after a dropped connection or an
election (PyMongo resumes once by itself; this module reopens it with the
last token after anything else, or from now when the token can no longer be
resumed), and wakes every watcher whenever it (re)opens: the commits in the
gap were not heard, and the core's loop re-reads the head of each thread. Nothing
here is needed for correctness, only for latency: a watcher reads its thread
at least once per interval whatever the stream does.

Change streams need a replica set or a sharded cluster; on a standalone server
opening the stream fails and the watchers poll. The stream does not say what
changed inside a thread (``ThreadChange.changed`` is ``None``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from pymongo.errors import OperationFailure, PyMongoError

from pai_storage.watch import ListeningNotifier

if TYPE_CHECKING:
    from .store import MongoThreadStore

__all__ = ["STREAM_PIPELINE", "MongoNotifier"]

STREAM_PIPELINE: Final = (
    {"$match": {"operationType": {"$in": ["insert", "update", "replace", "delete"]}}},
    {
        "$project": {
            "operationType": 1,
            "documentKey": 1,
            "fullDocument.scopeKey": 1,
            "fullDocument.threadId": 1,
        }
    },
)
"""The roots' events a watcher needs, and of each only what names its thread."""
_AWAIT_MS: Final = 1_000  # a getMore waits this long for an event on the server
_RETRY_FIRST, _RETRY_MAX = 0.05, 2.0  # seconds between attempts to reopen the stream
_KNOWN_IDS: Final = 10_000  # root _ids remembered for their delete events
_RESUME_LOST: Final = frozenset({136, 280, 286})  # CappedPositionLost, ChangeStreamFatalError, ...


class MongoNotifier(ListeningNotifier):
    """The watchers of one MongoDB store and the change stream that wakes them."""

    def __init__(self, store: MongoThreadStore) -> None:
        super().__init__()
        self._store = store
        self._token: Mapping[str, Any] | None = None
        self._threads: OrderedDict[Any, tuple[str, str]] = OrderedDict()

    @property
    def listener_name(self) -> str:
        return "pai-storage change stream"

    def idle(self) -> None:
        """The last watcher left: close the stream."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()  # a getMore in flight ends with its cursor

    async def close(self) -> None:
        """Close the stream (the store closes); watchers still running poll from now on."""
        self.idle()
        task, self._task = self._task, None
        if task is not None:
            await asyncio.wait({task})

    async def _listen(self, stop: asyncio.Event, listening: asyncio.Event) -> None:
        delay = _RETRY_FIRST
        while not stop.is_set():
            try:
                await self._follow(listening)
            except OperationFailure as exc:
                if exc.code in _RESUME_LOST:
                    self._token = None  # the oplog moved past the token: start from now
            except PyMongoError:
                pass  # unreachable, an election, or no replica set: the watchers poll meanwhile
            except Exception:  # the store is closed or not ready yet
                if self._store.closed:
                    return
            listening.clear()
            self.notify_all()  # commits while the stream was down were not heard
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, _RETRY_MAX)

    async def _follow(self, listening: asyncio.Event) -> None:
        """Open the stream (resuming after the last event heard) and route its events."""
        await self._store.initialize()
        roots = self._store._col("threads")
        async with await roots.watch(
            list(STREAM_PIPELINE),
            full_document="updateLookup",
            resume_after=self._token,
            max_await_time_ms=_AWAIT_MS,
        ) as stream:
            listening.set()
            self.notify_all()  # commits before the stream opened were not heard
            while True:
                event = await stream.try_next()
                self._token = stream.resume_token
                if event is not None:
                    self._route(event)

    def _route(self, event: Mapping[str, Any]) -> None:
        """Wake the watchers of the event's thread and scope."""
        key = event.get("documentKey", {}).get("_id")
        doc = event.get("fullDocument") or {}
        scope, thread = doc.get("scopeKey"), doc.get("threadId")
        if isinstance(scope, str) and isinstance(thread, str):
            self._threads[key] = (scope, thread)
            self._threads.move_to_end(key)
            if len(self._threads) > _KNOWN_IDS:
                self._threads.popitem(last=False)
        else:  # a delete, or a root deleted before the lookup: known by its _id only
            known = (
                self._threads.pop(key, None)
                if event.get("operationType") == "delete"
                else (self._threads.get(key))
            )
            if known is None:
                self.notify_all()
                return
            scope, thread = known
        self.notify(scope, thread)
