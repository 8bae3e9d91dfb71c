"""Collected by ``pytest --pai-backend=NAME``: every topic class of the suite.

The asyncio mark is set here, so the suite runs the same under pytest-asyncio's
strict mode (a third party's default) as under this project's auto mode.
"""

import pytest
from pai_storage_conformance.suite import *  # noqa: F403

pytestmark = pytest.mark.asyncio
