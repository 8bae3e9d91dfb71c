"""Errors (docs/errors.md): malformed inputs, the error hierarchy, defensive copies."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    ReadThreadInput,
    ThreadRecord,
    ThreadStore,
)
from pai_storage import builders as b
from pai_storage.errors import (
    ThreadStoreCommitUnknownError,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStorePageTokenError,
    ThreadStoreSerializationError,
    ThreadStoreUnavailableError,
)

from ._support import new_scope

__all__ = ["TestErrorsAndWarnings"]

pytestmark = pytest.mark.asyncio

VERSION = {"threadInstanceId": "0" * 32, "revision": 1}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with ``value`` set at a dotted path (``a.b.0.c``)."""
    data = copy.deepcopy(base)
    target: Any = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return data


def _without(base: dict[str, Any], path: str) -> dict[str, Any]:
    data = copy.deepcopy(base)
    target: Any = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    del target[keys[-1]]
    return data


def _full_create(scope: str) -> dict[str, Any]:
    return b.create(
        scope,
        "t1",
        {
            "messages": [b.insert(b.message("m1", run_id="r1"))],
            "runs": [b.insert(b.run("r1", "running", inputs=["m1"]))],
            "lease": b.acquire("r1", "w1"),
        },
    )


M0 = "mutation.changes.messages.0.record"
R0 = "mutation.changes.runs.0.record"
LEASE = "mutation.changes.lease"
STAMP = "2030-01-01T00:00:00.000Z"


def _tool_create(scope: str) -> dict[str, Any]:
    """:func:`_full_create` whose message has a second part, a tool call."""
    data = _full_create(scope)
    data["mutation"]["changes"]["messages"][0]["record"]["parts"].append(
        {
            "type": "tool-call",
            "toolCallId": "call-1",
            "toolName": "search",
            "input": {},
            "state": "input-available",
        }
    )
    return data


