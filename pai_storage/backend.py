"""What a backend author imports: the pipelines, their primitives and the helpers.

Applications import :mod:`pai_storage`; a backend imports this module (plus the
records and errors from :mod:`pai_storage`). Everything here is public and
documented in ``docs/backend-authors.md``. A backend supplies primitives, the
core runs the algorithms:

- :class:`~pai_storage.ThreadStore` is the contract; a backend implements its
  protected hooks. :class:`Backend` registers it by URL scheme.
- A normalized backend implements :class:`CommitTransaction` and
  :class:`ReadSnapshot` over its database and calls :func:`run_commit` and
  :func:`run_read`, which run the whole judgement in one fixed order.
- An aggregate-style backend (one value per thread) keeps
  :class:`ThreadAggregate` values and calls :func:`apply_thread_changes` and
  :func:`read_aggregate`; an in-process one that must not grow with the
  thread keeps :class:`IndexedThread` values and commits through
  :class:`IndexedTransaction` (the memory backend).
- :data:`FAMILIES` describes the three child families once (id field, noun,
  model, stamping).
- Reads and lists get their plans from the store's ``selections``
  (:class:`SelectionHelpers`), bound to its page-token codec.
- :func:`map_errors` turns every driver exception of a block into the
  contract's errors through one backend-supplied function.
- The runtime stores (:class:`KeyValueStore`, :class:`AgentStateStore`,
  :class:`SnapshotStore`, :class:`ExecutionGuard`) validate every argument in
  their base classes (:mod:`pai_storage.runtime`) and call a few protected
  hooks a backend implements; :meth:`Backend.open_components` opens them
  (``docs/bundle.md``).
- The thread lifecycle (prune, erase, fork, export, import) runs in the core
  (:mod:`pai_storage.maintenance`, :mod:`pai_storage.transfer`) over four
  primitives a backend implements on its store and declares with
  :data:`LIFECYCLE` in ``capabilities`` (``docs/lifecycle.md``): the
  updated-at index (:class:`ThreadIndexEntry`), a whole-thread load, an atomic
  restore, and a fork whose plan is made and copied in one transaction
  (:class:`ForkRequest` turned into a :class:`ForkPlan` at the held version).
- A copy of the runtime stores (``pai-storage copy --all``) enumerates them
  through three primitives (``_list_sessions`` and ``_session_keys`` of the
  agent-state store, ``_list_scopes`` of the snapshot store) that a backend
  declares with :data:`ENUMERATE` in their ``capabilities``.
- :class:`SharedClient` holds the one pool or driver client the stores of a
  ``connect()`` call share: counted users, a shared lazy connect, and a close
  by the last user; a backend supplies create, connect and disconnect.
"""

