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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

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

__all__ = ["StoreInfo", "ThreadStore", "public_projection"]

M = TypeVar("M", bound=StoreModel)


def _coerce(model: type[M], value: M | Mapping[str, Any]) -> M:
    if isinstance(value, model):
        return value
    if isinstance(value, Mapping):
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

    async def read_thread(self, request: ReadThreadInput | Mapping[str, Any]) -> ThreadReadResult:
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
        self, request: ListThreadsInput | Mapping[str, Any]
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
        self, request: CommitThreadInput | Mapping[str, Any]
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

    @abstractmethod
    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        """Serve a validated read (see :meth:`read_thread`)."""

    @abstractmethod
    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        """Serve a validated list (see :meth:`list_threads`)."""

    @abstractmethod
    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        """Serve a validated commit (see :meth:`commit_thread`)."""
