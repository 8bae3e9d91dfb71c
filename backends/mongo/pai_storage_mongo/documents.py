"""The stored document shapes and their conversion to and from records.

Documents are flat: the record's JSON form sits at the top level, with the
provider's own keys beside it, all underscore-prefixed (``_id``,
``_schemaVersion``, ``_order`` on children, ``_nextOrder`` on roots).
Timestamps are native BSON dates at every depth; opaque JSON is stored as-is
(key order, ``$``/``.`` keys, ``1`` vs ``1.0`` all survive BSON), with one
escape: BSON keys cannot contain U+0000, so an opaque value holding such a key
is stored as its JSON text in a binary value of a user-defined subtype, which
no strict-JSON value can be confused with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from bson.binary import Binary
from bson.codec_options import CodecOptions, TypeDecoder, TypeRegistry
from bson.errors import InvalidBSON
from bson.int64 import Int64
from pydantic import BaseModel

from pai_storage import (
    Message,
    QueuedItem,
    RunRecord,
    ThreadRecord,
    ThreadStoreInvariantError,
)

__all__ = [
    "CHILD_ID_FIELD",
    "CODEC_OPTIONS",
    "FAMILY_NAMES",
    "SCHEMA_VERSION",
    "child_document",
    "parse_child",
    "parse_root",
    "root_document",
]

SCHEMA_VERSION = 1
JSON_SUBTYPE = 0x80
"""User-defined binary subtype holding the JSON text of an opaque value with a NUL key."""

FAMILY_NAMES = ("messages", "runs", "queuedItems")
CHILD_ID_FIELD = {"messages": "messageId", "runs": "runId", "queuedItems": "queueItemId"}

M = TypeVar("M", Message, RunRecord, QueuedItem)


class _Int64Decoder(TypeDecoder):
    """BSON int64 comes back as a plain ``int`` (strict JSON knows no ``Int64``)."""

    bson_type = Int64

    def transform_bson(self, value: Any) -> Any:
        return int(value)


class _JsonTextDecoder(TypeDecoder):
    """The escaped opaque value (see module docstring) comes back parsed."""

    bson_type = Binary

    def transform_bson(self, value: Any) -> Any:
        if isinstance(value, Binary) and value.subtype == JSON_SUBTYPE:
            try:
                return json.loads(bytes(value).decode("utf-8"))
            except ValueError:  # never echo the stored bytes
                raise InvalidBSON("an escaped opaque JSON value is corrupt") from None
        return value


CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict,
    tz_aware=True,
    type_registry=TypeRegistry([_Int64Decoder(), _JsonTextDecoder()]),
)


# --------------------------------------------------------------- opaque JSON


def _has_nul_key(value: Any) -> bool:
    if type(value) is dict:
        return any("\x00" in key or _has_nul_key(v) for key, v in value.items())
    if type(value) is list:
        return any(_has_nul_key(v) for v in value)
    return False


def _opaque(value: Any) -> Any:
    """An opaque JSON value as stored: itself, or escaped when a key holds U+0000."""
    if type(value) not in (dict, list):
        return value
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if "\\u0000" in text and _has_nul_key(value):
        return Binary(text.encode("utf-8"), JSON_SUBTYPE)
    return value


def _escape_keys(doc: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in doc:
            doc[key] = _opaque(doc[key])


def _escape_parts(parts: list[dict[str, Any]]) -> None:
    for part in parts:
        _escape_keys(
            part,
            (
                "providerMetadata",
                "input",
                "output",
                "callProviderMetadata",
                "resultProviderMetadata",
                "data",
            ),
        )


# --------------------------------------------------------------- writing


def _dump(record: BaseModel) -> dict[str, Any]:
    # Python mode keeps datetimes (BSON dates at every depth) and opaque JSON as-is.
    data: dict[str, Any] = record.model_dump(mode="python", by_alias=True)
    return data


def root_document(record: ThreadRecord, next_order: Mapping[str, int]) -> dict[str, Any]:
    """The stored root: the record's fields, ``_schemaVersion`` and ``_nextOrder``."""
    doc: dict[str, Any] = {"_schemaVersion": SCHEMA_VERSION}
    doc.update(_dump(record))
    _escape_keys(doc, ("metadata", "privateMetadata"))
    doc["_nextOrder"] = {name: int(next_order[name]) for name in FAMILY_NAMES}
    return doc


def child_document(
    family: str, scope_key: str, thread_id: str, order: int, record: BaseModel
) -> dict[str, Any]:
    """A stored child: scope, thread, ``_schemaVersion``, ``_order`` and the record."""
    doc: dict[str, Any] = {
        "_schemaVersion": SCHEMA_VERSION,
        "scopeKey": scope_key,
        "threadId": thread_id,
        "_order": order,
    }
    doc.update(_dump(record))
    if family == "messages":
        _escape_keys(doc, ("metadata",))
        _escape_parts(doc["parts"])
    elif family == "runs":
        _escape_keys(doc, ("metadata", "privateMetadata"))
    else:
        _escape_keys(doc, ("input", "metadata"))
    return doc


# --------------------------------------------------------------- reading


def _invalid(what: str, reason: str) -> ThreadStoreInvariantError:
    return ThreadStoreInvariantError(f"invalid stored {what}: {reason}")


def parse_root(doc: Mapping[str, Any]) -> tuple[ThreadRecord, dict[str, int]]:
    """Validate a stored root strictly; returns the record and the order counters.

    Raises :class:`ThreadStoreInvariantError` (never echoing stored contents).
    """
    data = dict(doc)
    data.pop("_id", None)
    if data.pop("_schemaVersion", None) != SCHEMA_VERSION:
        raise _invalid("thread", "missing or unknown _schemaVersion")
    counters = data.pop("_nextOrder", None)
    if not isinstance(counters, dict) or set(counters) != set(FAMILY_NAMES):
        raise _invalid("thread", "missing or malformed _nextOrder")
    next_order: dict[str, int] = {}
    for name in FAMILY_NAMES:
        value = counters[name]
        if type(value) is not int or value < 1:
            raise _invalid("thread", "malformed _nextOrder")
        next_order[name] = value
    try:
        record = ThreadRecord.model_validate(data)
    except ThreadStoreInvariantError as exc:
        raise _invalid("thread", str(exc)) from None
    return record, next_order


def parse_child(model: type[M], doc: Mapping[str, Any]) -> tuple[int, M]:
    """Validate a stored child strictly; returns its ``_order`` and the record."""
    data = dict(doc)
    data.pop("_id", None)
    data.pop("scopeKey", None)
    data.pop("threadId", None)
    what = model.__name__
    if data.pop("_schemaVersion", None) != SCHEMA_VERSION:
        raise _invalid(what, "missing or unknown _schemaVersion")
    order = data.pop("_order", None)
    if type(order) is not int or order < 1:
        raise _invalid(what, "missing or malformed _order")
    try:
        record = model.model_validate(data)
    except ThreadStoreInvariantError as exc:
        raise _invalid(what, str(exc)) from None
    return order, record
