"""Stored records are read from plainly decoded BSON first, exactly otherwise.

:func:`~pai_storage_mongo.documents.read_root` and
:func:`~pai_storage_mongo.documents.read_child` decode a stored document with
PyMongo's C decoder and its default options (naive dates, ``Int64`` kept, no
type decoders) and validate that. Whatever that path does not accept is
decoded exactly and read by :func:`parse_root` / :func:`parse_child`, which
decide. The two must agree on every document: the same record for a valid
one (aware UTC dates, plain ``int``), the same error for an invalid one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from core import strategies as s
from hypothesis import given, settings
from hypothesis import strategies as st
from pai_storage_mongo.documents import (
    child_document,
    decode_or_invalid,
    parse_child,
    parse_root,
    read_child,
    read_root,
    root_document,
)

from pai_storage import Message, QueuedItem, RunRecord, ThreadRecord, codec
from pai_storage.backend import family
from pai_storage.errors import ThreadStoreInvariantError

COUNTERS = {"messages": 3, "runs": 2, "queuedItems": 5}
CHILDREN: dict[str, tuple[Any, Any]] = {
    "messages": (Message, s.messages()),
    "runs": (RunRecord, s.run_records()),
    "queuedItems": (QueuedItem, s.queued_items()),
}


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    # Each test starts with no remembered documents (a hit is a copy of a read).
    codec.cache.clear()
    yield
    codec.cache.clear()


def _raw(doc: dict[str, Any]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


def _exact_root(raw: RawBSONDocument) -> Any:
    return parse_root(decode_or_invalid(raw, "thread"), len(raw.raw))


def _exact_child(model: Any, raw: RawBSONDocument) -> Any:
    return parse_child(model, decode_or_invalid(raw, model.__name__), len(raw.raw))


def _same(read: Any, exact: Any) -> None:
    """``read`` is ``exact``, down to the types of its values."""
    assert read == exact
    assert repr(read) == repr(exact)  # aware UTC dates, ints not Int64, key order


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ThreadStoreInvariantError as exc:
        return (type(exc), str(exc))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), name=st.sampled_from(["threads", *CHILDREN]))
def test_both_paths_read_the_same_record(data: st.DataObject, name: str) -> None:
    # The strategies' opaque JSON holds 64-bit integers (Int64 in BSON), keys
    # holding U+0000 (stored escaped, as a Binary) and every other JSON shape.
    if name == "threads":
        record = ThreadRecord.model_validate(data.draw(s.thread_records()))
        raw = _raw(root_document(record, COUNTERS))
        _same(read_root(raw), _exact_root(raw))
        assert read_root(raw)[0].created_at.tzinfo is UTC
        return
    model, strategy = CHILDREN[name]
    record = model.model_validate(data.draw(strategy))
    order = data.draw(st.sampled_from([1, 2**31, 2**40]))  # int32 and Int64 in BSON
    raw = _raw(child_document(family(name), "scope", "t", order, record))
    found = read_child(model, raw)
    _same(found, _exact_child(model, raw))
    assert found == (order, record)
    assert type(found[0]) is int


def _message_doc(**changes: Any) -> dict[str, Any]:
    record = Message.model_validate(
        {
            "messageId": "m1",
            "role": "user",
            "parts": [{"type": "text", "text": "hi"}],
            "producer": {"kind": "user"},
            "association": {"kind": "standalone"},
            "visibility": {"transcript": True, "context": True},
            "status": "complete",
            "metadata": {"n": 2**40, "x": 1.5},
            "createdAt": "2026-01-02T03:04:05.678Z",
            "updatedAt": "2026-01-02T03:04:05.678Z",
        }
    )
    doc = child_document(family("messages"), "scope", "t", 7, record)
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"_order": Int64(9)},
        {"_schemaVersion": Int64(1)},
        {"metadata": {"ref": {"$ref": "users", "$id": 1}}},  # a DBRef to a plain decoder
        {"metadata": {"when": datetime(2026, 1, 1, tzinfo=UTC)}},  # not JSON
        {"metadata": {"code": bson.code.Code("x")}},
        {"metadata": bson.binary.Binary(b"{", 0x80)},  # a corrupt escaped value
        {"createdAt": "2026-01-02T03:04:05.678Z"},  # text, not a date
        {"createdAt": 5},
        {"_order": True},
        {"_order": Int64(0)},
        {"_order": 1.0},
        {"_schemaVersion": True},
        {"_schemaVersion": 2},
        {"messageId": 5},
        {"messageId": ""},
        {"parts": []},
        {"unknown": 1},
        {"status": "done"},
    ],
    ids=repr,
)
def test_both_paths_agree_on_every_child_document(changes: dict[str, Any]) -> None:
    raw = _raw(_message_doc(**changes))
    assert _outcome(read_child, Message, raw) == _outcome(_exact_child, Message, raw)


def _root_record(**changes: Any) -> ThreadRecord:
    return ThreadRecord.model_validate(
        {
            "scopeKey": "scope",
            "threadId": "t",
            "version": {"threadInstanceId": "i", "revision": 1},
            "agent": "a",
            "directExecutionAllowed": True,
            "listVisibility": "visible",
            "metadata": {},
            "privateMetadata": {},
            "createdAt": "2026-01-02T03:04:05.678Z",
            "updatedAt": "2026-01-02T03:04:05.678Z",
            **changes,
        }
    )


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"_nextOrder": {"messages": Int64(3), "runs": 2, "queuedItems": 5}},
        {"_nextOrder": {"messages": 3, "runs": 2}},
        {"_nextOrder": {"messages": 0, "runs": 2, "queuedItems": 5}},
        {"_nextOrder": {"messages": True, "runs": 2, "queuedItems": 5}},
        {"_schemaVersion": 9},
        {"_facts": [1]},
        {"updatedAt": "2026-01-02T03:04:05.678Z"},
        {"metadata": {"ref": {"$ref": "users", "$id": 1, "$db": None}}},
        {"version": {"threadInstanceId": "i", "revision": Int64(2**40)}},
        {"version": {"threadInstanceId": "i", "revision": 0}},
    ],
    ids=repr,
)
def test_both_paths_agree_on_every_root_document(changes: dict[str, Any]) -> None:
    doc = root_document(_root_record(), COUNTERS)
    doc.update(changes)
    raw = _raw(doc)
    assert _outcome(read_root, raw) == _outcome(_exact_root, raw)


def test_undecodable_bytes_are_the_exact_paths_error() -> None:
    good = bson.encode(_message_doc())
    broken = good.replace(b"hi", b"\xff\xfe")  # invalid UTF-8 in the text part
    raw = RawBSONDocument(broken)
    with pytest.raises(ThreadStoreInvariantError, match="cannot be decoded"):
        read_child(Message, raw)


def test_a_document_read_again_gives_the_same_shared_record() -> None:
    # Documents read before come from the codec's cache, by their bytes: every
    # read gives the same record, which nobody can change.
    raw = _raw(_message_doc())
    expected = _exact_child(Message, raw)
    first = read_child(Message, raw)
    for _ in range(3):
        order, record = read_child(Message, raw)
        assert (order, record) == expected
        assert record is first[1]
        assert len(codec.cache) == 1
        with pytest.raises(TypeError):
            record.metadata["n"] = "changed"
        with pytest.raises(TypeError):
            record.parts.clear()
    root = _root_record(metadata={"a": [1]})
    raw_root = _raw(root_document(root, COUNTERS))
    for _ in range(4):
        record, counters = read_root(raw_root)
        assert (record, counters) == (root, COUNTERS)
        with pytest.raises(TypeError):
            record.metadata["a"].append("changed")
        with pytest.raises(TypeError):
            counters["messages"] = 0
    damaged = _message_doc(status="done")  # other bytes: read anew, and refused
    with pytest.raises(ThreadStoreInvariantError):
        read_child(Message, _raw(damaged))
