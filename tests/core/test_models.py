"""Property and unit tests of the record and input models (docs/data-model.md#the-json-form)."""

from __future__ import annotations

import copy
import json
import pickle
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pai_storage import (
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    Message,
    QueuedItem,
    ReadThreadInput,
    RunRecord,
    TextPart,
    ThreadLease,
    ThreadReadResult,
    ThreadRecord,
    ThreadVersion,
    ToolCallPart,
)
from pai_storage import builders as b
from pai_storage.backend import format_timestamp, truncate_ms
from pai_storage.errors import ThreadStoreInvariantError, ThreadStoreSerializationError
from pai_storage.models import MessageDraft, RunDraft, TruncateChange
from pai_storage.strict_json import MAX_JSON_DEPTH

from . import strategies as s
from .test_strict_json import watchdog

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def exact(value: Any) -> str:
    """Type-strict, key-order-sensitive rendering (1 != 1.0 != True; key order matters)."""
    return json.dumps(value)


def same(a: Any, b: Any) -> bool:
    """Type-strict equality, ignoring key order (record field order is not specified)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def opaque_values(model_name: str, data: dict[str, Any]) -> list[Any]:
    """The opaque JSON members of a record's JSON form (their key order must survive)."""
    found: list[Any] = []
    for key in ("metadata", "privateMetadata", "input", "output", "data"):
        if key in data:
            found.append(data[key])
    for key in ("providerMetadata", "callProviderMetadata", "resultProviderMetadata"):
        if key in data:
            found.append(data[key])
    for part in data.get("parts", []):
        found.extend(opaque_values("part", part))
    return found


def check_round_trip(model: Any, data: dict[str, Any]) -> Any:
    value = model.model_validate(data)
    out = value.to_json()
    assert same(out, data)
    # The fast JSON form is exactly pydantic's own dump, and its text parses back to it.
    assert same(out, value.model_dump(mode="json", by_alias=True))
    assert same(json.loads(value.to_json_text()), out)
    assert exact(opaque_values(model.__name__, out)) == exact(opaque_values(model.__name__, data))
    again = model.model_validate(out)
    assert again == value
    assert same(again.to_json(), data)
    return value


# ---------------------------------------------------------------- round trips


@SETTINGS
@given(s.versions())
def test_thread_version_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(ThreadVersion, data)


@SETTINGS
@given(s.leases())
def test_thread_lease_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(ThreadLease, data)


@SETTINGS
@given(s.thread_records())
def test_thread_record_round_trip(data: dict[str, Any]) -> None:
    record = check_round_trip(ThreadRecord, data)
    public = record.public_json()
    assert "privateMetadata" not in public
    assert exact(public["metadata"]) == exact(data["metadata"])


@SETTINGS
@given(s.messages())
def test_message_round_trip(data: dict[str, Any]) -> None:
    message = check_round_trip(Message, data)
    draft = message.to_draft()
    assert isinstance(draft, MessageDraft)
    expected = {k: v for k, v in data.items() if k not in ("createdAt", "updatedAt")}
    assert same(draft.to_json(), expected)


@SETTINGS
@given(s.message_drafts())
def test_message_draft_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(MessageDraft, data)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "text", "text": "hi"},
        {"type": "text", "text": "hi", "providerMetadata": {"b": 1, "a": 2.0}},
        {"type": "reasoning", "text": "because"},
        {"type": "file", "mediaType": "image/png", "url": "https://x/y.png"},
        {
            "type": "file",
            "mediaType": "image/png",
            "url": "u",
            "filename": "y.png",
            "providerMetadata": {},
        },
        {
            "type": "tool-call",
            "toolCallId": "c1",
            "toolName": "t",
            "input": {},
            "state": "input-streaming",
        },
        {
            "type": "tool-call",
            "toolCallId": "c1",
            "toolName": "t",
            "input": [1, "x"],
            "state": "output-available",
            "output": None,
            "errorText": "e",
            "callProviderMetadata": {"a": None},
            "resultProviderMetadata": {"z": [True]},
        },
        {"type": "data", "name": "chart", "data": {"points": [1, 2.5]}},
        {"type": "data", "name": "nothing", "data": None},
    ],
)
def test_every_part_type_round_trips(part: dict[str, Any]) -> None:
    data = b.message("m1")
    data["parts"] = [part]
    data["createdAt"] = "2030-01-01T00:00:00.000Z"
    data["updatedAt"] = "2030-01-01T00:00:00.001Z"
    check_round_trip(Message, data)


