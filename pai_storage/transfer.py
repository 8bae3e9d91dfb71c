"""Export, import and copy of whole threads: the versioned JSON Lines format.

An export is UTF-8 JSON Lines (``docs/lifecycle.md`` documents every line)::

    {"format":"pai-storage.threads","version":1}
    {"kind":"thread","thread":{...},"nextPositions":{...},"counts":{...}}
    {"kind":"message","position":1,"record":{...}}      # counts.messages lines
    {"kind":"run","position":1,"record":{...}}          # counts.runs lines
    {"kind":"queuedItem","position":1,"record":{...}}   # counts.queuedItems lines
    {"kind":"end","digest":"sha256:..."}
    ... one block per thread ...

Records are in their JSON form (the root carries its version, lease and
timestamps); positions and the per-family position counters are kept, so an
import restores a thread exactly. The ``end`` line's digest covers the block,
so a truncated or edited block is refused. :func:`thread_digest` is the same
digest of a stored thread, which ``pai-storage copy`` compares on both sides.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from .aggregate import Entry, Family, ThreadAggregate
from .clock import system_clock
from .conflicts import Conflict
from .errors import ThreadExistsError, ThreadStoreInvariantError
from .fields import truncate_ms
from .models import Message, QueuedItem, RunRecord, ThreadRecord
from .relationships import assert_relationships, relations_from_aggregate
from .runtime import canonical_json

if TYPE_CHECKING:
    from .bundle import Stores
    from .store import ThreadStore

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "RUNTIME_COMPONENTS",
    "CopyReport",
    "ImportReport",
    "RuntimeCopyReport",
    "RuntimeItem",
    "copy_runtime",
    "copy_threads",
    "decode_threads",
    "encode_thread",
    "export_lines",
    "import_lines",
    "require_enumeration",
    "thread_digest",
]

EXPORT_FORMAT = "pai-storage.threads"
EXPORT_VERSION = 1

_FAMILIES: tuple[tuple[str, str, type[Any], str], ...] = (
    # line kind, family name, model, id attribute
    ("message", "messages", Message, "message_id"),
    ("run", "runs", RunRecord, "run_id"),
    ("queuedItem", "queuedItems", QueuedItem, "queue_item_id"),
)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _family(aggregate: ThreadAggregate, name: str) -> Family[Any]:
    if name == "messages":
        return aggregate.messages
    if name == "runs":
        return aggregate.runs
    return aggregate.queued_items


def _block(aggregate: ThreadAggregate) -> Iterator[str]:
    """The lines of one thread's block without the ``end`` line (no newlines)."""
    yield _dumps(
        {
            "kind": "thread",
            "thread": aggregate.root.to_json(),
            "nextPositions": {
                name: _family(aggregate, name).next_position for _, name, _, _ in _FAMILIES
            },
            "counts": {name: len(_family(aggregate, name)) for _, name, _, _ in _FAMILIES},
        }
    )
    for kind, name, _, _ in _FAMILIES:
        for entry in _family(aggregate, name):
            yield _dumps(
                {"kind": kind, "position": entry.position, "record": entry.record.to_json()}
            )


def encode_thread(aggregate: ThreadAggregate) -> Iterator[str]:
    """The lines (each ending in a newline) of one thread's block, ``end`` line included."""
    digest = hashlib.sha256()
    for line in _block(aggregate):
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
        yield line + "\n"
    yield _dumps({"kind": "end", "digest": f"sha256:{digest.hexdigest()}"}) + "\n"


def thread_digest(aggregate: ThreadAggregate) -> str:
    """The digest of a thread's content: root (version, lease, timestamps), records, positions."""
    digest = hashlib.sha256()
    for line in _block(aggregate):
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
    return f"sha256:{digest.hexdigest()}"


def header_line() -> str:
    return _dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION}) + "\n"


