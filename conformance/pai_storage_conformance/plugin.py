"""The pytest plugin: ``pytest --pai-backend=NAME [--pai-url=URL]``.

Registered as a ``pytest11`` entry point, so it is active wherever
``pai-storage`` is installed -- and therefore imports nothing but pytest and
the standard library until it is asked for something: a run that chooses no
backend never imports ``pai_storage``, the suite, Hypothesis or a backend, and
does not need the ``test`` extra. A backend is chosen by option or by the
``pai_backend`` ini value. Then the plugin imports that backend only, starts its
test harness once per session (an unreachable server stops the run with a
clear error), prints the backend and server in the header, and adds the
conformance suite to the collected tests.

Fixtures (override any of them in a ``conftest.py`` or in your test class):

``pai_harness``
    The chosen backend's :class:`~pai_storage_conformance.provision.TestHarness`
    (session scope).
``clock``
    A :class:`~pai_storage.ManualClock` that drives the store's time.
``pai_examples``
    The example budget of the model-based (Hypothesis) test.
``store``
    An initialized store in a fresh namespace, using ``clock``.
``real_clock_store``
    A store that uses the provider's real clock.

The two async ones live in :mod:`pai_storage_conformance.fixtures` (they need
pytest-asyncio); the plugin registers that module when a backend is chosen, or
as soon as a test module has imported the suite (the subclassing use), before
that module's tests are collected.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pai_storage import ManualClock

    from .provision import TestHarness

__all__ = ["FIXTURES_PLUGIN", "SUITE_DIR", "harness_of"]

SUITE_DIR = Path(__file__).parent / "collected"
"""The directory ``--pai-backend`` adds to the collected paths."""

FIXTURES_PLUGIN = "pai_storage_conformance.fixtures"
"""The module holding the async fixtures, registered on demand."""

_SUITE_MODULE = "pai_storage_conformance.suite"
_SUITE_NEEDS = ("pytest_asyncio", "hypothesis")  # the `test` extra
_HARNESS = pytest.StashKey["TestHarness"]()
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


def _use_fixtures(config: pytest.Config) -> None:
    """Register the async fixtures once; they import pai_storage and pytest-asyncio."""
    if not config.pluginmanager.has_plugin(FIXTURES_PLUGIN):
        config.pluginmanager.register(importlib.import_module(FIXTURES_PLUGIN), FIXTURES_PLUGIN)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pai_capability(name): test needs an optional backend capability"
    )
    examples = _setting(config, "pai_examples")
    if examples is not None and (not examples.isdigit() or int(examples) < 1):
        raise pytest.UsageError(f"--pai-examples must be a positive integer, not {examples!r}")
    name = _setting(config, "pai_backend")
    if name is None:
        if _SUITE_MODULE in sys.modules:  # a conftest imported the suite already
            _use_fixtures(config)
        return
    missing = [module for module in _SUITE_NEEDS if importlib.util.find_spec(module) is None]
    if missing:
        raise pytest.UsageError(
            f"--pai-backend={name!r}: the conformance suite needs {', '.join(missing)}, "
            "which is not installed: pip install 'pai-storage[test]'"
        )
    from pai_storage.errors import ThreadStoreError
    from pai_storage.registry import available_backends, get_backend

    try:
        get_backend(name)  # imports this backend only
    except ThreadStoreError:
        valid = ", ".join(sorted(available_backends())) or "none installed"
        raise pytest.UsageError(
            f"--pai-backend={name!r} is not an installed pai-storage backend; valid names: {valid}"
        ) from None
    config.stash[_BACKEND] = name
    _use_fixtures(config)
    suite = SUITE_DIR.resolve()
    if not any(Path(arg.split("::")[0]).resolve() == suite for arg in config.args):
        config.args.append(str(SUITE_DIR))


def pytest_collectstart(collector: pytest.Collector) -> None:
    # Subclassing use: the test module being collected imported the suite, so
    # its classes need the async fixtures before their tests are collected.
    if _SUITE_MODULE in sys.modules:
        _use_fixtures(collector.config)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    name = config.stash.get(_BACKEND, None)
    if name is None:
        return
    from pai_storage.registry import get_backend

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


def harness_of(config: pytest.Config) -> TestHarness | None:
    """The started harness of the chosen backend, or ``None`` without one."""
    return config.stash.get(_HARNESS, None)


@pytest.fixture(scope="session")
def pai_harness(pytestconfig: pytest.Config) -> TestHarness:
    harness = harness_of(pytestconfig)
    if harness is None:
        pytest.fail(
            "no pai-storage backend chosen: run with --pai-backend=NAME, or override "
            "the 'store' fixture (see docs/backend-authors.md)"
        )
    return harness


@pytest.fixture
def clock() -> ManualClock:
    import pai_storage

    return pai_storage.ManualClock()


@pytest.fixture
def pai_examples(pytestconfig: pytest.Config) -> int:
    return int(_setting(pytestconfig, "pai_examples") or 25)
