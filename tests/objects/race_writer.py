"""One writer process of the two-process test: puts snapshots of one scope, again and again.

Usage: ``python race_writer.py URL WRITER ROUNDS [OPTIONS_JSON]``. Each snapshot's
data is a pattern derived from ``(writer, round)`` alone and its metadata names
them, so a reader can tell a whole snapshot from a torn or mixed one.
"""

from __future__ import annotations

import asyncio
import json
import sys

from pai_storage.bundle import open_snapshot_store

IDS = ("a", "b", "c")


def payload(writer: int, round_: int) -> bytes:
    """The data of ``(writer, round)``: a few MiB (multipart on S3), its size varying."""
    unit = f"<writer {writer} round {round_}>".encode()
    size = (1 + (writer * 7 + round_) % 5) * 1024 * 1024 + writer * 1000 + round_
    return (unit * (size // len(unit) + 1))[:size]


async def main(url: str, writer: int, rounds: int, options: dict[str, str]) -> None:
    async with open_snapshot_store(url, **options) as store:
        for round_ in range(rounds):
            for snapshot_id in IDS:
                meta = {"writer": writer, "round": round_}
                await store.put("shared", snapshot_id, payload(writer, round_), metadata=meta)
            if round_ % 3 == 2:
                await store.delete("shared", IDS[round_ % len(IDS)])


if __name__ == "__main__":
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), extra))