@SETTINGS
@given(s.run_records())
def test_run_record_round_trip(data: dict[str, Any]) -> None:
    run = check_round_trip(RunRecord, data)
    assert "privateMetadata" not in run.public_json()
    draft = run.to_draft()
    assert isinstance(draft, RunDraft)
    assert "admittedAt" not in draft.to_json()["admission"]


@SETTINGS
@given(s.run_drafts())
def test_run_draft_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(RunDraft, data)


@SETTINGS
@given(s.queued_items())
def test_queued_item_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(QueuedItem, data)


@SETTINGS
@given(s.read_results())
def test_thread_read_result_round_trip(data: dict[str, Any]) -> None:
    result = check_round_trip(ThreadReadResult, data)
    assert "thread" in result.to_json()


@SETTINGS
@given(s.commit_inputs())
def test_commit_input_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(CommitThreadInput, data)


@SETTINGS
@given(s.list_inputs())
def test_list_input_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(ListThreadsInput, data)


@SETTINGS
@given(s.read_inputs())
def test_read_input_round_trip(data: dict[str, Any]) -> None:
    check_round_trip(ReadThreadInput, data)


# ---------------------------------------------------------------- absent vs null


def test_optional_fields_are_omitted_never_null() -> None:
    part = TextPart(type="text", text="x")
    assert part.to_json() == {"type": "text", "text": "x"}
    version = ThreadVersion(thread_instance_id="i", revision=1)
    lease = ThreadLease(
        kind="run",
        run_id="r",
        owner_id="o",
        operation="send",
        acquired_at=datetime(2030, 1, 1, tzinfo=UTC),
        expires_at=datetime(2030, 1, 1, 0, 1, tzinfo=UTC),
    )
    assert "renewedAt" not in lease.to_json()
    record = ThreadRecord(
        scope_key="s",
        thread_id="t",
        version=version,
        agent="a",
        direct_execution_allowed=False,
        list_visibility="visible",
        metadata={},
        private_metadata={},
        created_at=datetime(2030, 1, 1, tzinfo=UTC),
        updated_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    out = record.to_json()
    for key in ("parentThreadId", "category", "title", "lease"):
        assert key not in out
    assert None not in out.values()


def test_required_nullable_fields_are_kept_as_null() -> None:
    result = ThreadReadResult(observed_at=datetime(2030, 1, 1, tzinfo=UTC), thread=None)
    assert result.to_json() == {"observedAt": "2030-01-01T00:00:00.000Z", "thread": None}
    assert ConflictResult(type="conflict", current_version=None).to_json() == {
        "type": "conflict",
        "currentVersion": None,
    }
    assert TruncateChange(type="truncate", after_id=None).to_json() == {
        "type": "truncate",
        "afterId": None,
    }
    with pytest.raises(ThreadStoreInvariantError, match="thread"):
        ThreadReadResult.model_validate({"observedAt": "2030-01-01T00:00:00.000Z"})
    with pytest.raises(ThreadStoreInvariantError, match="afterId"):
        TruncateChange.model_validate({"type": "truncate"})
    with pytest.raises(ThreadStoreInvariantError, match="currentVersion"):
        ConflictResult.model_validate({"type": "conflict"})


def test_tool_output_null_is_kept_only_when_given() -> None:
    base = {
        "type": "tool-call",
        "toolCallId": "c",
        "toolName": "n",
        "input": None,
        "state": "input-available",
    }
    assert "output" not in ToolCallPart.model_validate(base).to_json()
    with_null = ToolCallPart.model_validate({**base, "output": None})
    assert with_null.to_json()["output"] is None
    assert (
        ToolCallPart(
            type="tool-call",
            tool_call_id="c",
            tool_name="n",
            input=None,
            state="output-available",
            output=None,
        ).to_json()["output"]
        is None
    )


# ---------------------------------------------------------------- rejection


def test_unknown_field_rejected_with_path() -> None:
    data = b.message("m1")
    data["extra"] = 1
    with pytest.raises(ThreadStoreInvariantError, match=r"extra") as err:
        MessageDraft.model_validate(data)
    assert not isinstance(err.value, ThreadStoreSerializationError)


def test_nested_unknown_field_rejected_with_path() -> None:
    commit = b.create(
        "s", "t", {"messages": [{"type": "insert", "record": {**b.message("m1"), "bogus": 1}}]}
    )
    with pytest.raises(ThreadStoreInvariantError) as err:
        CommitThreadInput.model_validate(commit)
    assert "mutation.changes.messages[0].record.bogus" in str(err.value)


@pytest.mark.parametrize("part_type", ["text", "reasoning", "data"])
def test_unknown_field_in_part_names_the_part_path(part_type: str) -> None:
    part: dict[str, Any] = {"type": part_type, "foo": 1}
    if part_type == "data":
        part.update(name="n", data=1)
    else:
        part["text"] = "x"
    data = b.message("m1")
    data["parts"] = [part]
    with pytest.raises(ThreadStoreInvariantError) as err:
        MessageDraft.model_validate(data)
    # The discriminator tag is not part of the path; a "text" or "data" part
    # also has a field of that name, which must not be mistaken for the tag.
    assert "parts[0].foo" in str(err.value)


def test_unknown_part_type_rejected() -> None:
    data = b.message("m1")
    data["parts"] = [{"type": "image", "text": "x"}]
    with pytest.raises(ThreadStoreInvariantError, match=r"parts\[0\]"):
        MessageDraft.model_validate(data)


def test_empty_parts_rejected() -> None:
    data = b.message("m1")
    data["parts"] = []
    with pytest.raises(ThreadStoreInvariantError, match="parts"):
        MessageDraft.model_validate(data)


def test_strict_json_error_in_model_names_full_path() -> None:
    data = b.message("m1", metadata={"items": [0, 1, 2, {"score": float("nan")}]})
    with pytest.raises(ThreadStoreSerializationError) as err:
        MessageDraft.model_validate(data)
    assert err.value.path == "metadata.items[3].score"
    assert "NaN" in err.value.reason


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("messageId", ""),
        ("messageId", "x" * 1025),
        ("messageId", "a\ud800"),
        ("messageId", 5),
        ("role", "robot"),
        ("status", "done"),
        ("metadata", []),
        ("metadata", None),
    ],
)
def test_invalid_fields_rejected(field: str, value: Any) -> None:
    data = b.message("m1")
    data[field] = value
    with pytest.raises(ThreadStoreInvariantError, match=field):
        MessageDraft.model_validate(data)


