"""Strict JSON: the only values pai-storage persists as opaque data.

Accepted: ``None``, ``bool``, ``int`` in the signed 64-bit range, finite
``float`` other than ``-0.0``, ``str`` (valid Unicode; U+0000 allowed), ``list``
and ``dict`` with ``str`` keys. Everything else -- NaN, infinities, ``-0.0``,
out-of-range ints, tuples, sets, bytes, datetimes, Decimals, enums, subclasses
of the accepted types, class instances, cycles, lone surrogates, nesting deeper
than :data:`MAX_JSON_DEPTH` containers, more than :data:`MAX_JSON_NODES` values
-- is rejected with :class:`ThreadStoreSerializationError` naming the path of
the first bad value, e.g. ``metadata.items[3].score: NaN is not JSON``.

:func:`check_json` returns the store's own copy of the value, made in the same
walk that checks it: a caller that mutates its object after validation changes
nothing that was checked or will be stored.

A container may appear more than once in a value (``x = [1]; [x, x]``): that is
valid JSON, and it is written out once per appearance. The walk visits each
distinct container once, so checking stays linear in the size of the object
graph, but the limits apply to the value as written out: a container shared
at several depths must fit the depth limit at each of them, and every
appearance counts towards :data:`MAX_JSON_NODES`. Without that bound, 40
levels of ``x = [x, x]`` -- a few hundred bytes in memory -- would expand to
2**40 values in every backend's serializer.
"""

from __future__ import annotations

import math
import re
from math import copysign, isfinite
from typing import Any, cast

from .errors import ThreadStoreSerializationError
from .frozen import EMPTY_DICT, EMPTY_LIST, FrozenDict, FrozenList

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_JSON_DEPTH",
    "MAX_JSON_NODES",
    "check_json",
    "check_json_object",
    "is_valid_text",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_JSON_DEPTH = 64
