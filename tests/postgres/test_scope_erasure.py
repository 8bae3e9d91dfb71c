"""Scope erasure on PostgreSQL: no row of the tenant is left in any table of the schema,
expired rows included, read with raw SQL (the scenario: ``support.erasure``)."""

from __future__ import annotations

from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from support.erasure import BUNDLE_OPTIONS, check_erasure

from pai_storage import ManualClock, connect

from .helpers import URL

pytestmark = pytest.mark.asyncio


async def _dump(conn: asyncpg.Connection, schema: str) -> dict[str, list[str]]:
    """Every row of every table of ``schema``, each as text, sorted."""
    tables = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
    )
    assert len(tables) >= 8  # the thread tables and the runtime tables
    out: dict[str, list[str]] = {}
    for row in tables:
        name = row["table_name"]
        rows = await conn.fetch(f'SELECT * FROM "{schema}"."{name}"')
        out[name] = sorted(repr(tuple(r.values())) for r in rows)
    return out


async def test_erase_scope_leaves_no_row_of_the_tenant(
    pg_schema: str, pg_conn: asyncpg.Connection
) -> None:
    clock = ManualClock()
    async with connect(URL, schema=pg_schema, clock=clock, **BUNDLE_OPTIONS) as stores:

        async def dump() -> Any:
            return await _dump(pg_conn, pg_schema)

        await check_erasure(stores, clock, dump)
