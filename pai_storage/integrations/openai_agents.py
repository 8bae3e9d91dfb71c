"""The OpenAI Agents SDK's ``Session`` on pai-storage's thread store.

``pip install 'pai-storage[openai-agents]'``; see ``docs/openai-agents.md``.

A session is a thread: ``session_id`` is its ``threadId`` in ``scope_key``,
and every conversation item is one message (role ``user``, ``assistant``,
``system`` or ``tool`` after the item) whose single ``data`` part, named
``openai-agents.item``, holds the item exactly as the SDK gave it. So the
conversation is visible to ``read_thread``, ``list_threads``, export, copy,
pruning and scope erasure like any other thread, and every write is one
version-checked commit: concurrent writers never lose an item.
"""

from __future__ import annotations

import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, cast

from .. import builders
from ..bundle import Stores, connect
from ..errors import InvalidInputError
from ..models import Message, ThreadRecord
from ..store import ThreadStore
from .support import missing_framework, text_id

try:
    from agents.memory.session import SessionABC
    from agents.memory.session_settings import SessionSettings, resolve_session_limit
except ImportError as exc:  # the extra is not installed
    raise missing_framework(__name__, "the OpenAI Agents SDK", "openai-agents") from exc

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

__all__ = ["ITEM_PART", "PaiSession"]

ITEM_PART = "openai-agents.item"
"""The name of the data part that holds a conversation item."""

AGENT = "openai-agents"
"""The ``agent`` of the threads a session creates."""

_PAGE = 100  # the thread store's largest page
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _role(item: dict[str, Any]) -> str:
    role = item.get("role")
    if isinstance(role, str) and role in _ROLES:
        return _ROLES[role]
    kind = item.get("type")
    if isinstance(kind, str) and kind.endswith("_output"):
        return "tool"  # function_call_output, computer_call_output, ...
    return "assistant"  # the model's own items: function calls, reasoning, ...


def _message(item: TResponseInputItem) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise InvalidInputError(f"a session item must be a dict, not {type(item).__qualname__}")
    role = _role(cast(dict[str, Any], item))
    return {
        "messageId": uuid.uuid4().hex,
        "role": role,
        "parts": [{"type": "data", "name": ITEM_PART, "data": item}],
        "producer": {"kind": "user"} if role == "user" else {"kind": "agent"},
        "association": {"kind": "standalone"},
        "visibility": {"transcript": True, "context": True},
        "status": "complete",
        "metadata": {},
    }


def _item(message: Message) -> TResponseInputItem | None:
    for part in message.parts:
        if part.type == "data" and part.name == ITEM_PART:
            return cast("TResponseInputItem", part.to_json()["data"])
    return None  # a message written by something else: not a session item


class PaiSession(SessionABC):
    """An OpenAI Agents SDK session kept as a pai-storage thread.

    Parameters
    ----------
    session_id:
        The conversation id: the thread's ``threadId``.
    stores:
        An open :func:`pai_storage.connect` bundle, or a
        :class:`~pai_storage.ThreadStore`.
    scope_key:
        The tenant the thread belongs to.
    session_settings:
        The SDK's settings (``limit``: the default for :meth:`get_items`).
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        stores: Stores | ThreadStore,
        *,
        scope_key: str = "default",
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = text_id("session_id", session_id)
        self.scope_key = text_id("scope_key", scope_key)
        self.threads = stores if isinstance(stores, ThreadStore) else stores.threads
        self.session_settings = session_settings
        self._owned: Stores | None = None
        self._root: ThreadRecord | None = None  # the root as of our last read or commit

    @classmethod
    def from_url(
        cls,
        session_id: str,
        *,
        url: str,
        scope_key: str = "default",
        session_settings: SessionSettings | None = None,
        **options: Any,
    ) -> Self:
        """A session on the stores at ``url`` (``options`` as for
        :func:`pai_storage.connect`); they open on first use and
        :meth:`close` (or ``async with``) closes them."""
        stores = connect(url, **options)
        session = cls(session_id, stores, scope_key=scope_key, session_settings=session_settings)
        session._owned = stores
        return session

    async def close(self) -> None:
        """Close the stores :meth:`from_url` opened (a bundle you passed stays open)."""
        if self._owned is not None:
            await self._owned.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ reads

    async def _page(
        self, order: str, limit: int, token: str | None
    ) -> tuple[ThreadRecord | None, list[Message], str | None]:
        page: dict[str, Any] = {"limit": limit}
        if token is not None:
            page["pageToken"] = token
        result = await self.threads.read_thread(
            builders.read(
                self.scope_key,
                self.session_id,
                messages={"type": "page", "view": "raw", "order": order, "page": page},
            )
        )
        self._root = result.thread
        if result.messages is None:
            return result.thread, [], None
        return result.thread, list(result.messages.items), result.messages.next_page_token

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation, oldest first; with ``limit``, its latest ``limit`` items.

        Reads keyset pages of at most 100 messages: the latest items cost one
        read, whatever the length of the conversation.
        """
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and wanted <= 0:
            return []
        order = "oldest" if wanted is None else "newest"
        items: list[TResponseInputItem] = []
        token: str | None = None
        while True:
            size = _PAGE if wanted is None else min(_PAGE, wanted - len(items))
            _, messages, token = await self._page(order, size, token)
            for message in messages:
                item = _item(message)
                if item is not None:
                    items.append(item)
            if token is None or (wanted is not None and len(items) >= wanted):
                break
        return items if wanted is None else items[::-1]

    # ------------------------------------------------------------ writes

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items, in order, in one commit."""
        if not items:
            return
        inserts = [builders.insert(_message(item)) for item in items]
        changes = {"messages": inserts}
        while True:
            root = self._root
            if root is None:
                commit = builders.create(self.scope_key, self.session_id, changes, agent=AGENT)
            else:
                commit = builders.update(root, changes)
            result = await self.threads.commit_thread(commit)
            if result.type == "committed":
                self._root = result.thread
                return
            await self._refresh()

    async def _refresh(self) -> None:
        result = await self.threads.read_thread(builders.read(self.scope_key, self.session_id))
        self._root = result.thread

    async def _latest(self) -> tuple[ThreadRecord | None, Message | None]:
        """The root and the newest message that is a session item (messages
        written by something else are passed over)."""
        token: str | None = None
        size = 1  # the newest message is nearly always an item
        while True:
            root, messages, token = await self._page("newest", size, token)
            for message in messages:
                if _item(message) is not None:
                    return root, message
            if root is None or token is None:
                return root, None
            size = _PAGE

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the latest item and return it (``None`` when there is none);
        messages written by something else stay."""
        while True:
            root, latest = await self._latest()
            if root is None or latest is None:
                return None
            changes = {"messages": [builders.delete_record(latest.message_id)]}
            result = await self.threads.commit_thread(builders.update(root, changes))
            if result.type == "committed":
                self._root = result.thread
                return _item(latest)
            # a conflict (someone wrote meanwhile): look again

    async def clear_session(self) -> None:
        """Delete the conversation: the whole thread."""
        while True:
            await self._refresh()
            root = self._root
            if root is None:
                return
            result = await self.threads.commit_thread(
                builders.delete(self.scope_key, self.session_id, root.version)
            )
            if result.type == "committed":
                self._root = None
                return