# (id, mutate(scope) -> commit input, word the error message must contain)
COMMIT_CASES: list[Any] = [
    pytest.param(lambda s: _with(_full_create(s), "colour", "red"), "colour", id="unknown-top"),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.colour", 1), "colour", id="unknown-root"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.colour", 1), "colour", id="unknown-message-field"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.createdAt", "2030-01-01T00:00:00.000Z"),
        "createdAt",
        id="stamp-in-draft",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.events", []),
        "events",
        id="unknown-family",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.parts.0.type", "video"),
        "parts[0]",
        id="unknown-part-type",
    ),
    pytest.param(lambda s: _with(_full_create(s), f"{M0}.parts", []), "parts", id="empty-parts"),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.parts", "hello"), "parts", id="parts-not-list"
    ),
    pytest.param(
        lambda s: _without(_full_create(s), f"{M0}.visibility.context"),
        "context",
        id="missing-visibility-field",
    ),
    pytest.param(lambda s: _with(_full_create(s), f"{M0}.role", "robot"), "role", id="bad-role"),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.association.kind", "thread"),
        "association",
        id="bad-association",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.runs.0.record.status", "done"),
        "status",
        id="bad-run-status",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.runs.0.record.inputMessageIds", "m1"),
        "inputMessageIds",
        id="input-ids-not-list",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.messages.0.type", "upsert"),
        "messages[0]",
        id="unknown-change-type",
    ),
    pytest.param(
        lambda s: _with(
            _full_create(s), "mutation.changes.queuedItems", [{"type": "truncate", "afterId": None}]
        ),
        "queuedItems[0]",
        id="truncate-queued-items",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.lease.durationMs", 0),
        "durationMs",
        id="duration-0",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.lease.durationMs", 86_400_001),
        "durationMs",
        id="duration-too-long",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.lease.durationMs", 1.5),
        "durationMs",
        id="duration-float",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.lease.durationMs", "1000"),
        "durationMs",
        id="duration-string",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.lease.lease.kind", "thread"),
        "kind",
        id="bad-lease-kind",
    ),
    pytest.param(
        lambda s: _with(
            b.update_at(s, "t1", VERSION, {"lease": b.release("r1", "w1")}, root=b.root()),
            "mutation.changes.lease.expiry",
            "never",
        ),
        "expiry",
        id="bad-release-expiry",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "condition", {"type": "version", "version": VERSION}),
        "condition",
        id="create-with-version-condition",
    ),
    pytest.param(
        lambda s: _with(
            b.update_at(s, "t1", VERSION, root=b.root()), "condition", {"type": "missing"}
        ),
        "condition",
        id="update-with-missing-condition",
    ),
    pytest.param(
        lambda s: _with(b.delete(s, "t1", VERSION), "condition", {"type": "missing"}),
        "condition",
        id="delete-with-missing-condition",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.type", "upsert"), "mutation", id="bad-mutation"
    ),
    pytest.param(
        lambda s: _with(
            b.update_at(s, "t1", VERSION, root=b.root()), "condition.version.revision", 0
        ),
        "revision",
        id="revision-0",
    ),
    pytest.param(
        lambda s: _with(
            b.update_at(s, "t1", VERSION, root=b.root()), "condition.version.revision", "1"
        ),
        "revision",
        id="revision-string",
    ),
    pytest.param(
        lambda s: _with(
            b.update_at(s, "t1", VERSION, root=b.root()), "condition.version.revision", True
        ),
        "revision",
        id="revision-bool",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.agent", 5), "agent", id="agent-int"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.directExecutionAllowed", "yes"),
        "directExecutionAllowed",
        id="bool-string",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.directExecutionAllowed", 1),
        "directExecutionAllowed",
        id="bool-int",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.listVisibility", "secret"),
        "listVisibility",
        id="bad-visibility",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.title", 5), "title", id="title-int"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.metadata", []),
        "metadata",
        id="metadata-list",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.metadata", None),
        "metadata",
        id="metadata-null",
    ),
    pytest.param(
        lambda s: _without(_full_create(s), "mutation.root.privateMetadata"),
        "privateMetadata",
        id="missing-private-metadata",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.agent", ""), "agent", id="empty-agent"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.messageId", ""), "messageId", id="empty-id"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.messageId", "m" * 1025),
        "messageId",
        id="long-record-id",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.parts.0.text", "bad \udc00"),
        "text",
        id="lone-surrogate-text",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "threadId", None), "threadId", id="thread-id-null"
    ),
    # closed shapes and enumerations of every record and change
    pytest.param(
        lambda s: _with(_tool_create(s), f"{M0}.parts.1.state", "done"), "state", id="tool-state"
    ),
    pytest.param(
        lambda s: _without(_tool_create(s), f"{M0}.parts.1.input"), "input", id="tool-no-input"
    ),
    pytest.param(
        lambda s: _with(_tool_create(s), f"{M0}.parts.1.toolCallId", ""),
        "toolCallId",
        id="tool-call-id-empty",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.parts.0", {"type": "file", "mediaType": "x"}),
        "url",
        id="file-no-url",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.parts.0", {"type": "data", "data": 1}),
        "name",
        id="data-no-name",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.producer.kind", "robot"),
        "producer.kind",
        id="producer-kind",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.producer.id", "p" * 1025),
        "producer.id",
        id="producer-id-long",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.status", "done"), "status", id="message-status"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.visibility.transcript", 1),
        "transcript",
        id="visibility-int",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.association.relation", "reply"),
        "relation",
        id="bad-relation",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{M0}.association", {"kind": "run", "runId": "r1"}),
        "relation",
        id="run-association-without-relation",
    ),
    pytest.param(
        lambda s: _with(
            _full_create(s), f"{M0}.association", {"kind": "standalone", "runId": "r1"}
        ),
        "runId",
        id="standalone-association-with-run",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.operation", "retry"), "operation", id="run-op"
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.error", {"code": "E"}),
        "error.message",
        id="run-error-incomplete",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.initiator.kind", "application"),
        "initiator.kind",
        id="initiator-kind",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.initiator.id", ""),
        "initiator.id",
        id="initiator-id-empty",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.admission.admitted", "true"),
        "admitted",
        id="admitted-string",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.admission.admittedAt", STAMP),
        "admittedAt",
        id="admitted-at-in-draft",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.finishedAt", STAMP),
        "finishedAt",
        id="finished-at-in-draft",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{R0}.inputMessageIds", ["m" * 1025]),
        "inputMessageIds",
        id="input-id-long",
    ),
    pytest.param(
        lambda s: _with(
            _full_create(s),
            "mutation.changes.queuedItems",
            [b.insert({**b.queued_item("q1", "r1"), "createdAt": STAMP})],
        ),
        "createdAt",
        id="queued-created-at-in-draft",
    ),
    pytest.param(
        lambda s: _with(
            _full_create(s),
            "mutation.changes.queuedItems",
            [b.insert({"queueItemId": "q1", "runId": "r1", "metadata": {}})],
        ),
        "input",
        id="queued-no-input",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{LEASE}.leaseOwnerId", "o" * 1025),
        "leaseOwnerId",
        id="lease-owner-long",
    ),
    pytest.param(
        lambda s: _without(_full_create(s), f"{LEASE}.operation"),
        "operation",
        id="acquire-without-operation",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{LEASE}.operation", "retry"),
        "operation",
        id="acquire-bad-operation",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), LEASE, [b.acquire("r1", "w1")]),
        "lease",
        id="lease-change-list",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{LEASE}.expiresAt", STAMP),
        "expiresAt",
        id="lease-stamp-in-change",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), LEASE, {**b.renew("r1", "w1"), "operation": "send"}),
        "operation",
        id="renew-with-operation",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), LEASE, {**b.release("r1", "w1"), "durationMs": 5}),
        "durationMs",
        id="release-with-duration",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), f"{LEASE}.lease.runId", ""), "runId", id="lease-run-id"
    ),
    pytest.param(
        lambda s: _with(
            b.update_at(s, "t1", {**VERSION, "x": 1}, root=b.root()), "mutation.root.title", "a"
        ),
        "version.x",
        id="version-extra-field",
    ),
    pytest.param(
        lambda s: b.update_at(s, "t1", {**VERSION, "threadInstanceId": ""}, root=b.root()),
        "threadInstanceId",
        id="instance-id-empty",
    ),
    pytest.param(
        lambda s: _with(b.delete(s, "t1", VERSION), "mutation.changes", {}),
        "changes",
        id="delete-with-changes",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.createdAt", STAMP),
        "createdAt",
        id="stamp-in-root",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.agent", "\u00e9" * 128 + "e"),
        "agent",
        id="agent-257-bytes",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.category", "\u00e9" * 128 + "e"),
        "category",
        id="category-257-bytes",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.root.parentThreadId", "\u00e9" * 128 + "e"),
        "parentThreadId",
        id="parent-257-bytes",
    ),
    pytest.param(
        lambda s: _with(_full_create(s), "mutation.changes.messages", [{"type": "truncate"}]),
        "afterId",
        id="truncate-without-after-id",
    ),
    pytest.param(
        lambda s: _with(
            _full_create(s), "mutation.changes.messages", [{"type": "delete", "id": "m1", "x": 1}]
        ),
        "messages[0]",
        id="delete-extra-field",
    ),
]

