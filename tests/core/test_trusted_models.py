"""The read fast paths give exactly what full validation gives.

``StoreModel.trusted`` builds a model from checked fields; ``codec.decode``
validates stored JSON text with pydantic-core constraints only, falling back to
``model_validate_json`` for anything they reject.
"""

import contextlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pai_storage import Item, Message, QueuedItem, RunRecord, ThreadRecord, codec
from pai_storage.codec import _DECODED as _DECODED_VALIDATORS
from pai_storage.codec import _STORED as _STORED_VALIDATORS
from pai_storage.errors import ThreadStoreInvariantError, ThreadStoreSerializationError
from pai_storage.strict_json import MAX_JSON_DEPTH, MAX_JSON_NODES

from . import strategies as s


def test_trusted_model_equals_the_validated_one() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    fields = {
        "namespace": ("a", "b"),
        "key": "k",
        "value": {"secret-word": 1, "a": [1.0, None]},
        "version": 3,
        "created_at": now,
        "updated_at": now,
        "expires_at": None,
        "ttl": None,
    }
    validated = Item(**fields)
    trusted = Item.trusted(dict(fields))
    assert trusted == validated
    assert trusted.to_json() == validated.to_json()
    assert repr(trusted) == repr(validated)
    assert "secret-word" not in repr(trusted)  # values never shown
    with pytest.raises(pydantic.ValidationError):
        trusted.key = "other"  # type: ignore[misc]


# ---------------------------------------------------------------- stored JSON text

STORED_MODELS = [
    (ThreadRecord, s.thread_records()),
    (Message, s.messages()),
    (RunRecord, s.run_records()),
    (QueuedItem, s.queued_items()),
]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def stored_text(model: Any, data: dict[str, Any]) -> str:
    """The JSON text a store writes for ``data``: key order kept, non-ASCII as is."""
    return json.dumps(
        model.model_validate(data).to_json(), ensure_ascii=False, separators=(",", ":")
    )


@pytest.mark.parametrize(
    ("model", "strategy"), STORED_MODELS, ids=lambda v: getattr(v, "__name__", "")
)
@SETTINGS
@given(data=st.data())
def test_stored_text_validates_like_model_validate_json(
    model: Any, strategy: Any, data: Any
) -> None:
    text = stored_text(model, data.draw(strategy))
    expected = model.model_validate_json(text)
    stored = codec.decode(model, text)
    records = [stored]
    # The fast path alone: it may refuse valid text (floats beyond 2**63), never accept
    # anything else than what full validation gives.
    with contextlib.suppress(ValidationError):
        records.append(_STORED_VALIDATORS[model].validate_json(text))
    for record in records:
        assert type(record) is model
        assert record == expected
        assert json.dumps(record.to_json()) == json.dumps(expected.to_json())  # types, key order
    assert stored.created_at.tzinfo is UTC


def _message(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "messageId": "m1",
        "role": "assistant",
        "parts": [{"type": "text", "text": "hello"}],
        "producer": {"kind": "agent", "id": "a"},
        "association": {"kind": "run", "runId": "r1", "relation": "output"},
        "visibility": {"transcript": True, "context": True},
        "status": "complete",
        "metadata": {"n": 1},
        "createdAt": "2030-01-01T00:00:00.000Z",
        "updatedAt": "2030-01-01T00:00:01.123Z",
    }
    data.update(changes)
    return data


def _with_metadata(raw: str) -> str:
    """A stored message whose metadata is the raw JSON text ``raw``."""
    text = json.dumps(_message(metadata={"x": "PLACEHOLDER"}), separators=(",", ":"))
    return text.replace('{"x":"PLACEHOLDER"}', raw)


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


