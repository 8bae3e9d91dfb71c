"""A throwaway PostgreSQL primary with a synchronous hot standby (Debian's cluster tools).

:class:`StandbyPair` makes two clusters with ``pg_createcluster`` (the newest
version under ``/etc/postgresql``) on free loopback ports, trust authentication
on loopback only. The standby is a ``pg_basebackup`` of the primary that
streams from it, and the primary names it in ``synchronous_standby_names``, so
a commit is acknowledged only once the standby has flushed it. Servers run as
the ``postgres`` user; the commands are run as root (or as ``postgres``).
:meth:`StandbyPair.drop` removes both clusters (``pg_dropcluster --stop``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import time
import uuid
from contextlib import suppress
from pathlib import Path

from failover.mongo_cluster import free_port

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


class StandbyPair:
    """A primary and its synchronous hot standby; see the module docstring."""

    def __init__(self) -> None:
        version = pg_version()
        tag = uuid.uuid4().hex[:8]
        self.primary = Cluster(version, f"pai_failover_{tag}_a")
        self.standby = Cluster(version, f"pai_failover_{tag}_b")

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
        self.standby.create(
            {
                **common,
                "hot_standby": "on",
                "primary_conninfo": (
                    f"'host=127.0.0.1 port={self.primary.port} user=postgres "
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
        # Only now that the standby streams: before, every commit would wait for it.
        self.primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        self.primary.psql("SELECT pg_reload_conf()")
        self.wait_synchronous()

    def wait_synchronous(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            state = self.primary.psql(
                "SELECT sync_state FROM pg_stat_replication "
                f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'"
            )
            if state == "sync":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not a streaming synchronous standby: {state!r}")
            time.sleep(0.2)

    def stop_primary(self) -> None:
        """``pg_ctlcluster ... stop -m immediate``: no checkpoint, clients cut off."""
        self.primary.ctl("stop", "-m", "immediate")

    def pause_standby(self) -> None:
        """SIGSTOP the standby: the primary's commits wait for it (synchronous)."""
        self.standby.signal(signal.SIGSTOP)

    def resume_standby(self) -> None:
        self.standby.signal(signal.SIGCONT)

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
        for cluster in (self.standby, self.primary):
            with suppress(Exception):
                cluster.signal(signal.SIGCONT)
            try:
                cluster.drop()
            except Exception as exc:
                errors.append(str(exc))
        if errors:
            raise RuntimeError("; ".join(errors))
