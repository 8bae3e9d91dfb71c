"""The pai-storage conformance suite.

Run it against an installed backend with ``pytest --pai-backend=NAME``, or
subclass :class:`ThreadStoreConformance` in your own tests and provide a
``store`` fixture (see ``docs/backend-authors.md``). Backends build their test
harness on :class:`pai_storage_conformance.provision.TestHarness`.

Importing this package is cheap: the pytest plugin and every backend harness
import its submodules, so the suite (and Hypothesis, the ``test`` extra) is
imported only when one of its classes -- or ``__all__`` -- is first asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .suite import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The suite's __all__ is the one list of its public classes; it is not
    # copied here, so a new topic is exported without touching this file.
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    suite = importlib.import_module(".suite", __name__)
    if name == "__all__":
        return list(suite.__all__)
    if name in suite.__all__:
        return getattr(suite, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
