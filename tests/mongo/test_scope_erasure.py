"""Scope erasure on MongoDB: no document of the tenant is left in any collection,
expired ones included, read with raw PyMongo (the scenario: ``support.erasure``).

The clock of the test is in 2030, so the TTL monitors (which judge by the
server's real time) never delete anything during it: whatever expired for the
stores is still stored until the erasure removes it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from support.erasure import BUNDLE_OPTIONS, check_erasure

from pai_storage import ManualClock, connect

pytestmark = pytest.mark.asyncio

DB = "pai_test"


async def test_erase_scope_leaves_no_document_of_the_tenant(mongo_url: str) -> None:
    prefix = f"pai_test_{uuid.uuid4().hex[:12]}_"
    clock = ManualClock()
    raw: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    db = raw[DB]

    async def dump() -> Any:
        names = await db.list_collection_names(filter={"name": {"$regex": f"^{prefix}"}})
        assert len(names) >= 7  # the thread collections and the runtime collections
        return {
            name: sorted(repr(doc) for doc in await db[name].find({}).to_list()) for name in names
        }

    try:
        async with connect(
            mongo_url, db_name=DB, collection_prefix=prefix, clock=clock, **BUNDLE_OPTIONS
        ) as stores:
            await check_erasure(stores, clock, dump)
    finally:
        for name in await db.list_collection_names(filter={"name": {"$regex": f"^{prefix}"}}):
            await db.drop_collection(name)
        await raw.close()
