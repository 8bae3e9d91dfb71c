"""Following a streamed reply from outside the process: ``pai-storage watch --follow``
and the server-sent-events example of ``docs/examples/sse_follow.py``, driven by a
real HTTP client against a real server on a loopback port."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from pai_storage_memory import MemoryThreadStore

import pai_storage
from pai_storage.cli import main
from pai_storage.models import ReadThreadInput, ThreadReadResult

HANG_GUARD = 120.0  # seconds: reached only when a follower misses the end of a reply
CHUNKS = 30
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "sse_follow.py"


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


class _CountingReads(MemoryThreadStore):
    """A memory store (whose watchers are told what changed) that counts message reads."""

    message_reads = 0

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        if request.include is not None and request.include.messages is not None:
            self.message_reads += 1
        return await super()._read_thread(request)


async def test_a_follower_reads_only_for_changes_that_can_concern_its_reply() -> None:
    store = _CountingReads()
    chat = store.conversation("s", "t", flush_every=0)
    other = store.conversation("s", "t")
    async with chat.reply() as answer:
        await answer.write("a")
        records = store.conversation("s", "t").follow(interval=3600)  # woken by the signal only
        assert (await anext(records)).text == "a"
        following = asyncio.create_task(_all(records))
        reads = store.message_reads
        for i in range(10):  # messages joining the run: the reply's message is not in them
            await other.add("user", f"aside {i}")
            await asyncio.sleep(0)
        assert store.message_reads == reads
        await answer.write("b")
    async with asyncio.timeout(HANG_GUARD):
        rest = await following
    assert [(m.text, m.status) for m in rest][-1] == ("ab", "complete")
    assert store.message_reads <= reads + 2  # the chunk and the close (maybe coalesced)


async def _all(records: AsyncIterator[pai_storage.Message]) -> list[pai_storage.Message]:
    return [record async for record in records]


# ---------------------------------------------------------------- the SSE example


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """The example running in its own process on a loopback port: (its URL, its store URL)."""
    store_url = f"sqlite:///{tmp_path}/chat.db"
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, str(EXAMPLE), "--url", store_url, "--port", str(port)),
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as client, asyncio.timeout(HANG_GUARD):
            while True:  # until it answers
                if proc.returncode is not None:
                    assert proc.stderr is not None
                    raise AssertionError((await proc.stderr.read()).decode())
                try:
                    if (await client.get(base + "/")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
        yield base, store_url
    finally:
        proc.terminate()
        await proc.wait()


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The server-sent events of a streaming response: (event name, JSON data)."""
    name, data = "message", ""
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line.partition(":")[2].strip()
        elif line.startswith("data:"):
            data += line.partition(":")[2].strip()
        elif not line and data:
            yield name, json.loads(data)
            name, data = "message", ""


def _check_stream(seen: list[tuple[str, dict[str, Any]]], message_id: str, final: str) -> None:
    """``message`` events of one growing answer, then ``done`` with its final record."""
    *growing, done = seen
    assert done == ("done", {"messageId": message_id, "status": "complete", "text": final})
    assert growing[-1] == ("message", done[1])
    assert {name for name, _ in growing} == {"message"}
    assert {data["messageId"] for _, data in growing} == {message_id}
    for (_, one), (_, two) in itertools.pairwise(growing):
        assert two["text"].startswith(one["text"])
        assert two != one


async def test_a_second_tab_follows_an_answer_streamed_by_another_process(
    server: tuple[str, str],
) -> None:
    base, store_url = server
    async with pai_storage.open_store(store_url) as store:  # the writer: not the server
        chat = store.conversation("demo", "chat-1", flush_every=0)
        await chat.add("user", "tell me a story")
        async with httpx.AsyncClient(timeout=HANG_GUARD) as tab, AsyncExitStack() as later:
            async with chat.reply() as answer:
                await answer.write("chunk 0 ")  # committed (flush_every=0) before the tab opens
                response = await tab.send(tab.build_request("GET", base + "/follow"), stream=True)
                later.push_async_callback(response.aclose)  # the stream outlives the reply
                assert response.headers["content-type"].startswith("text/event-stream")
                events = _events(response)
                seen = [await anext(events)]  # the tab joins while the answer streams
                for i in range(1, CHUNKS):
                    await answer.write(f"chunk {i} ")
            async with asyncio.timeout(HANG_GUARD):
                seen += [event async for event in events]  # the server ends the stream
    assert seen[0] == (
        "message",
        {"messageId": answer.message_id, "status": "streaming", "text": "chunk 0 "},
    )
    _check_stream(seen, answer.message_id, "".join(f"chunk {i} " for i in range(CHUNKS)))


async def test_the_page_asks_and_every_tab_follows_the_next_answer(
    server: tuple[str, str],
) -> None:
    base, store_url = server
    async with (
        httpx.AsyncClient(base_url=base, timeout=HANG_GUARD) as first,
        httpx.AsyncClient(base_url=base, timeout=HANG_GUARD) as second,
    ):
        page = await second.get("/")
        assert "EventSource" in page.text
        asked = await first.post("/ask", json={"text": "who keeps the words?"})
        assert asked.status_code == 200, asked.text
        message_id = asked.json()["messageId"]
        busy = await first.post("/ask", json={"text": "and then?"})
        assert busy.status_code == 409  # one answer at a time
        async with second.stream("GET", "/follow") as response, asyncio.timeout(HANG_GUARD):
            seen = [event async for event in _events(response)]
        _check_stream(seen, message_id, seen[-1][1]["text"])
        assert seen[-1][1]["text"].startswith("You asked: who keeps the words?. Once upon")

        # The tab shown that answer: it follows the next one.
        async with (
            second.stream("GET", "/follow", params={"newerThan": message_id}) as response,
            asyncio.timeout(HANG_GUARD),
        ):
            events = _events(response)
            again = await first.post("/ask", json={"text": "and then?"})
            assert again.status_code == 200, again.text
            following = [event async for event in events]
        _check_stream(following, again.json()["messageId"], following[-1][1]["text"])
    async with pai_storage.open_store(store_url) as store:
        stored = await store.conversation("demo", "chat-1").messages(last=None)
    assert [(m.role, m.status) for m in stored] == [
        ("user", "complete"),
        ("assistant", "complete"),
        ("user", "complete"),
        ("assistant", "complete"),
    ]
    assert stored[1].text == seen[-1][1]["text"]
    assert stored[3].text == following[-1][1]["text"]
