"""Records validated from stored data are remembered, and handed out as copies.

``StoreModel.model_validate_stored`` (and ``_many``) keep, in
``pai_storage.models.stored_records``, the records of texts validated more
than once; a later read of the same text gives a copy made by ``detached``,
which shares nothing mutable with the kept record. Invalid stored data is
never kept: it raises every time.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pai_storage_conformance.suite._support import assert_same_values
from pydantic import BaseModel

from core import strategies as s
from pai_storage import (
    Message,
    MessageDraft,
    Producer,
    QueuedItem,
    RunRecord,
    ThreadRecord,
    ThreadStoreInvariantError,
    models,
)
from pai_storage.families import stamp_message
from pai_storage.memo import StoredMemo
from pai_storage.models import as_validated, detached, planned, stored_records
from pai_storage.pipeline import commit_time

RECORDS: dict[str, tuple[Any, Any]] = {
    "threads": (ThreadRecord, s.thread_records()),
    "messages": (Message, s.messages()),
    "runs": (RunRecord, s.run_records()),
    "queuedItems": (QueuedItem, s.queued_items()),
}


@pytest.fixture(autouse=True)
def fresh_memo() -> Iterator[None]:
    entries, size = stored_records.limits
    stored_records.clear()
    yield
    stored_records.resize(entries=entries, size=size)
    stored_records.clear()


def _containers(value: Any, found: dict[int, Any] | None = None) -> dict[int, Any]:
    """Every dict and list reachable from ``value`` (through models too), by id."""
    found = {} if found is None else found
    if isinstance(value, BaseModel):
        _containers(value.__dict__, found)
        found.pop(id(value.__dict__))  # a model's own namespace is never shared
    elif isinstance(value, dict):
        found[id(value)] = value
        for sub in value.values():
            _containers(sub, found)
    elif isinstance(value, (list, tuple)):
        if isinstance(value, list):
            found[id(value)] = value
        for sub in value:
            _containers(sub, found)
    return found


def _assert_detached(copy: Any, original: Any) -> None:
    assert copy == original
    assert type(copy) is type(original)
    assert repr(copy) == repr(original)
    assert copy.model_fields_set == original.model_fields_set
    assert copy.to_json() == original.to_json()
    assert not _containers(copy).keys() & _containers(original).keys()


@settings(max_examples=100, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(RECORDS)))
def test_detached_copies_share_nothing_mutable(data: st.DataObject, name: str) -> None:
    model, strategy = RECORDS[name]
    record = model.model_validate(data.draw(strategy))
    _assert_detached(detached(record), record)
    _assert_detached(record.deep_copy(), record)


def test_detached_shares_what_cannot_change() -> None:
    record = Message.model_validate(_message())
    copy = detached(record)
    assert copy is not record
    assert copy.producer is record.producer  # strings only
    assert copy.created_at is record.created_at
    assert copy.parts[0] is record.parts[0]  # a text part without provider metadata
    assert copy.metadata is not record.metadata
    producer = record.producer  # a model of strings only
    assert detached(producer) is producer
    assert producer.deep_copy() is not producer
    frozen = (1, "a", None)
    assert detached(frozen) is frozen
    nested = ([1], {"k": (2, [3])})
    copied = detached(nested)
    assert copied == nested
    assert copied[0] is not nested[0]
    assert copied[1]["k"][1] is not nested[1]["k"][1]


def test_detached_copies_a_model_built_without_some_of_its_fields() -> None:
    # model_construct leaves a required field it was not given out of the model:
    # the copy leaves it out too, and still copies what the model holds.
    record = Message.model_construct(message_id="m1", metadata={"k": [1]})
    copy = detached(record)
    assert copy.__dict__ == record.__dict__
    assert "parts" not in copy.__dict__
    assert copy.model_fields_set == record.model_fields_set
    assert not _containers(copy).keys() & _containers(record).keys()


def test_a_part_whose_json_depends_on_its_fields_set_is_never_shared() -> None:
    # A tool-call part's "output" is written when it was set, even to null: its
    # fields set is part of its value, so every copy has its own.
    call = {"type": "tool-call", "toolCallId": "c1", "toolName": "t", "input": "x"}
    text = Message.model_validate(
        _message(parts=[{**call, "state": "input-available"}])
    ).to_json_text()
    reads = [Message.model_validate_stored(text) for _ in range(4)]
    for read in reads:
        read.parts[0].model_fields_set.add("output")
    assert Message.model_validate_stored(text).to_json_text() == text
    assert len({id(read.parts[0]) for read in reads}) == 4


def _message(**changes: Any) -> dict[str, Any]:
    return {
        "messageId": "m1",
        "role": "user",
        "parts": [{"type": "text", "text": "hi"}],
        "producer": {"kind": "user"},
        "association": {"kind": "standalone"},
        "visibility": {"transcript": True, "context": True},
        "status": "complete",
        "metadata": {"k": [1, {"n": 2}]},
        "createdAt": "2026-01-02T03:04:05.678Z",
        "updatedAt": "2026-01-02T03:04:05.678Z",
        **changes,
    }


@pytest.mark.parametrize("many", [False, True], ids=["one", "many"])
def test_a_text_read_again_gives_an_equal_record_sharing_nothing(many: bool) -> None:
    text = Message.model_validate(_message()).to_json_text()

    def read() -> Message:
        if many:
            return Message.model_validate_stored_many([text])[0]
        return Message.model_validate_stored(text)

    first = read()
    assert len(stored_records) == 0  # read once: nothing kept
    second = read()
    assert len(stored_records) == 1  # read twice: a copy kept
    assert stored_records.used == len(text)
    reads = [first, second, read(), read()]
    for one in reads[1:]:
        _assert_detached(one, first)
    for one, other in itertools.pairwise(reads[1:]):
        assert not _containers(one).keys() & _containers(other).keys()
    for one in reads:  # changing what was handed out changes no later read
        one.metadata["k"].append("changed")
        one.parts.clear()
    assert read().to_json() == Message.model_validate(_message()).to_json()


def test_records_are_kept_by_model_and_exact_text() -> None:
    text = Message.model_validate(_message()).to_json_text()
    spaced = text.replace(',"role"', ', "role"')  # the same record, another text
    for _ in range(2):
        Message.model_validate_stored(text)
    assert stored_records.get(Message, text) is not None
    assert stored_records.get(Message, spaced) is None
    assert stored_records.get(ThreadRecord, text) is None
    assert Message.model_validate_stored(spaced) == Message.model_validate_stored(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"messageId": "m1"}',
        "not json",
        Message.model_validate(_message()).to_json_text().replace('"complete"', '"done"'),
    ],
)
def test_invalid_stored_text_raises_every_time_and_is_never_kept(text: str) -> None:
    errors = []
    for _ in range(4):
        with pytest.raises(ThreadStoreInvariantError) as caught:
            Message.model_validate_stored(text)
        errors.append(str(caught.value))
        with pytest.raises(ThreadStoreInvariantError):
            Message.model_validate_stored_many([text])
    assert len(set(errors)) == 1
    assert len(stored_records) == 0


def test_a_page_of_texts_may_come_from_any_iterable() -> None:
    texts = [Message.model_validate(_message(messageId=f"m{i}")).to_json_text() for i in range(3)]
    for _ in range(3):  # nothing kept, then offered, then kept
        for source in (iter(texts), (t for t in texts), map(str, texts), tuple(texts)):
            page = Message.model_validate_stored_many(source)
            assert [m.message_id for m in page] == ["m0", "m1", "m2"]


def test_a_page_mixes_kept_and_new_records_in_order() -> None:
    texts = [Message.model_validate(_message(messageId=f"m{i}")).to_json_text() for i in range(4)]
    Message.model_validate_stored_many(texts[:2])
    Message.model_validate_stored_many(texts[:2])
    assert len(stored_records) == 2
    page = Message.model_validate_stored_many(texts)
    assert [m.message_id for m in page] == ["m0", "m1", "m2", "m3"]


def test_off_keeps_nothing_and_reads_the_same() -> None:
    stored_records.resize(entries=0, size=0)
    text = Message.model_validate(_message()).to_json_text()
    reads = [Message.model_validate_stored(text) for _ in range(3)]
    assert len(stored_records) == 0
    assert reads[0] == reads[2]


# ------------------------------------------------------------------ written records


@settings(max_examples=150, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(RECORDS)))
def test_a_written_record_is_kept_as_validating_its_text_gives_it(
    data: st.DataObject, name: str
) -> None:
    # Validated from a dict (as a commit builds records), a record may have set
    # optional fields to null, which its JSON form omits: what is kept is what
    # reading that text back gives, fields sets included.
    model, strategy = RECORDS[name]
    fields = data.draw(strategy)
    for field in model.model_fields.values():  # optional fields set to null, or not
        if not field.is_required() and field.alias not in fields and data.draw(st.booleans()):
            fields[field.alias] = None
    record = model.model_validate(fields)
    text = record.to_json_text()
    stored_records.resize(entries=0, size=0)
    validated = model.model_validate_stored(text)
    assert_same_values(as_validated(record), validated)
    assert not _containers(as_validated(record)).keys() & _containers(record).keys()
    stored_records.resize(entries=4096, size=4 * 2**20)
    record.keep_written(text)
    assert len(stored_records) == 1  # kept at once, not on a second sighting
    reads = [model.model_validate_stored(text), model.model_validate_stored_many([text])[0]]
    for read in reads:
        assert_same_values(read, validated)
        assert not _containers(read).keys() & _containers(record).keys()
    assert not _containers(reads[0]).keys() & _containers(reads[1]).keys()


def test_nested_optional_fields_set_to_null_are_not_set_in_what_is_kept() -> None:
    part = {"type": "text", "text": "t", "providerMetadata": None}
    call = {"type": "tool-call", "toolCallId": "c", "toolName": "t", "input": 1}
    record = Message.model_validate(
        _message(
            producer={"kind": "user", "id": None},
            parts=[
                part,
                {**call, "state": "output-available", "output": None},
                {**call, "state": "input-available"},
            ],
        )
    )
    kept = as_validated(record)
    assert record.producer.model_fields_set == {"kind", "id"}
    assert kept.producer.model_fields_set == {"kind"}
    assert kept.parts[0].model_fields_set == {"type", "text"}
    assert "output" in kept.parts[1].model_fields_set  # written as null: set
    assert "output" not in kept.parts[2].model_fields_set
    stored_records.resize(entries=0, size=0)
    assert_same_values(kept, Message.model_validate_stored(record.to_json_text()))


def test_what_is_kept_shares_only_nested_models_validation_would_give_alike() -> None:
    # A nested model holding only scalars, with the fields set validation
    # gives, cannot change: it is shared. One with a field set to null is
    # made again with validation's fields set; the record itself always is.
    record = Message.model_validate(_message(producer={"kind": "user", "id": None}))
    kept = as_validated(record)
    assert kept is not record
    assert kept.visibility is record.visibility
    assert kept.producer is not record.producer
    assert kept.producer.model_fields_set == {"kind"}
    assert record.producer.model_fields_set == {"kind", "id"}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(RECORDS)), pair=st.booleans())
def test_a_planned_copy_is_what_detached_gives(data: st.DataObject, name: str, pair: bool) -> None:
    # The memo keeps each record with its copy planned once; every copy made
    # from that plan is the copy detached() makes: the same values, types and
    # fields sets, sharing no container with the kept record or another copy.
    # Records also come kept in a pair with other values (as MongoDB keeps them).
    model, strategy = RECORDS[name]
    value: Any = model.model_validate(data.draw(strategy))
    if pair:
        value = (value, ("kept", {"keys": [1, 2]}, 3))
    kept = planned(value)
    first, second = kept(), kept()
    for copied in (first, second):
        assert_same_values(copied, detached(value))
        assert not _containers(copied).keys() & _containers(value).keys()
    assert not _containers(first).keys() & _containers(second).keys()


def test_a_model_being_looked_at_shows_its_real_optional_fields_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # While a model class's fields are being sorted out, another thread may
    # keep a record of it: what it finds meanwhile may look at more fields,
    # never leave an optional field set that validation would not set.
    seen: list[Any] = []
    alike = models._validated_alike

    def spy(kind: Any) -> bool:
        seen.append(models._VALIDATED.get(Producer))
        return alike(kind)

    monkeypatch.delitem(models._VALIDATED, Producer, raising=False)
    monkeypatch.setattr(models, "_validated_alike", spy)
    models._validated_fields(Producer)
    assert seen
    assert all(entry[1] == ("id",) for entry in seen)
    producer = Producer.model_validate({"kind": "user", "id": None})
    assert as_validated(producer).model_fields_set == {"kind"}


class _Moment(datetime):
    """A clock's own datetime type (as freezegun's or pendulum's clocks give)."""


