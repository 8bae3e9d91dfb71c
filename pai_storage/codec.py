"""The codec: stored text and documents into records, records into stored text.

A backend reads records only through :func:`decode` (stored JSON text),
:func:`decode_many` (a page of it), :func:`decode_document` (a decoded BSON or
JSON document) and :func:`decode_plain_bson`, and writes them through
:func:`encode`. Records are deeply immutable (:mod:`pai_storage.frozen`), so a
record decoded once is shared by every later read of the same stored data:
:data:`cache` keeps the records decoded last, by ``(model, exact stored
data)``, and hands out the record itself, never a copy.

Stored data is validated by a second validator of each record model, compiled
here once: every field check but the timestamps' becomes a pydantic-core
constraint (about twice as fast as the model's own validator). Whatever it
refuses goes through the model's own validator, which decides and names the
problem, with a path that stops at the record's own fields (stored opaque
JSON is never quoted; see :func:`~pai_storage.fields.convert_validation_error`).
"""

from __future__ import annotations

import functools
import json
import math
import operator
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar, cast, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError, SchemaSerializer, SchemaValidator

from .errors import ThreadStoreInvariantError
from .fields import (
    MAX_ID_LENGTH,
    _check_id,
    _check_json,
    _check_json_object,
    _check_text,
    _parse_timestamp,
    convert_validation_error,
)
from .frozen import freeze
from .strict_json import INT64_MAX, MAX_JSON_DEPTH, MAX_JSON_NODES

__all__ = [
    "STRICT_JSON_TEXT",
    "RecordCache",
    "cache",
    "decode",
    "decode_document",
    "decode_many",
    "decode_plain_bson",
    "encode",
    "json_form",
    "json_text",
    "prepare",
]

M = TypeVar("M", bound=BaseModel)


# ---------------------------------------------------------------- validators of stored data


def _check_float(value: float) -> float:
    # pydantic-core's float schema also takes JSON integers, so an integer
    # outside the int64 range would arrive here as a float: refuse every float
    # that large (legitimate ones are rare and take the full check instead).
    if (value == 0.0 and math.copysign(1.0, value) < 0) or not -_TWO_63 < value < _TWO_63:
        raise PydanticCustomError("strict_json", "negative zero or beyond 2**63")
    return value


_TWO_63 = float(2**63)


def _json_definitions() -> list[dict[str, Any]]:
    """pydantic-core definitions ``json0`` .. ``json64`` of a strict-JSON value from JSON text.

    The same checks as :func:`~pai_storage.strict_json.check_json` for a value
    pydantic's JSON parser produced (which never holds a lone surrogate, and
    holds fewer values than the text has characters): integers in the signed
    64-bit range, finite floats other than ``-0.0``, at most
    ``MAX_JSON_DEPTH`` nested containers (``jsonN`` is a value at depth N:
    the depth limit is part of the schema).
    """
    # Tried left to right, most frequent kinds first: an integer is tried as
    # one before it could be taken as a float.
    scalars: list[dict[str, Any]] = [
        {"type": "int", "strict": True, "ge": -INT64_MAX - 1, "le": INT64_MAX},
        {
            "type": "function-after",
            "function": {"type": "no-info", "function": _check_float},
            "schema": {"type": "float", "strict": True, "allow_inf_nan": False},
        },
        {"type": "bool", "strict": True},
        {"type": "none"},
    ]
    definitions: list[dict[str, Any]] = []
    for depth in range(MAX_JSON_DEPTH + 1):
        choices: list[dict[str, Any]] = [{"type": "str", "strict": True}]
        if depth < MAX_JSON_DEPTH:
            inner = {"type": "definition-ref", "schema_ref": f"json{depth + 1}"}
            choices.append(
                {
                    "type": "dict",
                    "keys_schema": {"type": "str"},
                    "values_schema": inner,
                    "strict": True,
                }
            )
            choices.append({"type": "list", "items_schema": inner, "strict": True})
        choices.extend(scalars)
        definitions.append(
            {"type": "union", "choices": choices, "mode": "left_to_right", "ref": f"json{depth}"}
        )
    return definitions


