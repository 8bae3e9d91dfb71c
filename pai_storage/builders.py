"""Small builders for the JSON form of common inputs (demos, tests, examples).

Each returns a plain ``dict`` in the wire form, ready for ``commit_thread`` or
``read_thread``; nothing here is required to use the store.
"""

from __future__ import annotations

from typing import Any, Literal, Never

from .errors import ThreadStoreInvariantError
from .models import ThreadRecord

__all__ = [
    "acquire",
    "create",
    "delete",
    "delete_record",
    "insert",
    "message",
    "queued_item",
    "read",
    "release",
    "renew",
    "replace",
    "root",
    "run",
    "truncate",
    "update",
    "update_at",
]


def message(
    message_id: str,
    text: str = "",
    *,
    role: Literal["user", "assistant", "system", "tool"] = "user",
    run_id: str | None = None,
    relation: Literal["input", "context", "output"] = "input",
    status: str = "complete",
    transcript: bool = True,
    context: bool = True,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A message draft; run-associated when ``run_id`` is given."""
    association: dict[str, Any] = (
        {"kind": "run", "runId": run_id, "relation": relation}
        if run_id is not None
        else {"kind": "standalone"}
    )
    producer = {"kind": "user"} if role == "user" else {"kind": "agent", "id": "agent"}
    return {
        "messageId": message_id,
        "role": role,
        "parts": [{"type": "text", "text": text or message_id}],
        "producer": producer,
        "association": association,
        "visibility": {"transcript": transcript, "context": context},
        "status": status,
        "metadata": metadata or {},
    }


def run(
    run_id: str,
    status: str = "running",
    *,
    inputs: list[str] | None = None,
    admitted: bool | None = None,
    queue_item_id: str | None = None,
    operation: str | None = "send",
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A run draft; admitted unless queued (or told otherwise)."""
    admission: dict[str, Any] = {
        "admitted": admitted if admitted is not None else status != "queued"
    }
    if queue_item_id is not None:
        admission["queueItemId"] = queue_item_id
    draft: dict[str, Any] = {
        "runId": run_id,
        "status": status,
        "initiator": {"kind": "user"},
        "admission": admission,
        "inputMessageIds": list(inputs or []),
        "metadata": metadata or {},
        "privateMetadata": {},
    }
    if operation is not None:
        draft["operation"] = operation
    return draft


def queued_item(queue_item_id: str, run_id: str, payload: Any = None) -> dict[str, Any]:
    return {"queueItemId": queue_item_id, "runId": run_id, "input": payload, "metadata": {}}


def acquire(run_id: str, owner: str, ms: int = 30_000, operation: str = "send") -> dict[str, Any]:
    return {
        "type": "acquire",
        "lease": {"kind": "run", "runId": run_id},
        "leaseOwnerId": owner,
        "durationMs": ms,
        "operation": operation,
    }


def renew(run_id: str, owner: str, ms: int = 30_000) -> dict[str, Any]:
    return {
        "type": "renew",
        "lease": {"kind": "run", "runId": run_id},
        "leaseOwnerId": owner,
        "durationMs": ms,
    }


def release(run_id: str, owner: str, expiry: str = "unexpired") -> dict[str, Any]:
    return {
        "type": "release",
        "lease": {"kind": "run", "runId": run_id},
        "leaseOwnerId": owner,
        "expiry": expiry,
    }


def _changes(changes: dict[str, Any] | None) -> dict[str, Any]:
    return {"changes": changes} if changes else {}


def create(
    scope_key: str,
    thread_id: str,
    changes: dict[str, Any] | None = None,
    *,
    agent: str = "assistant",
    visibility: str = "visible",
    **root: Any,
) -> dict[str, Any]:
    """A create commit. ``root`` adds camelCase root fields (``title=...``)."""
    full_root = {
        "agent": agent,
        "directExecutionAllowed": True,
        "listVisibility": visibility,
        "metadata": {},
        "privateMetadata": {},
        **root,
    }
    return {
        "scopeKey": scope_key,
        "threadId": thread_id,
        "condition": {"type": "missing"},
        "mutation": {"type": "create", "root": full_root, **_changes(changes)},
    }


_UPDATE_HOW = (
    "builders.update() takes the ThreadRecord the update starts from and keeps every "
    "root field it does not name: update(thread, changes, title=...). To write a whole root "
    "at a version, name it: update_at(scope_key, thread_id, version, changes, root=root(...))"
)


def update(
    thread: ThreadRecord,
    changes: dict[str, Any] | None = None,
    /,
    *refused: Never,
    visibility: str | None = None,
    **root_changes: Any,
) -> dict[str, Any]:
    """An update commit starting from ``thread``, keeping every root field it does not name.

    The commit names ``thread.version``; its root is ``thread``'s mutable root
    fields (``listVisibility``, ``category``, ``title``, ``metadata``,
    ``privateMetadata``) with ``root_changes`` (camelCase, ``title=...``) and
    ``visibility`` applied. ``title=None`` or ``category=None`` removes that field.

    Raises
    ------
    ThreadStoreInvariantError
        ``thread`` is not a :class:`~pai_storage.ThreadRecord` (the earlier
        ``update(scope_key, thread_id, version, ...)`` form); the message says
        what to write instead.
    """
    if not isinstance(thread, ThreadRecord) or refused:
        raise ThreadStoreInvariantError(_UPDATE_HOW)
    full_root: dict[str, Any] = {
        "listVisibility": thread.list_visibility,
        "metadata": thread.metadata,
        "privateMetadata": thread.private_metadata,
    }
    if thread.category is not None:
        full_root["category"] = thread.category
    if thread.title is not None:
        full_root["title"] = thread.title
    if visibility is not None:
        full_root["listVisibility"] = visibility
    full_root.update(root_changes)
    for name in ("category", "title"):
        if name in full_root and full_root[name] is None:
            del full_root[name]
    return update_at(thread.scope_key, thread.thread_id, thread.version, changes, root=full_root)


def root(
    *,
    visibility: str = "visible",
    metadata: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A whole update root: ``visibility``, ``metadata`` and camelCase ``fields``.

    Unnamed fields take their defaults (visible, empty metadata and private
    metadata, no title, no category): an update with this root *replaces*
    what is stored. To keep the stored fields, use :func:`update`.
    """
    return {
        "listVisibility": visibility,
        "metadata": metadata if metadata is not None else {},
        "privateMetadata": {},
        **fields,
    }


def update_at(
    scope_key: str,
    thread_id: str,
    version: Any,
    changes: dict[str, Any] | None = None,
    *,
    root: dict[str, Any],
) -> dict[str, Any]:
    """An update commit at ``version`` (a ``ThreadVersion`` or its JSON form), whole ``root`` given.

    The root replaces the stored root fields (an omitted title or category is
    removed): build it with :func:`root`, or use :func:`update` to keep them.
    """
    if hasattr(version, "to_json"):
        version = version.to_json()
    return {
        "scopeKey": scope_key,
        "threadId": thread_id,
        "condition": {"type": "version", "version": version},
        "mutation": {"type": "update", "root": dict(root), **_changes(changes)},
    }


def delete(scope_key: str, thread_id: str, version: Any) -> dict[str, Any]:
    if hasattr(version, "to_json"):
        version = version.to_json()
    return {
        "scopeKey": scope_key,
        "threadId": thread_id,
        "condition": {"type": "version", "version": version},
        "mutation": {"type": "delete"},
    }


def read(scope_key: str, thread_id: str, **include: Any) -> dict[str, Any]:
    """A read; ``include`` takes ``messages=``, ``runs=``, ``queuedItems=`` selections."""
    request: dict[str, Any] = {"scopeKey": scope_key, "threadId": thread_id}
    if include:
        request["include"] = include
    return request


def insert(record: dict[str, Any]) -> dict[str, Any]:
    """A child change appending ``record`` (a message, run or queued-item draft)."""
    return {"type": "insert", "record": record}


def replace(record: dict[str, Any]) -> dict[str, Any]:
    """A child change replacing the record with ``record``'s id, keeping its position."""
    return {"type": "replace", "record": record}


def delete_record(record_id: str) -> dict[str, Any]:
    """A child change deleting one record by id."""
    return {"type": "delete", "id": record_id}


def truncate(after_id: str | None) -> dict[str, Any]:
    """A child change removing every record after ``after_id`` (``None``: all)."""
    return {"type": "truncate", "afterId": after_id}
