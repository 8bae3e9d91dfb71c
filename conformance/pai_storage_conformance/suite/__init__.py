"""The conformance suite: one ``Test*`` class per topic, plus the umbrella class.

``pytest --pai-backend=NAME`` collects every topic class below. Third-party
authors can instead subclass :class:`ThreadStoreConformance` and provide a
``store`` fixture (see ``docs/backend-authors.md``).

The runtime stores have one topic each (:class:`KeyValueStoreTests`,
:class:`ExecutionGuardTests`, ...), each using one fixture for the store under
test (``kv_store``, ``guard``, ...); ``--pai-backend`` runs them for the
components the backend's harness provides and reports the others as not
provided. Subclass a topic and provide its fixture to run it on your own store.
"""

from __future__ import annotations

import pytest

from .commits import TestConflicts, TestCreateUpdateDelete
from .concurrency import TestConcurrency, TestIsolation
from .conversation import TestConversation
from .errors import TestErrorsAndWarnings
from .guard import ExecutionGuardTests
from .hostile import TestHostileValues
from .identity import TestIdentityAndScoping
from .immutability import TestImmutableRecords
from .json_values import TestStrictJson
from .kv import KeyValueStoreTests
from .leases import TestLeases
from .lifecycle import LifecycleTests
from .listing import TestListing
from .model_based import TestModelBased
from .pagination import TestPagination
from .reads import TestIdSelections, TestMessageViews, TestReads
from .relationships import TestRelationshipRules, TestWorkedExample
from .snapshots import SnapshotStoreTests
from .state import AgentStateStoreTests
from .watch import TestWatch

__all__ = [
    "AgentStateStoreTests",
    "ExecutionGuardTests",
    "KeyValueStoreTests",
    "LifecycleTests",
    "SnapshotStoreTests",
    "TestAgentStateStore",
    "TestConcurrency",
    "TestConflicts",
    "TestConversation",
    "TestCreateUpdateDelete",
    "TestErrorsAndWarnings",
    "TestExecutionGuard",
    "TestHostileValues",
    "TestIdSelections",
    "TestIdentityAndScoping",
    "TestImmutableRecords",
    "TestIsolation",
    "TestKeyValueStore",
    "TestLeases",
    "TestLifecycle",
    "TestListing",
    "TestMessageViews",
    "TestModelBased",
    "TestPagination",
    "TestReads",
    "TestRelationshipRules",
    "TestSnapshotStore",
    "TestStrictJson",
    "TestWatch",
    "TestWorkedExample",
    "ThreadStoreConformance",
]


class ThreadStoreConformance(
    TestIdentityAndScoping,
    TestReads,
    TestMessageViews,
    TestIdSelections,
    TestPagination,
    TestListing,
    TestCreateUpdateDelete,
    TestConflicts,
    TestLeases,
    TestRelationshipRules,
    TestWorkedExample,
    TestStrictJson,
    TestErrorsAndWarnings,
    TestImmutableRecords,
    TestHostileValues,
    TestConcurrency,
    TestConversation,
    TestIsolation,
    TestModelBased,
    TestWatch,
    LifecycleTests,
):
    """Every topic of the suite in one class.

    Subclass it as ``class TestMyStore(ThreadStoreConformance)`` and define an
    async ``store`` fixture that yields an initialized store using the
    ``clock`` fixture (a :class:`~pai_storage.ManualClock`); optionally a
    ``real_clock_store`` fixture too. The class carries the asyncio mark, so the
    suite also runs under pytest-asyncio's strict mode.
    """

    pytestmark = pytest.mark.asyncio


def _assert_no_shadowed_tests() -> None:
    # Topic classes are combined by inheritance: two topics defining the same
    # test name would silently drop one of them from ThreadStoreConformance.
    seen: dict[str, str] = {}
    for base in ThreadStoreConformance.__mro__[1:]:
        for name in vars(base):
            if name.startswith("test"):
                if name in seen and seen[name] != base.__name__:
                    raise TypeError(f"{name} is defined by both {seen[name]} and {base.__name__}")
                seen[name] = base.__name__


_assert_no_shadowed_tests()


class TestLifecycle(LifecycleTests):
    """The thread lifecycle topic (prune, erase, fork, export, import), on the
    ``lifecycle_store`` fixture: backends that declare the ``lifecycle`` capability."""

    pytestmark = pytest.mark.asyncio


class TestKeyValueStore(KeyValueStoreTests):
    """The key-value store topic, on the ``kv_store`` fixture."""

    pytestmark = pytest.mark.asyncio


class TestExecutionGuard(ExecutionGuardTests):
    """The execution guard topic, on the ``guard`` fixture."""

    pytestmark = [pytest.mark.asyncio]


class TestAgentStateStore(AgentStateStoreTests):
    """The agent-state topic, on the ``state_store`` fixture."""

    pytestmark = pytest.mark.asyncio


class TestSnapshotStore(SnapshotStoreTests):
    """The snapshot topic, on the ``snapshot_store`` fixture."""

    pytestmark = pytest.mark.asyncio
