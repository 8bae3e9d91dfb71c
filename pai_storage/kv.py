"""The key-value store: namespaced JSON items with versions and exact expiry.

An *item* lives at ``(namespace, key)``: a namespace is a tuple of 1 to 16
names (``("workspace", "sandbox-42")``), a key is one name. The user guide is
``docs/kv.md``.

:class:`KeyValueStore` is the contract. Its public methods validate every
argument (a bad one raises :class:`~pai_storage.errors.InvalidInputError` or
:class:`~pai_storage.errors.PageTokenError` and writes nothing), then call a
few protected hooks that a backend implements; everything that does not need
the database -- decoding stored values and reporting the ones that no longer
decode, page tokens and the one-extra-row end-of-list test, key
de-duplication, millisecond durations -- lives here, once.

Invariants every backend keeps (the conformance topic checks them):

- an item's ``version`` is 1 when it is created and grows by one on every
  write; a write over an *expired* item creates it afresh (version 1, new
  ``created_at``); of racing conditional writes on one version exactly one
  wins;
- an item whose ``expires_at`` is at or before the store's clock is absent to
  every operation from that instant, whether or not it was purged yet;
- order is by namespace *path* (each segment followed by U+001F, see
  :func:`namespace_path`), then key, comparing code points; a namespace prefix
  matches whole segments only (``("a",)`` covers ``("a", "b")``, never
  ``("ab",)``);
- values round-trip exactly (strict JSON: key order, ``1`` vs ``1.0``, 64-bit
  integers) and are copies: callers never share objects with the store.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pydantic import Field, StrictInt

from .clock import Clock
from .conflicts import Conflict
from .errors import InvalidInputError, PageTokenError
from .events import StoreWarning, WarningCallback
from .fields import Id
from .frozen import FrozenList
from .models import Json, Page, StoreModel, Timestamp
from .runtime import (
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_PAGE_LIMIT,
    MAX_NAMESPACE_DEPTH,
    MAX_PAGE_LIMIT,
    RuntimeStore,
    check_duration,
    check_limit,
    check_name,
    check_namespace,
    check_value,
    option_value_bytes,
    parse_json_text,
    token_strings,
)
from .strict_json import INT64_MAX

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_GET_MANY_KEYS",
    "NAMESPACE_SEPARATOR",
    "Item",
    "KVConflict",
    "KVRecord",
    "KeyValueStore",
    "VersionMismatch",
    "namespace_from_path",
    "namespace_path",
    "namespace_path_after",
    "prefix_upper_bound",
]


MAX_GET_MANY_KEYS = 1000
"""Most keys one :meth:`KeyValueStore.get_many` call may ask for."""

NAMESPACE_SEPARATOR = "\x1f"
"""Ends every segment of a namespace path; names can never contain it."""

_SEARCH = "kv-search"
_KEYS = "kv-keys"
_NAMESPACES = "kv-namespaces"
_TOKEN_SCOPE = "kv"
_MS = timedelta(milliseconds=1)


# ---------------------------------------------------------------- namespace paths


def namespace_path(namespace: Sequence[str]) -> str:
    """The namespace as one string: every segment followed by U+001F.

    ``("a", "b")`` is ``"a\\x1fb\\x1f"`` and ``()`` is ``""``. Because names
    never contain U+001F and every segment is terminated, a whole-segment
    namespace prefix is exactly a string prefix of the path, and the store's
    order of namespaces is the code-point order of their paths (which is also
    the byte order of their UTF-8 encoding, so a ``COLLATE "C"`` index or a
    MongoDB index on the path serves it).
    """
    return "".join(segment + NAMESPACE_SEPARATOR for segment in namespace)


def namespace_from_path(path: str) -> tuple[str, ...]:
    """The namespace of a path made by :func:`namespace_path` (``ValueError`` if malformed)."""
    if not path:
        return ()
    if not path.endswith(NAMESPACE_SEPARATOR):
        raise ValueError("a namespace path ends with U+001F")
    return tuple(path[:-1].split(NAMESPACE_SEPARATOR))


def prefix_upper_bound(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix``.

    A prefix query is then the range ``prefix <= s < prefix_upper_bound(prefix)``
    (``None``: no upper bound). It serves namespace paths (whose last code
    point is U+001F, so the bound ends in U+0020) and key prefixes alike. The
    bound is valid text: it skips the surrogate block, and trailing
    U+10FFFF characters, which nothing can follow, are dropped first.
    """
    stripped = prefix.rstrip("\U0010ffff")
    if not stripped:
        return None
    last = ord(stripped[-1]) + 1
    if last == 0xD800:
        last = 0xE000
    return stripped[:-1] + chr(last)