_JSON_VALUE = {"type": "definition-ref", "schema_ref": "json0"}
_JSON_OBJECT = {
    "type": "dict",
    "keys_schema": {"type": "str"},
    "values_schema": {"type": "definition-ref", "schema_ref": "json1"},
    "strict": True,
}

STRICT_JSON_TEXT = SchemaValidator(
    {"type": "definitions", "schema": _JSON_VALUE, "definitions": _json_definitions()}
)
"""Decodes JSON text (``validate_json``) only when it holds nothing but strict JSON.

A ``ValueError`` otherwise, and also for a float beyond 2**63 (or -2**63): callers
fall back to :func:`~pai_storage.strict_json.check_json` for those.
"""


def _stored_timestamp(value: Any) -> datetime:
    # A datetime in UTC of whole milliseconds (what a BSON decoder makes) is
    # returned as it is; anything else takes the full check.
    if type(value) is datetime and value.tzinfo is UTC and not value.microsecond % 1000:
        return value
    return _parse_timestamp(value)


def _date(value: Any) -> datetime:
    # A decoded document's timestamp as a BSON decoder makes it: a datetime in UTC
    # of whole milliseconds, returned as it is. Text is refused here (a JSON
    # document takes the full check, which parses it).
    if type(value) is datetime and value.tzinfo is UTC and not value.microsecond % 1000:
        return value
    if type(value) is not datetime:
        raise PydanticCustomError("timestamp", "Input should be a datetime")
    return _parse_timestamp(value)


def _plain_bson_date(value: Any) -> datetime:
    # A plain BSON decoder's date: naive, in UTC, whole milliseconds. Anything
    # else is left to the exact path (a plain decoder never makes it).
    if type(value) is datetime and value.tzinfo is None and not value.microsecond % 1000:
        return value.replace(tzinfo=UTC)
    raise PydanticCustomError("timestamp", "Input should be a naive BSON date")


