"""How SQLite's I/O failures map: before COMMIT nothing was applied; while COMMIT
was pending the outcome is unknown (a failed sync of the write-ahead log can
still leave the commit on disk)."""

from __future__ import annotations

import sqlite3

import pytest
from pai_storage_sql.client import SqlClient
from pai_storage_sql.errors import map_error

from pai_storage import make_url
from pai_storage.errors import (
    ThreadStoreCommitUnknownError,
    ThreadStoreError,
    ThreadStoreUnavailableError,
)

from .conftest import Target


def _sqlite_error(code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize("code", [10, 13, 15, 10 | (4 << 8)])  # IOERR, FULL, PROTOCOL, IOERR_FSYNC
def test_an_io_failure_during_commit_is_an_unknown_outcome(code: int) -> None:
    url = make_url("sqlite:///x.db")
    before = map_error(_sqlite_error(code), "write", url)
    assert type(before) is not ThreadStoreCommitUnknownError
    assert isinstance(before, ThreadStoreUnavailableError)
    assert "nothing was applied" in str(before)
    during = map_error(_sqlite_error(code), "commit", url)
    assert isinstance(during, ThreadStoreCommitUnknownError)
    assert "may or may not have been applied" in str(during)


@pytest.mark.asyncio
async def test_an_operations_block_raises_what_it_raised_or_the_mapped_driver_error(
    target: Target,
) -> None:
    # Any exception of the block propagates as it was raised (StopIteration
    # included); a driver exception becomes the contract's error, the driver's
    # own as its cause; the connection is usable afterwards either way.
    async with SqlClient(target.url) as client:
        await client.ready()
        for scope in (client.reading, client.writing):
            with pytest.raises(StopIteration):
                async with scope():
                    next(iter([]))
            with pytest.raises(KeyError):
                async with scope():
                    raise KeyError("k")
            with pytest.raises(ThreadStoreError) as raised:
                async with scope() as op:
                    await op.run_text("SELECT * FROM no_such_table")
            assert "no_such_table" in str(raised.value)
            assert raised.value.__cause__ is not None
            assert not isinstance(raised.value.__cause__, ThreadStoreError)
            async with scope() as op:
                await op.run_text("SELECT 1")
