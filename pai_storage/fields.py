"""The field types of the records and inputs, and their checks.

Ids, text, opaque JSON, timestamps and their limits (see the table in
:mod:`pai_storage.models`), and how a pydantic ``ValidationError`` becomes the
contract's typed error. Opaque JSON is copied while it is checked, into
read-only containers (:mod:`pai_storage.frozen`): a model never holds the
caller's ``dict`` or ``list``, and nobody can change what a model holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import (
    AfterValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictInt,
    StrictStr,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from .errors import ThreadStoreInvariantError, ThreadStoreSerializationError
from .frozen import FrozenDict, FrozenList
from .strict_json import check_json, is_valid_text

__all__ = [
    "MAX_DURATION_MS",
    "MAX_ID_LENGTH",
    "MAX_ID_SELECTION_SIZE",
    "MAX_INDEXED_TEXT_BYTES",
    "MAX_PAGE_SIZE",
    "Id",
    "IndexedId",
    "IndexedText",
    "Items",
    "Json",
    "JsonObject",
    "Limit",
    "ListVisibility",
    "Operation",
    "Order",
    "RunStatus",
    "Text",
    "Timestamp",
    "convert_validation_error",
    "format_timestamp",
    "truncate_ms",
]


MAX_PAGE_SIZE = 100
"""Largest ``limit`` of a page (messages, runs, queued items, threads)."""
MAX_ID_SELECTION_SIZE = 100
"""Largest number of ids in an ``ids`` selection."""
MAX_ID_LENGTH = 1024
"""Longest scope key, thread id or record id, in characters."""
MAX_DURATION_MS = 86_400_000
"""Longest lease duration a commit may request (one day)."""
MAX_INDEXED_TEXT_BYTES = 256
"""Longest ``agent``, ``category`` or ``parentThreadId`` of a commit or list, in
UTF-8 bytes (see the limits table above)."""


# ---------------------------------------------------------------- field types


def _check_text(value: str) -> str:
    if not value.isascii() and not is_valid_text(value):
        raise PydanticCustomError(
            "strict_json", "{path}: {reason}", {"path": "", "reason": _LONE_SURROGATE}
        )
    return value


_LONE_SURROGATE = "string with a lone surrogate is not valid Unicode"


def _check_id(value: str) -> str:
    if not 1 <= len(value) <= MAX_ID_LENGTH:
        raise PydanticCustomError(
            "invalid_id", "must be 1 to {max} characters", {"max": MAX_ID_LENGTH}
        )
    if not value.isascii() and not is_valid_text(value):
        raise PydanticCustomError("invalid_id", "id contains a lone surrogate")
    return value


def _strict_json_error(err: ThreadStoreSerializationError) -> PydanticCustomError:
    return PydanticCustomError(
        "strict_json", "{path}: {reason}", {"path": err.path, "reason": err.reason}
    )


def _check_json(value: Any) -> Any:
    # The model keeps the checked, read-only copy, never the caller's object:
    # mutating that object after validation cannot change what was checked or
    # what is stored, and nobody can change the copy.
    try:
        return check_json(value, frozen=True)
    except ThreadStoreSerializationError as err:
        raise _strict_json_error(err) from None


def _check_json_object(value: Any) -> dict[str, Any]:
    if type(value) is not dict and type(value) is not FrozenDict:
        if value is None or type(value) in (list, str, int, float, bool):
            raise PydanticCustomError("dict_type", "Input should be a JSON object")
        _check_json(value)  # not JSON at all: a strict-JSON error naming the value's type
    return cast(dict[str, Any], _check_json(value))


def _utf8_size(value: str) -> int:
    return len(value) if value.isascii() else len(value.encode("utf-8"))


def _check_indexed(value: str) -> str:
    size = _utf8_size(value)
    if size > MAX_INDEXED_TEXT_BYTES:
        raise PydanticCustomError(
            "indexed_text_too_long",
            "an indexed field holds at most {max} bytes of UTF-8 (this value has {size})",
            {"max": MAX_INDEXED_TEXT_BYTES, "size": size},
        )
    return value


_TIMESTAMP_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\Z", re.ASCII)
"""The JSON form of a timestamp, exactly: ``2026-01-02T03:04:05.678Z``."""


def _parse_timestamp(value: Any) -> datetime:
    if isinstance(value, str):
        # The JSON form is one spelling: UTC, milliseconds, "Z". Another spelling of
        # an instant (an offset, no or more fraction digits) is not that form.
        moment = None
        if _TIMESTAMP_TEXT.match(value):
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                moment = None
        if moment is None:
            raise PydanticCustomError(
                "timestamp",
                "Input should be an ISO 8601 UTC timestamp with milliseconds and Z "
                "(2026-01-02T03:04:05.678Z)",
            )
        return moment
    if type(value) is not datetime:
        raise PydanticCustomError("timestamp", "Input should be a datetime or ISO 8601 string")
    if value.tzinfo is None or value.utcoffset() is None:
        raise PydanticCustomError("timestamp", "timestamp must carry a UTC offset")
    try:
        return truncate_ms(value)
    except OverflowError:
        raise PydanticCustomError("timestamp", "timestamp is out of range in UTC") from None


def truncate_ms(moment: datetime) -> datetime:
    """Return ``moment`` in UTC, truncated to whole milliseconds: an exact
    ``datetime`` (not a subclass), ``fold`` 0, as decoding its JSON form gives."""
    if (
        type(moment) is datetime
        and moment.tzinfo is UTC
        and not moment.microsecond % 1000
        and not moment.fold
    ):
        return moment  # already so (the database's clock, read to the millisecond)
    m = moment.astimezone(UTC)
    ms = m.microsecond - m.microsecond % 1000
    return datetime(m.year, m.month, m.day, m.hour, m.minute, m.second, ms, tzinfo=UTC)


def format_timestamp(moment: datetime) -> str:
    """The JSON form of a timestamp: ``2026-01-02T03:04:05.678Z``."""
    # isoformat pads the year to four digits and ends in "+00:00" in UTC.
    return datetime.isoformat(truncate_ms(moment), timespec="milliseconds")[:-6] + "Z"


Id = Annotated[StrictStr, AfterValidator(_check_id)]
"""An opaque identifier: 1 to 1,024 characters of valid Unicode."""
Text = Annotated[StrictStr, AfterValidator(_check_text)]
IndexedId = Annotated[StrictStr, AfterValidator(_check_id), AfterValidator(_check_indexed)]
"""An id that list indexes hold (agent, parent thread id): at most 256 UTF-8 bytes."""
IndexedText = Annotated[StrictStr, AfterValidator(_check_text), AfterValidator(_check_indexed)]
"""Text that list indexes hold (category): at most 256 UTF-8 bytes."""
Json = Annotated[Any, AfterValidator(_check_json)]
JsonObject = Annotated[dict[str, Any], PlainValidator(_check_json_object)]
Timestamp = Annotated[
    datetime, PlainValidator(_parse_timestamp), PlainSerializer(format_timestamp, when_used="json")
]
Limit = Annotated[StrictInt, Field(ge=1, le=MAX_PAGE_SIZE)]

T = TypeVar("T")
Items = Annotated[list[T], AfterValidator(FrozenList)]
"""A list field of a model: held as a read-only list (:class:`~pai_storage.frozen.FrozenList`)."""

ListVisibility = Literal["visible", "hidden"]
Operation = Literal["send", "trigger", "regenerate", "resume"]
RunStatus = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]
Order = Literal["oldest", "newest"]


def _loc_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Render a pydantic location, dropping discriminator tags (found in ``data``)."""
    path = ""
    tag_skipped = False
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            data = data[part] if isinstance(data, list) and part < len(data) else None
            tag_skipped = False
            continue
        is_tag = isinstance(data, Mapping) and part in (data.get("type"), data.get("kind"))
        if is_tag and not tag_skipped:
            tag_skipped = True  # the tag pydantic adds for a discriminated union member
            continue
        path = f"{path}.{part}" if path else part
        data = data.get(part) if isinstance(data, Mapping) else None
        tag_skipped = False
    return path


