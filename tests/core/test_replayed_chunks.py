"""ReplayedChunks: the chunks read ahead, then the rest; the source's failure wins."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pai_storage.snapshot_io import ReplayedChunks


async def source(*chunks: bytes, fail: BaseException | None = None) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
    if fail is not None:
        raise fail


async def upload(chunks: AsyncIterator[bytes]) -> list[bytes]:
    """Stands for a driver: takes every chunk, aborts with its own error if they fail."""
    taken = []
    try:
        async for chunk in chunks:
            taken.append(chunk)
    except Exception as exc:
        raise RuntimeError("upload aborted") from exc
    return taken


async def test_the_head_then_the_rest_and_the_head_is_let_go() -> None:
    head = [b"a", b"b"]
    replay = ReplayedChunks(head, source(b"c", b"d"))
    with replay.source_failure():
        assert await upload(replay.chunks()) == [b"a", b"b", b"c", b"d"]
    assert head == []
    assert replay.failure is None


async def test_the_sources_error_is_raised_not_the_uploads() -> None:
    replay = ReplayedChunks([b"a"], source(b"b", fail=ValueError("source broke")))
    with pytest.raises(ValueError, match="source broke"), replay.source_failure():
        await upload(replay.chunks())
    assert isinstance(replay.failure, ValueError)


async def test_the_uploads_own_error_passes_when_the_source_did_not_fail() -> None:
    replay = ReplayedChunks([b"a"], source(b"b"))

    async def failing(chunks: AsyncIterator[bytes]) -> None:
        await anext(chunks)
        raise ConnectionError("server went away")

    with pytest.raises(ConnectionError, match="went away"), replay.source_failure():
        await failing(replay.chunks())