def test_id_limits_and_unicode_accepted() -> None:
    for value in ("x" * 1024, "a/b.c$ d", "\x00", "🙂"):
        data = b.message(value)
        assert MessageDraft.model_validate(data).message_id == value


def test_condition_must_match_mutation() -> None:
    commit = b.create("s", "t")
    commit["condition"] = {"type": "version", "version": {"threadInstanceId": "i", "revision": 1}}
    with pytest.raises(ThreadStoreInvariantError, match="condition"):
        CommitThreadInput.model_validate(commit)
    delete = b.delete("s", "t", {"threadInstanceId": "i", "revision": 1})
    delete["condition"] = {"type": "missing"}
    with pytest.raises(ThreadStoreInvariantError, match="condition"):
        CommitThreadInput.model_validate(delete)


def test_queued_items_cannot_truncate() -> None:
    commit = b.update_at(
        "s",
        "t",
        {"threadInstanceId": "i", "revision": 1},
        {"queuedItems": [{"type": "truncate", "afterId": None}]},
        root=b.root(),
    )
    with pytest.raises(ThreadStoreInvariantError, match="queuedItems"):
        CommitThreadInput.model_validate(commit)


def test_duplicate_ids_in_selection_rejected() -> None:
    with pytest.raises(ThreadStoreInvariantError, match="distinct"):
        ReadThreadInput.model_validate(
            b.read("s", "t", messages={"type": "ids", "messageIds": ["a", "a"]})
        )
    with pytest.raises(ThreadStoreInvariantError, match="runIds"):
        ReadThreadInput.model_validate(b.read("s", "t", runs={"type": "ids", "runIds": []}))
    many = [str(i) for i in range(101)]
    with pytest.raises(ThreadStoreInvariantError, match="queueItemIds"):
        ReadThreadInput.model_validate(
            b.read("s", "t", queuedItems={"type": "ids", "queueItemIds": many})
        )


