"""The examples of the framework pages (docs/langgraph.md, docs/openai-agents.md,
docs/adk.md) run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["langgraph.md", "openai-agents.md", "adk.md"]


@pytest.mark.parametrize("page", PAGES)
def test_examples_run(page: str) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, f"{page} has no Python example"
    for code in blocks:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip()  # every example prints what it shows
