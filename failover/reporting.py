"""Per-scenario reports, collected for the terminal summary and a report file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .load import Report

REPORTS: list[Report] = []


def report_path() -> Path:
    """``PAI_FAILOVER_REPORT``, else ``<tmp>/pai-failover/report.txt``."""
    explicit = os.environ.get("PAI_FAILOVER_REPORT")
    if explicit:
        return Path(explicit)
    return Path(tempfile.gettempdir()) / "pai-failover" / "report.txt"


def record(report: Report) -> None:
    """Keep ``report`` for the summary and append it to the report file at once."""
    REPORTS.append(report)
    path = report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(report.render() + "\n\n")