@pytest.mark.parametrize("limit", [0, 101, True, 1.0])
def test_limit_bounds(limit: Any) -> None:
    with pytest.raises(ThreadStoreInvariantError, match="limit"):
        ListThreadsInput.model_validate({"scopeKey": "s", "limit": limit})


@pytest.mark.parametrize("duration", [0, 86_400_001])
def test_duration_bounds(duration: int) -> None:
    commit = b.create("s", "t", {"lease": {**b.acquire("r", "o"), "durationMs": duration}})
    with pytest.raises(ThreadStoreInvariantError, match="durationMs"):
        CommitThreadInput.model_validate(commit)


def test_snake_case_names_accepted() -> None:
    snake = {
        "scope_key": "s",
        "thread_id": "t",
        "condition": {"type": "missing"},
        "mutation": {
            "type": "create",
            "root": {
                "agent": "a",
                "direct_execution_allowed": True,
                "list_visibility": "hidden",
                "metadata": {},
                "private_metadata": {"k": 1},
            },
            "changes": {
                "lease": {
                    "type": "acquire",
                    "lease": {"kind": "run", "run_id": "r"},
                    "lease_owner_id": "o",
                    "duration_ms": 5,
                    "operation": "send",
                }
            },
        },
    }
    parsed = CommitThreadInput.model_validate(snake)
    camel = parsed.to_json()
    assert camel["scopeKey"] == "s"
    assert camel["mutation"]["root"]["privateMetadata"] == {"k": 1}
    assert camel["mutation"]["changes"]["lease"]["leaseOwnerId"] == "o"
    assert CommitThreadInput.model_validate(camel) == parsed


# ---------------------------------------------------------------- timestamps


def _lease(acquired: Any) -> ThreadLease:
    return ThreadLease.model_validate(
        {
            "kind": "run",
            "runId": "r",
            "ownerId": "o",
            "operation": "send",
            "acquiredAt": acquired,
            "expiresAt": "2030-01-01T00:00:00.000Z",
        }
    )


def test_timestamps_are_aware_utc_truncated_to_ms() -> None:
    lease = _lease(datetime(2030, 1, 2, 3, 4, 5, 678_999, tzinfo=UTC))
    assert lease.acquired_at == datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    assert lease.acquired_at.utcoffset() == timedelta(0)
    assert lease.to_json()["acquiredAt"] == "2030-01-02T03:04:05.678Z"
    assert _lease("2030-01-02T03:04:05.678Z").acquired_at == lease.acquired_at