from .aggregate import (
    Entry,
    Family,
    FamilyName,
    FamilyView,
    IndexedFamily,
    IndexedThread,
    ThreadAggregate,
)
from .apply import (
    AggregateSnapshot,
    ApplyResult,
    IndexedTransaction,
    apply_thread_changes,
    read_aggregate,
)
from .changes import (
    FamilyWrite,
    apply_family_changes,
    change_ids,
    duplicate_insert_error,
    record_id,
)
from .clock import Clock, ManualClock, system_clock
from .errormap import map_errors
from .events import (
    HeldWarnings,
    StoreWarning,
    WarningCallback,
    deliver_held_warnings,
    emit_warning,
    holding_warnings,
)
from .families import (
    FAMILIES,
    TERMINAL_STATUSES,
    FamilySpec,
    family,
    stamp_message,
    stamp_queued_item,
    stamp_run,
)
from .fields import format_timestamp, truncate_ms
from .guard import ExecutionGuard, LockInfo
from .kv import (
    KeyValueStore,
    KVRecord,
    VersionMismatch,
    namespace_from_path,
    namespace_path,
    namespace_path_after,
    prefix_upper_bound,
)
from .leases import LEASE_CONFLICT, LeaseConflict, apply_lease_change, is_expired
from .lifecycle import ManagedStore
from .maintenance import ForkPlan, ForkRequest, SourceChanged, ThreadIndexEntry, fork_aggregate
from .models import StoreModel
from .pipeline import (
    CommitTransaction,
    HeldThread,
    ReadSnapshot,
    RelationshipContext,
    SnapshotRoot,
    ThreadConflict,
    commit_time,
    named_ids,
    run_commit,
    run_read,
    run_sync,
)
from .registry import (
    ENTRY_POINT_GROUP,
    SCHEME_ENTRY_POINT_GROUP,
    Backend,
    backend_for_url,
    get_backend,
)
from .relationships import (
    OPEN_STATUSES,
    MessageRef,
    QueueRef,
    RelationshipCheck,
    RelationshipReader,
    RunRef,
    RunRelations,
    ThreadRelations,
    assert_relationships,
    gapped_spans,
    message_ref_from_row,
    relations_from_aggregate,
    relationship_check,
    run_facts_from_rows,
    run_ref_from_row,
)
from .roots import apply_thread_root_update, assert_commit_input, check_condition, new_instance_id
from .runtime import (
    RuntimeStore,
    canonical_json,
    check_duration,
    check_limit,
    check_name,
    check_namespace,
    check_value,
    parse_json_text,
)
from .selection import (
    ChildPagePlan,
    IdsPlan,
    ListPlan,
    ReadPlan,
    SelectionHelpers,
    Window,
    timestamp_ms,
)
from .shared import SharedClient
from .snapshots import SnapshotDraft, SnapshotStore
from .state import (
    ENUMERATE,
    AgentStateStore,
    ListHead,
    ListWrite,
    SessionKey,
)
from .store import LIFECYCLE, StoreInfo, ThreadStore
from .strict_json import check_json, check_json_object
from .tokens import PageTokenCodec, default_scope_digest, query_digest
from .transfer import thread_digest
from .url import StoreURL, make_url, redact

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENUMERATE",
    "FAMILIES",
    "LEASE_CONFLICT",
    "LIFECYCLE",
    "OPEN_STATUSES",
    "SCHEME_ENTRY_POINT_GROUP",
    "TERMINAL_STATUSES",
    "AgentStateStore",
    "AggregateSnapshot",
    "ApplyResult",
    "Backend",
    "ChildPagePlan",
    "Clock",
    "CommitTransaction",
    "Entry",
    "ExecutionGuard",
    "Family",
    "FamilyName",
    "FamilySpec",
    "FamilyView",
    "FamilyWrite",
    "ForkPlan",
    "ForkRequest",
    "HeldThread",
    "HeldWarnings",
    "IdsPlan",
    "IndexedFamily",
    "IndexedThread",
    "IndexedTransaction",
    "KVRecord",
    "KeyValueStore",
    "LeaseConflict",
    "ListHead",
    "ListPlan",
    "ListWrite",
    "LockInfo",
    "ManagedStore",
    "ManualClock",
    "MessageRef",
    "PageTokenCodec",
    "QueueRef",
    "ReadPlan",
    "ReadSnapshot",
    "RelationshipCheck",
    "RelationshipContext",
    "RelationshipReader",
    "RunRef",
    "RunRelations",
    "RuntimeStore",
    "SelectionHelpers",
    "SessionKey",
    "SharedClient",
    "SnapshotDraft",
    "SnapshotRoot",
    "SnapshotStore",
    "SourceChanged",
    "StoreInfo",
    "StoreModel",
    "StoreURL",
    "StoreWarning",
    "ThreadAggregate",
    "ThreadConflict",
    "ThreadIndexEntry",
    "ThreadRelations",
    "ThreadStore",
    "VersionMismatch",
    "WarningCallback",
    "Window",
    "apply_family_changes",
    "apply_lease_change",
    "apply_thread_changes",
    "apply_thread_root_update",
    "assert_commit_input",
    "assert_relationships",
    "backend_for_url",
    "canonical_json",
    "change_ids",
    "check_condition",
    "check_duration",
    "check_json",
    "check_json_object",
    "check_limit",
    "check_name",
    "check_namespace",
    "check_value",
    "commit_time",
    "default_scope_digest",
    "deliver_held_warnings",
    "duplicate_insert_error",
    "emit_warning",
    "family",
    "fork_aggregate",
    "format_timestamp",
    "gapped_spans",
    "get_backend",
    "holding_warnings",
    "is_expired",
    "make_url",
    "map_errors",
    "message_ref_from_row",
    "named_ids",
    "namespace_from_path",
    "namespace_path",
    "namespace_path_after",
    "new_instance_id",
    "parse_json_text",
    "prefix_upper_bound",
    "query_digest",
    "read_aggregate",
    "record_id",
    "redact",
    "relations_from_aggregate",
    "relationship_check",
    "run_commit",
    "run_facts_from_rows",
    "run_read",
    "run_ref_from_row",
    "run_sync",
    "stamp_message",
    "stamp_queued_item",
    "stamp_run",
    "system_clock",
    "thread_digest",
    "timestamp_ms",
    "truncate_ms",
]