_PLAIN = {
    "union_tag_not_found": "the '{tag}' field is missing (it says which kind this is)",
    "missing": "a required field is missing",
    "extra_forbidden": "an unknown field",
}
"""Plain words for pydantic's messages ("Unable to extract tag using discriminator")."""


def convert_validation_error(
    exc: ValidationError, what: str, data: Any = None, *, stored: bool = False
) -> ThreadStoreInvariantError:
    """Turn a pydantic ``ValidationError`` into the contract's typed error.

    A strict-JSON failure becomes :class:`ThreadStoreSerializationError`;
    anything else :class:`ThreadStoreInvariantError`. Input values are never
    echoed (they may hold personal data). For a ``stored`` record the path
    stops at the record's own fields: the keys inside its opaque JSON, and the
    name of a key the record should not have, are stored contents too.
    """
    errors = exc.errors(include_url=False, include_input=False)
    for err in errors:
        if err["type"] == "strict_json":
            ctx = err.get("ctx") or {}
            outer = _loc_path(err["loc"], data)
            inner = "" if stored else str(ctx.get("path", ""))
            if inner and outer and not inner.startswith("["):
                inner = "." + inner
            reason = ctx.get("reason", err["msg"]) if ctx else err["msg"]
            if stored and not ctx:
                reason = "not strict JSON"  # the message would carry the inner path
            return ThreadStoreSerializationError.at(f"{outer}{inner}", f"{reason} (in {what})")
    first = errors[0]
    if stored and first["type"] == "extra_forbidden":
        where = _loc_path(first["loc"][:-1], data)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        field = f"{where}: " if where else ""
        return ThreadStoreInvariantError(f"invalid {what}: {field}an unknown field{more}")
    ctx = first.get("ctx") or {}
    tag = str(ctx.get("discriminator", "type")).strip(chr(39))
    if first["type"] == "union_tag_invalid":
        first["msg"] = f"unknown {tag} (expected one of {ctx.get('expected_tags', '?')})"
    else:  # pydantic's wording, in plain words
        plain = _PLAIN.get(first["type"])
        first["msg"] = first["msg"] if plain is None else plain.format(tag=tag)
    where = _loc_path(first["loc"], data) or "<input>"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ThreadStoreInvariantError(f"invalid {what}: {where}: {first['msg']}{more}")