READ_CASES: list[Any] = [
    pytest.param({"messages": {"type": "all"}}, "messages", id="unknown-selection-type"),
    pytest.param({"events": {"type": "ids", "ids": ["x"]}}, "events", id="unknown-family"),
    pytest.param(
        {"messages": {"type": "page", "view": "hidden", "page": {"limit": 1}}},
        "view",
        id="bad-view",
    ),
    pytest.param(
        {"runs": {"type": "page", "order": "random", "page": {"limit": 1}}},
        "order",
        id="bad-order",
    ),
    pytest.param(
        {"runs": {"type": "page", "statuses": ["done"], "page": {"limit": 1}}},
        "statuses",
        id="bad-status-filter",
    ),
    pytest.param({"runs": {"type": "page", "page": {"limit": "5"}}}, "limit", id="limit-string"),
    pytest.param({"runs": {"type": "page", "page": {"limit": 1.0}}}, "limit", id="limit-float"),
    pytest.param({"runs": {"type": "page", "page": {}}}, "limit", id="limit-missing"),
    pytest.param(
        {"queuedItems": {"type": "page", "page": {"limit": 1, "pageToken": 5}}},
        "pageToken",
        id="token-int",
    ),
    pytest.param(
        {"messages": {"type": "page", "view": "raw", "colour": 1, "page": {"limit": 1}}},
        "colour",
        id="unknown-selection-field",
    ),
    pytest.param({"messages": {"type": "ids", "messageIds": "m1"}}, "messageIds", id="ids-str"),
    pytest.param(
        {"messages": {"type": "ids", "messageIds": [""]}}, "messageIds", id="ids-empty-id"
    ),
]