def namespace_path_after(namespace: Sequence[str], max_depth: int | None) -> str:
    """Where a listing of namespaces continues once it has found ``namespace``.

    The least path past every item ``namespace`` stands for in that listing:
    when it is as deep as ``max_depth`` (a truncated namespace) everything
    whose path starts with its path, so the :func:`prefix_upper_bound` of it;
    otherwise only its own items, so its path followed by U+0001, the least
    text above it (names have no U+0000), which its sub-namespaces still
    follow. ``_list_namespaces`` starts at it from ``after`` and skips with it
    from one found namespace to the next (encode it for a byte-keyed index:
    UTF-8 keeps the order).
    """
    path = namespace_path(namespace)
    if max_depth is not None and len(namespace) >= max_depth:
        return prefix_upper_bound(path) or path  # ends in U+001F: the bound ends in U+0020
    return path + "\x01"


# ---------------------------------------------------------------- results


class Item(StoreModel):
    """One stored item, as every read and write returns it.

    ``ttl`` is the time-to-live it was last written with (``None``: it never
    expires); ``expires_at`` is when it stops existing. ``updated_at`` is the
    time of the last write; refreshing the TTL on read moves only
    ``expires_at``.
    """

    namespace: tuple[Id, ...]
    key: Id
    value: Json
    version: StrictInt = Field(ge=1)
    created_at: Timestamp
    updated_at: Timestamp
    expires_at: Timestamp | None = None
    ttl: timedelta | None = None

    def __repr_args__(self) -> Any:
        # A stored value may hold personal data: reprs (and so logs) never show it.
        for name, value in super().__repr_args__():
            if name != "value":
                yield name, value


_ItemPage = Page[Item]
_UNDECODABLE = (ValueError, TypeError, RecursionError)
"""What :func:`parse_json_text` raises for stored text that is not strict JSON."""


class KVConflict(StoreModel, Conflict):
    """The outcome of a :meth:`KeyValueStore.put_if_version` whose condition failed.

    Nothing was written. ``current`` is the item as stored now (``None``: the
    key is absent, expired, or its stored value no longer decodes).
    """

    current: Item | None

    def describe(self) -> str:
        if self.current is None:
            return "the key is absent"
        return f"the item's current version is {self.current.version}"


# ---------------------------------------------------------------- backend records


@dataclass(frozen=True, slots=True)
class KVRecord:
    """An item as a backend stores it: the value is its canonical JSON text.

    Backends return records from their hooks; the core decodes ``text`` (a
    text that no longer decodes is reported through ``on_warning`` and the
    item treated as absent) and builds the :class:`Item`.
    """

    namespace: tuple[str, ...]
    key: str
    text: str
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    ttl: timedelta | None


@dataclass(frozen=True, slots=True)
class VersionMismatch:
    """What :meth:`KeyValueStore._put_if_version` returns when it wrote nothing.

    ``current`` is the live stored record (``None``: absent or expired).
    """

    current: KVRecord | None


# ---------------------------------------------------------------- the contract


