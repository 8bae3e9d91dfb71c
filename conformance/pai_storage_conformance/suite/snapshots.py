"""The snapshot store topic: opaque binary snapshots per scope, newest first.

Uses one fixture for the store under test, ``snapshot_store`` (an initialized
:class:`~pai_storage.snapshots.SnapshotStore` made with the suite's
``clock``, a :class:`~pai_storage.ManualClock`), plus ``clock`` and
``pai_examples``. Every test works in scopes of its own, so a shared database
is fine.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from pai_storage import ManualClock
from pai_storage.errors import (
    ConfigurationError,
    InvalidInputError,
    PageTokenError,
    SerializationError,
    SnapshotTooLargeError,
    StorageError,
)
from pai_storage.snapshots import Snapshot, SnapshotInfo, SnapshotReader, SnapshotStore

from ._support import BAD_NAMES, HOSTILE_NAMES, run_model, tampered_token

__all__ = ["SnapshotStoreTests"]

pytestmark = pytest.mark.asyncio

T = TypeVar("T")
RACERS = 12
MS = timedelta(milliseconds=1)
MIB = 1024 * 1024
LARGEST_TESTED_LIMIT = 32 * MIB
"""A backend limit up to this is also checked by writing a snapshot of exactly that size."""


def _scope(tag: str = "") -> str:
    return f"scope-{tag}-{uuid.uuid4().hex}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _all(store: SnapshotStore, scope: str, limit: int = 100) -> list[SnapshotInfo]:
    out: list[SnapshotInfo] = []
    token: str | None = None
    for _ in range(10_000):
        page = await store.list(scope, limit=limit, page_token=token)
        assert len(page.items) <= limit
        out.extend(page.items)
        ids = [i.snapshot_id for i in out]
        assert len(set(ids)) == len(ids), f"a page repeated a snapshot: {ids}"
        token = page.next_page_token
        if token is None:
            return out
    raise AssertionError("pages never ended")


async def _scopes_from(store: SnapshotStore, prefix: str, limit: int) -> list[str]:
    """Every scope starting with ``prefix`` that holds a live snapshot, page by page."""
    out: list[str] = []
    after: str | None = prefix
    for _ in range(10_000):
        page = await store._list_scopes(after, limit)
        assert len(page) <= limit
        mine = [scope for scope in page if scope.startswith(prefix)]
        out.extend(mine)
        assert len(set(out)) == len(out), f"a page repeated a scope: {out}"
        if len(page) < limit or len(mine) < len(page):
            return out
        after = page[-1]
    raise AssertionError("pages never ended")


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part


async def _failing(data: bytes, error: Exception) -> AsyncIterator[bytes]:
    yield data
    raise error


async def _read(reader: SnapshotReader) -> list[bytes]:
    async with reader:
        return [chunk async for chunk in reader]


class SnapshotStoreTests:
    """Round trips, streaming, replacement, order, expiry, pages, isolation, sizes, errors."""

    pytestmark = pytest.mark.asyncio

    # ------------------------------------------------------------ streaming

    async def test_snapshot_streamed_put_and_open(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("stream")
        parts = [bytes(range(256)) * 4096, b"", b"tail", b"\x00" * 3_000_001]
        data = b"".join(parts)
        info = await snapshot_store.put(scope, "iter", _chunks(*parts), metadata={"n": 1})
        assert (info.size, info.sha256, info.metadata) == (len(data), _digest(data), {"n": 1})
        from_file = await snapshot_store.put(scope, "file", io.BytesIO(data))
        assert (from_file.size, from_file.sha256) == (info.size, info.sha256)
        for snapshot_id, expected in (("iter", info), ("file", from_file)):
            reader = await snapshot_store.open(scope, snapshot_id)
            assert reader is not None
            assert reader.info == expected
            chunks = await _read(reader)
            assert b"".join(chunks) == data
            assert all(type(c) is bytes for c in chunks)
            assert max(len(c) for c in chunks) <= 8 * MIB, "chunks bound a read's memory"
            got = await snapshot_store.get(scope, snapshot_id)
            assert got is not None
            assert got.data == data
            assert got.info == expected
        empty = await snapshot_store.put(scope, "empty", _chunks())
        assert (empty.size, empty.sha256) == (0, _digest(b""))
        reader = await snapshot_store.open(scope, "empty")
        assert reader is not None
        assert await _read(reader) == []
        assert await snapshot_store.open(scope, "absent") is None

    async def test_snapshot_streamed_from_a_file_on_disk(
        self, snapshot_store: SnapshotStore, tmp_path: Any
    ) -> None:
        scope = _scope("disk")
        data = uuid.uuid4().bytes * 100_000
        path = tmp_path / "archive.tar"
        path.write_bytes(data)
        with path.open("rb") as source:
            source.seek(16)  # read from where the file stands
            info = await snapshot_store.put(scope, "s", source)
        assert (info.size, info.sha256) == (len(data) - 16, _digest(data[16:]))
        reader = await snapshot_store.open(scope, "s")
        assert reader is not None
        async with reader:
            assert await reader.read() == data[16:]

    async def test_snapshot_reader_closes_early_and_reads_once(
        self, snapshot_store: SnapshotStore
    ) -> None:
        scope = _scope("early")
        data = b"0123456789" * 300_000
        await snapshot_store.put(scope, "s", data)
        reader = await snapshot_store.open(scope, "s")
        assert reader is not None
        async with reader:
            async for chunk in reader:
                assert data.startswith(chunk)
                break
        with pytest.raises(ConfigurationError, match="read once"):
            async for _ in reader:
                pass
        assert await snapshot_store.delete(scope, "s")  # nothing held it
        assert await snapshot_store.open(scope, "s") is None

    async def test_snapshot_failed_stream_stores_nothing(
        self, snapshot_store: SnapshotStore
    ) -> None:
        scope = _scope("failed-stream")
        await snapshot_store.put(scope, "s", b"kept", metadata={"v": 1})
        with pytest.raises(OSError, match="source broke"):
            await snapshot_store.put(scope, "s", _failing(b"x" * MIB, OSError("source broke")))
        with pytest.raises(InvalidInputError, match=r"data must be bytes.*yielded str"):
            await snapshot_store.put(scope, "s", _chunks(b"abc", "text"))  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="binary mode"):
            await snapshot_store.put(scope, "s", io.StringIO("text"))
        with pytest.raises(InvalidInputError, match="data must be bytes"):
            await snapshot_store.put(
                scope, "new", _failing(b"x", InvalidInputError("data must be bytes"))
            )
        got = await snapshot_store.get(scope, "s")
        assert got is not None
        assert (got.data, got.info.metadata) == (b"kept", {"v": 1})
        assert [i.snapshot_id for i in await _all(snapshot_store, scope)] == ["s"]

    async def test_snapshot_streamed_size_limit(self, snapshot_store: SnapshotStore) -> None:
        limit = snapshot_store.max_snapshot_bytes
        if limit is None or limit > LARGEST_TESTED_LIMIT:
            return  # too large to stream in a test; test_snapshot_size_limit covers the rule
        scope = _scope("stream-size")

        async def just_over() -> AsyncIterator[bytes]:
            for _ in range(limit // MIB):
                yield b"\x01" * MIB
            yield b"\x01" * (limit % MIB + 1)

        with pytest.raises(SnapshotTooLargeError, match=rf"{limit + 1:,} bytes.*{limit:,} bytes"):
            await snapshot_store.put(scope, "too-big", just_over())
        assert await snapshot_store.get(scope, "too-big") is None
        assert await _all(snapshot_store, scope) == []

    async def test_snapshot_open_checks_names_and_a_closed_store(
        self, snapshot_store: SnapshotStore
    ) -> None:
        for bad, words in BAD_NAMES:
            with pytest.raises(InvalidInputError, match=re.escape(words)):
                await snapshot_store.open(bad, "s")  # type: ignore[arg-type]
            with pytest.raises(InvalidInputError, match=re.escape(words)):
                await snapshot_store.open("scope", bad)  # type: ignore[arg-type]
        await snapshot_store.close()
        with pytest.raises(ConfigurationError, match="closed"):
            await snapshot_store.open("scope", "s")
        with pytest.raises(ConfigurationError, match="closed"):
            await snapshot_store.put("scope", "s", _chunks(b"x"))

    # ------------------------------------------------------------ round trips

    async def test_snapshot_round_trip(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        scope = _scope("round-trip")
        data = bytes(range(256)) * 64 + b"\x00\xff"
        metadata = {"b": 1, "a": [1.0, None, "\u00e9"], "files": 3}
        info = await snapshot_store.put(scope, "snap-1", data, metadata=metadata)
        assert isinstance(info, SnapshotInfo)
        assert (info.scope, info.snapshot_id, info.size) == (scope, "snap-1", len(data))
        assert info.sha256 == _digest(data)
        assert json.dumps(info.metadata) == json.dumps(metadata)
        assert info.created_at == clock()
        ttl = snapshot_store.snapshot_ttl
        assert info.expires_at == (None if ttl is None else clock() + ttl)
        got = await snapshot_store.get(scope, "snap-1")
        assert isinstance(got, Snapshot)
        assert got.data == data
        assert type(got.data) is bytes
        assert got.info == info
        assert json.dumps(got.info.metadata) == json.dumps(metadata)  # key order and 1.0 kept

    async def test_snapshot_empty_data_and_default_metadata(
        self, snapshot_store: SnapshotStore
    ) -> None:
        scope = _scope("empty")
        info = await snapshot_store.put(scope, "empty", b"")
        assert info.size == 0
        assert info.metadata == {}
        assert info.sha256 == _digest(b"")
        got = await snapshot_store.get(scope, "empty")
        assert got is not None
        assert got.data == b""

    async def test_snapshot_buffers_are_copied(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("buffers")
        buffer = bytearray(b"original")
        info = await snapshot_store.put(scope, "from-bytearray", buffer)
        buffer[:] = b"changed!"
        assert info.sha256 == _digest(b"original")
        view_source = bytearray(b"viewed bytes")
        await snapshot_store.put(scope, "from-memoryview", memoryview(view_source)[:6])
        view_source[:6] = b"XXXXXX"
        first = await snapshot_store.get(scope, "from-bytearray")
        second = await snapshot_store.get(scope, "from-memoryview")
        assert first is not None
        assert second is not None
        assert first.data == b"original"
        assert second.data == b"viewed"
        metadata: dict[str, Any] = {"tags": ["a"]}
        await snapshot_store.put(scope, "meta", b"x", metadata=metadata)
        metadata["tags"].append("b")
        got = await snapshot_store.get(scope, "meta")
        assert got is not None
        assert got.info.metadata == {"tags": ["a"]}

    async def test_snapshot_put_replaces(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        scope = _scope("replace")
        await snapshot_store.put(scope, "s", b"first", metadata={"n": 1})
        clock.advance(ms=10)
        info = await snapshot_store.put(scope, "s", b"second version", metadata={"n": 2})
        assert info.created_at == clock()
        got = await snapshot_store.get(scope, "s")
        assert got is not None
        assert got.data == b"second version"
        assert got.info.metadata == {"n": 2}
        assert got.info.size == len(b"second version")
        assert [i.snapshot_id for i in await _all(snapshot_store, scope)] == ["s"]

    async def test_snapshot_delete(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("delete")
        assert not await snapshot_store.delete(scope, "s")
        await snapshot_store.put(scope, "s", b"x")
        await snapshot_store.put(scope, "t", b"y")
        assert await snapshot_store.delete(scope, "s")
        assert not await snapshot_store.delete(scope, "s")
        assert await snapshot_store.get(scope, "s") is None
        assert [i.snapshot_id for i in await _all(snapshot_store, scope)] == ["t"]
        latest = await snapshot_store.latest(scope)
        assert latest is not None
        assert latest.info.snapshot_id == "t"

    async def test_snapshot_absent(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("absent")
        assert await snapshot_store.get(scope, "nothing") is None
        assert await snapshot_store.latest(scope) is None
        page = await snapshot_store.list(scope)
        assert page.items == []
        assert page.next_page_token is None

    # ------------------------------------------------------------ order and pages

    async def test_snapshot_newest_first(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        scope = _scope("order")
        await snapshot_store.put(scope, "old", b"1")
        clock.advance(ms=1)
        await snapshot_store.put(scope, "middle", b"2")
        clock.advance(ms=1)
        for snapshot_id in ("tie-b", "tie-a", "tie-c"):  # one millisecond: ids break the tie
            await snapshot_store.put(scope, snapshot_id, snapshot_id.encode())
        expected = ["tie-c", "tie-b", "tie-a", "middle", "old"]
        for limit in (1, 2, 3, 5, 100):
            assert [i.snapshot_id for i in await _all(snapshot_store, scope, limit)] == expected
        latest = await snapshot_store.latest(scope)
        assert latest is not None
        assert latest.info.snapshot_id == "tie-c"
        assert latest.data == b"tie-c"
        clock.advance(ms=1)
        await snapshot_store.put(scope, "old", b"renewed")  # a replaced snapshot is new again
        latest = await snapshot_store.latest(scope)
        assert latest is not None
        assert latest.data == b"renewed"

    async def test_snapshot_page_tokens(self, snapshot_store: SnapshotStore) -> None:
        scope, other = _scope("tokens"), _scope("tokens-other")
        for i in range(3):
            await snapshot_store.put(scope, f"s{i}", b"x")
            await snapshot_store.put(other, f"s{i}", b"x")
        first = await snapshot_store.list(scope, limit=1)
        token = first.next_page_token
        assert token is not None
        # Only limit may change between pages.
        rest = await snapshot_store.list(scope, limit=10, page_token=token)
        assert [i.snapshot_id for i in first.items + rest.items] == ["s2", "s1", "s0"]
        assert rest.next_page_token is None
        with pytest.raises(PageTokenError, match="another"):
            await snapshot_store.list(other, limit=1, page_token=token)
        tampered = tampered_token(token)
        for bad in ("", "garbage", "a.b.c", tampered, token + "x"):
            with pytest.raises(PageTokenError, match="page token"):
                await snapshot_store.list(scope, limit=1, page_token=bad)
        with pytest.raises(PageTokenError, match="page token"):
            await snapshot_store.list(scope, page_token=7)  # type: ignore[arg-type]
        for limit in (0, 1001, -1, True, "5", 1.0, None):
            with pytest.raises(InvalidInputError, match="limit"):
                await snapshot_store.list(scope, limit=limit)  # type: ignore[arg-type]
        assert len((await snapshot_store.list(scope, limit=1000)).items) == 3

    async def test_snapshot_deleted_page_position(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("moving")
        for i in range(4):
            await snapshot_store.put(scope, f"s{i}", b"x")
        first = await snapshot_store.list(scope, limit=2)
        assert [i.snapshot_id for i in first.items] == ["s3", "s2"]
        assert await snapshot_store.delete(scope, "s2")  # the token's own position vanishes
        rest = await snapshot_store.list(scope, limit=10, page_token=first.next_page_token)
        assert [i.snapshot_id for i in rest.items] == ["s1", "s0"]

    # ------------------------------------------------------------ expiry

    async def test_snapshot_expiry_is_exact(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        ttl = snapshot_store.snapshot_ttl
        scope = _scope("expiry")
        await snapshot_store.put(scope, "old", b"old")
        if ttl is None:
            clock.advance(timedelta(days=3650))
            assert await snapshot_store.get(scope, "old") is not None
            return
        clock.advance(ttl - timedelta(seconds=1))
        await snapshot_store.put(scope, "young", b"young")
        clock.advance(timedelta(seconds=1) - MS)
        assert await snapshot_store.get(scope, "old") is not None
        clock.advance(MS)  # exactly ttl after its creation: gone, everywhere
        assert await snapshot_store.get(scope, "old") is None
        assert [i.snapshot_id for i in await _all(snapshot_store, scope)] == ["young"]
        assert not await snapshot_store.delete(scope, "old")
        latest = await snapshot_store.latest(scope)
        assert latest is not None
        assert latest.info.snapshot_id == "young"
        clock.advance(ttl - timedelta(seconds=1) - MS)
        assert await snapshot_store.latest(scope) is not None
        clock.advance(MS)
        assert await snapshot_store.latest(scope) is None
        assert await _all(snapshot_store, scope) == []

    async def test_snapshot_replace_after_expiry(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        ttl = snapshot_store.snapshot_ttl or timedelta(days=3650)
        scope = _scope("replace-expired")
        await snapshot_store.put(scope, "s", b"old", metadata={"v": 1})
        clock.advance(ttl)
        info = await snapshot_store.put(scope, "s", b"new")
        assert info.metadata == {}
        got = await snapshot_store.get(scope, "s")
        assert got is not None
        assert got.data == b"new"
        assert got.info.created_at == clock()

    async def test_snapshot_purge_expired(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        ttl = snapshot_store.snapshot_ttl
        scope = _scope("purge")
        for i in range(3):
            await snapshot_store.put(scope, f"old-{i}", b"x")
        if ttl is None:
            clock.advance(timedelta(days=3650))
            await snapshot_store.purge_expired()
            assert len(await _all(snapshot_store, scope)) == 3
            return
        clock.advance(ttl - MS)
        await snapshot_store.put(scope, "young", b"y")
        clock.advance(MS)
        assert await snapshot_store.purge_expired() >= 3
        assert [i.snapshot_id for i in await _all(snapshot_store, scope)] == ["young"]
        assert await snapshot_store.purge_expired() >= 0
        assert await snapshot_store.get(scope, "young") is not None

    # ------------------------------------------------------------ isolation

    async def test_snapshot_hostile_names_are_isolated(self, snapshot_store: SnapshotStore) -> None:
        base = _scope("hostile")
        for i, name in enumerate(HOSTILE_NAMES):
            await snapshot_store.put(base, name, f"id {i}".encode())
            await snapshot_store.put(name, base, f"scope {i}".encode())
        for i, name in enumerate(HOSTILE_NAMES):
            as_id = await snapshot_store.get(base, name)
            as_scope = await snapshot_store.get(name, base)
            assert as_id is not None
            assert as_scope is not None
            assert as_id.data == f"id {i}".encode(), name
            assert as_scope.data == f"scope {i}".encode(), name
            assert [s.snapshot_id for s in await _all(snapshot_store, name)] == [base], name
        listed = sorted(s.snapshot_id for s in await _all(snapshot_store, base))
        assert listed == sorted(HOSTILE_NAMES)
        assert await snapshot_store.delete(base, "a")
        assert await snapshot_store.delete("a", base)
        for i, name in enumerate(HOSTILE_NAMES):
            if name == "a":
                continue
            got = await snapshot_store.get(base, name)
            assert got is not None
            assert got.data == f"id {i}".encode(), name
            assert await snapshot_store.get(name, base) is not None, name
        assert await snapshot_store.get(base, "a") is None
        assert await snapshot_store.get("a", base) is None

    async def test_snapshot_prefix_scopes_are_isolated(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("prefix")
        await snapshot_store.put(scope + "x", "s", b"longer scope")
        await snapshot_store.put(scope, "sx", b"longer id")
        assert await snapshot_store.get(scope, "s") is None
        assert [i.snapshot_id for i in await _all(snapshot_store, scope)] == ["sx"]
        latest = await snapshot_store.latest(scope + "x")
        assert latest is not None
        assert latest.data == b"longer scope"

    # ------------------------------------------------------------ concurrency

    async def test_snapshot_racing_puts(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("race")
        payloads = [f"writer {i}".encode() * (i + 1) for i in range(RACERS)]
        infos = await asyncio.gather(
            *(snapshot_store.put(scope, "same", data) for data in payloads)
        )
        got = await snapshot_store.get(scope, "same")
        assert got is not None
        assert got.data in payloads  # one whole write won: never a mix
        assert got.info.sha256 == _digest(got.data)
        assert got.info.sha256 in {i.sha256 for i in infos}
        assert len(await _all(snapshot_store, scope)) == 1

    # ------------------------------------------------------------ sizes

    async def test_snapshot_size_limit(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("size")
        limit = snapshot_store.max_snapshot_bytes
        if limit is None:
            big = b"\x5a" * (8 * 1024 * 1024 + 3)  # no limit: a large one goes through
            info = await snapshot_store.put(scope, "big", big)
            assert info.size == len(big)
            got = await snapshot_store.get(scope, "big")
            assert got is not None
            assert got.data == big
            return
        if limit <= LARGEST_TESTED_LIMIT:
            fits = b"\x01" * limit
            assert (await snapshot_store.put(scope, "fits", fits)).size == limit
            got = await snapshot_store.get(scope, "fits")
            assert got is not None
            assert got.data == fits
            too_big = fits + b"\x01"
        else:
            # Too large to write in a test. bytes(n) is zero-filled by calloc, so its
            # pages are never touched: the refusal below happens on the length alone.
            too_big = bytes(limit + 1)
        with pytest.raises(
            SnapshotTooLargeError, match=rf"{limit + 1:,} bytes.*{limit:,} bytes.*snapshots="
        ):
            await snapshot_store.put(scope, "too-big", too_big)
        with pytest.raises(InvalidInputError):  # SnapshotTooLargeError is one
            await snapshot_store.put(scope, "too-big", too_big)
        assert await snapshot_store.get(scope, "too-big") is None

    async def test_snapshot_metadata_limits(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("metadata")
        fits = {"k": "x" * (64 * 1024 - 10)}  # {"k":"..."} adds 8 bytes
        assert (await snapshot_store.put(scope, "fits", b"x", metadata=fits)).metadata == fits
        with pytest.raises(InvalidInputError, match=r"metadata.*65,537 bytes.*65,536"):
            await snapshot_store.put(scope, "big", b"x", metadata={"k": "x" * (64 * 1024 - 7)})
        assert await snapshot_store.get(scope, "big") is None

    # ------------------------------------------------------------ errors

    async def test_snapshot_bad_names_write_nothing(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("bad-names")
        for bad, words in BAD_NAMES:
            calls: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = [
                (snapshot_store.put, (bad, "s", b"x")),
                (snapshot_store.put, (scope, bad, b"x")),
                (snapshot_store.get, (bad, "s")),
                (snapshot_store.get, (scope, bad)),
                (snapshot_store.latest, (bad,)),
                (snapshot_store.list, (bad,)),
                (snapshot_store.delete, (bad, "s")),
                (snapshot_store.delete, (scope, bad)),
            ]
            for method, args in calls:
                with pytest.raises(InvalidInputError, match=re.escape(words)):
                    await method(*args)
        assert await _all(snapshot_store, scope) == []

    async def test_snapshot_bad_data_and_metadata_write_nothing(
        self, snapshot_store: SnapshotStore
    ) -> None:
        scope = _scope("bad-data")
        for bad_data in ("text", None, 5, [1, 2], bytes, b"x".hex):
            with pytest.raises(InvalidInputError, match="data must be bytes"):
                await snapshot_store.put(scope, "s", bad_data)  # type: ignore[arg-type]
        for bad_meta, error, words in (
            ([1], InvalidInputError, "metadata must be a dict"),
            ("text", InvalidInputError, "metadata must be a dict"),
            ({"x": float("nan")}, SerializationError, "metadata.x: NaN"),
            ({"x": {1, 2}}, SerializationError, "set"),
            ({1: "x"}, SerializationError, "not a string"),
            ({"x": b"raw"}, SerializationError, "bytes"),
        ):
            with pytest.raises(error, match=re.escape(words)):
                await snapshot_store.put(scope, "s", b"x", metadata=bad_meta)  # type: ignore[arg-type]
        assert await _all(snapshot_store, scope) == []
        assert await snapshot_store.get(scope, "s") is None

    async def test_snapshot_errors_are_storage_errors(self, snapshot_store: SnapshotStore) -> None:
        with pytest.raises(StorageError):
            await snapshot_store.get("", "s")
        with pytest.raises(ValueError, match="scope"):
            await snapshot_store.get("", "s")
        with pytest.raises(StorageError):
            await snapshot_store.list(_scope("roots"), page_token="nope")

    async def test_snapshot_closed_store_refuses_every_call(
        self, snapshot_store: SnapshotStore
    ) -> None:
        scope = _scope("closed")
        await snapshot_store.put(scope, "s", b"x")
        await snapshot_store.close()
        calls: list[Coroutine[Any, Any, Any]] = [
            snapshot_store.put(scope, "s", b"y"),
            snapshot_store.get(scope, "s"),
            snapshot_store.latest(scope),
            snapshot_store.list(scope),
            snapshot_store.delete(scope, "s"),
            snapshot_store.purge_expired(),
        ]
        for call in calls:
            with pytest.raises(ConfigurationError, match="closed"):
                await call

    # ------------------------------------------------------------ enumeration

    async def test_snapshot_enumerates_scopes_in_code_point_order(
        self, enumerating_snapshot_store: SnapshotStore
    ) -> None:
        store = enumerating_snapshot_store
        prefix = f"enum-{uuid.uuid4().hex}"
        scopes = [f"{prefix}-{tail}" for tail in ("A", "a", "\u00e9", "\uffee", "\U0001f600")]
        for scope in reversed(scopes):
            await store.put(scope, "one", b"1")
            await store.put(scope, "two", b"2")  # a scope is listed once, however many it holds
        for limit in (1, 2, 1000):
            assert await _scopes_from(store, prefix, limit) == sorted(scopes), f"limit {limit}"
        assert await store._list_scopes(scopes[1], 2) == scopes[2:4]
        assert await store._list_scopes(scopes[-2], 1) == scopes[-1:]

    async def test_snapshot_enumeration_skips_expired_and_deleted_scopes(
        self, enumerating_snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        store = enumerating_snapshot_store
        ttl = store.snapshot_ttl
        prefix = f"enum-expiry-{uuid.uuid4().hex}"
        old, young, gone = f"{prefix}-1", f"{prefix}-2", f"{prefix}-3"
        await store.put(old, "s", b"old")
        await store.put(gone, "s", b"gone")
        assert await store.delete(gone, "s")
        if ttl is None:
            clock.advance(timedelta(days=3650))
            assert await _scopes_from(store, prefix, 10) == [old]
            return
        clock.advance(ttl - MS)
        await store.put(young, "s", b"young")
        assert await _scopes_from(store, prefix, 10) == [old, young]
        clock.advance(MS)  # exactly ttl after its creation: the old scope is empty
        assert await _scopes_from(store, prefix, 10) == [young]

    # ------------------------------------------------------------ defaults and stated limits

    async def test_snapshot_defaults_and_stated_limits(self, snapshot_store: SnapshotStore) -> None:
        assert snapshot_store.snapshot_ttl == timedelta(days=30), "snapshots expire after 30 days"
        limit = snapshot_store.max_snapshot_bytes
        stated = {"memory": None, "mongo": None}  # MongoDB: GridFS past 15 MiB documents
        backend = snapshot_store.backend_name
        if backend in stated:
            assert limit == stated[backend], backend
        elif backend in ("postgres", "sql"):
            assert limit is not None
            assert limit >= 256 * MIB, backend
        else:
            assert limit is None or limit > 0, backend

    async def test_snapshot_list_pages_100_by_default(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("default-limit")
        ids = [f"s{i:03d}" for i in range(101)]
        await asyncio.gather(*(snapshot_store.put(scope, i, b"x") for i in ids))
        first = await snapshot_store.list(scope)
        assert len(first.items) == 100
        assert first.next_page_token is not None
        rest = await snapshot_store.list(scope, page_token=first.next_page_token)
        assert len(rest.items) == 1
        assert rest.next_page_token is None
        assert sorted(i.snapshot_id for i in first.items + rest.items) == ids

    async def test_snapshot_info_is_frozen(self, snapshot_store: SnapshotStore) -> None:
        scope = _scope("frozen")
        info = await snapshot_store.put(scope, "s", b"data", metadata={"a": 1})
        with pytest.raises((TypeError, ValueError, AttributeError)):
            info.size = 7  # type: ignore[misc]
        got = await snapshot_store.get(scope, "s")
        assert got is not None
        with pytest.raises((TypeError, ValueError, AttributeError)):
            got.data = b"other"  # type: ignore[misc]
        assert (await snapshot_store.get(scope, "s")) == got

    async def test_snapshot_replacement_starts_a_new_lifetime(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        ttl = snapshot_store.snapshot_ttl
        if ttl is None:
            return  # nothing expires: test_snapshot_expiry_is_exact covers it
        scope = _scope("new-lifetime")
        await snapshot_store.put(scope, "s", b"first")
        clock.advance(ttl - MS)
        info = await snapshot_store.put(scope, "s", b"second")
        assert info.expires_at == clock() + ttl
        clock.advance(MS)
        got = await snapshot_store.get(scope, "s")
        assert got is not None
        assert got.data == b"second"
        assert got.info == info
        clock.advance(ttl - MS)
        assert await snapshot_store.get(scope, "s") is None

    async def test_snapshot_timestamps_are_utc_whole_milliseconds(
        self, snapshot_store: SnapshotStore, clock: ManualClock
    ) -> None:
        scope = _scope("ms")
        clock.advance(timedelta(microseconds=1_999))  # the clock is now between milliseconds
        now = clock()
        whole = now.replace(microsecond=now.microsecond - now.microsecond % 1000)
        info = await snapshot_store.put(scope, "s", b"x")
        assert info.created_at == whole
        assert info.created_at.utcoffset() == timedelta(0)
        ttl = snapshot_store.snapshot_ttl
        assert info.expires_at == (None if ttl is None else whole + ttl)
        got = await snapshot_store.get(scope, "s")
        assert got is not None
        assert got.info == info
        assert [i.created_at for i in await _all(snapshot_store, scope)] == [whole]

    # ------------------------------------------------------------ model-based

    async def test_snapshots_agree_with_model(
        self, snapshot_store: SnapshotStore, clock: ManualClock, pai_examples: int
    ) -> None:
        loop = asyncio.get_running_loop()
        machine = _machine(snapshot_store, clock, loop)
        await run_model(machine, examples=pai_examples, steps=STEPS)


# ---------------------------------------------------------------- the model

STEPS = 40
IDS = ("a", "b", "B", "a.b", "%")


@dataclass
class _ModelSnapshot:
    data: bytes
    metadata: dict[str, Any]
    created_at: datetime
    expires_at: datetime | None


class _SnapshotWorkload(RuleBasedStateMachine):
    """The store under test beside a dict-of-dicts model of the contract."""

    store: SnapshotStore
    clock: ManualClock
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        super().__init__()
        token = uuid.uuid4().hex[:12]
        self.scopes = (f"model-{token}", f"model-{token}x")
        self.model: dict[str, dict[str, _ModelSnapshot]] = {s: {} for s in self.scopes}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def live(self, scope: str) -> list[tuple[str, _ModelSnapshot]]:
        now = self.clock()
        found = [
            (i, s)
            for i, s in self.model[scope].items()
            if s.expires_at is None or s.expires_at > now
        ]
        return sorted(found, key=lambda e: (e[1].created_at, e[0]), reverse=True)

    def check(self, got: Snapshot | None, scope: str, snapshot_id: str | None) -> None:
        if snapshot_id is None:
            assert got is None, got
            return
        wanted = self.model[scope][snapshot_id]
        assert got is not None, (scope, snapshot_id)
        assert got.info.snapshot_id == snapshot_id
        assert got.info.scope == scope
        assert got.data == wanted.data
        assert got.info.metadata == wanted.metadata
        assert (got.info.created_at, got.info.expires_at) == (wanted.created_at, wanted.expires_at)

    scope_picks = st.sampled_from((0, 1))

    @rule(
        pick=scope_picks,
        snapshot_id=st.sampled_from(IDS),
        data=st.binary(max_size=64),
        metadata=st.dictionaries(st.sampled_from(("n", "tag")), st.integers(0, 3), max_size=2),
    )
    def put(self, pick: int, snapshot_id: str, data: bytes, metadata: dict[str, Any]) -> None:
        scope = self.scopes[pick]
        info = self.run(self.store.put(scope, snapshot_id, data, metadata=metadata))
        now = self.clock()
        ttl = self.store.snapshot_ttl
        self.model[scope][snapshot_id] = _ModelSnapshot(
            data, metadata, now, None if ttl is None else now + ttl
        )
        assert info.created_at == now
        assert info.sha256 == hashlib.sha256(data).hexdigest()

    @rule(pick=scope_picks, snapshot_id=st.sampled_from(IDS))
    def get(self, pick: int, snapshot_id: str) -> None:
        scope = self.scopes[pick]
        live = dict(self.live(scope))
        got = self.run(self.store.get(scope, snapshot_id))
        self.check(got, scope, snapshot_id if snapshot_id in live else None)

    @rule(pick=scope_picks)
    def latest(self, pick: int) -> None:
        scope = self.scopes[pick]
        live = self.live(scope)
        self.check(self.run(self.store.latest(scope)), scope, live[0][0] if live else None)

    @rule(pick=scope_picks, limit=st.integers(1, 3))
    def list_all(self, pick: int, limit: int) -> None:
        scope = self.scopes[pick]
        listed = self.run(_all(self.store, scope, limit))
        assert [i.snapshot_id for i in listed] == [i for i, _ in self.live(scope)]

    @rule(pick=scope_picks, snapshot_id=st.sampled_from(IDS))
    def delete(self, pick: int, snapshot_id: str) -> None:
        scope = self.scopes[pick]
        existed = snapshot_id in dict(self.live(scope))
        assert self.run(self.store.delete(scope, snapshot_id)) == existed
        self.model[scope].pop(snapshot_id, None)

    @rule(step=st.sampled_from(("0", "1ms", "ttl-1ms", "ttl", "day")))
    def advance(self, step: str) -> None:
        ttl = self.store.snapshot_ttl or timedelta(days=30)
        delta = {
            "0": timedelta(0),
            "1ms": MS,
            "ttl-1ms": ttl - MS,
            "ttl": ttl,
            "day": timedelta(days=1),
        }[step]
        self.clock.advance(delta)

    @precondition(lambda self: any(self.model.values()))
    @rule()
    def purge_expired(self) -> None:
        expired = 0
        for scope in self.scopes:
            live = dict(self.live(scope))
            expired += len(self.model[scope]) - len(live)
            self.model[scope] = live
        assert self.run(self.store.purge_expired()) >= expired

    @invariant()
    def lists_agree(self) -> None:
        for scope in self.scopes:
            listed = self.run(_all(self.store, scope))
            assert [i.snapshot_id for i in listed] == [i for i, _ in self.live(scope)]


def _machine(
    store: SnapshotStore, clock: ManualClock, loop: asyncio.AbstractEventLoop
) -> type[_SnapshotWorkload]:
    class SnapshotWorkload(_SnapshotWorkload):
        pass

    SnapshotWorkload.store = store
    SnapshotWorkload.clock = clock
    SnapshotWorkload.loop = loop
    return SnapshotWorkload