LIST_CASES: list[Any] = [
    pytest.param({"includeHidden": "yes"}, "includeHidden", id="hidden-string"),
    pytest.param({"visibility": "hidden"}, "visibility", id="unknown-field"),
    pytest.param({"limit": None}, "limit", id="limit-null"),
    pytest.param({"limit": "10"}, "limit", id="limit-string"),
    pytest.param({"agent": 1}, "agent", id="agent-int"),
    pytest.param({"category": ["a"]}, "category", id="category-list"),
    pytest.param({"pageToken": 7}, "pageToken", id="token-int"),
]


async def _assert_usable(store: ThreadStore) -> None:
    scope = new_scope()
    result = await store.commit_thread(_full_create(scope))
    assert isinstance(result, CommittedResult)
    read = await store.read_thread(b.read(scope, "t1"))
    assert read.thread is not None
    assert read.thread.version.revision == 1
    listed = await store.list_threads({"scopeKey": scope, "limit": 1})
    assert [t.thread_id for t in listed.items] == ["t1"]


async def _existing(store: ThreadStore, scope: str) -> ThreadRecord:
    result = await store.commit_thread(
        b.create(scope, "t1", {"messages": [b.insert(b.message("m1", metadata={"k": [1]}))]})
    )
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


class TestErrorsAndWarnings:
    """Typed errors for malformed input; the error tree; copies in and out."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    @pytest.mark.parametrize(("build", "word"), COMMIT_CASES)
    async def test_malformed_commit_is_invariant_error(
        self, store: ThreadStore, build: Callable[[str], dict[str, Any]], word: str
    ) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.commit_thread(build(scope))
        assert word in str(caught.value)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None
        await _assert_usable(store)

    @pytest.mark.parametrize(("build", "word"), COMMIT_CASES)
    async def test_malformed_commit_model_is_refused_alike(
        self, store: ThreadStore, build: Callable[[str], dict[str, Any]], word: str
    ) -> None:
        # The same input as a model: parsing refuses it with the same words, or (for
        # the few rules judged on the thread) the store does when it is committed.
        scope = new_scope()

        async def parse_and_commit() -> None:
            await store.commit_thread(CommitThreadInput.model_validate(build(scope)))

        with pytest.raises(ThreadStoreInvariantError) as caught:
            await parse_and_commit()
        assert word in str(caught.value)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None

    async def test_malformed_update_leaves_thread_unchanged(self, store: ThreadStore) -> None:
        scope = new_scope()
        existing = await _existing(store, scope)
        bad = b.update_at(
            scope,
            "t1",
            existing.version,
            {"messages": [b.insert({**b.message("m2"), "parts": []})]},
            root=b.root(title="changed"),
        )
        with pytest.raises(ThreadStoreInvariantError, match="parts"):
            await store.commit_thread(bad)
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread == existing

    @pytest.mark.parametrize(("include", "word"), READ_CASES)
    async def test_malformed_read_is_invariant_error(
        self, store: ThreadStore, include: dict[str, Any], word: str
    ) -> None:
        scope = new_scope()
        await _existing(store, scope)
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.read_thread({"scopeKey": scope, "threadId": "t1", "include": include})
        assert word in str(caught.value)
        await _assert_usable(store)

    @pytest.mark.parametrize(("fields", "word"), LIST_CASES)
    async def test_malformed_list_is_invariant_error(
        self, store: ThreadStore, fields: dict[str, Any], word: str
    ) -> None:
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.list_threads({"scopeKey": new_scope(), "limit": 5, **fields})
        assert word in str(caught.value)
        await _assert_usable(store)

    @pytest.mark.parametrize(
        ("request_", "path"),
        [
            pytest.param(
                {
                    "scopeKey": "s",
                    "threadId": "t",
                    "include": {"runs": {"type": "page", "order": "x", "page": {"limit": 1}}},
                },
                "include.runs.order",
                id="read-order",
            ),
            pytest.param(
                {
                    "scopeKey": "s",
                    "threadId": "t",
                    "include": {"messages": {"type": "page", "view": "raw", "page": {"limit": 0}}},
                },
                "include.messages.page.limit",
                id="read-limit",
            ),
        ],
    )
    async def test_read_error_names_the_json_path(
        self, store: ThreadStore, request_: dict[str, Any], path: str
    ) -> None:
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.read_thread(request_)
        assert path in str(caught.value)

    @pytest.mark.parametrize(
        ("build", "path"),
        [
            pytest.param(
                lambda s: _with(
                    b.update_at(s, "t1", VERSION, root=b.root()), "condition.version.revision", 0
                ),
                "condition.version.revision",
                id="revision",
            ),
            pytest.param(
                lambda s: _with(_full_create(s), f"{M0}.parts.0.text", 5),
                "mutation.changes.messages[0].record.parts[0].text",
                id="text-part-text",
            ),
            pytest.param(
                lambda s: _with(_full_create(s), "mutation.changes.lease.durationMs", 0),
                "mutation.changes.lease.durationMs",
                id="duration",
            ),
        ],
    )
    async def test_commit_error_names_the_json_path(
        self, store: ThreadStore, build: Callable[[str], dict[str, Any]], path: str
    ) -> None:
        with pytest.raises(ThreadStoreInvariantError) as caught:
            await store.commit_thread(build(new_scope()))
        assert path in str(caught.value)

    async def test_errors_never_echo_input_values(self, store: ThreadStore) -> None:
        secret = "SECRET-VALUE-4242"
        scope = new_scope()
        cases = [
            _with(_full_create(scope), "mutation.root.agent", [secret]),
            _with(_full_create(scope), "mutation.root.listVisibility", secret),
            _with(_full_create(scope), "mutation.root.metadata", [secret]),
            _with(_full_create(scope), f"{M0}.role", secret),
        ]
        for bad in cases:
            with pytest.raises(ThreadStoreInvariantError) as caught:
                await store.commit_thread(bad)
            assert secret not in str(caught.value)
            assert secret not in repr(caught.value)

    @pytest.mark.parametrize("value", [42, "commit", None, ["scopeKey"], b"{}"], ids=repr)
    async def test_non_mapping_inputs_are_invariant_errors(
        self, store: ThreadStore, value: Any
    ) -> None:
        with pytest.raises(ThreadStoreInvariantError):
            await store.commit_thread(value)
        with pytest.raises(ThreadStoreInvariantError):
            await store.read_thread(value)
        with pytest.raises(ThreadStoreInvariantError):
            await store.list_threads(value)
        await _assert_usable(store)

    async def test_wrong_model_type_is_invariant_error(self, store: ThreadStore) -> None:
        scope = new_scope()
        read_model = ReadThreadInput.model_validate(b.read(scope, "t1"))
        with pytest.raises(ThreadStoreInvariantError):
            await store.commit_thread(read_model)  # type: ignore[arg-type]

    # ------------------------------------------------------------ models or JSON

    async def test_inputs_may_be_models_or_json(self, store: ThreadStore) -> None:
        scope_json, scope_model = new_scope(), new_scope()
        created_json = await store.commit_thread(_full_create(scope_json))
        created_model = await store.commit_thread(
            CommitThreadInput.model_validate(_full_create(scope_model))
        )
        assert isinstance(created_json, CommittedResult)
        assert isinstance(created_model, CommittedResult)
        assert created_json.thread is not None
        assert created_model.thread is not None
        assert created_model.thread.version.revision == 1

        selection = {"type": "page", "view": "raw", "page": {"limit": 10}}
        read_json = await store.read_thread(b.read(scope_model, "t1", messages=selection))
        read_model = await store.read_thread(
            ReadThreadInput.model_validate(b.read(scope_model, "t1", messages=selection))
        )
        assert read_json == read_model
        assert read_model.messages is not None
        assert [m.message_id for m in read_model.messages.items] == ["m1"]

        listed_json = await store.list_threads({"scopeKey": scope_model, "limit": 5})
        listed_model = await store.list_threads(
            ListThreadsInput.model_validate({"scopeKey": scope_model, "limit": 5})
        )
        assert listed_json == listed_model
        assert [t.thread_id for t in listed_model.items] == ["t1"]

        update = CommitThreadInput.model_validate(
            b.update_at(
                scope_model, "t1", created_model.thread.version, root=b.root(title="via model")
            )
        )
        updated = await store.commit_thread(update)
        assert isinstance(updated, CommittedResult)
        assert updated.thread is not None
        assert updated.thread.title == "via model"

    async def test_record_json_forms_are_accepted_as_inputs(self, store: ThreadStore) -> None:
        # A read record's draft (its JSON form minus the stamps) can be replaced as is.
        scope = new_scope()
        existing = await _existing(store, scope)
        read = await store.read_thread(
            b.read(scope, "t1", messages={"type": "ids", "messageIds": ["m1"]})
        )
        assert read.messages is not None
        draft = read.messages.items[0].to_json()
        del draft["createdAt"], draft["updatedAt"]
        draft["metadata"] = {"edited": True}
        result = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                existing.version,
                {"messages": [{"type": "replace", "record": draft}]},
                root=b.root(),
            )
        )
        assert isinstance(result, CommittedResult)
        again = await store.read_thread(
            b.read(scope, "t1", messages={"type": "ids", "messageIds": ["m1"]})
        )
        assert again.messages is not None
        assert again.messages.items[0].metadata == {"edited": True}

    # ------------------------------------------------------------ no stored contents

    async def test_reprs_never_show_opaque_values(self, store: ThreadStore) -> None:
        # Metadata may hold personal data: no repr or str of an input, a record, a
        # page or a result shows an opaque value, its keys included.
        secret = "SECRET-5151"
        scope = new_scope()
        opaque = {secret: [secret], "k": secret}
        message = b.message("m1", run_id="r1", metadata=opaque)
        message["parts"] += [
            {"type": "text", "text": "t", "providerMetadata": opaque},
            {
                "type": "tool-call",
                "toolCallId": "c1",
                "toolName": "search",
                "input": opaque,
                "state": "output-available",
                "output": [secret],
                "callProviderMetadata": opaque,
                "resultProviderMetadata": opaque,
            },
            {"type": "data", "name": "d", "data": secret},
            {"type": "file", "mediaType": "x", "url": "u", "providerMetadata": opaque},
        ]
        run = b.run("r1", "running", inputs=["m1"], metadata=opaque)
        run["privateMetadata"] = opaque
        commit = b.create(
            scope,
            "t1",
            {
                "messages": [b.insert(message)],
                "runs": [b.insert(run), b.insert(b.run("r2", "queued", queue_item_id="q1"))],
                "queuedItems": [
                    b.insert({**b.queued_item("q1", "r2", opaque), "metadata": opaque})
                ],
                "lease": b.acquire("r1", "w1"),
            },
            metadata=opaque,
            privateMetadata=opaque,
        )
        model = CommitThreadInput.model_validate(commit)
        result = await store.commit_thread(model)
        assert isinstance(result, CommittedResult)
        read = await store.read_thread(
            b.read(
                scope,
                "t1",
                messages={"type": "page", "view": "raw", "page": {"limit": 5}},
                runs={"type": "page", "page": {"limit": 5}},
                queuedItems={"type": "page", "page": {"limit": 5}},
            )
        )
        listed = await store.list_threads({"scopeKey": scope, "limit": 5})
        assert read.messages is not None
        assert read.runs is not None
        assert read.queued_items is not None
        assert read.thread is not None
        assert read.thread.metadata == opaque  # stored and returned as given
        shown: list[object] = [
            model,
            result,
            read,
            listed,
            read.thread,
            read.messages,
            *read.messages.items,
            *read.messages.items[0].parts,
            *read.runs.items,
            *read.queued_items.items,
        ]
        for value in shown:
            assert secret not in repr(value), type(value).__name__
            assert secret not in str(value), type(value).__name__

    async def test_errors_never_show_stored_contents(self, store: ThreadStore) -> None:
        secret = "SECRET-6262"
        scope = new_scope()
        created = await store.commit_thread(
            b.create(
                scope,
                "t1",
                {
                    "messages": [b.insert(b.message("m1", run_id="r1", metadata={"k": secret}))],
                    "runs": [b.insert(b.run("r1", "running", inputs=["m1"], metadata={secret: 1}))],
                    "lease": b.acquire("r1", "w1"),
                },
                metadata={"k": secret},
                privateMetadata={secret: secret},
            )
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        version = created.thread.version
        again = {"k": secret}
        failing = [
            {"messages": [b.insert(b.message("m1", metadata=again))]},
            {"messages": [b.replace(b.message("m9", metadata=again))]},
            {"messages": [b.insert(b.message("m2", run_id="ghost", metadata=again))]},
            {"runs": [b.replace(b.run("r1", "completed", inputs=["m1"], metadata=again))]},
            {"runs": [b.delete_record("r1")]},
            {"messages": [b.truncate("m9")]},
        ]
        for changes in failing:
            with pytest.raises(ThreadStoreInvariantError) as caught:
                await store.commit_thread(
                    b.update_at(scope, "t1", version, changes, root=b.root(metadata={"k": secret}))
                )
            assert secret not in str(caught.value)
            assert secret not in repr(caught.value)
        conflict = await store.commit_thread(b.create(scope, "t1", metadata={"k": secret}))
        assert isinstance(conflict, ConflictResult)
        assert secret not in repr(conflict)

    # ------------------------------------------------------------ hierarchy

    @pytest.mark.parametrize(
        "error",
        [
            ThreadStorePageTokenError,
            ThreadStoreInvariantError,
            ThreadStoreSerializationError,
            ThreadStoreCommitUnknownError,
            ThreadStoreUnavailableError,
            ThreadStoreConfigurationError,
        ],
    )
    async def test_every_error_derives_from_thread_store_error(
        self, error: type[Exception]
    ) -> None:
        assert issubclass(error, ThreadStoreError)
        assert issubclass(ThreadStoreError, Exception)
        with pytest.raises(ThreadStoreError):
            raise error("boom")

    async def test_raised_errors_are_caught_by_the_root(self, store: ThreadStore) -> None:
        scope = new_scope()
        await _existing(store, scope)
        with pytest.raises(ThreadStoreError):
            await store.commit_thread(b.create(scope, "t2", metadata={"x": float("nan")}))
        with pytest.raises(ThreadStoreError):
            await store.read_thread(
                b.read(
                    scope,
                    "t1",
                    messages={
                        "type": "page",
                        "view": "raw",
                        "page": {"limit": 1, "pageToken": "x"},
                    },
                )
            )
        with pytest.raises(ThreadStoreError):
            await store.list_threads({"scopeKey": scope, "limit": 0})

    async def test_conflict_is_a_result_not_an_error(self, store: ThreadStore) -> None:
        scope = new_scope()
        existing = await _existing(store, scope)
        result = await store.commit_thread(b.create(scope, "t1"))
        assert isinstance(result, ConflictResult)
        assert not isinstance(result, BaseException)
        assert result.current_version == existing.version

    # ------------------------------------------------------------ copies

    async def test_mutating_inputs_after_commit_does_not_change_the_store(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        message = b.message("m1", metadata={"k": [1]})
        queued_input: dict[str, Any] = {"text": ["hi"]}
        request = b.create(
            scope,
            "t1",
            {
                "messages": [b.insert(message)],
                "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
                "queuedItems": [b.insert(b.queued_item("q1", "r1", queued_input))],
            },
            metadata={"root": {"x": 1}},
        )
        model = CommitThreadInput.model_validate(copy.deepcopy(request))
        await store.commit_thread(request)
        message["metadata"]["k"].append(2)
        message["parts"][0]["text"] = "changed"
        queued_input["text"].append("there")
        request["mutation"]["root"]["metadata"]["root"]["x"] = 2

        scope_model = new_scope()
        model_data = model.model_copy(update={"scope_key": scope_model})
        await store.commit_thread(model_data)
        with pytest.raises(TypeError):  # a model's values are read-only
            model_data.mutation.root.metadata["root"]["x"] = 3  # type: ignore[union-attr]

        for current in (scope, scope_model):
            read = await store.read_thread(
                b.read(
                    current,
                    "t1",
                    messages={"type": "ids", "messageIds": ["m1"]},
                    queuedItems={"type": "ids", "queueItemIds": ["q1"]},
                )
            )
            assert read.thread is not None
            assert read.thread.metadata == {"root": {"x": 1}}, current
            assert read.messages is not None
            assert read.messages.items[0].metadata == {"k": [1]}
            assert read.messages.items[0].to_json()["parts"] == [{"type": "text", "text": "m1"}]
            assert read.queued_items is not None
            assert read.queued_items.items[0].input == {"text": ["hi"]}
