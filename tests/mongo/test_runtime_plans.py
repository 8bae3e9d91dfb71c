"""Every command the four runtime stores send is served by an index.

A workload through the key-value, agent-state, snapshot and guard stores runs
on an application's own client with a command listener; every statement with
a filter it sent (reads, conditional writes, deletes, the expiry sweeps) is
then explained (``queryPlanner``: nothing runs again). None may scan the
collection, sort in memory or use a regex, and each must use an index
(``docs/mongodb.md`` lists them).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_mongo import backend as mongo_backend
from pymongo import AsyncMongoClient, monitoring

from pai_storage.backend import make_url

pytestmark = pytest.mark.asyncio

DB = "pai_test"
_SKIP = ("lsid", "$db", "$clusterTime", "txnNumber", "autocommit", "startTransaction")


class Recorder(monitoring.CommandListener):
    """Keeps every command that selects documents, split into single statements."""

    def __init__(self) -> None:
        self.statements: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        command = {k: v for k, v in event.command.items() if k not in _SKIP}
        name = event.command_name
        if name in ("find", "findAndModify", "aggregate", "count", "distinct"):
            self.statements.append(command)
        elif name in ("update", "delete"):
            many = "updates" if name == "update" else "deletes"
            for statement in command[many]:
                self.statements.append({**command, many: [statement]})

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest_asyncio.fixture
async def recorded(mongo_url: str) -> AsyncIterator[tuple[dict[str, Any], Recorder, Any]]:
    recorder = Recorder()
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        mongo_url, event_listeners=[recorder], tz_aware=True
    )
    prefix = f"pai_test_{uuid.uuid4().hex}_"
    stores = mongo_backend.open_components(
        make_url("mongodb://"),
        ["kv", "state", "snapshots", "guard"],
        client=client,
        db_name=DB,
        collection_prefix=prefix,
    )
    try:
        for store in stores.values():
            await store.initialize()
        yield stores, recorder, client
    finally:
        for store in stores.values():
            await store.close()
        for name in await client[DB].list_collection_names():
            if name.startswith(prefix):
                await client[DB].drop_collection(name)
        await client.close()


def _stages(plan: Any) -> list[str]:
    found: list[str] = []
    if isinstance(plan, dict):
        if "stage" in plan:
            found.append(plan["stage"])
        for value in plan.values():
            found += _stages(value)
    elif isinstance(plan, list):
        for value in plan:
            found += _stages(value)
    return found


def _has_regex(value: Any) -> bool:
    if isinstance(value, dict):
        return "$regex" in value or any(_has_regex(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_regex(v) for v in value)
    return hasattr(value, "pattern") and hasattr(value, "flags")


async def test_every_runtime_statement_uses_an_index(
    recorded: tuple[dict[str, Any], Recorder, Any],
) -> None:
    stores, recorder, client = recorded
    kv, state, snapshots, guard = (stores[c] for c in ("kv", "state", "snapshots", "guard"))
    for a in ("a", "b"):
        for k in range(3):
            await kv.put((a, "x"), f"k{k}", k, ttl=timedelta(hours=1))
    item = await kv.put(("a", "x"), "plain", 1)
    await kv.get(("a", "x"), "k1")
    await kv.put_if_version(("a", "x"), "plain", 2, item.version)
    await kv.put_if_version(("a", "x"), "fresh", 2, None)
    page = await kv.search(("a",), limit=2)
    await kv.search(("a",), limit=2, page_token=page.next_page_token)
    await kv.search(("a",), key_prefix="k", limit=2)
    await kv.search((), limit=2)
    await kv.list_keys(("a", "x"), prefix="k", limit=2)
    await kv.list_namespaces((), max_depth=1)
    await kv.delete(("a", "x"), "k0")
    await kv.purge_expired()

    await state.save("u", "s1", "v", 1)
    await state.save_if_version("u", "s1", "v", 2, 1)
    await state.save_if_version("u", "s1", "new", 1, 0)
    await state.get("u", "s1", "v")
    await state.save_list("u", "s1", "log", [1, 2])
    await state.append_list("u", "s1", "log", [3])
    await state.append_list("u", "s1", "log", list(range(40)))
    await state.save_list("u", "s1", "log", [9])
    await state.get_list("u", "s1", "log")
    await state.save("u", "s2", "v", 1)
    sessions = await state.list_session_ids("u", limit=1)
    await state.list_session_ids("u", limit=1, page_token=sessions.next_page_token)
    await state.save(None, "s1", "v", 1)
    await state.save("\x01", "s1", "v", 1)
    await state._list_sessions(None, 10)  # the anonymous user, then the users around it
    await state._list_sessions(("\x01", "s1"), 1)
    await state._session_keys("u", "s1")
    await state.exists("u", "s1")
    await state.delete_state("u", "s1", "v")
    await state.delete("u", "s2")
    await state.purge_expired()

    await snapshots.put("scope", "one", b"1")
    await snapshots.put("scope", "two", b"2")
    await snapshots.get("scope", "one")
    await snapshots.latest("scope")
    await snapshots.put("other", "one", b"1")
    assert await snapshots._list_scopes(None, 10) == ["other", "scope"]
    listed = await snapshots.list("scope", limit=1)
    await snapshots.list("scope", limit=1, page_token=listed.next_page_token)
    await snapshots.delete("scope", "one")
    await snapshots.purge_expired()

    lock = await guard.try_acquire("resource", owner="w")
    assert lock is not None
    assert await guard.try_acquire("resource", owner="other") is None
    await guard.inspect("resource")
    assert await lock.renew()
    assert await lock.release()
    await guard.purge_expired()

    assert len(recorder.statements) >= 45
    kinds: set[str] = set()
    for statement in recorder.statements:
        name = next(iter(statement))
        assert not _has_regex(statement), statement
        explained = await client[DB].command({"explain": statement, "verbosity": "queryPlanner"})
        stages = _stages(explained["queryPlanner"]["winningPlan"])
        assert "COLLSCAN" not in stages, (statement, stages)
        assert "SORT" not in stages, (statement, stages)
        assert {"IXSCAN", "IDHACK"} & set(stages), (statement, stages)
        kinds.add(f"{name}:{statement[name].rpartition('_')[2]}")
    # Every store, its reads and its writes, were explained.
    for expected in (
        "find:kv",
        "findAndModify:kv",
        "delete:kv",
        "find:sessions",
        "findAndModify:sessions",
        "update:sessions",
        "delete:sessions",
        "find:snapshots",
        "findAndModify:snapshots",
        "delete:snapshots",
        "find:locks",
        "findAndModify:locks",
        "update:locks",
        "delete:locks",
    ):
        assert expected in kinds, (expected, sorted(kinds))