def _date_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The JSON paths of every timestamp of ``model``, nested records included."""
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        key = (*prefix, field.alias or name)
        kinds = [
            get_args(kind)[0] if get_origin(kind) is Annotated else kind
            for kind in (get_args(field.annotation) or (field.annotation,))
        ]
        if datetime in kinds:
            paths.append(key)
        for kind in kinds:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                paths.extend(_date_paths(kind, key))
    return paths


def _refuse_text_dates(model: type[BaseModel], data: Any) -> None:
    """Raise unless every timestamp of a BSON-decoded ``data`` is a date (or absent)."""
    paths = _DATE_PATHS.get(model)
    if paths is None:
        paths = _DATE_PATHS[model] = _date_paths(model)
    for path in paths:
        value = data
        for key in path:
            value = value.get(key) if type(value) is dict else None
        if value is not None and type(value) is not datetime:
            raise ThreadStoreInvariantError(
                f"invalid {model.__name__}: {'.'.join(path)}: a stored timestamp must be a date"
            )


_DATE_PATHS: dict[type, list[tuple[str, ...]]] = {}


def _stored_schema(node: Any) -> Any:
    """A copy of a model's core schema for validating stored JSON text.

    The Python-level field checks become pydantic-core constraints with the
    same meaning for JSON text (pydantic's JSON parser never yields a lone
    surrogate): ids are strict strings of 1 to 1,024 characters, text is a
    strict string, opaque values and JSON objects follow the strict-JSON
    definitions of :func:`_json_definitions`. Timestamps keep a Python check,
    with a shortcut for the form stores write. Every other schema (models,
    unions, literals, limits) is kept as it is.
    """
    if isinstance(node, list):
        return [_stored_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in ("function-after", "function-plain"):
        function = node["function"]["function"]
        if function is _check_id:
            return {"type": "str", "strict": True, "min_length": 1, "max_length": MAX_ID_LENGTH}
        if function is _check_text:
            return _stored_schema(node["schema"])
        if function is _check_json:
            return _frozen(_JSON_VALUE)
        if function is _check_json_object:
            return _frozen(_JSON_OBJECT)
        if function is _parse_timestamp:
            return {
                "type": "function-plain",
                "function": {"type": "no-info", "function": _stored_timestamp},
            }
    return {key: _stored_schema(value) for key, value in node.items()}


def _model_classes(node: Any, found: dict[int, type[BaseModel]]) -> dict[int, type[BaseModel]]:
    if isinstance(node, list):
        for item in node:
            _model_classes(item, found)
    elif isinstance(node, dict):
        if node.get("type") == "model":
            found[id(node["cls"])] = node["cls"]
        for value in node.values():
            _model_classes(value, found)
    return found


def _stored_validator(
    model: type[BaseModel], decoded: bool = False, *, plain_bson: bool = False
) -> SchemaValidator:
    """Compile :func:`_stored_schema` of ``model`` (for JSON text, or with
    :func:`_decoded_schema` for decoded documents, and :func:`_plain_bson_schema`
    for plainly decoded BSON) into its own validator.

    pydantic-core reuses a finished model's own validator for every nested
    model it meets while compiling a schema; each model class is marked
    unfinished for the moment of compiling (at import time, under the import
    lock) so the copy's nested models are compiled from the copy.
    """
    schema = {
        "type": "definitions",
        "schema": _stored_schema(model.__pydantic_core_schema__),
        "definitions": _json_definitions(),
    }
    if decoded:
        schema = _decoded_schema(schema)
    if plain_bson:
        schema = _plain_bson_schema(schema)
    classes = list(_model_classes(schema, {}).values())
    for cls in classes:
        cls.__pydantic_complete__ = False
    try:
        return SchemaValidator(schema)
    finally:
        for cls in classes:
            cls.__pydantic_complete__ = True


_UNICODE_CHECKED = 2**62
"""A length bound no string reaches: with any length bound, pydantic-core reads a
Python string as Unicode and refuses one holding a lone surrogate."""


def _decoded_schema(node: Any) -> Any:
    """A copy of a stored-text schema (:func:`_stored_schema`) for decoded documents.

    The same checks in Python mode, where a string may hold a lone surrogate
    (a JSON decoder turns ``"\\ud800"`` into one): every string, dictionary
    keys included, is strict and length-bounded, so pydantic-core refuses it.
    A timestamp must be a ``datetime`` (:func:`_date`): text takes the full
    check.
    """
    if isinstance(node, list):
        return [_decoded_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "function-plain" and node["function"]["function"] is _stored_timestamp:
        return {"type": "function-plain", "function": {"type": "no-info", "function": _date}}
    copied = {key: _decoded_schema(value) for key, value in node.items()}
    if copied.get("type") == "str":
        copied["strict"] = True
        copied.setdefault("max_length", _UNICODE_CHECKED)
    return copied


def _plain_bson_schema(node: Any) -> Any:
    """A copy of a decoded-document schema (:func:`_decoded_schema`) whose dates
    are those of a plain BSON decoder (:func:`_plain_bson_date`)."""
    if isinstance(node, list):
        return [_plain_bson_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "function-plain" and node["function"]["function"] is _date:
        return {
            "type": "function-plain",
            "function": {"type": "no-info", "function": _plain_bson_date},
        }
    return {key: _plain_bson_schema(value) for key, value in node.items()}


_is_none = functools.partial(operator.is_, None)
"""Whether a value is ``None``: a C call, which pydantic-core makes for each
optional field it serializes (a Python function would cost a frame each)."""


def _json_form_schema(node: Any) -> Any:
    """A copy of a model's core schema whose serializer omits absent fields itself.

    The models' ``_omit_absent`` wrap serializer is a Python call per nested
    model; in the copy a field the JSON form omits when ``None``
    (:attr:`JsonShape.when_not_none`) is left out by pydantic-core
    (``serialization_exclude_if``). A model with fields omitted when unset
    (:attr:`JsonShape.when_set`) keeps its wrap serializer for them.
    """
    if isinstance(node, list):
        return [_json_form_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    copied = {key: _json_form_schema(value) for key, value in node.items()}
    cls: Any = node.get("cls")
    if node.get("type") == "model" and hasattr(cls, "_json_optional"):  # a StoreModel
        shape = json_shape(cls)
        if not shape.when_set:
            copied.pop("serialization", None)
        inner = copied["schema"]
        while inner["type"] != "model-fields":  # under the model's own validators
            inner = inner["schema"]
        fields = inner["fields"]
        for name, _ in shape.when_not_none:
            fields[name]["serialization_exclude_if"] = _is_none
    return copied


_JSON_FORMS: dict[type, SchemaSerializer] = {}


def _json_form(cls: type[BaseModel]) -> SchemaSerializer:
    """The serializer of ``cls``'s JSON form (:func:`_json_form_schema`), compiled once.

    Unlike validators, pydantic-core compiles every nested model's serializer
    from the schema it is given, so the copy needs nothing more.
    """
    serializer = _JSON_FORMS.get(cls)
    if serializer is None:  # racing threads compile equal serializers: either one is kept
        schema = _json_form_schema(cls.__pydantic_core_schema__)
        serializer = _JSON_FORMS[cls] = SchemaSerializer(schema)
    return serializer


def _frozen(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, its value made read-only (:func:`~pai_storage.frozen.freeze`)."""
    return {
        "type": "function-after",
        "function": {"type": "no-info", "function": freeze},
        "schema": schema,
    }


