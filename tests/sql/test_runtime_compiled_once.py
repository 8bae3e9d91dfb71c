"""A runtime store's hot paths compile their statements once, not once per call.

On SQLite engines the client made, a runtime store's Core statement runs on
the driver (:class:`~pai_storage_sql.core_connection.CoreConnection`), which
compiles a statement once per statement object and set of parameter names.
A store that builds its statements once per store therefore compiles nothing
on the second call of the same shape; one that builds a new statement object
each call compiles every call (issue 31: the agent-state list append did, at
1.22x of its floor instead of 1.03x). Compilations are counted where the
backend makes them (``_Prepared.make``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from pai_storage_sql import core_connection
from pai_storage_sql.state import SqlAgentStateStore

from .conftest import Target

pytestmark = pytest.mark.asyncio


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every statement the client compiles for the driver, in order."""
    seen: list[Any] = []
    make = core_connection._Prepared.make

    def counting(statement: Any, dialect: Any, keys: list[str], many: bool) -> Any:
        seen.append(statement)
        return make(statement, dialect, keys, many)

    monkeypatch.setattr(core_connection._Prepared, "make", counting)
    return seen


@pytest_asyncio.fixture
async def state(sqlite_target: Target) -> AsyncIterator[SqlAgentStateStore]:
    store = SqlAgentStateStore(sqlite_target.url, **sqlite_target.options)
    await store.initialize()
    try:
        yield store
    finally:
        await store.close()


async def test_a_list_append_compiles_nothing_the_second_time(
    state: SqlAgentStateStore, compiled: list[Any]
) -> None:
    await state.append_list("u", "s", "log", [1])  # creates the list
    await state.append_list("u", "s", "log", [2])  # the first append proper
    compiled.clear()
    assert await state.append_list("u", "s", "log", [3]) == 3
    assert compiled == []
    assert await state.get_list("u", "s", "log") == [1, 2, 3]


async def test_list_creation_rewrite_and_read_compile_nothing_the_second_time(
    state: SqlAgentStateStore, compiled: list[Any]
) -> None:
    for n, session in enumerate(("a", "b")):
        if n:
            compiled.clear()
        await state.append_list("u", session, "log", [1, 2])
        await state.save_list("u", session, "log", ["x"])
        assert await state.get_list("u", session, "log") == ["x"]
    assert compiled == []
