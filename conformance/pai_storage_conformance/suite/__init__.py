"""The conformance suite: one ``Test*`` class per topic, plus the umbrella class.

``pytest --pai-backend=NAME`` collects every topic class below. Third-party
authors can instead subclass :class:`ThreadStoreConformance` and provide a
``store`` fixture (see ``docs/backend-authors.md``).
"""

from __future__ import annotations

import pytest

from .commits import TestConflicts, TestCreateUpdateDelete
from .concurrency import TestConcurrency, TestIsolation
from .errors import TestErrorsAndWarnings
from .identity import TestIdentityAndScoping
from .json_values import TestStrictJson
from .leases import TestLeases
from .listing import TestListing
from .model_based import TestModelBased
from .pagination import TestPagination
from .reads import TestIdSelections, TestMessageViews, TestReads
from .relationships import TestRelationshipRules, TestWorkedExample

__all__ = [
    "TestConcurrency",
    "TestConflicts",
    "TestCreateUpdateDelete",
    "TestErrorsAndWarnings",
    "TestIdSelections",
    "TestIdentityAndScoping",
    "TestIsolation",
    "TestLeases",
    "TestListing",
    "TestMessageViews",
    "TestModelBased",
    "TestPagination",
    "TestReads",
    "TestRelationshipRules",
    "TestStrictJson",
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
    TestConcurrency,
    TestIsolation,
    TestModelBased,
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
