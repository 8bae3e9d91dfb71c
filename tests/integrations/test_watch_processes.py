"""Watching on every backend another process can open: a watcher in another process sees
every committed version of a thread streamed by 200 chunk commits, in order, ending at the
final one (docs/watch.md)."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from .conftest import Target

CHUNKS = 200

WATCHER = """
import asyncio, json, sys
import pai_storage

async def main(url, options, after):
    async with pai_storage.connect(url, **options) as stores:
        changes = stores.threads.watch("tenant-42", "streamed", after=after, interval=0.02)
        print("ready", flush=True)
        async for change in changes:
            print(json.dumps(change.to_json()), flush=True)

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])))
"""


async def test_a_watcher_in_another_process_sees_every_version_of_200_chunk_commits(
    durable_target: Target, tmp_path: Path
) -> None:
    script = tmp_path / "watcher.py"
    script.write_text(WATCHER)
    async with durable_target.connect() as stores:
        chat = stores.threads.conversation("tenant-42", "streamed", flush_every=0)
        await chat.add("user", "tell me a long story")
        thread = await chat.get()
        assert thread is not None
        start = thread.version
        watcher = await asyncio.create_subprocess_exec(
            *(sys.executable, str(script), durable_target.url),
            *(json.dumps(durable_target.options), json.dumps(start.to_json())),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert watcher.stdout is not None
        assert watcher.stderr is not None
        try:
            line = await asyncio.wait_for(watcher.stdout.readline(), 120)
            if line.strip() != b"ready":
                raise AssertionError((await watcher.stderr.read()).decode())
            async with chat.reply() as answer:  # one commit per chunk (flush_every=0)
                for i in range(CHUNKS):
                    await answer.write(f"chunk {i} ")
            thread = await chat.get()
            assert thread is not None
            final = thread.version
            seen: list[dict[str, Any]] = []
            async with asyncio.timeout(120):
                while not seen or seen[-1]["version"] != final.to_json():
                    line = await watcher.stdout.readline()
                    if not line:
                        raise AssertionError((await watcher.stderr.read()).decode())
                    seen.append(json.loads(line))
        finally:
            watcher.terminate()
            await watcher.wait()
    assert final.revision >= start.revision + CHUNKS  # every chunk was its own commit
    revisions = [change["version"]["revision"] for change in seen]
    assert revisions == sorted(set(revisions))  # strictly increasing, none twice
    assert seen[0]["previous"] == start.to_json()
    for one, two in itertools.pairwise(seen):
        assert two["previous"] == one["version"]  # every commit is inside some change
    assert sum(change["commits"] for change in seen) == final.revision - start.revision
    assert not any(change["deleted"] for change in seen)
