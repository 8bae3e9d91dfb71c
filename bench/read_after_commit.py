"""What a PostgreSQL newest-20 read costs right after a commit, and why.

::

    .venv/bin/python -m bench.read_after_commit [--url URL] [--n 300]

``bench.physical_floor`` interleaves each side's append, turn and read, so
every timed read of the store follows one of its commits. This runs that same
interleaving four times; each time, after every commit of the store, one
untimed step prepares its next read:

- *nothing*: as ``bench.physical_floor`` runs;
- *decode*: the thread's root and newest page fetched by hand and decoded by
  the codec (the records the commit wrote are then decoded);
- *other read*: the store reads another thread (its read code has just run;
  the new records are still to decode);
- *same read*: the store reads the same thread (both).

Printed: the store's read and the physical floor's read (median ms) and their
ratio, for each.
"""

from __future__ import annotations

import argparse
import asyncio

from pai_storage import codec
from pai_storage.models import Message, ThreadRecord

from .physical_floor import SCOPE, Call, StoreSide, build, interleaved, postgres_sides

PREPARATIONS = ("nothing", "decode", "other read", "same read")


async def run(url: str, n: int) -> None:
    async with postgres_sides(url) as (store, pool, side, floor):
        other = StoreSide(store, "other", await build(store, "other"))

        async def decode() -> None:
            async with pool.acquire() as conn:
                rows = await conn.fetch(floor.read_sql, SCOPE.encode(), b"store")
            for row in rows:
                codec.decode(ThreadRecord if row["position"] is None else Message, row["doc"])

        prepare: dict[str, Call | None] = {
            "nothing": None,
            "decode": decode,
            "other read": other.read,
            "same read": side.read,
        }
        cases: dict[str, Call] = {
            "store append": side.append,
            "store turn": side.turn,
            "store read": side.read,
            "floor append": floor.append,
            "floor turn": floor.turn,
            "floor read": floor.read,
        }
        print(f"{'after each store commit':<24} {'store read':>10} {'floor read':>10} {'ratio':>6}")
        for name in PREPARATIONS:
            step = prepare[name]
            after = {"store append": step, "store turn": step} if step is not None else None
            med = await interleaved(cases, n, after=after)
            store_ms, floor_ms = med["store read"], med["floor read"]
            print(f"{name:<24} {store_ms:10.3f} {floor_ms:10.3f} {store_ms / floor_ms:5.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(run(args.url, args.n))