"""Deepest nesting of containers in one opaque value. Every backend must store
it (MongoDB allows 100 levels per document, counting the record around it)."""
MAX_JSON_NODES = 1_000_000
"""Most values (containers and scalars) in one opaque value as written out: a
container that appears several times counts each time it appears."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DEEPER = f"nesting deeper than {MAX_JSON_DEPTH} levels is not stored"
_CYCLE = "cycle: a container contains itself"


def is_valid_text(text: str) -> bool:
    """True when ``text`` is valid Unicode (no lone surrogate code points)."""
    return text.isascii() or _SURROGATE.search(text) is None


def _describe(value: object) -> str:
    # Exact types only: a subclass (numpy.float64, an enum) is named by its type,
    # not described as the NaN, infinity or negative zero it need not be.
    if type(value) is float:
        if math.isnan(value):
            return "NaN is not JSON"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}Infinity is not JSON"
        return "-0.0 is not JSON (negative zero does not round-trip)"
    if type(value) is int:
        return "integer outside the signed 64-bit range is not JSON"
    if type(value) is str:
        return "string with a lone surrogate is not valid Unicode"
    return f"a value of type {type(value).__qualname__} is not JSON"


def _join(path: str, key: str) -> str:
    if _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _fail(path: str, reason: str) -> ThreadStoreSerializationError:
    return ThreadStoreSerializationError.at(path, reason)


class _Bad(Exception):
    """The first bad value. Containers add their key or index while it unwinds."""

    def __init__(self, reason: str, *, at_container: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.segments: list[str | int] = []  # innermost first
        # A bad key is reported at its container, not under the key itself.
        self.at_container = at_container


class _TooBig(Exception):
    """More than MAX_JSON_NODES values as written out."""


class _Shared(Exception):
    """A container appears twice: check again, remembering each container."""


class _Walk:
    """State of one check: containers seen so far, and values counted."""

    __slots__ = ("done", "frozen", "nodes", "seen")

    def __init__(self, frozen: bool) -> None:
        self.frozen = frozen  # copies made read-only (FrozenDict, FrozenList)
        self.nodes = 1  # the top-level value
        self.seen: set[int] = set()
        # For the shared walk: id -> None while the container is on the current
        # path (seen again: a cycle); afterwards (its copy, values below it,
        # its height).
        self.done: dict[int, tuple[Any, int, int] | None] = {}


_DICTS = frozenset[type]((dict, FrozenDict))
_CONTAINERS = frozenset[type]((dict, list, FrozenDict, FrozenList))


def _scalar_ok(value: Any, kind: type) -> bool:
    if kind is str:
        return bool(value.isascii() or _SURROGATE.search(value) is None)
    if kind is int:
        return bool(INT64_MIN <= value <= INT64_MAX)
    if kind is float:
        return math.isfinite(value) and (value != 0.0 or math.copysign(1.0, value) > 0)
    return value is None or kind is bool


def _bad_key(key: Any) -> _Bad | None:
    if type(key) is not str:
        return _Bad(f"a key of type {type(key).__qualname__} is not a string", at_container=True)
    if not key.isascii() and _SURROGATE.search(key):
        return _Bad("key with a lone surrogate is not valid Unicode", at_container=True)
    return None


def _unwind(bad: _Bad, segment: str | int) -> None:
    if bad.at_container:
        bad.at_container = False
    else:
        bad.segments.append(segment)


def _copy_tree(value: dict[Any, Any] | list[Any], depth: int, walk: _Walk) -> Any:
    """Check and copy a container at ``depth`` (0 for the top) in which nothing repeats.

    This runs on every opaque value of every commit, so common scalars are
    checked inline; recursion is bounded by :data:`MAX_JSON_DEPTH`. A container
    met twice raises :class:`_Shared` (the caller starts :func:`_copy_shared`).
    """
    ident = id(value)
    if ident in walk.seen:
        raise _Shared
    if depth >= MAX_JSON_DEPTH:
        raise _Bad(_DEEPER)
    walk.seen.add(ident)
    walk.nodes += len(value)
    if walk.nodes > MAX_JSON_NODES:
        raise _TooBig
    depth += 1
    out: Any
    if type(value) in _DICTS:
        out = {}
        key: Any = None
        try:
            for key, sub in cast(dict[Any, Any], value).items():
                if type(key) is not str or not key.isascii():
                    bad = _bad_key(key)
                    if bad is not None:
                        raise bad
                kind = type(sub)
                if kind is str:
                    if not sub.isascii() and _SURROGATE.search(sub):
                        raise _Bad(_describe(sub))
                elif kind in _CONTAINERS:
                    sub = _copy_tree(sub, depth, walk)
                elif kind is int:
                    if not INT64_MIN <= sub <= INT64_MAX:
                        raise _Bad(_describe(sub))
                elif kind is float:
                    if not isfinite(sub) or (sub == 0.0 and copysign(1.0, sub) < 0):
                        raise _Bad(_describe(sub))
                elif sub is not None and kind is not bool:
                    raise _Bad(_describe(sub))
                out[key] = sub
        except _Bad as bad:
            _unwind(bad, key)
            raise
    else:
        out = []
        try:
            for sub in value:
                kind = type(sub)
                if kind is str:
                    if not sub.isascii() and _SURROGATE.search(sub):
                        raise _Bad(_describe(sub))
                elif kind in _CONTAINERS:
                    sub = _copy_tree(sub, depth, walk)
                elif kind is int:
                    if not INT64_MIN <= sub <= INT64_MAX:
                        raise _Bad(_describe(sub))
                elif kind is float:
                    if not isfinite(sub) or (sub == 0.0 and copysign(1.0, sub) < 0):
                        raise _Bad(_describe(sub))
                elif sub is not None and kind is not bool:
                    raise _Bad(_describe(sub))
                out.append(sub)
        except _Bad as bad:
            _unwind(bad, len(out))  # items are copied in order: this is the index
            raise
    if walk.frozen:
        return FrozenDict(out) if type(out) is dict else FrozenList(out)
    return out


def _copy_shared(value: dict[Any, Any] | list[Any], depth: int, walk: _Walk) -> tuple[Any, int]:
    """Like :func:`_copy_tree` for a value with repeated containers; returns (copy, height).

    Each distinct container is walked once; later appearances reuse its copy
    and count its values again, and must fit the depth limit where they appear.
    """
    ident = id(value)
    done = walk.done
    if ident in done:
        found = done[ident]
        if found is None:
            raise _Bad(_CYCLE)
        copied, below, height = found
        if depth + height > MAX_JSON_DEPTH:
            raise _Bad(_DEEPER)
        walk.nodes += below
        if walk.nodes > MAX_JSON_NODES:
            raise _TooBig
        return copied, height
    if depth >= MAX_JSON_DEPTH:
        raise _Bad(_DEEPER)
    done[ident] = None
    start = walk.nodes
    walk.nodes += len(value)
    if walk.nodes > MAX_JSON_NODES:
        raise _TooBig
    height = 0
    items = cast(dict[Any, Any], value).items() if type(value) in _DICTS else enumerate(value)
    out: Any = {} if type(value) in _DICTS else []
    segment: Any = None
    try:
        for segment, sub in items:
            if type(out) is dict:
                bad = _bad_key(segment)
                if bad is not None:
                    raise bad
            kind = type(sub)
            if kind in _CONTAINERS:
                sub, sub_height = _copy_shared(sub, depth + 1, walk)
                height = max(height, sub_height)
            elif not _scalar_ok(sub, kind):
                raise _Bad(_describe(sub))
            if type(out) is dict:
                out[segment] = sub
            else:
                out.append(sub)
    except _Bad as bad:
        _unwind(bad, segment)
        raise
    height += 1
    if walk.frozen:
        out = FrozenDict(out) if type(out) is dict else FrozenList(out)
    done[ident] = (out, walk.nodes - start, height)
    return out, height


def _render(path: str, segments: list[str | int]) -> str:
    for segment in reversed(segments):
        path = f"{path}[{segment}]" if type(segment) is int else _join(path, str(segment))
    return path


def check_json(value: Any, path: str = "", *, frozen: bool = False) -> Any:
    """Return the store's own copy of ``value``, or raise unless it is strict JSON.

    Raises :class:`ThreadStoreSerializationError` naming the first bad value;
    ``path`` prefixes the location named in the error (``"metadata"`` gives
    ``metadata.items[3]: ...``). The copy shares no ``dict`` or ``list`` with
    ``value`` (a container shared within ``value`` is shared within the copy);
    with ``frozen`` its containers are read-only (:mod:`pai_storage.frozen`).
    A read-only container is taken as a ``dict`` or ``list``.
    """
    kind = type(value)
    if kind not in _CONTAINERS:
        if not _scalar_ok(value, kind):
            raise _fail(path, _describe(value))
        return value
    if not value:  # an empty object or array (most metadata): its copy, no walk
        if frozen:
            return EMPTY_DICT if kind in _DICTS else EMPTY_LIST
        return {} if kind in _DICTS else []
    try:
        try:
            return _copy_tree(value, 0, _Walk(frozen))
        except _Shared:
            return _copy_shared(value, 0, _Walk(frozen))[0]
    except _Bad as bad:
        raise _fail(_render(path, bad.segments), bad.reason) from None
    except _TooBig:
        raise _fail(
            path,
            f"more than {MAX_JSON_NODES:,} values (a container counts each time it "
            "appears) is not stored",
        ) from None


def check_json_object(value: Any, path: str = "", *, frozen: bool = False) -> dict[str, Any]:
    """Like :func:`check_json`, and ``value`` must be a ``dict``."""
    if type(value) not in _DICTS:
        raise _fail(path, f"expected a JSON object, got {type(value).__qualname__}")
    copied: dict[str, Any] = check_json(value, path, frozen=frozen)
    return copied
