"""``codec.encode`` keeps the record it encodes as the record of its text, exactly
when decoding the text gives that record: what a read of it then gets from the
cache is what decoding gives, value for value (the conformance suite checks the
same through the stores: ``immutability.py``)."""

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pai_storage_conformance.suite._support import assert_same_values
from pydantic import BaseModel

from pai_storage import Message, RunRecord, ThreadRecord, codec
from pai_storage import builders as b
from pai_storage.families import stamp_message, stamp_run
from pai_storage.fields import truncate_ms
from pai_storage.models import MessageDraft, Producer, RunDraft, StoreModel, ToolCallPart

from . import strategies as s

NOW = datetime(2026, 12, 7, 1, 2, 3, 456000, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    codec.cache.clear()
    yield
    codec.cache.clear()


def _decoded(model: type[StoreModel], text: str) -> Any:
    """What decoding ``text`` gives, with no cache (which forgets every record kept)."""
    entries, size = codec.cache.limits
    codec.cache.resize(entries=0, size=0)
    try:
        return codec.decode(model, text)
    finally:
        codec.cache.resize(entries=entries, size=size)


def _kept_or_decoded(record: StoreModel) -> None:
    """Encoding ``record`` keeps it exactly when it is what its text decodes to;
    either way the next decode of the text gives what decoding gives."""
    text = codec.encode(record)
    read = codec.decode(type(record), text)
    fresh = _decoded(type(record), text)  # (forgets every kept record)
    assert_same_values(read, fresh)
    try:
        assert_same_values(record, fresh)
    except AssertionError:
        assert read is not record  # not kept: decoded
    else:
        assert read is record  # kept: nothing decoded


def test_the_records_a_commit_writes_are_kept() -> None:
    draft = MessageDraft.model_validate(b.message("m1", "hi", run_id="r1", relation="input"))
    message = stamp_message(None, draft, NOW)
    run = stamp_run(None, RunDraft.model_validate(b.run("r1", "completed", inputs=["m1"])), NOW)
    for record in (message, run):
        assert codec.decode(type(record), codec.encode(record)) is record


def test_a_built_root_sets_only_the_fields_its_json_form_carries() -> None:
    fields = ThreadRecord.model_validate(
        {
            "scopeKey": "s",
            "threadId": "t",
            "version": {"threadInstanceId": "i", "revision": 1},
            "agent": "a",
            "directExecutionAllowed": True,
            "listVisibility": "visible",
            "metadata": {"a": [1.5, None]},
            "privateMetadata": {},
            "createdAt": "2026-12-07T01:02:03.456Z",
            "updatedAt": "2026-12-07T01:02:03.456Z",
        }
    ).__dict__
    root = ThreadRecord.trusted(dict(fields))  # title, category, ... given as None
    assert {"title", "category", "parent_thread_id", "lease"}.isdisjoint(root.model_fields_set)
    assert codec.decode(ThreadRecord, codec.encode(root)) is root


@pytest.mark.parametrize(
    ("model", "data"),
    [
        # An optional field given as None is set; its JSON form omits it.
        (MessageDraft, {**b.message("m1"), "producer": {"kind": "user", "id": None}}),
        (
            MessageDraft,
            {**b.message("m1"), "parts": [{"type": "text", "text": "t", "providerMetadata": None}]},
        ),
        # A tool call's output may be null: given as None it is carried, and set.
        (
            MessageDraft,
            {
                **b.message("m1"),
                "parts": [
                    {
                        "type": "tool-call",
                        "toolCallId": "c",
                        "toolName": "n",
                        "input": {},
                        "state": "output-available",
                        "output": None,
                    }
                ],
            },
        ),
        (RunDraft, {**b.run("r1", "failed"), "error": None}),
    ],
    ids=["producer-id-none", "part-metadata-none", "tool-output-null", "run-error-none"],
)
def test_a_record_with_fields_given_as_none_reads_back_as_decoded(
    model: type[MessageDraft | RunDraft], data: dict[str, Any]
) -> None:
    draft = model.model_validate(data)
    record: StoreModel = (
        stamp_message(None, draft, NOW)
        if isinstance(draft, MessageDraft)
        else stamp_run(None, draft, NOW)
    )
    _kept_or_decoded(record)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EVERY_RECORD_MODEL = pytest.mark.parametrize(
    ("model", "strategy"),
    [
        (ThreadRecord, s.thread_records()),
        (Message, s.messages()),
        (RunRecord, s.run_records()),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)


@EVERY_RECORD_MODEL
@SETTINGS
@given(data=st.data())
def test_validated_and_built_records_read_back_as_decoded(
    model: type[StoreModel], strategy: Any, data: Any
) -> None:
    validated = model.model_validate(data.draw(strategy))
    _kept_or_decoded(validated)
    codec.cache.clear()
    _kept_or_decoded(model.trusted(dict(validated.__dict__)))
    codec.cache.clear()
    # The same values with every field set, those left None too (which the
    # JSON form omits): not kept when there is one.
    _kept_or_decoded(model.model_construct(set(model.model_fields), **validated.__dict__))


def _carried(record: StoreModel) -> set[str]:
    """The fields ``record``'s JSON form carries, by :func:`codec.json_shape`."""
    shape = codec.json_shape(type(record))
    values, fields_set = record.__dict__, record.__pydantic_fields_set__
    return (
        set(shape.required)
        | {name for name, _ in shape.when_not_none if values[name] is not None}
        | {name for name, _ in shape.when_set if name in fields_set}
    )


def _assert_shape_holds(record: StoreModel, decoded: StoreModel) -> None:
    carried = _carried(record)
    fields = type(record).model_fields
    assert set(record.to_json()) == {fields[name].alias or name for name in carried}
    assert decoded.model_fields_set == carried
    for name in codec.json_shape(type(record)).nested:
        value, read = getattr(record, name), getattr(decoded, name)
        pairs = (
            zip(value, read, strict=True) if isinstance(value, tuple | list) else [(value, read)]
        )
        for part, read_part in pairs:
            if isinstance(part, StoreModel):
                _assert_shape_holds(part, read_part)


@EVERY_RECORD_MODEL
@SETTINGS
@given(data=st.data())
def test_the_json_shape_names_what_the_json_form_carries_and_decoding_sets(
    model: type[StoreModel], strategy: Any, data: Any
) -> None:
    # One rule (codec.json_shape) for the serializers, trusted() and encode():
    # the form's keys, model by model, and the fields decoding sets.
    record = model.model_validate(data.draw(strategy))
    _assert_shape_holds(record, _decoded(model, codec.json_text(record)))


def test_a_tool_calls_output_is_carried_when_set_even_if_null() -> None:
    shape = codec.json_shape(ToolCallPart)
    assert shape.when_set == (("output", "output"),)
    assert ("error_text", "errorText") in shape.when_not_none
    assert {"type", "tool_call_id", "tool_name", "input", "state"} == shape.required


def test_a_plain_models_json_form_carries_every_field() -> None:
    class Plain(BaseModel):
        a: int
        b: int | None = None

    given_a = Plain(a=1)  # decoding its text sets b as well: not kept
    text = codec.encode(given_a)
    assert text == '{"a":1,"b":null}'
    assert codec.cache.get(Plain, text) is None
    both = Plain(a=1, b=None)
    assert codec.encode(both) == text
    assert codec.cache.get(Plain, text) is both


def test_to_json_text_keeps_nothing() -> None:
    # A caller's record need not be validated (model_copy(update=...) is not):
    # only what a store writes is kept.
    draft = MessageDraft.model_validate(b.message("m1"))
    message = stamp_message(None, draft, NOW).model_copy(update={"metadata": {"x": 1}})
    read = codec.decode(Message, message.to_json_text())
    assert read is not message
    with pytest.raises(TypeError):
        read.metadata["x"] = 2  # type: ignore[index]


def _tool_part(fields_set: set[str], **values: Any) -> ToolCallPart:
    return ToolCallPart.model_construct(
        fields_set,
        type="tool-call",
        tool_call_id="c",
        tool_name="n",
        input={},
        state="output-available",
        **values,
    )


@pytest.mark.parametrize(
    "given",
    [
        # A caller's models keep their own fields set through validation.
        {"parts": [_tool_part({"type", "tool_call_id", "tool_name", "input", "state"}, output=1)]},
        {"producer": Producer.model_construct(set(), kind="user")},
        {"producer": Producer.model_construct({"kind", "id", "bogus"}, kind="user", id="p")},
        # Not a set (model_copy(update=...) would fail on the record read).
        {"producer": Producer.model_construct(frozenset({"kind"}), kind="user")},
    ],
    ids=["output-valued-but-unset", "required-field-unset", "unknown-field-set", "frozen-set"],
)
def test_a_record_whose_models_set_other_fields_is_not_kept(given: dict[str, Any]) -> None:
    draft = MessageDraft.model_validate({**b.message("m1"), **given})
    record = stamp_message(None, draft, NOW)
    text = codec.encode(record)
    read = codec.decode(Message, text)
    assert read is not record
    assert read.producer.model_copy(update={"id": "x"}).id == "x"
    assert_same_values(read, _decoded(Message, text))


class _Moment(datetime):
    pass


@pytest.mark.parametrize(
    "moment",
    [NOW.replace(fold=1), _Moment(2026, 12, 7, 1, 2, 3, 456789, tzinfo=UTC)],
    ids=["fold", "datetime-subclass"],
)
def test_a_clock_time_is_stamped_as_decoding_gives_it(moment: datetime) -> None:
    # A store's test clock goes through truncate_ms: what it stamps is what
    # decoding the stamp's JSON form gives, so the record is kept and reads back
    # as decoded.
    now = truncate_ms(moment)
    assert (type(now), now.fold, now.tzinfo) == (datetime, 0, UTC)
    record = stamp_message(None, MessageDraft.model_validate(b.message("m1")), now)
    assert codec.decode(Message, codec.encode(record)) is record
    _kept_or_decoded(record)
