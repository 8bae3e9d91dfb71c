"""The class tree of docs/errors.md is the one in the code: every class it
draws is importable from ``pai_storage.errors`` and derives directly from the
class it is drawn under."""

from __future__ import annotations

import re
from pathlib import Path

import pai_storage.errors

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
NODE = re.compile(r"^(?P<indent>(?:[│ ] {3})*)(?:[├└]── )?(?P<name>[A-Z]\w+)(?:\s|$)")


def _tree() -> list[tuple[str, str | None]]:
    """``(class, parent)`` for each line of the first code block of the page."""
    block = DOC.read_text(encoding="utf-8").split("```\n", 2)[1]
    parents: list[str] = []
    drawn: list[tuple[str, str | None]] = []
    for line in block.splitlines():
        match = NODE.match(line)
        assert match, f"not a line of the tree: {line!r}"
        depth = len(match["indent"]) // 4 + (1 if line.lstrip("│ ").startswith(("├", "└")) else 0)
        del parents[depth:]
        drawn.append((match["name"], parents[-1] if parents else None))
        parents.append(match["name"])
    return drawn


def test_every_drawn_class_is_in_pai_storage_errors_under_its_parent() -> None:
    drawn = _tree()
    assert len(drawn) >= 20
    assert drawn[0] == ("StorageError", None)
    for name, parent in drawn:
        cls = getattr(pai_storage.errors, name, None)
        assert isinstance(cls, type), f"{name} is not importable from pai_storage.errors"
        assert name in pai_storage.errors.__all__
        if parent is not None:
            assert parent in [base.__name__ for base in cls.__bases__], (name, parent)