async def export_lines(
    store: ThreadStore, scope_key: str | None, thread_ids: Iterable[str] | None = None
) -> AsyncIterator[str]:
    """Stream the export of a scope (every scope with ``None``), one line at a time.

    Threads come in ascending ``updated_at`` order; each is read whole from one
    consistent snapshot. A thread changed during the export appears once, as
    it was when its turn came.
    """
    from .maintenance import SWEEP_BATCH, ThreadIndexEntry, check_thread_key

    scope = None if scope_key is None else check_thread_key("scope_key", scope_key)
    if thread_ids is not None:
        if isinstance(thread_ids, str):
            raise ThreadStoreInvariantError("thread_ids must be a sequence of ids, not a str")
        if scope is None:
            raise ThreadStoreInvariantError("thread_ids needs a scope_key")
        chosen = list(dict.fromkeys(check_thread_key("thread_id", t) for t in thread_ids))
        yield header_line()
        for thread_id in chosen:
            aggregate = await store._load_thread(scope, thread_id)
            if aggregate is not None:
                for line in encode_thread(aggregate):
                    yield line
        return
    yield header_line()
    seen: set[tuple[str, str]] = set()
    after: ThreadIndexEntry | None = None
    while True:
        batch = await store._thread_heads(
            scope, updated_before=None, after=after, limit=SWEEP_BATCH
        )
        for head in batch:
            after = head
            key = (head.scope_key, head.thread_id)
            if key in seen:
                continue
            seen.add(key)
            aggregate = await store._load_thread(head.scope_key, head.thread_id)
            if aggregate is not None:
                for line in encode_thread(aggregate):
                    yield line
        if len(batch) < SWEEP_BATCH:
            return


# ------------------------------------------------------------------ decoding


class _Corrupt(Exception):
    pass


