"""Rules shared by the runtime stores: names, namespaces, values, durations, pages.

The key-value store, the agent-state store, the snapshot store and the
execution guard (``docs/runtime-stores.md``) validate every argument here,
before a backend sees it, so every backend refuses the same inputs with the
same :class:`~pai_storage.InvalidInputError` and writes nothing:

- a *name* (namespace segment, key, user id, session id, state key, snapshot
  id, scope, lock resource, owner) is a ``str`` of 1 to 1,024 characters with
  no U+0000, no U+001F and no lone surrogate; U+001F is reserved because
  backends join namespace segments with it;
- a *namespace* is a tuple (or list) of 1 to 16 names;
- a *value* is strict JSON (``docs/json.md``); it is stored as its canonical
  text, whose UTF-8 size is checked against the store's limit, and the store
  keeps its own copy, so a caller mutating its object afterwards changes
  nothing stored;
- a *duration* is a positive :class:`~datetime.timedelta` of whole
  milliseconds or more;
- a page *limit* is 1 to 1,000; page tokens are opaque, bound to the query
  that produced them, and a token used with another query is a
  :class:`~pai_storage.PageTokenError`.

:class:`RuntimeStore` is the base of the four store contracts: the common
options and lifecycle of :class:`~pai_storage.lifecycle.ManagedStore`, plus a
page-token codec bound to the backend's ``token_prefix``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal, overload

from .clock import Clock
from .codec import STRICT_JSON_TEXT
from .errors import ConfigurationError, InvalidInputError, PageTokenError, general_errors
from .events import WarningCallback
from .lifecycle import ManagedStore
from .strict_json import (
    MAX_JSON_NODES,
    check_json,
    is_valid_text,
)
from .tokens import PageTokenCodec, query_digest

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_PAGE_LIMIT",
    "MAX_NAMESPACE_DEPTH",
    "MAX_NAME_LENGTH",
    "MAX_PAGE_LIMIT",
    "RuntimeStore",
    "canonical_json",
    "check_duration",
    "check_limit",
    "check_name",
    "check_namespace",
    "check_value",
    "option_duration",
    "option_value_bytes",
    "parse_json_text",
    "token_strings",
]

MAX_NAME_LENGTH = 1024
"""Longest name (namespace segment, key, id, resource), in characters."""
MAX_NAMESPACE_DEPTH = 16
"""Most segments in a namespace."""
MAX_PAGE_LIMIT = 1000
"""Largest page ``limit`` of a runtime store."""
DEFAULT_PAGE_LIMIT = 100
"""The ``limit`` of a page when none is given."""
DEFAULT_MAX_VALUE_BYTES = 4 * 1024 * 1024
"""The default size limit of one stored JSON value (a key-value item, a state
value or list item): 4 MiB of canonical JSON (UTF-8)."""

_RESERVED = ("\x00", "\x1f")


def check_name(kind: str, value: object) -> str:
    """``value`` as a valid name, else :class:`InvalidInputError` naming ``kind``."""
    if type(value) is not str:
        raise InvalidInputError(f"{kind} must be a str, not {type(value).__qualname__}")
    if not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise InvalidInputError(
            f"{kind} must be 1 to {MAX_NAME_LENGTH} characters long (got {len(value)})"
        )
    if any(c in value for c in _RESERVED):
        raise InvalidInputError(f"{kind} must not contain U+0000 or U+001F")
    if not is_valid_text(value):
        raise InvalidInputError(f"{kind} contains a lone surrogate (not valid Unicode)")
    return value


def check_namespace(
    value: object, *, kind: str = "namespace", allow_empty: bool = False
) -> tuple[str, ...]:
    """``value`` as a namespace tuple of 1 to 16 names (0 with ``allow_empty``)."""
    if isinstance(value, str) or not isinstance(value, tuple | list):
        raise InvalidInputError(
            f"{kind} must be a tuple of strings, not {type(value).__qualname__}"
        )
    low = 0 if allow_empty else 1
    if not low <= len(value) <= MAX_NAMESPACE_DEPTH:
        raise InvalidInputError(
            f"{kind} must have {low} to {MAX_NAMESPACE_DEPTH} segments (got {len(value)})"
        )
    return tuple(check_name(f"{kind}[{i}]", segment) for i, segment in enumerate(value))


def check_limit(value: object, *, maximum: int = MAX_PAGE_LIMIT) -> int:
    """A page limit: an ``int`` from 1 to ``maximum``."""
    if type(value) is not int or not 1 <= value <= maximum:
        raise InvalidInputError(f"limit must be an integer from 1 to {maximum}")
    return value


def check_duration(kind: str, value: object, *, optional: bool = True) -> timedelta | None:
    """A positive :class:`timedelta` of at least one millisecond (``None`` if optional)."""
    if value is None and optional:
        return None
    if not isinstance(value, timedelta):
        raise InvalidInputError(f"{kind} must be a datetime.timedelta")
    if value < timedelta(milliseconds=1) or value > timedelta(days=365_000):
        raise InvalidInputError(f"{kind} must be at least 1 ms and at most 1,000 years")
    return value


@overload
def option_duration(name: str, value: object, *, optional: Literal[False]) -> timedelta: ...
@overload
def option_duration(name: str, value: object, *, optional: bool = True) -> timedelta | None: ...
def option_duration(name: str, value: object, *, optional: bool = True) -> timedelta | None:
    """A duration constructor option, checked as :func:`check_duration` does.

    Raises :class:`~pai_storage.ConfigurationError` (not ``InvalidInputError``)
    naming ``option <name>``.
    """
    try:
        return check_duration(f"option {name}", value, optional=optional)
    except InvalidInputError as exc:
        raise ConfigurationError(str(exc)) from None


def option_value_bytes(value: object, *, hard: int | None, backend: str) -> int:
    """The ``max_value_bytes`` constructor option: an ``int`` from 1 to ``hard``.

    ``hard`` is the backend's own limit (``None``: unbounded); a bad value is a
    :class:`~pai_storage.ConfigurationError` naming the bounds and ``backend``.
    """
    if type(value) is not int or value < 1 or (hard is not None and value > hard):
        upper = f"{hard:,}" if hard is not None else "unbounded"
        raise ConfigurationError(
            f"option max_value_bytes must be an integer from 1 to {upper} for the {backend} backend"
        )
    return value


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a strict-JSON value: key order kept, no spaces."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def check_value(value: Any, *, path: str = "value", limit: int | None = None) -> tuple[Any, str]:
    """Validate a strict-JSON value; return the store's own copy and its canonical text.

    Raises :class:`~pai_storage.SerializationError` for a value that is not
    strict JSON, and :class:`InvalidInputError` when its canonical UTF-8 size
    exceeds ``limit`` bytes (the message names both).
    """
    with general_errors():  # the strict-JSON check is shared with the thread store
        check_json(value, path)
    text = canonical_json(value)
    if limit is not None:
        size = len(text.encode("utf-8"))
        if size > limit:
            raise InvalidInputError(
                f"{path} is {size:,} bytes of JSON, over this store's limit of {limit:,} bytes"
            )
    return json.loads(text), text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_json_text(text: str) -> Any:
    """Decode stored canonical JSON text; raises ``ValueError`` when it is not strict JSON.

    The result is a fresh value, owned by the caller. pydantic-core decodes
    and checks the text in one pass (:data:`~pai_storage.codec.STRICT_JSON_TEXT`);
    whatever it refuses is decoded again and walked by the full strict-JSON
    check, which decides (and names the problem).
    """
    if len(text) < MAX_JSON_NODES:  # fewer characters than values cannot exceed the limit
        try:
            return STRICT_JSON_TEXT.validate_json(text)
        except ValueError:
            pass
    return check_json(_DECODER.decode(text))


class RuntimeStore(ManagedStore):
    """Base of the runtime-store contracts: common options, lifecycle, page tokens.

    Parameters
    ----------
    clock:
        Test-only clock override; production uses the provider's clock.
    on_warning:
        Receives recoverable integrity warnings (a record that no longer
        decodes, a damaged snapshot).
    token_secret:
        Key (bytes) that makes page tokens unforgeable; set it in production.
    """

    token_prefix: str = "pai-rt"
    """The prefix of this store's page tokens."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning)
        self._tokens = PageTokenCodec(self.token_prefix, secret=token_secret)

    def encode_token(self, kind: str, scope: str, query: Any, position: dict[str, Any]) -> str:
        """A page token for ``kind`` pages of ``query`` within ``scope`` at ``position``."""
        return self._tokens.encode(kind, scope, query_digest(query), position)

    def decode_token(self, token: object, kind: str, scope: str, query: Any) -> dict[str, Any]:
        """The position a token carries; :class:`PageTokenError` unless it is this query's."""
        if type(token) is not str or not token:
            raise PageTokenError("page token must be a non-empty string")
        try:
            return self._tokens.decode(token, kind, scope, query_digest(query))
        except PageTokenError as exc:  # the codec's thread-store class: say it generally
            raise PageTokenError(str(exc)) from None


def token_strings(position: dict[str, Any], *keys: str) -> Sequence[str]:
    """The string fields ``keys`` of a decoded token position (else PageTokenError)."""
    out = []
    for key in keys:
        value = position.get(key)
        if type(value) is not str or not is_valid_text(value):
            raise PageTokenError("page token is malformed")
        out.append(value)
    return out
