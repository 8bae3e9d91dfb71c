"""pai-storage: durable, versioned, tenant-scoped storage for AI-agent threads.

Open a store by URL and use its three operations::

    import pai_storage

    async with pai_storage.open_store("memory://") as store:
        result = await store.commit_thread({...})   # CommitThreadInput or its JSON form
        page = await store.read_thread({...})
        threads = await store.list_threads({...})

Every store an agent product needs, from one connection string::

    async with pai_storage.connect("memory://") as stores:
        stores.threads, stores.kv, stores.state, stores.snapshots, stores.guard

A chat, with the versions tracked for you (``docs/conversation.md``)::

    chat = stores.threads.conversation("tenant-42", "chat-1")
    await chat.add("user", "Hi!")
    async with chat.reply() as answer:
        await answer.write("Hello!")

The same without ``await``: :mod:`pai_storage.sync` (``sync.connect(url)``).

This module is what an application imports: opening stores (``open_store``,
``connect``, ``open_kv_store``, ...), the store contracts, the records,
inputs and results, the errors, the parsers and the JSON builders
(:mod:`pai_storage.builders`). Backend authors import
:mod:`pai_storage.backend` (the pipelines, their primitives and the helpers);
test provisioning lives beside the conformance suite.
"""

from typing import Any

from . import builders
from .aggregate import ThreadAggregate
from .bundle import (
    ScopeErasure,
    Stores,
    connect,
    open_guard,
    open_kv_store,
    open_snapshot_store,
    open_state_store,
)
from .clock import Clock, ManualClock, system_clock
from .conflicts import Conflict, raise_on_conflict
from .conversation import Conversation, Reply
from .errors import *  # noqa: F403 - every error class is public
from .errors import __all__ as _error_names
from .events import StoreWarning, WarningCallback
from .fields import format_timestamp, truncate_ms
from .guard import ExecutionGuard, Lock, LockInfo, LostCallback
from .kv import Item, KeyValueStore, KVConflict
from .maintenance import PrunedThread
from .models import *  # noqa: F403 - the record and input types are the public API
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
from .registry import available_backends, open_store, register_backend, unregister_backend
from .snapshots import Snapshot, SnapshotInfo, SnapshotReader, SnapshotStore
from .state import AgentStateStore, ListConflict, StateConflict, VersionedState
from .store import StoreInfo, ThreadStore, public_projection
from .transfer import EXPORT_FORMAT, EXPORT_VERSION, ImportReport, ThreadExistsError
from .url import StoreURL, make_url
from .watch import ThreadChange

__version__ = "0.1.0"

__all__ = [
    *_error_names,
    "ThreadAggregate",
    *_model_names,
    "AgentStateStore",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "ExecutionGuard",
    "ImportReport",
    "Item",
    "KVConflict",
    "KeyValueStore",
    "Lock",
    "ListConflict",
    "LockInfo",
    "LostCallback",
    "PrunedThread",
    "Reply",
    "ScopeErasure",
    "Snapshot",
    "SnapshotInfo",
    "SnapshotReader",
    "SnapshotStore",
    "StateConflict",
    "Stores",
    "VersionedState",
    "connect",
    "open_guard",
    "open_kv_store",
    "open_snapshot_store",
    "open_state_store",
    "Clock",
    "Conversation",
    "Conflict",
    "ManualClock",
    "StoreInfo",
    "StoreURL",
    "StoreWarning",
    "ThreadChange",
    "ThreadExistsError",
    "ThreadStore",
    "WarningCallback",
    "available_backends",
    "builders",
    "format_timestamp",
    "make_url",
    "open_store",
    "parse",
    "parse_aggregate",
    "parse_commit_result",
    "parse_message",
    "parse_queued_item",
    "parse_run",
    "parse_thread",
    "public_projection",
    "raise_on_conflict",
    "register_backend",
    "system_clock",
    "truncate_ms",
    "unregister_backend",
]


def __getattr__(name: str) -> Any:
    # Backend-author names moved to pai_storage.backend; keep old imports working.
    import importlib

    backend = importlib.import_module("pai_storage.backend")
    if name in backend.__all__:
        return getattr(backend, name)
    raise AttributeError(f"module 'pai_storage' has no attribute {name!r}")
