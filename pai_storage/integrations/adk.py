"""Google ADK's ``BaseSessionService`` on pai-storage.

``pip install 'pai-storage[adk]'``; see ``docs/adk.md``.

- A session is a thread in scope ``app_name``; its ``threadId`` is
  ``["<user_id>", "<session_id>"]`` (JSON), its ``category`` the user id (so
  a user's sessions are one indexed list) and its root ``metadata``
  ``{"state": <session state>}``.
- An event is a message (``user`` for the user's events, ``assistant`` for
  the others) whose message id is the event id and whose single ``data``
  part, named ``google-adk.event``, holds the event's JSON.
- ``app:`` state is one key-value item ``(app_name, "google-adk", "app")`` /
  ``state``; ``user:`` state one item per user, ``(app_name, "google-adk",
  "user")`` / ``user_id``. ``temp:`` state is never stored.

``append_event`` writes the event and the session's state delta in one
version-checked commit (a session object whose thread version is not the
stored one gets ADK's ``StaleSessionError``); app and user deltas are merged
into their items right after it, each with a version-checked write.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from types import TracebackType
from typing import Any, Self

from .. import builders
from ..bundle import Stores, connect
from ..errors import InvalidInputError
from ..kv import Item as KVItem
from ..kv import KeyValueStore, KVConflict
from ..models import Message, ThreadRecord, ThreadVersion
from ..runtime import check_name, check_value
from ..store import ThreadStore
from .support import missing_framework, run_to_end, text_id

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from pydantic_core import PydanticSerializationError, to_jsonable_python
except ImportError as exc:  # the extra is not installed
    raise missing_framework(__name__, "Google ADK", "adk") from exc

__all__ = ["EVENT_PART", "PaiSessionService"]

EVENT_PART = "google-adk.event"
"""The name of the data part that holds an event."""

AGENT = "google-adk"
"""The ``agent`` of the threads the service creates."""

_PAGE = 100  # the thread store's largest page


def _split(state: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """App, user and session parts of a state (delta), prefixes removed, ``temp:`` dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    for key, value in (state or {}).items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            session[key] = value
    return _json(app), _json(user), _json(session)


def _json(values: dict[str, Any]) -> dict[str, Any]:
    """State values in their JSON form (datetimes, models, ... as ADK stores them)."""
    try:
        return dict(to_jsonable_python(values))
    except PydanticSerializationError as exc:
        raise InvalidInputError(f"a state value is not JSON-serializable: {exc}") from None


