"""The published langgraph-checkpoint-conformance suite against PaiCheckpointSaver.

Every base capability must pass, and every extended one the saver implements
(``copy_thread``); the ones it does not implement must be reported as not
detected, never as failed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES

from pai_storage.integrations.langgraph import PaiCheckpointSaver

from .conftest import Target

IMPLEMENTED_EXTENSIONS = {"copy_thread"}


async def test_conformance(target: Target) -> None:
    async def factory() -> AsyncGenerator[PaiCheckpointSaver, None]:
        async with PaiCheckpointSaver.from_url(target.url, **target.options) as saver:
            yield saver

    registered = checkpointer_test(name=f"PaiCheckpointSaver[{target.backend}]")(factory)
    report = await validate(registered)

    failures = {
        name: result.failures for name, result in report.results.items() if result.passed is False
    }
    assert not failures, failures
    passed = {name for name, result in report.results.items() if result.passed}
    assert passed == {c.value for c in BASE_CAPABILITIES} | IMPLEMENTED_EXTENSIONS
    total = sum(result.tests_passed for result in report.results.values())
    assert total >= 60  # the suite ran its cases, not an empty report
