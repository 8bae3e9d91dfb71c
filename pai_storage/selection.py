"""Read and list planning, shared by every backend.

Normalized backends call :meth:`SelectionHelpers.plan_read` (or
:meth:`~SelectionHelpers.plan_list`) before loading anything. A plan validates
the request, decodes and checks its page token, and tells the backend exactly
which bounded query to run: for a child page, a :class:`Window` of positions
(exclusive bounds, order, how many rows to fetch); for a list, the filters and
the keyset cursor. The backend loads at most ``fetch`` rows and hands them to
the plan's ``finish`` method, which cuts the page and mints the next token.

Aggregate-style backends call the ``select_*`` helpers instead, which run the
same plans over families already in memory.

Child-page tokens record the thread incarnation and an *upper anchor* (the
family's high-water position when the first page was read), so later pages
never show records committed after the first page, and a token whose thread was
deleted and re-created is rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

from .aggregate import FamilyName, FamilyView, ThreadAggregate
from .errors import ThreadStoreInvariantError, ThreadStorePageTokenError
from .families import family as family_spec
from .fields import Order
from .frozen import FrozenList
from .models import (
    MAX_ID_LENGTH,
    Message,
    MessageIdsSelection,
    MessagePageSelection,
    MessageSelection,
    Page,
    QueuedItem,
    QueuedItemIdsSelection,
    QueuedItemPageSelection,
    QueuedItemSelection,
    ReadThreadInput,
    RunIdsSelection,
    RunPageSelection,
    RunRecord,
    RunSelection,
    ThreadPage,
    ThreadRecord,
    ThreadVersion,
)
from .strict_json import INT64_MAX, is_valid_text
from .tokens import PageTokenCodec, ScopeDigest, default_scope_digest, json_text, query_digest

__all__ = [
    "ChildPagePlan",
    "IdsPlan",
    "ListPlan",
    "ReadPlan",
    "SelectionHelpers",
    "Window",
    "timestamp_ms",
]

T = TypeVar("T")
R = TypeVar("R", Message, RunRecord, QueuedItem)


def timestamp_ms(moment: datetime) -> int:
    """Milliseconds since the Unix epoch (the list cursor's time key)."""
    return round(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Window:
    """The positions a child page may return: ``lower < position < upper``."""

    lower: int
    upper: int
    order: Order
    fetch: int
    anchor: int
    bound_lower: int
    bound_upper: int | None

    def contains(self, position: int) -> bool:
        return self.lower < position < self.upper


@dataclass(frozen=True, slots=True)
class IdsPlan:
    """An ``ids`` selection: load these ids, keep their order, omit missing ones."""

    ids: tuple[str, ...]

    def finish(self, found: Mapping[str, T], version: ThreadVersion) -> ThreadPage[T]:
        items = [found[i] for i in self.ids if i in found]
        return _child_page(items, None, version)


# Pages are built from records the backend validated (or the store built) and
# from a token minted here: nothing in them needs a second validation. The
# generic classes are parametrized once (each ``ThreadPage[Any]`` is a lookup).
_CHILD_PAGE = ThreadPage[Any]
_ROOT_PAGE = Page[ThreadRecord]


def _child_page(items: list[T], token: str | None, version: ThreadVersion) -> ThreadPage[T]:
    page: ThreadPage[T] = _CHILD_PAGE.trusted(
        {"items": FrozenList(items), "next_page_token": token, "version": version}
    )
    return page


# A decoded token is only a claim about a position: without a deployment
# secret anyone can mint one (see PageTokenCodec). Every field is checked here,
# once, so no backend ever sees a value it cannot bind to a query.
_MAX_POSITION = INT64_MAX - 1  # a window's exclusive upper bound is anchor + 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_MIN_UPDATED_MS = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // _MS
_MAX_UPDATED_MS = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // _MS


def _malformed(what: str) -> ThreadStorePageTokenError:
    return ThreadStorePageTokenError(f"page token is malformed ({what})")


def _token_position(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_POSITION:
        raise _malformed("a position is not an integer from 0 to 2**63 - 2")
    return value


def _token_id(value: Any) -> str:
    if type(value) is not str or not 1 <= len(value) <= MAX_ID_LENGTH or not is_valid_text(value):
        raise _malformed("an id is not 1 to 1,024 characters of valid Unicode")
    return value


def _child_position(instance_id: str, anchor: int, lower: int, upper: int | None, last: int) -> str:
    """A child page's token position (what :meth:`_ChildCursor.parse` reads) as
    canonical JSON: ``{"a", "c", "hi", "i", "lo"}``, for
    :meth:`PageTokenCodec.encode_json`."""
    hi = "null" if upper is None else f"{upper:d}"
    return f'{{"a":{anchor:d},"c":{last:d},"hi":{hi},"i":{json_text(instance_id)},"lo":{lower:d}}}'


def _token_keys(position: Mapping[str, Any], *keys: str) -> None:
    if set(position) != set(keys):
        raise _malformed("unexpected fields")


@dataclass(frozen=True, slots=True)
class _ChildCursor:
    """A decoded child-page token: incarnation, anchor, bounds, last position."""

    instance_id: str
    anchor: int
    lower: int
    upper: int | None
    position: int

    @classmethod
    def parse(cls, token: Mapping[str, Any]) -> _ChildCursor:
        _token_keys(token, "i", "a", "lo", "hi", "c")
        hi = token["hi"]
        return cls(
            instance_id=_token_id(token["i"]),
            anchor=_token_position(token["a"]),
            lower=_token_position(token["lo"]),
            upper=None if hi is None else _token_position(hi),
            position=_token_position(token["c"]),
        )


def _mismatched(name: FamilyName, record: Any) -> ThreadStoreInvariantError:
    spec = family_spec(name)
    return ThreadStoreInvariantError(
        f"stored {spec.noun} {spec.record_id(record)!r} was read for a page whose filter "
        "it does not pass (its stored view, status or run column disagrees with the record)"
    )


def _list_cursor(position: Mapping[str, Any]) -> tuple[int, str]:
    _token_keys(position, "u", "t")
    updated = position["u"]
    if type(updated) is not int or not _MIN_UPDATED_MS <= updated <= _MAX_UPDATED_MS:
        raise _malformed("the update time is not a millisecond timestamp of years 1 to 9999")
    return updated, _token_id(position["t"])


class ChildPagePlan:
    """A ``page`` selection of one child family: a value, never changed once
    made (:meth:`SelectionHelpers.plan_read` hands the same plan to the same
    read made again; setting an attribute raises ``AttributeError``).

    Attributes
    ----------
    family, order, limit:
        What is read, in which order, and how many items the page holds.
    view, statuses, run_id, after_id, before_id:
        The selection's filters (``None`` when not applicable).
    """

    __slots__ = (
        "_accepts",
        "_codec",
        "_cursor",
        "_query",
        "_scope_key",
        "after_id",
        "before_id",
        "family",
        "limit",
        "order",
        "run_id",
        "statuses",
        "view",
    )

    family: FamilyName
    order: Order
    limit: int
    view: str | None
    statuses: frozenset[str] | None
    run_id: str | None
    after_id: str | None
    before_id: str | None
    _codec: PageTokenCodec
    _scope_key: str
    _query: str
    _accepts: Callable[[Any], bool] | None
    _cursor: _ChildCursor | None

    def __init__(
        self,
        codec: PageTokenCodec,
        scope_key: str,
        family: FamilyName,
        query: dict[str, Any],
        order: Order,
        limit: int,
        page_token: str | None,
    ) -> None:
        view: str | None = query.get("view")
        statuses = frozenset(query["statuses"]) if query.get("statuses") is not None else None
        run_id: str | None = query.get("runId")
        digest = query_digest(query)
        cursor = (
            _ChildCursor.parse(codec.decode(page_token, family, scope_key, digest))
            if page_token is not None
            else None
        )
        for name, value in (
            ("family", family),
            ("order", order),
            ("limit", limit),
            ("view", view),
            ("statuses", statuses),
            ("run_id", run_id),
            ("after_id", query.get("after")),
            ("before_id", query.get("before")),
            ("_codec", codec),
            ("_scope_key", scope_key),
            ("_query", digest),
            ("_accepts", _filter(family, view, statuses, run_id)),
            ("_cursor", cursor),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a page plan is a value shared by reads: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a page plan is a value shared by reads: {name} cannot be deleted")

    @property
    def is_continuation(self) -> bool:
        return self._cursor is not None

    def bound_ids(self) -> tuple[str | None, str | None]:
        """Message ids whose positions the backend must resolve before :meth:`window`.

        Empty on a continuation (the token carries the resolved bounds).
        """
        if self._cursor is not None:
            return (None, None)
        return (self.after_id, self.before_id)

    def window(
        self,
        version: ThreadVersion,
        high_water: int,
        after_position: int | None = None,
        before_position: int | None = None,
    ) -> Window:
        """The position window for this page of the thread at ``version``.

        ``high_water`` is the family's highest assigned position in the read
        snapshot; ``after_position`` / ``before_position`` are the resolved
        positions of :meth:`bound_ids` (raise for a missing anchor first, see
        :meth:`missing_anchor`).
        """
        cursor = self._cursor
        if cursor is not None and cursor.instance_id != version.thread_instance_id:
            raise ThreadStorePageTokenError(
                "page token belongs to an earlier incarnation of this thread "
                "(it was deleted and re-created)"
            )
        return self._window(high_water, after_position, before_position)

    def prospective_window(self) -> Window:
        """The window of a page without anchors, before the thread's root is read.

        For a backend that reads the root and the page in one request (see
        :meth:`~pai_storage.backend.ReadSnapshot.head_and_page`). A
        continuation's window is the one :meth:`window` gives; a first page's
        upper bound is only a cap (the largest position), so the backend also
        keeps the rows below the family's position counter in the same
        snapshot. The thread's incarnation is checked afterwards, by
        :meth:`window`.
        """
        return self._window(_MAX_POSITION, None, None)

    def _window(
        self, high_water: int, after_position: int | None, before_position: int | None
    ) -> Window:
        cursor = self._cursor
        position: int | None
        if cursor is not None:
            anchor, lower, bound_upper = cursor.anchor, cursor.lower, cursor.upper
            position = cursor.position
        else:
            anchor, lower, position = high_water, after_position or 0, None
            bound_upper = before_position
        bound_lower = lower
        upper = anchor + 1 if bound_upper is None else min(bound_upper, anchor + 1)
        if position is not None:
            if self.order == "oldest":
                lower = max(lower, position)
            else:
                upper = min(upper, position)
        return Window(lower, upper, self.order, self.limit + 1, anchor, bound_lower, bound_upper)

    def missing_anchor(self, message_id: str) -> ThreadStoreInvariantError:
        """The error for an ``afterMessageId``/``beforeMessageId`` that does not exist."""
        return ThreadStoreInvariantError(
            f"message page bound {message_id!r} does not name an existing message"
        )

    def matches(self, record: Message | RunRecord | QueuedItem) -> bool:
        """Whether ``record`` (of this selection's family) passes its filter (view,
        statuses, run)."""
        accepts = self._accepts
        return accepts is None or bool(accepts(record))

    def finish(
        self, window: Window, rows: Sequence[tuple[int, T]], version: ThreadVersion
    ) -> ThreadPage[T]:
        """Cut the page from up to ``window.fetch`` matching rows, in window order.

        Raises :class:`ThreadStoreInvariantError` for a row that does not pass
        the selection's filter: a normalized backend filters on columns it
        derives from each record, and a row whose columns disagree with its
        record is invalid stored data, refused rather than served.
        """
        accepts = self._accepts
        if accepts is not None and not all(map(accepts, map(_record_of, rows))):
            record = next(r for _, r in rows if not accepts(r))
            raise _mismatched(self.family, record)
        items = rows[: self.limit]
        token = None
        if len(rows) > self.limit:
            token = self._codec.encode_json(
                self.family,
                self._scope_key,
                self._query,
                _child_position(
                    version.thread_instance_id,
                    window.anchor,
                    window.bound_lower,
                    window.bound_upper,
                    items[-1][0],
                ),
            )
        return _child_page([record for _, record in items], token, version)

    def select(self, family: FamilyView[R], version: ThreadVersion) -> ThreadPage[R]:
        """Run this plan over a family held in memory (aggregate backends)."""
        after, before = self.bound_ids()
        positions: list[int | None] = []
        for anchor_id in (after, before):
            if anchor_id is None:
                positions.append(None)
                continue
            entry = family.get(anchor_id)
            if entry is None:
                raise self.missing_anchor(anchor_id)
            positions.append(entry.position)
        window = self.window(version, family.high_water(), positions[0], positions[1])
        return self.finish(window, self.scan(family, window), version)

    def scan(self, family: FamilyView[R], window: Window) -> list[tuple[int, R]]:
        """Up to ``window.fetch`` matching rows of a family held in memory, in window order."""
        rows: list[tuple[int, R]] = []
        if window.lower + 1 >= window.upper:
            return rows
        for entry in family.between(window.lower, window.upper, newest=window.order == "newest"):
            if self.matches(entry.record):
                rows.append((entry.position, entry.record))
                if len(rows) == window.fetch:
                    break
        return rows


_record_of = itemgetter(1)


def _filter(
    family: FamilyName, view: str | None, statuses: frozenset[str] | None, run_id: str | None
) -> Callable[[Any], bool] | None:
    """:meth:`ChildPagePlan.matches` for one selection, as one callable (``None``:
    every record passes): a page checks each of its records with it."""
    if family == "messages":
        return _VIEWS.get(view) if view is not None else None
    if family == "runs":
        return None if statuses is None else lambda record: record.status in statuses
    return None if run_id is None else lambda record: record.run_id == run_id


_VIEWS = {view: attrgetter(f"visibility.{view}") for view in ("transcript", "context")}


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What a read asks of each child family (``None``: not requested)."""

    scope_key: str
    thread_id: str
    messages: IdsPlan | ChildPagePlan | None
    runs: IdsPlan | ChildPagePlan | None
    queued_items: IdsPlan | ChildPagePlan | None

    def single_page(self) -> tuple[FamilyName, ChildPagePlan] | None:
        """The read's one selection when it is a page that needs no anchor lookup.

        ``None`` when the read selects nothing, an ``ids`` selection, more than
        one family, or a first page bounded by ``afterMessageId`` /
        ``beforeMessageId``. Such a read is the root and one bounded range
        scan, which a backend may answer in one request (see
        :meth:`~pai_storage.backend.ReadSnapshot.head_and_page`).
        """
        found: tuple[FamilyName, ChildPagePlan] | None = None
        for selection in (self.messages, self.runs, self.queued_items):
            if selection is None:
                continue
            if found is not None or not isinstance(selection, ChildPagePlan):
                return None
            if selection.bound_ids() != (None, None):
                return None
            found = (selection.family, selection)
        return found

    def select(self, aggregate: ThreadAggregate) -> dict[str, ThreadPage[Any]]:
        """Run the plan over an aggregate; returns the pages keyed by attribute name."""
        version = aggregate.root.version
        pages: dict[str, ThreadPage[Any]] = {}
        for name, plan, fam in (
            ("messages", self.messages, aggregate.messages),
            ("runs", self.runs, aggregate.runs),
            ("queued_items", self.queued_items, aggregate.queued_items),
        ):
            if plan is None:
                continue
            if isinstance(plan, IdsPlan):
                found = {i: e.record for i in plan.ids if (e := fam.get(i)) is not None}
                pages[name] = plan.finish(found, version)
            else:
                pages[name] = plan.select(fam, version)
        return pages


class ListPlan:
    """A validated ``list_threads`` request with its decoded keyset cursor.

    Rows are ordered by ``updated_at`` newest first, then ``thread_id``
    ascending (code-point order). A backend loads at most :attr:`fetch` rows of
    this scope that pass :meth:`matches` and come after :attr:`cursor`.
    """

    def __init__(
        self,
        codec: PageTokenCodec,
        scope_key: str,
        limit: int,
        agent: str | None,
        parent_thread_id: str | None,
        category: str | None,
        include_hidden: bool,
        page_token: str | None,
    ) -> None:
        self.scope_key = scope_key
        self.limit = limit
        self.fetch = limit + 1
        self.agent = agent
        self.parent_thread_id = parent_thread_id
        self.category = category
        self.include_hidden = include_hidden
        self._codec = codec
        self._query = query_digest(
            {
                "agent": agent,
                "parent": parent_thread_id,
                "category": category,
                "hidden": include_hidden,
            }
        )
        self.cursor: tuple[int, str] | None = None
        if page_token is not None:
            self.cursor = _list_cursor(codec.decode(page_token, "threads", scope_key, self._query))

    def matches(self, record: ThreadRecord) -> bool:
        """Whether a root passes the filters (scope is the backend's to bind)."""
        return (
            (self.include_hidden or record.list_visibility == "visible")
            and (self.agent is None or record.agent == self.agent)
            and (self.parent_thread_id is None or record.parent_thread_id == self.parent_thread_id)
            and (self.category is None or record.category == self.category)
        )

    @staticmethod
    def sort_key(record: ThreadRecord) -> tuple[int, str]:
        return (-timestamp_ms(record.updated_at), record.thread_id)

    def after_cursor(self, record: ThreadRecord) -> bool:
        if self.cursor is None:
            return True
        updated, thread_id = self.cursor
        return self.sort_key(record) > (-updated, thread_id)

    def finish(self, rows: Sequence[ThreadRecord]) -> Page[ThreadRecord]:
        """Cut the page from up to :attr:`fetch` rows in list order."""
        items = list(rows[: self.limit])
        token = None
        if len(rows) > self.limit:
            last = items[-1]
            token = self._codec.encode(
                "threads",
                self.scope_key,
                self._query,
                {"u": timestamp_ms(last.updated_at), "t": last.thread_id},
            )
        return _ROOT_PAGE.trusted({"items": FrozenList(items), "next_page_token": token})

    def select(self, roots: Iterable[ThreadRecord]) -> Page[ThreadRecord]:
        """Run the plan over roots held in memory (already limited to this scope).

        Sorts the matching roots: O(n log n) in the scope's size. A backend
        that keeps its roots in list order uses :meth:`select_sorted`.
        """
        rows = sorted(
            (r for r in roots if self.matches(r) and self.after_cursor(r)), key=self.sort_key
        )
        return self.finish(rows[: self.fetch])

    def select_sorted(
        self, roots_after: Callable[[tuple[int, str] | None], Iterable[ThreadRecord]]
    ) -> Page[ThreadRecord]:
        """Run the plan over roots a backend keeps sorted by :meth:`sort_key`.

        ``roots_after(key)`` yields the scope's roots whose sort key is greater
        than ``key`` (all of them for ``None``), in list order; they are
        consumed only until the page is full, so a page costs its rows plus the
        rows the filters skip.
        """
        start = None if self.cursor is None else (-self.cursor[0], self.cursor[1])
        rows: list[ThreadRecord] = []
        for root in roots_after(start):
            if self.matches(root):
                rows.append(root)
                if len(rows) == self.fetch:
                    break
        return self.finish(rows)


class SelectionHelpers:
    """Selection planning and page finishing bound to one provider's token codec.

    .. warning::
       Pass ``secret`` (the store option ``token_secret``): set it in
       production. Without it the token key is derived from the public prefix
       and anyone can forge a token. Decoded tokens are validated field by
       field (types, int64 ranges, ids) when a plan is made, so a forged token
       raises :class:`ThreadStorePageTokenError` rather than reaching a
       backend, but only a secret proves the store issued it.

    Parameters
    ----------
    token_prefix:
        Prefix of this provider's tokens, e.g. ``"pai-pg"``.
    secret:
        Key for token integrity: non-empty ``bytes`` (see
        :class:`PageTokenCodec`); anything else raises
        :class:`ThreadStoreConfigurationError`.
    scope_digest:
        The scope binding recorded in every token.
    """

    def __init__(
        self,
        token_prefix: str = "pai",
        *,
        secret: bytes | None = None,
        scope_digest: ScopeDigest = default_scope_digest,
    ) -> None:
        self.codec = PageTokenCodec(token_prefix, secret=secret, scope_digest=scope_digest)

    def plan_read(self, request: ReadThreadInput) -> ReadPlan:
        """Validate a read's selections and decode their tokens."""
        include = request.include
        scope, thread = request.scope_key, request.thread_id
        return ReadPlan(
            scope_key=scope,
            thread_id=thread,
            messages=self._plan_messages(scope, thread, include.messages if include else None),
            runs=self._plan_runs(scope, thread, include.runs if include else None),
            queued_items=self._plan_queued(
                scope, thread, include.queued_items if include else None
            ),
        )

    def plan_list(self, request: Any) -> ListPlan:
        """Validate a ``ListThreadsInput`` and decode its token."""
        return ListPlan(
            self.codec,
            request.scope_key,
            request.limit,
            request.agent,
            request.parent_thread_id,
            request.category,
            bool(request.include_hidden),
            request.page_token,
        )

    def _page(
        self,
        scope: str,
        family: FamilyName,
        query: dict[str, Any],
        selection: MessagePageSelection | RunPageSelection | QueuedItemPageSelection,
    ) -> ChildPagePlan:
        order: Order = selection.order or "oldest"
        query["order"] = order
        return ChildPagePlan(
            self.codec,
            scope,
            family,
            query,
            order,
            selection.page.limit,
            selection.page.page_token,
        )

    def _plan_messages(
        self, scope: str, thread: str, sel: MessageSelection | None
    ) -> IdsPlan | ChildPagePlan | None:
        if sel is None:
            return None
        if isinstance(sel, MessageIdsSelection):
            return IdsPlan(tuple(sel.message_ids))
        query = {
            "t": thread,
            "view": sel.view,
            "after": sel.after_message_id,
            "before": sel.before_message_id,
        }
        return self._page(scope, "messages", query, sel)

    def _plan_runs(
        self, scope: str, thread: str, sel: RunSelection | None
    ) -> IdsPlan | ChildPagePlan | None:
        if sel is None:
            return None
        if isinstance(sel, RunIdsSelection):
            return IdsPlan(tuple(sel.run_ids))
        statuses = sorted(set(sel.statuses)) if sel.statuses is not None else None
        return self._page(scope, "runs", {"t": thread, "statuses": statuses}, sel)

    def _plan_queued(
        self, scope: str, thread: str, sel: QueuedItemSelection | None
    ) -> IdsPlan | ChildPagePlan | None:
        if sel is None:
            return None
        if isinstance(sel, QueuedItemIdsSelection):
            return IdsPlan(tuple(sel.queue_item_ids))
        return self._page(scope, "queuedItems", {"t": thread, "runId": sel.run_id}, sel)
