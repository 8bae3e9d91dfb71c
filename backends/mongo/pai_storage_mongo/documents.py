"""The stored document shapes and their conversion to and from records.

Documents are flat: the record's JSON form sits at the top level, with the
provider's own keys beside it, all underscore-prefixed (``_id``,
``_schemaVersion``, ``_order`` on children, ``_nextOrder`` on roots).
Timestamps are native BSON dates at every depth; opaque JSON is stored as-is
(key order, ``$``/``.`` keys, ``1`` vs ``1.0`` all survive BSON), with one
escape: BSON keys cannot contain U+0000, so an opaque value holding such a key
is stored as its JSON text in a binary value of a user-defined subtype, which
no strict-JSON value can be confused with.

Roots written by commits carry one more provider key, ``_facts``: the
relationship facts of the thread's open runs and its last message, kept by
every commit so that the next one can check the relationship rules without
querying the children (see :class:`~pai_storage.root_facts.RootFacts`). A root without ``_facts`` is
read like any other (its next commit queries the children and writes them).
Every document is ``_schemaVersion: 1``.

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
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import bson
from bson.binary import Binary
from bson.codec_options import CodecOptions, TypeDecoder, TypeRegistry
from bson.dbref import DBRef
from bson.errors import BSONError, InvalidBSON
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from pydantic import BaseModel

from pai_storage import Message, QueuedItem, RunRecord, ThreadRecord, codec
from pai_storage.backend import (
    FAMILIES,
    FamilyName,
    FamilySpec,
)
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.frozen import FrozenDict
from pai_storage.models import StoreModel
from pai_storage.root_facts import RootFacts, facts_from_document
from pai_storage.strict_json import MAX_JSON_NODES

M = TypeVar("M", bound=StoreModel)
K = TypeVar("K")

__all__ = [
    "CODEC_OPTIONS",
    "PLAIN_CODEC_OPTIONS",
    "RAW_CODEC_OPTIONS",
    "SCHEMA_VERSION",
    "child_document",
    "decode_document",
    "decoded",
    "parse_child",
    "parse_root",
    "read_child",
    "read_root",
    "root_document",
    "root_facts",
    "stored_count",
]

SCHEMA_VERSION = 1
"""The ``_schemaVersion`` of every document this backend writes."""
_READ_ROOT_VERSIONS = (SCHEMA_VERSION, 2)
"""Root versions read: development builds wrote roots carrying ``_facts`` as 2,
in the same layout."""
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
    tzinfo=UTC,  # dates as the models hold them: no conversion when validated
    type_registry=TypeRegistry([*_DECODERS, _DBRefDecoder()]),
)
"""Decoding of query results: plain dicts; an object shaped like a ``DBRef`` is an error."""

PLAIN_CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict, tz_aware=True, tzinfo=UTC
)
"""The codec of ``findAndModify`` replies: plain dicts, no type decoders.

With type decoders PyMongo decodes only the reply's ``value`` and leaves every
other field raw BSON, and its own handling of a ``writeConcernError`` (the
answer of a primary stepping down while a write waits for a majority) then
fails on it instead of retrying the write. The returned document gets the
backend's decoding afterwards (:func:`decoded`)."""

_UNDECODED = frozenset({str, int, float, bool, bytes, datetime, type(None)})
"""Python types of decoded BSON values that the backend's type decoders leave alone
(exact types: ``Int64`` is an ``int`` subclass and is decoded)."""


def stored_count(value: object, *, low: int = 1) -> bool:
    """Whether a stored version, ``ttlMs`` (``low`` 1) or list length (``low`` 0) is
    what this backend writes: a 64-bit integer from ``low`` up, never a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2**63


def decoded(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """A document read with :data:`PLAIN_CODEC_OPTIONS`, decoded as every other result is.

    Int64 as ``int``, and an object shaped like a DBRef refused
    (:data:`CODEC_OPTIONS`). Top-level values no type decoder touches
    (strings, dates, ...) are kept as they are, so a large value is not
    copied; the others are encoded and decoded again. Run it inside the
    operation's error mapping (``with holder.errors(...)``).

    A ``findAndModify`` the driver retried is answered with the server's record
    of the first attempt: the whole document, the projection not applied. So
    read only stored fields from the result, never a field the projection
    computes (extra fields are ignored).
    """
    if doc is None:
        return None
    rest = {key: value for key, value in doc.items() if type(value) not in _UNDECODED}
    if rest:
        doc.update(bson.decode(bson.encode(rest), codec_options=CODEC_OPTIONS))
    return doc


RAW_CODEC_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
"""Whole documents stay raw BSON until :func:`decode_document` decodes them."""

_EXACT_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument,
    tz_aware=True,
    tzinfo=UTC,
    type_registry=TypeRegistry(list(_DECODERS)),
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


def root_document(
    record: ThreadRecord,
    next_order: Mapping[FamilyName, int],
    facts: RootFacts | None = None,
) -> dict[str, Any]:
    """The stored root: the record's fields, ``_schemaVersion``, ``_nextOrder`` and,
    when given, ``_facts`` (a root without them is valid too)."""
    doc: dict[str, Any] = {"_schemaVersion": SCHEMA_VERSION}
    doc.update(_dump(record))
    _escape_keys(doc, _OPAQUE["threads"])
    doc["_nextOrder"] = {spec.name: int(next_order[spec.name]) for spec in FAMILIES}
    if facts is not None:
        doc["_facts"] = facts.document()
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


def _validate(model: type[M], data: dict[str, Any], size: int | None) -> M:
    # Timestamps are BSON dates: a string there is invalid, whatever it spells.
    # An unknown size takes the full check, which counts the values itself.
    size = MAX_JSON_NODES if size is None else size
    return codec.decode_document(model, data, size, dates=True)


_FAMILY_NAMES = frozenset(spec.name for spec in FAMILIES)


def parse_root(
    doc: Mapping[str, Any], size: int | None = None
) -> tuple[ThreadRecord, dict[FamilyName, int]]:
    """Validate a stored root strictly; returns the record and the order counters.

    ``size`` is the length of the BSON document ``doc`` was decoded from, when
    known (see :func:`pai_storage.codec.decode_document`).
    Raises :class:`ThreadStoreInvariantError` (never echoing stored contents).
    """
    data = dict(doc)
    next_order = _root_keys(data)
    try:
        record = _validate(ThreadRecord, data, size)
    except ThreadStoreInvariantError as exc:
        raise _invalid("thread", str(exc)) from None
    return record, next_order


def _root_keys(data: dict[str, Any]) -> dict[FamilyName, int]:
    """Pop and check a root's provider keys; returns its order counters."""
    data.pop("_id", None)
    version = data.pop("_schemaVersion", None)
    facts = data.pop("_facts", None)
    if not _is_int(version) or version not in _READ_ROOT_VERSIONS:
        raise _invalid("thread", "missing or unknown _schemaVersion")
    if facts is not None and type(facts) is not dict:
        raise _invalid("thread", "malformed _facts")
    counters = data.pop("_nextOrder", None)
    if not isinstance(counters, dict) or counters.keys() != _FAMILY_NAMES:
        raise _invalid("thread", "missing or malformed _nextOrder")
    next_order: dict[FamilyName, int] = {}
    for name, value in counters.items():
        if not _is_int(value) or value < 1:
            raise _invalid("thread", "malformed _nextOrder")
        next_order[name] = int(value)
    # Read-only: the codec's cache shares it with every later read of the root.
    return cast(dict[FamilyName, int], FrozenDict(cast(dict[str, int], next_order)))


