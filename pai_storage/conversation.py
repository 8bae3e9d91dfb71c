"""The conversation handle: the everyday chat loop on the thread store.

::

    chat = stores.threads.conversation("tenant-42", "chat-1")
    await chat.add("user", "What is the capital of France?")
    async with chat.reply() as answer:             # role "assistant"
        async for chunk in model.stream(...):
            await answer.write(chunk)
    for m in await chat.messages(last=20):         # oldest first
        print(m.role, m.text)
    async for m in chat.follow():                  # another tab: the reply as it grows
        print(m.text)

Built only on :meth:`ThreadStore.read_thread` and
:meth:`ThreadStore.commit_thread`: every change is one version-checked commit
that obeys the relationship rules, so a runtime using the full contract on the
same thread sees ordinary records. The handle keeps the version it last saw
and builds each commit from it; when another writer committed first, it
re-reads and builds again (see ``docs/conversation.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from . import builders as b
from .errors import ConversationConflictError, ThreadStoreInvariantError
from .lifecycle import to_the_end
from .maintenance import check_thread_key
from .models import CommittedResult, Message, ThreadRecord, ThreadVersion
from .watch import check_interval

if TYPE_CHECKING:
    from .store import ThreadStore
    from .watch import ThreadChange

__all__ = ["Conversation", "Reply", "Role"]

Role = Literal["user", "assistant", "system", "tool"]
_ROLES: Final = frozenset(get_args(Role))
_PRODUCERS: Final[Mapping[str, dict[str, str]]] = {
    "user": {"kind": "user"},
    "assistant": {"kind": "agent"},
    "tool": {"kind": "agent"},
    "system": {"kind": "system"},
}
_OPEN_RUNS: Final = {"type": "page", "order": "newest", "statuses": ["running", "waiting"]}
MAX_ATTEMPTS: Final = 1_000
"""Commits one change tries before giving up (each failed try means another writer won)."""
_REPLY_MESSAGE: Final = "replyMessageId"  # a reply run's private metadata: its message
_NEWEST_RUN: Final = {"type": "page", "order": "newest", "page": {"limit": 1}}
# A version of no thread: a watch after it reports the thread's state at once
# (another incarnation), or its absence as a deletion, so a follower never
# misses what was committed between its call and the watch's first look.
_NOWHERE: Final = ThreadVersion(thread_instance_id=uuid.uuid4().hex, revision=1)


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()
"""The default of :meth:`Conversation.update`'s fields: leave the stored value as it is."""


@dataclass(frozen=True, slots=True)
class _State:
    """What a commit is built from: the root, the open run's id, and when it was read."""

    thread: ThreadRecord | None
    open_run: str | None
    observed_at: datetime | None  # the provider's clock at the read; None: our own commit


Build = Callable[[_State], Awaitable[tuple[dict[str, Any], str | None] | None]]
"""Builds a commit from a state: the commit and the open run after it (``None``: nothing to do)."""


def _draft(
    message_id: str,
    role: str,
    text: str,
    status: str,
    association: dict[str, Any],
    fields: Mapping[str, Any],
) -> dict[str, Any]:
    if role not in _ROLES:
        raise ThreadStoreInvariantError(
            f"a message role is one of {', '.join(sorted(_ROLES))}, not {role!r}"
        )
    if not isinstance(text, str):
        raise ThreadStoreInvariantError(f"a message's text is a str, not {type(text).__name__}")
    return {
        "messageId": message_id,
        "role": role,
        "parts": [{"type": "text", "text": text}],
        "producer": _PRODUCERS[role],
        "association": association,
        "visibility": {"transcript": True, "context": True},
        "status": status,
        "metadata": {},
        **fields,
    }


def _key(name: str, value: str) -> str:
    try:
        return check_thread_key(name, value)
    except ThreadStoreInvariantError as err:
        raise ThreadStoreInvariantError(f"bad {name}: {err}") from None


