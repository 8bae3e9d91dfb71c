"""The pytest plugin: ``pytest --pai-backend=NAME [--pai-url=URL]``.

Registered as a ``pytest11`` entry point, so it is active wherever
``pai-storage`` is installed; it does nothing until a backend is chosen (by
option or ini value). Then it starts that backend's test harness once per
session (an unreachable server stops the run with a clear error), prints the
backend and server in the header, and adds the conformance suite to the
collected tests.

Fixtures (override any of them in a ``conftest.py``):

``pai_harness``
    The chosen backend's :class:`~pai_storage.TestHarness` (session scope).
``clock``
    A :class:`~pai_storage.ManualClock` that drives the store's time.
``store``
    An initialized store in a fresh namespace, using ``clock``.
``real_clock_store``
    A store that uses the provider's real clock.
``pai_examples``
    The example budget of the model-based (Hypothesis) test.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from pai_storage import ManualClock, TestHarness, ThreadStore, available_backends, get_backend
from pai_storage.errors import ThreadStoreError

SUITE_DIR = Path(__file__).parent / "collected"
_HARNESS = pytest.StashKey[TestHarness]()
_BACKEND = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pai", "pai-storage conformance suite")
    group.addoption(
        "--pai-backend",
        dest="pai_backend",
        default=None,
        metavar="NAME",
        help="run the pai-storage conformance suite against this installed backend",
    )
    parser.addini("pai_backend", "default for --pai-backend", default=None)
    group.addoption(
        "--pai-url",
        dest="pai_url",
        default=None,
        metavar="URL",
        help="server URL for the backend under test (else PAI_TEST_<NAME>_URL, "
        "else the backend's own default, e.g. a throwaway server)",
    )
    parser.addini("pai_url", "default for --pai-url", default=None)
    group.addoption(
        "--pai-examples",
        dest="pai_examples",
        default=None,
        metavar="N",
        help="example budget of the model-based (Hypothesis) conformance test",
    )
    parser.addini("pai_examples", "default for --pai-examples", default="25")


def _setting(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(name)
    if value is None:
        value = config.getini(name)
    return str(value) if value not in (None, "") else None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pai_capability(name): test needs an optional backend capability"
    )
    examples = _setting(config, "pai_examples")
    if examples is not None and (not examples.isdigit() or int(examples) < 1):
        raise pytest.UsageError(f"--pai-examples must be a positive integer, not {examples!r}")
    name = _setting(config, "pai_backend")
    if name is None:
        return
    try:
        get_backend(name)
    except ThreadStoreError:
        valid = ", ".join(sorted(available_backends())) or "none installed"
        raise pytest.UsageError(
            f"--pai-backend={name!r} is not an installed pai-storage backend; valid names: {valid}"
        ) from None
    config.stash[_BACKEND] = name
    suite = SUITE_DIR.resolve()
    if not any(Path(arg.split("::")[0]).resolve() == suite for arg in config.args):
        config.args.append(str(SUITE_DIR))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    name = config.stash.get(_BACKEND, None)
    if name is None:
        return
    url = _setting(config, "pai_url") or os.environ.get(f"PAI_TEST_{name.upper()}_URL") or None
    harness = get_backend(name).test_harness(url)
    try:
        asyncio.run(harness.start())
    except Exception as exc:
        raise pytest.UsageError(
            f"pai-storage: cannot start the {name!r} backend's test server: {exc}"
        ) from exc
    config.stash[_HARNESS] = harness


def pytest_unconfigure(config: pytest.Config) -> None:
    harness = config.stash.get(_HARNESS, None)
    if harness is not None:
        del config.stash[_HARNESS]
        asyncio.run(harness.aclose())


def pytest_report_header(config: pytest.Config) -> str | None:
    name = config.stash.get(_BACKEND, None)
    if name is None:
        return None
    harness = config.stash.get(_HARNESS, None)
    server = harness.describe() if harness is not None else "not started"
    return f"pai-storage conformance: backend={name}; server={server}"


@pytest.fixture(scope="session")
def pai_harness(pytestconfig: pytest.Config) -> TestHarness:
    harness = pytestconfig.stash.get(_HARNESS, None)
    if harness is None:
        pytest.fail(
            "no pai-storage backend chosen: run with --pai-backend=NAME, or override "
            "the 'store' fixture (see docs/backend-authors.md)"
        )
    return harness


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest_asyncio.fixture
async def store(pai_harness: TestHarness, clock: ManualClock) -> AsyncIterator[ThreadStore]:
    async with pai_harness.store(clock) as created:
        yield created


@pytest_asyncio.fixture
async def real_clock_store(pytestconfig: pytest.Config) -> AsyncIterator[ThreadStore]:
    harness = pytestconfig.stash.get(_HARNESS, None)
    if harness is None:
        pytest.skip(
            "capability 'real_clock' not provided: override the real_clock_store "
            "fixture (a store using the provider's own clock) to run this test"
        )
    async with harness.store(None) as created:
        yield created


@pytest.fixture
def pai_examples(pytestconfig: pytest.Config) -> int:
    return int(_setting(pytestconfig, "pai_examples") or 25)