def test_non_utc_offset_converted() -> None:
    plus2 = timezone(timedelta(hours=2))
    lease = _lease(datetime(2030, 1, 2, 3, 0, 0, 1500, tzinfo=plus2))
    assert lease.acquired_at == datetime(2030, 1, 2, 1, 0, 0, 1000, tzinfo=UTC)
    assert lease.acquired_at.tzinfo == UTC
    assert lease.to_json()["acquiredAt"] == "2030-01-02T01:00:00.001Z"


@pytest.mark.parametrize(
    "value",
    [
        datetime(2030, 1, 1),
        "2030-01-01T00:00:00",
        "not a time",
        1_700_000_000,
        None,
        # The JSON form is one spelling: UTC, milliseconds and "Z".
        "2030-01-02T03:04:05Z",
        "2030-01-02T03:04:05.678999Z",
        "2030-01-02T03:04:05.678+00:00",
        "2030-01-02T03:00:00.000-05:30",
        "2030-01-02 03:04:05.678Z",
        "2030-01-02t03:04:05.678z",
        "20300102T030405.678Z",
        "2030-02-30T03:04:05.678Z",
        "\uff12030-01-02T03:04:05.678Z",
    ],
)
def test_naive_or_malformed_timestamps_rejected(value: Any) -> None:
    with pytest.raises(ThreadStoreInvariantError, match="acquiredAt"):
        _lease(value)


def test_timestamp_with_offset_near_datetime_min_is_an_invariant_error() -> None:
    # Converting to UTC would leave datetime's range; that must be a typed
    # error, not a raw OverflowError.
    with pytest.raises(ThreadStoreInvariantError, match="acquiredAt"):
        _lease("0001-01-01T00:00:00+01:00")