# ---------------------------------------------------------------- the JSON form


def json_form(record: BaseModel) -> dict[str, Any]:
    """The JSON form of a model (a fresh ``dict``): ``model_dump(mode="json",
    by_alias=True)``, about twice as fast."""
    form: dict[str, Any] = _json_form(type(record)).to_python(record, mode="json", by_alias=True)
    return form


def json_text(record: BaseModel) -> str:
    """The JSON form of a record as compact text."""
    return _json_form(type(record)).to_json(record, by_alias=True).decode()


def encode(record: BaseModel) -> str:
    """A record a store writes, as the text it stores (:func:`json_text`).

    The record, validated or built by the store from validated values, is
    kept in :data:`cache` as the record of that text when decoding the text
    would give the record itself (:func:`_as_decoded`): the first read of
    what a store just wrote decodes nothing.
    """
    text = json_text(record)
    if _as_decoded(record):
        cache.put(type(record), text, record)
    return text


def _as_decoded(record: BaseModel) -> bool:
    """Whether decoding ``record``'s JSON form gives ``record`` itself: whether
    every model in it has set exactly the fields that form carries
    (:func:`json_shape`).

    Its values are what decoding gives already: validated (exact types,
    read-only containers), every timestamp an exact UTC ``datetime`` to the
    millisecond (:func:`~pai_storage.fields.truncate_ms`). What validation
    leaves open is which fields are set (it keeps a given model's own), and
    decoding sets exactly the fields the form carries; a field omitted when
    unset must then be ``None``, as decoding gives it. A record built by the
    store (:meth:`~pai_storage.models.StoreModel.trusted`) is so; a value a
    caller validated may not be (an optional field given as ``None``, a
    default not given).
    """
    shape = json_shape(type(record))
    fields_set = record.__pydantic_fields_set__
    values = record.__dict__
    carried = set(shape.required)
    for name, _ in shape.when_not_none:
        if values[name] is not None:
            carried.add(name)
    for name, _ in shape.when_set:
        if name in fields_set:
            carried.add(name)
        elif values[name] is not None:  # left out of the JSON form: decoded as None
            return False
    if type(fields_set) is not set or fields_set != carried:  # a frozenset would refuse model_copy
        return False
    for name in shape.nested:
        value = values[name]
        if isinstance(value, BaseModel):
            if not _as_decoded(value):
                return False
        elif isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, BaseModel) and not _as_decoded(item):
                    return False
    return True