def test_a_record_stamped_with_a_datetime_of_another_type_is_kept_as_validated() -> None:
    # A commit stamps records with its clock's time, converted to UTC and
    # truncated but of the clock's type; its text holds a timestamp, which
    # validation reads back as a datetime.
    now = commit_time(_Moment(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), None)
    draft = MessageDraft.model_validate(
        {k: v for k, v in _message().items() if k not in ("createdAt", "updatedAt")}
    )
    record = stamp_message(None, draft, now)
    stored_records.resize(entries=0, size=0)
    validated = Message.model_validate_stored(record.to_json_text())
    assert type(validated.created_at) is datetime
    assert_same_values(as_validated(record), validated)


def test_a_written_record_changed_afterwards_changes_no_read() -> None:
    record = Message.model_validate(_message(parts=[{"type": "data", "name": "d", "data": [1]}]))
    text = record.to_json_text()
    record.keep_written(text)
    record.metadata["k"].append("changed")
    record.parts[0].data.append("changed")
    record.model_fields_set.discard("metadata")
    assert Message.model_validate_stored(text).to_json_text() == text


def test_a_written_record_is_not_copied_when_it_would_not_be_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The copy is the commit's cost of keeping a record: with the memo off, or
    # a text too long to keep, a commit does not pay it.
    copies: list[Any] = []
    monkeypatch.setattr(models, "as_validated", lambda value: copies.append(value) or value)
    record = Message.model_validate(_message())
    text = record.to_json_text()
    stored_records.resize(entries=0, size=0)
    record.keep_written(text)
    stored_records.resize(entries=4096, size=64 * (len(text) - 1))
    record.keep_written(text)
    assert copies == []
    assert len(stored_records) == 0
    stored_records.resize(entries=4096, size=64 * len(text))
    record.keep_written(text)
    assert copies == [record]
    assert len(stored_records) == 1


