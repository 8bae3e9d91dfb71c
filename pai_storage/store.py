"""The ``ThreadStore`` contract: three operations, stated once.

Application code calls :meth:`ThreadStore.read_thread`,
:meth:`ThreadStore.list_threads` and :meth:`ThreadStore.commit_thread`. Each
accepts the input model or its JSON form, validates it (raising the typed errors
of :mod:`pai_storage.errors`), initializes the store on first use, and hands a
validated model to the backend.

Backend authors subclass :class:`ThreadStore` and implement the protected hooks
``_read_thread``, ``_list_threads`` and ``_commit_thread`` (plus ``_initialize``
and ``_close`` when they hold connections). The docstrings of the public
methods state the guarantees the conformance suite checks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from .clock import Clock
from .errors import ThreadStoreConfigurationError, ThreadStoreInvariantError
from .events import WarningCallback
from .lifecycle import ManagedStore
from .models import (
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    Page,
    ReadThreadInput,
    RunRecord,
    StoreModel,
    ThreadReadResult,
    ThreadRecord,
)
from .selection import SelectionHelpers

if TYPE_CHECKING:
    from .aggregate import ThreadAggregate
    from .conversation import Conversation
    from .inputs import CommitThreadJSON, ListThreadsJSON, ReadThreadJSON
    from .maintenance import ForkRequest, PrunedThread, ThreadIndexEntry
    from .models import ThreadVersion
    from .transfer import ImportReport
    from .watch import ChangeSignal, ThreadChange

__all__ = ["LIFECYCLE", "StoreInfo", "ThreadStore", "public_projection"]

LIFECYCLE = "lifecycle"
"""The capability of a store that implements the lifecycle primitives
(``_thread_heads``, ``_load_thread``, ``_restore_thread``; ``docs/lifecycle.md``)."""

M = TypeVar("M", bound=StoreModel)


def _coerce(model: type[M], value: M | Mapping[str, Any]) -> M:
    # A model is validated again, like a mapping, down to every nested model
    # (StoreModel's revalidate_instances="always"): its dicts and lists are the
    # caller's to change after validation, and pydantic's model_copy(update=...)
    # skips validation. The store then holds its own copy either way.
    if type(value) is dict or isinstance(value, model | Mapping):  # dict: no ABC check
        return model.model_validate(value)
    raise ThreadStoreInvariantError(
        f"expected a {model.__name__} or its JSON form, not {type(value).__name__}"
    )


def public_projection(record: ThreadRecord | RunRecord) -> dict[str, Any]:
    """The client-readable JSON form of a root or run: ``privateMetadata`` dropped."""
    return record.public_json()


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """What :meth:`ThreadStore.info` found out about the backend."""

    backend: str
    server_version: str | None = None
    transactions: bool | None = None
    details: dict[str, str] = field(default_factory=dict)


class ThreadStore(ManagedStore, ABC):
    """Durable, versioned, tenant-scoped storage of agent threads.

    Guarantees (checked by the conformance suite for every backend):

    - every operation is isolated by ``(scope_key, thread_id)``;
    - a read is consistent: the root and every page come from one committed
      version, even while other writers commit;
    - a commit applies the root, every child change and the lease change
      atomically, or nothing; of N commits racing on one version exactly one
      commits and the rest get a conflict;
    - a create gives revision 1 and a fresh instance id; every commit adds 1;
    - commit times, lease expiry and ``observed_at`` come from the provider's
      clock (overridable only for tests, through ``clock``).

    Parameters
    ----------
    clock:
        Test-only clock override (a callable returning an aware UTC datetime).
    on_warning:
        Receives recoverable integrity warnings (:class:`StoreWarning`); a
        plain function or a coroutine function. Failures in it are ignored.
    token_secret:
        Key (bytes) that makes page tokens unforgeable. Without it tokens are
        only tamper-evident against accidents, not against a caller who
        forges one: set it in production (``docs/reads.md``).

    Every backend accepts these common options; they are checked here, once,
    and a bad value raises :class:`ThreadStoreConfigurationError` when the
    store is opened.
    """

    configuration_error = ThreadStoreConfigurationError
    token_prefix: str = "pai"
    """The prefix of this backend's page tokens (``"pai-pg"``)."""
    capabilities: ClassVar[frozenset[str]] = frozenset()
    """Optional features this store implements: :data:`LIFECYCLE` when it
    provides the lifecycle primitives (prune, erase, fork, export, import)."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning)
        self.selections = SelectionHelpers(self.token_prefix, secret=token_secret)
        """Read and list planning bound to this store's page-token codec."""

    # ------------------------------------------------------------ public API

    async def read_thread(
        self, request: ReadThreadInput | ReadThreadJSON | Mapping[str, Any]
    ) -> ThreadReadResult:
        """Read a thread root and the selected pages of its child families.

        A missing thread gives ``thread=None`` and no pages. Otherwise there is
        a page for exactly each requested family (empty when the family is),
        and the root and every page carry the same :class:`ThreadVersion`.

        Raises
        ------
        ThreadStoreInvariantError
            A malformed request, a duplicate id in an ``ids`` selection, or a
            page bound naming a missing message.
        ThreadStorePageTokenError
            A token that is malformed, tampered with, from another scope or
            query, or from an earlier incarnation of the thread.
        """
        parsed = _coerce(ReadThreadInput, request)
        await self._ensure_ready()
        return await self._read_thread(parsed)

    async def list_threads(
        self, request: ListThreadsInput | ListThreadsJSON | Mapping[str, Any]
    ) -> Page[ThreadRecord]:
        """List thread roots of one scope, newest update first, then by thread id.

        Hidden threads appear only with ``include_hidden``. Pagination is by
        keyset: a page never repeats or skips a thread that did not change. A
        stored root that fails validation is skipped and reported to
        ``on_warning``.
        """
        parsed = _coerce(ListThreadsInput, request)
        await self._ensure_ready()
        return await self._list_threads(parsed)

    async def commit_thread(
        self, request: CommitThreadInput | CommitThreadJSON | Mapping[str, Any]
    ) -> CommittedResult | ConflictResult:
        """Atomically compare the version and apply one complete write set.

        Returns
        -------
        CommittedResult
            With the new root (``None`` after a delete) and ``committed_at``.
        ConflictResult
            When the version differs, the thread exists on create or is missing
            on update/delete, or a lease precondition is false. Nothing applied.

        Raises
        ------
        ThreadStoreInvariantError
            A malformed input, a mechanical change error or a broken
            relationship rule. Nothing applied.
        ThreadStoreSerializationError
            A value that is not strict JSON. Nothing applied.
        ThreadStoreCommitUnknownError
            The outcome cannot be known; re-read and re-plan.
        ThreadStoreUnavailableError
            The backend cannot be reached; nothing applied.
        """
        parsed = _coerce(CommitThreadInput, request)
        await self._ensure_ready()
        return await self._commit_thread(parsed)

    async def info(self) -> StoreInfo:
        """Initialize and describe the backend (server version, transactions)."""
        await self._ensure_ready()
        return await self._info()

    async def _info(self) -> StoreInfo:
        return StoreInfo(backend=self.backend_name)

    def conversation(
        self,
        scope_key: str,
        thread_id: str,
        *,
        agent: str = "assistant",
        flush_every: float = 0.25,
        lease_ttl: timedelta = timedelta(seconds=60),
    ) -> Conversation:
        """A handle on one thread as a chat (``docs/conversation.md``).

        Built on :meth:`read_thread` and :meth:`commit_thread`: ``add``,
        ``reply``, ``messages``, ``get``, ``update``, ``delete``, with the
        versions tracked inside. Writes nothing until the first change.
        """
        from .conversation import Conversation

        return Conversation(
            self, scope_key, thread_id, agent=agent, flush_every=flush_every, lease_ttl=lease_ttl
        )

    def watch(
        self,
        scope_key: str,
        thread_id: str,
        *,
        after: ThreadVersion | Mapping[str, Any] | None = None,
        interval: float = 0.2,
    ) -> AsyncGenerator[ThreadChange, None]:
        """The changes committed to one thread after ``after``, as they happen (``docs/watch.md``).

        An endless async iterator of :class:`~pai_storage.ThreadChange`. Every
        commit after ``after`` (``None``: after the version read when
        iteration starts) is reported, or coalesced into a later change when
        the consumer or the signal is slower than the commits: the latest
        version is never missed, and versions never go backwards. A deletion
        is a change with ``deleted=True``. ``interval`` (seconds) bounds the
        wait between two looks at the thread; backends that know when their
        threads change wake the watcher sooner.

        Raises
        ------
        ThreadStoreInvariantError
            A bad scope key, thread id, ``after`` or ``interval`` (at the call).
        ThreadStoreUnavailableError
            The backend stayed unreachable for several intervals in a row.
        """
        from .maintenance import check_thread_key
        from .watch import check_interval, check_version, watch_thread

        return watch_thread(
            self,
            check_thread_key("scope_key", scope_key),
            check_thread_key("thread_id", thread_id),
            check_version(after),
            check_interval(interval),
        )

    def watch_scope(
        self, scope_key: str, *, interval: float = 0.2, include_hidden: bool = False
    ) -> AsyncGenerator[ThreadChange, None]:
        """The threads of a scope that change from now on, one change each (a sidebar's list).

        Polls :meth:`list_threads` (newest update first) every ``interval``
        seconds and reports each thread whose version moved, oldest update
        first; deletions are not reported. See ``docs/watch.md``.
        """
        from .maintenance import check_thread_key
        from .watch import check_interval, watch_scope

        return watch_scope(
            self,
            check_thread_key("scope_key", scope_key),
            check_interval(interval),
            include_hidden is True,
        )

    def _change_signal(self, scope_key: str, thread_id: str | None) -> ChangeSignal:
        """When a watcher of the thread (``None``: of any thread of the scope) looks again.

        This default polls: it sleeps for the watcher's interval. A backend
        that learns of commits returns a signal that wakes the watcher sooner
        (``docs/backend-authors.md``).
        """
        from .watch import ChangeSignal

        return ChangeSignal()

    @abstractmethod
    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        """Serve a validated read (see :meth:`read_thread`)."""

    @abstractmethod
    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        """Serve a validated list (see :meth:`list_threads`)."""

    @abstractmethod
    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        """Serve a validated commit (see :meth:`commit_thread`)."""

    # ------------------------------------------------------------ lifecycle

    async def prune_threads(
        self,
        scope_key: str | None = None,
        *,
        updated_before: datetime,
        limit: int = 100,
    ) -> list[PrunedThread]:
        """Delete whole threads last updated before ``updated_before`` (a retention sweep).

        Walks the backend's updated-at index (every scope when ``scope_key``
        is ``None``) in bounded batches. A thread holding an unexpired lease
        or a ``running``/``waiting`` run is skipped; every other candidate is
        deleted (root and every child record) through the ordinary
        version-checked delete commit, so a commit racing with the sweep
        either lands first (the thread survives) or gets a conflict. At most
        ``limit`` (1 to 10,000) threads are deleted per call; call again
        until it returns fewer.

        Returns
        -------
        list[PrunedThread]
            What was deleted: scope key, thread id and the version it had.

        Raises
        ------
        ThreadStoreInvariantError
            A bad scope key, cutoff (an aware datetime) or limit.
        ThreadStoreConfigurationError
            The backend does not provide the lifecycle capability.
        """
        from .maintenance import prune_threads

        self._require_lifecycle("prune_threads")
        await self._ensure_ready()
        return await prune_threads(self, scope_key, updated_before=updated_before, limit=limit)

    async def erase_scope(self, scope_key: str) -> int:
        """Delete every thread of a scope; return how many this call deleted.

        Resumable: an interrupted erasure is finished by calling it again.
        Once it returns (and nobody writes to the scope meanwhile), no read or
        list of the scope returns anything. Each thread goes through the
        version-checked delete commit. Runtime-store data of the same tenant
        is erased by :meth:`Stores.erase_scope <pai_storage.Stores.erase_scope>`.
        """
        from .maintenance import erase_scope

        self._require_lifecycle("erase_scope")
        await self._ensure_ready()
        return await erase_scope(self, scope_key)

    async def fork_thread(
        self,
        scope_key: str,
        thread_id: str,
        new_thread_id: str,
        *,
        through_message_id: str | None = None,
    ) -> CommittedResult | ConflictResult:
        """Copy a thread into a new thread of the same scope, optionally up to a message.

        The fork records its parent (``parentThreadId``), starts at revision 1
        with a new instance id, and holds no lease and no queued item.
        Messages after ``through_message_id`` are not copied; neither are
        runs that are open (``running``/``waiting``) or ``queued``, runs with
        a message after the cut or created after the cut message, nor any
        message of such a run. Copied records keep their timestamps and
        positions. The fork's plan is made and copied at one version of the
        source (inside one transaction that holds it, or one snapshot), so
        commits to the source while it is forked do not make it fail.

        Returns
        -------
        CommittedResult
            With the fork's root; ``committed_at`` is its creation time.
        ConflictResult
            ``new_thread_id`` exists already (its version in ``current_version``).

        Raises
        ------
        ThreadStoreInvariantError
            The source or the cut message does not exist, or a bad argument.
        ThreadStoreUnavailableError
            The backend's reads of the source were not one version, again and
            again (transient: nothing was written; retry).
        """
        from .maintenance import fork_thread

        self._require_lifecycle("fork_thread")
        await self._ensure_ready()
        return await fork_thread(self, scope_key, thread_id, new_thread_id, through_message_id)

    async def export_threads(
        self, scope_key: str | None, *, thread_ids: Sequence[str] | None = None
    ) -> AsyncIterator[str]:
        """Stream the threads of a scope (every scope with ``None``) as JSON Lines.

        Yields text lines ending in a newline, in the versioned format of
        ``docs/lifecycle.md``: roots, messages, runs, queued items and leases
        with their original timestamps and positions. ``thread_ids`` limits
        the export to those threads of ``scope_key``.
        """
        from .transfer import export_lines

        self._require_lifecycle("export_threads")
        await self._ensure_ready()
        async for line in export_lines(self, scope_key, thread_ids):
            yield line

    async def import_threads(
        self,
        lines: AsyncIterable[str | bytes] | Iterable[str | bytes],
        *,
        on_conflict: Literal["skip", "fail"] = "skip",
    ) -> ImportReport:
        """Restore exported threads exactly (timestamps, versions, positions kept).

        Every line is validated like any input; each thread is written whole,
        atomically, or not at all. A thread that already exists is skipped
        (``on_conflict="skip"``) or raises :class:`ThreadExistsError`
        (``"fail"``); threads before it stay imported, so a re-run with
        ``"skip"`` resumes.

        Raises
        ------
        ThreadStoreInvariantError
            A corrupt line, named by its line number; nothing of its thread
            was written (threads before it were).
        ThreadExistsError
            With ``on_conflict="fail"``, a thread that exists.
        """
        from .transfer import import_lines

        self._require_lifecycle("import_threads")
        await self._ensure_ready()
        return await import_lines(self, lines, on_conflict)

    async def thread_digest(self, scope_key: str, thread_id: str) -> str | None:
        """A digest of the stored thread's whole content (``None``: it does not exist).

        Two stores hold the same thread exactly when the digests are equal;
        ``pai-storage copy`` compares them after copying.
        """
        from .maintenance import check_thread_key
        from .transfer import thread_digest

        self._require_lifecycle("thread_digest")
        await self._ensure_ready()
        aggregate = await self._load_thread(
            check_thread_key("scope_key", scope_key), check_thread_key("thread_id", thread_id)
        )
        return None if aggregate is None else thread_digest(aggregate)

    def _require_lifecycle(self, operation: str) -> None:
        if LIFECYCLE not in self.capabilities:
            raise self._no_lifecycle(f"{operation}()")

    def _no_lifecycle(self, needed: str) -> ThreadStoreConfigurationError:
        # Also what a lifecycle primitive a backend left out raises.
        return ThreadStoreConfigurationError(
            f"the {self.backend_name} backend does not provide the lifecycle capability "
            f"needed by {needed}"
        )

    # ------------------------------------------------------------ lifecycle primitives

    async def _thread_heads(
        self,
        scope_key: str | None,
        *,
        updated_before: datetime | None,
        after: ThreadIndexEntry | None,
        limit: int,
    ) -> Sequence[ThreadIndexEntry]:
        """Up to ``limit`` entries of the updated-at index, in ascending order.

        Threads of ``scope_key`` (of every scope when ``None``) with
        ``updated_at < updated_before`` (every one when ``None``), ordered by
        ``updated_at``, then scope key, then thread id, strictly after
        ``after`` (a head this method returned) in that order. Served by an
        index: the cost is the entries returned, never a scan of the others.
        """
        raise self._no_lifecycle("_thread_heads")

    async def _load_thread(self, scope_key: str, thread_id: str) -> ThreadAggregate | None:
        """The whole thread (root, every record with its position, the counters).

        From one consistent snapshot; ``None`` when the thread does not exist.
        """
        raise self._no_lifecycle("_load_thread")

    async def _restore_thread(self, aggregate: ThreadAggregate) -> ThreadVersion | None:
        """Write a validated whole thread exactly as given, atomically, if it is missing.

        The root (version, lease and timestamps as given), every record at its
        position and the counters, in one transaction. Returns ``None`` when
        written; when the thread exists, writes nothing and returns its
        version. The core has validated the aggregate (records, positions,
        relationship rules).
        """
        raise self._no_lifecycle("_restore_thread")

    async def _fork_copy(self, fork: ForkRequest) -> ThreadRecord:
        """Plan and copy a fork (:class:`~pai_storage.backend.ForkRequest`) at one version.

        Inside one transaction, with the source held against commits (or in one
        snapshot): plan it with ``await fork.plan_in(self, snapshot)`` over the
        backend's read primitives on that transaction, then copy what the
        :class:`~pai_storage.backend.ForkPlan` keeps; raise
        :class:`~pai_storage.backend.ThreadConflict` (with its version) when
        the new thread exists; return the fork's root. Read the provider's
        time inside the transaction and pass it to ``plan.root()``.

        This generic version loads the whole source in one snapshot
        (:meth:`_load_thread`), plans and applies the fork in memory and writes
        it (:meth:`_restore_thread`): the fork is the source at the loaded
        version. It is correct for any backend but costs the thread's size in
        Python: a backend should override it with a copy inside its database.
        """
        from .apply import AggregateSnapshot
        from .clock import system_clock
        from .maintenance import fork_aggregate
        from .pipeline import ThreadConflict

        source = await self._load_thread(fork.scope_key, fork.source_thread_id)
        now = system_clock()
        plan = await fork.plan_in(self, AggregateSnapshot(source, now))
        assert source is not None  # planning raised for a missing source
        copied = fork_aggregate(source, plan, now)
        existing = await self._restore_thread(copied)
        if existing is not None:
            raise ThreadConflict(existing)
        return copied.root
