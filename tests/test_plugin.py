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
