"""The conformance plugin's own behaviour: options, usage errors, header, collection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_unknown_backend_is_a_usage_error_naming_valid_ones(tmp_path: Path) -> None:
    run = _pytest("--pai-backend=nosuch", cwd=tmp_path)
    assert run.returncode == 4  # pytest's usage-error exit code
    assert "--pai-backend='nosuch' is not an installed pai-storage backend" in run.stderr
    assert "memory" in run.stderr
    assert "Traceback" not in run.stderr


def test_bad_example_budget_is_a_usage_error(tmp_path: Path) -> None:
    run = _pytest("--pai-examples=0", cwd=tmp_path)
    assert run.returncode == 4
    assert "--pai-examples must be a positive integer" in run.stderr


def test_backend_runs_the_suite_and_reports_it_in_the_header(tmp_path: Path) -> None:
    run = _pytest("--pai-backend=memory", "-q", "-k", "TestWorkedExample", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    header = _pytest("--pai-backend=memory", "--co", "-k", "TestWorkedExample", cwd=tmp_path)
    assert "pai-storage conformance: backend=memory; server=memory (in-process)" in header.stdout


def test_without_a_backend_the_plugin_collects_nothing_extra(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    run = _pytest("-q", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


# ------------------------------------------- nothing heavy until a backend is chosen

SUITE_MODULES = ("pai_storage", "pai_storage_conformance.suite", "pai_storage_conformance.fixtures")

UNRELATED_TEST = f"""
import sys


def test_unrelated():
    heavy = [m for m in {SUITE_MODULES!r} if m in sys.modules]
    assert heavy == [], heavy
"""


def test_without_a_backend_the_plugin_imports_nothing_heavy(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text(UNRELATED_TEST)
    run = _pytest("-q", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


# As if the `test` extra were not installed: its pytest plugins are not loaded
# and neither module can be imported or found (a None entry in sys.modules).
WITHOUT_TEST_EXTRA = """
import sys

sys.modules["hypothesis"] = None
sys.modules["pytest_asyncio"] = None
"""


def _pytest_without_test_extra(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    (cwd / "conftest.py").write_text(WITHOUT_TEST_EXTRA)
    return _pytest("-p", "no:asyncio", "-p", "no:hypothesispytest", *args, cwd=cwd)


def test_plain_run_needs_no_test_extra(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text(UNRELATED_TEST)
    run = _pytest_without_test_extra("-q", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_backend_without_test_extra_is_a_usage_error(tmp_path: Path) -> None:
    run = _pytest_without_test_extra("--pai-backend=memory", cwd=tmp_path)
    assert run.returncode == 4
    assert "--pai-backend='memory': the conformance suite needs" in run.stderr
    assert "pytest_asyncio, hypothesis" in run.stderr
    assert "pip install 'pai-storage[test]'" in run.stderr
    assert "Traceback" not in run.stderr


def test_plugin_and_provision_import_cheaply_and_the_package_exports_the_suite() -> None:
    code = """
import sys
import pai_storage_conformance as package
import pai_storage_conformance.plugin as plugin
import pai_storage_conformance.provision
print(plugin.SUITE_DIR.is_dir(), [m for m in (*HEAVY, "hypothesis") if m in sys.modules])
from pai_storage_conformance import ThreadStoreConformance
import pai_storage_conformance.suite as suite
print(ThreadStoreConformance is suite.ThreadStoreConformance, package.__all__ == suite.__all__)
"""
    run = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {SUITE_MODULES!r}\n{code}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["True []", "True True"]


SUBCLASSING_TEST = """
from collections.abc import AsyncIterator

import pytest_asyncio
from pai_storage_conformance.suite import ThreadStoreConformance

from pai_storage import ManualClock, ThreadStore, open_store


class TestMemoryBySubclassing(ThreadStoreConformance):
    @pytest_asyncio.fixture
    async def store(self, clock: ManualClock) -> AsyncIterator[ThreadStore]:
        async with open_store("memory://", clock=clock) as store:
            yield store
"""


def test_subclassing_gets_the_suite_fixtures_in_strict_mode(tmp_path: Path) -> None:
    # No backend chosen: the async fixtures (real_clock_store here) come from the
    # plugin as soon as the test module has imported the suite.
    (tmp_path / "test_sub.py").write_text(SUBCLASSING_TEST)
    run = _pytest(
        "-q",
        "-rs",
        "-o",
        "asyncio_mode=strict",
        "-o",
        "asyncio_default_fixture_loop_scope=function",
        "-k",
        "one_turn_end_to_end or real_clock",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "capability 'real_clock' not provided" in run.stdout
    assert "fixture 'real_clock_store' not found" not in run.stdout
