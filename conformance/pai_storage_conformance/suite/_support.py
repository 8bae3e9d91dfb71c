"""Small helpers shared by the suite's topic modules."""

from __future__ import annotations

from uuid import uuid4


def new_scope(tag: str = "") -> str:
    """A fresh scope key, so tests never see each other's threads (even on a shared store)."""
    return f"scope-{tag}{'-' if tag else ''}{uuid4().hex}"
