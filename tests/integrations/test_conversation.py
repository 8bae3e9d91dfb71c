"""The conversation handle on every backend: writers in several processes on one thread, and
a follower in another process that sees a streamed reply grow to its final text."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pai_storage

from .conftest import Target

MESSAGES = 15
CHUNKS = 40

WORKER = """
import asyncio, json, sys
import pai_storage

async def main(url, options, name, count):
    async with pai_storage.connect(url, **options) as stores:
        chat = stores.threads.conversation("tenant-42", "shared")
        print("ready", flush=True)
        sys.stdin.readline()  # every writer starts together
        for i in range(count):
            await chat.add("user", f"{name}-{i}")
    print("done", flush=True)

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
"""

FOLLOWER = """
import asyncio, json, sys
import pai_storage

async def main(url, options):
    async with pai_storage.connect(url, **options) as stores:
        chat = stores.threads.conversation("tenant-42", "followed")
        async for m in chat.follow(interval=0.01):
            print(json.dumps({"id": m.message_id, "text": m.text, "status": m.status}), flush=True)

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
"""


async def test_the_ten_line_loop(stores: pai_storage.Stores) -> None:
    chat = stores.threads.conversation("tenant-42", "chat-1")
    await chat.add("user", "What is the capital of France?")
    async with chat.reply() as answer:
        for chunk in ("The capital ", "is ", "Paris."):
            await answer.write(chunk)
    shown = [(m.role, m.text) for m in await chat.messages(last=20)]
    assert shown == [
        ("user", "What is the capital of France?"),
        ("assistant", "The capital is Paris."),
    ]


async def test_three_writers_in_two_processes_lose_nothing_and_keep_their_order(
    durable_target: Target, tmp_path: Path
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WORKER)
    options = json.dumps(durable_target.options)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            durable_target.url,
            options,
            name,
            str(MESSAGES),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for name in ("p1", "p2")
    ]
    async with durable_target.connect() as stores:
        chat = stores.threads.conversation("tenant-42", "shared")
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            if line.strip() != b"ready":
                assert proc.stderr is not None
                raise AssertionError((await proc.stderr.read()).decode())
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        for i in range(MESSAGES):  # the third writer, in this process
            await chat.add("user", f"here-{i}")
        outputs = [await asyncio.wait_for(proc.communicate(), 300) for proc in procs]
        for proc, (_, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err.decode()
        texts = [m.text for m in await chat.messages(last=None)]
        writers = ("p1", "p2", "here")
        assert sorted(texts) == sorted(f"{w}-{i}" for w in writers for i in range(MESSAGES))
        for writer in writers:
            mine = [t for t in texts if t.startswith(f"{writer}-")]
            assert mine == [f"{writer}-{i}" for i in range(MESSAGES)]
        thread = await chat.get()
        assert thread is not None
        assert thread.version.revision == 3 * MESSAGES


async def test_a_follower_in_another_process_sees_the_reply_grow_to_its_final_text(
    durable_target: Target, tmp_path: Path
) -> None:
    script = tmp_path / "follower.py"
    script.write_text(FOLLOWER)
    async with durable_target.connect() as stores:
        chat = stores.threads.conversation("tenant-42", "followed", flush_every=0)
        await chat.add("user", "tell me a long story")
        async with chat.reply() as answer:
            await answer.write("chunk 0 ")  # committed: flush_every=0
            follower = await asyncio.create_subprocess_exec(
                *(sys.executable, str(script), durable_target.url),
                json.dumps(durable_target.options),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            assert follower.stdout is not None
            first = await asyncio.wait_for(follower.stdout.readline(), 120)
            if not first:
                assert follower.stderr is not None
                raise AssertionError((await follower.stderr.read()).decode())
            for i in range(1, CHUNKS):
                await answer.write(f"chunk {i} ")
                await asyncio.sleep(0.002)
        out, err = await asyncio.wait_for(follower.communicate(), 120)  # it ends by itself
    assert follower.returncode == 0, err.decode()
    seen: list[dict[str, Any]] = [json.loads(line) for line in [first, *out.splitlines()]]
    final = "".join(f"chunk {i} " for i in range(CHUNKS))
    assert seen[0] == {"id": answer.message_id, "text": "chunk 0 ", "status": "streaming"}
    assert seen[-1] == {"id": answer.message_id, "text": final, "status": "complete"}
    assert all(s["status"] == "streaming" for s in seen[:-1])
    for one, two in itertools.pairwise(seen):
        assert two["text"].startswith(one["text"])
        assert two != one
