"""The stored document shapes and their conversion to and from records.

Documents are flat: the record's JSON form sits at the top level, with the
provider's own keys beside it, all underscore-prefixed (``_id``,
``_schemaVersion``, ``_order`` on children, ``_nextOrder`` on roots).
Timestamps are native BSON dates at every depth; opaque JSON is stored as-is
(key order, ``$``/``.`` keys, ``1`` vs ``1.0`` all survive BSON), with one
escape: BSON keys cannot contain U+0000, so an opaque value holding such a key
is stored as its JSON text in a binary value of a user-defined subtype, which
no strict-JSON value can be confused with.

Reading is exact too. PyMongo turns every embedded document with a string
``$ref`` and an ``$id`` into a ``DBRef`` (reordering its keys and dropping a
null ``$db``), which would make such an opaque value unreadable. Whole
documents are therefore fetched as raw BSON and decoded by
:func:`decode_document`: the fast C decoder first, and, only when it meets such
an object, an exact decoder that never interprets ``$``-keys. No other object
shape is special to the BSON decoder (``$regex``, ``$binary``, ``$date`` and
the like only mean something in Extended JSON, which is never used here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import bson
from bson.binary import Binary
from bson.codec_options import CodecOptions, TypeDecoder, TypeRegistry
from bson.dbref import DBRef
from bson.errors import BSONError, InvalidBSON
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from pydantic import BaseModel

from pai_storage import (
    Message,
    QueuedItem,
    RunRecord,
    ThreadRecord,
    ThreadStoreInvariantError,
)
from pai_storage.backend import FAMILIES, FamilyName, FamilySpec

__all__ = [
    "CODEC_OPTIONS",
    "RAW_CODEC_OPTIONS",
    "SCHEMA_VERSION",
    "child_document",
    "decode_document",
    "parse_child",
    "parse_root",
    "root_document",
]

SCHEMA_VERSION = 1
JSON_SUBTYPE = 0x80
"""User-defined binary subtype holding the JSON text of an opaque value with a NUL key."""


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


class _DBRefShaped(InvalidBSON):
    """Internal: the fast decoder met an object PyMongo would turn into a ``DBRef``."""


class _DBRefDecoder(TypeDecoder):
    """Stops the fast decoder at a ``DBRef``: the document is decoded exactly instead."""

    bson_type = DBRef

    def transform_bson(self, value: Any) -> Any:
        raise _DBRefShaped("an object with $ref and $id keys")


_DECODERS = (_Int64Decoder(), _JsonTextDecoder())

CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict,
    tz_aware=True,
    type_registry=TypeRegistry([*_DECODERS, _DBRefDecoder()]),
)
"""Decoding of query results: plain dicts; an object shaped like a ``DBRef`` is an error."""

RAW_CODEC_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
"""Whole documents stay raw BSON until :func:`decode_document` decodes them."""

_EXACT_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument, tz_aware=True, type_registry=TypeRegistry(list(_DECODERS))
)


def _exact(value: Any) -> Any:
    if isinstance(value, RawBSONDocument):
        return {key: _exact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_exact(item) for item in value]
    return value


def decode_document(raw: RawBSONDocument | bytes) -> dict[str, Any]:
    """Decode one stored document so that every JSON value comes back exactly.

    Raises :class:`bson.errors.BSONError` or :class:`ValueError` for bytes that
    cannot be decoded (invalid UTF-8, a corrupt escaped value).
    """
    data = raw.raw if isinstance(raw, RawBSONDocument) else raw
    try:
        return bson.decode(data, codec_options=CODEC_OPTIONS)
    except _DBRefShaped:
        # Raw sub-documents are never interpreted: ``$ref``/``$id`` stay plain keys.
        doc: dict[str, Any] = _exact(bson.decode(data, codec_options=_EXACT_OPTIONS))
        return doc


def decode_or_invalid(raw: RawBSONDocument, what: str) -> dict[str, Any]:
    """:func:`decode_document`, with undecodable bytes an invalid stored ``what``."""
    try:
        return decode_document(raw)
    except (BSONError, ValueError) as exc:  # ValueError: UnicodeDecodeError and the like
        raise _invalid(
            what, f"the stored document cannot be decoded ({type(exc).__name__})"
        ) from None


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


_PART_OPAQUE = (
    "providerMetadata",
    "input",
    "output",
    "callProviderMetadata",
    "resultProviderMetadata",
    "data",
)
# The opaque JSON fields of each stored record (the part fields are per message part).
_OPAQUE: dict[str, tuple[str, ...]] = {
    "threads": ("metadata", "privateMetadata"),
    "messages": ("metadata",),
    "runs": ("metadata", "privateMetadata"),
    "queuedItems": ("input", "metadata"),
}


# --------------------------------------------------------------- writing


def _dump(record: BaseModel) -> dict[str, Any]:
    # Python mode keeps datetimes (BSON dates at every depth) and opaque JSON as-is.
    data: dict[str, Any] = record.model_dump(mode="python", by_alias=True)
    return data


def root_document(record: ThreadRecord, next_order: Mapping[FamilyName, int]) -> dict[str, Any]:
    """The stored root: the record's fields, ``_schemaVersion`` and ``_nextOrder``."""
    doc: dict[str, Any] = {"_schemaVersion": SCHEMA_VERSION}
    doc.update(_dump(record))
    _escape_keys(doc, _OPAQUE["threads"])
    doc["_nextOrder"] = {spec.name: int(next_order[spec.name]) for spec in FAMILIES}
    return doc


def child_document(
    spec: FamilySpec, scope_key: str, thread_id: str, order: int, record: BaseModel
) -> dict[str, Any]:
    """A stored child: scope, thread, ``_schemaVersion``, ``_order`` and the record."""
    doc: dict[str, Any] = {
        "_schemaVersion": SCHEMA_VERSION,
        "scopeKey": scope_key,
        "threadId": thread_id,
        "_order": order,
    }
    doc.update(_dump(record))
    _escape_keys(doc, _OPAQUE[spec.name])
    if spec.name == "messages":
        for part in doc["parts"]:
            _escape_keys(part, _PART_OPAQUE)
    return doc


# --------------------------------------------------------------- reading


def _invalid(what: str, reason: str) -> ThreadStoreInvariantError:
    return ThreadStoreInvariantError(f"invalid stored {what}: {reason}")


def parse_root(doc: Mapping[str, Any]) -> tuple[ThreadRecord, dict[FamilyName, int]]:
    """Validate a stored root strictly; returns the record and the order counters.

    Raises :class:`ThreadStoreInvariantError` (never echoing stored contents).
    """
    data = dict(doc)
    data.pop("_id", None)
    if data.pop("_schemaVersion", None) != SCHEMA_VERSION:
        raise _invalid("thread", "missing or unknown _schemaVersion")
    counters = data.pop("_nextOrder", None)
    if not isinstance(counters, dict) or set(counters) != {spec.name for spec in FAMILIES}:
        raise _invalid("thread", "missing or malformed _nextOrder")
    next_order: dict[FamilyName, int] = {}
    for spec in FAMILIES:
        value = counters[spec.name]
        if type(value) is not int or value < 1:
            raise _invalid("thread", "malformed _nextOrder")
        next_order[spec.name] = value
    try:
        record = ThreadRecord.model_validate(data)
    except ThreadStoreInvariantError as exc:
        raise _invalid("thread", str(exc)) from None
    return record, next_order


def parse_child(
    model: type[Message] | type[RunRecord] | type[QueuedItem], doc: Mapping[str, Any]
) -> tuple[int, Any]:
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