def _object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Corrupt(f"not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise _Corrupt("not a JSON object")
    return value


def _fields(data: dict[str, Any], expected: set[str], kind: str) -> None:
    if set(data) != expected:
        unexpected = sorted(set(data) - expected)
        missing = sorted(expected - set(data))
        raise _Corrupt(f"bad {kind} line (unexpected {unexpected}, missing {missing})")


def _positions(data: Any, what: str) -> dict[str, int]:
    names = {name for _, name, _, _ in _FAMILIES}
    if not isinstance(data, dict) or set(data) != names:
        raise _Corrupt(f"{what} must name messages, runs and queuedItems")
    for value in data.values():
        if type(value) is not int or value < 0:
            raise _Corrupt(f"{what} must hold non-negative integers")
    return data


@dataclass(slots=True)
class _Block:
    line: int
    root: ThreadRecord
    next_positions: dict[str, int]
    counts: dict[str, int]
    families: dict[str, Family[Any]] = field(default_factory=dict)
    last_positions: dict[str, int] = field(default_factory=dict)
    kind_index: int = 0

    def expected_kind(self) -> str:
        while self.kind_index < len(_FAMILIES):
            kind, name, _, _ = _FAMILIES[self.kind_index]
            if len(self.families[name]) < self.counts[name]:
                return kind
            self.kind_index += 1
        return "end"


def _start(data: dict[str, Any], line: int) -> _Block:
    _fields(data, {"kind", "thread", "nextPositions", "counts"}, "thread")
    root = ThreadRecord.model_validate(data["thread"])
    next_positions = _positions(data["nextPositions"], "nextPositions")
    counts = _positions(data["counts"], "counts")
    for name, count in counts.items():
        if next_positions[name] < 1 or count > next_positions[name] - 1:
            raise _Corrupt(f"{name}: count and nextPosition disagree")
    families = {name: Family[Any](next_position=next_positions[name]) for name in counts}
    return _Block(line, root, next_positions, counts, families)


def _add(block: _Block, data: dict[str, Any], kind: str) -> None:
    _fields(data, {"kind", "position", "record"}, kind)
    for line_kind, name, model, id_attr in _FAMILIES:
        if line_kind != kind:
            continue
        family = block.families[name]
        position = data["position"]
        last = block.last_positions.get(name, 0)
        if type(position) is not int or not last < position < family.next_position:
            raise _Corrupt(f"{kind} position out of order or not below nextPosition")
        block.last_positions[name] = position
        record = model.model_validate(data["record"])
        record_id = getattr(record, id_attr)
        if record_id in family.entries:
            raise _Corrupt(f"duplicate {kind} id {record_id!r}")
        family.entries[record_id] = Entry(position, record)
        return


def _finish(block: _Block, data: dict[str, Any]) -> ThreadAggregate:
    _fields(data, {"kind", "digest"}, "end")
    aggregate = ThreadAggregate(
        root=block.root,
        messages=block.families["messages"],
        runs=block.families["runs"],
        queued_items=block.families["queuedItems"],
    )
    if data["digest"] != thread_digest(aggregate):
        raise _Corrupt("the block's digest does not match its content")
    assert_relationships(relations_from_aggregate(aggregate))
    return aggregate


async def _lines(
    source: AsyncIterable[str | bytes] | Iterable[str | bytes],
) -> AsyncIterator[str | bytes]:
    if isinstance(source, str):  # a whole export in one string (not str.splitlines:
        source = source.split("\n")  # U+2028 and friends may stand unescaped in JSON)
    elif isinstance(source, bytes):
        source = source.split(b"\n")
    if isinstance(source, AsyncIterable):
        async for item in source:
            yield item
    else:
        for item in source:
            yield item


async def decode_threads(
    source: AsyncIterable[str | bytes] | Iterable[str | bytes],
) -> AsyncIterator[tuple[int, ThreadAggregate]]:
    """Parse an export, yielding ``(line of the thread's first line, aggregate)`` per thread.

    Every line is validated like any input (records strictly, positions in
    order and below their counters, ids unique, the block's digest, every
    relationship rule); a thread is yielded only once its ``end`` line
    checked out. Raises :class:`ThreadStoreInvariantError` naming the line
    number of the first problem.
    """
    number = 0
    block: _Block | None = None
    header = False
    async for raw in _lines(source):
        number += 1
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise ThreadStoreInvariantError(f"line {number}: not UTF-8") from None
        text = text.rstrip("\r\n")
        if not text.strip():
            continue
        try:
            data = _object(text)
            if not header:
                if data.get("format") != EXPORT_FORMAT:
                    raise _Corrupt(f"not a {EXPORT_FORMAT} export (no header line)")
                version = data.get("version")
                if type(version) is not int or version != EXPORT_VERSION:
                    raise _Corrupt(
                        f"export format version {version!r} is not supported "
                        f"(this version reads {EXPORT_VERSION})"
                    )
                header = True
                continue
            kind = data.get("kind")
            if block is None:
                if kind != "thread":
                    raise _Corrupt(f"expected a thread line, found kind {kind!r}")
                block = _start(data, number)
                continue
            expected = block.expected_kind()
            if kind != expected:
                raise _Corrupt(f"expected a {expected} line, found kind {kind!r}")
            if kind == "end":
                aggregate = _finish(block, data)
                first = block.line
                block = None
                yield first, aggregate
            else:
                _add(block, data, expected)
        except _Corrupt as exc:
            raise ThreadStoreInvariantError(f"line {number}: {exc}") from None
        except ThreadStoreInvariantError as exc:
            located = type(exc)(f"line {number}: {exc}")
            located.__dict__.update(exc.__dict__)  # e.g. a serialization error's path
            raise located from None
    if not header:
        raise ThreadStoreInvariantError(f"line {number + 1}: empty input, not an export")
    if block is not None:
        raise ThreadStoreInvariantError(
            f"line {number + 1}: the input ends inside the thread that starts on line {block.line}"
        )


@dataclass(slots=True)
class ImportReport:
    """What :meth:`ThreadStore.import_threads` did: ``(scope_key, thread_id)`` pairs."""

    imported: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


async def import_lines(
    store: ThreadStore,
    source: AsyncIterable[str | bytes] | Iterable[str | bytes],
    on_conflict: Literal["skip", "fail"],
) -> ImportReport:
    """Import an export (see :meth:`ThreadStore.import_threads`)."""
    if on_conflict not in ("skip", "fail"):
        raise ThreadStoreInvariantError('on_conflict must be "skip" or "fail"')
    report = ImportReport()
    async for line, aggregate in decode_threads(source):
        root = aggregate.root
        key = (root.scope_key, root.thread_id)
        existing = await store._restore_thread(aggregate)
        if existing is None:
            report.imported.append(key)
        elif on_conflict == "skip":
            report.skipped.append(key)
        else:
            raise ThreadExistsError(root.scope_key, root.thread_id, line)
    return report


# ------------------------------------------------------------------ copy


@dataclass(slots=True)
class CopyReport:
    """What :func:`copy_threads` did, thread by thread: ``(scope_key, thread_id)`` pairs."""

    copied: list[tuple[str, str]] = field(default_factory=list)
    present: list[tuple[str, str]] = field(default_factory=list)
    """Already in the target with the same digest (a resumed copy)."""
    mismatched: list[tuple[str, str]] = field(default_factory=list)
    """In the target with another content, or read back differently."""
    verified: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatched


async def copy_threads(
    source: ThreadStore,
    target: ThreadStore,
    scope_key: str | None = None,
    *,
    verify: bool = True,
    on_total: Callable[[int], None] | None = None,
    on_thread: Callable[[tuple[str, str]], None] | None = None,
) -> CopyReport:
    """Copy the threads of a scope (every scope with ``None``) from one store to another.

    Each thread is loaded whole from one snapshot of the source and restored
    exactly (versions, timestamps, positions) in one transaction of the
    target. Resumable: a thread already in the target with the same digest
    counts as ``present``; one with other content is ``mismatched`` and left
    alone. With ``verify``, every thread is then read back from both stores
    and its digests compared. ``on_total`` receives the number of threads
    once the source's index was walked; ``on_thread`` is called after each.
    """
    from .maintenance import SWEEP_BATCH, ThreadIndexEntry, check_thread_key

    scope = None if scope_key is None else check_thread_key("scope_key", scope_key)
    await source._ensure_ready()
    await target._ensure_ready()
    source._require_lifecycle("copy")
    target._require_lifecycle("copy")
    keys: dict[tuple[str, str], None] = {}
    after: ThreadIndexEntry | None = None
    while True:
        batch = await source._thread_heads(
            scope, updated_before=None, after=after, limit=SWEEP_BATCH
        )
        for head in batch:
            keys[(head.scope_key, head.thread_id)] = None
            after = head
        if len(batch) < SWEEP_BATCH:
            break
    if on_total is not None:
        on_total(len(keys))
    report = CopyReport()
    copied: list[tuple[str, str]] = []
    for key in keys:
        aggregate = await source._load_thread(*key)
        if aggregate is not None:
            existing = await target._restore_thread(aggregate)
            if existing is None:
                report.copied.append(key)
                copied.append(key)
            else:
                theirs = await target._load_thread(*key)
                same = theirs is not None and thread_digest(theirs) == thread_digest(aggregate)
                (report.present if same else report.mismatched).append(key)
        if on_thread is not None:
            on_thread(key)
    if verify:
        for key in [*report.copied, *report.present]:
            mine, theirs = await source._load_thread(*key), await target._load_thread(*key)
            if mine is None:
                continue  # deleted in the source since: nothing to compare
            if theirs is None or thread_digest(mine) != thread_digest(theirs):
                if key not in report.mismatched:
                    report.mismatched.append(key)
            else:
                report.verified += 1
    return report


# ------------------------------------------------------------------ runtime stores

RUNTIME_COMPONENTS = ("kv", "state", "snapshots")
"""The runtime stores ``copy_runtime`` copies (the execution guard's locks are not data)."""

_RUNTIME_PAGE = 1000


@dataclass(frozen=True, slots=True)
class RuntimeItem:
    """One unit of a runtime copy: a key-value item, a session or a snapshot.

    ``where`` is ``(*namespace, key)`` of an item, ``(user_id, session_id)``
    of a session (``user_id`` ``None`` for the anonymous user), ``(scope,
    snapshot_id)`` of a snapshot.
    """

    component: Literal["kv", "state", "snapshots"]
    where: tuple[str | None, ...]

    def __str__(self) -> str:
        return f"{self.component} {self.where!r}"


@dataclass(slots=True)
class RuntimeCopyReport:
    """What :func:`copy_runtime` did, item by item."""

    copied: list[RuntimeItem] = field(default_factory=list)
    present: list[RuntimeItem] = field(default_factory=list)
    """Already in the target with the same content (a resumed copy)."""
    mismatched: list[RuntimeItem] = field(default_factory=list)
    """In the target with another content, or read back differently."""
    verified: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatched

    def count(self, component: str) -> int:
        """How many items of ``component`` were copied or already present."""
        return sum(item.component == component for item in (*self.copied, *self.present))


def require_enumeration(source: Stores, target: Stores) -> None:
    """Raise :class:`~pai_storage.ConfigurationError` unless both bundles can take part
    in :func:`copy_runtime`: each holds the three runtime stores, and its agent-state and
    snapshot stores declare :data:`~pai_storage.backend.ENUMERATE`."""
    from .errors import ConfigurationError
    from .state import ENUMERATE

    for side, stores in (("source", source), ("target", target)):
        for component in RUNTIME_COMPONENTS:
            if component not in stores:
                raise ConfigurationError(
                    f"the {side} provides no {component} store, so its runtime stores "
                    "cannot be copied (--all)"
                )
        for component, store in (("agent-state", stores.state), ("snapshot", stores.snapshots)):
            if ENUMERATE not in store.capabilities:
                raise ConfigurationError(
                    f"the {side}'s {component} store ({store.backend_name} backend) does not "
                    "enumerate its content, so the runtime stores cannot be copied (--all)"
                )


async def copy_runtime(
    source: Stores,
    target: Stores,
    *,
    verify: bool = True,
    on_total: Callable[[int], None] | None = None,
    on_item: Callable[[RuntimeItem], None] | None = None,
) -> RuntimeCopyReport:
    """Copy every key-value item, agent-state session and snapshot from one bundle to another.

    Copied by value through the stores' public writes: an item keeps its
    value and its remaining time to live, and its version restarts at 1; a
    session gets each value and list (the target's session TTL applies); a
    snapshot gets its data and metadata (its creation time, and so its
    expiry, is the target's). Resumable: what is already in the target with
    the same content counts as ``present``; what holds other content there
    is ``mismatched`` and left alone. With ``verify``, every item is then
    read back from both sides and its digest compared. ``on_total`` receives
    the number of items once the source was enumerated; ``on_item`` is called
    after each.

    Raises
    ------
    ConfigurationError
        A bundle lacks a runtime store, or its agent-state or snapshot store
        does not enumerate (:func:`require_enumeration`); nothing is copied.
    """
    require_enumeration(source, target)
    items = await _runtime_items(source)
    if on_total is not None:
        on_total(len(items))
    report = RuntimeCopyReport()
    for item in items:
        outcome = await _COPIERS[item.component](source, target, item)
        if outcome is not None:
            getattr(report, outcome).append(item)
        if on_item is not None:
            on_item(item)
    if verify:
        for item in [*report.copied, *report.present]:
            mine = await _DIGESTS[item.component](source, item)
            if mine is None:
                continue  # deleted (or expired) in the source since: nothing to compare
            if mine != await _DIGESTS[item.component](target, item):
                if item not in report.mismatched:
                    report.mismatched.append(item)
            else:
                report.verified += 1
    return report


async def _runtime_items(source: Stores) -> list[RuntimeItem]:
    """Every item of the source's runtime stores, walked by their enumeration."""
    items: list[RuntimeItem] = []
    kv, token = source.kv, None
    while True:
        page = await kv.search((), limit=_RUNTIME_PAGE, page_token=token)
        items.extend(RuntimeItem("kv", (*i.namespace, i.key)) for i in page.items)
        token = page.next_page_token
        if token is None:
            break
    state = source.state
    await state._ensure_ready()
    after: tuple[str | None, str] | None = None
    while True:
        sessions = await state._list_sessions(after, _RUNTIME_PAGE)
        items.extend(RuntimeItem("state", pair) for pair in sessions)
        if len(sessions) < _RUNTIME_PAGE:
            break
        after = sessions[-1]
    snapshots = source.snapshots
    await snapshots._ensure_ready()
    scope: str | None = None
    while True:
        scopes = await snapshots._list_scopes(scope, _RUNTIME_PAGE)
        for scope in scopes:
            listing: str | None = None
            while True:
                infos = await snapshots.list(scope, limit=_RUNTIME_PAGE, page_token=listing)
                items.extend(RuntimeItem("snapshots", (scope, i.snapshot_id)) for i in infos.items)
                listing = infos.next_page_token
                if listing is None:
                    break
        if len(scopes) < _RUNTIME_PAGE:
            break
    return items


def _digest_of(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return "sha256:" + digest.hexdigest()


def _kv_where(item: RuntimeItem) -> tuple[tuple[str, ...], str]:
    parts = [str(part) for part in item.where]
    return tuple(parts[:-1]), parts[-1]


async def _kv_digest(stores: Stores, item: RuntimeItem) -> str | None:
    namespace, key = _kv_where(item)
    found = await stores.kv.get(namespace, key)
    if found is None:
        return None
    return _digest_of(canonical_json(found.value), "expires" if found.expires_at else "forever")


async def _copy_kv(source: Stores, target: Stores, item: RuntimeItem) -> str | None:
    from .kv import KVConflict

    namespace, key = _kv_where(item)
    found = await source.kv.get(namespace, key)
    if found is None:
        return None  # deleted or expired since the walk
    ttl = None
    if found.expires_at is not None:
        now = source.kv.now() or truncate_ms(system_clock())
        ttl = timedelta(milliseconds=(found.expires_at - now) // timedelta(milliseconds=1))
        if ttl < timedelta(milliseconds=1):
            return None  # expires now: nothing to copy
    written = await target.kv.put_if_version(namespace, key, found.value, None, ttl=ttl)
    if not isinstance(written, KVConflict):
        return "copied"
    current = written.current
    same = current is not None and canonical_json(current.value) == canonical_json(found.value)
    return "present" if same else "mismatched"


async def _session_digest(stores: Stores, item: RuntimeItem) -> str | None:
    user_id, session_id = item.where[0], str(item.where[1])
    state = stores.state
    await state._ensure_ready()
    values, lists = await state._session_keys(user_id, session_id)
    if not values and not lists:
        return None
    texts: list[str] = []
    for key in values:
        texts += ["value", key, canonical_json(await state.get(user_id, session_id, key))]
    for key in lists:
        texts += ["list", key, canonical_json(await state.get_list(user_id, session_id, key))]
    return _digest_of(*texts)


async def _copy_session(source: Stores, target: Stores, item: RuntimeItem) -> str | None:
    user_id, session_id = item.where[0], str(item.where[1])
    mine, theirs = source.state, target.state
    await theirs._ensure_ready()
    values, lists = await mine._session_keys(user_id, session_id)
    if not values and not lists:
        return None  # deleted or expired since the walk
    contents: dict[str, tuple[bool, Any]] = {}  # key -> (is a list, content)
    for key in values:
        found = await mine.get_versioned(user_id, session_id, key)
        if found is not None:
            contents[key] = (False, found.value)
    for key in lists:
        contents[key] = (True, await mine.get_list(user_id, session_id, key))
    # What the target already holds must be part of the source's session (an
    # interrupted copy): otherwise the session is left alone, nothing written.
    their_values, their_lists = await theirs._session_keys(user_id, session_id)
    for key, is_list in [*((k, False) for k in their_values), *((k, True) for k in their_lists)]:
        if key not in contents or contents[key][0] is not is_list:
            return "mismatched"
        if is_list:
            stored: Any = await theirs.get_list(user_id, session_id, key)
        else:
            versioned = await theirs.get_versioned(user_id, session_id, key)
            stored = None if versioned is None else versioned.value
        if _differ(stored, contents[key][1]):
            return "mismatched"
    wrote = False
    for key, (is_list, content) in contents.items():
        if key in their_values or key in their_lists:
            continue
        wrote = True
        if is_list:
            written = await theirs.append_list(user_id, session_id, key, content, expected_length=0)
            if isinstance(written, Conflict):
                return "mismatched"  # written in the target meanwhile
        elif isinstance(
            await theirs.save_if_version(user_id, session_id, key, content, 0), Conflict
        ):
            return "mismatched"
    after = await theirs._session_keys(user_id, session_id)
    if after != ([k for k in values if k in contents], lists):
        return "mismatched"
    return "copied" if wrote else "present"


def _differ(a: Any, b: Any) -> bool:
    return canonical_json(a) != canonical_json(b)


async def _snapshot_digest(stores: Stores, item: RuntimeItem) -> str | None:
    scope, snapshot_id = str(item.where[0]), str(item.where[1])
    found = await stores.snapshots.get(scope, snapshot_id)
    if found is None:
        return None
    return _digest_of(found.info.sha256, canonical_json(found.info.metadata))


async def _copy_snapshot(source: Stores, target: Stores, item: RuntimeItem) -> str | None:
    scope, snapshot_id = str(item.where[0]), str(item.where[1])
    found = await source.snapshots.get(scope, snapshot_id)
    if found is None:
        return None  # deleted or expired since the walk
    theirs = await target.snapshots.get(scope, snapshot_id)
    if theirs is None:
        await target.snapshots.put(scope, snapshot_id, found.data, metadata=found.info.metadata)
        return "copied"
    same = theirs.info.sha256 == found.info.sha256 and not _differ(
        theirs.info.metadata, found.info.metadata
    )
    return "present" if same else "mismatched"


_COPIERS: dict[str, Callable[[Stores, Stores, RuntimeItem], Awaitable[str | None]]] = {
    "kv": _copy_kv,
    "state": _copy_session,
    "snapshots": _copy_snapshot,
}
_DIGESTS: dict[str, Callable[[Stores, RuntimeItem], Awaitable[str | None]]] = {
    "kv": _kv_digest,
    "state": _session_digest,
    "snapshots": _snapshot_digest,
}