@dataclass(frozen=True, slots=True)
class JsonShape:
    """Which fields of a model class its JSON form carries (:func:`json_shape`).

    Every field in ``required``; an optional field in ``when_not_none`` unless
    it is ``None``; one whose JSON value may itself be null (in the model's
    ``_json_optional``, a tool call's ``output``), in ``when_set``, when it is
    set. Both as ``(name, alias)``. ``nested``: the fields that may hold a model.
    """

    required: frozenset[str]
    when_not_none: tuple[tuple[str, str | None], ...]
    when_set: tuple[tuple[str, str | None], ...]
    nested: tuple[str, ...]


def json_shape(cls: type[BaseModel]) -> JsonShape:
    """The :class:`JsonShape` of ``cls``, worked out once. The one place that
    says which fields a JSON form carries: the serializers
    (:func:`_json_form_schema`, ``StoreModel._omit_absent``), the store's own
    models (``StoreModel.trusted``) and :func:`encode` follow it. The JSON form
    of a model that is not a ``StoreModel`` carries every field (``None`` as
    ``null``)."""
    shape = _SHAPES.get(cls)
    if shape is None:  # racing threads work out equal shapes: either one is kept
        fields = cls.model_fields
        store_model = hasattr(cls, "_json_optional")
        when_set: frozenset[str] = getattr(cls, "_json_optional", frozenset())
        optional = [
            (name, field.alias)
            for name, field in fields.items()
            if store_model and not field.is_required()
        ]
        omitted = {name for name, _ in optional}
        shape = _SHAPES[cls] = JsonShape(
            required=frozenset(name for name in fields if name not in omitted),
            when_not_none=tuple(pair for pair in optional if pair[0] not in when_set),
            when_set=tuple(pair for pair in optional if pair[0] in when_set),
            nested=tuple(name for name, field in fields.items() if _holds_model(field.annotation)),
        )
    return shape


def _holds_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(arg) for arg in get_args(annotation))


_SHAPES: dict[type, JsonShape] = {}


# ---------------------------------------------------------------- the cache


