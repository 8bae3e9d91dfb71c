"""Strict JSON (docs/json.md): what is rejected, where, and what round-trips."""

from __future__ import annotations

import copy
import enum
import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings

from pai_storage.backend import check_json, check_json_object
from pai_storage.errors import ThreadStoreSerializationError
from pai_storage.strict_json import MAX_JSON_DEPTH, MAX_JSON_NODES

from . import strategies as s


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 1


class MyDict(dict):  # type: ignore[type-arg]
    pass


class MyStr(str):
    pass


class MyInt(int):
    pass


class Thing:
    pass


def _cyclic_dict() -> dict[str, Any]:
    inner: dict[str, Any] = {}
    inner["self"] = inner
    return {"items": [inner]}


def _cyclic_list() -> dict[str, Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return {"items": [0, loop]}


BAD_VALUES = [
    (float("nan"), "NaN"),
    (float("inf"), "Infinity"),
    (float("-inf"), "-Infinity"),
    (-0.0, "-0.0"),
    (2**63, "64-bit"),
    (-(2**63) - 1, "64-bit"),
    ((1, 2), "tuple"),
    ({1}, "set"),
    (frozenset({1}), "frozenset"),
    (b"x", "bytes"),
    (bytearray(b"x"), "bytearray"),
    (datetime(2030, 1, 1, tzinfo=UTC), "datetime"),
    (Decimal("1.5"), "Decimal"),
    (Color.RED, "Color"),
    (Level.HIGH, "Level"),
    (MyDict(a=1), "MyDict"),
    (MyStr("x"), "MyStr"),
    (MyInt(3), "MyInt"),
    (Thing(), "Thing"),
    ("a\ud800b", "surrogate"),
    ("\udfff", "surrogate"),
]


@pytest.mark.parametrize(("bad", "word"), BAD_VALUES)
def test_rejected_value_names_exact_path(bad: Any, word: str) -> None:
    value = {"items": [0, 1, 2, {"score": bad}]}
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(value, "metadata")
    assert err.value.path == "metadata.items[3].score"
    assert word in err.value.reason
    assert str(err.value) == f"metadata.items[3].score: {err.value.reason}"


def test_nan_message_format() -> None:
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json({"items": [0, 1, 2, {"score": float("nan")}]}, "metadata")
    assert str(err.value) == "metadata.items[3].score: NaN is not JSON"
    assert err.value.reason == "NaN is not JSON"


@pytest.mark.parametrize(("bad", "word"), BAD_VALUES)
def test_rejected_at_top_level(bad: Any, word: str) -> None:
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(bad)
    assert err.value.path == ""
    assert word in err.value.reason
    assert str(err.value).startswith("<value>: ")


def test_int64_bounds_accepted() -> None:
    check_json([2**63 - 1, -(2**63), 0, True, False, None, 0.0, 1.5, -1.5, "\x00"])


@pytest.mark.parametrize(
    ("make", "path"),
    [(_cyclic_dict, "items[0].self"), (_cyclic_list, "items[1][1]")],
)
def test_cycles_rejected(make: Any, path: str) -> None:
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(make())
    assert err.value.path == path
    assert "cycle" in err.value.reason


@pytest.mark.parametrize("key", [1, None, 1.5, ("a",), b"k", True])
def test_non_string_keys_rejected(key: Any) -> None:
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json({"a": {"ok": 1, key: 2}}, "metadata")
    assert err.value.path == "metadata.a"
    assert "not a string" in err.value.reason


def test_lone_surrogate_key_rejected() -> None:
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json({"a": {"x\ud83d": 1}}, "metadata")
    assert err.value.path == "metadata.a"
    assert "surrogate" in err.value.reason


def test_non_identifier_keys_are_quoted_in_path() -> None:
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json({"a.b": [{"": float("inf")}]}, "metadata")
    assert err.value.path == "metadata['a.b'][0]['']"


def test_check_json_object_requires_dict() -> None:
    values: list[Any] = [[], "x", None, MyDict()]
    for value in values:
        with pytest.raises(ThreadStoreSerializationError, match="JSON object"):
            check_json_object(value, "metadata")
    check_json_object({"a": [1]}, "metadata")


def test_valid_non_ascii_text_accepted() -> None:
    check_json({"emoji 🙂": ["é", "中文", "\U0001f600", "\x00"]})


@settings(max_examples=200, deadline=None)
@given(s.json_values)
def test_accepted_values_round_trip_unchanged(value: Any) -> None:
    before = json.dumps(value)
    snapshot = copy.deepcopy(value)
    check_json(value)
    assert json.dumps(value) == before
    assert json.dumps(json.loads(before)) == before
    assert value == snapshot


def test_shared_non_cyclic_sub_values_accepted() -> None:
    shared = {"k": [1, 2]}
    lst = [shared, shared, [shared]]
    value = {"a": shared, "b": shared, "c": lst, "d": lst}
    copied = check_json(value)
    assert json.dumps(copied) == json.dumps(value)
    # The copy mirrors the sharing, and shares nothing with the input.
    assert copied["a"] is copied["b"] is copied["c"][0]
    assert copied["a"] is not shared


# ---------------------------------------------------------------- the check returns a copy


def _containers(value: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, dict | list):
        found.append(value)
        for sub in value.values() if isinstance(value, dict) else value:
            found.extend(_containers(sub))
    return found


@settings(max_examples=200, deadline=None)
@given(s.json_values)
def test_check_returns_an_equal_copy_sharing_no_container(value: Any) -> None:
    copied = check_json(value, "metadata")
    assert json.dumps(copied) == json.dumps(value)
    originals = {id(c) for c in _containers(value)}
    assert not any(id(c) in originals for c in _containers(copied))


def test_mutating_the_input_after_the_check_leaves_the_copy_alone() -> None:
    value: dict[str, Any] = {"a": [1, {"b": 2}]}
    copied = check_json_object(value, "metadata")
    value["a"][1]["b"] = float("nan")
    value["a"].append(2**80)
    value["new"] = object()
    assert copied == {"a": [1, {"b": 2}]}
    check_json(copied)


def test_an_empty_object_or_array_is_copied_too() -> None:
    # The commonest metadata is {}: the store still keeps its own.
    for empty in ({}, []):
        copied = check_json(empty)
        assert copied == empty
        assert type(copied) is type(empty)
        assert copied is not empty


def test_scalars_are_returned_as_they_are() -> None:
    for scalar in (None, True, 0, 2**63 - 1, 1.5, "text"):
        assert check_json(scalar) is scalar


# ---------------------------------------------------------------- shared sub-values


def _doubling(levels: int) -> Any:
    value: Any = [1]
    for _ in range(levels):
        value = [value, value]
    return value


class Hung(Exception):
    """A check still running when the watchdog fired."""


@contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: a regression here is exponential, not slow."""

    def expire(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_shared_sub_value_bomb_is_rejected_without_expanding_it() -> None:
    # 40 levels of x = [x, x] are 81 containers in memory and 2**41 values
    # written out; the old check walked every one of them.
    for levels in (22, 40, MAX_JSON_DEPTH - 2):  # the bomb sits one level down
        with watchdog(30), pytest.raises(ThreadStoreSerializationError) as err:
            check_json({"bomb": _doubling(levels)}, "metadata")
        assert err.value.path == "metadata"
        assert "1,000,000 values" in err.value.reason


def test_shared_sub_values_within_the_node_limit_are_accepted() -> None:
    # 2**18 leaves, 2**19 - 1 containers: about 800,000 values written out.
    value = _doubling(18)
    copied = check_json(value)
    assert copied[0] is copied[1]
    assert json.dumps(copied) == json.dumps(value)


def test_node_limit_counts_every_value() -> None:
    check_json([0] * (MAX_JSON_NODES - 1))  # the list itself is the last value
    with pytest.raises(ThreadStoreSerializationError, match="1,000,000 values") as err:
        check_json([0] * MAX_JSON_NODES, "output")
    assert err.value.path == "output"


def test_node_limit_counts_a_shared_container_each_time() -> None:
    shared = [0] * 1000
    check_json([shared] * 998)  # 1 + 998 * 1001 values
    with pytest.raises(ThreadStoreSerializationError, match="1,000,000"):
        check_json([shared] * 1000)


def test_a_shared_container_must_fit_the_depth_limit_where_it_appears() -> None:
    shared = _nested_lists(10)  # 10 levels
    shallow = {"a": shared}
    check_json(_nested_dicts(MAX_JSON_DEPTH - 11, shallow))  # deepest: exactly the limit
    value = {"first": shared, "deep": _nested_dicts(MAX_JSON_DEPTH - 10, {"again": shared})}
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(value, "metadata")
    assert err.value.path == "metadata.deep" + ".a" * (MAX_JSON_DEPTH - 10) + ".again"
    assert "deeper" in err.value.reason


def test_errors_after_a_shared_container_are_named_exactly() -> None:
    shared: list[Any] = [1, {"x": 2}]
    value = {"a": shared, "b": [shared, shared], "c": {"d": float("nan")}}
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(value, "metadata")
    assert err.value.path == "metadata.c.d"
    value = {"a": shared, "b": shared, "c": {1: "x"}}
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(value, "metadata")
    assert err.value.path == "metadata.c"
    assert "not a string" in err.value.reason


def test_a_cycle_behind_a_shared_container_is_named() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    shared = [1]
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json({"a": shared, "b": shared, "c": [loop]})
    assert err.value.path == "c[0].self"
    assert "cycle" in err.value.reason


def _nested_lists(depth: int, leaf: Any = "leaf") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _nested_dicts(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def test_nesting_up_to_the_depth_limit_accepted() -> None:
    check_json(_nested_lists(MAX_JSON_DEPTH))
    check_json(_nested_dicts(MAX_JSON_DEPTH))
    check_json_object(_nested_dicts(MAX_JSON_DEPTH))


def test_nesting_beyond_the_depth_limit_rejected_with_path() -> None:
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(_nested_lists(MAX_JSON_DEPTH + 1), "metadata")
    assert err.value.path == "metadata" + "[0]" * MAX_JSON_DEPTH
    assert "deeper" in err.value.reason


def test_deep_value_does_not_hit_recursion_limit() -> None:
    # 10,000 levels: a typed error, never a RecursionError.
    for value, path in (
        (_nested_lists(10_000), "[0]" * MAX_JSON_DEPTH),
        (_nested_dicts(10_000), ".".join(["a"] * MAX_JSON_DEPTH)),
        (_nested_lists(10_000, float("nan")), "[0]" * MAX_JSON_DEPTH),
    ):
        with pytest.raises(ThreadStoreSerializationError) as err:
            check_json(value)
        assert err.value.path == path
        assert "deeper" in err.value.reason


def test_large_value_checked() -> None:
    big = {"rows": [{"i": i, "v": float(i) + 0.5, "s": str(i)} for i in range(200_000)]}
    check_json(big)
    big["rows"][199_999]["v"] = float("nan")
    with pytest.raises(ThreadStoreSerializationError) as err:
        check_json(big)
    assert err.value.path == "rows[199999].v"