@SETTINGS
@given(
    st.datetimes(
        min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
    )
)
def test_timestamp_json_form_is_iso_with_ms_and_z(moment: datetime) -> None:
    text = format_timestamp(moment)
    assert len(text) == 24, text  # YYYY-MM-DDTHH:MM:SS.mmmZ, four-digit year
    assert text.endswith("Z")
    assert _lease(text).acquired_at == moment.replace(microsecond=moment.microsecond // 1000 * 1000)


class _Clock(datetime):
    """A clock's own datetime type, whose isoformat is not datetime's."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return "not a timestamp"


@SETTINGS
@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(min_value=-23 * 60, max_value=23 * 60),
    st.booleans(),
)
def test_timestamp_json_form_of_any_offset_and_datetime_type(
    local: datetime, minutes: int, subclass: bool
) -> None:
    # The instant in UTC, truncated to milliseconds, whatever the offset or
    # the datetime type (a clock's own subclass) it is given in.
    moment = local.replace(tzinfo=timezone(timedelta(minutes=minutes)))
    if subclass:
        moment = _Clock.combine(moment.date(), moment.timetz())
    utc = moment.astimezone(UTC)
    expected = (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:"
        f"{utc.second:02d}.{utc.microsecond // 1000:03d}Z"
    )
    assert format_timestamp(moment) == expected
    assert format_timestamp(moment.astimezone(UTC)) == expected


@SETTINGS
@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(min_value=-23 * 60, max_value=23 * 60),
    st.booleans(),
    st.booleans(),
)
def test_truncate_ms_is_the_instant_in_utc_to_the_millisecond(
    local: datetime, minutes: int, subclass: bool, whole: bool
) -> None:
    moment = local.replace(tzinfo=timezone(timedelta(minutes=minutes)))
    if whole:
        moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    if subclass:
        moment = _Clock.combine(moment.date(), moment.timetz())
    utc = moment.astimezone(UTC)
    expected = utc.replace(microsecond=utc.microsecond // 1000 * 1000)
    truncated = truncate_ms(moment)
    assert truncated == expected
    assert truncated.tzinfo is UTC
    # What decoding its JSON form gives: a plain datetime (a clock's subclass
    # is not kept), fold 0.
    assert type(truncated) is datetime
    assert truncated.fold == 0
    assert truncate_ms(truncated.replace(fold=1)).fold == 0


# ---------------------------------------------------------------- immutability


def test_models_are_frozen() -> None:
    version = ThreadVersion(thread_instance_id="i", revision=1)
    with pytest.raises(ValidationError):
        version.revision = 2  # type: ignore[misc]
    draft = MessageDraft.model_validate(b.message("m1"))
    with pytest.raises(ValidationError):
        draft.status = "error"  # type: ignore[misc]
    assert hash(version) == hash(ThreadVersion(thread_instance_id="i", revision=1))


def test_lists_and_opaque_values_are_read_only_at_every_depth() -> None:
    source = b.message("m1", metadata={"a": [1, {"b": {"c": [2]}}]})
    draft = MessageDraft.model_validate(source)
    assert draft.metadata == {"a": [1, {"b": {"c": [2]}}]}  # equal to plain values
    assert isinstance(draft.metadata, dict)
    assert isinstance(draft.parts, list)
    for attempt in (
        lambda: draft.metadata.__setitem__("x", 1),
        lambda: draft.metadata["a"].append(3),
        lambda: draft.metadata["a"][1]["b"]["c"].clear(),
        lambda: draft.metadata["a"][1].update({"x": 1}),
        lambda: draft.parts.append(draft.parts[0]),
        lambda: draft.parts.__iadd__([]),
    ):
        with pytest.raises(TypeError, match="read-only"):
            attempt()
    source["metadata"]["a"].append("caller's")  # the caller's own object is not held
    assert draft.metadata == {"a": [1, {"b": {"c": [2]}}]}
    assert copy.deepcopy(draft) == draft
    assert pickle.loads(pickle.dumps(draft)) == draft
    assert json.loads(draft.to_json_text())["metadata"] == {"a": [1, {"b": {"c": [2]}}]}
    plain = draft.metadata.copy()
    plain["x"] = 1  # copy() gives a plain dict
    again = MessageDraft.model_validate({**draft.to_json(), "metadata": draft.metadata})
    assert again == draft  # read-only values are accepted as input


def test_deepest_accepted_opaque_value_serializes_and_deeper_is_rejected() -> None:
    # Validation accepts strict JSON up to MAX_JSON_DEPTH levels; the JSON form
    # of anything it accepts must be producible and round-trip.
    deep: Any = "leaf"
    for _ in range(MAX_JSON_DEPTH):
        deep = {"a": deep}
    base = {"type": "tool-call", "toolCallId": "c", "toolName": "n", "state": "input-available"}
    part = ToolCallPart.model_validate({**base, "input": deep})
    assert ToolCallPart.model_validate(part.to_json()) == part
    for _ in range(1_000):
        deep = {"a": deep}
    with pytest.raises(ThreadStoreSerializationError) as err:
        ToolCallPart.model_validate({**base, "input": deep})
    assert err.value.path.startswith("input.a.a")
    assert "deeper" in err.value.reason


# ---------------------------------------------------------------- hostile values


INPUT_MODELS = [CommitThreadInput, ReadThreadInput, ListThreadsInput]


def _integer_schemas(schema: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        if schema.get("type") == "integer":
            found.append((path, schema))
        for key, sub in schema.items():
            found.extend(_integer_schemas(sub, f"{path}.{key}"))
    elif isinstance(schema, list):
        for index, sub in enumerate(schema):
            found.extend(_integer_schemas(sub, f"{path}[{index}]"))
    return found


@pytest.mark.parametrize("model", INPUT_MODELS)
def test_every_integer_field_of_an_input_is_bounded_to_int64(model: Any) -> None:
    integers = _integer_schemas(model.model_json_schema())
    assert integers, "the schema walk found no integer field"
    for path, schema in integers:
        assert schema.get("minimum", schema.get("exclusiveMinimum", -(2**64))) >= -(2**63), path
        assert schema.get("maximum", schema.get("exclusiveMaximum", 2**64)) <= 2**63 - 1, path


@pytest.mark.parametrize("revision", [2**63, 2**64, 10**30])
def test_revision_beyond_int64_is_an_invariant_error(revision: int) -> None:
    commit = b.update_at("s", "t", {"threadInstanceId": "i", "revision": revision}, root=b.root())
    with pytest.raises(ThreadStoreInvariantError, match=r"condition\.version\.revision") as err:
        CommitThreadInput.model_validate(commit)
    assert str(revision) not in str(err.value).replace(str(2**63 - 1), "")
    with pytest.raises(ThreadStoreInvariantError, match="revision"):
        ThreadVersion(thread_instance_id="i", revision=revision)


def test_revision_at_int64_max_is_valid() -> None:
    commit = b.delete("s", "t", {"threadInstanceId": "i", "revision": 2**63 - 1})
    parsed = CommitThreadInput.model_validate(commit)
    assert parsed.condition.version.revision == 2**63 - 1  # type: ignore[union-attr]
    assert CommitThreadInput.model_validate_json(json.dumps(commit)) == parsed


def _hostile_commit() -> dict[str, Any]:
    tool = {
        "type": "tool-call",
        "toolCallId": "c1",
        "toolName": "search",
        "input": {"q": [1]},
        "state": "output-available",
        "output": {"hits": [{"id": 1}]},
        "callProviderMetadata": {"p": [1]},
        "resultProviderMetadata": {"p": [1]},
    }
    message = b.message("m1", metadata={"k": [1]})
    message["parts"] = [
        {"type": "text", "text": "x", "providerMetadata": {"p": [1]}},
        {"type": "reasoning", "text": "x", "providerMetadata": {"p": [1]}},
        {"type": "file", "mediaType": "a/b", "url": "u", "providerMetadata": {"p": [1]}},
        tool,
        {"type": "data", "name": "n", "data": {"rows": [1]}},
    ]
    run = b.run("r1", "queued", queue_item_id="q1", metadata={"k": [1]})
    run["privateMetadata"] = {"k": [1]}
    queued = {**b.queued_item("q1", "r1", {"in": [1]}), "metadata": {"k": [1]}}
    return b.create(
        "s",
        "t",
        {
            "messages": [b.insert(message)],
            "runs": [b.insert(run)],
            "queuedItems": [b.insert(queued)],
        },
        metadata={"k": [1]},
        privateMetadata={"k": [1]},
    )


def _containers(value: Any) -> list[Any]:
    """Every dict and list inside ``value`` (itself included)."""
    found: list[Any] = []
    if isinstance(value, dict | list):
        found.append(value)
        for sub in value.values() if isinstance(value, dict) else value:
            found.extend(_containers(sub))
    return found


def test_validated_inputs_do_not_alias_the_callers_objects() -> None:
    data = _hostile_commit()
    parsed = CommitThreadInput.model_validate(data)
    before = json.dumps(parsed.to_json())
    # Every dict and list inside the caller's input now gets a NaN, a huge int
    # and a set: none of it may reach the validated model.
    for container in _containers(data):
        if isinstance(container, dict):
            container["evil"] = float("nan")
        else:
            container.append(2**80)
    assert json.dumps(parsed.to_json(), allow_nan=False) == before
    caller_ids = {id(c) for c in _containers(data)}
    root = parsed.mutation.root  # type: ignore[union-attr]
    changes = parsed.mutation.changes  # type: ignore[union-attr]
    assert changes is not None
    assert changes.messages
    assert changes.runs
    assert changes.queued_items
    message = changes.messages[0].record  # type: ignore[union-attr]
    run = changes.runs[0].record  # type: ignore[union-attr]
    queued = changes.queued_items[0].record  # type: ignore[union-attr]
    held = [root.metadata, root.private_metadata, message.metadata, run.metadata]
    held += [run.private_metadata, queued.metadata, queued.input]
    for part in message.parts:
        for name in ("provider_metadata", "input", "output", "data"):
            held.append(getattr(part, name, None))
        for name in ("call_provider_metadata", "result_provider_metadata"):
            held.append(getattr(part, name, None))
    for value in held:
        assert all(id(c) not in caller_ids for c in _containers(value))


def test_validated_json_copy_keeps_order_and_types() -> None:
    metadata = {"z": 1, "a": 1.0, "m": [True, None, "s", {"$ref": "x", "$id": 1}]}
    draft = MessageDraft.model_validate(b.message("m1", metadata=metadata))
    assert draft.metadata is not metadata
    assert exact(draft.metadata) == exact(metadata)


def test_shared_sub_value_bomb_in_a_commit_is_rejected() -> None:
    bomb: Any = [1]
    for _ in range(40):
        bomb = [bomb, bomb]
    with watchdog(30), pytest.raises(ThreadStoreSerializationError, match="1,000,000") as err:
        CommitThreadInput.model_validate(b.create("s", "t", metadata={"bomb": bomb}))
    assert err.value.path == "mutation.root.metadata"


# ---------------------------------------------------------------- indexed text fields


INDEXED_FIELDS = [
    ("agent", lambda v: b.create("s", "t", agent=v), CommitThreadInput, "root.agent"),
    ("category", lambda v: b.create("s", "t", category=v), CommitThreadInput, "root.category"),
    (
        "parentThreadId",
        lambda v: b.create("s", "t", parentThreadId=v),
        CommitThreadInput,
        "root.parentThreadId",
    ),
    (
        "category (update)",
        lambda v: b.update_at(
            "s", "t", {"threadInstanceId": "i", "revision": 1}, root=b.root(category=v)
        ),
        CommitThreadInput,
        "root.category",
    ),
    (
        "agent filter",
        lambda v: {"scopeKey": "s", "limit": 1, "agent": v},
        ListThreadsInput,
        "agent",
    ),
    (
        "category filter",
        lambda v: {"scopeKey": "s", "limit": 1, "category": v},
        ListThreadsInput,
        "category",
    ),
    (
        "parent filter",
        lambda v: {"scopeKey": "s", "limit": 1, "parentThreadId": v},
        ListThreadsInput,
        "parentThreadId",
    ),
]


@pytest.mark.parametrize(("name", "build", "model", "where"), INDEXED_FIELDS)
def test_indexed_text_fields_hold_at_most_256_utf8_bytes(
    name: str, build: Any, model: Any, where: str
) -> None:
    # 256 bytes in ASCII, two-byte and four-byte characters: accepted.
    for value in ("a" * 256, "é" * 128, "🧵" * 64, "\x00" * 256):
        model.model_validate(build(value))
    # One byte more, however few characters that is: refused, naming the limit in bytes.
    for value in ("a" * 257, "é" * 128 + "a", "🧵" * 64 + "a", "é" * 129):
        with pytest.raises(ThreadStoreInvariantError, match=where) as err:
            model.model_validate(build(value))
        assert "256 bytes of UTF-8" in str(err.value)
        assert value not in str(err.value)
        assert type(err.value) is ThreadStoreInvariantError


def test_stored_records_are_not_held_to_the_input_limits() -> None:
    data = {
        "scopeKey": "s",
        "threadId": "t",
        "version": {"threadInstanceId": "i", "revision": 1},
        "directExecutionAllowed": True,
        "listVisibility": "visible",
        "metadata": {},
        "privateMetadata": {},
        "createdAt": "2030-01-01T00:00:00.000Z",
        "updatedAt": "2030-01-01T00:00:00.000Z",
    }
    data["agent"] = "a" * 1024
    data["category"] = "c" * 2000
    data["parentThreadId"] = "p" * 1024
    record = ThreadRecord.model_validate(data)
    assert record.agent == "a" * 1024
