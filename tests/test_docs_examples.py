"""Every Python block of README.md and docs/**/*.md runs as written, or says it is a fragment.

A block opened with ```` ```python ```` is a complete program: it is run in a
fresh interpreter, in an empty working directory, and must exit 0 (a block
indented inside a list item too, dedented). A block that
uses ``memory://`` is run a second time with every ``memory://`` replaced by a
SQLite file (``sqlite:///docs-example.db``), so the examples hold on a durable
backend too. A block that is only a piece of a program (a signature, a
pattern, a hook a backend implements, code that needs a server the tests do not
provide) is opened with ```` ```python fragment ```` and is not run.

Pages are found by globbing, so a new page is covered without editing this
file. The framework pages (LangGraph, OpenAI Agents SDK, ADK) are run by
``tests/integrations/test_docs.py`` with their optional dependencies.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A fence may be indented (a block inside a list item); its code is dedented.
FENCE = re.compile(r"^([ \t]*)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.DOTALL | re.MULTILINE)
FRAMEWORK_PAGES = {"docs/langgraph.md", "docs/openai-agents.md", "docs/adk.md"}
TIMEOUT = 300  # seconds per block, generous: the machine may be loaded


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    info: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    return [p for p in pages if p.relative_to(ROOT).as_posix() not in FRAMEWORK_PAGES]


def _blocks() -> list[Block]:
    found = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            info = match.group(2).strip()
            if info.split(" ", 1)[0] not in ("python", "py"):
                continue
            line = text.count("\n", 0, match.start()) + 1
            code = textwrap.dedent(match.group(3))
            found.append(Block(page.relative_to(ROOT).as_posix(), line, info, code))
    return found


BLOCKS = _blocks()
RUNNABLE = [b for b in BLOCKS if b.info in ("python", "py")]


def test_every_block_is_runnable_or_a_fragment() -> None:
    odd = [
        f"{b.name} ({b.info!r})"
        for b in BLOCKS
        if b not in RUNNABLE and b.info.split()[1:] != ["fragment"]
    ]
    assert not odd, "a Python block is ```python or ```python fragment: " + ", ".join(odd)
    assert len(RUNNABLE) >= 20  # the discovery found the pages


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # A name that left the top-level pai_storage warns; the docs must not use one.
        [sys.executable, "-W", "error:pai_storage.:DeprecationWarning", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    written = tmp_path / "as-written"
    written.mkdir()
    done = _run(block.code, written)
    assert done.returncode == 0, f"{block.name} failed:\n{done.stderr[-3000:]}"
    if "memory://" in block.code:
        durable = tmp_path / "sqlite"
        durable.mkdir()
        done = _run(block.code.replace("memory://", "sqlite:///docs-example.db"), durable)
        assert done.returncode == 0, f"{block.name} on a SQLite file:\n{done.stderr[-3000:]}"
