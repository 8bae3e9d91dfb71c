"""A watcher in another process, and the checks of what it reported (docs/watch.md).

The push backends' tests (PostgreSQL ``NOTIFY``, MongoDB change streams) run
the same scenario: a writer streams a reply of many chunk commits while a
watcher in another process prints each change as a JSON line; the changes must
form an unbroken chain of strictly increasing versions ending at the final one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from typing import Any

from pai_storage import ThreadStore, ThreadVersion

__all__ = ["check_chain", "start_watcher", "stream_reply", "until_final"]

HANG_GUARD = 120.0  # seconds: reached only when the final version is never reported

# The watcher process: build the store from a JSON description, print each change.
_WATCHER = """
import asyncio, importlib, json, sys

async def main() -> None:
    spec = json.loads(sys.argv[1])
    module = importlib.import_module(spec["module"])
    store = getattr(module, spec["class"])(*spec["args"], **spec["kwargs"])
    async with store:
        changes = store.watch(spec["scope"], spec["thread"], after=spec["after"],
                              interval=spec["interval"])
        async for change in changes:
            print(json.dumps(change.to_json()), flush=True)

asyncio.run(main())
"""


async def start_watcher(
    store_class: type[ThreadStore],
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    scope: str,
    thread: str,
    after: ThreadVersion,
    interval: float,
) -> asyncio.subprocess.Process:
    """``store_class(*args, **kwargs).watch(...)`` in another process, printing JSON lines."""
    spec = {
        "module": store_class.__module__,
        "class": store_class.__qualname__,
        "args": args,
        "kwargs": kwargs,
        "scope": scope,
        "thread": thread,
        "after": after.to_json(),
        "interval": interval,
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WATCHER, json.dumps(spec), stdout=asyncio.subprocess.PIPE
    )


async def stream_reply(store: ThreadStore, scope: str, thread: str, chunks: int) -> ThreadVersion:
    """A reply of ``chunks`` chunk commits (``flush_every=0``); the final version."""
    chat = store.conversation(scope, thread, flush_every=0)
    async with chat.reply() as answer:
        for i in range(chunks):
            await answer.write(f"chunk {i} ")
    root = await chat.get()
    assert root is not None
    return root.version


async def until_final(
    watcher: asyncio.subprocess.Process, final: ThreadVersion
) -> list[dict[str, Any]]:
    """The watcher's changes up to the one reporting ``final``."""
    assert watcher.stdout is not None
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(HANG_GUARD):
        while not seen or seen[-1]["version"] != final.to_json():
            line = await watcher.stdout.readline()
            assert line, "the watcher ended"
            seen.append(json.loads(line))
    return seen


def check_chain(seen: list[dict[str, Any]], start: ThreadVersion, final: ThreadVersion) -> None:
    """Strictly increasing versions, each change starting where the last ended, start to final."""
    revisions = [c["version"]["revision"] for c in seen]
    assert revisions == sorted(set(revisions))
    assert seen[0]["previous"] == start.to_json()
    assert seen[-1]["version"] == final.to_json()
    for one, two in itertools.pairwise(seen):
        assert two["previous"] == one["version"]
    assert sum(c["commits"] for c in seen) == final.revision - start.revision
    assert not any(c["deleted"] for c in seen)
