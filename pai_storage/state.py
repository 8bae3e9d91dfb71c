"""The agent-state store: per-session agent state, single values and lists.

A *session* is ``(user_id, session_id)``; it holds named *states*, each either
a single value (versioned, for optimistic concurrency) or a list (append-only
in practice, written incrementally). The user guide is ``docs/agent-state.md``.

:class:`AgentStateStore` is the contract. Its public methods validate every
argument (a bad one raises :class:`~pai_storage.errors.InvalidInputError` and
writes nothing), then call a few protected hooks that a backend implements;
everything that does not need the database -- the anonymous-user sentinel,
the list content hash and the decision to append rather than rewrite, the
retry loop of a list write, page tokens -- lives here, once.

Invariants every backend keeps (the conformance topic checks them):

- a state key holds either a single value or a list; using it as the other
  kind is an :class:`InvalidInputError` (delete it first to change its kind);
- a single value's version is 1 when the key is created and grows by one on
  every save; of racing conditional saves on one version exactly one wins;
- a session expires ``session_ttl`` after its last write, all at once, and is
  absent to every operation from that instant, swept or not;
- values round-trip exactly (strict JSON: key order, ``1`` vs ``1.0``, 64-bit
  integers) and are copies: callers never share objects with the store.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, ClassVar, Literal, NamedTuple, TypeVar, overload

from pydantic import Field, StrictInt

from .clock import Clock
from .conflicts import Conflict
from .errors import ConfigurationError, InvalidInputError, StorageError, UnavailableError
from .events import StoreWarning, WarningCallback
from .models import Json, Page, StoreModel
from .runtime import (
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    RuntimeStore,
    check_limit,
    check_name,
    check_value,
    option_duration,
    option_value_bytes,
    parse_json_text,
    token_strings,
)
from .strict_json import INT64_MAX

__all__ = [
    "ANONYMOUS_USER",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_SESSION_TTL",
    "EMPTY_LIST_HASH",
    "ENUMERATE",
    "UNDECODABLE",
    "AgentStateStore",
    "ListConflict",
    "ListHead",
    "ListWrite",
    "SessionKey",
    "SessionRange",
    "StaleVersion",
    "StateConflict",
    "StoredKind",
    "VersionedState",
    "extend_list_hash",
    "session_ranges",
]

ENUMERATE = "enumerate"
"""The capability of a runtime store that enumerates its whole content for a
backend-to-backend copy (``pai-storage copy --all``; ``docs/lifecycle.md``):
``_list_sessions`` and ``_session_keys`` on an :class:`AgentStateStore`,
``_list_scopes`` on a :class:`~pai_storage.snapshots.SnapshotStore`."""

DEFAULT_SESSION_TTL = timedelta(days=30)
"""How long a session lives after its last write, unless configured otherwise."""


ANONYMOUS_USER = "\x1fanonymous"
"""The stored user key of ``user_id=None``.