class KeyValueStore(RuntimeStore):
    """A namespaced key-value store of strict-JSON items with versions and expiry.

    Parameters
    ----------
    clock:
        Test-only clock override; production uses the provider's clock.
    on_warning:
        Receives recoverable integrity warnings (a stored value that no
        longer decodes: kind ``invalid_record``, with its namespace and key).
    token_secret:
        Key (bytes) that makes page tokens unforgeable; set it in production.
    max_value_bytes:
        The size limit of one value, in bytes of canonical JSON (default
        4 MiB; at most the backend's :attr:`value_bytes_limit`).

    Raises
    ------
    ConfigurationError
        An option has the wrong type or is out of range.
    """

    value_bytes_limit: ClassVar[int | None] = None
    """The backend's hard limit for ``max_value_bytes`` (``None``: no limit)."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning, token_secret=token_secret)
        self.max_value_bytes: int = option_value_bytes(
            max_value_bytes, hard=self.value_bytes_limit, backend=self.backend_name
        )

    # ------------------------------------------------------------ reads

    async def get(
        self, namespace: Sequence[str], key: str, *, refresh_ttl: bool = False
    ) -> Item | None:
        """The item at ``(namespace, key)``, or ``None`` when absent or expired.

        With ``refresh_ttl=True`` an item written with a TTL has its
        ``expires_at`` moved to now + its ``ttl`` (its version and
        ``updated_at`` do not change); an item without a TTL is returned as is.

        Raises
        ------
        InvalidInputError
            A bad namespace or key, or ``refresh_ttl`` is not a bool.
        """
        ns = check_namespace(namespace)
        key = check_name("key", key)
        if type(refresh_ttl) is not bool:
            raise InvalidInputError("refresh_ttl must be a bool")
        await self._ensure_ready()
        if refresh_ttl:
            record = await self._refresh_ttl(ns, key)
            return None if record is None else await self._decode(record)
        for record in await self._get_many(ns, [key]):
            if record.key == key:
                return await self._decode(record)
        return None

    async def get_many(self, namespace: Sequence[str], keys: Sequence[str]) -> dict[str, Item]:
        """The live items of ``keys`` in one namespace, in one round trip.

        Returns a dict from key to item, in the order of ``keys``; absent and
        expired keys are left out. Repeated keys are read once.

        Raises
        ------
        InvalidInputError
            A bad namespace or key, ``keys`` not a list or tuple, or more than
            1,000 keys.
        """
        ns = check_namespace(namespace)
        if not isinstance(keys, list | tuple):
            raise InvalidInputError(
                f"keys must be a list or tuple of strings, not {type(keys).__qualname__}"
            )
        if len(keys) > MAX_GET_MANY_KEYS:
            raise InvalidInputError(
                f"get_many takes at most {MAX_GET_MANY_KEYS:,} keys (got {len(keys):,})"
            )
        wanted = list(dict.fromkeys(check_name(f"keys[{i}]", k) for i, k in enumerate(keys)))
        await self._ensure_ready()
        if not wanted:
            return {}
        found: dict[str, KVRecord] = {}
        for record in await self._get_many(ns, wanted):
            found[record.key] = record
        out: dict[str, Item] = {}
        for key in wanted:
            if key in found and (item := await self._decode(found[key])) is not None:
                out[key] = item
        return out

    # ------------------------------------------------------------ writes

    async def put(
        self,
        namespace: Sequence[str],
        key: str,
        value: Any,
        *,
        ttl: timedelta | None = None,
    ) -> Item:
        """Create or replace the item at ``(namespace, key)``; return it as stored.

        ``ttl`` (kept to whole milliseconds) makes it expire ``ttl`` after this
        write; without one any previous expiry is removed.

        Raises
        ------
        InvalidInputError
            A bad namespace, key or ``ttl``, or the value's canonical JSON is
            over ``max_value_bytes`` (the message names both sizes).
        SerializationError
            ``value`` is not strict JSON.
        """
        ns, key, stored, text, ttl = self._check_write(namespace, key, value, ttl)
        await self._ensure_ready()
        return self._item(await self._put(ns, key, text, ttl), stored)

    async def put_if_version(
        self,
        namespace: Sequence[str],
        key: str,
        value: Any,
        expected_version: int | None,
        *,
        ttl: timedelta | None = None,
    ) -> Item | KVConflict:
        """Write only if the stored version is ``expected_version``.

        ``expected_version=None`` writes only when the key is absent (or
        expired). Returns the stored item, or a :class:`KVConflict` carrying
        the current item when the condition failed (nothing written). Of
        racing calls on one version exactly one wins.

        Raises
        ------
        InvalidInputError
            A bad namespace, key, ``ttl`` or ``expected_version`` (``None`` or
            an integer >= 1), or a value over ``max_value_bytes``.
        SerializationError
            ``value`` is not strict JSON.
        """
        expected = _check_version(expected_version)
        ns, key, stored, text, ttl = self._check_write(namespace, key, value, ttl)
        await self._ensure_ready()
        outcome = await self._put_if_version(ns, key, text, ttl, expected)
        if isinstance(outcome, VersionMismatch):
            current = outcome.current
            return KVConflict(current=None if current is None else await self._decode(current))
        return self._item(outcome, stored)

    async def delete(
        self, namespace: Sequence[str], key: str, *, expected_version: int | None = None
    ) -> bool:
        """Delete the item; ``True`` when a live item was deleted.

        Idempotent: ``False`` when nothing live was there, or when
        ``expected_version`` is given and the stored version differs.

        Raises
        ------
        InvalidInputError
            A bad namespace, key or ``expected_version``.
        """
        ns = check_namespace(namespace)
        key = check_name("key", key)
        expected = _check_version(expected_version)
        await self._ensure_ready()
        return await self._delete(ns, key, expected)

    async def purge_expired(self) -> int:
        """Delete every expired item now; return how many were deleted.

        Expired items are already absent to every read; this only frees their
        space (MongoDB's TTL index also does it in the background).
        """
        await self._ensure_ready()
        return await self._purge_expired()

    async def _erase_scope(self, scope: str) -> int:
        """Delete every item whose namespace begins with ``(scope,)``, expired or not.

        The primitive of :meth:`Stores.erase_scope <pai_storage.Stores.erase_scope>`
        (``scope`` is a valid name, the store initialized); returns how many
        items were deleted. This default deletes the live items page by page,
        then purges every expired item of the store (expired items are not
        listed), counting only the live ones; a backend deletes the scope's
        items, expired ones included, with one scoped delete instead.
        """
        erased, token = 0, None
        while True:
            page = await self.search((scope,), limit=MAX_PAGE_LIMIT, page_token=token)
            for item in page.items:
                erased += await self.delete(item.namespace, item.key)
            token = page.next_page_token
            if token is None:
                break
        await self._purge_expired()
        return erased

    # ------------------------------------------------------------ listing

    async def search(
        self,
        namespace_prefix: Sequence[str],
        *,
        key_prefix: str = "",
        limit: int = DEFAULT_PAGE_LIMIT,
        page_token: str | None = None,
    ) -> Page[Item]:
        """One page of the live items under ``namespace_prefix``, keys starting with ``key_prefix``.

        The prefix matches whole segments (``("a",)`` covers ``("a",)`` and
        ``("a", "b")``, never ``("ab",)``; ``()`` covers everything). Items come
        in (namespace path, key) code-point order. Pages are keyset pages:
        items written or deleted between pages never shift the others. A page
        may hold fewer than ``limit`` items when stored values no longer decode.

        Raises
        ------
        InvalidInputError
            A bad prefix or ``limit`` (1 to 1,000).
        PageTokenError
            ``page_token`` is malformed or came from another query.
        """
        prefix = check_namespace(namespace_prefix, kind="namespace_prefix", allow_empty=True)
        key_prefix = _check_prefix("key_prefix", key_prefix)
        limit = check_limit(limit)
        query = {"search": prefix, "keyPrefix": key_prefix}
        after = None
        if page_token is not None:
            position = self.decode_token(page_token, _SEARCH, _TOKEN_SCOPE, query)
            after = (_token_namespace(position), token_strings(position, "key")[0])
        await self._ensure_ready()
        records = await self._search(prefix, key_prefix, after, limit + 1)
        page, more = records[:limit], len(records) > limit
        items: list[Item] = []
        trusted = Item.trusted
        for record in page:
            try:
                value = parse_json_text(record.text)
            except _UNDECODABLE:
                await self._undecodable(record)
                continue
            # As _item, inline: this loop runs once per item of every page.
            items.append(
                trusted(
                    {
                        "namespace": record.namespace,
                        "key": record.key,
                        "value": value,
                        "version": record.version,
                        "created_at": record.created_at,
                        "updated_at": record.updated_at,
                        "expires_at": record.expires_at,
                        "ttl": record.ttl,
                    }
                )
            )
        token = None
        if more:
            last = page[-1]
            position = {"ns": last.namespace, "key": last.key}
            token = self.encode_token(_SEARCH, _TOKEN_SCOPE, query, position)
        # Every item was built by this store: the page needs no validation either.
        return _ItemPage.trusted({"items": FrozenList(items), "next_page_token": token})

    async def list_keys(
        self,
        namespace: Sequence[str],
        *,
        prefix: str = "",
        limit: int = MAX_PAGE_LIMIT,
        page_token: str | None = None,
    ) -> Page[str]:
        """One page of the live keys of exactly ``namespace`` that start with ``prefix``.

        Sub-namespaces are not included. Keys come whole (the prefix
        included), in code-point order.

        Raises
        ------
        InvalidInputError
            A bad namespace, prefix or ``limit`` (1 to 1,000).
        PageTokenError
            ``page_token`` is malformed or came from another query.
        """
        ns = check_namespace(namespace)
        prefix = _check_prefix("prefix", prefix)
        limit = check_limit(limit)
        query = {"keys": ns, "prefix": prefix}
        after = None
        if page_token is not None:
            position = self.decode_token(page_token, _KEYS, _TOKEN_SCOPE, query)
            after = token_strings(position, "key")[0]
        await self._ensure_ready()
        keys = await self._list_keys(ns, prefix, after, limit + 1)
        token = None
        if len(keys) > limit:
            keys = keys[:limit]
            token = self.encode_token(_KEYS, _TOKEN_SCOPE, query, {"key": keys[-1]})
        return Page[str](items=keys, next_page_token=token)

    async def list_namespaces(
        self,
        prefix: Sequence[str] = (),
        *,
        max_depth: int | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        page_token: str | None = None,
    ) -> Page[tuple[str, ...]]:
        """One page of the distinct namespaces holding live items under ``prefix``.

        Each namespace is truncated to its first ``max_depth`` segments before
        duplicates are removed; they come in namespace-path order.

        Raises
        ------
        InvalidInputError
            A bad prefix, ``max_depth`` (``None`` or 1 to 16) or ``limit``.
        PageTokenError
            ``page_token`` is malformed or came from another query.
        """
        prefix_ns = check_namespace(prefix, kind="prefix", allow_empty=True)
        if max_depth is not None and (
            type(max_depth) is not int or not 1 <= max_depth <= MAX_NAMESPACE_DEPTH
        ):
            raise InvalidInputError(
                f"max_depth must be None or an integer from 1 to {MAX_NAMESPACE_DEPTH}"
            )
        limit = check_limit(limit)
        query = {"namespaces": prefix_ns, "maxDepth": max_depth}
        after = None
        if page_token is not None:
            position = self.decode_token(page_token, _NAMESPACES, _TOKEN_SCOPE, query)
            after = _token_namespace(position)
        await self._ensure_ready()
        found = await self._list_namespaces(prefix_ns, max_depth, after, limit + 1)
        token = None
        if len(found) > limit:
            found = found[:limit]
            position = {"ns": tuple(found[-1])}
            token = self.encode_token(_NAMESPACES, _TOKEN_SCOPE, query, position)
        return Page[tuple[str, ...]](items=found, next_page_token=token)

    # ------------------------------------------------------------ helpers

    def _check_write(
        self, namespace: object, key: object, value: Any, ttl: object
    ) -> tuple[tuple[str, ...], str, Any, str, timedelta | None]:
        ns = check_namespace(namespace)
        checked_key = check_name("key", key)
        duration = check_duration("ttl", ttl)
        if duration is not None:
            # Kept to whole milliseconds, the precision of every stored time.
            duration = (duration // _MS) * _MS
        stored, text = check_value(value, limit=self.max_value_bytes)
        return ns, checked_key, stored, text, duration

    def _item(self, record: KVRecord, value: Any) -> Item:
        # Every field is already checked: the value by parse_json_text (or the
        # write's own check), the rest by this store or its backend.
        return Item.trusted(
            {
                "namespace": record.namespace,
                "key": record.key,
                "value": value,
                "version": record.version,
                "created_at": record.created_at,
                "updated_at": record.updated_at,
                "expires_at": record.expires_at,
                "ttl": record.ttl,
            }
        )

    async def _decode(self, record: KVRecord) -> Item | None:
        """The item of a stored record; ``None`` (and a warning) when its text is not JSON."""
        try:
            value = parse_json_text(record.text)
        except _UNDECODABLE:
            await self._undecodable(record)
            return None
        return self._item(record, value)

    async def _undecodable(self, record: KVRecord) -> None:
        # Never the value itself in the warning: it may hold personal data.
        await self.warn(
            StoreWarning(
                kind="invalid_record",
                reason="a stored key-value item no longer decodes as strict JSON; "
                "it is treated as absent",
                namespace=record.namespace,
                key=record.key,
            )
        )

    # ------------------------------------------------------------ backend hooks

    @abstractmethod
    async def _get_many(self, namespace: tuple[str, ...], keys: list[str]) -> list[KVRecord]:
        """The live records of ``keys`` (distinct, 1 to 1,000) in ``namespace``, any order.

        One round trip. Expired records are left out whether or not they were
        purged.
        """

    @abstractmethod
    async def _refresh_ttl(self, namespace: tuple[str, ...], key: str) -> KVRecord | None:
        """The live record, its ``expires_at`` first moved to now + its ``ttl``.

        A record without a ``ttl`` is returned unchanged; ``None`` when absent
        or expired. Version and ``updated_at`` do not change. Atomic.
        """

    @abstractmethod
    async def _put(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None
    ) -> KVRecord:
        """Upsert the item with value ``text``; return the stored record.

        Over a live record: version + 1, ``created_at`` kept. Otherwise (absent
        or expired): version 1, ``created_at`` now. ``updated_at`` is now;
        ``expires_at`` is now + ``ttl``, or none without a ``ttl``. Atomic.
        """

    @abstractmethod
    async def _put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        expected_version: int | None,
    ) -> KVRecord | VersionMismatch:
        """As :meth:`_put`, but only when the live version is ``expected_version``.

        ``None`` expects no live record (absent or expired). When the condition
        fails, write nothing and return :class:`VersionMismatch` with the live
        record. The check and the write are one atomic step: of racing calls on
        one version exactly one succeeds.
        """

    @abstractmethod
    async def _delete(
        self, namespace: tuple[str, ...], key: str, expected_version: int | None
    ) -> bool:
        """Delete the live record (only at ``expected_version`` if given); ``True`` if deleted.

        An expired record is absent: deleting it (the purge's job) returns
        ``False``.
        """

    @abstractmethod
    async def _search(
        self,
        prefix: tuple[str, ...],
        key_prefix: str,
        after: tuple[tuple[str, ...], str] | None,
        limit: int,
    ) -> list[KVRecord]:
        """Up to ``limit`` live records under ``prefix`` with keys starting with ``key_prefix``.

        Ordered by (:func:`namespace_path`, key) in code-point order, starting
        strictly after the position ``after`` (a namespace and key) when given.
        The prefix is a range on the path (:func:`prefix_upper_bound`), never a
        pattern.
        """

    @abstractmethod
    async def _list_keys(
        self, namespace: tuple[str, ...], prefix: str, after: str | None, limit: int
    ) -> list[str]:
        """Up to ``limit`` live keys of exactly ``namespace`` starting with ``prefix``.

        In code-point order, strictly after ``after`` when given.
        """

    @abstractmethod
    async def _list_namespaces(
        self,
        prefix: tuple[str, ...],
        max_depth: int | None,
        after: tuple[str, ...] | None,
        limit: int,
    ) -> list[tuple[str, ...]]:
        """Up to ``limit`` distinct namespaces of live records under ``prefix``.

        Each namespace is first truncated to ``max_depth`` segments; the
        results are in :func:`namespace_path` order, strictly after ``after``.
        """

    @abstractmethod
    async def _purge_expired(self) -> int:
        """Delete every record whose ``expires_at`` is at or before now; return the count."""


# ---------------------------------------------------------------- validators


def _check_version(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= INT64_MAX:
        raise InvalidInputError("expected_version must be None or an integer >= 1")
    return value


def _check_prefix(kind: str, value: object) -> str:
    """A key prefix: ``""`` or a valid name."""
    if value == "" and type(value) is str:
        return ""
    return check_name(kind, value)


def _token_namespace(position: dict[str, Any]) -> tuple[str, ...]:
    segments = position.get("ns")
    if not isinstance(segments, list):
        raise PageTokenError("page token is malformed")
    try:
        return check_namespace(segments, allow_empty=True)
    except InvalidInputError:
        raise PageTokenError("page token is malformed") from None
