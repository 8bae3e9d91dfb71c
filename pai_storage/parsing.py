"""Strict parsers: the JSON form of any record, input, result or whole aggregate.

Each parser accepts the JSON form (``docs/data-model.md#the-json-form``) (or the model
itself) and raises :class:`ThreadStoreInvariantError` /
:class:`ThreadStoreSerializationError` naming the path of the first problem.
:func:`parse` also handles the union types (``CommitThreadResult``, ``Part``,
``LeaseChange``, ...), which have no ``model_validate`` of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .aggregate import ThreadAggregate
from .fields import convert_validation_error
from .models import (
    CommitThreadResult,
    Message,
    QueuedItem,
    RunRecord,
    ThreadRecord,
)

__all__ = [
    "parse",
    "parse_aggregate",
    "parse_commit_result",
    "parse_message",
    "parse_queued_item",
    "parse_run",
    "parse_thread",
]


@cache
def _adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def parse(tp: Any, data: Any) -> Any:
    """Validate ``data`` (the JSON form) as ``tp``: a model or a union alias."""
    try:
        return _adapter(tp).validate_python(data)
    except ValidationError as exc:
        what = tp.__name__ if isinstance(tp, type) else "value"
        raise convert_validation_error(exc, what, data) from None


def parse_thread(data: Mapping[str, Any]) -> ThreadRecord:
    return ThreadRecord.model_validate(data)


def parse_message(data: Mapping[str, Any]) -> Message:
    return Message.model_validate(data)


def parse_run(data: Mapping[str, Any]) -> RunRecord:
    return RunRecord.model_validate(data)


def parse_queued_item(data: Mapping[str, Any]) -> QueuedItem:
    return QueuedItem.model_validate(data)


def parse_commit_result(data: Mapping[str, Any]) -> Any:
    """A ``CommittedResult`` or ``ConflictResult`` from its JSON form."""
    return parse(CommitThreadResult, data)


def parse_aggregate(data: Mapping[str, Any]) -> ThreadAggregate:
    """A whole thread (see :meth:`ThreadAggregate.to_json`), checked strictly."""
    return ThreadAggregate.from_json(data)
