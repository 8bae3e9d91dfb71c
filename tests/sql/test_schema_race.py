"""Several real processes preparing the schema of a fresh database at once.

Each process connects (which creates the tables and records the schema
version) at the same moment on a fresh SQLite file or a fresh MariaDB table
prefix. Every one succeeds, and the version is recorded once.

Turning a fresh SQLite file to WAL is the step where they collide: SQLite
refuses a connection that read the file and must then wait for another's write
at once, without its busy handler; the last test holds that lock on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pai_storage_sql.schema import SCHEMA_VERSION
from sqlalchemy import select

from pai_storage.errors import ThreadStoreUnavailableError

from .conftest import Target

pytestmark = pytest.mark.asyncio

PROCESSES = 3

WORKER = """
import asyncio, sys
from pai_storage_sql.client import SqlClient

async def main(url, prefix):
    client = SqlClient.attached(url, table_prefix=prefix, busy_timeout=60)
    try:
        print("ready", flush=True)
        sys.stdin.readline()  # every process starts together
        await client.ready()
        print("prepared", flush=True)
    finally:
        await client.release()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_processes_preparing_a_fresh_database_at_once(target: Target) -> None:
    prefix = target.options.get("table_prefix", "pai_threads")
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WORKER,
            target.url,
            prefix,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert (await worker.stdout.readline()).strip() == b"ready"
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        await worker.stdin.drain()
    outcomes = [await worker.communicate() for worker in workers]
    for worker, (out, err) in zip(workers, outcomes, strict=True):
        assert worker.returncode == 0, err.decode()
        assert out.strip() == b"prepared"
    client = target.client()
    try:
        engines = await client.ready()
        async with engines.writer.connect() as conn:
            rows = (await conn.execute(select(client.tables.version.c.version))).all()
        assert [tuple(row) for row in rows] == [(SCHEMA_VERSION,)]
    finally:
        await client.release()


@contextlib.contextmanager
def another_writer(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection writing the fresh file (not committed yet): SQLite
    refuses the turn to WAL at once while it does."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("CREATE TABLE app (x)")
        yield other
    finally:
        other.close()


async def test_a_connection_waits_for_another_turning_the_file_to_wal(
    sqlite_target: Target, tmp_path: Path
) -> None:
    with another_writer(tmp_path / "pai.db") as other:
        client = sqlite_target.client(busy_timeout=30)
        preparing = asyncio.create_task(client.ready())
        await asyncio.sleep(0.3)
        assert not preparing.done()  # waiting for the lock, not refused at once
        other.execute("COMMIT")
        await asyncio.wait_for(preparing, timeout=30)
        async with (await client.ready()).writer.connect() as conn:
            mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar_one()
        assert mode == "wal"
        await client.release()


async def test_the_wal_step_gives_up_after_busy_timeout(
    sqlite_target: Target, tmp_path: Path
) -> None:
    with another_writer(tmp_path / "pai.db"):
        client = sqlite_target.client(busy_timeout=0.2)
        with pytest.raises(ThreadStoreUnavailableError, match="past busy_timeout"):
            await asyncio.wait_for(client.ready(), timeout=30)
        await client.release()
