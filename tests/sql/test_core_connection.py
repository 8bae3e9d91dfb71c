"""The runtime stores' connection on SQLite: Core statements run on the driver.

:class:`~pai_storage_sql.client.CoreConnection` runs a SQLAlchemy Core
statement with SQLAlchemy's compiled form and processors but without its
execution layer. These tests compare what it returns with what SQLAlchemy's
own connection returns for the same statements (values through type
processors, expanding ``IN``, row counts, ``executemany``), check what it
leaves to SQLAlchemy, and that a rollback through it applies nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pai_storage_sql.client import CoreConnection, SqlClient, value_rows
from sqlalchemy import bindparam, delete, insert, select, text, tuple_, update

from .conftest import Target

pytestmark = pytest.mark.asyncio

NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


async def both(client: SqlClient, statement: Any, params: Any = None) -> tuple[Any, Any]:
    """The rows of ``statement`` through CoreConnection and through SQLAlchemy."""
    async with client.reading() as op:
        core = client.connection(op)
        assert isinstance(core, CoreConnection)
        fast = (await core.execute(statement, params)).all()
        slow = (await op.conn.execute(statement, params)).all()
    return fast, slow


async def test_rows_values_and_counts_match_sqlalchemy(sqlite_target: Target) -> None:
    async with SqlClient(sqlite_target.url) as client:
        await client.ready()
        kv = client.tables.runtime.kv
        rows = [
            {
                "sk_head": f"ns\x00k{i}".encode(),
                "sk_tail_hash": b"",
                "sk_tail": None,
                "ns": b"ns",
                "key": f"k{i}".encode(),
                "value": b'{"i": %d}' % i,
                "version": 1,
                "writer": bytes(16),
                "created_at": NOW,
                "updated_at": NOW,
                "expires_at": None if i % 2 else NOW + timedelta(days=i),
                "ttl_ms": None,
            }
            for i in range(5)
        ]
        async with client.writing() as op:
            core = client.connection(op)
            done = await core.execute(insert(kv), rows)  # executemany on the driver
            assert done.rowcount == 5
            changed = await core.execute(
                update(kv).where(kv.c.version == 1).values(version=kv.c.version + 1)
            )
            assert changed.rowcount == 5

        query = select(kv.c.key, kv.c.created_at, kv.c.expires_at, kv.c.version).order_by(
            kv.c.sk_head
        )
        fast, slow = await both(client, query)
        assert fast == slow
        assert fast[0].created_at == NOW  # through the column's result processor
        assert fast[0]._mapping["expires_at"] == NOW
        async with client.reading() as op:
            result = await client.connection(op).execute(query)
            assert list(result.keys()) == ["key", "created_at", "expires_at", "version"]
            values = value_rows(result)  # asking for the keys consumed nothing
        # The same values, processors applied, without Row objects.
        assert [tuple(row) for row in values] == [tuple(row) for row in slow]
        assert all(type(row) is not type(slow[0]) for row in values)
        assert values[1][2] is None
        assert values[0][2] == NOW
        async with client.reading() as op:
            rows = value_rows(await op.conn.execute(query))  # SQLAlchemy's own result
            assert [tuple(row) for row in rows] == [tuple(row) for row in slow]

        wanted = [(f"ns\x00k{i}".encode(), b"") for i in (1, 3, 4)]
        by_keys = query.where(
            tuple_(kv.c.sk_head, kv.c.sk_tail_hash).in_(bindparam("keys", expanding=True)),
            kv.c.expires_at.is_(None)
            | (kv.c.expires_at > bindparam("now", type_=kv.c.expires_at.type)),
        )
        fast, slow = await both(client, by_keys, {"keys": wanted, "now": NOW})
        assert fast == slow
        assert [bytes(r.key) for r in fast] == [b"k1", b"k3", b"k4"]

        literal = select(kv.c.key).where(kv.c.key.in_([b"k0", b"k2"]), kv.c.created_at <= NOW)
        fast, slow = await both(client, literal)
        assert fast == slow
        assert len(fast) == 2

        async with client.writing() as op:
            core = client.connection(op)
            gone = await core.execute(delete(kv).where(kv.c.key == b"k0"))
            assert gone.rowcount == 1
            assert not hasattr(gone, "lastrowid")
            with pytest.raises(AttributeError, match="statement without rows"):
                gone.all()
            await core.rollback()  # nothing of the operation is applied
        fast, _ = await both(client, select(kv.c.key).where(kv.c.key == b"k0"))
        assert len(fast) == 1


async def test_auto_increment_keys_and_what_is_left_to_sqlalchemy(
    sqlite_target: Target,
) -> None:
    async with SqlClient(sqlite_target.url) as client:
        await client.ready()
        sessions = client.tables.runtime.state_sessions

        def row(name: bytes, **extra: Any) -> Any:
            return insert(sessions).values(
                sk_head=name, sk_tail_hash=b"", sk_tail=None, expires_at=None, **extra
            )

        async with client.writing() as op:
            core = client.connection(op)
            # The new row's key, from the driver's lastrowid as SQLAlchemy takes it.
            first = await core.execute(row(b"u\x00a"))
            slow = await op.conn.execute(row(b"u\x00b"))
            second = await core.execute(row(b"u\x00c"))
            assert first.inserted_primary_key is not None
            assert second.inserted_primary_key is not None
            assert slow.inserted_primary_key is not None
            ids = [
                int(first.inserted_primary_key[0]),
                int(slow.inserted_primary_key[0]),
                int(second.inserted_primary_key[0]),
            ]
            assert ids == [ids[0], ids[0] + 1, ids[0] + 2]
            # A key given in the statement, and text: SQLAlchemy's connection.
            given = await core.execute(row(b"u\x00d", id=1000))
            assert given.inserted_primary_key == (1000,)
            assert (await core.execute(text("SELECT 41 + 1"))).scalar_one() == 42
        found = await both(client, select(sessions.c.id).order_by(sessions.c.id))
        assert [r.id for r in found[0]] == [*ids, 1000]


async def test_an_application_engine_keeps_sqlalchemy_connections(tmp_path: Any) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/app.db")
    try:
        async with SqlClient(f"sqlite:///{tmp_path}/app.db", engine=engine) as client:
            await client.ready()
            async with client.reading() as op:
                assert client.connection(op) is op.conn
    finally:
        await engine.dispose()