class Conversation:
    """One thread of a scope, as a chat: add messages, stream replies, read them back.

    Made by :meth:`ThreadStore.conversation`. Not safe to share between tasks
    that write at the same time (make one handle per task: handles on one
    thread coordinate through the store, like separate processes).

    Parameters
    ----------
    store, scope_key, thread_id:
        The thread; created by the first write.
    agent:
        The ``agent`` of the thread when this handle creates it.
    flush_every:
        Seconds between two commits of a streaming reply's text (at most).
    lease_ttl:
        How long a reply's run lease lasts between two commits; a reply whose
        process died is taken over by the next ``reply()`` once it expires.
    """

    def __init__(
        self,
        store: ThreadStore,
        scope_key: str,
        thread_id: str,
        *,
        agent: str = "assistant",
        flush_every: float = 0.25,
        lease_ttl: timedelta = timedelta(seconds=60),
    ) -> None:
        self.store = store
        self.scope_key = _key("scope_key", scope_key)
        self.thread_id = _key("thread_id", thread_id)
        self.agent = agent
        number = isinstance(flush_every, int | float) and not isinstance(flush_every, bool)
        if not (number and flush_every >= 0):
            raise ThreadStoreInvariantError(f"flush_every is seconds >= 0, not {flush_every!r}")
        self.flush_every = float(flush_every)
        if not isinstance(lease_ttl, timedelta):
            raise ThreadStoreInvariantError(f"lease_ttl is a timedelta, not {lease_ttl!r}")
        lease_ms = lease_ttl.total_seconds() * 1000
        if not 1 <= lease_ms <= 86_400_000:
            raise ThreadStoreInvariantError("lease_ttl is 1 ms to 24 hours")
        self.lease_ms = int(lease_ms)
        self._state: _State | None = None

    def __repr__(self) -> str:
        return f"Conversation(scope_key={self.scope_key!r}, thread_id={self.thread_id!r})"

    # ------------------------------------------------------------ reads

    async def get(self) -> ThreadRecord | None:
        """The thread's root as stored now (``None`` before the first write)."""
        self._state = await self._read()
        return self._state.thread

    def watch(
        self, *, after: ThreadVersion | None = None, interval: float = 0.2
    ) -> AsyncGenerator[ThreadChange, None]:
        """The thread's changes as they are committed: :meth:`ThreadStore.watch` on this thread."""
        return self.store.watch(self.scope_key, self.thread_id, after=after, interval=interval)

    def follow(
        self,
        message_id: str | None = None,
        *,
        newer_than: str | None = None,
        interval: float = 0.2,
    ) -> AsyncGenerator[Message, None]:
        """A reply as it is streamed: its message each time its text or status changes.

        Follows ``message_id``, or by default the thread's newest reply (the run
        :meth:`reply` opened last, streaming or finished; when the thread has none
        yet, the first one opened). With ``newer_than`` (a reply's message id), when
        the newest reply is that one, the next one opened is followed instead (a
        viewer that has shown an answer waits for the next). The first record is the
        message as stored now (a follower that joins late starts with the text so
        far); then one record per committed change of its text or status (commits
        coalesce when they come faster than the follower reads). The iteration ends
        when the message's run is closed (``completed``, ``failed`` or ``cancelled``;
        a message without a run: when it is no longer ``streaming``), and the last
        record is then the message as that closing commit left it: its whole text,
        ``status`` ``complete``, ``error`` (the reply's body raised) or ``incomplete``
        (cancelled, or taken over after its process died). That final record is never
        skipped. Built on :meth:`watch` (``interval`` as there) plus one read per
        change.

        Raises
        ------
        ThreadStoreInvariantError
            A bad argument (on the call: ``interval``, or both ``message_id``
            and ``newer_than``), or a ``message_id`` that names no message of
            the thread.
        ConversationConflictError
            The thread was deleted (or deleted and created again), or the
            message removed, while it was followed.
        """
        for name, value in (("message_id", message_id), ("newer_than", newer_than)):
            if value is not None and not isinstance(value, str):
                raise ThreadStoreInvariantError(
                    f"{name} is a message id (a str) or None, not {type(value).__name__}"
                )
        if message_id is not None and newer_than is not None:
            raise ThreadStoreInvariantError("follow() takes message_id or newer_than, not both")
        return self._follow(message_id, newer_than, check_interval(interval))

    async def _follow(
        self, message_id: str | None, newer_than: str | None, interval: float
    ) -> AsyncGenerator[Message, None]:
        given = message_id is not None  # else: wait for a reply while there is none
        instance: str | None = None  # the incarnation the followed message lives in
        looked = False  # a change is skipped unread only after a first read
        last: Message | None = None
        watch = self.store.watch(self.scope_key, self.thread_id, after=_NOWHERE, interval=interval)
        async with contextlib.aclosing(watch) as changes:
            async for change in changes:
                if looked and not _may_concern(change, message_id):
                    continue
                looked = True
                if message_id is None and change.version is not None:
                    message_id = await self._newest_reply()
                    if message_id == newer_than:
                        message_id = None  # no new reply yet: wait for one
                found = None if message_id is None else await self._look(message_id)
                if found is None:  # no thread, or no reply in it yet
                    if instance is not None:
                        raise ConversationConflictError(f"{self!r} was deleted while followed")
                    if given:
                        raise ThreadStoreInvariantError(
                            f"message_id {message_id!r} does not name a message of {self!r}"
                        )
                    message_id = None
                    continue
                message, open_run, version = found
                if instance is None:
                    instance = version.thread_instance_id
                elif version.thread_instance_id != instance:
                    raise ConversationConflictError(
                        f"{self!r} was deleted and created again while followed"
                    )
                if message is None:
                    if last is None and given:
                        raise ThreadStoreInvariantError(
                            f"message_id {message_id!r} does not name a message of {self!r}"
                        )
                    raise ConversationConflictError(f"message {message_id!r} was removed")
                if last is None or (message.parts, message.status) != (last.parts, last.status):
                    last = message
                    yield message
                run_id = message.run_id
                if (open_run != run_id) if run_id is not None else message.status != "streaming":
                    return

    async def _newest_reply(self) -> str | None:
        """The message of the thread's newest run when :meth:`reply` opened it."""
        read = await self.store.read_thread(
            b.read(self.scope_key, self.thread_id, runs=_NEWEST_RUN)
        )
        if read.runs is None or not read.runs.items:
            return None
        found = read.runs.items[0].private_metadata.get(_REPLY_MESSAGE)
        return found if isinstance(found, str) else None

    async def _look(
        self, message_id: str
    ) -> tuple[Message | None, str | None, ThreadVersion] | None:
        """The message, the open run's id and the version, in one read (so one state).

        ``None`` when the thread is missing.
        """
        read = await self.store.read_thread(
            b.read(
                self.scope_key,
                self.thread_id,
                messages={"type": "ids", "messageIds": [message_id]},
                runs={**_OPEN_RUNS, "page": {"limit": 1}},
            )
        )
        if read.thread is None:
            return None
        message = read.messages.items[0] if read.messages and read.messages.items else None
        open_run = read.runs.items[0].run_id if read.runs and read.runs.items else None
        return message, open_run, read.thread.version

    async def messages(self, last: int | None = 20) -> list[Message]:
        """The last ``last`` messages of the transcript (every one with ``None``), oldest first.

        Messages whose ``visibility.transcript`` is false are left out. Reads
        pages of up to 100 messages; an empty list when the thread is missing.
        """
        if last is not None and (not isinstance(last, int) or isinstance(last, bool) or last < 0):
            raise ThreadStoreInvariantError(f"last is a count >= 0 or None, not {last!r}")
        wanted = last if last is not None else -1
        items: list[Message] = []
        token: str | None = None
        while wanted < 0 or len(items) < wanted:
            limit = 100 if wanted < 0 else min(100, wanted - len(items))
            page: dict[str, Any] = {"limit": limit}
            if token is not None:
                page["pageToken"] = token
            view = {"type": "page", "view": "transcript", "page": page}
            view["order"] = "oldest" if wanted < 0 else "newest"
            read = await self.store.read_thread(
                b.read(self.scope_key, self.thread_id, messages=view)
            )
            if read.messages is None:
                return []
            items.extend(read.messages.items)
            token = read.messages.next_page_token
            if token is None:
                break
        return items if wanted < 0 else items[::-1]

    # ------------------------------------------------------------ writes

    async def add(self, role: Role, text: str, **fields: Any) -> Message:
        """Append one complete message; create the thread on first use.

        ``fields`` are the message's JSON fields to set (camelCase, as in the
        data model: ``metadata=``, ``visibility=``, ``messageId=``, ``parts=``).
        While a run is open (a reply streaming), the message joins that run
        with relation ``context``: the relationship rules let nothing follow
        an open run's messages otherwise. Returns the stored message.

        Raises
        ------
        ThreadStoreInvariantError
            A bad role, text or field (nothing written); ``status`` among the
            fields (a streaming message is :meth:`reply`'s).
        """
        if "status" in fields:
            raise ThreadStoreInvariantError(
                "add() appends a complete message: status is not a field to set "
                "(reply() streams one)"
            )
        message_id = fields.pop("messageId", None)
        if message_id is None:  # a bad id is refused by the commit's validation, not replaced
            message_id = uuid.uuid4().hex
        _draft(message_id, role, text, "complete", {"kind": "standalone"}, fields)  # checks
        sent: dict[str, Any] = {}

        async def build(state: _State) -> tuple[dict[str, Any], str | None]:
            association: dict[str, Any] = (
                {"kind": "run", "runId": state.open_run, "relation": "context"}
                if state.open_run is not None
                else {"kind": "standalone"}
            )
            sent.update(_draft(message_id, role, text, "complete", association, fields))
            changes = {"messages": [b.insert(dict(sent))]}
            if state.thread is None:
                return b.create(self.scope_key, self.thread_id, changes, agent=self.agent), None
            return b.update(state.thread, changes), state.open_run

        result = await self._commit(build)
        assert result is not None
        stamp = result.committed_at
        return Message.model_validate({**sent, "createdAt": stamp, "updatedAt": stamp})

    def reply(
        self, role: Role = "assistant", *, metadata: Mapping[str, Any] | None = None
    ) -> Reply:
        """An ``async with`` block that streams one message inside its own run.

        Entering opens a run (``running``, with the run lease) and a
        ``streaming`` message; :meth:`Reply.write` adds text, committed at
        most every ``flush_every`` seconds. A normal exit commits the whole
        text, the message ``complete`` and the run ``completed``, and releases
        the lease. An exception marks the message ``error`` (``incomplete``
        when cancelled) and the run ``failed`` (``cancelled``), releases the
        lease and propagates.

        Raises
        ------
        ConversationConflictError
            On entering, another run is open and its lease has not expired;
            while streaming, the thread was deleted or the run taken over.
        """
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ThreadStoreInvariantError(
                f"metadata is a mapping or None, not {type(metadata).__name__}"
            )
        return Reply(self, role, dict(metadata or {}))

    async def update(self, *, title: Any = KEEP, metadata: Any = KEEP) -> ThreadRecord:
        """Change the title and/or metadata, keeping every root field not named.

        ``title=None`` removes the title. Creates the thread when it is
        missing. Retried over other writers' commits: the fields named win.
        """
        named: dict[str, Any] = {}
        if title is not KEEP:
            named["title"] = title
        if metadata is not KEEP:
            named["metadata"] = metadata

        async def build(state: _State) -> tuple[dict[str, Any], str | None]:
            if state.thread is None:
                created = {k: v for k, v in named.items() if v is not None}
                commit = b.create(self.scope_key, self.thread_id, agent=self.agent, **created)
                return commit, None
            return b.update(state.thread, **named), state.open_run

        result = await self._commit(build)
        assert result is not None
        assert result.thread is not None
        return result.thread

    async def delete(self) -> bool:
        """Delete the thread and all its records; ``False`` when it was missing."""

        async def build(state: _State) -> tuple[dict[str, Any], str | None] | None:
            if state.thread is None:
                return None
            return b.delete(self.scope_key, self.thread_id, state.thread.version), None

        return await self._commit(build) is not None

    # ------------------------------------------------------------ the commit loop

    async def _read(self) -> _State:
        runs = {**_OPEN_RUNS, "page": {"limit": 1}}
        read = await self.store.read_thread(b.read(self.scope_key, self.thread_id, runs=runs))
        open_run = read.runs.items[0].run_id if read.runs and read.runs.items else None
        return _State(read.thread, open_run, read.observed_at)

    async def _commit(self, build: Build) -> CommittedResult | None:
        """Build from the state last seen, commit; on a conflict re-read and build again."""
        for attempt in range(MAX_ATTEMPTS):
            state = self._state if self._state is not None else await self._read()
            try:
                built = await build(state)
            except _Reread:
                self._state = None
                continue
            if built is None:
                self._state = state
                return None
            commit, open_after = built
            result = await self.store.commit_thread(commit)
            if isinstance(result, CommittedResult):
                self._state = (
                    _State(result.thread, open_after, None) if result.thread is not None else None
                )
                return result
            self._state = None
            if state.observed_at is not None:  # a fresh read lost too: let the others pass
                await asyncio.sleep(random.uniform(0, 0.002 * min(attempt, 25)))
        raise ConversationConflictError(
            f"{MAX_ATTEMPTS} commits to {self!r} in a row found another writer's first; gave up"
        )


