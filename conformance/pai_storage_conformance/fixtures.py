"""The suite's async store fixtures.

Not a ``pytest11`` entry point: :mod:`pai_storage_conformance.plugin` registers
this module only when the suite is used, because it imports ``pai_storage``
and pytest-asyncio (the ``test`` extra). The decorator marks the fixtures for
pytest-asyncio, so they work in its strict mode too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from pai_storage import ManualClock, ThreadStore

from .plugin import harness_of
from .provision import TestHarness

__all__ = [
    "enumerating_snapshot_store",
    "enumerating_state_store",
    "guard",
    "kv_store",
    "lifecycle_store",
    "real_clock_store",
    "snapshot_store",
    "state_store",
    "store",
]


def _require_threads(harness: TestHarness) -> None:
    if "threads" not in harness.components:
        pytest.skip(
            f"component 'threads' not provided by {harness.describe()}: the backend does not "
            "declare it (override the store fixture to test your own store)"
        )


@pytest_asyncio.fixture
async def store(pai_harness: TestHarness, clock: ManualClock) -> AsyncIterator[ThreadStore]:
    _require_threads(pai_harness)
    async with pai_harness.store(clock) as created:
        yield created


@pytest_asyncio.fixture
async def real_clock_store(pytestconfig: pytest.Config) -> AsyncIterator[ThreadStore]:
    harness = harness_of(pytestconfig)
    if harness is None:
        pytest.skip(
            "capability 'real_clock' not provided: override the real_clock_store "
            "fixture (a store using the provider's own clock) to run this test"
        )
    _require_threads(harness)
    async with harness.store(None) as created:
        yield created


@pytest_asyncio.fixture
async def lifecycle_store(store: ThreadStore) -> AsyncIterator[ThreadStore]:
    """The ``store``, when it declares the ``lifecycle`` capability."""
    from pai_storage.backend import LIFECYCLE

    if LIFECYCLE not in store.capabilities:
        pytest.skip(
            f"capability {LIFECYCLE!r} not provided by the {store.backend_name} backend: its "
            "store does not declare it (ThreadStore.capabilities, docs/lifecycle.md)"
        )
    yield store


async def _component(
    request: pytest.FixtureRequest, name: str, clock: ManualClock
) -> AsyncIterator[Any]:
    harness = harness_of(request.config)
    if harness is None or name not in harness.components:
        backend = "the test harness" if harness is None else harness.describe()
        pytest.skip(
            f"component {name!r} not provided by {backend}: the backend does not declare it "
            f"(override the {request.fixturename} fixture to test your own store)"
        )
    async with harness.component(name, clock) as created:
        yield created


@pytest_asyncio.fixture
async def kv_store(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Any]:
    """An initialized key-value store in a fresh namespace, using ``clock``."""
    async for created in _component(request, "kv", clock):
        yield created


@pytest_asyncio.fixture
async def state_store(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Any]:
    """An initialized agent-state store in a fresh namespace, using ``clock``."""
    async for created in _component(request, "state", clock):
        yield created


@pytest_asyncio.fixture
async def snapshot_store(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Any]:
    """An initialized snapshot store in a fresh namespace, using ``clock``."""
    async for created in _component(request, "snapshots", clock):
        yield created


@pytest_asyncio.fixture
async def guard(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Any]:
    """An initialized execution guard in a fresh namespace, using ``clock``."""
    async for created in _component(request, "guard", clock):
        yield created


def _require_enumerate(store: Any, component: str) -> None:
    from pai_storage.backend import ENUMERATE

    if ENUMERATE not in store.capabilities:
        pytest.skip(
            f"capability {ENUMERATE!r} not provided by the {store.backend_name} {component} "
            "store: it does not declare it (capabilities, docs/lifecycle.md)"
        )


@pytest_asyncio.fixture
async def enumerating_state_store(state_store: Any) -> AsyncIterator[Any]:
    """The ``state_store``, when it declares the ``enumerate`` capability."""
    _require_enumerate(state_store, "agent-state")
    yield state_store


@pytest_asyncio.fixture
async def enumerating_snapshot_store(snapshot_store: Any) -> AsyncIterator[Any]:
    """The ``snapshot_store``, when it declares the ``enumerate`` capability."""
    _require_enumerate(snapshot_store, "snapshot")
    yield snapshot_store
