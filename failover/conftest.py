"""Failover tests: a three-member MongoDB replica set and a PostgreSQL primary with a
synchronous hot standby, each faulted under a bounded load of racing writers.

They are not part of the default test run (``testpaths`` is ``tests``). Run them with::

    .venv/bin/pytest -q -o pai_backend= failover

Every scenario's report (acknowledged, found, lost, unknown outcomes and how
each resolved, seconds to recovery) is printed in the terminal summary and
written to ``PAI_FAILOVER_REPORT`` (default ``<tmp>/pai-failover/report.txt``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The shared test helpers (``support``: the fault proxy) live under tests/, which this
# run does not collect.
_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

from failover.reporting import REPORTS, report_path  # noqa: E402


def pytest_sessionstart(session: pytest.Session) -> None:
    path = report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORTS:
        return
    terminalreporter.section("failover report")
    for report in REPORTS:
        terminalreporter.write_line(report.render())
    terminalreporter.write_line(f"(also written to {report_path()})")