INVALID_STORED = {
    "NaN": _with_metadata('{"x":NaN}'),
    "Infinity": _with_metadata('{"x":[1,Infinity]}'),
    "-Infinity": _with_metadata('{"x":-Infinity}'),
    "overflow to infinity": _with_metadata('{"x":1e400}'),
    "negative zero": _with_metadata('{"x":-0.0}'),
    "negative zero exponent": _with_metadata('{"x":{"y":-0e5}}'),
    "underflow to negative zero": _with_metadata('{"x":-1e-400}'),
    "int above int64": _with_metadata('{"x":9223372036854775808}'),
    "int below int64": _with_metadata('{"x":-9223372036854775809}'),
    "lone surrogate in text": json.dumps(
        _message(parts=[{"type": "text", "text": "\ud800"}]), ensure_ascii=True
    ),
    "lone surrogate in a key": _with_metadata('{"\\udc00":1}'),
    "too deep": _with_metadata('{"x":' + _nested(MAX_JSON_DEPTH) + "}"),
    "metadata not an object": _with_metadata("[1]"),
    "empty id": json.dumps(_message(messageId="")),
    "id too long": json.dumps(_message(messageId="m" * 1025)),
    "id not a string": json.dumps(_message(messageId=1)),
    "unknown field": json.dumps(_message(extra=1)),
    "unknown part type": json.dumps(_message(parts=[{"type": "video", "text": "x"}])),
    "no parts": json.dumps(_message(parts=[])),
    "naive timestamp": json.dumps(_message(createdAt="2030-01-01T00:00:00.000")),
    "not a timestamp": json.dumps(_message(createdAt="2030-13-01T00:00:00.000Z")),
    "timestamp as a number": json.dumps(_message(createdAt=1893456000)),
    "timestamp with an offset": json.dumps(_message(createdAt="2030-01-01T01:00:00.000+01:00")),
    "timestamp with microseconds": json.dumps(_message(createdAt="2030-01-01T00:00:00.123456Z")),
    "timestamp without milliseconds": json.dumps(_message(createdAt="2030-01-01T00:00:00Z")),
    "missing field": json.dumps({k: v for k, v in _message().items() if k != "status"}),
    "not JSON": '{"messageId":"m1",',
}


@pytest.mark.parametrize("text", INVALID_STORED.values(), ids=INVALID_STORED.keys())
def test_invalid_stored_text_raises_what_model_validate_json_raises(text: str) -> None:
    with pytest.raises(ValidationError):
        _STORED_VALIDATORS[Message].validate_json(text)  # never accepted by the fast path
    with pytest.raises(ThreadStoreInvariantError) as expected:
        Message.model_validate_json(text)
    with pytest.raises(ThreadStoreInvariantError) as got:
        codec.decode(Message, text)
    _assert_stored_form(got.value, expected.value)


def _assert_stored_form(got: Exception, expected: Exception) -> None:
    """The error of a stored record: the class and reason of the input's error,
    with a path that stops at the record's own fields (stored contents are
    never quoted: no key inside opaque JSON, no name of an unknown key)."""
    assert type(got) is type(expected)
    if isinstance(expected, ThreadStoreSerializationError):
        path, reason = str(expected).split(": ", 1)
        got_path, got_reason = str(got).split(": ", 1)
        assert got_reason == reason
        assert path.startswith(got_path)
        assert got_path in ("metadata", "parts[0].text")
    elif "an unknown field" in str(expected):
        assert str(got) == "invalid Message: an unknown field"
    else:
        assert str(got) == str(expected)


VALID_STORED = {
    "deepest opaque value": _with_metadata('{"x":' + _nested(MAX_JSON_DEPTH - 1) + "}"),
    "int64 bounds": _with_metadata('{"x":[9223372036854775807,-9223372036854775808]}'),
    "floats": _with_metadata('{"x":[0.0,1e-300,-2.5,9.2e18,1.0]}'),
    "floats beyond 2**63 (full check)": _with_metadata('{"x":[1e308,-9.3e18]}'),
    "ints stay ints": _with_metadata('{"x":[1,-0,0]}'),
    "U+0000 and escaped non-ASCII": _with_metadata('{"\\u0000":"\\u00e9\\ud83d\\ude00"}'),
    "NaN inside a string": _with_metadata('{"x":"NaN -0.0 1e400"}'),
    "snake_case names": json.dumps(
        {"message_id" if k == "messageId" else k: v for k, v in _message().items()}
    ),
    "standalone, no producer id": json.dumps(
        _message(association={"kind": "standalone"}, producer={"kind": "user"})
    ),
}


