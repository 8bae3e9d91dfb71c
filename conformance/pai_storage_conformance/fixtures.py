"""The suite's async store fixtures.

Not a ``pytest11`` entry point: :mod:`pai_storage_conformance.plugin` registers
this module only when the suite is used, because it imports ``pai_storage``
and pytest-asyncio (the ``test`` extra). The decorator marks the fixtures for
pytest-asyncio, so they work in its strict mode too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from pai_storage import ManualClock, ThreadStore

from .plugin import harness_of
from .provision import TestHarness

__all__ = ["real_clock_store", "store"]


@pytest_asyncio.fixture
async def store(pai_harness: TestHarness, clock: ManualClock) -> AsyncIterator[ThreadStore]:
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
    async with harness.store(None) as created:
        yield created