Real user ids can never contain U+001F (nor U+0000), so no real user id can
produce this key. U+001F rather than U+0000 because PostgreSQL text cannot
hold U+0000.
"""

EMPTY_LIST_HASH = hashlib.sha256(b"pai-storage state list v1").hexdigest()
"""The content hash of an empty list (the start of the hash chain)."""

UNDECODABLE: Any = object()
"""What :meth:`AgentStateStore.decode_stored` returns for a stored text that no
longer decodes (after reporting it)."""

_MAX_LIST_ATTEMPTS = 1000
_T = TypeVar("_T")
_W = TypeVar("_W")


def extend_list_hash(current: str, texts: Sequence[str]) -> str:
    """The content hash of a list after appending items with canonical JSON ``texts``.

    The hash is a chain, ``h(n) = sha256(h(n-1) || utf8(text(n)))`` starting
    at :data:`EMPTY_LIST_HASH`, so an append extends the stored hash without
    reading the stored items.
    """
    digest = bytes.fromhex(current)
    for text in texts:
        digest = hashlib.sha256(digest + text.encode("utf-8")).digest()
    return digest.hex()


class VersionedState(StoreModel):
    """A single state value with its version (1 on create, +1 on every save)."""

    value: Json
    version: StrictInt = Field(ge=1)

    def __repr_args__(self) -> Any:
        # A stored value may hold personal data: reprs (and so logs) never show it.
        yield "version", self.version


class StateConflict(StoreModel, Conflict):
    """What :meth:`AgentStateStore.save_if_version` returns when its condition failed.

    Nothing was written. ``current_version`` is the key's version as stored
    now (``0``: the key is absent or its session expired), which is what to
    pass as ``expected_version`` after re-reading.
    """

    current_version: StrictInt = Field(ge=0)

    def describe(self) -> str:
        if self.current_version == 0:
            return "the key is absent (current version is 0)"
        return f"the key's current version is {self.current_version}"


class ListConflict(StoreModel, Conflict):
    """What :meth:`AgentStateStore.append_list` with ``expected_length`` returns when the
    stored list has another length.

    Nothing was written. ``current_length`` is the list's length as stored now
    (``0``: the key is absent or its session expired).
    """

    current_length: StrictInt = Field(ge=0)

    def describe(self) -> str:
        return f"the list's current length is {self.current_length}"


@dataclass(frozen=True, slots=True)
class StaleVersion:
    """What :meth:`AgentStateStore._save_value` returns when its condition failed.

    ``current`` is the stored version (``0``: the key is absent).
    """

    current: int


class SessionKey(NamedTuple):
    """A session as backends see it: the stored user key and the session id.

    ``user`` is :data:`ANONYMOUS_USER` for ``user_id=None``.
    """

    user: str
    session: str


class SessionRange(NamedTuple):
    """One range of stored session keys ``(user, session)`` that a listing of
    every session reads (:func:`session_ranges`).

    ``users`` is which user keys: ``"anonymous"`` (only :data:`ANONYMOUS_USER`),
    ``"below"`` (the real user keys below it) or ``"above"`` (those above it);
    ``after`` is where to start inside the range, exclusive (``None``: at its
    beginning).
    """

    users: Literal["anonymous", "below", "above"]
    after: SessionKey | None


def session_ranges(after: tuple[str | None, str] | None) -> list[SessionRange]:
    """The ranges ``_list_sessions`` reads, in order, for a page that starts after ``after``.

    The listing's order is user id ``None`` first, then users by code point;
    the stored key of ``None`` (:data:`ANONYMOUS_USER`, starting with U+001F)
    is not first in the keys' own order, since real user ids below U+001F
    sort before it. So a full listing is three index ranges: the anonymous
    user's sessions, then the user keys below its key, then those above it;
    a page resumed past the anonymous user skips what it has read. A backend
    reads each range in key order, up to what the page still needs.
    """
    if after is None or after[0] is None:
        start = None if after is None else SessionKey(ANONYMOUS_USER, after[1])
        return [
            SessionRange("anonymous", start),
            SessionRange("below", None),
            SessionRange("above", None),
        ]
    key = SessionKey(after[0], after[1])
    if key.user < ANONYMOUS_USER:  # code point order: the byte order of UTF-8
        return [SessionRange("below", key), SessionRange("above", None)]
    return [SessionRange("above", key)]


class StoredKind(Enum):
    """What a hook returns when the key holds the other kind of state."""

    VALUE = "value"
    """The key holds a single value (returned by the list hooks)."""
    LIST = "list"
    """The key holds a list (returned by the single-value hooks)."""


@dataclass(frozen=True, slots=True)
class ListHead:
    """What identifies a stored list's content: its length and its content hash."""

    length: int
    hash: str