class RecordCache:
    """Values decoded from stored data, by ``(kind, exact data)``; shared, never copied.

    At most ``entries`` values, decoded from at most ``size`` characters (or
    bytes) of stored data in all, none from data longer than ``size // 64``;
    the oldest go first. Only ``str`` and ``bytes`` data is kept. A value put
    here must be immutable: every reader gets the value itself.
    """

    def __init__(self, *, entries: int, size: int) -> None:
        self._values: OrderedDict[tuple[Hashable, str | bytes], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._used = 0
        self._entries = self._size = self._largest = 0
        self.resize(entries=entries, size=size)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def limits(self) -> tuple[int, int]:
        """``(entries, size)`` as last given to :meth:`resize`."""
        return self._entries, self._size

    def resize(self, *, entries: int, size: int) -> None:
        """Change the bounds (``0`` keeps nothing); forgets every value."""
        for name, value in (("entries", entries), ("size", size)):
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an integer >= 0")
        with self._lock:
            self._entries, self._size, self._largest = entries, size, size // 64
            self._values.clear()
            self._used = 0

    def clear(self) -> None:
        """Forget every value."""
        with self._lock:
            self._values.clear()
            self._used = 0

    def get(self, kind: Hashable, data: str | bytes) -> Any | None:
        """The value decoded from ``data`` as ``kind``, or ``None``."""
        return self._values.get((kind, data)) if type(data) in _KEYS else None

    def put(self, kind: Hashable, data: str | bytes, value: Any) -> None:
        """Keep ``value``, decoded from ``data`` as ``kind`` (when within the bounds)."""
        if type(data) not in _KEYS or len(data) > self._largest:
            return
        key = (kind, data)
        with self._lock:
            values = self._values
            if key in values:
                return
            values[key] = value
            self._used += len(data)
            while len(values) > self._entries or self._used > self._size:
                oldest, _ = values.popitem(last=False)
                self._used -= len(oldest[1])


_KEYS = frozenset({str, bytes})  # immutable and hashable (not bytearray, not memoryview)

cache = RecordCache(entries=4096, size=4 * 2**20)
"""The records decoded last, shared by every store of the process: at most 4,096
records decoded from 4 MiB of stored data (records take several times their
stored size in memory: some 16 MB when full). ``cache.resize(entries=0,
size=0)`` keeps none."""


# ---------------------------------------------------------------- decoding


_STORED: dict[type, SchemaValidator] = {}
_DECODED: dict[type, SchemaValidator] = {}
_PLAIN_BSON: dict[type, SchemaValidator] = {}


def prepare(*models: type[BaseModel]) -> None:
    """Compile the fast validators of ``models`` (the stored record models; at
    import of :mod:`pai_storage.models`, under the import lock). A model not
    prepared is decoded by its own validator alone."""
    for model in models:
        _STORED[model] = _stored_validator(model)
        _DECODED[model] = _stored_validator(model, decoded=True)
        _PLAIN_BSON[model] = _stored_validator(model, decoded=True, plain_bson=True)


def decode(model: type[M], text: str) -> M:
    """The record of stored JSON text (:func:`decode_many` of one text)."""
    return decode_many(model, (text,))[0]


def decode_many(model: type[M], texts: Iterable[str]) -> list[M]:
    """The records of stored JSON texts (a page's), each shared from :data:`cache`
    when decoded before. Invalid stored data raises
    :class:`~pai_storage.errors.ThreadStoreInvariantError` (or the serialization
    error of a value that is not strict JSON), as ``model_validate_json`` would."""
    # RecordCache.get without a call per record.
    found = cache._values.get
    validator = _STORED.get(model)
    records: list[M] = []
    for text in texts:
        record = found((model, text)) if type(text) in _KEYS else None
        if record is None:
            record = _decode_text(model, text, validator)
            cache.put(model, text, record)
        records.append(record)
    return records


def _decode_text(model: type[M], text: str, validator: SchemaValidator | None) -> M:
    if validator is not None and len(text) < MAX_JSON_NODES:
        try:
            return cast(M, validator.validate_json(text))
        except ValidationError:
            pass
    try:  # the model's own validator decides, and names the problem
        return cast(M, model.__pydantic_validator__.validate_json(text))
    except ValidationError as exc:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        raise convert_validation_error(exc, model.__name__, data, stored=True) from None


def decode_document(model: type[M], data: dict[str, Any], size: int, *, dates: bool = False) -> M:
    """The record of a document a store decoded (BSON, JSON).

    ``data`` is as a decoder made it: containers and scalars of exactly the
    JSON types (a subclass such as BSON's ``Int64`` converted first) or other
    types, which are refused. ``size`` is the length of the encoded document:
    each value took at least one byte of it, so it bounds the number of values
    (a larger document takes the full check, which counts them). With ``dates``
    (a BSON document) every timestamp must be a date: text there, even the JSON
    form, is invalid stored data. Errors as for :func:`decode`.
    """
    validator = _DECODED.get(model)
    if validator is not None and size < MAX_JSON_NODES:
        try:
            return cast(M, validator.validate_python(data))
        except ValidationError:
            pass
    if dates:
        _refuse_text_dates(model, data)
    try:
        return cast(M, model.__pydantic_validator__.validate_python(data))
    except ValidationError as exc:
        raise convert_validation_error(exc, model.__name__, data, stored=True) from None


def decode_plain_bson(model: type[M], data: dict[str, Any], size: int) -> M | None:
    """The record of a BSON document decoded plainly, or ``None`` when it takes
    the exact path (:func:`decode_document` with ``dates``).

    ``data`` is as PyMongo's C decoder makes it with its default options:
    naive datetimes (BSON dates are UTC), ``Int64`` for 64-bit integers, no
    type decoders. The record returned is the one :func:`decode_document`
    gives for the same document decoded exactly; anything this check refuses,
    and what a plain decoder leaves uninterpreted (a ``Binary``, a ``DBRef``),
    gives ``None``.
    """
    validator = _PLAIN_BSON.get(model)
    if validator is None or size >= MAX_JSON_NODES:
        return None
    try:
        return cast(M, validator.validate_python(data))
    except ValidationError:
        return None
