"""docs/guard.md lists every error the guard raises and states its lease guarantees."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pai_storage import errors

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guard.md"

RAISED = (
    "InvalidInputError",
    "LockTimeoutError",
    "UnavailableError",
    "OutcomeUnknownError",  # acquire / release when a connection dies mid-call
    "ConfigurationError",
)


def _errors_table() -> dict[str, str]:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.+) \|$", section, flags=re.MULTILINE)
    return dict(rows)


@pytest.mark.parametrize("name", RAISED)
def test_every_error_the_guard_raises_is_listed(name: str) -> None:
    table = _errors_table()
    assert name in table, f"docs/guard.md's errors table does not list {name}"
    assert issubclass(getattr(errors, name), errors.StorageError)


def test_outcome_unknown_says_which_calls_and_what_is_left() -> None:
    row = _errors_table()["OutcomeUnknownError"]
    for words in ("acquire", "release", "lease"):
        assert words in row


def test_the_lease_guarantees_are_stated() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert "### What the guard guarantees about lease expiry" in text
    for words in ("monotonic clock", "**sent**", "never hand out", "lock.lost` is set at"):
        assert words in text, words
