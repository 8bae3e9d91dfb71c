"""Strict JSON (docs/json.md): rejected values, exact round trips, the JSON form of records."""

from __future__ import annotations

import copy
import enum
import re
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ManualClock,
    Message,
    QueuedItem,
    RunRecord,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ToolCallPart,
)
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreSerializationError
from pai_storage.frozen import FrozenDict, FrozenList
from pai_storage.store import public_projection

from ._support import new_scope

__all__ = ["TestStrictJson"]

pytestmark = pytest.mark.asyncio

TIMESTAMP = re.compile(r"\A\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\Z")


class _Color(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    LOW = 1


class _Thing:
    pass


class _Mode(enum.StrEnum):
    FAST = "fast"


class _Text(str):
    pass


class _Number(float):
    pass


class _Count(int):
    pass


class _Mapping(dict[str, Any]):
    pass


class _Items(list[Any]):
    pass


def _cycle() -> Any:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


def _list_cycle() -> Any:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


BAD_VALUES: list[Any] = [
    pytest.param(lambda: float("nan"), id="nan"),
    pytest.param(lambda: float("inf"), id="inf"),
    pytest.param(lambda: float("-inf"), id="-inf"),
    pytest.param(lambda: -0.0, id="negative-zero"),
    pytest.param(lambda: 2**63, id="int-2**63"),
    pytest.param(lambda: -(2**63) - 1, id="int--2**63-1"),
    pytest.param(lambda: 10**30, id="huge-int"),
    pytest.param(lambda: (1, 2), id="tuple"),
    pytest.param(lambda: {1, 2}, id="set"),
    pytest.param(lambda: frozenset({1}), id="frozenset"),
    pytest.param(lambda: b"bytes", id="bytes"),
    pytest.param(lambda: bytearray(b"x"), id="bytearray"),
    pytest.param(lambda: datetime(2030, 1, 1, tzinfo=UTC), id="datetime"),
    pytest.param(lambda: Decimal("1.5"), id="decimal"),
    pytest.param(lambda: _Color.RED, id="enum"),
    pytest.param(lambda: _Level.LOW, id="int-enum"),
    pytest.param(_Thing, id="class-instance"),
    pytest.param(object, id="object"),
    pytest.param(_cycle, id="dict-cycle"),
    pytest.param(_list_cycle, id="list-cycle"),
    pytest.param(lambda: {1: "x"}, id="int-key"),
    pytest.param(lambda: {("a",): "x"}, id="tuple-key"),
    pytest.param(lambda: "lone \ud800 surrogate", id="lone-surrogate"),
    pytest.param(lambda: _Mode.FAST, id="str-enum"),
    pytest.param(lambda: _Text("text"), id="str-subclass"),
    pytest.param(lambda: _Number(1.5), id="float-subclass"),
    pytest.param(lambda: _Count(1), id="int-subclass"),
    pytest.param(lambda: _Mapping(a=1), id="dict-subclass"),
    pytest.param(lambda: _Items([1]), id="list-subclass"),
    pytest.param(lambda: {_Mode.FAST: 1}, id="str-enum-key"),
]

SOME_BAD_VALUES: list[Any] = [
    pytest.param(lambda: float("nan"), id="nan"),
    pytest.param(lambda: b"bytes", id="bytes"),
    pytest.param(lambda: {1: "x"}, id="int-key"),
]


def _wrap(bad: Any) -> dict[str, Any]:
    return {"items": [0, 0, 0, {"score": bad}]}


def _message_with_part(part: dict[str, Any]) -> dict[str, Any]:
    message = b.message("m1", role="assistant")
    message["parts"] = [part]
    return message


def _tool(**fields: Any) -> dict[str, Any]:
    return {
        "type": "tool-call",
        "toolCallId": "call-1",
        "toolName": "search",
        "input": {},
        "state": "output-available",
        **fields,
    }


def _queued(**fields: Any) -> dict[str, Any]:
    return {
        "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
        "queuedItems": [b.insert({**b.queued_item("q1", "r1"), **fields})],
    }


def _run(**fields: Any) -> dict[str, Any]:
    return {"runs": [b.insert({**b.run("r1", "completed"), **fields})]}


# Each location builds (root fields, changes) around a JSON value.
Location = Callable[[Any], tuple[dict[str, Any], dict[str, Any] | None]]

LOCATIONS: list[Any] = [
    pytest.param(lambda v: ({"metadata": v}, None), "root.metadata", id="root-metadata"),
    pytest.param(
        lambda v: ({"privateMetadata": v}, None), "root.privateMetadata", id="root-private"
    ),
    pytest.param(
        lambda v: ({}, {"messages": [b.insert(b.message("m1", metadata=v))]}),
        "record.metadata",
        id="message-metadata",
    ),
    pytest.param(
        lambda v: (
            {},
            {
                "messages": [
                    b.insert(
                        _message_with_part({"type": "text", "text": "x", "providerMetadata": v})
                    )
                ]
            },
        ),
        "parts[0].providerMetadata",
        id="text-provider-metadata",
    ),
    pytest.param(
        lambda v: (
            {},
            {
                "messages": [
                    b.insert(
                        _message_with_part(
                            {"type": "reasoning", "text": "x", "providerMetadata": v}
                        )
                    )
                ]
            },
        ),
        "parts[0].providerMetadata",
        id="reasoning-provider-metadata",
    ),
    pytest.param(
        lambda v: (
            {},
            {
                "messages": [
                    b.insert(
                        _message_with_part(
                            {
                                "type": "file",
                                "mediaType": "text/plain",
                                "url": "https://example.invalid/f.txt",
                                "providerMetadata": v,
                            }
                        )
                    )
                ]
            },
        ),
        "parts[0].providerMetadata",
        id="file-provider-metadata",
    ),
    pytest.param(
        lambda v: ({}, {"messages": [b.insert(_message_with_part(_tool(input=v)))]}),
        "parts[0].input",
        id="tool-input",
    ),
    pytest.param(
        lambda v: ({}, {"messages": [b.insert(_message_with_part(_tool(output=v)))]}),
        "parts[0].output",
        id="tool-output",
    ),
    pytest.param(
        lambda v: ({}, {"messages": [b.insert(_message_with_part(_tool(callProviderMetadata=v)))]}),
        "parts[0].callProviderMetadata",
        id="tool-call-provider-metadata",
    ),
    pytest.param(
        lambda v: (
            {},
            {"messages": [b.insert(_message_with_part(_tool(resultProviderMetadata=v)))]},
        ),
        "parts[0].resultProviderMetadata",
        id="tool-result-provider-metadata",
    ),
    pytest.param(
        lambda v: (
            {},
            {"messages": [b.insert(_message_with_part({"type": "data", "name": "n", "data": v}))]},
        ),
        "parts[0].data",
        id="data-part",
    ),
    pytest.param(lambda v: ({}, _queued(input=v)), "record.input", id="queued-input"),
    pytest.param(lambda v: ({}, _queued(metadata=v)), "record.metadata", id="queued-metadata"),
    pytest.param(lambda v: ({}, _run(metadata=v)), "record.metadata", id="run-metadata"),
    pytest.param(
        lambda v: ({}, _run(privateMetadata=v)), "record.privateMetadata", id="run-private"
    ),
]

# Values that must round-trip exactly (key order, types) through every location.
ROUND_TRIP: dict[str, Any] = {
    "z": 1,
    "a": 2,
    "$set": {"$inc": 1, "$": "dollar"},
    "a.b": "dotted",
    "": "empty key",
    "int": 1,
    "float": 1.0,
    "zero": 0.0,
    "negative": -2.5,
    "tiny": 5e-324,
    "huge": 1.7976931348623157e308,
    "max": 2**63 - 1,
    "min": -(2**63),
    "minPlusOne": -(2**63 - 1),
    "iso": "2030-01-01T00:00:00.000Z",
    "date": "2030-01-01",
    "oid": "507f1f77bcf86cd799439011",
    "nul": "a\x00b",
    "nulKey\x00": True,
    "emoji": "🧵",
    "false": False,
    "null": None,
    "nested": [[1, [2, [3, []]]], [], {}, [{"k": [None]}]],
    "10": "numeric-looking key",
    "_id": "underscore id",
}


_READ_ONLY: dict[type, type] = {FrozenDict: dict, FrozenList: list}


def _assert_same(got: Any, expected: Any, path: str = "") -> None:
    """Equal values, equal types (``1`` vs ``1.0``, ``True`` vs ``1``) and equal key order.

    A record's read-only containers are its ``dict`` and ``list`` values.
    """
    kind = _READ_ONLY.get(type(got), type(got))
    assert kind is type(expected), f"{path}: {type(got).__name__} != {type(expected).__name__}"
    if isinstance(expected, dict):
        assert list(got) == list(expected), f"{path}: key order {list(got)} != {list(expected)}"
        for key in expected:
            _assert_same(got[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, list):
        assert len(got) == len(expected), f"{path}: length"
        for index, (g, e) in enumerate(zip(got, expected, strict=True)):
            _assert_same(g, e, f"{path}[{index}]")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


async def _read_all(store: ThreadStore, scope: str, thread: str = "t1") -> ThreadReadResult:
    return await store.read_thread(
        b.read(
            scope,
            thread,
            messages={"type": "page", "view": "raw", "page": {"limit": 100}},
            runs={"type": "page", "page": {"limit": 100}},
            queuedItems={"type": "page", "page": {"limit": 100}},
        )
    )


def _timestamps(value: Any, path: str = "") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, sub in value.items():
            if key.endswith("At"):
                found.append((f"{path}.{key}", sub))
            elif key not in ("metadata", "privateMetadata", "input", "output", "data"):
                found.extend(_timestamps(sub, f"{path}.{key}"))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            found.extend(_timestamps(sub, f"{path}[{index}]"))
    return found


class TestStrictJson:
    """Only strict JSON is stored; accepted values round-trip exactly."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    # ------------------------------------------------------------ rejected values

    @pytest.mark.parametrize("make_bad", BAD_VALUES)
    async def test_rejected_kind_names_its_path_and_writes_nothing(
        self, store: ThreadStore, make_bad: Callable[[], Any]
    ) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreSerializationError) as caught:
            await store.commit_thread(b.create(scope, "t1", metadata=_wrap(make_bad())))
        assert "metadata.items[3].score" in str(caught.value)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None
        listed = await store.list_threads({"scopeKey": scope, "limit": 5, "includeHidden": True})
        assert listed.items == []

    @pytest.mark.parametrize(("where", "path"), LOCATIONS)
    @pytest.mark.parametrize("make_bad", SOME_BAD_VALUES)
    async def test_rejected_value_in_every_location_names_its_path(
        self,
        store: ThreadStore,
        make_bad: Callable[[], Any],
        where: Location,
        path: str,
    ) -> None:
        scope = new_scope()
        root, changes = where(_wrap(make_bad()))
        path = path.removeprefix("root.")
        with pytest.raises(ThreadStoreSerializationError) as caught:
            await store.commit_thread(b.create(scope, "t1", changes, **root))
        assert f"{path}.items[3].score" in str(caught.value)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None

    @pytest.mark.parametrize("make_bad", BAD_VALUES)
    async def test_rejected_value_in_update_writes_nothing(
        self, store: ThreadStore, make_bad: Callable[[], Any]
    ) -> None:
        scope = new_scope()
        created = await store.commit_thread(
            b.create(scope, "t1", {"messages": [b.insert(b.message("m1"))]}, metadata={"ok": 1})
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        with pytest.raises(ThreadStoreSerializationError) as caught:
            await store.commit_thread(
                b.update_at(
                    scope,
                    "t1",
                    created.thread.version,
                    {
                        "messages": [
                            b.insert(b.message("m2")),
                            b.insert(b.message("m3", metadata={"deep": _wrap(make_bad())})),
                        ]
                    },
                    root=b.root(metadata={"ok": 2}),
                )
            )
        assert "metadata.deep.items[3].score" in str(caught.value)
        read = await _read_all(store, scope)
        assert read.thread == created.thread
        assert read.messages is not None
        assert [m.message_id for m in read.messages.items] == ["m1"]

    @pytest.mark.parametrize(
        ("build", "path"),
        [
            pytest.param(
                lambda v: {"messages": [b.insert(_message_with_part(_tool(input=v)))]},
                "parts[0].input",
                id="tool-input",
            ),
            pytest.param(
                lambda v: {"messages": [b.insert(_message_with_part(_tool(output=v)))]},
                "parts[0].output",
                id="tool-output",
            ),
            pytest.param(lambda v: _queued(input=v), "record.input", id="queued-input"),
        ],
    )
    @pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.0, 2**64, (1,), b"x"], ids=repr)
    async def test_rejected_top_level_json_value(
        self, store: ThreadStore, build: Callable[[Any], dict[str, Any]], path: str, bad: Any
    ) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreSerializationError) as caught:
            await store.commit_thread(b.create(scope, "t1", build(bad)))
        assert path in str(caught.value)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None

    async def test_rejection_never_echoes_values(self, store: ThreadStore) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreSerializationError) as caught:
            await store.commit_thread(
                b.create(
                    scope,
                    "t1",
                    metadata={"email": "alice@example.invalid", "score": float("nan")},
                )
            )
        assert "metadata.score" in str(caught.value)
        assert "alice@example.invalid" not in str(caught.value)

    @pytest.mark.parametrize(
        ("make_bad", "reason"),
        [
            pytest.param(lambda: float("nan"), "NaN", id="nan"),
            pytest.param(lambda: float("-inf"), "-Infinity", id="-inf"),
            pytest.param(lambda: -0.0, "-0.0", id="negative-zero"),
            pytest.param(lambda: 2**63, "64-bit", id="int-2**63"),
            pytest.param(lambda: _Number(1.5), "_Number", id="float-subclass"),
            pytest.param(lambda: _Number("nan"), "_Number", id="float-subclass-nan"),
            pytest.param(lambda: _Text("x"), "_Text", id="str-subclass"),
            pytest.param(lambda: _Count(2**70), "_Count", id="int-subclass-huge"),
            pytest.param(lambda: _Mode.FAST, "_Mode", id="str-enum"),
            pytest.param(lambda: b"x", "bytes", id="bytes"),
            pytest.param(lambda: {1: "x"}, "key", id="int-key"),
        ],
    )
    async def test_rejection_names_what_is_wrong(
        self, store: ThreadStore, make_bad: Callable[[], Any], reason: str
    ) -> None:
        # The message says what the bad value is: a float subclass is named by its
        # type, never described as a NaN, an infinity or a negative zero it is not.
        scope = new_scope()
        with pytest.raises(ThreadStoreSerializationError) as caught:
            await store.commit_thread(b.create(scope, "t1", metadata={"v": make_bad()}))
        message = str(caught.value)
        assert "metadata.v" in message
        assert reason in message, message
        for wrong in ("NaN", "Infinity", "-0.0", "64-bit"):
            if wrong not in reason:
                assert wrong not in message, message

    @pytest.mark.parametrize("make_bad", SOME_BAD_VALUES)
    async def test_model_parsing_rejects_what_the_store_rejects(
        self, store: ThreadStore, make_bad: Callable[[], Any]
    ) -> None:
        # Parsing a commit into its model checks strict JSON the same way, naming
        # the same path, so a model input can never carry a value the store refuses.
        scope = new_scope()
        commit = b.create(
            scope,
            "t1",
            {"messages": [b.insert(b.message("m1", metadata=_wrap(make_bad())))]},
        )
        with pytest.raises(ThreadStoreSerializationError) as parsed:
            CommitThreadInput.model_validate(commit)
        with pytest.raises(ThreadStoreSerializationError) as committed:
            await store.commit_thread(commit)
        assert "metadata.items[3].score" in str(parsed.value)
        assert str(parsed.value) == str(committed.value)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None

    async def test_shared_non_cyclic_values_are_accepted(self, store: ThreadStore) -> None:
        scope = new_scope()
        shared = {"k": [1, 2]}
        result = await store.commit_thread(
            b.create(scope, "t1", metadata={"a": shared, "b": shared, "c": [shared, shared]})
        )
        assert isinstance(result, CommittedResult)
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        _assert_same(
            read.thread.metadata,
            {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}, "c": [{"k": [1, 2]}, {"k": [1, 2]}]},
        )

    # ------------------------------------------------------------ round trips

    async def test_opaque_json_round_trips_exactly_everywhere(self, store: ThreadStore) -> None:
        scope = new_scope()
        value = copy.deepcopy(ROUND_TRIP)
        message = b.message("m1", role="assistant", metadata=copy.deepcopy(value))
        message["parts"] = [
            {"type": "text", "text": "t", "providerMetadata": copy.deepcopy(value)},
            {"type": "reasoning", "text": "r", "providerMetadata": copy.deepcopy(value)},
            {
                "type": "file",
                "mediaType": "image/png",
                "url": "data:,x",
                "filename": "f.png",
                "providerMetadata": copy.deepcopy(value),
            },
            _tool(
                input=copy.deepcopy(value),
                output=copy.deepcopy(value),
                callProviderMetadata=copy.deepcopy(value),
                resultProviderMetadata=copy.deepcopy(value),
            ),
            {"type": "data", "name": "d", "data": copy.deepcopy(value)},
        ]
        run = {
            **b.run("r1", "queued", queue_item_id="q1"),
            "metadata": copy.deepcopy(value),
            "privateMetadata": copy.deepcopy(value),
        }
        item = {
            **b.queued_item("q1", "r1", copy.deepcopy(value)),
            "metadata": copy.deepcopy(value),
        }
        result = await store.commit_thread(
            b.create(
                scope,
                "t1",
                {
                    "messages": [b.insert(message)],
                    "runs": [b.insert(run)],
                    "queuedItems": [b.insert(item)],
                },
                metadata=copy.deepcopy(value),
                privateMetadata=copy.deepcopy(value),
            )
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        _assert_same(result.thread.metadata, value, "committed.metadata")

        read = await _read_all(store, scope)
        assert read.thread is not None
        _assert_same(read.thread.metadata, value, "metadata")
        _assert_same(read.thread.private_metadata, value, "privateMetadata")
        assert read.messages is not None
        got = read.messages.items[0]
        _assert_same(got.metadata, value, "message.metadata")
        parts = [part.to_json() for part in got.parts]
        for index in (0, 1, 2):
            _assert_same(parts[index]["providerMetadata"], value, f"parts[{index}]")
        for key in ("input", "output", "callProviderMetadata", "resultProviderMetadata"):
            _assert_same(parts[3][key], value, f"tool.{key}")
        _assert_same(parts[4]["data"], value, "data")
        assert read.runs is not None
        _assert_same(read.runs.items[0].metadata, value, "run.metadata")
        _assert_same(read.runs.items[0].private_metadata, value, "run.privateMetadata")
        assert read.queued_items is not None
        _assert_same(read.queued_items.items[0].input, value, "queued.input")
        _assert_same(read.queued_items.items[0].metadata, value, "queued.metadata")

        listed = await store.list_threads({"scopeKey": scope, "limit": 1})
        _assert_same(listed.items[0].metadata, value, "listed.metadata")
        by_id = await store.read_thread(
            b.read(scope, "t1", messages={"type": "ids", "messageIds": ["m1"]})
        )
        assert by_id.messages is not None
        _assert_same(by_id.messages.items[0].metadata, value, "by_id.metadata")

    async def test_json_form_of_round_tripped_values(self, store: ThreadStore) -> None:
        scope = new_scope()
        await store.commit_thread(b.create(scope, "t1", metadata=copy.deepcopy(ROUND_TRIP)))
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        _assert_same(read.thread.to_json()["metadata"], ROUND_TRIP)
        _assert_same(read.thread.model_dump(mode="json")["metadata"], ROUND_TRIP)

    @pytest.mark.parametrize(
        "value",
        [None, True, 0, 1, 1.0, -1.5, "", "2030-01-01T00:00:00Z", [], [1, "a", None], {}],
        ids=repr,
    )
    async def test_any_json_value_as_tool_input_and_queued_input(
        self, store: ThreadStore, value: Any
    ) -> None:
        scope = new_scope()
        changes = {
            "messages": [b.insert(_message_with_part(_tool(input=value, output=value)))],
            **_queued(input=value),
        }
        await store.commit_thread(b.create(scope, "t1", changes))
        read = await _read_all(store, scope)
        assert read.messages is not None
        part = read.messages.items[0].parts[0]
        assert isinstance(part, ToolCallPart)
        _assert_same(part.input, value)
        _assert_same(part.output, value)
        assert read.queued_items is not None
        _assert_same(read.queued_items.items[0].input, value)

    async def test_null_tool_output_kept_and_absent_output_omitted(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        with_null = _message_with_part(_tool(output=None))
        without = _message_with_part(_tool(state="input-available"))
        without["messageId"] = "m2"
        await store.commit_thread(
            b.create(scope, "t1", {"messages": [b.insert(with_null), b.insert(without)]})
        )
        read = await _read_all(store, scope)
        assert read.messages is not None
        first, second = (m.to_json()["parts"][0] for m in read.messages.items)
        assert "output" in first
        assert first["output"] is None
        assert "output" not in second
        assert "errorText" not in second
        # The JSON form parses back to an equal record.
        for message in read.messages.items:
            assert Message.model_validate(message.to_json()) == message
            assert Message.model_validate(message.to_json()).to_json() == message.to_json()

    async def test_input_mutation_after_commit_does_not_leak(self, store: ThreadStore) -> None:
        scope = new_scope()
        metadata: dict[str, Any] = {"list": [1, 2], "obj": {"k": "v"}}
        await store.commit_thread(b.create(scope, "t1", metadata=metadata))
        metadata["list"].append(3)
        metadata["obj"]["k"] = "changed"
        metadata["new"] = True
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        _assert_same(read.thread.metadata, {"list": [1, 2], "obj": {"k": "v"}})

    # ------------------------------------------------------------ the JSON form

    async def test_json_form_of_every_record(self, store: ThreadStore, clock: ManualClock) -> None:
        scope = new_scope()
        clock.set(datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC))
        t = "2030-01-02T03:04:05.678Z"
        expires = "2030-01-02T03:05:05.678Z"
        failed = {
            **b.run("r0", "failed", operation=None),
            "error": {"code": "E_TOOL", "message": "tool failed"},
        }
        result = await store.commit_thread(
            b.create(
                scope,
                "t1",
                {
                    "messages": [b.insert(b.message("m1", "hello", run_id="r1"))],
                    "runs": [
                        b.insert(failed),
                        b.insert(b.run("r1", "running", inputs=["m1"])),
                        b.insert(b.run("r2", "queued", queue_item_id="q1")),
                    ],
                    "queuedItems": [b.insert(b.queued_item("q1", "r2", {"text": "next"}))],
                    "lease": b.acquire("r1", "w1", 60_000),
                },
                agent="helper",
                title="Hello",
                metadata={"m": 1},
                privateMetadata={"p": 2},
            )
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        version = result.thread.version.to_json()
        assert set(version) == {"threadInstanceId", "revision"}
        assert version["revision"] == 1
        expected_thread = {
            "scopeKey": scope,
            "threadId": "t1",
            "version": version,
            "agent": "helper",
            "directExecutionAllowed": True,
            "listVisibility": "visible",
            "title": "Hello",
            "metadata": {"m": 1},
            "privateMetadata": {"p": 2},
            "lease": {
                "kind": "run",
                "runId": "r1",
                "ownerId": "w1",
                "operation": "send",
                "acquiredAt": t,
                "expiresAt": expires,
            },
            "createdAt": t,
            "updatedAt": t,
        }
        assert result.to_json() == {
            "type": "committed",
            "thread": expected_thread,
            "committedAt": t,
        }

        read = await _read_all(store, scope)
        assert read.thread is not None
        assert read.thread.to_json() == expected_thread
        expected_message = {
            "messageId": "m1",
            "role": "user",
            "parts": [{"type": "text", "text": "hello"}],
            "producer": {"kind": "user"},
            "association": {"kind": "run", "runId": "r1", "relation": "input"},
            "visibility": {"transcript": True, "context": True},
            "status": "complete",
            "metadata": {},
            "createdAt": t,
            "updatedAt": t,
        }
        run_base = {
            "initiator": {"kind": "user"},
            "metadata": {},
            "privateMetadata": {},
            "createdAt": t,
            "updatedAt": t,
        }
        expected_runs = [
            {
                **run_base,
                "runId": "r0",
                "status": "failed",
                "admission": {"admitted": True, "admittedAt": t},
                "inputMessageIds": [],
                "error": {"code": "E_TOOL", "message": "tool failed"},
                "finishedAt": t,
            },
            {
                **run_base,
                "runId": "r1",
                "status": "running",
                "admission": {"admitted": True, "admittedAt": t},
                "inputMessageIds": ["m1"],
                "operation": "send",
            },
            {
                **run_base,
                "runId": "r2",
                "status": "queued",
                "admission": {"queueItemId": "q1", "admitted": False},
                "inputMessageIds": [],
                "operation": "send",
            },
        ]
        expected_item = {
            "queueItemId": "q1",
            "runId": "r2",
            "input": {"text": "next"},
            "metadata": {},
            "createdAt": t,
        }
        assert read.to_json() == {
            "observedAt": t,
            "thread": expected_thread,
            "messages": {"items": [expected_message], "version": version},
            "runs": {"items": expected_runs, "version": version},
            "queuedItems": {"items": [expected_item], "version": version},
        }
        # Every JSON form parses back to an equal record.
        assert ThreadRecord.model_validate(expected_thread) == read.thread
        assert read.messages is not None
        assert read.runs is not None
        assert read.queued_items is not None
        assert Message.model_validate(expected_message) == read.messages.items[0]
        assert [RunRecord.model_validate(r) for r in expected_runs] == read.runs.items
        assert QueuedItem.model_validate(expected_item) == read.queued_items.items[0]

    async def test_json_form_of_conflicts_and_deletes(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        scope = new_scope()
        created = await store.commit_thread(b.create(scope, "t1"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        conflict = await store.commit_thread(b.create(scope, "t1"))
        assert isinstance(conflict, ConflictResult)
        assert conflict.to_json() == {
            "type": "conflict",
            "currentVersion": created.thread.version.to_json(),
        }
        missing = await store.commit_thread(b.delete(scope, "t2", created.thread.version))
        assert isinstance(missing, ConflictResult)
        assert missing.to_json() == {"type": "conflict", "currentVersion": None}
        deleted = await store.commit_thread(b.delete(scope, "t1", created.thread.version))
        assert isinstance(deleted, CommittedResult)
        assert deleted.to_json() == {
            "type": "committed",
            "thread": None,
            "committedAt": created.to_json()["committedAt"],
        }
        read = await store.read_thread(
            b.read(scope, "t1", messages={"type": "ids", "messageIds": ["m"]})
        )
        assert read.to_json() == {"observedAt": created.to_json()["committedAt"], "thread": None}

    async def test_page_json_has_token_only_when_more(self, store: ThreadStore) -> None:
        scope = new_scope()
        await store.commit_thread(
            b.create(
                scope, "t1", {"messages": [b.insert(b.message("m1")), b.insert(b.message("m2"))]}
            )
        )
        one = await store.read_thread(
            b.read(scope, "t1", messages={"type": "page", "view": "raw", "page": {"limit": 1}})
        )
        two = await store.read_thread(
            b.read(scope, "t1", messages={"type": "page", "view": "raw", "page": {"limit": 2}})
        )
        one_json = one.to_json()["messages"]
        two_json = two.to_json()["messages"]
        assert isinstance(one_json["nextPageToken"], str)
        assert "nextPageToken" not in two_json
        listed = await store.list_threads({"scopeKey": scope, "limit": 1})
        assert listed.to_json() == {"items": [listed.items[0].to_json()]}

    async def test_real_clock_timestamps_are_milliseconds(
        self, real_clock_store: ThreadStore
    ) -> None:
        scope = new_scope()
        before = datetime.now(UTC)
        await real_clock_store.commit_thread(
            b.create(scope, "t1", {"messages": [b.insert(b.message("m1"))]})
        )
        read = await _read_all(real_clock_store, scope)
        assert read.thread is not None
        created = read.thread.created_at
        assert created.microsecond % 1000 == 0
        assert created.utcoffset() is not None
        assert created.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        # Generous bound: the provider clock may differ a little from this process.
        assert abs((created - before).total_seconds()) < 300
        stamps = _timestamps(read.to_json())
        assert len(stamps) >= 5
        for where, stamp in stamps:
            assert isinstance(stamp, str), where
            assert TIMESTAMP.match(stamp), f"{where}: {stamp!r}"

    async def test_public_projection_drops_private_metadata(self, store: ThreadStore) -> None:
        scope = new_scope()
        run = {**b.run("r1", "completed"), "metadata": {"pub": 1}, "privateMetadata": {"sec": 2}}
        await store.commit_thread(
            b.create(
                scope,
                "t1",
                {"runs": [b.insert(run)]},
                metadata={"pub": 1},
                privateMetadata={"secret": "s3cr3t"},
            )
        )
        read = await _read_all(store, scope)
        assert read.thread is not None
        assert read.runs is not None
        thread_public = public_projection(read.thread)
        expected = read.thread.to_json()
        del expected["privateMetadata"]
        assert thread_public == expected
        assert thread_public["metadata"] == {"pub": 1}
        assert "s3cr3t" not in repr(thread_public)
        run_public = public_projection(read.runs.items[0])
        expected_run = read.runs.items[0].to_json()
        del expected_run["privateMetadata"]
        assert run_public == expected_run
        assert run_public["metadata"] == {"pub": 1}
        # The projection is a copy: the record keeps its private metadata.
        assert read.thread.private_metadata == {"secret": "s3cr3t"}

    async def test_model_dump_json_mode_is_the_json_form(
        self, store: ThreadStore, clock: ManualClock
    ) -> None:
        # model_dump(mode="json") gives the camelCase JSON form with absent optional
        # fields omitted (never null), exactly like to_json(): docs/data-model.md#the-json-form.
        scope = new_scope()
        await store.commit_thread(
            b.create(
                scope,
                "t1",
                {
                    "messages": [b.insert(b.message("m1", run_id="r1"))],
                    "runs": [
                        b.insert(b.run("r1", "running", inputs=["m1"])),
                        b.insert(b.run("r2", "queued", queue_item_id="q1")),
                    ],
                    "queuedItems": [b.insert(b.queued_item("q1", "r2"))],
                    "lease": b.acquire("r1", "w1"),
                },
            )
        )
        read = await _read_all(store, scope)
        assert read.thread is not None
        assert read.messages is not None
        assert read.runs is not None
        assert read.queued_items is not None
        records: list[Any] = [
            read.thread,
            *read.messages.items,
            *read.runs.items,
            *read.queued_items.items,
            read.messages,
            read,
        ]
        for record in records:
            assert record.model_dump(mode="json") == record.to_json(), type(record).__name__
        dumped = read.thread.model_dump(mode="json")
        assert "parentThreadId" not in dumped
        assert "renewedAt" not in dumped["lease"]

    async def test_renewed_lease_json_form(self, store: ThreadStore, clock: ManualClock) -> None:
        scope = new_scope()
        clock.set(datetime(2030, 5, 6, 7, 8, 9, 10000, tzinfo=UTC))
        created = await store.commit_thread(
            b.create(
                scope,
                "t1",
                {"runs": [b.insert(b.run("r1", "running"))], "lease": b.acquire("r1", "w1", 1000)},
            )
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        clock.advance(ms=500)
        renewed = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                created.thread.version,
                {"lease": b.renew("r1", "w1", 2000)},
                root=b.root(),
            )
        )
        assert isinstance(renewed, CommittedResult)
        assert renewed.thread is not None
        assert renewed.thread.to_json()["lease"] == {
            "kind": "run",
            "runId": "r1",
            "ownerId": "w1",
            "operation": "send",
            "acquiredAt": "2030-05-06T07:08:09.010Z",
            "renewedAt": "2030-05-06T07:08:09.510Z",
            "expiresAt": "2030-05-06T07:08:11.510Z",
        }
