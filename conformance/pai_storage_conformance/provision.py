"""Test provisioning: how the conformance suite gets isolated stores of a backend.

A backend's :meth:`~pai_storage.backend.Backend.test_harness` returns a
:class:`TestHarness`; ``pytest --pai-backend=NAME`` starts it once per session
and asks it for a fresh store per test. This module is test support, not
application surface (the way SQLAlchemy keeps ``testing/provision.py`` beside
its suite): it imports only the standard library, so a backend can import it
cheaply, and nothing here is imported when an application opens a store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pai_storage import ThreadStore
    from pai_storage.backend import Clock

__all__ = ["TestHarness"]


class TestHarness(ABC):
    """Makes isolated stores of one backend for the conformance suite.

    Every store it creates lives in its own namespace (a fresh collection
    prefix, schema or table prefix) and is cleaned up when its context exits;
    :meth:`aclose` stops whatever :meth:`start` started.
    """

    __test__ = False  # not a pytest test class

    components: frozenset[str] = frozenset({"threads"})
    """The components this harness can provision: ``"threads"`` and any of
    ``"kv"``, ``"state"``, ``"snapshots"``, ``"guard"``. The suite runs a
    runtime-store topic only for a component listed here and reports the
    others as not provided."""

    @abstractmethod
    def store(self, clock: Clock | None = None) -> AbstractAsyncContextManager[ThreadStore]:
        """An initialized store in a fresh namespace, removed on exit.

        ``clock`` is the suite's manual clock; ``None`` means the store uses
        its provider's own clock.
        """

    def component(self, name: str, clock: Clock | None = None) -> AbstractAsyncContextManager[Any]:
        """An initialized store of component ``name`` in a fresh namespace, closed on exit.

        Override it when :attr:`components` lists more than ``"threads"``.
        """
        if name == "threads":
            return self.store(clock)
        raise LookupError(f"{type(self).__name__} does not provide the {name} component")

    async def start(self) -> None:
        """Connect, or start a throwaway server; fail loudly if unreachable."""

    async def aclose(self) -> None:
        """Stop anything :meth:`start` started."""

    def describe(self) -> str:
        """One line for the pytest header: backend and server."""
        return type(self).__name__