def _merged(app: dict[str, Any], user: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    merged = dict(session)
    merged.update({State.APP_PREFIX + k: v for k, v in app.items()})
    merged.update({State.USER_PREFIX + k: v for k, v in user.items()})
    return merged


def _event(message: Message) -> Event | None:
    for part in message.parts:
        if part.type == "data" and part.name == EVENT_PART:
            return Event.model_validate(part.to_json()["data"])
    return None  # written by something else: not an event


def _state_of(item: KVItem | None) -> dict[str, Any]:
    """The state a state item holds (``{}``: none, or not an object)."""
    return {} if item is None or not isinstance(item.value, dict) else dict(item.value)


class PaiSessionService(BaseSessionService):
    """ADK sessions, events and state on pai-storage.

    ``PaiSessionService(url, **options)`` opens the stores at ``url``
    (``options`` as for :func:`pai_storage.connect`) on first use;
    ``PaiSessionService(stores)`` uses an open bundle. :meth:`close` (or
    ``async with``) closes the stores it opened.
    """

    def __init__(self, url_or_stores: str | Stores, **options: Any) -> None:
        if isinstance(url_or_stores, Stores):
            if options:
                raise InvalidInputError("options are for a URL; the bundle is already open")
            self._stores, self._owned = url_or_stores, False
        else:
            self._stores, self._owned = connect(url_or_stores, **options), True
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock]
        self._locks = weakref.WeakValueDictionary()
        self._versions: dict[int, tuple[weakref.ref[Session], ThreadVersion]] = {}

    def _lock(self, app_name: str, thread_id: str) -> asyncio.Lock:
        """The lock of one session's appends through this service (as ADK's own
        services have): a session object shared by concurrent tasks is never
        its own stale writer. It lives while an append holds it."""
        key = (app_name, thread_id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _version_of(self, session: Session) -> ThreadVersion | None:
        """The thread version ``session`` was returned or last appended at by this
        service (``None``: a session object it never saw, or a copy of one)."""
        found = self._versions.get(id(session))
        return found[1] if found is not None and found[0]() is session else None

    def _remember(self, session: Session, root: ThreadRecord) -> None:
        # By object, not by session id: two objects of one session are two
        # readers, and the one behind is stale. (ADK's Session is unhashable, so
        # its id() keys the entry, which is dropped with the object.)
        key = id(session)
        dropped = weakref.ref(session, lambda _: self._versions.pop(key, None))
        self._versions[key] = (dropped, root.version)

    @property
    def threads(self) -> ThreadStore:
        return self._stores.threads

    @property
    def kv(self) -> KeyValueStore:
        return self._stores.kv

    async def close(self) -> None:
        if self._owned:
            await self._stores.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ layout

    @staticmethod
    def _thread_id(user_id: str, session_id: str) -> str:
        pair = [text_id("user_id", user_id), text_id("session_id", session_id)]
        return json.dumps(pair, ensure_ascii=False)

    @staticmethod
    def _app_item(app_name: str) -> tuple[tuple[str, ...], str]:
        return (check_name("app_name", app_name), AGENT, "app"), "state"

    @staticmethod
    def _user_item(app_name: str, user_id: str) -> tuple[tuple[str, ...], str]:
        return (check_name("app_name", app_name), AGENT, "user"), check_name("user_id", user_id)

    async def _state(self, namespace: tuple[str, ...], key: str) -> dict[str, Any]:
        return _state_of(await self.kv.get(namespace, key))

    async def _check_merge(
        self, namespace: tuple[str, ...], key: str, delta: dict[str, Any]
    ) -> KVItem | None:
        """Refuse, before anything is written, a delta its state item could not take;
        the item as read (``None``: absent, or no delta), where :meth:`_merge` starts."""
        if not delta:
            return None
        item = await self.kv.get(namespace, key)
        merged = {**_state_of(item), **delta}
        check_value(merged, path=f"the {namespace[-1]} state", limit=self.kv.max_value_bytes)
        return item

    async def _merge(
        self, namespace: tuple[str, ...], key: str, delta: dict[str, Any], item: KVItem | None
    ) -> None:
        """Merge ``delta`` into a state item, a version-checked write from ``item``
        (retried from the stored item on a race)."""
        if not delta:
            return
        while True:
            expected = None if item is None else item.version
            result = await self.kv.put_if_version(
                namespace, key, {**_state_of(item), **delta}, expected
            )
            if not isinstance(result, KVConflict):
                return
            item = result.current

    def _session(
        self,
        root: ThreadRecord,
        app_name: str,
        user_id: str,
        session_id: str,
        state: dict[str, Any],
        events: list[Event] | None = None,
    ) -> Session:
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=state,
            events=events or [],
            last_update_time=root.updated_at.timestamp(),
        )
        self._remember(session, root)  # what the stale check compares
        return session

    # ------------------------------------------------------------ the service

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session; ``AlreadyExistsError`` when its id is taken."""
        session_id = uuid.uuid4().hex if session_id is None else text_id("session_id", session_id)
        app_item, user_item = self._app_item(app_name), self._user_item(app_name, user_id)
        app_delta, user_delta, session_state = _split(state)  # all checked before any write
        app_now = await self._check_merge(*app_item, app_delta)
        user_now = await self._check_merge(*user_item, user_delta)
        commit = builders.create(
            text_id("app_name", app_name),
            self._thread_id(user_id, session_id),
            agent=AGENT,
            category=user_id,
            metadata={"state": session_state},
        )

        async def store() -> ThreadRecord:
            result = await self.threads.commit_thread(commit)
            if result.type == "conflict" or result.thread is None:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            await self._merge(*app_item, app_delta, app_now)
            await self._merge(*user_item, user_delta, user_now)
            return result.thread

        root = await run_to_end(store())  # begun, it ends: the session with all its state
        app, user = await asyncio.gather(self._state(*app_item), self._state(*user_item))
        merged = _merged(app, user, session_state)
        return self._session(root, app_name, user_id, session_id, merged)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """A session with its events (oldest first), or ``None``.

        ``config.num_recent_events`` keeps the latest N events and
        ``config.after_timestamp`` those at or after that time; both read
        keyset pages from the newest, so they cost what they return.
        """
        recent = None if config is None else config.num_recent_events
        after = None if config is None else config.after_timestamp
        thread_id = self._thread_id(user_id, session_id)
        (root, events), app, user = await asyncio.gather(
            self._events(app_name, thread_id, recent, after),
            self._state(*self._app_item(app_name)),
            self._state(*self._user_item(app_name, user_id)),
        )
        if root is None:
            return None
        merged = _merged(app, user, dict(root.metadata.get("state") or {}))
        return self._session(root, app_name, user_id, session_id, merged, events)

    async def _events(
        self, app_name: str, thread_id: str, recent: int | None, after: float | None
    ) -> tuple[ThreadRecord | None, list[Event]]:
        if recent == 0:
            read = await self.threads.read_thread(builders.read(app_name, thread_id))
            return read.thread, []
        newest_first = recent is not None or after is not None
        events: list[Event] = []
        root: ThreadRecord | None = None
        token: str | None = None
        while True:
            size = _PAGE if recent is None else min(_PAGE, recent - len(events))
            page: dict[str, Any] = {"limit": size}
            if token is not None:
                page["pageToken"] = token
            order = "newest" if newest_first else "oldest"
            selection = {"type": "page", "view": "raw", "order": order, "page": page}
            read = await self.threads.read_thread(
                builders.read(app_name, thread_id, messages=selection)
            )
            root = root or read.thread
            if read.thread is None or read.messages is None:
                return read.thread, []
            for message in read.messages.items:
                event = _event(message)
                if event is None:
                    continue
                if after is not None and event.timestamp < after:
                    token = None  # older than the window: the walk is done
                    break
                events.append(event)
            else:
                token = read.messages.next_page_token
            if token is None or (recent is not None and len(events) >= recent):
                break
        return root, events[::-1] if newest_first else events

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The app's sessions (of one user, or of all), least recently updated first,
        with their merged state and no events; read in keyset pages of an index."""
        request: dict[str, Any] = {"scopeKey": text_id("app_name", app_name), "limit": _PAGE}
        if user_id is not None:
            request["category"] = text_id("user_id", user_id)
        roots: list[ThreadRecord] = []
        while True:
            page = await self.threads.list_threads(request)
            roots.extend(t for t in page.items if t.agent == AGENT)
            if page.next_page_token is None:
                break
            request["pageToken"] = page.next_page_token
        app = await self._state(*self._app_item(app_name))
        users: dict[str, dict[str, Any]] = {}
        sessions: list[Session] = []
        for root in reversed(roots):
            owner, session_id = json.loads(root.thread_id)
            if owner not in users:
                users[owner] = await self._state(*self._user_item(app_name, owner))
            state = _merged(app, users[owner], dict(root.metadata.get("state") or {}))
            sessions.append(self._session(root, app_name, owner, session_id, state))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session and its events (its user's and app's state stay)."""
        thread_id = self._thread_id(user_id, session_id)
        while True:
            read = await self.threads.read_thread(builders.read(app_name, thread_id))
            if read.thread is None:
                return
            result = await self.threads.commit_thread(
                builders.delete(app_name, thread_id, read.thread.version)
            )
            if result.type == "committed":
                return

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, prefixes removed."""
        return await self._state(*self._user_item(app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store the event and its state delta; ``temp:`` keys reach only the
        in-memory session. ``StaleSessionError`` when the session object is
        behind what is stored (someone else appended since it was read)."""
        if event.partial:
            return event
        delta = dict(event.actions.state_delta or {}) if event.actions else {}
        for key, value in delta.items():
            if key.startswith(State.TEMP_PREFIX):
                session.state[key] = value
        kept = {k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)}
        if event.actions:
            event.actions.state_delta = kept
        app_delta, user_delta, session_delta = _split(kept)
        app_item, user_item = (
            self._app_item(session.app_name),
            self._user_item(session.app_name, session.user_id),
        )
        app_name, thread_id = session.app_name, self._thread_id(session.user_id, session.id)
        app_now = await self._check_merge(*app_item, app_delta)
        user_now = await self._check_merge(*user_item, user_delta)
        message = {
            "messageId": text_id("event.id", event.id),
            "role": "user" if event.author == "user" else "assistant",
            "parts": [
                {
                    "type": "data",
                    "name": EVENT_PART,
                    "data": event.model_dump(mode="json", exclude_none=True),
                }
            ],
            "producer": {"kind": "user"} if event.author == "user" else {"kind": "agent"},
            "association": {"kind": "standalone"},
            "visibility": {"transcript": True, "context": True},
            "status": "complete",
            "metadata": {},
        }

        newest_one = {"type": "page", "view": "raw", "order": "newest", "page": {"limit": 1}}

        async def store() -> None:
            while True:
                read = await self.threads.read_thread(
                    builders.read(app_name, thread_id, messages=newest_one)
                )
                root = read.thread
                if root is None:
                    raise SessionNotFoundError(f"Session {session.id} not found.")
                newest = read.messages.items if read.messages else []
                latest = newest[0].message_id if newest else None
                version = self._version_of(session)
                if version is None:  # a session this service did not return: its update time
                    moved = root.updated_at.timestamp() > session.last_update_time
                else:  # the thread's version: exact, whatever the clocks
                    moved = version != root.version
                if latest is not None and moved:
                    mine = session.events[-1].id if session.events else None
                    if latest != mine:
                        raise StaleSessionError(
                            "The session has been modified in storage since it was loaded. "
                            "Please reload the session before appending more events."
                        )
                state = {**(root.metadata.get("state") or {}), **session_delta}
                result = await self.threads.commit_thread(
                    builders.update(
                        root,
                        {"messages": [builders.insert(message)]},
                        metadata={**root.metadata, "state": state},
                    )
                )
                if result.type == "committed" and result.thread is not None:
                    session.last_update_time = result.thread.updated_at.timestamp()
                    self._remember(session, result.thread)
                    break
            await self._merge(*app_item, app_delta, app_now)
            await self._merge(*user_item, user_delta, user_now)
            for key, value in kept.items():
                session.state[key] = value
            session.events.append(event)

        # Once begun, an append runs to its end (the state merges and the
        # session object included) even if the caller is cancelled meanwhile,
        # as the Agents SDK's sessions do with their writes. One queued behind
        # another append of the session is not begun: a cancellation takes it.
        async with self._lock(app_name, thread_id):
            await run_to_end(store())
        return event