# ------------------------------------------------------------------ the memo


def _memo(entries: int = 3, size: int = 6400) -> StoredMemo[Any]:
    return StoredMemo(detached, entries=entries, size=size)


def _offer_twice(memo: StoredMemo[Any], data: str | bytes, value: Any, kind: Any = "k") -> None:
    memo.add(kind, data, value)
    memo.add(kind, data, value)


def test_a_value_is_kept_the_second_time_and_handed_out_as_copies() -> None:
    memo = _memo()
    value: dict[str, list[Any]] = {"a": [1]}
    memo.add("k", "x", value)
    assert memo.get("k", "x") is None
    memo.add("k", "x", value)
    value["a"].append("changed by the caller")
    found = memo.get("k", "x")
    assert found == {"a": [1]}
    found["a"].append(2)
    assert memo.get("k", "x") == {"a": [1]}
    assert memo.get("other kind", "x") is None


def test_a_kept_value_is_kept_at_once_and_handed_out_as_copies() -> None:
    memo = _memo(entries=2)
    value: dict[str, list[Any]] = {"a": [1]}
    memo.keep("k", "x", value)
    found = memo.get("k", "x")
    assert found == {"a": [1]}
    assert found is not value
    found["a"].append(2)
    assert memo.get("k", "x") == {"a": [1]}
    memo.keep("k", "x", {"a": ["another value"]})  # the first kept stays
    assert memo.get("k", "x") == {"a": [1]}
    for data in ("y", "z"):  # within the bounds, the oldest first
        memo.keep("k", data, data)
    assert memo.get("k", "x") is None
    assert len(memo) == 2
    assert all(map(memo.keeps, ("x", b"x", "e" * 100)))
    assert not any(map(memo.keeps, ("e" * 101, bytearray(b"b"))))
    memo.keep("k", "e" * 101, "too long")
    memo.keep("k", bytearray(b"b"), "not text")
    assert memo.get("k", "e" * 101) is None
    assert len(memo) == 2
    memo.resize(entries=0, size=0)
    assert not memo.keeps("w")
    memo.keep("k", "w", "off")
    assert len(memo) == 0


