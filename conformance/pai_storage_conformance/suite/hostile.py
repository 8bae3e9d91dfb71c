"""Hostile values (docs/json.md, docs/reads.md#page-tokens): operator-looking keys,
malformed and forged page tokens, out-of-range integers, aliasing, JSON bombs,
and typed errors for every bad input."""

from __future__ import annotations

import copy
import json
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pai_storage import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    InvalidInputError,
    PageTokenError,
    StorageError,
    ThreadReadResult,
    ThreadStore,
    ThreadVersion,
)
from pai_storage import builders as b
from pai_storage.errors import (
    ThreadStoreInvariantError,
    ThreadStorePageTokenError,
    ThreadStoreSerializationError,
)
from pai_storage.models import MessageDraft, PageRequest
from pai_storage.strict_json import MAX_JSON_DEPTH

from ._support import new_scope, token_of, token_parts, token_payload

__all__ = ["TestHostileValues"]

pytestmark = pytest.mark.asyncio

# Objects a document database or a JSON layer may treat as more than data.
HOSTILE_OBJECTS: list[Any] = [
    pytest.param({"$ref": "users", "$id": 1}, id="dbref"),
    pytest.param({"$ref": "users", "$id": 1, "$db": "admin"}, id="dbref-db"),
    pytest.param({"$id": "x", "$ref": "users"}, id="dbref-reordered"),
    pytest.param({"$ref": "users", "$id": {"$oid": "507f1f77bcf86cd799439011"}}, id="dbref-oid"),
    pytest.param(
        {
            "$where": "sleep(1000)",
            "$gt": "",
            "$ne": None,
            "$in": [1],
            "$set": {"admin": True},
            "$inc": {"n": 1},
            "$expr": {"$eq": [1, 1]},
            "$regex": ".*",
            "$options": "i",
        },
        id="query-operators",
    ),
    pytest.param(
        {
            "$oid": "507f1f77bcf86cd799439011",
            "$date": "2030-01-01T00:00:00Z",
            "$numberLong": "9",
            "$numberDecimal": "1.5",
            "$binary": {"base64": "AA==", "subType": "00"},
            "$timestamp": {"t": 1, "i": 1},
            "$minKey": 1,
            "$maxKey": 1,
            "$undefined": True,
            "$code": "function () {}",
            "$symbol": "s",
        },
        id="extended-json",
    ),
    pytest.param({"$date": {"$numberLong": "0"}}, id="extended-json-date"),
    pytest.param(
        {
            "$": 1,
            ".": 2,
            "a.b": 3,
            "$.": 4,
            "": 5,
            "_id": 6,
            "__proto__": {"polluted": True},
            "constructor": {"prototype": {"polluted": True}},
            "'; DROP TABLE t; --": 7,
            "%_\\": 8,
            "\x00": 9,
        },
        id="odd-keys",
    ),
    pytest.param(
        {"a": [{"$ref": "x", "$id": 2}, {"$db": "y"}], "b": {"c": {"$ref": "z", "$id": None}}},
        id="nested-dbrefs",
    ),
]


def _nested(levels: int) -> dict[str, Any]:
    """An object ``levels`` containers deep, alternating objects and arrays."""
    value: Any = "leaf"
    for level in range(levels - 1):
        value = [value, level] if level % 2 else {"k": value, "$n": level}
    return {"top": value}


def _same(got: Any, expected: Any) -> None:
    """Equal as JSON text: equal values, types and key order."""
    assert json.dumps(got) == json.dumps(expected)


def _tool(value: Any) -> dict[str, Any]:
    return {
        "type": "tool-call",
        "toolCallId": "call-1",
        "toolName": "search",
        "input": value,
        "state": "output-available",
        "output": value,
    }


def _message(message_id: str, value: Any) -> dict[str, Any]:
    message = b.message(message_id, role="assistant", metadata=value)
    message["parts"] = [{"type": "text", "text": "x"}, _tool(value)]
    return message


def _changes(value: Any) -> dict[str, Any]:
    run = b.run("r1", "queued", queue_item_id="q1", metadata=value)
    queued = {**b.queued_item("q1", "r1", value), "metadata": value}
    return {
        "messages": [b.insert(_message("m1", value))],
        "runs": [b.insert(run)],
        "queuedItems": [b.insert(queued)],
    }


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


