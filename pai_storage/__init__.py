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

This module is what an application imports, and only that (at most 80
names): opening stores (``open_store``, ``connect``, ``open_kv_store``, ...),
the store contracts, the records, results and pages a read or a commit
returns, the message parts, the conversation, the conflicts, the errors an
application catches (the general classes; the thread store's own subclasses,
``ThreadStoreInvariantError`` and the rest, are in :mod:`pai_storage.errors`)
and the JSON builders (:mod:`pai_storage.builders`). Everything else is
imported from the module it belongs to: the input-building types from
:mod:`pai_storage.models`, the parsers from :mod:`pai_storage.parsing`, and
every name a backend author needs from :mod:`pai_storage.backend`. Test
provisioning lives beside the conformance suite.

A name that left the top level still resolves here, with a
``DeprecationWarning`` naming the module to import it from (see
``docs/changelog.md``); it goes in the next minor release.
"""

from functools import cache
from importlib import import_module
from typing import Any

from . import builders
from .bundle import (
    ScopeErasure,
    Stores,
    connect,
    open_guard,
    open_kv_store,
    open_snapshot_store,
    open_state_store,
)
from .clock import ManualClock
from .conflicts import Conflict, raise_on_conflict
from .conversation import Conversation, Reply
from .errors import (
    ConfigurationError,
    ConflictError,
    ConversationConflictError,
    CorruptSnapshotError,
    InvalidInputError,
    LockTimeoutError,
    OutcomeUnknownError,
    PageTokenError,
    SerializationError,
    SnapshotTooLargeError,
    StorageError,
    ThreadExistsError,
    UnavailableError,
)
from .events import StoreWarning
from .guard import ExecutionGuard, Lock, LockInfo
from .kv import Item, KeyValueStore, KVConflict
from .maintenance import PrunedThread
from .models import (
    CommittedResult,
    CommitThreadInput,
    CommitThreadResult,
    ConflictResult,
    DataPart,
    FilePart,
    ListThreadsInput,
    Message,
    Page,
    Part,
    QueuedItem,
    ReadThreadInput,
    ReasoningPart,
    RunRecord,
    TextPart,
    ThreadLease,
    ThreadPage,
    ThreadReadResult,
    ThreadRecord,
    ThreadVersion,
    ToolCallPart,
)
from .registry import available_backends, open_store, register_backend, unregister_backend
from .snapshots import Snapshot, SnapshotInfo, SnapshotReader, SnapshotStore
from .state import AgentStateStore, ListConflict, StateConflict, VersionedState
from .store import StoreInfo, ThreadStore
from .transfer import ImportReport
from .url import make_url
from .watch import ThreadChange

__version__ = "0.1.0"

__all__ = [  # noqa: RUF022 - grouped by what an application does with each name
    # Opening stores
    "available_backends",
    "connect",
    "make_url",
    "open_guard",
    "open_kv_store",
    "open_snapshot_store",
    "open_state_store",
    "open_store",
    "register_backend",
    "unregister_backend",
    # The store contracts
    "AgentStateStore",
    "ExecutionGuard",
    "KeyValueStore",
    "SnapshotStore",
    "StoreInfo",
    "Stores",
    "ThreadStore",
    # What the thread store's operations take and return
    "CommitThreadInput",
    "CommitThreadResult",
    "CommittedResult",
    "ConflictResult",
    "ImportReport",
    "ListThreadsInput",
    "Message",
    "Page",
    "PrunedThread",
    "QueuedItem",
    "ReadThreadInput",
    "RunRecord",
    "ScopeErasure",
    "ThreadChange",
    "ThreadLease",
    "ThreadPage",
    "ThreadReadResult",
    "ThreadRecord",
    "ThreadVersion",
    # Message parts
    "DataPart",
    "FilePart",
    "Part",
    "ReasoningPart",
    "TextPart",
    "ToolCallPart",
    # Conversations
    "Conversation",
    "Reply",
    # What the other stores return
    "Item",
    "Lock",
    "LockInfo",
    "Snapshot",
    "SnapshotInfo",
    "SnapshotReader",
    "VersionedState",
    # Conflicts
    "Conflict",
    "KVConflict",
    "ListConflict",
    "StateConflict",
    "raise_on_conflict",
    # Errors and warnings (the thread store's own subclasses: pai_storage.errors)
    "ConfigurationError",
    "ConflictError",
    "ConversationConflictError",
    "CorruptSnapshotError",
    "InvalidInputError",
    "LockTimeoutError",
    "OutcomeUnknownError",
    "PageTokenError",
    "SerializationError",
    "SnapshotTooLargeError",
    "StorageError",
    "StoreWarning",
    "ThreadExistsError",
    "UnavailableError",
    # Building inputs and testing
    "ManualClock",
    "builders",
]

# Names that left the top level and are not in a module listed below, with their home.
_MOVED_ONE_BY_ONE = {
    "EXPORT_FORMAT": "pai_storage.transfer",
    "EXPORT_VERSION": "pai_storage.transfer",
    "LostCallback": "pai_storage.guard",
    "public_projection": "pai_storage.store",
}

# Modules whose whole ``__all__`` used to be served here, in the order a name is
# looked up: a backend author's name is imported from pai_storage.backend even
# where it is defined in a smaller module (``truncate_ms``, ``Clock``).
_MOVED_MODULES = (
    "pai_storage.backend",
    "pai_storage.models",
    "pai_storage.errors",
    "pai_storage.parsing",
)


@cache
def _moved_names() -> dict[str, str]:
    """Every name served for compatibility, mapped to the module to import it from.

    Built on first use, so that ``import pai_storage`` does not import
    :mod:`pai_storage.backend`.
    """
    moved = dict(_MOVED_ONE_BY_ONE)
    for module in _MOVED_MODULES:
        for name in import_module(module).__all__:
            moved.setdefault(name, module)
    for name in __all__:
        moved.pop(name, None)
    return moved


def __getattr__(name: str) -> Any:
    # Only called for a name this module does not define: a moved one keeps
    # working, loudly, until the next minor release removes it (issue 31).
    home = _moved_names().get(name)
    if home is None:
        raise AttributeError(f"module 'pai_storage' has no attribute {name!r}")
    import warnings

    warnings.warn(
        f"pai_storage.{name} moved to {home}: write `from {home} import {name}`"
        " (the top-level name goes in the next minor release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(import_module(home), name)