def test_the_oldest_go_first_within_both_bounds() -> None:
    memo = _memo(entries=3, size=6400)  # data of up to 100 characters
    for data in ("a" * 10, "b" * 10, "c" * 10, "d" * 10):
        _offer_twice(memo, data, data)
    assert len(memo) == 3
    assert memo.get("k", "a" * 10) is None
    assert memo.get("k", "d" * 10) == "d" * 10
    _offer_twice(memo, "e" * 101, "too long")
    assert memo.get("k", "e" * 101) is None
    assert memo.used == 30
    memo.resize(entries=100, size=6400)
    for n in range(70):  # 100 characters each: 64 of them fill the size
        _offer_twice(memo, f"{n:03d}" + "x" * 97, n)
    assert memo.used <= 6400
    assert len(memo) == 64
    assert memo.get("k", "000" + "x" * 97) is None  # the oldest went first
    assert memo.get("k", "069" + "x" * 97) == 69
    memo.resize(entries=100, size=3200)  # data of up to 50 characters from now on
    assert len(memo) == 0
    assert memo.used == 0
    _offer_twice(memo, "f" * 50, "kept")
    assert memo.get("k", "f" * 50) == "kept"
    assert memo.limits == (100, 3200)
    memo.clear()
    assert len(memo) == 0
    assert memo.used == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", None])
