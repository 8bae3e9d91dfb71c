"""Small helpers and input tables shared by the suite's topic modules."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test
from pydantic import BaseModel


def assert_same_values(one: Any, other: Any, path: str = "") -> None:
    """``one`` and ``other`` hold the same values of the same types: every model
    with the same fields set, itself of the same type (it decides what
    ``exclude_unset`` and a tool-call part's JSON form hold), every dict with
    its keys in the same order, every timestamp with the same time zone
    object."""
    assert type(one) is type(other), path
    if isinstance(one, BaseModel):
        assert one.model_fields_set == other.model_fields_set, path
        assert type(one.model_fields_set) is type(other.model_fields_set), path
        assert one.__pydantic_extra__ == other.__pydantic_extra__, path
        assert one.__pydantic_private__ == other.__pydantic_private__, path
        assert_same_values(one.__dict__, other.__dict__, path)
    elif isinstance(one, dict):
        assert list(one) == list(other), path
        for key in one:
            assert_same_values(one[key], other[key], f"{path}.{key}")
    elif isinstance(one, list | tuple):
        assert len(one) == len(other), path
        for i, (item, other_item) in enumerate(zip(one, other, strict=True)):
            assert_same_values(item, other_item, f"{path}[{i}]")
    elif isinstance(one, datetime):
        # Equal instants may still differ in their time zone object (its
        # repr, its name) or their fold.
        assert (one, one.tzinfo, one.fold) == (other, other.tzinfo, other.fold), path
    else:
        assert one == other, path


def new_scope(tag: str = "") -> str:
    """A fresh scope key, so tests never see each other's threads (even on a shared store)."""
    return f"scope-{tag}{'-' if tag else ''}{uuid4().hex}"


MAC_BYTES = 16
"""The length of a page token's integrity check (the last bytes of the token)."""


def token_parts(token: str) -> tuple[bytes, bytes, bytes]:
    """``(prefix and dot, JSON payload, mac)`` of a page token (one base64url string)."""
    blob = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    dot = blob.index(b".") + 1
    return blob[:dot], blob[dot:-MAC_BYTES], blob[-MAC_BYTES:]


def token_payload(token: str) -> dict[str, Any]:
    """The JSON payload of a page token (tokens are not secret, only tamper-evident)."""
    payload: dict[str, Any] = json.loads(token_parts(token)[1])
    return payload


def token_of(head: bytes, payload: bytes, mac: bytes) -> str:
    """A page token of these parts (the inverse of :func:`token_parts`)."""
    return base64.urlsafe_b64encode(head + payload + mac).rstrip(b"=").decode()


def tampered_token(token: str) -> str:
    """``token`` with one character of its JSON payload changed (its mac kept)."""
    head, payload, mac = token_parts(token)
    middle = len(payload) // 2
    flipped = b"A" if payload[middle : middle + 1] != b"A" else b"B"
    return token_of(head, payload[:middle] + flipped + payload[middle + 1 :], mac)


async def run_model(
    machine: type[RuleBasedStateMachine],
    *,
    examples: int,
    steps: int,
    also_suppress: Iterable[HealthCheck] = (),
) -> None:
    """Run a model-based (Hypothesis stateful) test in a worker thread.

    The machine's rules drive the store on the test's event loop, so the
    machine runs off that loop. No deadline, no example database, the first
    failure only; the ``too_slow`` and ``data_too_large`` health checks (a
    store over a network is slow) are off, plus ``also_suppress``.
    """
    checks_off = [HealthCheck.too_slow, HealthCheck.data_too_large, *also_suppress]
    await asyncio.to_thread(
        run_state_machine_as_test,
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            report_multiple_bugs=False,
            suppress_health_check=checks_off,
        ),
    )


# ---------------------------------------------------------------- input tables

HOSTILE_NAMES = (
    "a",
    "ab",
    "a ",
    "A",
    "\u0430",  # Cyrillic a, looks like "a"
    "\u0410",  # Cyrillic capital A, looks like "A"
    "\uff41",  # fullwidth a
    "e\u0301",  # e + combining acute
    "\u00e9",  # precomposed e acute
    "a.b",
    "a.",
    ".",
    "..",
    "a$b",
    "$where",
    "$set",
    "$",
    "a%",
    "%",
    "%_",
    "%2E",
    "%25",
    "%24",
    "a_",
    "_",
    "a\\",
    "\\",
    "'",
    "a'b",
    '"',
    'a"b',
    "a*",
    "*",
    "a?",
    "?",
    "a[b]",
    "[",
    "]",
    "^a.*$",
    ".*",
    "a|b",
    "a\u0001",
    "a\u001e",
    "a\u0020b",
    "a\uffff",
    "a\U0001f600",
    "a/b",
    "null",
    "states",
    "versions",
    "hashes",
    "_id",
    "_updated_at",
    "anonymous",
    "x" * 1024,
)
"""Valid names that must stay apart whatever a backend's matching rules are.

Look-alikes, regex, ``LIKE`` and path metacharacters, operator-looking and
percent-encoded-looking strings, document field names, and neighbours of
U+001F (the namespace separator). All distinct; the longest allowed name
(1,024 characters) comes last, so a test can prefix all the others with a tag.
"""

BAD_NAMES: tuple[tuple[object, str], ...] = (
    ("", "1 to 1024 characters"),
    ("x" * 1025, "1 to 1024 characters"),
    ("a\x00b", "U+0000"),
    ("a\x1fb", "U+001F"),
    ("a\ud800b", "surrogate"),
    ("a\ud800", "surrogate"),
    (42, "must be a str"),
    (None, "must be a str"),
    (b"bytes", "must be a str"),
)
"""Names every runtime store refuses, with words its message must contain."""

BAD_DURATIONS: tuple[object, ...] = (
    timedelta(0),
    timedelta(microseconds=500),
    timedelta(seconds=-1),
    5,
    5.0,
    "30s",
)
"""Durations (a ttl, a lease) every runtime store refuses."""
