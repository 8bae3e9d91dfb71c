"""Following a streamed reply from outside the process: ``pai-storage watch --follow``
and the server-sent-events example of ``docs/examples/sse_follow.py``, driven by a
real HTTP client against a real server on a loopback port."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import pai_storage
from pai_storage.cli import main

HANG_GUARD = 120.0  # seconds: reached only when a follower misses the end of a reply
CHUNKS = 30


def test_the_command_refuses_after_with_follow(capsys: pytest.CaptureFixture[str]) -> None:
    version = json.dumps({"threadInstanceId": "i", "revision": 1})
    assert main(["watch", "memory://", "s", "t", "--follow", "--after", version]) == 1
    assert "--after does not apply to --follow" in capsys.readouterr().err


async def test_the_command_follows_a_reply_from_another_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/follow.db"
    async with pai_storage.open_store(url) as store:
        chat = store.conversation("tenant", "chat", flush_every=0)
        await chat.add("user", "tell me a long story")
        async with chat.reply() as answer:
            await answer.write("chunk 0 ")
            follower = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "pai_storage", "watch", url, "tenant", "chat"),
                *("--follow", "--interval", "0.01"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            assert follower.stdout is not None
            first = await asyncio.wait_for(follower.stdout.readline(), HANG_GUARD)
            assert first, "the follower printed nothing"
            for i in range(1, CHUNKS):
                await answer.write(f"chunk {i} ")
        out, err = await asyncio.wait_for(follower.communicate(), HANG_GUARD)
    assert follower.returncode == 0, err.decode()
    seen: list[dict[str, Any]] = [json.loads(line) for line in [first, *out.splitlines()]]
    assert {m["messageId"] for m in seen} == {answer.message_id}
    shown = [("".join(p["text"] for p in m["parts"]), m["status"]) for m in seen]
    assert shown[0] == ("chunk 0 ", "streaming")
    assert shown[-1] == ("".join(f"chunk {i} " for i in range(CHUNKS)), "complete")
