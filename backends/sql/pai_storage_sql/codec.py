"""Row <-> record conversion: UTF-8 identifiers, their digests, and exact JSON text."""

from __future__ import annotations

import json
from typing import TypeVar

from pai_storage import ThreadStoreInvariantError
from pai_storage.backend import StoreModel

__all__ = ["dec", "dump", "enc", "enc_opt", "parse", "run_ref_fields"]

M = TypeVar("M", bound=StoreModel)

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def enc(text: str) -> bytes:
    """An identifier as stored: UTF-8 bytes (their byte order is code-point order)."""
    return text.encode("utf-8")


def enc_opt(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")


def dec(data: bytes) -> str:
    return bytes(data).decode("utf-8")


def dump(record: StoreModel) -> str:
    """The record's JSON form as text (stored verbatim, never a JSON column type)."""
    return _dumps(record.to_json())


def parse(model: type[M], doc: str) -> M:
    """Strictly parse stored JSON text (invalid data raises ``ThreadStoreInvariantError``).

    pydantic parses the text itself (ints stay ints, floats floats, key order
    kept); see :meth:`~pai_storage.backend.StoreModel.model_validate_stored`.
    """
    record: M = model.model_validate_stored(doc)
    return record


def run_ref_fields(doc: str) -> tuple[str, bool, str | None, tuple[str, ...]]:
    """``(status, admitted, queue_item_id, input_message_ids)`` of a stored run."""
    try:
        data = json.loads(doc)
        admission = data["admission"]
        return (
            str(data["status"]),
            bool(admission["admitted"]),
            admission.get("queueItemId"),
            tuple(data["inputMessageIds"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ThreadStoreInvariantError(
            "a stored run is invalid (impossible persisted state)"
        ) from None