@pytest.mark.parametrize(("text_id", "text"), VALID_STORED.items(), ids=VALID_STORED.keys())
def test_valid_stored_text_gives_what_model_validate_json_gives(text_id: str, text: str) -> None:
    expected = Message.model_validate_json(text)
    got = codec.decode(Message, text)
    if "full check" not in text_id:
        assert got == _STORED_VALIDATORS[Message].validate_json(text)  # taken by the fast path
    assert got == expected
    assert json.dumps(got.to_json()) == json.dumps(expected.to_json())
    assert got.created_at.tzinfo is UTC


def test_a_page_of_stored_texts_validates_like_each_text() -> None:
    # Valid texts (fast path and full check alike) give the records each gives
    # alone; an invalid one anywhere in the page raises what it raises alone.
    valid = list(VALID_STORED.values())
    got = codec.decode_many(Message, valid)
    assert got == [codec.decode(Message, text) for text in valid]
    assert [json.dumps(r.to_json()) for r in got] == [
        json.dumps(Message.model_validate_json(text).to_json()) for text in valid
    ]
    assert codec.decode_many(Message, []) == []
    for text in INVALID_STORED.values():
        with pytest.raises(ThreadStoreInvariantError) as alone:
            codec.decode(Message, text)
        with pytest.raises(ThreadStoreInvariantError) as in_page:
            codec.decode_many(Message, [*valid[:2], text, *valid[2:]])
        assert type(in_page.value) is type(alone.value)
        assert str(in_page.value) == str(alone.value)


def test_stored_opaque_values_are_read_only_and_shared() -> None:
    text = _with_metadata('{"x":[1,{"y":2}]}')
    first, second = codec.decode(Message, text), codec.decode(Message, text)
    assert second is first  # from the cache: immutable, so shared
    with pytest.raises(TypeError):
        first.metadata["x"][1]["y"] = 3
    with pytest.raises(TypeError):
        first.metadata["x"].append(3)
    assert second.metadata == {"x": [1, {"y": 2}]}


# ---------------------------------------------------------------- decoded documents


@pytest.mark.parametrize(
    ("model", "strategy"), STORED_MODELS, ids=lambda v: getattr(v, "__name__", "")
)
@SETTINGS
@given(data=st.data())
def test_decoded_document_validates_like_model_validate(
    model: Any, strategy: Any, data: Any
) -> None:
    text = stored_text(model, data.draw(strategy))
    expected = model.model_validate(json.loads(text))
    got = codec.decode_document(model, json.loads(text), len(text))
    records = [got]
    with contextlib.suppress(ValidationError):
        records.append(_DECODED_VALIDATORS[model].validate_python(json.loads(text)))
    for record in records:
        assert type(record) is model
        assert record == expected
        assert json.dumps(record.to_json()) == json.dumps(expected.to_json())  # types, key order
    assert got.created_at.tzinfo is UTC


def _decoded(text: str) -> Any:
    # NaN, Infinity, huge ints and lone surrogates all decode; timestamps in the
    # JSON form become dates, as a BSON decoder gives them.
    return _as_bson(json.loads(text))


def _as_bson(doc: Any) -> Any:
    if isinstance(doc, dict):
        for key in ("createdAt", "updatedAt"):
            value = doc.get(key)
            if isinstance(value, str) and re.fullmatch(r"\d{4}-.{8}:\d\d:\d\d\.\d{3}Z", value):
                with contextlib.suppress(ValueError):  # "2030-13-01...": left as text
                    doc[key] = datetime.fromisoformat(value)
    return doc


