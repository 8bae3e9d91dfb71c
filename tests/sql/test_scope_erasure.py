"""Scope erasure on SQLite and MariaDB: no row of the tenant is left in any table,
expired rows included, read with raw SQL (the scenario: ``support.erasure``)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import pytest
from sqlalchemy import text
from support.erasure import BUNDLE_OPTIONS, check_erasure

from pai_storage import ManualClock, connect

from .conftest import Target, mysql_engine

pytestmark = pytest.mark.asyncio


def _sqlite_dump(path: str) -> dict[str, list[str]]:
    with closing(sqlite3.connect(path)) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {n: sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{n}"')) for n in names}


async def _mysql_dump(prefix: str) -> dict[str, list[str]]:
    engine = mysql_engine()
    try:
        async with engine.connect() as conn:
            names = [
                r[0]
                for r in await conn.execute(
                    text(
                        "SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = DATABASE() AND table_name LIKE :p"
                    ),
                    {"p": prefix.replace("_", "\\_") + "\\_%"},
                )
            ]
            out: dict[str, list[str]] = {}
            for name in names:
                rows = await conn.execute(text(f"SELECT * FROM `{name}`"))
                out[name] = sorted(repr(tuple(r)) for r in rows)
            return out
    finally:
        await engine.dispose()


async def test_erase_scope_leaves_no_row_of_the_tenant(target: Target) -> None:
    clock = ManualClock()
    options = {**target.options, **BUNDLE_OPTIONS}
    async with connect(target.url, clock=clock, **options) as stores:

        async def dump() -> Any:
            if target.dialect == "sqlite":
                found = _sqlite_dump(target.url.removeprefix("sqlite:///"))
            else:
                found = await _mysql_dump(target.options["table_prefix"])
            assert len(found) >= 8  # the thread tables and the runtime tables
            return found

        await check_erasure(stores, clock, dump)
