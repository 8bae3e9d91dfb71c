"""Strict JSON: the only values pai-storage persists as opaque data.

Accepted: ``None``, ``bool``, ``int`` in the signed 64-bit range, finite
``float`` other than ``-0.0``, ``str`` (valid Unicode; U+0000 allowed), ``list``
and ``dict`` with ``str`` keys. Everything else -- NaN, infinities, ``-0.0``,
out-of-range ints, tuples, sets, bytes, datetimes, Decimals, enums, subclasses
of the accepted types, class instances, cycles, lone surrogates, nesting deeper
than :data:`MAX_JSON_DEPTH` containers -- is rejected
with :class:`ThreadStoreSerializationError` naming the path of the first bad
value, e.g. ``metadata.items[3].score: NaN is not JSON``.

The walk is iterative (no recursion limit on deep values) and checks exact
types, which keeps it fast on the large values it sees on every commit.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import ThreadStoreSerializationError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_JSON_DEPTH",
    "check_json",
    "check_json_object",
    "is_valid_text",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_JSON_DEPTH = 64
"""Deepest nesting of containers in one opaque value. Every backend must store
it (MongoDB allows 100 levels per document, counting the record around it)."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def is_valid_text(text: str) -> bool:
    """True when ``text`` is valid Unicode (no lone surrogate code points)."""
    return text.isascii() or _SURROGATE.search(text) is None


def _describe(value: object) -> str:
    if isinstance(value, float):
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


def _is_json(value: Any, depth: int, active: set[int]) -> bool:
    """Fast yes/no check (no paths); depth is capped, so recursion is bounded."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _SURROGATE.search(value) is None
    if kind is dict or kind is list:
        ident = id(value)
        if depth >= MAX_JSON_DEPTH or ident in active:
            return False
        active.add(ident)
        if kind is dict:
            for key, sub in value.items():
                if type(key) is not str or not (key.isascii() or _SURROGATE.search(key) is None):
                    return False
                if not _is_json(sub, depth + 1, active):
                    return False
        else:
            for sub in value:
                if not _is_json(sub, depth + 1, active):
                    return False
        active.discard(ident)
        return True
    if kind is int:
        return bool(INT64_MIN <= value <= INT64_MAX)
    if kind is float:
        return math.isfinite(value) and (value != 0.0 or math.copysign(1.0, value) > 0)
    return value is None or kind is bool


def check_json(value: Any, path: str = "") -> None:
    """Raise :class:`ThreadStoreSerializationError` unless ``value`` is strict JSON.

    ``path`` prefixes the location named in the error (``"metadata"`` gives
    ``metadata.items[3]: ...``).
    """
    if _is_json(value, 0, set()):
        return
    _explain(value, path)
    raise _fail(path, "not strict JSON")  # unreachable: _explain names the bad value


def _explain(value: Any, path: str) -> None:
    """The slow walk that finds the first bad value and names its path."""
    # Containers currently on the walk: a container reached again is a cycle.
    # Shared (non-cyclic) sub-values are fine and checked each time they appear.
    active: set[int] = set()
    # Each entry is (value, path, depth) to check, or (None, id, 0) to leave a container.
    stack: list[tuple[Any, Any, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if item is None:
            if type(where) is int:
                active.discard(where)
            continue
        kind = type(item)
        if kind is str:
            if not item.isascii() and _SURROGATE.search(item):
                raise _fail(where, _describe(item))
        elif kind is bool:
            pass
        elif kind is int:
            if not INT64_MIN <= item <= INT64_MAX:
                raise _fail(where, _describe(item))
        elif kind is float:
            if not math.isfinite(item) or (item == 0.0 and math.copysign(1.0, item) < 0):
                raise _fail(where, _describe(item))
        elif kind is dict or kind is list:
            ident = id(item)
            if ident in active:
                raise _fail(where, "cycle: a container contains itself")
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise _fail(where, f"nesting deeper than {MAX_JSON_DEPTH} levels is not stored")
            active.add(ident)
            stack.append((None, ident, 0))
            if kind is dict:
                for key, sub in reversed(item.items()):
                    if type(key) is not str:
                        raise _fail(
                            where, f"a key of type {type(key).__qualname__} is not a string"
                        )
                    if not key.isascii() and _SURROGATE.search(key):
                        raise _fail(where, "key with a lone surrogate is not valid Unicode")
                    stack.append((sub, _join(where, key), depth))
            else:
                for index in range(len(item) - 1, -1, -1):
                    stack.append((item[index], f"{where}[{index}]", depth))
        else:
            raise _fail(where, _describe(item))


def check_json_object(value: Any, path: str = "") -> None:
    """Like :func:`check_json`, and ``value`` must be a ``dict``."""
    if type(value) is not dict:
        raise _fail(path, f"expected a JSON object, got {type(value).__qualname__}")
    check_json(value, path)