@dataclass(frozen=True, slots=True)
class ListWrite:
    """One conditional list write, decided by the core for a backend to apply.

    Applied only while the stored list still has the head ``expect`` (``None``:
    the key is absent, or its session expired); then, with ``replace`` the
    list becomes ``items``, otherwise ``items`` are appended after the stored
    ones. Either way the stored head becomes ``head``.
    """

    expect: ListHead | None
    replace: bool
    items: tuple[Any, ...]
    """The backend's own copies of the items to write (strict JSON)."""
    texts: tuple[str, ...]
    """The canonical JSON text of each item of ``items``."""
    head: ListHead


class AgentStateStore(RuntimeStore):
    """Per-session agent state: named single values and lists.

    Parameters
    ----------
    clock:
        Test-only clock override; production uses the provider's clock.
    on_warning:
        Receives recoverable integrity warnings.
    token_secret:
        Key (bytes) that makes page tokens unforgeable; set it in production.
    session_ttl:
        How long a session lives after its last write (a
        :class:`~datetime.timedelta`, default 30 days); ``None`` keeps
        sessions forever.
    max_value_bytes:
        The size limit of one value or one list item, in bytes of canonical
        JSON (default 4 MiB; at most the backend's :attr:`value_bytes_limit`).

    Raises
    ------
    ConfigurationError
        An option has the wrong type or is out of range.
    """

    value_bytes_limit: ClassVar[int | None] = None
    """The backend's hard limit for ``max_value_bytes`` (``None``: no limit)."""
    capabilities: ClassVar[frozenset[str]] = frozenset()
    """Optional features this store implements: :data:`ENUMERATE` when it
    provides :meth:`_list_sessions` and :meth:`_session_keys`."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
        session_ttl: timedelta | None = DEFAULT_SESSION_TTL,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning, token_secret=token_secret)
        self.session_ttl: timedelta | None = option_duration("session_ttl", session_ttl)
        self.max_value_bytes: int = option_value_bytes(
            max_value_bytes, hard=self.value_bytes_limit, backend=self.backend_name
        )

    # ------------------------------------------------------------ single values

    async def save(self, user_id: str | None, session_id: str, key: str, value: Any) -> int:
        """Store ``value`` under ``key``, creating or replacing it; return its new version.

        Raises
        ------
        InvalidInputError
            A bad name, a value over the size limit, or ``key`` holds a list.
        SerializationError
            ``value`` is not strict JSON.
        """
        session = self._session(user_id, session_id)
        key = check_name("key", key)
        copy, text = check_value(value, limit=self.max_value_bytes)
        await self._ensure_ready()
        version = await self._save_value(session, key, copy, text, None)
        if isinstance(version, StoredKind):
            raise _kind_error(version)
        if isinstance(version, StaleVersion):
            raise StorageError(f"the {self.backend_name} backend skipped an unconditional save")
        return version

    async def save_if_version(
        self,
        user_id: str | None,
        session_id: str,
        key: str,
        value: Any,
        expected_version: int,
    ) -> int | StateConflict:
        """Store ``value`` only if the stored version is ``expected_version``.

        ``expected_version=0`` saves only when ``key`` is absent. Returns the
        new version, or a :class:`StateConflict` carrying the current version
        (``0``: absent) when the condition failed and nothing was written. Of
        racing calls with one expected version exactly one wins.

        Raises
        ------
        InvalidInputError
            A bad name or ``expected_version`` (an integer >= 0), a value over
            the size limit, or ``key`` holds a list.
        SerializationError
            ``value`` is not strict JSON.
        """
        session = self._session(user_id, session_id)
        key = check_name("key", key)
        if type(expected_version) is not int or not 0 <= expected_version <= INT64_MAX:
            raise InvalidInputError("expected_version must be an integer >= 0 (0: key absent)")
        copy, text = check_value(value, limit=self.max_value_bytes)
        await self._ensure_ready()
        saved = await self._save_value(session, key, copy, text, expected_version)
        if isinstance(saved, StoredKind):
            raise _kind_error(saved)
        if isinstance(saved, StaleVersion):
            return StateConflict(current_version=saved.current)
        return saved

    async def get(self, user_id: str | None, session_id: str, key: str) -> Any:
        """The value stored under ``key``, or ``None`` when absent.

        A stored JSON ``null`` also reads as ``None``; use
        :meth:`get_versioned` to tell them apart.

        Raises
        ------
        InvalidInputError
            A bad name, or ``key`` holds a list (read it with :meth:`get_list`).
        """
        found = await self.get_versioned(user_id, session_id, key)
        return None if found is None else found.value

    async def get_versioned(
        self, user_id: str | None, session_id: str, key: str
    ) -> VersionedState | None:
        """The value stored under ``key`` and its version, or ``None`` when absent.

        Raises
        ------
        InvalidInputError
            A bad name, or ``key`` holds a list (read it with :meth:`get_list`).
        """
        session = self._session(user_id, session_id)
        key = check_name("key", key)
        await self._ensure_ready()
        return _of_kind(await self._get_value(session, key))

    # ------------------------------------------------------------ lists

    async def save_list(
        self, user_id: str | None, session_id: str, key: str, values: Sequence[Any]
    ) -> None:
        """Store the whole list ``values`` under ``key``.

        When the stored list is an unchanged prefix of ``values`` (same length
        n and same content hash as the first n items), only the items after it
        are written; otherwise the list is rewritten.

        Raises
        ------
        InvalidInputError
            A bad name, ``values`` not a list or tuple, an item over the size
            limit, or ``key`` holds a single value.
        SerializationError
            An item is not strict JSON.
        """
        session = self._session(user_id, session_id)
        key = check_name("key", key)
        items, texts = self._check_items(values)
        # The hash of every prefix, so whatever is stored the decision is one lookup.
        prefix_hashes = [EMPTY_LIST_HASH]
        for text in texts:
            prefix_hashes.append(extend_list_hash(prefix_hashes[-1], (text,)))
        final = ListHead(len(items), prefix_hashes[-1])
        await self._ensure_ready()

        def plan(head: ListHead | None) -> ListWrite:
            n = -1 if head is None else head.length
            if head is not None and n <= len(items) and prefix_hashes[n] == head.hash:
                return ListWrite(head, False, items[n:], texts[n:], final)
            return ListWrite(head, True, items, texts, final)

        await self._write_list_with_retry(session, key, plan)

    @overload
    async def append_list(
        self,
        user_id: str | None,
        session_id: str,
        key: str,
        values: Sequence[Any],
        *,
        expected_length: None = None,
    ) -> int: ...

    @overload
    async def append_list(
        self,
        user_id: str | None,
        session_id: str,
        key: str,
        values: Sequence[Any],
        *,
        expected_length: int,
    ) -> int | ListConflict: ...

    async def append_list(
        self,
        user_id: str | None,
        session_id: str,
        key: str,
        values: Sequence[Any],
        *,
        expected_length: int | None = None,
    ) -> int | ListConflict:
        """Append ``values`` to the list under ``key`` (created if absent); return its new length.

        Only the new items are sent. With ``expected_length`` the append
        happens only when the stored list has that length (0: absent);
        otherwise nothing is written and the result is a
        :class:`ListConflict` carrying the current length.

        Raises
        ------
        InvalidInputError
            A bad name, ``values`` not a list or tuple, a bad
            ``expected_length``, an item over the size limit, or ``key`` holds
            a single value.
        SerializationError
            An item is not strict JSON.
        """
        session = self._session(user_id, session_id)
        key = check_name("key", key)
        if expected_length is not None and (
            type(expected_length) is not int or not 0 <= expected_length <= INT64_MAX
        ):
            raise InvalidInputError("expected_length must be None or an integer >= 0")
        items, texts = self._check_items(values)
        await self._ensure_ready()

        def plan(head: ListHead | None) -> ListWrite | ListConflict:
            length = 0 if head is None else head.length
            if expected_length is not None and length != expected_length:
                return ListConflict(current_length=length)
            start = EMPTY_LIST_HASH if head is None else head.hash
            new_head = ListHead(length + len(items), extend_list_hash(start, texts))
            return ListWrite(head, False, items, texts, new_head)

        written = await self._write_list_with_retry(session, key, plan)
        return written if isinstance(written, ListConflict) else written.length

    async def get_list(self, user_id: str | None, session_id: str, key: str) -> list[Any]:
        """The list stored under ``key``; ``[]`` when absent.

        Raises
        ------
        InvalidInputError
            A bad name, or ``key`` holds a single value (read it with :meth:`get`).
        """
        session = self._session(user_id, session_id)
        key = check_name("key", key)
        await self._ensure_ready()
        found = _of_kind(await self._get_list(session, key))
        return [] if found is None else found

    # ------------------------------------------------------------ sessions

    async def exists(self, user_id: str | None, session_id: str) -> bool:
        """Whether the session holds at least one (unexpired) state."""
        session = self._session(user_id, session_id)
        await self._ensure_ready()
        return await self._exists(session)

    async def delete(self, user_id: str | None, session_id: str) -> bool:
        """Delete the whole session; ``False`` when it did not exist (or had expired)."""
        session = self._session(user_id, session_id)
        await self._ensure_ready()
        return await self._delete(session)

    async def delete_state(self, user_id: str | None, session_id: str, key: str) -> bool:
        """Delete one state (a value or a list); ``False`` when it did not exist.

        Deleting a session's last state deletes the session.
        """
        session = self._session(user_id, session_id)
        key = check_name("key", key)
        await self._ensure_ready()
        return await self._delete_state(session, key)

    async def list_session_ids(
        self, user_id: str | None, *, limit: int = DEFAULT_PAGE_LIMIT, page_token: str | None = None
    ) -> Page[str]:
        """The ids of the user's sessions, in code-point order, one keyset page at a time.

        Raises
        ------
        InvalidInputError
            A bad user id or ``limit`` (1 to 1,000).
        PageTokenError
            ``page_token`` is malformed, tampered with, or from another query
            (another user, another store kind).
        """
        user = self._user(user_id)
        limit = check_limit(limit)
        query = {"user": user}
        after: str | None = None
        if page_token is not None:
            position = self.decode_token(page_token, "state-sessions", user, query)
            (after,) = token_strings(position, "after")
        await self._ensure_ready()
        ids = await self._list_session_ids(user, after, limit + 1)
        token = None
        if len(ids) > limit:
            ids = ids[:limit]
            token = self.encode_token("state-sessions", user, query, {"after": ids[-1]})
        return Page[str].model_construct(items=list(ids), next_page_token=token)

    async def purge_expired(self) -> int:
        """Delete every expired session now; return how many were deleted."""
        await self._ensure_ready()
        return await self._purge_expired()

    async def _erase_scope(self, user: str) -> int:
        """Delete every session of ``user``, expired or not, with all its state.

        The primitive of :meth:`Stores.erase_scope <pai_storage.Stores.erase_scope>`
        (``user`` is a valid name, the store initialized); returns how many
        sessions were deleted. This default deletes the live sessions page by
        page, then purges every expired session of the store (expired
        sessions are not listed), counting only the live ones; a backend
        deletes the user's sessions, expired ones included, with one scoped
        delete instead.
        """
        erased, token = 0, None
        while True:
            page = await self.list_session_ids(user, limit=MAX_PAGE_LIMIT, page_token=token)
            for session_id in page.items:
                erased += await self.delete(user, session_id)
            token = page.next_page_token
            if token is None:
                break
        await self._purge_expired()
        return erased

    # ------------------------------------------------------------ for backends

    def session_expiry(self, written_at: datetime) -> datetime | None:
        """When a session last written at ``written_at`` expires (``None``: never)."""
        return None if self.session_ttl is None else written_at + self.session_ttl

    async def decode_stored(self, session: SessionKey, key: str, text: object) -> Any:
        """A stored value or list item, decoded from its canonical JSON ``text``.

        A stored text that no longer decodes as strict JSON (edited by hand,
        damaged) is reported through ``on_warning`` (kind ``invalid_record``,
        the user as ``scope_key``, the session as ``thread_id``, and ``key``;
        never the text) and :data:`UNDECODABLE` is returned: the hooks then
        treat that value as absent and leave that list item out.
        """
        try:
            if not isinstance(text, str):
                raise ValueError("not a string")
            return parse_json_text(text)
        except (ValueError, TypeError, RecursionError):
            await self.warn(
                StoreWarning(
                    kind="invalid_record",
                    reason="a stored agent state no longer decodes as strict JSON; "
                    "it is treated as absent",
                    scope_key=session.user,
                    thread_id=session.session,
                    key=key,
                )
            )
            return UNDECODABLE

    async def stored_value(
        self, session: SessionKey, key: str, text: object, version: int
    ) -> VersionedState | None:
        """A stored single value at ``version`` (for ``_get_value``), ``None`` when its
        ``text`` no longer decodes (reported, see :meth:`decode_stored`)."""
        value = await self.decode_stored(session, key, text)
        if value is UNDECODABLE:
            return None
        return VersionedState.model_construct(value=value, version=version)

    async def stored_items(
        self, session: SessionKey, key: str, texts: Iterable[object]
    ) -> list[Any]:
        """A stored list's items (for ``_get_list``), decoded in order; an item whose
        text no longer decodes is left out (reported, see :meth:`decode_stored`)."""
        values = [await self.decode_stored(session, key, text) for text in texts]
        return [value for value in values if value is not UNDECODABLE]

    # ------------------------------------------------------------ hooks

    @abstractmethod
    async def _save_value(
        self,
        session: SessionKey,
        key: str,
        value: Any,
        text: str,
        expected_version: int | None,
    ) -> int | StoredKind | StaleVersion:
        """Atomically write a single value; return its new version.

        ``expected_version`` ``None`` writes unconditionally; ``0`` writes only
        when the key is absent; ``n`` only when the stored version is ``n``
        (else return :class:`StaleVersion` with the stored version, ``0`` when
        absent, writing nothing). Return :attr:`StoredKind.LIST`
        (writing nothing) when the key holds a list. A write refreshes the
        session's expiry; a write to an expired session starts a new, empty one.
        """

    @abstractmethod
    async def _get_value(self, session: SessionKey, key: str) -> VersionedState | StoredKind | None:
        """The single value under ``key``; :attr:`StoredKind.LIST` when it holds a list."""

    @abstractmethod
    async def _list_head(self, session: SessionKey, key: str) -> ListHead | StoredKind | None:
        """The stored list's length and hash; :attr:`StoredKind.VALUE` for a single value."""

    @abstractmethod
    async def _write_list(
        self, session: SessionKey, key: str, write: ListWrite
    ) -> bool | StoredKind:
        """Apply ``write`` atomically if the stored head still equals ``write.expect``.

        Return ``False`` (writing nothing) when it does not, and
        :attr:`StoredKind.VALUE` when the key holds a single value. An append
        writes only ``write.items``, never the stored ones. A write refreshes
        the session's expiry.
        """

    @abstractmethod
    async def _get_list(self, session: SessionKey, key: str) -> list[Any] | StoredKind | None:
        """The stored list (a fresh copy); :attr:`StoredKind.VALUE` for a single value."""

    @abstractmethod
    async def _exists(self, session: SessionKey) -> bool:
        """Whether the session is unexpired and holds at least one state."""

    @abstractmethod
    async def _delete(self, session: SessionKey) -> bool:
        """Delete the session; whether an unexpired one existed."""

    @abstractmethod
    async def _delete_state(self, session: SessionKey, key: str) -> bool:
        """Delete one state; whether it existed. Removing the last state removes the session."""

    @abstractmethod
    async def _list_session_ids(self, user: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` unexpired session ids of ``user`` greater than ``after``, ascending."""

    @abstractmethod
    async def _purge_expired(self) -> int:
        """Delete every expired session; return the count."""

    # ------------------------------------------------------------ enumeration

    async def _list_sessions(
        self, after: tuple[str | None, str] | None, limit: int
    ) -> list[tuple[str | None, str]]:
        """Up to ``limit`` ``(user_id, session_id)`` pairs of live (unexpired) sessions.

        In order: user id ``None`` first, then users by code point; within a
        user, session ids by code point; strictly after ``after``. Served by
        an index, never a scan per page. A backend that implements it (and
        :meth:`_session_keys`) declares :data:`ENUMERATE` in
        :attr:`capabilities`.
        """
        raise self._no_enumeration()

    async def _session_keys(
        self, user_id: str | None, session_id: str
    ) -> tuple[list[str], list[str]]:
        """``(value keys, list keys)`` of one live session, each sorted by code point.

        ``([], [])`` for a missing or expired session.
        """
        raise self._no_enumeration()

    def _no_enumeration(self) -> ConfigurationError:
        return ConfigurationError(
            f"the {self.backend_name} agent-state store does not enumerate its sessions, "
            "so it cannot take part in a copy of the runtime stores (--all)"
        )

    # ------------------------------------------------------------ internals

    def _user(self, user_id: str | None) -> str:
        return ANONYMOUS_USER if user_id is None else check_name("user_id", user_id)

    def _session(self, user_id: str | None, session_id: str) -> SessionKey:
        return SessionKey(self._user(user_id), check_name("session_id", session_id))

    def _check_items(self, values: object) -> tuple[tuple[Any, ...], tuple[str, ...]]:
        if type(values) not in (list, tuple):
            raise InvalidInputError(
                f"values must be a list or tuple, not {type(values).__qualname__}"
            )
        assert isinstance(values, list | tuple)
        items: list[Any] = []
        texts: list[str] = []
        for i, item in enumerate(values):
            copy, text = check_value(item, path=f"values[{i}]", limit=self.max_value_bytes)
            items.append(copy)
            texts.append(text)
        return tuple(items), tuple(texts)

    async def _write_list_with_retry(
        self, session: SessionKey, key: str, plan: Callable[[ListHead | None], ListWrite | _W]
    ) -> ListHead | _W:
        """Read the head, plan, write conditionally; re-plan when a racing write got there first.

        Returns the head written, or what ``plan`` returned instead of a
        :class:`ListWrite` when it declined to write (a conflict).
        """
        for _ in range(_MAX_LIST_ATTEMPTS):
            write = plan(_of_kind(await self._list_head(session, key)))
            if not isinstance(write, ListWrite):
                return write
            if _of_kind(await self._write_list(session, key, write)):
                return write.head
        raise UnavailableError(
            f"the list changed under {_MAX_LIST_ATTEMPTS} racing writes in a row; "
            "nothing was written; retry"
        )


def _of_kind(result: _T | StoredKind) -> _T:
    """``result``, unless a hook said the key holds the other kind of state."""
    if isinstance(result, StoredKind):
        raise _kind_error(result)
    return result


def _kind_error(stored: StoredKind) -> InvalidInputError:
    if stored is StoredKind.LIST:
        return InvalidInputError(
            "this state key holds a list: read it with get_list, write it with "
            "save_list or append_list (or delete_state it first)"
        )
    return InvalidInputError(
        "this state key holds a single value: read it with get or get_versioned, write "
        "it with save or save_if_version (or delete_state it first)"
    )