def _may_concern(change: ThreadChange, message_id: str | None) -> bool:
    """Whether a change can touch the followed message or start or close a run.

    Only what the watcher was told (``change.changed``) can rule a change out;
    ``None`` (unknown), or a change across incarnations, never does. A reply's
    run is opened and closed by commits that change runs, so the final record
    is never skipped here.
    """
    changed = change.changed
    if changed is None or change.commits is None or changed.runs:
        return True
    if message_id is None:  # waiting for a reply: only a new run can bring one
        return False
    messages = changed.messages
    return messages.truncated or message_id in (
        *messages.inserted,
        *messages.updated,
        *messages.deleted,
    )


class Reply:
    """A message streaming into its own run: what :meth:`Conversation.reply` returns.

    ``message_id`` and ``run_id`` name the records; ``text`` is the text
    written so far.
    """

    def __init__(self, conversation: Conversation, role: Role, metadata: dict[str, Any]) -> None:
        self.conversation = conversation
        self.message_id = uuid.uuid4().hex
        self.run_id = uuid.uuid4().hex
        self._owner = uuid.uuid4().hex
        self._role = role
        self._fields = {"metadata": metadata}
        _draft(self.message_id, role, "", "streaming", {"kind": "standalone"}, self._fields)
        self._chunks: list[str] = []
        self._flushed = 0
        self._last_flush = 0.0
        self._instance: str | None = None

    @property
    def text(self) -> str:
        return "".join(self._chunks)

    def _message(self, status: str) -> dict[str, Any]:
        association = {"kind": "run", "runId": self.run_id, "relation": "output"}
        return _draft(self.message_id, self._role, self.text, status, association, self._fields)

    def _run(self, status: str, error: dict[str, str] | None = None) -> dict[str, Any]:
        run = b.run(self.run_id, status)
        run["privateMetadata"] = {_REPLY_MESSAGE: self.message_id}
        if error is not None:
            run["error"] = error
        return run

    # ------------------------------------------------------------ the block

    async def __aenter__(self) -> Reply:
        # Cancelled half-way, the opening commit could land with nobody left to
        # close its run: it runs to its end, and a run it opened for a task
        # cancelled meanwhile is closed as cancelled.
        opening, cancelled = await to_the_end(self.conversation._commit(self._open))
        if cancelled is not None:
            if not opening.cancelled() and opening.exception() is None:
                self._opened(opening.result())
                await self.__aexit__(type(cancelled), cancelled, cancelled.__traceback__)
            raise cancelled
        self._opened(opening.result())
        return self

    def _opened(self, opened: CommittedResult | None) -> None:
        assert opened is not None
        assert opened.thread is not None
        self._instance = opened.thread.version.thread_instance_id
        self._last_flush = time.monotonic()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            closing = self._close("complete", "completed", None)
        else:
            failed = isinstance(exc, Exception)
            error = {"code": "failed" if failed else "cancelled", "message": type(exc).__name__}
            if failed:
                closing = self._close("error", "failed", error)
            else:
                closing = self._close("incomplete", "cancelled", error)
        # Cancelled again while it runs, the closing commit still ends (then the
        # cancellation is raised): cut short, it would leave the run open.
        closed, cancelled = await to_the_end(closing)
        seen = cancelled if cancelled is not None else exc  # what is raised
        if seen is None:
            closed.result()
            return
        try:
            closed.result()
        except Exception as close_error:  # the exception raised is the one to see
            seen.add_note(f"the reply could not be closed: {close_error!r}")
        if cancelled is not None:
            raise cancelled

    async def write(self, chunk: str) -> None:
        """Add ``chunk`` to the text; commit it when ``flush_every`` has passed since the last."""
        if not isinstance(chunk, str):
            raise ThreadStoreInvariantError(f"a reply chunk is a str, not {type(chunk).__name__}")
        if self._instance is None:
            raise ThreadStoreInvariantError("write() belongs inside the reply's async with block")
        self._chunks.append(chunk)
        if time.monotonic() - self._last_flush >= self.conversation.flush_every:
            await self.flush()

    async def flush(self) -> None:
        """Commit the text written so far now (when any was written since the last commit)."""
        if len(self._chunks) == self._flushed:
            return
        count = len(self._chunks)
        await self.conversation._commit(self._flush)
        self._flushed = count
        self._last_flush = time.monotonic()

    # ------------------------------------------------------------ commits

    async def _open(self, state: _State) -> tuple[dict[str, Any], str | None]:
        conv = self.conversation
        changes: dict[str, Any] = {
            "messages": [b.insert(self._message("streaming"))],
            "runs": [b.insert(self._run("running"))],
            "lease": b.acquire(self.run_id, self._owner, conv.lease_ms),
        }
        thread = state.thread
        if thread is not None and state.open_run is not None:
            await self._take_over(state, changes)
        if thread is None:
            commit = b.create(conv.scope_key, conv.thread_id, changes, agent=conv.agent)
        else:
            commit = b.update(thread, changes)
        return commit, self.run_id

    async def _take_over(self, state: _State, changes: dict[str, Any]) -> None:
        """Close an open run whose lease expired (its process died): failed, message incomplete."""
        thread, run_id = state.thread, state.open_run
        assert thread is not None
        assert run_id is not None
        lease = thread.lease
        expired = (
            lease is not None
            and lease.run_id == run_id
            and state.observed_at is not None
            and lease.expires_at <= state.observed_at
        )
        if state.observed_at is None or not expired:
            if state.observed_at is None:
                raise _Reread
            raise ConversationConflictError(
                f"run {run_id} is open on {self.conversation!r}: one reply at a time (a reply "
                "whose process died is taken over once its run lease expires)"
            )
        conv = self.conversation
        read = await conv.store.read_thread(
            b.read(conv.scope_key, conv.thread_id, runs={"type": "ids", "runIds": [run_id]})
        )
        if read.runs is None or not read.runs.items:
            raise _Reread
        run = read.runs.items[0].to_draft().to_json()
        run.update(status="failed", error={"code": "abandoned", "message": "run lease expired"})
        changes["runs"].insert(0, b.replace(run))
        message_id = read.runs.items[0].private_metadata.get(_REPLY_MESSAGE)
        if isinstance(message_id, str):
            found = await conv.store.read_thread(
                b.read(
                    conv.scope_key,
                    conv.thread_id,
                    messages={"type": "ids", "messageIds": [message_id]},
                )
            )
            if found.messages is not None and found.messages.items:
                message = found.messages.items[0]
                if message.status == "streaming":
                    draft = message.to_draft().to_json()
                    draft["status"] = "incomplete"
                    changes["messages"].insert(0, b.replace(draft))

    def _check_ours(self, state: _State) -> ThreadRecord:
        thread, conv = state.thread, self.conversation
        if thread is None:
            raise ConversationConflictError(f"{conv!r} was deleted while its reply was open")
        if thread.version.thread_instance_id != self._instance:
            raise ConversationConflictError(
                f"{conv!r} was deleted and created again while its reply was open"
            )
        if state.open_run != self.run_id:
            raise ConversationConflictError(
                f"the reply's run {self.run_id} was closed by another writer of {conv!r}"
            )
        lease = thread.lease
        if lease is not None and (lease.run_id, lease.owner_id) != (self.run_id, self._owner):
            raise ConversationConflictError(f"the reply's run lease on {conv!r} was taken over")
        return thread

    def _lease(self, state: _State, thread: ThreadRecord) -> dict[str, Any] | None:
        lease, ms = thread.lease, self.conversation.lease_ms
        if lease is None:  # released by another writer: take it again
            return b.acquire(self.run_id, self._owner, ms)
        if state.observed_at is not None and lease.expires_at <= state.observed_at:
            return b.acquire(self.run_id, self._owner, ms)
        return b.renew(self.run_id, self._owner, ms)

    async def _flush(self, state: _State) -> tuple[dict[str, Any], str | None]:
        thread = self._check_ours(state)
        changes: dict[str, Any] = {"messages": [b.replace(self._message("streaming"))]}
        lease = self._lease(state, thread)
        if lease is not None:
            changes["lease"] = lease
        return b.update(thread, changes), self.run_id

    async def _close(self, status: str, run_status: str, error: dict[str, str] | None) -> None:
        async def build(state: _State) -> tuple[dict[str, Any], str | None]:
            thread = self._check_ours(state)
            changes: dict[str, Any] = {
                "messages": [b.replace(self._message(status))],
                "runs": [b.replace(self._run(run_status, error))],
            }
            if thread.lease is not None:
                changes["lease"] = b.release(self.run_id, self._owner, "any")
            return b.update(thread, changes), None

        if self._instance is not None:
            await self.conversation._commit(build)


class _Reread(Exception):
    """A commit needs a fresh read (built from our own commit's state, it cannot judge)."""
