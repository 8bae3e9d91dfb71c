"""A record encoded is kept in the codec's cache: the text decodes to that very record.

That is only right if decoding the text would give a record indistinguishable
from it, so these check both: the cache hands back the encoded record itself,
and with the cache off the text decodes to an equal record of the same type
with the same JSON form, for records of every kind, including ones whose
timestamps were given as ``datetime`` values with microseconds and offsets.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pai_storage import codec
from pai_storage.models import Message, QueuedItem, RunRecord, ThreadRecord

from .strategies import messages, queued_items, run_records, thread_records

KINDS = st.one_of(
    thread_records().map(lambda d: (ThreadRecord, d)),
    messages().map(lambda d: (Message, d)),
    run_records().map(lambda d: (RunRecord, d)),
    queued_items().map(lambda d: (QueuedItem, d)),
)


@pytest.fixture
def no_cache() -> Iterator[None]:
    entries, size = codec.cache.limits
    yield
    codec.cache.resize(entries=entries, size=size)


def _fresh(model: type[Any], text: str) -> Any:
    """``text`` decoded with the cache off (then back to its bounds, emptied)."""
    entries, size = codec.cache.limits
    codec.cache.resize(entries=0, size=0)
    try:
        return codec.decode(model, text)
    finally:
        codec.cache.resize(entries=entries, size=size)


@settings(max_examples=300, deadline=None)
@given(KINDS)
def test_an_encoded_record_decodes_to_itself_and_equals_a_fresh_decode(
    kind: tuple[type[Any], dict[str, Any]],
) -> None:
    model, data = kind
    record = model.model_validate(data)
    codec.cache.clear()  # an equal record of an earlier example would be kept instead
    text = codec.encode(record)
    assert codec.decode(model, text) is record
    fresh = _fresh(model, text)
    assert fresh is not record
    assert type(fresh) is type(record)
    assert fresh == record
    assert codec.json_form(fresh) == codec.json_form(record)
    assert codec.encode(fresh) == text


def test_timestamps_given_as_datetimes_are_kept_as_their_text_reads_back(
    no_cache: None,
) -> None:
    """A timestamp given with microseconds and an offset is validated to UTC
    milliseconds: the record kept for the text is the one its text reads back."""
    moment = datetime(2030, 1, 2, 3, 4, 5, 678_901, tzinfo=timezone(timedelta(hours=5)))
    data = {
        "messageId": "m1",
        "role": "user",
        "parts": [{"type": "text", "text": "hello"}],
        "producer": {"kind": "user"},
        "association": {"kind": "standalone"},
        "visibility": {"transcript": True, "context": True},
        "status": "complete",
        "metadata": {},
        "createdAt": moment,
        "updatedAt": moment,
    }
    record = Message.model_validate(data)
    text = codec.encode(record)
    fresh = _fresh(Message, text)
    assert fresh == record
    assert fresh.created_at == record.created_at
    assert fresh.created_at.tzinfo == record.created_at.tzinfo
