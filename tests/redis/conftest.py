"""Fixtures for the Redis backend's own tests: real servers, never mocks.

``redis_url`` is the shared server (``PAI_TEST_REDIS_URL``, default
``redis://127.0.0.1:6379/15``); every test's stores use their own key prefix
(:func:`prefix`), removed afterwards. ``redis_server_factory`` makes
throwaway servers (:class:`redis_servers.RedisServer`: ``redis-server`` on a
free loopback port, data in a temporary directory) for the tests that kill and
restart one.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

pytest.importorskip("redis")

# tests/ (for support.proxy): this directory has no __init__.py, so no package
# basedir puts it on the path; a directory named redis without one never hides
# redis-py there.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pai_storage_redis.harness import drop_prefix
from redis_servers import RedisServer

from pai_storage import make_url

URL = os.environ.get("PAI_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def redis_url() -> str:
    return URL


@pytest_asyncio.fixture
async def prefix() -> AsyncIterator[str]:
    """A fresh key prefix on the shared server; its keys are deleted afterwards."""
    name = f"pai-rtest-{uuid.uuid4().hex[:12]}:"
    yield name
    await drop_prefix(make_url(URL), name)


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[type[RedisServer]]:
    started: list[RedisServer] = []

    class _Server(RedisServer):
        def __init__(self, *config: str) -> None:
            super().__init__(tmp_path, *config)
            started.append(self)

    yield _Server
    for server in started:
        server.kill()
