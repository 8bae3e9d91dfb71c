"""The pai-storage conformance suite.

Run it against an installed backend with ``pytest --pai-backend=NAME``, or
subclass :class:`ThreadStoreConformance` in your own tests and provide a
``store`` fixture (see ``docs/backend-authors.md``).
"""

from __future__ import annotations

from .suite import *  # noqa: F403
from .suite import __all__ as _topics

__all__ = [*_topics]
