"""Test provisioning for the snapshot stores: a temporary directory, an emulated S3.

:class:`MotoServer` runs moto's standalone S3 emulator (``moto[server]``, a
test-only dependency) in a child process on a free loopback port: the tests
speak real S3 over HTTP to it, and the data it holds stays out of the test
process (whose memory the large-snapshot tests measure).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from pai_storage_conformance.provision import TestHarness

from pai_storage.backend import Clock
from pai_storage.errors import ThreadStoreConfigurationError

__all__ = ["FilesHarness", "MotoServer", "S3Harness"]

ACCESS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
"""Credentials the emulator accepts (any would do: it checks none)."""


class MotoServer:
    """moto's S3 emulator in a child process on ``127.0.0.1`` (start, create buckets, stop)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self) -> dict[str, str]:
        """The store options that reach this server."""
        return {"endpoint": self.endpoint, **ACCESS}

    def start(self, timeout: float = 60.0) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ThreadStoreConfigurationError(
                    "moto's S3 server exited at start: pip install 'moto[server]'"
                )
            with suppress(OSError), urllib.request.urlopen(self.endpoint, timeout=2):
                return
            time.sleep(0.1)
        self.stop()
        raise ThreadStoreConfigurationError(f"moto's S3 server did not start in {timeout} s")

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


class _SnapshotsHarness(TestHarness):
    components = frozenset({"snapshots"})

    def store(self, clock: Clock | None = None) -> Any:
        raise LookupError(f"{type(self).__name__} provides snapshots only")

    def _url(self) -> str:
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        return {}

    @asynccontextmanager
    async def component(self, name: str, clock: Clock | None = None) -> AsyncIterator[Any]:
        from pai_storage.bundle import open_snapshot_store

        if name != "snapshots":
            raise LookupError(f"{type(self).__name__} provides snapshots only")
        async with open_snapshot_store(self._url(), clock=clock, **self._options()) as store:
            yield store


class FilesHarness(_SnapshotsHarness):
    """Each store is a fresh subdirectory of ``url``'s directory (else a temporary one)."""

    def __init__(self, url: str | None = None) -> None:
        self._given = url
        self._root: Path | None = None

    async def start(self) -> None:
        if self._given:
            self._root = Path(self._given.removeprefix("file://"))
            self._root.mkdir(parents=True, exist_ok=True)
        else:
            self._root = Path(tempfile.mkdtemp(prefix="pai-snapshots-"))

    async def aclose(self) -> None:
        if self._root is not None and not self._given:
            shutil.rmtree(self._root, ignore_errors=True)

    def _url(self) -> str:
        assert self._root is not None
        return f"file://{self._root}/{uuid.uuid4().hex}"

    def describe(self) -> str:
        return f"files ({self._root})"


class S3Harness(_SnapshotsHarness):
    """Each store is a fresh prefix of a bucket: ``url``'s, else moto's emulator.

    With a URL (``s3://bucket``), the endpoint and credentials come from the
    environment (``AWS_ENDPOINT_URL``, ...) and the bucket must exist.
    """

    def __init__(self, url: str | None = None) -> None:
        self._given = url
        self._server: MotoServer | None = None
        self._bucket = f"pai-test-{uuid.uuid4().hex[:12]}"

    async def start(self) -> None:
        if self._given:
            return
        self._server = MotoServer()
        self._server.start()
        self._server.create_bucket(self._bucket)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.stop()

    def _url(self) -> str:
        base = self._given.rstrip("/") if self._given else f"s3://{self._bucket}"
        return f"{base}/{uuid.uuid4().hex}"

    def _options(self) -> dict[str, Any]:
        return self._server.options() if self._server is not None else {}

    def describe(self) -> str:
        where = self._server.endpoint if self._server else os.environ.get("AWS_ENDPOINT_URL")
        return f"s3 ({where or 'AWS'})"
