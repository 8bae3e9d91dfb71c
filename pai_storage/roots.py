"""Commit conditions and root stamping, shared by the pipeline and the reference.

See ``docs/commits.md`` for the rules: a create needs a missing thread and gets
revision 1 and a fresh instance id; an update or delete needs the exact
version; an update keeps the creation-only fields, replaces every mutable one
and adds 1 to the revision.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from .errors import ThreadStoreInvariantError
from .models import (
    CommitThreadInput,
    ConflictResult,
    CreateMutation,
    DeleteMutation,
    ThreadLease,
    ThreadRecord,
    ThreadVersion,
)

__all__ = [
    "apply_thread_root_update",
    "assert_commit_input",
    "check_condition",
    "new_instance_id",
]


def new_instance_id() -> str:
    """A fresh thread instance id (random UUID, hex)."""
    return uuid.uuid4().hex


def assert_commit_input(commit: CommitThreadInput | Mapping[str, Any]) -> CommitThreadInput:
    """Validate a commit input mechanically and return it as a model.

    Accepts the model or its JSON form. Raises :class:`ThreadStoreInvariantError`
    (or :class:`ThreadStoreSerializationError` for a value that is not strict
    JSON) naming the path of the first problem.
    """
    if isinstance(commit, CommitThreadInput):
        return commit
    if not isinstance(commit, Mapping):
        raise ThreadStoreInvariantError(
            f"a commit input must be a CommitThreadInput or its JSON form, "
            f"not {type(commit).__name__}"
        )
    return CommitThreadInput.model_validate(commit)


def check_condition(
    commit: CommitThreadInput, current: ThreadVersion | None
) -> ConflictResult | None:
    """The conflict for a false commit condition, or ``None`` when it holds."""
    if commit.condition.type == "missing":
        if current is None:
            return None
    elif current is not None:
        expected = commit.condition.version  # compared field by field: no model __eq__
        if (
            current.revision == expected.revision
            and current.thread_instance_id == expected.thread_instance_id
        ):
            return None
    return ConflictResult(type="conflict", current_version=current)


def apply_thread_root_update(
    previous: ThreadRecord | None,
    commit: CommitThreadInput,
    now: datetime,
    lease: ThreadLease | None,
    instance_id: Callable[[], str] = new_instance_id,
) -> ThreadRecord:
    """Stamp the root a create or update commits at ``now`` (normalized backends).

    A create gets revision 1 and a fresh instance id; an update keeps the
    creation-only fields, replaces every mutable one (an omitted ``category``
    or ``title`` is removed) and adds 1 to the revision. ``updated_at`` is
    ``now`` either way.
    """
    mutation = commit.mutation
    if isinstance(mutation, DeleteMutation):
        raise ValueError("a delete commits no root")
    root = mutation.root
    # Every field is the validated commit's, the previous root's or a stamp:
    # built without validation, in the model's field order (the JSON form's).
    mutable = {
        "list_visibility": root.list_visibility,
        "category": root.category,
        "title": root.title,
        "metadata": root.metadata,
        "private_metadata": root.private_metadata,
        "lease": lease,
    }
    if isinstance(mutation, CreateMutation):
        return ThreadRecord.trusted(
            {
                "scope_key": commit.scope_key,
                "thread_id": commit.thread_id,
                "version": ThreadVersion.trusted(
                    {"thread_instance_id": instance_id(), "revision": 1}
                ),
                "agent": mutation.root.agent,
                "direct_execution_allowed": mutation.root.direct_execution_allowed,
                "parent_thread_id": mutation.root.parent_thread_id,
                **mutable,
                "created_at": now,
                "updated_at": now,
            }
        )
    if previous is None:
        raise ValueError("an update needs the previous root")
    version = previous.version
    return ThreadRecord.trusted(
        {
            **previous.__dict__,
            "version": ThreadVersion.trusted(
                {"thread_instance_id": version.thread_instance_id, "revision": version.revision + 1}
            ),
            **mutable,
            "updated_at": now,
        }
    )
