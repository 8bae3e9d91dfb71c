"""Several real processes preparing the schema of a fresh database at once.

Each process connects (which creates the tables and records the schema
version) at the same moment on a fresh SQLite file or a fresh MariaDB table
prefix. Every one succeeds, and the version is recorded once.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from pai_storage_sql.schema import SCHEMA_VERSION
from sqlalchemy import select

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
