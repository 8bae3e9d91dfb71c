"""A throwaway PostgreSQL primary with a hot standby (Debian's cluster tools).

:class:`StandbyPair` makes two clusters with ``pg_createcluster`` (the newest
version under ``/etc/postgresql``) on free loopback ports, trust authentication
on loopback only. The standby is a ``pg_basebackup`` of the primary that
streams from it through a :class:`ReplicationLink` (a fault proxy on a thread
of its own), so a test can cut the replication stream: the standby then
receives nothing more. By default the primary names the standby in
``synchronous_standby_names``, so a commit is acknowledged only once the
standby has flushed it; ``synchronous=False`` leaves it asynchronous (the
mutation the failover test must detect). Servers run as the ``postgres`` user;
the commands are run as root (or as ``postgres``). :meth:`StandbyPair.drop`
removes both clusters (``pg_dropcluster --stop``, then their configuration).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

from support.proxy import FaultProxy

from failover.mongo_cluster import free_port

T = TypeVar("T")

CONF_ROOT = Path("/etc/postgresql")
STANDBY_NAME = "failover_standby"
HBA = """\
local   all          all                 trust
local   replication  all                 trust
host    all          all   127.0.0.1/32  trust
host    replication  all   127.0.0.1/32  trust
"""


def pg_version() -> str:
    """The newest PostgreSQL major version with Debian cluster configuration."""
    versions = sorted(
        (entry.name for entry in CONF_ROOT.iterdir() if entry.name.isdigit()), key=int
    )
    if not versions or shutil.which("pg_createcluster") is None:
        raise RuntimeError("Debian's postgresql-common (pg_createcluster) is not installed")
    return versions[-1]


def _run(*args: str, user: str | None = None, timeout: float = 120) -> str:
    command = list(args)
    if user is not None and os.geteuid() == 0:
        command = ["runuser", "-u", user, "--", *command]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, cwd="/"
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-800:]}"
        )
    return done.stdout


class Cluster:
    """One Debian cluster (``<version>/<name>``) on a loopback port."""

    def __init__(self, version: str, name: str) -> None:
        self.version = version
        self.name = name
        self.port = free_port()
        self.created = False

    @property
    def conf_dir(self) -> Path:
        return CONF_ROOT / self.version / self.name

    @property
    def data_dir(self) -> Path:
        return Path("/var/lib/postgresql") / self.version / self.name

    def create(self, settings: dict[str, str]) -> None:
        self.created = True
        _run("pg_createcluster", self.version, self.name, "-p", str(self.port))
        (self.conf_dir / "pg_hba.conf").write_text(HBA, encoding="utf-8")
        lines = [f"{key} = {value}" for key, value in settings.items()]
        conf = self.conf_dir / "conf.d"
        conf.mkdir(exist_ok=True)
        (conf / "failover.conf").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def ctl(self, action: str, *extra: str) -> None:
        # Act on the cluster directly, not through systemd (which would also ignore "-m").
        _run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action, *extra)

    def psql(self, sql: str) -> str:
        return _run(
            "psql",
            "-X",
            "-A",
            "-t",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            sql,
        ).strip()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.psql("SELECT 1")
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def processes(self) -> list[int]:
        """The postmaster and every server process it started."""
        postmaster = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    status = (entry / "status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("PPid:") and int(line.split()[1]) == postmaster:
                        pids.append(int(entry.name))
        return pids

    def signal(self, signum: int) -> None:
        for pid in self.processes():
            with suppress(ProcessLookupError):
                os.kill(pid, signum)

    def drop(self) -> None:
        """``pg_dropcluster --stop``, then the configuration directory it leaves when
        it holds files it did not write (``conf.d/failover.conf``)."""
        if self.created:
            _run("pg_dropcluster", "--stop", self.version, self.name)
            self.created = False
        if self.conf_dir.is_dir():
            shutil.rmtree(self.conf_dir)


class ReplicationLink:
    """A :class:`FaultProxy` to the primary on an event loop of its own thread.

    The standby streams through it, whatever the test's own event loop is
    doing (a synchronous fixture, a busy load); :meth:`cut` cuts the stream
    and refuses the standby's reconnections until :meth:`restore`.
    """

    def __init__(self, primary_port: int) -> None:
        self._primary_port = primary_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._proxy: FaultProxy | None = None
        self.port = 0

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=30)

    def _call(self, action: Callable[[FaultProxy], None]) -> None:
        async def call() -> None:
            assert self._proxy is not None
            action(self._proxy)

        self._run(call())

    def start(self) -> int:
        async def start() -> int:
            self._proxy = FaultProxy(self._primary_port)
            return await self._proxy.start()

        self._thread.start()
        self.port = self._run(start())
        return self.port

    def cut(self) -> None:
        self._call(FaultProxy.cut)

    def restore(self) -> None:
        self._call(FaultProxy.restore)

    def stop(self) -> None:
        """Stop the proxy and its thread (idempotent)."""
        if not self._thread.is_alive():
            return
        if self._proxy is not None:
            self._run(self._proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


class StandbyPair:
    """A primary and its hot standby (synchronous unless told otherwise); see the
    module docstring."""

    def __init__(self, *, synchronous: bool = True) -> None:
        version = pg_version()
        tag = uuid.uuid4().hex[:8]
        self.synchronous = synchronous
        self.primary = Cluster(version, f"pai_failover_{tag}_a")
        self.standby = Cluster(version, f"pai_failover_{tag}_b")
        self.link = ReplicationLink(self.primary.port)

    @property
    def url(self) -> str:
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            "/test?target_session_attrs=read-write"
        )

    def start(self) -> None:
        atexit.register(self.drop)  # also when the run is interrupted
        common = {"listen_addresses": "'127.0.0.1'", "max_connections": "50"}
        self.primary.create({**common, "wal_level": "replica"})
        self.primary.ctl("start")
        self.primary.wait_ready()
        self.primary.psql("CREATE DATABASE test")
        self.link.start()
        self.standby.create(
            {
                **common,
                "hot_standby": "on",
                "primary_conninfo": (
                    f"'host=127.0.0.1 port={self.link.port} user=postgres "
                    f"application_name={STANDBY_NAME}'"
                ),
            }
        )
        data = self.standby.data_dir
        for entry in data.iterdir():  # keep the directory itself (owner, mode)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        _run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-D",
            str(data),
            "-X",
            "stream",
            "-c",
            "fast",
            user="postgres",
        )
        _run("touch", str(data / "standby.signal"), user="postgres")
        self.standby.ctl("start")
        self.standby.wait_ready()
        if self.synchronous:
            # Only now that the standby streams: before, every commit would wait for it.
            self.primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            self.primary.psql("SELECT pg_reload_conf()")
        self.wait_streaming()

    def wait_streaming(self, timeout: float = 60.0) -> None:
        """Wait until the standby streams, as a synchronous standby when it is one."""
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while True:
            state = self.primary.psql(
                "SELECT sync_state FROM pg_stat_replication "
                f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'"
            )
            if state == wanted:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not a streaming {wanted} standby: {state!r}")
            time.sleep(0.2)

    def stop_primary(self) -> None:
        """``pg_ctlcluster ... stop -m immediate``: no checkpoint, clients cut off."""
        self.primary.ctl("stop", "-m", "immediate")

    def cut_replication(self) -> None:
        """Cut the replication stream: the standby receives no more WAL (a synchronous
        primary's commits wait for it; an asynchronous one's are acknowledged alone)."""
        self.link.cut()

    def restore_replication(self) -> None:
        self.link.restore()

    def promote_standby(self) -> None:
        self.standby.ctl("promote")
        deadline = time.monotonic() + 60
        while self.standby.psql("SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not leave recovery")
            time.sleep(0.1)

    def drop(self) -> None:
        """Drop both clusters (idempotent)."""
        errors: list[str] = []
        with suppress(Exception):
            self.link.stop()
        for cluster in (self.standby, self.primary):
            with suppress(Exception):
                cluster.signal(signal.SIGCONT)
            try:
                cluster.drop()
            except Exception as exc:
                errors.append(str(exc))
        if errors:
            raise RuntimeError("; ".join(errors))
