"""Collected by ``pytest --pai-backend=NAME``: every topic class of the suite."""

from pai_storage_conformance.suite import *  # noqa: F403
