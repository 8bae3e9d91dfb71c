"""A copy of 1,000 threads of 100 messages through every built-in backend:
memory -> PostgreSQL -> MongoDB -> SQLite, each hop resumable and digest-verified.

Every backend of the chain must declare the ``lifecycle`` capability (the test
fails, naming the first that does not). Servers come from each
backend's test harness: ``PAI_TEST_<NAME>_URL`` or the harness's own default (a
throwaway ``mongod``, an in-memory SQLite database).
"""

from __future__ import annotations

import importlib
import itertools
import os
from contextlib import AsyncExitStack

import pytest
from pai_storage_conformance.suite.lifecycle import build_conversation

from pai_storage import ManualClock, ThreadStore
from pai_storage.backend import LIFECYCLE, ThreadAggregate, get_backend
from pai_storage.transfer import copy_threads

CHAIN = ("memory", "postgres", "mongo", "sql")
THREADS = 1_000


def _store_classes(name: str) -> list[type[ThreadStore]]:
    module = importlib.import_module(f"pai_storage_{name}.store")
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, ThreadStore) and value is not ThreadStore
    ]


async def test_a_thousand_threads_copy_through_every_backend_with_equal_digests() -> None:
    for name in CHAIN:
        if not any(LIFECYCLE in cls.capabilities for cls in _store_classes(name)):
            pytest.fail(f"capability {LIFECYCLE!r} not provided by the {name} backend")
    clock = ManualClock()
    harnesses = [
        get_backend(n).test_harness(os.environ.get(f"PAI_TEST_{n.upper()}_URL")) for n in CHAIN
    ]
    async with AsyncExitStack() as stack:
        stores: list[ThreadStore] = []
        for harness in harnesses:
            await harness.start()
            stack.push_async_callback(harness.aclose)
            stores.append(await stack.enter_async_context(harness.store(clock)))
        source = stores[0]
        await build_conversation(source, clock, "chain", "template", turns=49, open_turn=True)
        template = await source._load_thread("chain", "template")
        assert template is not None
        assert len(template.messages) == 100
        for i in range(THREADS - 1):
            root = template.root.model_copy(
                update={"scope_key": f"chain-{i % 7}", "thread_id": f"t{i}"}
            )
            copy = ThreadAggregate(root, template.messages, template.runs, template.queued_items)
            assert await source._restore_thread(copy) is None
        for before, after in itertools.pairwise(stores):
            report = await copy_threads(before, after)
            assert len(report.copied) == THREADS
            assert report.verified == THREADS
            assert report.ok
        for i in range(0, THREADS - 1, 37):
            scope = f"chain-{i % 7}"
            digests = {await store.thread_digest(scope, f"t{i}") for store in stores}
            assert len(digests) == 1
            assert None not in digests
