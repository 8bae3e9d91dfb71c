"""Instructions per operation of the PostgreSQL backend and its asyncpg floor.

One command, prints a table::

    .venv/bin/python bench/instructions.py [--url postgresql://postgres@127.0.0.1/test]

Wall-clock ratios on a shared machine move by 0.1-0.2x between runs of the
same code. The instructions a process executes do not: valgrind's callgrind
counts the same total for the same run whatever else the machine does. Each
case (the store's append of one message and its read of the newest 20, and
the same statements through raw asyncpg: ``bench/postgres_bench.py``'s
floor) runs in a child process under callgrind twice, with 0 and with
``--ops`` operations after the same setup and warm-up; the difference
divided by ``--ops`` is the cost of one operation in this process. The
database server is another process and is not counted.

Instructions are not time: the store's read executes as many as its floor's
and still takes longer (``docs/performance.md``, "Costs counted in
instructions"). Use this to see what a change to the store's own code
removes, next to the wall-clock benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from pai_storage_postgres import PostgresThreadStore
from pai_storage_postgres.store import SESSION_SETTINGS, keep_session

from pai_storage import CommittedResult, make_url
from pai_storage import builders as b

sys.path.insert(0, str(Path(__file__).parent))
from postgres_bench import FLOOR_SCOPE, SCOPE, Floor, build_thread, close_and_drop

CASES = ("append", "append-floor", "read", "read-floor")
WARMUP = 30


async def child(url: str, case: str, ops: int) -> None:
    """Set up, warm every case up, then run ``ops`` operations of one case."""
    schema = f"pai_instr_{uuid.uuid4().hex[:10]}"
    store = PostgresThreadStore(url, schema=schema, max_pool_size=2)
    await store.initialize()
    dsn = make_url(url).render(hide_password=False, scheme="postgresql")
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=2, server_settings=dict(SESSION_SETTINGS), reset=keep_session
    )
    try:
        version = await build_thread(store, "t", 10)
        await build_thread(store, "floor", 10, FLOOR_SCOPE)
        floor = Floor(pool, store)

        async def append() -> None:
            nonlocal version
            msg = b.message(uuid.uuid4().hex, "answer " * 40, role="assistant")
            result = await store.commit_thread(
                b.update_at(SCOPE, "t", version, {"messages": [b.insert(msg)]}, root=b.root())
            )
            assert isinstance(result, CommittedResult)
            assert result.thread is not None
            version = result.thread.version

        async def read() -> None:
            page = {"type": "page", "view": "transcript", "order": "newest"}
            result = await store.read_thread(
                b.read(SCOPE, "t", messages={**page, "page": {"limit": 20}})
            )
            assert result.messages is not None

        run: dict[str, Any] = {
            "append": append,
            "append-floor": lambda: floor.append("floor"),
            "read": read,
            "read-floor": lambda: floor.read_newest("t"),
        }
        for _ in range(WARMUP):
            for fn in run.values():
                await fn()
        for _ in range(ops):
            await run[case]()
    finally:
        await close_and_drop(pool, store, dsn, schema)


def counted(url: str, case: str, ops: int) -> int:
    """Instructions callgrind counted for one child run."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--url",
                url,
                "--child",
                case,
                "--ops",
                str(ops),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{case} ({ops} operations) failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1/test")
    parser.add_argument("--ops", type=int, default=100, help="operations per counted run")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        asyncio.run(child(args.url, args.child, args.ops))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed (Debian: apt-get install valgrind)")
    runs = [(case, ops) for case in CASES for ops in (0, args.ops)]
    print(f"counting {len(runs)} runs under callgrind (a few minutes) ...", file=sys.stderr)
    with ThreadPoolExecutor(max_workers=2) as pool:  # children are CPU-bound; two at once
        totals = dict(zip(runs, pool.map(lambda r: counted(args.url, *r), runs), strict=True))
    per_op = {case: (totals[(case, args.ops)] - totals[(case, 0)]) / args.ops for case in CASES}
    print(f"\ninstructions per operation, PostgreSQL, a thread of 10 messages ({args.ops} ops)\n")
    print("| operation | pai-storage | asyncpg floor | vs floor |")
    print("| --- | ---: | ---: | ---: |")
    for case, label in (("append", "append 1 message"), ("read", "read newest 20")):
        ours, base = per_op[case], per_op[f"{case}-floor"]
        print(f"| {label} | {ours:,.0f} | {base:,.0f} | {ours / base:.2f}x |")


if __name__ == "__main__":
    main()
