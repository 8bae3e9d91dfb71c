"""The conformance suite's topic classes (each ``Test*`` class is one topic)."""

from __future__ import annotations

__all__: list[str] = []
