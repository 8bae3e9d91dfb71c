"""Every record and input of the contract, as immutable pydantic models.

Python attributes are snake_case; the JSON form (the wire and persisted form,
``docs/data-model.md``) is camelCase. ``Model.model_validate(json)`` accepts
exactly the JSON form (snake_case names are accepted too), and
``model_dump(mode="json")`` produces it: optional fields are omitted when
absent, never written as null. Unknown fields and unknown part types are
rejected.

Validation failures raise :class:`ThreadStoreInvariantError` (a ``ValueError``)
naming the path of the bad field; a value that is not strict JSON raises
:class:`ThreadStoreSerializationError`. Error messages never echo input values.

Opaque JSON values (metadata, private metadata, tool input and output,
provider metadata, queued input, data parts) are copied while they are
checked: a model never holds the caller's ``dict`` or ``list``, so mutating
them after validation changes nothing.

Timestamps are aware UTC datetimes truncated to milliseconds; in JSON they are
ISO 8601 strings with milliseconds and ``Z``.

Limits
------
Every backend refuses the same inputs, with the same error, before anything is
written:

=============================================  ======================================
field                                          limit
=============================================  ======================================
``scopeKey``, ``threadId``, every record id,   1 to 1,024 characters
lease owner and producer/initiator ids
``agent`` (commit root and list filter)        1 character to 256 bytes of UTF-8
``parentThreadId`` (commit root, list filter)  1 character to 256 bytes of UTF-8
``category`` (commit root and list filter)     at most 256 bytes of UTF-8
``version.revision``                           1 to 2**63 - 1
``limit`` of a page or list                    1 to 100
``ids`` of an ids selection                    1 to 100, distinct
``durationMs`` of a lease                      1 to 86,400,000 (one day)
an opaque JSON value                           strict JSON, 64 levels, 1,000,000 values
=============================================  ======================================

``agent``, ``parentThreadId`` and ``category`` are the text fields the list
indexes hold besides the scope key and thread id. Their limit is in UTF-8
bytes, not characters, because that is what an index entry holds: with the
scope key and thread id at their longest ASCII form, an entry holding the
agent and the parent (or category) at 256 bytes each still fits PostgreSQL's
2,704-byte index entry. (Ids of up to 1,024 *non-ASCII* characters can still
exceed it there; see ``docs/postgres.md``.) Stored records read back are not
held to these input limits.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import operator
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import (
    Annotated,
    Any,
    ClassVar,
    Generic,
    Literal,
    Self,
    TypeVar,
    cast,
    get_args,
    get_origin,
)

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, SchemaSerializer, SchemaValidator

from .conflicts import Conflict
from .errors import ThreadStoreInvariantError, ThreadStoreSerializationError
from .memo import StoredMemo, remember
from .strict_json import INT64_MAX, MAX_JSON_DEPTH, MAX_JSON_NODES, check_json, is_valid_text

__all__ = [
    "MAX_DURATION_MS",
    "MAX_ID_LENGTH",
    "MAX_ID_SELECTION_SIZE",
    "MAX_INDEXED_TEXT_BYTES",
    "MAX_PAGE_SIZE",
    "AcquireLease",
    "Admission",
    "AdmissionDraft",
    "CommitThreadInput",
    "CommitThreadResult",
    "CommittedResult",
    "ConflictResult",
    "CreateMutation",
    "CreateRoot",
    "DataPart",
    "DeleteChange",
    "DeleteMutation",
    "FilePart",
    "InsertChange",
    "Json",
    "JsonObject",
    "LeaseChange",
    "LeaseRef",
    "ListThreadsInput",
    "Message",
    "MessageChange",
    "MessageDraft",
    "MessageIdsSelection",
    "MessagePageSelection",
    "MessageSelection",
    "MissingCondition",
    "Page",
    "PageRequest",
    "Part",
    "Producer",
    "QueuedItem",
    "QueuedItemChange",
    "QueuedItemDraft",
    "QueuedItemIdsSelection",
    "QueuedItemPageSelection",
    "QueuedItemSelection",
    "ReadInclude",
    "ReadThreadInput",
    "ReasoningPart",
    "ReleaseLease",
    "RenewLease",
    "ReplaceChange",
    "RunAssociation",
    "RunChange",
    "RunDraft",
    "RunError",
    "RunIdsSelection",
    "RunInitiator",
    "RunPageSelection",
    "RunRecord",
    "RunSelection",
    "RunStatus",
    "StandaloneAssociation",
    "TextPart",
    "ThreadChanges",
    "ThreadLease",
    "ThreadPage",
    "ThreadReadResult",
    "ThreadRecord",
    "ThreadVersion",
    "Timestamp",
    "ToolCallPart",
    "TruncateChange",
    "UpdateMutation",
    "UpdateRoot",
    "VersionCondition",
    "Visibility",
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
    # The model keeps the checked copy, never the caller's object: mutating that
    # object after validation cannot change what was checked or what is stored.
    try:
        return check_json(value)
    except ThreadStoreSerializationError as err:
        raise _strict_json_error(err) from None


def _check_json_object(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
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
    """Return ``moment`` in UTC, truncated to whole milliseconds."""
    if type(moment) is datetime and moment.tzinfo is UTC and not moment.microsecond % 1000:
        return moment  # already so (the database's clock, read to the millisecond)
    moment = moment.astimezone(UTC)
    return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)


def format_timestamp(moment: datetime) -> str:
    """The JSON form of a timestamp: ``2026-01-02T03:04:05.678Z``.

    The texts of the most recent datetimes in UTC are remembered (formatting
    costs about a microsecond; a commit writes its one time into several
    records, and a root's creation time again on every commit).
    """
    kept = type(moment) is datetime and moment.tzinfo is UTC
    if kept:
        text = _FORMATTED.get(moment)
        if text is not None:
            return text
    # isoformat pads the year to four digits and ends in "+00:00" in UTC.
    text = datetime.isoformat(truncate_ms(moment), timespec="milliseconds")[:-6] + "Z"
    return remember(_FORMATTED, moment, text) if kept else text


_FORMATTED: dict[datetime, str] = {}
"""Texts of datetimes in UTC (equal ones, the same instant, have the same text)."""


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

ListVisibility = Literal["visible", "hidden"]
Operation = Literal["send", "trigger", "regenerate", "resume"]
RunStatus = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]
Order = Literal["oldest", "newest"]

T = TypeVar("T")
D = TypeVar("D")


# ---------------------------------------------------------------- stored records


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
    # returned as it is; anything else takes the full check. Datetimes are
    # immutable, so the most recent results of parsing text are remembered and
    # shared.
    if type(value) is not str:
        if type(value) is datetime and value.tzinfo is UTC and not value.microsecond % 1000:
            return value
        return _parse_timestamp(value)
    found = _TIMESTAMPS.get(value)
    if found is not None:
        return found
    # The one spelling; anything else raises.
    return remember(_TIMESTAMPS, value, _parse_timestamp(value))


_TIMESTAMPS: dict[str, datetime] = {}


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
            return _JSON_VALUE
        if function is _check_json_object:
            return _JSON_OBJECT
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
    model; in the copy an optional field is left out by pydantic-core when it
    is ``None`` (``serialization_exclude_if``), which is what ``_omit_absent``
    does for every field but those in ``_json_optional``: a model with such
    fields keeps its wrap serializer.
    """
    if isinstance(node, list):
        return [_json_form_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    copied = {key: _json_form_schema(value) for key, value in node.items()}
    cls = node.get("cls")
    if node.get("type") == "model" and isinstance(cls, type) and issubclass(cls, StoreModel):
        if not cls._json_optional:
            copied.pop("serialization", None)
        inner = copied["schema"]
        while inner["type"] != "model-fields":  # under the model's own validators
            inner = inner["schema"]
        fields = inner["fields"]
        for name, field in cls.model_fields.items():
            if not field.is_required() and name not in cls._json_optional:
                fields[name]["serialization_exclude_if"] = _is_none
    return copied


_JSON_FORMS: dict[type, SchemaSerializer] = {}


def _json_form(cls: type[StoreModel]) -> SchemaSerializer:
    """The serializer of ``cls``'s JSON form (:func:`_json_form_schema`), compiled once.

    Unlike validators, pydantic-core compiles every nested model's serializer
    from the schema it is given, so the copy needs nothing more.
    """
    serializer = _JSON_FORMS.get(cls)
    if serializer is None:  # racing threads compile equal serializers: either one is kept
        schema = _json_form_schema(cls.__pydantic_core_schema__)
        serializer = _JSON_FORMS[cls] = SchemaSerializer(schema)
    return serializer


# ---------------------------------------------------------------- base model


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
    if first["type"] == "union_tag_invalid":
        ctx = first.get("ctx") or {}
        first["msg"] = (
            f"unknown {str(ctx.get('discriminator', 'tag')).strip(chr(39))} (expected one of "
            f"{ctx.get('expected_tags', '?')})"
        )
    where = _loc_path(first["loc"], data) or "<input>"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ThreadStoreInvariantError(f"invalid {what}: {where}: {first['msg']}{more}")


_OPAQUE_FIELDS = frozenset(
    {
        "metadata",
        "private_metadata",
        "provider_metadata",
        "call_provider_metadata",
        "result_provider_metadata",
        "input",
        "output",
        "data",
    }
)


class _Opaque:
    """Stands in for an opaque JSON value in a repr."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def __repr__(self) -> str:
        value = self._value
        if isinstance(value, dict):
            return f"<object: {len(value)} keys>"
        if isinstance(value, list):
            return f"<array: {len(value)} items>"
        return "<json>" if value is not None else "None"


_new = object.__new__
_set = object.__setattr__


# Values nobody can change in place.
_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None), datetime})
_CHANGEABLE: dict[type, tuple[str, ...]] = {}
"""Per model class: the fields whose values may be changed in place (dicts,
lists, opaque JSON, nested models holding such values)."""


def detached(value: T) -> T:
    """A copy of ``value`` that shares no value anyone can change with it.

    The effect of ``copy.deepcopy`` at the cost of the mutable values alone:
    ``dict`` and ``list`` values are copied, and a :class:`StoreModel` is
    re-created around its copied values; strings, numbers, timestamps, tuples
    of them, and a model holding nothing else are shared (``value`` itself
    when it is such a model). A model whose JSON form depends on which fields
    were set (a tool-call part's ``output``) is always re-created, with its own
    fields set. What is none of these is deep-copied. Values are taken to be
    what their model's annotations say (as validation makes them): a field
    annotated with a string or a nested model holding only such values is
    shared.
    """
    fresh: T = _fresh(value)
    return fresh


def _fresh(value: Any) -> Any:
    # detached(), untyped: a read's hot path (no cast() calls, scalars, dicts and
    # lists inline: a kept record is copied on every read of it).
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {k: v if type(v) in _SCALARS else _fresh(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _SCALARS else _fresh(v) for v in value]
    names = _CHANGEABLE.get(kind)
    if names is None:
        if not isinstance(value, StoreModel):
            if kind is tuple:
                items = tuple(map(_fresh, value))
                return value if all(map(operator.is_, items, value)) else items
            return copy.deepcopy(value)
        names = _changeable_fields(kind)
    fields = value.__dict__
    copied = None
    fresh: Any
    for name in names:
        try:
            item = fields[name]
        except KeyError:  # a field model_construct was not given: nothing to copy
            continue
        item_kind = type(item)
        if item_kind in _SCALARS:
            continue
        if item_kind is dict:
            fresh = {k: v if type(v) in _SCALARS else _fresh(v) for k, v in item.items()}
        elif item_kind is list:
            fresh = [v if type(v) in _SCALARS else _fresh(v) for v in item]
        else:
            fresh = _fresh(item)
            if fresh is item:
                continue
        if copied is None:
            copied = fields.copy()
        copied[name] = fresh
    if copied is None:
        if not kind._json_optional:
            return value  # nothing in it can change: safe to share
        copied = fields.copy()
    clone = _new(kind)
    _set(clone, "__dict__", copied)
    _set(clone, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
    extra, private = value.__pydantic_extra__, value.__pydantic_private__
    _set(clone, "__pydantic_extra__", None if extra is None else _fresh(extra))
    _set(clone, "__pydantic_private__", None if private is None else _fresh(private))
    return clone


def planned(value: Any) -> Callable[[], Any]:
    """A function of no arguments that makes a copy of ``value`` as
    :func:`detached` does (``value`` itself when that shares it as it is),
    planned once from this very value.

    For a value that is kept and never changed, and copied on every read of
    it (:data:`stored_records`): the plan names only what needs copying, and a
    ``dict`` or ``list`` of values shared as they are is copied by
    ``dict.copy`` or ``list.copy``, not element by element (another ``dict``
    by ``dict.copy`` and a plan per value to copy, another list by a plan per
    element). The function is a :func:`functools.partial` of the
    plan and ``value``: a copy costs no call of Python code but the plan's.
    """
    make = _plan(value)
    return functools.partial(_as_is if make is None else make, value)


def _as_is(value: Any) -> Any:
    return value


def _plan(value: Any) -> Callable[[Any], Any] | None:
    kind = type(value)
    if kind in _SCALARS:
        return None
    if kind is dict:
        steps = tuple(
            (key, make) for key, item in value.items() if (make := _plan(item)) is not None
        )
        return functools.partial(_copy_dict, steps) if steps else dict.copy
    if kind is list:
        plans = tuple(_plan(item) for item in value)
        if not any(plans):
            return list.copy
        return functools.partial(_copy_list, plans)
    if kind is tuple:
        plans = tuple(_plan(item) for item in value)
        if not any(plans):
            return None
        return functools.partial(_copy_tuple, plans)
    if (
        not isinstance(value, StoreModel)
        or value.__pydantic_extra__ is not None
        or value.__pydantic_private__ is not None
    ):
        return _fresh  # models holding extra or private values, anything else
    fields = value.__dict__
    names = _changeable_fields(kind)
    steps = tuple(
        (name, make)
        for name in names
        if name in fields and (make := _plan(fields[name])) is not None
    )
    if not steps and not kind._json_optional:
        return None  # nothing in it can change: shared, as detached() shares it
    return functools.partial(_copy_model, steps)


# The plans' steps come first: functools.partial passes them positionally
# (a keyword would cost a dict per call).


def _copy_dict(steps: tuple[tuple[str, Callable[[Any], Any]], ...], value: dict[str, Any]) -> Any:
    copied = value.copy()
    for key, make in steps:
        copied[key] = make(copied[key])
    return copied


def _copy_list(plans: tuple[Callable[[Any], Any] | None, ...], value: list[Any]) -> Any:
    pairs = zip(value, plans, strict=True)
    return [item if make is None else make(item) for item, make in pairs]


def _copy_tuple(plans: tuple[Callable[[Any], Any] | None, ...], value: tuple[Any, ...]) -> Any:
    pairs = zip(value, plans, strict=True)
    return tuple(item if make is None else make(item) for item, make in pairs)


def _copy_model(steps: tuple[tuple[str, Callable[[Any], Any]], ...], value: Any) -> Any:
    copied = value.__dict__.copy()
    for name, make in steps:
        copied[name] = make(copied[name])
    clone = _new(type(value))
    _set(clone, "__dict__", copied)
    _set(clone, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
    _set(clone, "__pydantic_extra__", None)
    _set(clone, "__pydantic_private__", None)
    return clone


def _changeable_fields(cls: type[StoreModel]) -> tuple[str, ...]:
    """:data:`_CHANGEABLE` of ``cls``, found once."""
    names = _CHANGEABLE.get(cls)
    if names is not None:
        return names
    _CHANGEABLE[cls] = tuple(cls.model_fields)  # meanwhile (a recursive model): every field
    names = tuple(name for name, field in cls.model_fields.items() if _may_change(field.annotation))
    _CHANGEABLE[cls] = names
    return names


def _may_change(kind: Any) -> bool:
    """Whether a value of the annotation ``kind`` may be changed in place (or,
    for a model whose JSON form depends on its fields set, must be re-created)."""
    return not _every_type(kind, _unchangeable)


def _unchangeable(kind: type) -> bool:
    if issubclass(kind, StoreModel):
        return not (kind._json_optional or _changeable_fields(kind))
    return issubclass(kind, tuple(_SCALARS))


def _every_type(kind: Any, test: Callable[[type], bool]) -> bool:
    """Whether every value of the annotation ``kind`` is of a class for which
    ``test`` holds: through ``Annotated`` and unions, a literal always passes,
    and a container or ``Any`` never does."""
    origin = get_origin(kind)
    if origin is Annotated:
        return _every_type(get_args(kind)[0], test)
    if origin is Literal:
        return True
    if origin is typing.Union or origin is types.UnionType:
        return all(_every_type(arg, test) for arg in get_args(kind))
    if isinstance(kind, type) and origin is None:
        return test(kind)
    return False  # dict, list, Any, or anything else


_OPTIONAL_FIELDS: dict[type, tuple[tuple[str, str | None, bool], ...]] = {}
"""Per model class: (name, alias, omitted only when unset) of each optional field."""


def _optional_fields(cls: type[StoreModel]) -> tuple[tuple[str, str | None, bool], ...]:
    """:data:`_OPTIONAL_FIELDS` of ``cls``: the fields its JSON form may omit."""
    optional = _OPTIONAL_FIELDS.get(cls)
    if optional is None:
        optional = _OPTIONAL_FIELDS[cls] = tuple(
            (name, field.alias, name in cls._json_optional)
            for name, field in cls.model_fields.items()
            if not field.is_required()
        )
    return optional


def as_validated(value: T) -> T:
    """A copy of ``value`` as validating its JSON form gives it back.

    The same values, sharing nothing changeable with ``value`` (as
    :func:`detached`), and every model with the fields set validation sets:
    the fields its JSON form holds (an optional field that is ``None`` is
    omitted from it, so it is not set), and every timestamp a ``datetime``
    (not a clock's own subclass of it). For a record a store has just written,
    kept as what reading that text back gives (:meth:`StoreModel.keep_written`).
    """
    copied: T = _as_validated(value)
    return copied


def _as_validated(value: Any) -> Any:
    # as_validated(), untyped: runs on every record a commit writes. Like
    # _fresh, scalars are checked inline and a model that needs no change (no
    # container, a plain datetime, the fields set validation gives) is shared;
    # fields that validation always gives alike are not looked at.
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list:
        return [item if type(item) in _SCALARS else _as_validated(item) for item in value]
    if isinstance(value, StoreModel):
        visit, omitted, json_optional = _VALIDATED.get(kind) or _validated_fields(kind)
        fields = value.__dict__
        copied = None
        for name in visit:
            item = fields.get(name)
            if type(item) in _SCALARS:
                continue
            fresh = _as_validated(item)
            if fresh is not item:
                if copied is None:
                    copied = fields.copy()
                copied[name] = fresh
        present = set(fields)
        for name in omitted:
            if fields.get(name) is None:
                present.discard(name)
        if json_optional:
            present -= set(json_optional) - value.__pydantic_fields_set__
        if copied is None:
            if present == value.__pydantic_fields_set__:
                return value  # nothing in it can change, and it is what validation gives
            copied = fields.copy()
        clone = kind.trusted(copied)
        _set(clone, "__pydantic_fields_set__", present)
        return clone
    if isinstance(value, datetime):
        # A clock's own datetime type (freezegun's, pendulum's): validation
        # reads the timestamp back as a datetime.
        return _parse_timestamp(format_timestamp(value))
    return _fresh(value)


_VALIDATED: dict[type, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {}
"""Per model class, for :func:`_as_validated`: the fields whose value validation
may not give alike, the optional fields omitted from the JSON form when
``None``, and those omitted only when unset (``_json_optional``)."""


def _validated_fields(
    cls: type[StoreModel],
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    optional = _optional_fields(cls)
    omitted = tuple(name for name, _, json_optional in optional if not json_optional)
    unset = tuple(name for name, _, json_optional in optional if json_optional)
    # Meanwhile (a recursive model, or another thread): every field looked at,
    # which is never wrong, only slower; the optional fields are the real ones.
    _VALIDATED[cls] = (tuple(cls.model_fields), omitted, unset)
    visit = tuple(
        name for name, field in cls.model_fields.items() if not _validated_alike(field.annotation)
    )
    found = _VALIDATED[cls] = (visit, omitted, unset)
    return found


def _validated_alike(kind: Any) -> bool:
    """Whether every value of the annotation ``kind`` is what validating its JSON
    form gives back, so it is shared as it is: strings, numbers, booleans,
    ``None``, literals, and models holding only those with no optional field
    (a validated model sets every field it has). Not a timestamp, which may be
    a clock's own subclass of ``datetime``."""
    return _every_type(kind, _alike)


def _alike(kind: type) -> bool:
    if issubclass(kind, StoreModel):
        return not any(_VALIDATED.get(kind) or _validated_fields(kind))
    return kind in (str, int, float, bool, type(None))


class StoreModel(BaseModel):
    """Base of every model: immutable, strict, camelCase JSON, absent fields omitted."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        revalidate_instances="always",
    )

    # Optional fields whose JSON value may itself be null: omitted only when unset.
    _json_optional: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise convert_validation_error(exc, type(self).__name__, data) from None

    # Tell pydantic this __init__ only converts errors, so nested models are
    # still validated by pydantic-core directly (not through __init__).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def trusted(cls, fields: dict[str, Any]) -> Self:
        """A model of ``fields`` that were already checked, built without validation.

        For a store's hot read path: every field has been validated (or was
        built by the store itself) and ``fields`` holds every field of the
        model, in the model's field order (the JSON form follows it).
        Several times cheaper than ``model_construct``; the result is the
        same frozen model (equal, serializable, unchangeable).
        """
        model = _new(cls)
        _set(model, "__dict__", fields)
        _set(model, "__pydantic_fields_set__", set(fields))
        _set(model, "__pydantic_extra__", None)
        _set(model, "__pydantic_private__", None)
        return model

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        try:
            if not kwargs:  # the common call: straight to pydantic-core
                return cast(Self, cls.__pydantic_validator__.validate_python(obj))
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise convert_validation_error(exc, cls.__name__, obj) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, **kwargs)
        except ValidationError as exc:
            try:
                data = json.loads(json_data)
            except ValueError:
                data = None
            raise convert_validation_error(exc, cls.__name__, data) from None

    @classmethod
    def model_validate_stored(cls, text: str) -> Self:
        """Validate a record from the JSON text a store persisted.

        A text validated before may give a copy of the record it gave then
        (:data:`stored_records`).

        The result, and every error class, is that of
        :meth:`model_validate_json`: invalid stored data raises. The text is
        checked by a second validator of the model in which every field check
        but the timestamps' is a pydantic-core constraint (about twice as
        fast); whatever it refuses goes through the model's own validator,
        which decides and names the problem, with a path that stops at the
        record's fields (see :func:`convert_validation_error`: stored opaque
        JSON is never quoted).
        """
        return cls.model_validate_stored_many((text,))[0]

    @classmethod
    def model_validate_stored_many(cls, texts: Iterable[str]) -> list[Self]:
        """:meth:`model_validate_stored` of each text (a page's records): the
        same results and errors, in one call."""
        if not isinstance(texts, list | tuple):
            texts = list(texts)  # read twice: looked up, then validated where missing
        records: list[Any] = stored_records.get_many(cls, texts)
        for i, record in enumerate(records):
            if record is None:
                text = texts[i]
                records[i] = record = cls._validate_stored(text, _STORED_VALIDATORS.get(cls))
                stored_records.add(cls, text, record)
        return records

    def keep_written(self, text: str) -> None:
        """Keep this record, which a store has just written as ``text`` (its
        :meth:`to_json_text`), in :data:`stored_records`: reading that text
        back (:meth:`model_validate_stored`) gives a copy of what validating
        it gives (:func:`as_validated`) without validating it. A commit's root
        and records are what the read that follows it reads. Nothing is
        copied when the memo would not keep it (off, or ``text`` too long)."""
        if stored_records.keeps(text):
            stored_records.keep(type(self), text, as_validated(self))

    @classmethod
    def _validate_stored(cls, text: str, validator: SchemaValidator | None) -> Self:
        if validator is not None and len(text) < MAX_JSON_NODES:
            try:
                return cast(Self, validator.validate_json(text))
            except ValidationError:
                pass
        return cls._validate_stored_fully(text)

    @classmethod
    def _validate_stored_fully(cls, text: str) -> Self:
        """The model's own validator on stored text: decides, and names the problem."""
        try:
            return cast(Self, cls.__pydantic_validator__.validate_json(text))
        except ValidationError as exc:
            try:
                data = json.loads(text)
            except (ValueError, RecursionError):
                data = None
            raise convert_validation_error(exc, cls.__name__, data, stored=True) from None

    @classmethod
    def model_validate_decoded(
        cls, data: dict[str, Any], size: int, *, dates: bool = False
    ) -> Self:
        """Validate a record from a document a store decoded (BSON, JSON).

        The result, and every error class, is that of :meth:`model_validate`,
        as with :meth:`model_validate_stored`: the document is checked by a
        validator whose field checks are pydantic-core constraints, and
        whatever it refuses goes through the model's own validator, which
        decides and names the problem (the path stopping at the record's
        fields, as for :meth:`model_validate_stored`). ``data`` is as a
        decoder made it: containers and scalars of exactly the JSON types
        (``dict``, ``list``, ``str``,
        ``int``, ``float``, ``bool``, ``None``; a subclass such as BSON's
        ``Int64`` converted first) or other types, which are refused.
        ``size`` is the length of the encoded document: each value took at
        least one byte of it, so it bounds the number of values (a larger
        document takes the full check, which counts them). With ``dates``
        (a BSON document) every timestamp must be a date: text there, even
        the JSON form, is invalid stored data.
        """
        validator = _DECODED_VALIDATORS.get(cls)
        if validator is not None and size < MAX_JSON_NODES:
            try:
                return cast(Self, validator.validate_python(data))
            except ValidationError:
                pass
        if dates:
            _refuse_text_dates(cls, data)
        try:
            return cast(Self, cls.__pydantic_validator__.validate_python(data))
        except ValidationError as exc:
            raise convert_validation_error(exc, cls.__name__, data, stored=True) from None

    @classmethod
    def model_validate_plain_bson(cls, data: dict[str, Any], size: int) -> Self | None:
        """The record of a BSON document decoded plainly, or ``None`` when it takes
        the exact path.

        ``data`` is as PyMongo's C decoder makes it with its default options:
        naive datetimes (BSON dates are UTC), ``Int64`` for 64-bit integers,
        no type decoders. The same checks as the fast path of
        :meth:`model_validate_decoded` with ``dates``: the record returned is
        the one that method gives for the same document decoded exactly
        (aware UTC dates, integers as ``int``). Anything that check refuses,
        and what a plain decoder leaves uninterpreted (a ``Binary``, a
        ``DBRef``), gives ``None``: the caller decodes the document exactly
        and calls :meth:`model_validate_decoded`, which decides and names the
        problem.
        """
        validator = _PLAIN_BSON_VALIDATORS.get(cls)
        if validator is None or size >= MAX_JSON_NODES:
            return None
        try:
            return cast(Self, validator.validate_python(data))
        except ValidationError:
            return None

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        values = self.__dict__
        for name, alias, json_optional in _optional_fields(type(self)):
            if json_optional:
                absent = name not in self.__pydantic_fields_set__
            else:
                absent = values[name] is None
            if absent:
                # Keys are aliases or names depending on the call and the config.
                data.pop(name, None)
                if alias:
                    data.pop(alias, None)
        return data

    def __repr_args__(self) -> Any:
        # Opaque JSON may hold personal data: reprs (and so logs) show only its shape.
        for name, value in super().__repr_args__():
            yield name, (_Opaque(value) if name in _OPAQUE_FIELDS else value)

    def to_json(self) -> dict[str, Any]:
        """The JSON form of this value (a fresh ``dict``).

        The same as ``model_dump(mode="json", by_alias=True)``, about twice as fast.
        """
        form: dict[str, Any] = _json_form(type(self)).to_python(self, mode="json", by_alias=True)
        return form

    def to_json_text(self) -> str:
        """The JSON form as compact text (what :meth:`to_json` gives, encoded by pydantic-core)."""
        return _json_form(type(self)).to_json(self, by_alias=True).decode()

    def deep_copy(self) -> Self:
        """A copy sharing no mutable state (opaque JSON included) with this one."""
        return copy.deepcopy(self)


# ---------------------------------------------------------------- thread root


class ThreadVersion(StoreModel):
    """The optimistic-concurrency token: incarnation plus revision (1 to 2**63 - 1)."""

    thread_instance_id: Id
    revision: Annotated[StrictInt, Field(ge=1, le=INT64_MAX)]


class ThreadLease(StoreModel):
    """The active-run lease: owner-fenced, expiring on the provider's clock."""

    kind: Literal["run"]
    run_id: Id
    owner_id: Id
    operation: Operation
    acquired_at: Timestamp
    renewed_at: Timestamp | None = None
    expires_at: Timestamp


class ThreadRecord(StoreModel):
    """A thread root as stored. ``updated_at`` is the last commit's ``committed_at``."""

    scope_key: Id
    thread_id: Id
    version: ThreadVersion
    agent: Id
    direct_execution_allowed: StrictBool
    parent_thread_id: Id | None = None
    list_visibility: ListVisibility
    category: Text | None = None
    title: Text | None = None
    metadata: JsonObject
    private_metadata: JsonObject
    lease: ThreadLease | None = None
    created_at: Timestamp
    updated_at: Timestamp

    def public_json(self) -> dict[str, Any]:
        """The JSON form without the server-only ``privateMetadata``."""
        data = self.to_json()
        del data["privateMetadata"]
        return data


# ---------------------------------------------------------------- messages


class _PartBase(StoreModel):
    pass


class TextPart(_PartBase):
    type: Literal["text"]
    text: Text
    provider_metadata: JsonObject | None = None


class ReasoningPart(_PartBase):
    type: Literal["reasoning"]
    text: Text
    provider_metadata: JsonObject | None = None


class FilePart(_PartBase):
    type: Literal["file"]
    media_type: Text
    url: Text
    filename: Text | None = None
    provider_metadata: JsonObject | None = None


class ToolCallPart(_PartBase):
    _json_optional: ClassVar[frozenset[str]] = frozenset({"output"})

    type: Literal["tool-call"]
    tool_call_id: Id
    tool_name: Text
    input: Json
    state: Literal["input-streaming", "input-available", "output-available", "output-error"]
    output: Json = None
    error_text: Text | None = None
    call_provider_metadata: JsonObject | None = None
    result_provider_metadata: JsonObject | None = None


class DataPart(_PartBase):
    type: Literal["data"]
    name: Text
    data: Json


Part = Annotated[
    TextPart | ReasoningPart | FilePart | ToolCallPart | DataPart, Field(discriminator="type")
]


class Producer(StoreModel):
    kind: Literal["user", "agent", "system", "application"]
    id: Id | None = None


class StandaloneAssociation(StoreModel):
    kind: Literal["standalone"]


class RunAssociation(StoreModel):
    kind: Literal["run"]
    run_id: Id
    relation: Literal["input", "context", "output"]


Association = Annotated[StandaloneAssociation | RunAssociation, Field(discriminator="kind")]


class Visibility(StoreModel):
    transcript: StrictBool
    context: StrictBool


class _MessageFields(StoreModel):
    message_id: Id
    role: Literal["user", "assistant", "system", "tool"]
    parts: Annotated[list[Part], Field(min_length=1)]
    producer: Producer
    association: Association
    visibility: Visibility
    status: Literal["complete", "streaming", "incomplete", "error"]
    metadata: JsonObject

    @property
    def run_id(self) -> str | None:
        """The run this message belongs to, or ``None`` when standalone."""
        assoc = self.association
        return assoc.run_id if isinstance(assoc, RunAssociation) else None

    @property
    def text(self) -> str:
        """The message's words: its text parts joined, in order (``""`` without any)."""
        return "".join(part.text for part in self.parts if isinstance(part, TextPart))


class MessageDraft(_MessageFields):
    """A message as callers insert or replace it."""


class Message(_MessageFields):
    """A stored message: the draft plus ``created_at`` and ``updated_at``."""

    created_at: Timestamp
    updated_at: Timestamp

    def to_draft(self) -> MessageDraft:
        """The draft of this message, e.g. to replace it with changes."""
        return MessageDraft.model_validate(
            self.model_dump(exclude={"created_at", "updated_at"}, by_alias=False)
        )


# ---------------------------------------------------------------- runs


class RunInitiator(StoreModel):
    kind: Literal["user", "agent", "system", "trigger"]
    id: Id | None = None


class AdmissionDraft(StoreModel):
    queue_item_id: Id | None = None
    admitted: StrictBool


class Admission(StoreModel):
    queue_item_id: Id | None = None
    admitted: StrictBool
    admitted_at: Timestamp | None = None


class RunError(StoreModel):
    code: Text
    message: Text


class _RunFields(StoreModel):
    run_id: Id
    status: RunStatus
    initiator: RunInitiator
    input_message_ids: list[Id]
    operation: Operation | None = None
    error: RunError | None = None
    metadata: JsonObject
    private_metadata: JsonObject


class RunDraft(_RunFields):
    """A run lifecycle record as callers insert or replace it."""

    admission: AdmissionDraft


class RunRecord(_RunFields):
    """A stored run: ``admission.admitted_at`` and ``finished_at`` are stamped by commits."""

    admission: Admission
    created_at: Timestamp
    updated_at: Timestamp
    finished_at: Timestamp | None = None

    def to_draft(self) -> RunDraft:
        data = self.model_dump(exclude={"created_at", "updated_at", "finished_at"}, by_alias=False)
        data["admission"].pop("admitted_at", None)
        return RunDraft.model_validate(data)

    def public_json(self) -> dict[str, Any]:
        """The JSON form without the server-only ``privateMetadata``."""
        data = self.to_json()
        del data["privateMetadata"]
        return data


# ---------------------------------------------------------------- queued items


class QueuedItemDraft(StoreModel):
    queue_item_id: Id
    run_id: Id
    input: Json
    metadata: JsonObject


class QueuedItem(StoreModel):
    queue_item_id: Id
    run_id: Id
    input: Json
    metadata: JsonObject
    created_at: Timestamp

    def to_draft(self) -> QueuedItemDraft:
        return QueuedItemDraft.model_validate(
            self.model_dump(exclude={"created_at"}, by_alias=False)
        )


# ---------------------------------------------------------------- reads


def _distinct(ids: list[str]) -> list[str]:
    if len(set(ids)) != len(ids):
        raise PydanticCustomError("duplicate_id", "ids must be distinct")
    return ids


IdSelection = Annotated[
    list[Id], Field(min_length=1, max_length=MAX_ID_SELECTION_SIZE), AfterValidator(_distinct)
]


class PageRequest(StoreModel):
    limit: Limit
    page_token: StrictStr | None = None


class MessageIdsSelection(StoreModel):
    type: Literal["ids"]
    message_ids: IdSelection


class MessagePageSelection(StoreModel):
    type: Literal["page"]
    view: Literal["raw", "transcript", "context"]
    order: Order | None = None
    after_message_id: Id | None = None
    before_message_id: Id | None = None
    page: PageRequest


MessageSelection = Annotated[
    MessageIdsSelection | MessagePageSelection, Field(discriminator="type")
]


class RunIdsSelection(StoreModel):
    type: Literal["ids"]
    run_ids: IdSelection


class RunPageSelection(StoreModel):
    type: Literal["page"]
    order: Order | None = None
    statuses: Annotated[list[RunStatus], Field(min_length=1)] | None = None
    page: PageRequest


RunSelection = Annotated[RunIdsSelection | RunPageSelection, Field(discriminator="type")]


class QueuedItemIdsSelection(StoreModel):
    type: Literal["ids"]
    queue_item_ids: IdSelection


class QueuedItemPageSelection(StoreModel):
    type: Literal["page"]
    order: Order | None = None
    run_id: Id | None = None
    page: PageRequest


QueuedItemSelection = Annotated[
    QueuedItemIdsSelection | QueuedItemPageSelection, Field(discriminator="type")
]


class ReadInclude(StoreModel):
    messages: MessageSelection | None = None
    runs: RunSelection | None = None
    queued_items: QueuedItemSelection | None = None


class ReadThreadInput(StoreModel):
    scope_key: Id
    thread_id: Id
    include: ReadInclude | None = None


class Page(StoreModel, Generic[T]):
    items: list[T]
    next_page_token: StrictStr | None = None


class ThreadPage(Page[T], Generic[T]):
    version: ThreadVersion


class ThreadReadResult(StoreModel):
    observed_at: Timestamp
    thread: ThreadRecord | None
    messages: ThreadPage[Message] | None = None
    runs: ThreadPage[RunRecord] | None = None
    queued_items: ThreadPage[QueuedItem] | None = None


# ---------------------------------------------------------------- listing


class ListThreadsInput(StoreModel):
    scope_key: Id
    limit: Limit
    agent: IndexedId | None = None
    parent_thread_id: IndexedId | None = None
    category: IndexedText | None = None
    include_hidden: StrictBool | None = None
    page_token: StrictStr | None = None


# ---------------------------------------------------------------- commits


class MissingCondition(StoreModel):
    type: Literal["missing"]


class VersionCondition(StoreModel):
    type: Literal["version"]
    version: ThreadVersion


class CreateRoot(StoreModel):
    agent: IndexedId
    direct_execution_allowed: StrictBool
    parent_thread_id: IndexedId | None = None
    list_visibility: ListVisibility
    category: IndexedText | None = None
    title: Text | None = None
    metadata: JsonObject
    private_metadata: JsonObject


class UpdateRoot(StoreModel):
    """The complete set of mutable root fields; omitted ``category``/``title`` are removed."""

    list_visibility: ListVisibility
    category: IndexedText | None = None
    title: Text | None = None
    metadata: JsonObject
    private_metadata: JsonObject


class InsertChange(StoreModel, Generic[D]):
    """Append ``record`` at the end of its family; its id must be new."""

    type: Literal["insert"]
    record: D


class ReplaceChange(StoreModel, Generic[D]):
    """Replace the record with the same id; it must exist and keeps its position."""

    type: Literal["replace"]
    record: D


class DeleteChange(StoreModel):
    """Delete the record with this id; it must exist."""

    type: Literal["delete"]
    id: Id


class TruncateChange(StoreModel):
    """Remove every record after ``after_id`` (``None``: all). Messages and runs only."""

    type: Literal["truncate"]
    after_id: Id | None


MessageChange = Annotated[
    InsertChange[MessageDraft] | ReplaceChange[MessageDraft] | DeleteChange | TruncateChange,
    Field(discriminator="type"),
]
RunChange = Annotated[
    InsertChange[RunDraft] | ReplaceChange[RunDraft] | DeleteChange | TruncateChange,
    Field(discriminator="type"),
]
QueuedItemChange = Annotated[
    InsertChange[QueuedItemDraft] | ReplaceChange[QueuedItemDraft] | DeleteChange,
    Field(discriminator="type"),
]


class LeaseRef(StoreModel):
    kind: Literal["run"]
    run_id: Id


Duration = Annotated[StrictInt, Field(ge=1, le=MAX_DURATION_MS)]


class AcquireLease(StoreModel):
    """Take the lease; conflicts while another unexpired lease exists."""

    type: Literal["acquire"]
    lease: LeaseRef
    lease_owner_id: Id
    duration_ms: Duration
    operation: Operation


class RenewLease(StoreModel):
    """Extend the caller's own unexpired lease."""

    type: Literal["renew"]
    lease: LeaseRef
    lease_owner_id: Id
    duration_ms: Duration


class ReleaseLease(StoreModel):
    """Drop the caller's lease; ``expiry="any"`` also releases an expired one."""

    type: Literal["release"]
    lease: LeaseRef
    lease_owner_id: Id
    expiry: Literal["unexpired", "any"]


LeaseChange = Annotated[AcquireLease | RenewLease | ReleaseLease, Field(discriminator="type")]


class ThreadChanges(StoreModel):
    messages: list[MessageChange] | None = None
    runs: list[RunChange] | None = None
    queued_items: list[QueuedItemChange] | None = None
    lease: LeaseChange | None = None


class CreateMutation(StoreModel):
    type: Literal["create"]
    root: CreateRoot
    changes: ThreadChanges | None = None


class UpdateMutation(StoreModel):
    type: Literal["update"]
    root: UpdateRoot
    changes: ThreadChanges | None = None


class DeleteMutation(StoreModel):
    type: Literal["delete"]


class CommitThreadInput(StoreModel):
    """One atomic, version-checked write set for one thread."""

    scope_key: Id
    thread_id: Id
    condition: Annotated[MissingCondition | VersionCondition, Field(discriminator="type")]
    mutation: Annotated[
        CreateMutation | UpdateMutation | DeleteMutation, Field(discriminator="type")
    ]

    @model_validator(mode="after")
    def _condition_matches_mutation(self) -> Self:
        creating = self.mutation.type == "create"
        if creating != (self.condition.type == "missing"):
            raise PydanticCustomError(
                "condition_mismatch",
                "a create needs condition 'missing'; an update or delete needs 'version'",
            )
        return self


class CommittedResult(StoreModel):
    type: Literal["committed"]
    thread: ThreadRecord | None
    committed_at: Timestamp


class ConflictResult(StoreModel, Conflict):
    type: Literal["conflict"]
    current_version: ThreadVersion | None


CommitThreadResult = Annotated[CommittedResult | ConflictResult, Field(discriminator="type")]


_STORED_RECORDS = (ThreadRecord, Message, RunRecord, QueuedItem)
_STORED_VALIDATORS: dict[type, SchemaValidator] = {
    model: _stored_validator(model) for model in _STORED_RECORDS
}
_DECODED_VALIDATORS: dict[type, SchemaValidator] = {
    model: _stored_validator(model, decoded=True) for model in _STORED_RECORDS
}
_PLAIN_BSON_VALIDATORS: dict[type, SchemaValidator] = {
    model: _stored_validator(model, decoded=True, plain_bson=True) for model in _STORED_RECORDS
}

stored_records: StoredMemo[Any] = StoredMemo(
    operator.call, kept=planned, entries=4096, size=4 * 2**20
)
"""The records :meth:`StoreModel.model_validate_stored` validated more than once,
and those a store has just written (:meth:`StoreModel.keep_written`), by model
and exact stored text, shared by every store of the process (a
backend may keep its own decoded records in it too, under its own kind).
At most 4,096 records built from 4 MiB of stored text; the records take
several times their text in memory (about 4 KB for a message of 650
characters, some 16 MB when full of such messages).
``stored_records.resize(entries=0, size=0)`` keeps none. See
:mod:`pai_storage.memo` and ``docs/performance.md``."""