INVALID_DECODED = {name: text for name, text in INVALID_STORED.items() if name != "not JSON"} | {
    "bytes instead of text": _message(parts=[{"type": "text", "text": b"hi"}]),
    "bytes in metadata": _message(metadata={"x": b"hi"}),
    "a tuple in metadata": _message(metadata={"x": (1, 2)}),
    "a non-string key": _message(metadata={1: "x"}),
    "a set in metadata": _message(metadata={"x": {1}}),
}


@pytest.mark.parametrize("value", INVALID_DECODED.values(), ids=INVALID_DECODED.keys())
def test_invalid_decoded_document_raises_what_model_validate_raises(value: Any) -> None:
    if isinstance(value, str):
        value = _decoded(value)
    with pytest.raises(ValidationError):
        _DECODED_VALIDATORS[Message].validate_python(value)  # never accepted by the fast path
    with pytest.raises(ThreadStoreInvariantError) as expected:
        Message.model_validate(value)
    with pytest.raises(ThreadStoreInvariantError) as got:
        codec.decode_document(Message, value, 1000)
    _assert_stored_form(got.value, expected.value)


@pytest.mark.parametrize(("text_id", "text"), VALID_STORED.items(), ids=VALID_STORED.keys())
def test_valid_decoded_document_gives_what_model_validate_gives(text_id: str, text: str) -> None:
    expected = Message.model_validate(_decoded(text))
    got = codec.decode_document(Message, _decoded(text), len(text))
    if "full check" not in text_id:
        assert got == _DECODED_VALIDATORS[Message].validate_python(_decoded(text))
    assert got == expected
    assert json.dumps(got.to_json()) == json.dumps(expected.to_json())
    assert got.created_at.tzinfo is UTC


def test_a_large_decoded_document_takes_the_full_check() -> None:
    # The fast path does not count values; the size bound sends a document that
    # may hold more than the limit to the full check, which does.
    value = _as_bson(_message(metadata={"x": [None] * MAX_JSON_NODES}))
    _DECODED_VALIDATORS[Message].validate_python(value)
    with pytest.raises(ThreadStoreInvariantError) as expected:
        Message.model_validate(value)
    with pytest.raises(ThreadStoreInvariantError) as got:
        codec.decode_document(Message, value, 3 * MAX_JSON_NODES)
    _assert_stored_form(got.value, expected.value)


def test_a_stored_error_never_quotes_stored_contents() -> None:
    # A key of stored opaque JSON, or an unknown key, may be personal data:
    # errors (and the warnings built from them) name the record's field only.
    secret = "alice@example.invalid"
    metadata = _with_metadata(f'{{"{secret}":{{"ssn-123":NaN}}}}')
    extra = json.dumps(_message(**{secret: 1}))
    for text in (metadata, extra):
        with pytest.raises(ThreadStoreInvariantError) as stored:
            codec.decode(Message, text)
        assert secret not in str(stored.value)
        assert "ssn-123" not in str(stored.value)
        with pytest.raises(ThreadStoreInvariantError) as decoded:
            codec.decode_document(Message, _decoded(text), len(text))
        assert secret not in str(decoded.value)
    # An input's error still names the path (the caller's own data).
    with pytest.raises(ThreadStoreInvariantError, match="ssn-123"):
        Message.model_validate_json(metadata)


def test_a_decoded_document_with_text_for_a_date() -> None:
    # A JSON document's timestamps are text: the full check parses them. A BSON
    # document's are dates (dates=True): text there is invalid stored data.
    text = json.dumps(_message())
    assert codec.decode_document(Message, json.loads(text), len(text)) == Message.model_validate(
        json.loads(text)
    )
    with pytest.raises(ThreadStoreInvariantError, match=r"createdAt: a stored timestamp must"):
        codec.decode_document(Message, json.loads(text), len(text), dates=True)
    bson = _decoded(text)
    assert codec.decode_document(Message, bson, len(text), dates=True) == Message.model_validate(
        bson
    )
