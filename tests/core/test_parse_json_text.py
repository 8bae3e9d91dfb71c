"""runtime.parse_json_text: stored JSON text decodes only to strict JSON, fast path or not."""

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pai_storage.codec import STRICT_JSON_TEXT
from pai_storage.runtime import canonical_json, parse_json_text

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: str(f) != "-0.0")
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


def exact(value: object) -> str:
    """Type-strict rendering: 1, 1.0 and True differ, and so does key order."""
    return json.dumps(value)


@given(values)
def test_strict_values_round_trip(value: object) -> None:
    for text in (canonical_json(value), json.dumps(value)):  # raw and escaped unicode
        assert exact(parse_json_text(text)) == exact(value)
        with contextlib.suppress(ValueError):  # refuses only floats beyond 2**63
            assert exact(STRICT_JSON_TEXT.validate_json(text)) == exact(value)


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1,"b":1.0,"c":true,"d":null,"e":"x","f":[],"g":{}}',
        "[9223372036854775807,-9223372036854775808,-0,0.0,1e-300,-2.5e18]",
        '{"\\u0000":"\\ud83d\\ude00","a":{"b":"2030-01-01T00:00:00.000Z"}}',
        "[" * 64 + "]" * 64,
    ],
)
def test_the_one_pass_decoder_takes_strict_json(text: str) -> None:
    assert exact(STRICT_JSON_TEXT.validate_json(text)) == exact(json.loads(text))


@pytest.mark.parametrize("text", ["1e300", "[-9.3e18]", "1.5e19"])
def test_floats_beyond_int64_take_the_full_check(text: str) -> None:
    with pytest.raises(ValidationError):
        STRICT_JSON_TEXT.validate_json(text)
    assert exact(parse_json_text(text)) == exact(json.loads(text))


@pytest.mark.parametrize("text", ["-0.5", "[1e-5, -2.5e+10]", '"\\ud83d\\ude00"', "1e300"])
def test_numbers_and_escapes_that_look_suspect_but_are_strict(text: str) -> None:
    assert parse_json_text(text) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("-0.0", "-0.0"),
        ("[1.5, -0.0]", "-0.0"),
        ("9223372036854775808", "64-bit"),
        ("[-9223372036854775809]", "64-bit"),
        ("1e999", "Infinity"),
        ("[-1e-400]", "-0.0"),
        ("12345678901234567890", "64-bit"),
        ("NaN", "NaN"),
        ('{"a": [Infinity]}', "Infinity"),
        ('"\\ud800"', "surrogate"),
        ('{"k": "x\\uDFFF"}', "surrogate"),
        ("[" * 65 + "]" * 65, "nesting"),
        ('{"a": 1} trailing', "Extra data"),
    ],
)
def test_anything_else_is_refused(text: str, words: str) -> None:
    with pytest.raises(ValidationError):
        STRICT_JSON_TEXT.validate_json(text)
    with pytest.raises(ValueError, match=words):
        parse_json_text(text)
