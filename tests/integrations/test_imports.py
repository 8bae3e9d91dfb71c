"""pai-storage without the framework extras imports none of the frameworks, and
an adapter whose framework is missing says which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("langgraph", "langchain_core", "agents", "openai", "google")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_library_imports_no_framework() -> None:
    done = _run(
        f"""
import asyncio, sys
import pai_storage
import pai_storage.integrations
import pai_storage.integrations.support

async def use():
    async with pai_storage.connect("memory://") as stores:
        await stores.kv.put(("ns",), "k", 1)

asyncio.run(use())
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r})
print(loaded)
assert not loaded, loaded
"""
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "extra"),
    [("langgraph", "langgraph"), ("openai_agents", "openai-agents"), ("adk", "adk")],
)
def test_a_missing_framework_names_its_extra(module: str, extra: str) -> None:
    done = _run(
        f"""
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {FRAMEWORKS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
try:
    import pai_storage.integrations.{module}
except ImportError as exc:
    print(exc)
else:
    raise SystemExit("imported without its framework")
"""
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pip install 'pai-storage[{extra}]'" in done.stdout
    assert f"pai_storage.integrations.{module} needs" in done.stdout
