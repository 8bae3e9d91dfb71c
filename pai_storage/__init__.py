"""pai-storage: durable, versioned, tenant-scoped storage for AI-agent threads.

Open a store by URL and use its three operations::

    import pai_storage

    async with pai_storage.open_store("memory://") as store:
        result = await store.commit_thread({...})   # CommitThreadInput or its JSON form
        page = await store.read_thread({...})
        threads = await store.list_threads({...})

Backend authors start at :class:`ThreadStore`, :class:`Backend` and the helpers
re-exported here (:func:`apply_thread_changes`, :class:`SelectionHelpers`,
:func:`plan_relationship_validation`, ...).
"""

from .aggregate import Entry, Family, FamilyName, ThreadAggregate
from .apply import (
    ApplyResult,
    apply_thread_changes,
    apply_thread_root_update,
    assert_commit_input,
    check_condition,
    new_instance_id,
)
from .changes import (
    TERMINAL_STATUSES,
    FamilyWrite,
    apply_family_changes,
    change_ids,
    record_id,
    stamp_message,
    stamp_queued_item,
    stamp_run,
)
from .clock import Clock, ManualClock, system_clock
from .errors import (
    ThreadStoreCommitUnknownError,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStorePageTokenError,
    ThreadStoreSerializationError,
    ThreadStoreUnavailableError,
)
from .events import StoreWarning, WarningCallback, emit_warning
from .leases import LEASE_CONFLICT, LeaseConflict, apply_lease_change, is_expired
from .models import *  # noqa: F403 - the record and input types are the public API
from .models import StoreModel, format_timestamp, truncate_ms
from .models import __all__ as _model_names
from .parsing import (
    parse,
    parse_aggregate,
    parse_commit_result,
    parse_message,
    parse_queued_item,
    parse_run,
    parse_thread,
)
from .registry import (
    ENTRY_POINT_GROUP,
    Backend,
    TestHarness,
    available_backends,
    backend_for_url,
    get_backend,
    open_store,
    register_backend,
    unregister_backend,
)
from .relationships import (
    OPEN_STATUSES,
    MessageRef,
    QueueRef,
    RelationshipFacts,
    RelationshipPlan,
    RelationshipReader,
    RunFacts,
    RunRef,
    assert_relationships,
    facts_from_aggregate,
    plan_relationship_validation,
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
from .store import StoreInfo, ThreadStore, public_projection
from .strict_json import check_json, check_json_object
from .tokens import PageTokenCodec, default_scope_digest, query_digest
from .url import StoreURL, make_url, redact

__version__ = "0.1.0"

__all__ = [
    *_model_names,
    "ENTRY_POINT_GROUP",
    "LEASE_CONFLICT",
    "OPEN_STATUSES",
    "TERMINAL_STATUSES",
    "ApplyResult",
    "Backend",
    "ChildPagePlan",
    "Clock",
    "Entry",
    "Family",
    "FamilyName",
    "FamilyWrite",
    "IdsPlan",
    "LeaseConflict",
    "ListPlan",
    "ManualClock",
    "MessageRef",
    "PageTokenCodec",
    "QueueRef",
    "ReadPlan",
    "RelationshipFacts",
    "RelationshipPlan",
    "RelationshipReader",
    "RunFacts",
    "RunRef",
    "SelectionHelpers",
    "StoreInfo",
    "StoreModel",
    "StoreURL",
    "StoreWarning",
    "TestHarness",
    "ThreadAggregate",
    "ThreadStore",
    "ThreadStoreCommitUnknownError",
    "ThreadStoreConfigurationError",
    "ThreadStoreError",
    "ThreadStoreInvariantError",
    "ThreadStorePageTokenError",
    "ThreadStoreSerializationError",
    "ThreadStoreUnavailableError",
    "WarningCallback",
    "Window",
    "apply_family_changes",
    "apply_lease_change",
    "apply_thread_changes",
    "apply_thread_root_update",
    "assert_commit_input",
    "assert_relationships",
    "available_backends",
    "backend_for_url",
    "change_ids",
    "check_condition",
    "check_json",
    "check_json_object",
    "default_scope_digest",
    "emit_warning",
    "facts_from_aggregate",
    "format_timestamp",
    "get_backend",
    "is_expired",
    "make_url",
    "new_instance_id",
    "open_store",
    "parse",
    "parse_aggregate",
    "parse_commit_result",
    "parse_message",
    "parse_queued_item",
    "parse_run",
    "parse_thread",
    "plan_relationship_validation",
    "public_projection",
    "query_digest",
    "record_id",
    "redact",
    "register_backend",
    "stamp_message",
    "stamp_queued_item",
    "stamp_run",
    "system_clock",
    "timestamp_ms",
    "truncate_ms",
    "unregister_backend",
]
