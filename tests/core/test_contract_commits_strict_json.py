"""Strict JSON reasons: a rejected value is described by what it is."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from pai_storage.backend import check_json
from pai_storage.errors import ThreadStoreSerializationError


class _Number(float):
    pass


class _Text(str):
    pass


class _Mode(enum.StrEnum):
    FAST = "fast"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "NaN is not JSON"),
        (float("inf"), "Infinity is not JSON"),
        (float("-inf"), "-Infinity is not JSON"),
        (-0.0, "-0.0 is not JSON"),
        (2**63, "signed 64-bit range"),
        ("a\ud800", "lone surrogate"),
        (_Number(1.5), "a value of type _Number is not JSON"),
        (_Number("nan"), "a value of type _Number is not JSON"),
        (_Number(-0.0), "a value of type _Number is not JSON"),
        (_Text("x"), "a value of type _Text is not JSON"),
        (_Mode.FAST, "a value of type _Mode is not JSON"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("where", ["top", "object", "array", "shared"])
def test_reason_names_what_the_value_is(value: Any, reason: str, where: str) -> None:
    shared: list[Any] = [1]
    wrapped: Any = {
        "top": value,
        "object": {"v": value},
        "array": [value],
        "shared": {"a": shared, "b": shared, "v": value},  # the walk for repeated containers
    }[where]
    with pytest.raises(ThreadStoreSerializationError) as caught:
        check_json(wrapped, "metadata")
    assert reason in str(caught.value)
    if "_" in reason:  # a subclass is never described as a value it need not be
        for wrong in ("NaN", "Infinity", "-0.0"):
            assert wrong not in str(caught.value)