def _assert_holds(read: ThreadReadResult, value: Any, root: Any) -> None:
    """Every location of ``read`` holds ``value`` (``root`` for the root's metadata)."""
    assert read.thread is not None
    assert read.messages is not None
    assert read.runs is not None
    assert read.queued_items is not None
    thread = read.thread.to_json()
    _same(thread["metadata"], root)
    _same(thread["privateMetadata"], root)
    message = read.messages.items[0].to_json()
    _same(message["metadata"], value)
    _same(message["parts"][1]["input"], value)
    _same(message["parts"][1]["output"], value)
    run = read.runs.items[0].to_json()
    _same(run["metadata"], value)
    queued = read.queued_items.items[0].to_json()
    _same(queued["input"], value)
    _same(queued["metadata"], value)


@contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """Fail rather than hang where an exponential regression would hang (POSIX only)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _bomb(levels: int = 40) -> Any:
    value: Any = [1]
    for _ in range(levels):
        value = [value, value]
    return value


# ---------------------------------------------------------------- tokens


def _remint(store: ThreadStore, token: str, scope: str, **position: Any) -> str:
    """``token`` with position fields replaced, minted with the store's own codec."""
    payload = token_payload(token)
    codec = store.selections.codec
    return codec.encode(payload["k"], scope, payload["q"], {**payload["p"], **position})


def _malformed(token: str) -> list[Any]:
    head, payload, mac = token_parts(token)
    middle = len(token) // 2
    return [
        pytest.param(token[:middle] + "\u00e9" + token[middle + 1 :], id="non-ascii"),
        pytest.param(token[:-1] + "\u00e9", id="non-ascii-mac"),
        pytest.param(token[:middle] + "\ud800" + token[middle + 1 :], id="lone-surrogate"),
        pytest.param(token[:-1] + "\udfff", id="lone-surrogate-mac"),
        pytest.param("garbage", id="garbage"),
        pytest.param("!!!.???.***", id="garbage-3-parts"),
        pytest.param(token_of(head, payload, bytes(len(mac))), id="bad-mac"),
        pytest.param(token_of(head, payload, mac[:-1]), id="short-mac"),
        pytest.param(token_of(head, payload[:-1], mac), id="truncated-payload"),
        pytest.param(token_of(head, b"", mac), id="no-payload"),
        pytest.param(token[:-1], id="truncated-mac"),
        pytest.param(token[: len(token) // 2], id="truncated-half"),
        pytest.param(token[: len(head)], id="truncated-prefix"),
        pytest.param(token + "A", id="extended"),
        pytest.param(token + "." + token, id="doubled"),
        pytest.param(token + "=" * (-len(token) % 4 or 4), id="padded"),
        pytest.param("", id="empty"),
        pytest.param(" " + token, id="leading-space"),
    ]


MESSAGES = {"type": "page", "view": "raw", "page": {"limit": 1}}
RUNS = {"type": "page", "page": {"limit": 1}}
QUEUED = {"type": "page", "page": {"limit": 1}}
FAMILIES = [("messages", MESSAGES), ("runs", RUNS), ("queuedItems", QUEUED)]
ATTR = {"messages": "messages", "runs": "runs", "queuedItems": "queued_items"}


def _paged(selection: dict[str, Any], token: str, **extra: Any) -> dict[str, Any]:
    return {**selection, **extra, "page": {**selection["page"], "pageToken": token}}


async def _seed_pages(store: ThreadStore, scope: str) -> None:
    changes = {
        "messages": [b.insert(b.message(f"m{i}")) for i in range(3)],
        "runs": [b.insert(b.run(f"r{i}", "queued", queue_item_id=f"q{i}")) for i in range(3)],
        "queuedItems": [b.insert(b.queued_item(f"q{i}", f"r{i}")) for i in range(3)],
    }
    for thread in ("t1", "t2", "t3"):
        result = await store.commit_thread(b.create(scope, thread, changes))
        assert isinstance(result, CommittedResult)


async def _first_tokens(store: ThreadStore, scope: str) -> dict[str, str]:
    tokens: dict[str, str] = {}
    for family, selection in FAMILIES:
        read = await store.read_thread(b.read(scope, "t1", **{family: selection}))
        page = getattr(read, ATTR[family])
        assert page.next_page_token is not None
        tokens[family] = page.next_page_token
    listed = await store.list_threads({"scopeKey": scope, "limit": 1})
    assert listed.next_page_token is not None
    tokens["threads"] = listed.next_page_token
    return tokens


# ---------------------------------------------------------------- bad inputs

# Leaf replacements: wrong types, out-of-range numbers, invalid text, objects.
BAD_LEAVES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    -(2**63) - 1,
    2**64,
    1.5,
    float("nan"),
    float("inf"),
    -0.0,
    "",
    "\ud800",
    "x" * 1025,
    "\u00e9" * 300,
    b"bytes",
    [],
    [None],
    {},
    {"$ref": "users", "$id": 1},
    {1: "int key"},
    (1, 2),
    {1, 2},
    object(),
]


def _leaf_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (containers included, the root excluded)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict | list):
        items: Any = value.items() if isinstance(value, dict) else enumerate(value)
        for key, sub in items:
            found.append((*path, key))
            found.extend(_leaf_paths(sub, (*path, key)))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    data = copy.deepcopy(value)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return data


