"""Two real processes committing to one SQLite file at once.

Each process runs the optimistic loop an application runs (read the version,
commit against it, re-read on a conflict). Writers of both processes queue on
the database lock (``BEGIN IMMEDIATE`` with ``busy_timeout``), so no commit
fails for being concurrent: it either wins its version or reports a conflict.
Afterwards every message of both processes is stored once, and each version
of the thread has exactly one winner.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from pai_storage_sql import SqlThreadStore

from pai_storage import CommittedResult
from pai_storage import builders as b

pytestmark = pytest.mark.asyncio

APPENDS = 30
RACES = 10

WORKER = """
import asyncio, json, sys
from pai_storage import CommittedResult, ConflictResult
from pai_storage import builders as b
from pai_storage_sql import SqlThreadStore

async def main(url, name, appends, races):
    won, created = [], []
    async with SqlThreadStore(url, busy_timeout=60) as store:
        await store.initialize()
        print("ready", flush=True)
        sys.stdin.readline()  # both processes start together
        for k in range(races):
            result = await store.commit_thread(b.create("s", f"race-{k}", title=name))
            if isinstance(result, CommittedResult):
                created.append(k)
            else:
                assert isinstance(result, ConflictResult), result
        done = 0
        while done < appends:
            read = await store.read_thread(b.read("s", "t"))
            change = {"messages": [b.insert(b.message(f"{name}-{done}", name))]}
            result = await store.commit_thread(b.update(read.thread, change))
            if isinstance(result, CommittedResult):
                won.append(result.thread.version.revision)
                done += 1
            else:
                assert isinstance(result, ConflictResult), result
    print(json.dumps({"won": won, "created": created}), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


async def test_two_processes_lose_nothing_and_win_each_version_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shared.db"
    async with SqlThreadStore(url) as store:
        created = await store.commit_thread(b.create("s", "t"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        first = created.thread.version.revision
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            url,
            name,
            str(APPENDS),
            str(RACES),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for name in ("p1", "p2")
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    outputs = [await proc.communicate() for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    results = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]

    won = sorted(r for result in results for r in result["won"])
    # Exactly one winner per version: every revision after the create, once.
    assert won == list(range(first + 1, first + 1 + 2 * APPENDS))
    created_by = sorted(k for result in results for k in result["created"])
    assert created_by == list(range(RACES))

    async with SqlThreadStore(url) as store:
        read = await store.read_thread(
            b.read("s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 100}})
        )
        assert read.thread is not None
        assert read.thread.version.revision == first + 2 * APPENDS
        assert read.messages is not None
        stored = sorted(m.message_id for m in read.messages.items)
        expected = sorted(f"{name}-{i}" for name in ("p1", "p2") for i in range(APPENDS))
        assert stored == expected
        for k in range(RACES):
            race = await store.read_thread(b.read("s", f"race-{k}"))
            assert race.thread is not None
            assert race.thread.version.revision == 1