def _is_int(value: object) -> bool:
    # An integer as a decoder makes it (``int``, or BSON's ``Int64`` from a plain
    # decoder), never a bool.
    return isinstance(value, int) and type(value) is not bool


def parse_child(
    model: type[Message] | type[RunRecord] | type[QueuedItem],
    doc: Mapping[str, Any],
    size: int | None = None,
) -> tuple[int, Any]:
    """Validate a stored child strictly; returns its ``_order`` and the record
    (``size`` as for :func:`parse_root`)."""
    data = dict(doc)
    what = model.__name__
    order = _child_keys(data, what)
    try:
        record = _validate(model, data, size)
    except ThreadStoreInvariantError as exc:
        raise _invalid(what, str(exc)) from None
    return order, record


def _child_keys(data: dict[str, Any], what: str) -> int:
    """Pop and check a child's provider keys; returns its ``_order``."""
    data.pop("_id", None)
    data.pop("scopeKey", None)
    data.pop("threadId", None)
    version = data.pop("_schemaVersion", None)
    if not _is_int(version) or version != SCHEMA_VERSION:  # not True, not 1.0
        raise _invalid(what, "missing or unknown _schemaVersion")
    order = data.pop("_order", None)
    if not _is_int(order) or order < 1:
        raise _invalid(what, "missing or malformed _order")
    return int(order)


# Plainly decoded BSON (PyMongo's C decoder with its default options: naive UTC
# dates, Int64 kept, no type decoders) costs about half of the exact decoding
# above. Records are read that way first; whatever that path does not accept
# (a check that fails, a value only the exact decoder interprets, bytes that do
# not decode) is decoded exactly and read as before, which decides.


def read_root(raw: RawBSONDocument) -> tuple[ThreadRecord, dict[FamilyName, int]]:
    """:func:`parse_root` of a raw stored root: plainly decoded first, exactly
    when that does not serve."""
    plain = _read_plainly(raw, ThreadRecord, _root_keys)
    if plain is not None:
        return plain
    return parse_root(decode_or_invalid(raw, "thread"), len(raw.raw))


def read_child(
    model: type[Message] | type[RunRecord] | type[QueuedItem], raw: RawBSONDocument
) -> tuple[int, Any]:
    """:func:`parse_child` of a raw stored child, as :func:`read_root` reads a root."""
    what = model.__name__
    plain = _read_plainly(raw, model, _child_keys, what)
    if plain is not None:
        record, order = plain
        return order, record
    return parse_child(model, decode_or_invalid(raw, what), len(raw.raw))


def _read_plainly(
    raw: RawBSONDocument, model: type[M], keys: Callable[..., K], *args: Any
) -> tuple[M, K] | None:
    """The record of ``raw`` plainly decoded, with what ``keys(data, *args)`` took
    of its provider keys; ``None`` when the exact path must decide.

    Documents read before come from the codec's cache, by their exact bytes.
    """
    kind = (model, keys)
    stored = raw.raw if type(raw.raw) is bytes else bytes(raw.raw)
    found: tuple[M, K] | None = codec.cache.get(kind, stored)
    if found is not None:
        return found
    try:
        data = bson.decode(stored)
        taken = keys(data, *args)
    except Exception:  # anything at all: the exact path decides
        return None
    record = codec.decode_plain_bson(model, data, len(stored))
    if record is None:
        return None
    codec.cache.put(kind, stored, (record, taken))
    return record, taken


# --------------------------------------------------------------- relationship facts


def root_facts(doc: Mapping[str, Any]) -> RootFacts | None:
    """The ``_facts`` of a decoded root, or ``None`` for a root without them.

    Raises :class:`ThreadStoreInvariantError` when they are malformed.
    """
    value = doc.get("_facts")
    if value is None:
        return None
    try:
        return facts_from_document(value)
    except TypeError:
        raise _invalid("thread", "malformed _facts") from None