def _remove(value: Any, path: tuple[Any, ...]) -> Any:
    data = copy.deepcopy(value)
    target = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


async def _typed_outcome(call: Callable[[], Any]) -> BaseException | None:
    """Run one operation; return the exception if it is not a StorageError."""
    try:
        await call()
    except StorageError:
        return None
    except Exception as exc:
        return exc
    return None


class _NotJson:
    """An object with no JSON form."""


class TestHostileValues:
    """Hostile values are stored as data, refused with typed errors, never executed."""

    pytestmark = pytest.mark.asyncio

    # ------------------------------------------------------------ operator-looking keys

    @pytest.mark.parametrize("value", HOSTILE_OBJECTS)
    async def test_operator_looking_objects_are_plain_data_through_the_lifecycle(
        self, store: ThreadStore, value: Any
    ) -> None:
        scope = new_scope("hostile")
        root = {"top": value, "list": [value, value], "flat": 1}
        created = await store.commit_thread(
            b.create(scope, "t1", _changes(value), metadata=root, privateMetadata=root)
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        read = await _read_all(store, scope)
        _assert_holds(read, value, root)
        assert read.thread is not None
        _same(read.thread.to_json(), created.thread.to_json())

        # Update: the object becomes the whole root metadata; records are replaced.
        run = b.run("r1", "queued", queue_item_id="q1", metadata=value)
        queued = {**b.queued_item("q1", "r1", value), "metadata": value}
        updated = await store.commit_thread(
            b.update_at(
                scope,
                "t1",
                created.thread.version,
                {
                    "messages": [b.replace(_message("m1", value))],
                    "runs": [b.replace(run)],
                    "queuedItems": [b.replace(queued)],
                },
                root=b.root(metadata=value, privateMetadata=value),
            )
        )
        assert isinstance(updated, CommittedResult)
        assert updated.thread is not None
        read = await _read_all(store, scope)
        _assert_holds(read, value, value)
        assert read.thread is not None
        _same(read.thread.to_json(), updated.thread.to_json())

        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert len(listed.items) == 1
        _same(listed.items[0].to_json(), updated.thread.to_json())

        deleted = await store.commit_thread(b.delete(scope, "t1", updated.thread.version))
        assert isinstance(deleted, CommittedResult)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None
        assert (await store.list_threads({"scopeKey": scope, "limit": 10})).items == []

        again = await store.commit_thread(
            b.create(scope, "t1", _changes(value), metadata=root, privateMetadata=root)
        )
        assert isinstance(again, CommittedResult)
        read = await _read_all(store, scope)
        _assert_holds(read, value, root)

    async def test_operator_looking_ids_and_filters_are_plain_text(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope("hostile") + ".$where"
        odd = ["$ref", "$where", "a.b", "{$gt: ''}", "'; DROP TABLE t; --", "%", "_", "\\"]
        for thread in odd:
            result = await store.commit_thread(
                b.create(
                    scope,
                    thread,
                    {"messages": [b.insert(b.message(thread))]},
                    agent=thread,
                    category=thread,
                    parentThreadId=thread,
                )
            )
            assert isinstance(result, CommittedResult)
        for thread in odd:
            read = await store.read_thread(
                b.read(scope, thread, messages={"type": "ids", "messageIds": ["{$ne: 1}", thread]})
            )
            assert read.thread is not None
            assert read.thread.thread_id == thread
            assert read.messages is not None
            assert [m.message_id for m in read.messages.items] == [thread]
            for field in ("agent", "category", "parentThreadId"):
                listed = await store.list_threads({"scopeKey": scope, "limit": 20, field: thread})
                assert [t.thread_id for t in listed.items] == [thread], field
        other = await store.list_threads({"scopeKey": new_scope("hostile"), "limit": 20})
        assert other.items == []

    # ------------------------------------------------------------ page tokens

    async def test_malformed_page_tokens_are_page_token_errors(self, store: ThreadStore) -> None:
        scope = new_scope("hostile")
        await _seed_pages(store, scope)
        tokens = await _first_tokens(store, scope)
        for family, selection in FAMILIES:
            for param in _malformed(tokens[family]):
                bad = param.values[0]
                with pytest.raises(ThreadStorePageTokenError) as caught:
                    await store.read_thread(b.read(scope, "t1", **{family: _paged(selection, bad)}))
                assert isinstance(caught.value, PageTokenError), param.id
        for param in _malformed(tokens["threads"]):
            with pytest.raises(ThreadStorePageTokenError):
                await store.list_threads(
                    {"scopeKey": scope, "limit": 1, "pageToken": param.values[0]}
                )

    async def test_tokens_of_another_query_scope_or_family_are_refused(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope("hostile")
        other = new_scope("hostile")
        await _seed_pages(store, scope)
        await _seed_pages(store, other)
        tokens = await _first_tokens(store, scope)
        message_token = tokens["messages"]
        cases: list[tuple[str, dict[str, Any]]] = [
            ("query", {"messages": _paged(MESSAGES, message_token, view="transcript")}),
            ("query", {"messages": _paged(MESSAGES, message_token, order="newest")}),
            ("query", {"messages": _paged(MESSAGES, message_token, afterMessageId="m0")}),
            ("page", {"runs": _paged(RUNS, message_token)}),
            ("page", {"queuedItems": _paged(QUEUED, tokens["runs"])}),
            ("page", {"messages": _paged(MESSAGES, tokens["threads"])}),
        ]
        for words, include in cases:
            with pytest.raises(ThreadStorePageTokenError, match=words):
                await store.read_thread(b.read(scope, "t1", **include))
        with pytest.raises(ThreadStorePageTokenError, match="scope"):
            await store.read_thread(b.read(other, "t1", messages=_paged(MESSAGES, message_token)))
        for request in (
            {"includeHidden": True},
            {"agent": "assistant"},
            {"category": "c"},
            {"parentThreadId": "p"},
        ):
            with pytest.raises(ThreadStorePageTokenError, match="query"):
                await store.list_threads(
                    {"scopeKey": scope, "limit": 1, "pageToken": tokens["threads"], **request}
                )
        with pytest.raises(ThreadStorePageTokenError):
            await store.list_threads({"scopeKey": scope, "limit": 1, "pageToken": message_token})
        with pytest.raises(ThreadStorePageTokenError, match="scope"):
            await store.list_threads(
                {"scopeKey": other, "limit": 1, "pageToken": tokens["threads"]}
            )

    async def test_forged_positions_beyond_int64_are_page_token_errors(
        self, store: ThreadStore
    ) -> None:
        # Tokens minted with the store's own codec (as anyone can without a
        # token secret) over out-of-range contents: refused when decoded,
        # before the backend builds a query from them.
        scope = new_scope("hostile")
        await _seed_pages(store, scope)
        tokens = await _first_tokens(store, scope)
        for family, selection in FAMILIES:
            token = tokens[family]
            same = _remint(store, token, scope)
            read = await store.read_thread(b.read(scope, "t1", **{family: _paged(selection, same)}))
            assert [*getattr(read, ATTR[family]).items], "the re-minted token must be accepted"
            bad_positions: list[Any] = [2**63, 2**64, -1, -(2**63) - 1, "1", 1.5, [1]]
            for key in ("a", "lo", "c", "hi"):
                for bad in bad_positions:
                    forged = _remint(store, token, scope, **{key: bad})
                    with pytest.raises(ThreadStorePageTokenError):
                        await store.read_thread(
                            b.read(scope, "t1", **{family: _paged(selection, forged)})
                        )
            for bad_id in (5, "", "\ud800", None):
                forged = _remint(store, token, scope, i=bad_id)
                with pytest.raises(ThreadStorePageTokenError):
                    await store.read_thread(
                        b.read(scope, "t1", **{family: _paged(selection, forged)})
                    )
        token = tokens["threads"]
        listed = await store.list_threads(
            {"scopeKey": scope, "limit": 5, "pageToken": _remint(store, token, scope)}
        )
        assert len(listed.items) == 2
        for fields in (
            {"u": 2**63},
            {"u": -(2**63) - 1},
            {"u": 10**20},
            {"u": "0"},
            {"u": None},
            {"t": 5},
            {"t": "\ud800"},
            {"t": ""},
            {"t": "x" * 1025},
        ):
            with pytest.raises(ThreadStorePageTokenError):
                await store.list_threads(
                    {
                        "scopeKey": scope,
                        "limit": 5,
                        "pageToken": _remint(store, token, scope, **fields),
                    }
                )

    # ------------------------------------------------------------ integers

    async def test_revisions_beyond_int64_are_invalid_input(self, store: ThreadStore) -> None:
        scope = new_scope("hostile")
        created = await store.commit_thread(b.create(scope, "t1", metadata={"v": 1}))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        instance = created.thread.version.thread_instance_id
        for revision in (2**63, 2**64, 10**30):
            version = {"threadInstanceId": instance, "revision": revision}
            for commit in (
                b.update_at(scope, "t1", version, root=b.root(metadata={"v": 2})),
                b.delete(scope, "t1", version),
            ):
                with pytest.raises(ThreadStoreInvariantError, match="revision") as caught:
                    await store.commit_thread(commit)
                assert isinstance(caught.value, InvalidInputError)
        for revision in (0, -1, -(2**63), -(2**64)):
            version = {"threadInstanceId": instance, "revision": revision}
            with pytest.raises(ThreadStoreInvariantError, match="revision"):
                await store.commit_thread(b.update_at(scope, "t1", version, root=b.root()))
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread == created.thread

    async def test_largest_revision_is_a_conflict_not_an_error(self, store: ThreadStore) -> None:
        scope = new_scope("hostile")
        created = await store.commit_thread(b.create(scope, "t1", metadata={"v": 1}))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        current = created.thread.version
        for instance in (current.thread_instance_id, "0" * 32):
            version = ThreadVersion(thread_instance_id=instance, revision=2**63 - 1)
            for commit in (
                b.update_at(scope, "t1", version, root=b.root(metadata={"v": 2})),
                b.delete(scope, "t1", version),
            ):
                result = await store.commit_thread(commit)
                assert isinstance(result, ConflictResult)
                assert result.current_version == current
        missing = ThreadVersion(thread_instance_id="0" * 32, revision=2**63 - 1)
        result = await store.commit_thread(b.update_at(scope, "nobody", missing, root=b.root()))
        assert isinstance(result, ConflictResult)
        assert result.current_version is None
        assert (await store.read_thread(b.read(scope, "t1"))).thread == created.thread

    # ------------------------------------------------------------ aliasing

    async def test_mutating_the_callers_objects_after_validation_changes_nothing(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope("hostile")
        value: dict[str, Any] = {"k": [1, {"n": 2}]}
        data = b.create(scope, "t1", _changes(value), metadata=value, privateMetadata=value)
        expected = json.loads(json.dumps(value))
        parsed = CommitThreadInput.model_validate(data)
        # The caller keeps its objects and fills them with values that are not JSON.
        value["k"][1]["n"] = float("nan")
        value["k"].append(2**80)
        value["bytes"] = b"x"
        result = await store.commit_thread(parsed)
        assert isinstance(result, CommittedResult)
        read = await _read_all(store, scope)
        _assert_holds(read, expected, expected)

        # A dict committed directly is no different once the call returns.
        second: dict[str, Any] = {"k": [1]}
        committed = await store.commit_thread(
            b.create(scope, "t2", metadata=second, privateMetadata=second)
        )
        assert isinstance(committed, CommittedResult)
        second["k"].append(float("nan"))
        again = await store.read_thread(b.read(scope, "t2"))
        assert again.thread is not None
        _same(again.thread.metadata, {"k": [1]})

    async def test_a_model_changed_after_validation_is_validated_again(
        self, store: ThreadStore
    ) -> None:
        # A parsed model's values are read-only, but pydantic's
        # model_copy(update=...) does not validate: a model input is checked like
        # its JSON form, and nothing is written.
        scope = new_scope("hostile")

        def commit() -> CommitThreadInput:
            changes = {"messages": [b.insert(b.message("m1", "hi"))]}
            return CommitThreadInput.model_validate(b.create(scope, "t1", changes))

        changed = commit()
        root = changed.mutation.root  # type: ignore[union-attr]
        assert root is not None
        with pytest.raises(TypeError):
            root.metadata["x"] = float("nan")
        nan_root = root.model_copy(update={"metadata": {"x": float("nan")}})
        mutation = changed.mutation.model_copy(update={"root": nan_root})
        with pytest.raises(ThreadStoreSerializationError, match="metadata"):
            await store.commit_thread(changed.model_copy(update={"mutation": mutation}))
        message = commit()
        record = message.mutation.changes.messages[0].record  # type: ignore[union-attr,index]
        with pytest.raises(TypeError):
            record.metadata["b"] = b"raw"
        for update in ({"scope_key": "a\ud800"}, {"thread_id": 5}, {"thread_id": ""}):
            with pytest.raises(ThreadStoreInvariantError):
                await store.commit_thread(commit().model_copy(update=update))
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is None
        assert isinstance(await store.commit_thread(commit()), CommittedResult)

    async def test_a_model_nested_in_a_mapping_is_validated_again_and_copied(
        self, store: ThreadStore
    ) -> None:
        # The same holds for a parsed record placed inside a JSON-form request,
        # and the store keeps its own copy of it.
        scope = new_scope("hostile")
        draft = MessageDraft.model_validate(b.message("m1", "hi", metadata={"k": [1]}))
        bad_drafts: list[Any] = [
            draft.model_copy(update={"status": "bogus"}),
            draft.model_copy(update={"metadata": {"x": float("nan")}}),
            draft.model_copy(update={"metadata": {"x": _NotJson()}}),
        ]
        for bad in bad_drafts:
            with pytest.raises(ThreadStoreInvariantError):
                await store.commit_thread(
                    b.create(scope, "t1", {"messages": [{"type": "insert", "record": bad}]})
                )
        page = PageRequest.model_validate({"limit": 1}).model_copy(update={"limit": 10**6})
        with pytest.raises(ThreadStoreInvariantError):
            await store.read_thread(
                b.read(scope, "t1", messages={"type": "page", "view": "raw", "page": page})
            )
        created = await store.commit_thread(
            b.create(scope, "t1", {"messages": [{"type": "insert", "record": draft}]})
        )
        assert isinstance(created, CommittedResult)
        with pytest.raises(TypeError):  # the caller's model is read-only, too
            draft.metadata["k"].append(2)
        read = await store.read_thread(
            b.read(scope, "t1", messages={"type": "ids", "messageIds": ["m1"]})
        )
        assert read.messages is not None
        assert read.messages.items[0].metadata == {"k": [1]}

    # ------------------------------------------------------------ deep values

    async def test_deepest_allowed_value_round_trips_everywhere(self, store: ThreadStore) -> None:
        # 64 levels of containers is the documented limit of one opaque value: every
        # backend stores it in every location, and refuses one level more up front.
        scope = new_scope("hostile")
        deepest = _nested(MAX_JSON_DEPTH)
        result = await store.commit_thread(
            b.create(scope, "t1", _changes(deepest), metadata=deepest, privateMetadata=deepest)
        )
        assert isinstance(result, CommittedResult)
        _assert_holds(await _read_all(store, scope), deepest, deepest)
        listed = await store.list_threads({"scopeKey": scope, "limit": 5})
        _same(listed.items[0].metadata, deepest)

        too_deep = _nested(MAX_JSON_DEPTH + 1)
        cases: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
            ({"metadata": too_deep}, None),
            ({}, {"messages": [b.insert(b.message("m1", metadata=too_deep))]}),
            ({}, _changes(too_deep)),
        ]
        for root, changes in cases:
            with pytest.raises(ThreadStoreSerializationError, match="nesting deeper"):
                await store.commit_thread(b.create(scope, "t2", changes, **root))
        assert (await store.read_thread(b.read(scope, "t2"))).thread is None

    # ------------------------------------------------------------ JSON bombs

    @pytest.mark.parametrize(
        "where",
        [
            pytest.param(lambda v: b.create("{scope}", "t1", metadata={"bomb": v}), id="root"),
            pytest.param(lambda v: b.create("{scope}", "t1", _changes(v)), id="records"),
        ],
    )
    async def test_shared_sub_value_bomb_is_refused_quickly(
        self, store: ThreadStore, where: Callable[[Any], dict[str, Any]]
    ) -> None:
        scope = new_scope("hostile")
        commit = where(_bomb())
        commit["scopeKey"] = scope
        with _watchdog(60), pytest.raises(ThreadStoreSerializationError, match="1,000,000"):
            await store.commit_thread(commit)
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None

    # ------------------------------------------------------------ every error is typed

    async def test_every_bad_input_raises_a_storage_error(self, store: ThreadStore) -> None:
        scope = new_scope("hostile")
        await _seed_pages(store, scope)
        tokens = await _first_tokens(store, scope)
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        version = read.thread.version.to_json()
        full_update = b.update_at(
            scope,
            "t1",
            version,
            {
                "messages": [b.insert(_message("m9", {"a": 1}))],
                "runs": [b.insert(b.run("r9", "running", inputs=["m9"]))],
                "lease": b.acquire("r9", "w1"),
            },
            root=b.root(category="c", title="t"),
        )
        forms: list[tuple[Callable[[Any], Any], dict[str, Any]]] = [
            (store.commit_thread, b.create(scope, "new", _changes({"a": 1}), category="c")),
            (store.commit_thread, full_update),
            (store.commit_thread, b.delete(scope, "t3", version)),
            (
                store.read_thread,
                b.read(
                    scope,
                    "t1",
                    messages={
                        "type": "page",
                        "view": "context",
                        "order": "newest",
                        "afterMessageId": "m0",
                        "page": {"limit": 2, "pageToken": tokens["messages"]},
                    },
                    runs={"type": "page", "statuses": ["queued"], "page": {"limit": 2}},
                    queuedItems={"type": "ids", "queueItemIds": ["q0", "q1"]},
                ),
            ),
            (
                store.list_threads,
                {
                    "scopeKey": scope,
                    "limit": 1,
                    "agent": "assistant",
                    "category": "c",
                    "parentThreadId": "p",
                    "includeHidden": True,
                    "pageToken": tokens["threads"],
                },
            ),
        ]
        token = tokens["messages"]
        bad_leaves = [
            *BAD_LEAVES,
            token[:-1] + "\u00e9",
            "\u00e9" + token[1:],
            token[:-1] + "\ud800",
            token[:-1],
        ]
        leaked: list[str] = []

        async def attempt(operation: Callable[[Any], Any], request: Any, what: str) -> None:
            exc = await _typed_outcome(lambda: operation(request))
            if exc is not None:
                leaked.append(f"{operation.__name__} {what}: {type(exc).__qualname__}: {exc}")

        for operation, valid in forms:
            for whole in (None, 5, "text", b"bytes", [], [valid], {}, object(), {1: 2}):
                await attempt(operation, whole, f"whole input {whole!r}")
            for path in _leaf_paths(valid):
                await attempt(operation, _remove(valid, path), f"without {path}")
                for bad in bad_leaves:
                    await attempt(operation, _replace(valid, path, bad), f"{path} = {bad!r}")
            await attempt(operation, {**valid, "extra": 1}, "unknown field")
        assert not leaked, "\n".join(leaked[:20])
