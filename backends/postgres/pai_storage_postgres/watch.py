"""Watching threads on PostgreSQL: ``NOTIFY`` in the commit, one ``LISTEN`` per store.

A commit sends one notification from inside its own transaction
(:meth:`PgNotifier.committed`, ``SELECT pg_notify(...)``), so PostgreSQL
delivers it only if the commit commits, after it is visible, and in commit
order. Every watcher of the store shares one listening connection, held
while anyone watches, through asyncpg's public ``add_listener``: its own
connection, or one of the application's pool when the store was given one
(never a pool's only connection: then nobody listens and the watchers poll,
starting at once); each message wakes the watchers of its thread and of its
scope and hands them the commit's :class:`~pai_storage.watch.CommitNote`.

The channel is per set of tables (``pai_watch_`` and a hash of the threads
table's qualified name) and the payload names the thread by a hash of its
scope key and thread id, never by the keys themselves: any role of the
database may ``LISTEN``, and server logs may show payloads. The payload is
JSON, ``{"t": thread hash, "s": scope hash, "v": version, "c": change set}``;
when the change set would not fit PostgreSQL's 8,000-byte limit it is left
out (the watcher then reports ``changed=None``: re-read the thread).

Nothing here is needed for correctness: the core's loop reads the head after
every wake-up and at least once per interval, so a lost notification (the
listening connection dropped, a ``pg_terminate_backend``) costs latency, not
a version. When the listener loses its connection or gets it back it wakes
every watcher, which re-reads its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, TypeVar

from pai_storage import CommittedResult, CommitThreadInput, ThreadVersion
from pai_storage.watch import ChangeSet, CommitNote, ListeningNotifier

from .client import PgClient, terminate

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

    from .schema import Tables

__all__ = ["MAX_PAYLOAD", "PgNotifier", "watch_channel", "watch_key"]

MAX_PAYLOAD: Final = 7_999
"""Bytes of a ``NOTIFY`` payload (PostgreSQL refuses 8,000 and more)."""
_RETRY_FIRST, _RETRY_MAX = 0.05, 2.0  # seconds between attempts to listen again
_CONNECT_TIMEOUT: Final = 10.0
_CLOSE_WAIT: Final = 5.0  # seconds the listener has to let go cleanly when the store closes
_NOTIFY_SQL: Final = "SELECT pg_notify($1, $2)"
R = TypeVar("R")


def watch_channel(tables: Tables) -> str:
    """The channel of one set of tables (an identifier of 26 characters)."""
    digest = hashlib.sha256(tables.threads.encode()).hexdigest()
    return f"pai_watch_{digest[:16]}"


def watch_key(scope_key: str, thread_id: str | None) -> str:
    """What a payload calls a thread (``thread_id=None``: its scope): 24 hex digits."""
    name = json.dumps([scope_key, thread_id], ensure_ascii=False)
    return hashlib.sha256(name.encode()).hexdigest()[:24]


def payload(commit: CommitThreadInput, thread: Any) -> str:
    """The notification of one commit (``thread``: the committed root, ``None`` if deleted)."""
    doc: dict[str, Any] = {
        "t": watch_key(commit.scope_key, commit.thread_id),
        "s": watch_key(commit.scope_key, None),
    }
    note = CommitNote.of_commit(commit, thread)
    if note is not None:
        doc["v"] = note.version.to_json()
        doc["c"] = note.changes.to_json()
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) > MAX_PAYLOAD:
        del doc["c"]  # too many ids for one message: the watcher re-reads the thread
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return text


def _note(doc: dict[str, Any]) -> CommitNote | None:
    if "v" not in doc or "c" not in doc:
        return None
    return CommitNote(ThreadVersion.model_validate(doc["v"]), ChangeSet.from_json(doc["c"]))


class PgNotifier(ListeningNotifier):
    """The watchers of one PostgreSQL store and the connection that listens for them.

    Parameters
    ----------
    client:
        The store's client: its URL for the listener's own connection, and
        its tables (they name the channel).
    pooled:
        Opens a connection of the store's pool for as long as the block runs
        (the store's own ``_connection``): the listener's connection when the
        pool is the application's (then only it knows how to connect).
    """

    def __init__(
        self,
        client: PgClient,
        pooled: Callable[[], AbstractAsyncContextManager[asyncpg.Connection]],
    ) -> None:
        super().__init__()
        self.channel = watch_channel(client.tables)
        self._client = client
        self._pooled = pooled

    def key(self, scope_key: str, thread_id: str | None) -> Hashable:
        return watch_key(scope_key, thread_id)

    async def committed(self, conn: asyncpg.Connection, commit: CommitThreadInput, result: R) -> R:
        """Notify the commit inside its transaction (before ``COMMIT``); return ``result``."""
        assert isinstance(result, CommittedResult)
        await conn.execute(_NOTIFY_SQL, self.channel, payload(commit, result.thread))
        return result

    # ------------------------------------------------------------ the listener

    @property
    def listener_name(self) -> str:
        return f"pai-storage {self.channel}"

    def idle(self) -> None:
        """The last watcher left: the listener gives its connection back."""
        self._stop.set()

    async def close(self) -> None:
        """Stop listening (the store closes); watchers still running poll from now on."""
        self._stop.set()
        task, self._task = self._task, None
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=_CLOSE_WAIT)
        if not done:  # a connect or UNLISTEN that hangs: drop it with its connection
            task.cancel()
            await asyncio.wait({task})

    async def _may_hold(self) -> bool:
        """Whether the listener may hold a connection: not an application's pool's only one
        (every read and commit of the store would wait for it while anyone watches)."""
        if self._client.owns_pool:
            return True
        pool = await self._client.pool()
        return bool(pool.get_max_size() > 1)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        """The listener's connection: its own, so it never takes one of the pool's."""
        if not self._client.owns_pool:
            async with self._pooled() as conn:
                yield conn
            return
        import asyncpg

        url = self._client.url.render(hide_password=False, scheme="postgresql")
        conn = await asyncpg.connect(url, timeout=_CONNECT_TIMEOUT)
        try:
            yield conn
        finally:
            try:
                await asyncio.wait_for(conn.close(), _CONNECT_TIMEOUT)
            except BaseException:
                terminate(conn)
                raise

    async def _listen(self, stop: asyncio.Event, listening: asyncio.Event) -> None:
        with contextlib.suppress(Exception):  # the pool cannot be had: try as usual below
            if not await self._may_hold():
                return  # nobody listens: the watchers poll
        delay = _RETRY_FIRST
        while not stop.is_set():
            try:
                async with self._connection() as conn:
                    await self._hold(conn, stop, listening)
                    delay = _RETRY_FIRST
            except Exception:
                pass
            listening.clear()
            # Commits while nobody listened were not heard: every watcher reads again.
            self.notify_all()
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, _RETRY_MAX)

    async def _hold(
        self, conn: asyncpg.Connection, stop: asyncio.Event, listening: asyncio.Event
    ) -> None:
        """Listen on ``conn`` until it is lost or ``stop`` is set."""
        lost = asyncio.Event()

        def on_lost(_: object) -> None:
            lost.set()

        conn.add_termination_listener(on_lost)
        try:
            await conn.add_listener(self.channel, self._heard)
            listening.set()
            # Commits before LISTEN took effect were not heard: every watcher reads again.
            self.notify_all()
            ends = [asyncio.ensure_future(lost.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for end in ends:
                    end.cancel()
            if not lost.is_set():  # a clean stop: the pool gets a connection without LISTEN
                await conn.remove_listener(self.channel, self._heard)
        finally:
            conn.remove_termination_listener(on_lost)

    def _heard(self, _conn: object, _pid: int, _channel: str, message: str) -> None:
        """One notification: wake the thread's and the scope's watchers."""
        try:
            doc = json.loads(message)
            thread, scope = doc["t"], doc["s"]
            note = _note(doc)
        except (ValueError, KeyError, TypeError):  # not ours, or malformed: wake everyone
            self.notify_all()
            return
        self.notify_key(thread, note)
        self.notify_key(scope)