def test_resize_takes_integers_of_zero_or_more(bad: Any) -> None:
    memo = _memo()
    with pytest.raises(ValueError, match="entries"):
        memo.resize(entries=bad, size=10)
    with pytest.raises(ValueError, match="size"):
        memo.resize(entries=10, size=bad)
    assert memo.limits == (3, 6400)


def test_only_text_and_bytes_are_kept() -> None:
    memo = _memo()
    for data in (bytearray(b"x"), memoryview(b"x"), memoryview(bytearray(b"x"))):
        _offer_twice(memo, cast(Any, data), "value")
        assert memo.get("k", cast(Any, data)) is None
    assert len(memo) == 0
    text = Message.model_validate(_message()).to_json_text()
    for _ in range(3):  # a stored record may come as a bytearray, never kept
        record = Message.model_validate_stored(cast(Any, bytearray(text.encode())))
        assert record == Message.model_validate_json(text)
    assert len(stored_records) == 0


def test_bytes_and_text_are_kept_apart() -> None:
    memo = _memo()
    _offer_twice(memo, "x", "text")
    _offer_twice(memo, b"x", "bytes")
    assert memo.get("k", "x") == "text"
    assert memo.get("k", b"x") == "bytes"


def test_threads_sharing_a_memo_keep_it_within_its_bounds() -> None:
    memo = _memo(entries=50, size=64 * 400)
    failures: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(3000):
                data = f"{worker}-{i % 120}-" + "x" * (i % 300)
                found = memo.get("k", data)
                if found is not None and found != [data]:
                    raise AssertionError(f"{data!r} gave {found!r}")
                memo.add("k", data, [data])
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert len(memo) <= 50
    assert memo.used <= 64 * 400
    assert memo.used == sum(len(key[1]) for key in memo._values)
