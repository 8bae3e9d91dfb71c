"""Hypothesis strategies for the JSON forms of pai-storage records and inputs."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from pai_storage.backend import format_timestamp, truncate_ms

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _not_negative_zero(value: float) -> bool:
    return not (value == 0.0 and math.copysign(1.0, value) < 0)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=INT64_MIN, max_value=INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False).filter(_not_negative_zero)
    | st.text(max_size=8)
)
json_keys = st.text(max_size=6) | st.sampled_from(["$set", "a.b", "", "_id", "\x00"])
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_keys, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(json_keys, json_values, max_size=4)

ids = st.text(min_size=1, max_size=12)
texts = st.text(max_size=12)
timestamps = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
).map(lambda d: format_timestamp(truncate_ms(d)))
operations = st.sampled_from(["send", "trigger", "regenerate", "resume"])
run_statuses = st.sampled_from(["queued", "running", "waiting", "completed", "failed", "cancelled"])


def _maybe(draw: Any, data: dict[str, Any], key: str, strategy: Any) -> None:
    if draw(st.booleans()):
        data[key] = draw(strategy)


@st.composite
def versions(draw: Any) -> dict[str, Any]:
    return {"threadInstanceId": draw(ids), "revision": draw(st.integers(1, 2**40))}


@st.composite
def leases(draw: Any) -> dict[str, Any]:
    data = {
        "kind": "run",
        "runId": draw(ids),
        "ownerId": draw(ids),
        "operation": draw(operations),
        "acquiredAt": draw(timestamps),
    }
    _maybe(draw, data, "renewedAt", timestamps)
    data["expiresAt"] = draw(timestamps)
    return data


@st.composite
def thread_records(draw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "scopeKey": draw(ids),
        "threadId": draw(ids),
        "version": draw(versions()),
        "agent": draw(ids),
        "directExecutionAllowed": draw(st.booleans()),
    }
    _maybe(draw, data, "parentThreadId", ids)
    data["listVisibility"] = draw(st.sampled_from(["visible", "hidden"]))
    _maybe(draw, data, "category", texts)
    _maybe(draw, data, "title", texts)
    data["metadata"] = draw(json_objects)
    data["privateMetadata"] = draw(json_objects)
    _maybe(draw, data, "lease", leases())
    data["createdAt"] = draw(timestamps)
    data["updatedAt"] = draw(timestamps)
    return data


@st.composite
def parts(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["text", "reasoning", "file", "tool-call", "data"]))
    data: dict[str, Any] = {"type": kind}
    if kind in ("text", "reasoning"):
        data["text"] = draw(texts)
        _maybe(draw, data, "providerMetadata", json_objects)
    elif kind == "file":
        data["mediaType"] = draw(texts)
        data["url"] = draw(texts)
        _maybe(draw, data, "filename", texts)
        _maybe(draw, data, "providerMetadata", json_objects)
    elif kind == "tool-call":
        data["toolCallId"] = draw(ids)
        data["toolName"] = draw(texts)
        data["input"] = draw(json_values)
        data["state"] = draw(
            st.sampled_from(
                ["input-streaming", "input-available", "output-available", "output-error"]
            )
        )
        _maybe(draw, data, "output", json_values)  # may be null: kept when given
        _maybe(draw, data, "errorText", texts)
        _maybe(draw, data, "callProviderMetadata", json_objects)
        _maybe(draw, data, "resultProviderMetadata", json_objects)
    else:
        data["name"] = draw(texts)
        data["data"] = draw(json_values)
    return data


@st.composite
def message_drafts(draw: Any) -> dict[str, Any]:
    producer: dict[str, Any] = {
        "kind": draw(st.sampled_from(["user", "agent", "system", "application"]))
    }
    _maybe(draw, producer, "id", ids)
    association = draw(
        st.just({"kind": "standalone"})
        | st.fixed_dictionaries(
            {
                "kind": st.just("run"),
                "runId": ids,
                "relation": st.sampled_from(["input", "context", "output"]),
            }
        )
    )
    return {
        "messageId": draw(ids),
        "role": draw(st.sampled_from(["user", "assistant", "system", "tool"])),
        "parts": draw(st.lists(parts(), min_size=1, max_size=3)),
        "producer": producer,
        "association": association,
        "visibility": {"transcript": draw(st.booleans()), "context": draw(st.booleans())},
        "status": draw(st.sampled_from(["complete", "streaming", "incomplete", "error"])),
        "metadata": draw(json_objects),
    }


@st.composite
def messages(draw: Any) -> dict[str, Any]:
    data = draw(message_drafts())
    data["createdAt"] = draw(timestamps)
    data["updatedAt"] = draw(timestamps)
    return data


@st.composite
def _run_fields(draw: Any, stored: bool) -> dict[str, Any]:
    initiator: dict[str, Any] = {
        "kind": draw(st.sampled_from(["user", "agent", "system", "trigger"]))
    }
    _maybe(draw, initiator, "id", ids)
    admission: dict[str, Any] = {}
    _maybe(draw, admission, "queueItemId", ids)
    admission["admitted"] = draw(st.booleans())
    if stored:
        _maybe(draw, admission, "admittedAt", timestamps)
    data: dict[str, Any] = {
        "runId": draw(ids),
        "status": draw(run_statuses),
        "initiator": initiator,
        "admission": admission,
        "inputMessageIds": draw(st.lists(ids, max_size=3)),
    }
    _maybe(draw, data, "operation", operations)
    _maybe(draw, data, "error", st.fixed_dictionaries({"code": texts, "message": texts}))
    data["metadata"] = draw(json_objects)
    data["privateMetadata"] = draw(json_objects)
    if stored:
        data["createdAt"] = draw(timestamps)
        data["updatedAt"] = draw(timestamps)
        _maybe(draw, data, "finishedAt", timestamps)
    return data


def run_drafts() -> st.SearchStrategy[dict[str, Any]]:
    return _run_fields(False)


def run_records() -> st.SearchStrategy[dict[str, Any]]:
    return _run_fields(True)


@st.composite
def queued_item_drafts(draw: Any) -> dict[str, Any]:
    return {
        "queueItemId": draw(ids),
        "runId": draw(ids),
        "input": draw(json_values),
        "metadata": draw(json_objects),
    }


@st.composite
def queued_items(draw: Any) -> dict[str, Any]:
    data = draw(queued_item_drafts())
    data["createdAt"] = draw(timestamps)
    return data


@st.composite
def thread_pages(draw: Any, items: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {"items": draw(st.lists(items, max_size=2))}
    _maybe(draw, data, "nextPageToken", texts)
    data["version"] = draw(versions())
    return data


@st.composite
def read_results(draw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "observedAt": draw(timestamps),
        "thread": draw(st.none() | thread_records()),
    }
    _maybe(draw, data, "messages", thread_pages(messages()))
    _maybe(draw, data, "runs", thread_pages(run_records()))
    _maybe(draw, data, "queuedItems", thread_pages(queued_items()))
    return data


def _change(draw: Any, drafts: Any, truncate: bool) -> dict[str, Any]:
    kinds = ["insert", "replace", "delete"] + (["truncate"] if truncate else [])
    kind = draw(st.sampled_from(kinds))
    if kind in ("insert", "replace"):
        return {"type": kind, "record": draw(drafts)}
    if kind == "delete":
        return {"type": "delete", "id": draw(ids)}
    return {"type": "truncate", "afterId": draw(st.none() | ids)}


@st.composite
def lease_changes(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["acquire", "renew", "release"]))
    data: dict[str, Any] = {
        "type": kind,
        "lease": {"kind": "run", "runId": draw(ids)},
        "leaseOwnerId": draw(ids),
    }
    if kind in ("acquire", "renew"):
        data["durationMs"] = draw(st.integers(1, 86_400_000))
    if kind == "acquire":
        data["operation"] = draw(operations)
    if kind == "release":
        data["expiry"] = draw(st.sampled_from(["unexpired", "any"]))
    return data


@st.composite
def thread_changes(draw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if draw(st.booleans()):
        data["messages"] = [
            _change(draw, message_drafts(), True) for _ in range(draw(st.integers(0, 2)))
        ]
    if draw(st.booleans()):
        data["runs"] = [_change(draw, run_drafts(), True) for _ in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        data["queuedItems"] = [
            _change(draw, queued_item_drafts(), False) for _ in range(draw(st.integers(0, 2)))
        ]
    _maybe(draw, data, "lease", lease_changes())
    return data


@st.composite
def commit_inputs(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["create", "update", "delete"]))
    data: dict[str, Any] = {"scopeKey": draw(ids), "threadId": draw(ids)}
    if kind == "create":
        root: dict[str, Any] = {
            "agent": draw(ids),
            "directExecutionAllowed": draw(st.booleans()),
        }
        _maybe(draw, root, "parentThreadId", ids)
        root["listVisibility"] = draw(st.sampled_from(["visible", "hidden"]))
        _maybe(draw, root, "category", texts)
        _maybe(draw, root, "title", texts)
        root["metadata"] = draw(json_objects)
        root["privateMetadata"] = draw(json_objects)
        data["condition"] = {"type": "missing"}
        mutation: dict[str, Any] = {"type": "create", "root": root}
    else:
        data["condition"] = {"type": "version", "version": draw(versions())}
        if kind == "delete":
            mutation = {"type": "delete"}
        else:
            root = {"listVisibility": draw(st.sampled_from(["visible", "hidden"]))}
            _maybe(draw, root, "category", texts)
            _maybe(draw, root, "title", texts)
            root["metadata"] = draw(json_objects)
            root["privateMetadata"] = draw(json_objects)
            mutation = {"type": "update", "root": root}
    if kind != "delete":
        _maybe(draw, mutation, "changes", thread_changes())
    data["mutation"] = mutation
    return data


@st.composite
def list_inputs(draw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"scopeKey": draw(ids), "limit": draw(st.integers(1, 100))}
    _maybe(draw, data, "agent", ids)
    _maybe(draw, data, "parentThreadId", ids)
    _maybe(draw, data, "category", texts)
    _maybe(draw, data, "includeHidden", st.booleans())
    _maybe(draw, data, "pageToken", texts)
    return data


@st.composite
def _page_request(draw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"limit": draw(st.integers(1, 100))}
    _maybe(draw, data, "pageToken", texts)
    return data


@st.composite
def read_inputs(draw: Any) -> dict[str, Any]:
    distinct = st.lists(ids, min_size=1, max_size=5, unique=True)
    include: dict[str, Any] = {}
    if draw(st.booleans()):
        if draw(st.booleans()):
            include["messages"] = {"type": "ids", "messageIds": draw(distinct)}
        else:
            sel: dict[str, Any] = {
                "type": "page",
                "view": draw(st.sampled_from(["raw", "transcript", "context"])),
            }
            _maybe(draw, sel, "order", st.sampled_from(["oldest", "newest"]))
            _maybe(draw, sel, "afterMessageId", ids)
            _maybe(draw, sel, "beforeMessageId", ids)
            sel["page"] = draw(_page_request())
            include["messages"] = sel
    if draw(st.booleans()):
        if draw(st.booleans()):
            include["runs"] = {"type": "ids", "runIds": draw(distinct)}
        else:
            sel = {"type": "page"}
            _maybe(draw, sel, "order", st.sampled_from(["oldest", "newest"]))
            _maybe(draw, sel, "statuses", st.lists(run_statuses, min_size=1, max_size=3))
            sel["page"] = draw(_page_request())
            include["runs"] = sel
    if draw(st.booleans()):
        if draw(st.booleans()):
            include["queuedItems"] = {"type": "ids", "queueItemIds": draw(distinct)}
        else:
            sel = {"type": "page"}
            _maybe(draw, sel, "order", st.sampled_from(["oldest", "newest"]))
            _maybe(draw, sel, "runId", ids)
            sel["page"] = draw(_page_request())
            include["queuedItems"] = sel
    data: dict[str, Any] = {"scopeKey": draw(ids), "threadId": draw(ids)}
    if include or draw(st.booleans()):
        data["include"] = include
    return data
