"""The second part of ``pai-storage demo``: one agent turn using all five stores.

A worker takes the sandbox's execution guard, loads the session's agent state,
reads the workspace files from the key-value store, records the turn on its
thread, snapshots the sandbox, appends to the session history and releases
the guard. Then the same worker takes the guard again and freezes: its lease
expires, a second worker takes over with a higher fencing token, and the first
one finds its lock lost and its fencing token refused. See ``docs/bundle.md``.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import uuid
from datetime import timedelta
from typing import TextIO

from . import builders as b
from .bundle import Stores
from .clock import ManualClock
from .errors import StorageError

__all__ = ["RuntimeDemo"]


class _DemoFailure(StorageError):
    """A store did not behave as the contract says (the demo checks as it goes)."""


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise _DemoFailure(what)


def _tarball(files: dict[str, str]) -> bytes:
    """The sandbox workspace as a tar archive (what a sandbox snapshot holds)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class RuntimeDemo:
    """Plays the runtime part of the demo on a fresh sandbox, user and scope."""

    def __init__(self, stores: Stores, out: TextIO, clock: ManualClock | None) -> None:
        self.stores = stores
        self.out = out
        self.clock = clock
        run = uuid.uuid4().hex[:12]
        self.sandbox = f"sandbox-{run}"
        self.user = f"user-{run}"
        self.session = "session-1"
        self.scope = f"demo-{run}"
        self.workspace = ("workspace", self.sandbox)
        self.step = 0

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def title(self, text: str) -> None:
        self.step += 1
        self.say()
        self.say(f"{self.step:>2}. {text}")

    def detail(self, label: str, text: str) -> None:
        self.say(f"    {label:<12}{text}")

    async def run(self) -> None:
        self.say()
        self.say(f"Part 2: one agent turn with every store ({self.stores!r})")
        try:
            await self.turn()
            await self.takeover()
        finally:
            await self.cleanup()

    async def turn(self) -> None:
        stores = self.stores
        self.title("The workspace holds two files (key-value store)")
        files = {"README.md": "# Trip planner\n", "plan.py": "print('Paris')\n"}
        for name, text in files.items():
            await stores.kv.put(self.workspace, name, text)
        page = await stores.kv.search(self.workspace)
        self.detail("files", ", ".join(f"{i.key} (v{i.version})" for i in page.items))

        self.title("worker-1 takes the sandbox's execution guard")
        lock = await stores.guard.acquire(self.sandbox, owner="worker-1")
        self.detail("lock", f"fencing token {lock.fencing_token}, expires {lock.expires_at:%X}")

        self.title("It loads the session's agent state (none yet) and saves a plan")
        current = await stores.state.get_versioned(self.user, self.session, "plan")
        self.detail("plan", "none" if current is None else f"v{current.version}")
        version = await stores.state.save_if_version(
            self.user, self.session, "plan", {"goal": "capitals", "step": 1}, 0
        )
        _expect(version == 1, "a first save_if_version(expected 0) gives version 1")
        self.detail("saved", f"plan v{version}")

        self.title("It records the turn on the conversation thread (thread store)")
        created = await stores.threads.commit_thread(
            b.create(
                self.scope,
                "chat-1",
                {
                    "messages": [
                        {"type": "insert", "record": b.message("m1", "Plan my trip", run_id="r1")}
                    ],
                    "runs": [{"type": "insert", "record": b.run("r1", inputs=["m1"])}],
                },
            )
        )
        _expect(created.type == "committed", "the thread is created")
        self.detail("thread", "chat-1 at revision 1, run r1 running")

        self.title("It snapshots the sandbox workspace (snapshot store)")
        archive = _tarball(files)
        # Streamed from a file object: a workspace of any size takes one chunk of
        # memory on a store that keeps chunks (connect(url, snapshots="s3://...")).
        info = await stores.snapshots.put(self.scope, "after-turn-1", io.BytesIO(archive))
        _expect(info.sha256 == hashlib.sha256(archive).hexdigest(), "the digest matches")
        self.detail(
            "snapshot",
            f"{info.size} bytes, sha256 {info.sha256[:12]}... (on {stores.snapshots.backend_name})",
        )
        reader = await stores.snapshots.open(self.scope, "after-turn-1")
        _expect(reader is not None, "the snapshot can be opened")
        assert reader is not None
        async with reader:
            restored = b"".join([chunk async for chunk in reader])  # verified as it is read
        _expect(restored == archive, "the snapshot streams back exactly")
        self.detail("restore", "read back in verified chunks")

        self.title("It appends the turn to the session history and releases the guard")
        length = await stores.state.append_list(
            self.user, self.session, "history", [{"role": "user", "text": "Plan my trip"}]
        )
        self.detail("history", f"{length} item(s)")
        _expect(await lock.release(), "the lock is released by its holder")
        _expect(await stores.guard.inspect(self.sandbox) is None, "the sandbox is free")
        self.detail("guard", "released; the sandbox is free")

    async def takeover(self) -> None:
        guard = self.stores.guard
        self.title("worker-1 takes the guard again, then freezes (its renewals stop)")
        first = await guard.acquire(self.sandbox, owner="worker-1", lease_ttl=timedelta(seconds=30))
        self.detail("worker-1", f"fencing token {first.fencing_token}")
        if self.clock is None:
            self.detail("skipped", "the takeover needs the test clock of memory://")
            await first.release()
            return
        self.clock.advance(timedelta(seconds=31))
        self.detail("clock", "+31 s: the 30 s lease ran out")

        self.title("worker-2 takes over with a higher fencing token")
        second = await guard.try_acquire(self.sandbox, owner="worker-2")
        _expect(second is not None, "an expired lock is free at once")
        assert second is not None
        _expect(second.fencing_token > first.fencing_token, "fencing tokens increase")
        self.detail("worker-2", f"fencing token {second.fencing_token}")

        self.title("worker-1 wakes up: its lock is lost, its writes are fenced off")
        renewed = await first.renew()
        _expect(not renewed and first.lost.is_set(), "the stale holder cannot renew")
        self.detail("worker-1", "renew refused; lock.lost is set")
        stale = first.fencing_token
        self.detail("downstream", f"rejects token {stale} < {second.fencing_token}: stale writer")
        _expect(not await first.release(), "the stale holder cannot release worker-2's lock")
        _expect(await second.release(), "worker-2 releases its own lock")

    async def cleanup(self) -> None:
        stores = self.stores
        for name in ("README.md", "plan.py"):
            await stores.kv.delete(self.workspace, name)
        await stores.state.delete(self.user, self.session)
        await stores.snapshots.delete(self.scope, "after-turn-1")
        read = await stores.threads.read_thread({"scopeKey": self.scope, "threadId": "chat-1"})
        if read.thread is not None:
            await stores.threads.commit_thread(b.delete(self.scope, "chat-1", read.thread.version))
