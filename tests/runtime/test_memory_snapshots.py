"""The snapshot topic on the memory store, plus integrity, size and option checks."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from pai_storage_conformance.suite.snapshots import SnapshotStoreTests
from pai_storage_memory.snapshots import MemorySnapshotStore

from pai_storage import ManualClock
from pai_storage.errors import (
    ConfigurationError,
    CorruptSnapshotError,
    InvalidInputError,
    SnapshotTooLargeError,
    StorageError,
)
from pai_storage.events import StoreWarning
from pai_storage.snapshots import Snapshot, SnapshotInfo, SnapshotReader


@pytest_asyncio.fixture
async def snapshot_store(clock: ManualClock) -> AsyncIterator[MemorySnapshotStore]:
    async with MemorySnapshotStore(clock=clock) as store:
        yield store


class TestMemorySnapshotStore(SnapshotStoreTests):
    """The conformance topic, consumed the way a third-party backend would."""


class _Damaging(MemorySnapshotStore):
    """A memory store whose stored bytes (or digest) can be damaged after the fact."""

    def damage(self, scope: str, snapshot_id: str, *, data: bytes | None = None) -> None:
        stored = self._scopes[scope][snapshot_id]
        if data is None:
            flipped = bytes([stored.data[0] ^ 0x01]) + stored.data[1:]
            stored.data = flipped
        else:
            stored.data = data


async def test_damaged_bytes_are_never_returned() -> None:
    warnings: list[StoreWarning] = []
    store = _Damaging(clock=ManualClock(), on_warning=warnings.append)
    await store.put("scope", "s1", b"archive bytes", metadata={"secret": "hunter2"})
    store.damage("scope", "s1")
    with pytest.raises(CorruptSnapshotError, match="does not match its size and SHA-256") as err:
        await store.get("scope", "s1")
    assert isinstance(err.value, StorageError)
    assert "hunter2" not in str(err.value)
    assert "archive" not in str(err.value)
    with pytest.raises(CorruptSnapshotError, match="was not returned"):
        await store.latest("scope")
    assert len(warnings) == 2
    warning = warnings[0]
    assert warning.kind == "invalid_record"
    assert warning.scope_key == "scope"
    assert warning.snapshot_id == "s1"
    assert "SHA-256" in warning.reason
    assert "hunter2" not in repr(warning)
    # Listing needs no data, so it still shows the snapshot; delete and put repair it.
    assert [i.snapshot_id for i in (await store.list("scope")).items] == ["s1"]
    assert await store.delete("scope", "s1")
    await store.put("scope", "s1", b"archive bytes")
    got = await store.get("scope", "s1")
    assert got is not None
    assert got.data == b"archive bytes"


async def test_truncated_or_extended_bytes_are_corrupt() -> None:
    store = _Damaging(clock=ManualClock(), on_warning=lambda w: None)
    await store.put("scope", "s", b"0123456789")
    store.damage("scope", "s", data=b"012345678")
    with pytest.raises(CorruptSnapshotError):
        await store.get("scope", "s")
    store.damage("scope", "s", data=b"0123456789\x00")
    with pytest.raises(CorruptSnapshotError):
        await store.get("scope", "s")
    store.damage("scope", "s", data=b"0123456789")
    assert await store.get("scope", "s") is not None


async def test_latest_does_not_fall_back_to_an_older_snapshot() -> None:
    clock = ManualClock()
    store = _Damaging(clock=clock, on_warning=lambda w: None)
    await store.put("scope", "old", b"old")
    clock.advance(ms=1)
    await store.put("scope", "new", b"new")
    store.damage("scope", "new")
    with pytest.raises(CorruptSnapshotError):
        await store.latest("scope")
    old = await store.get("scope", "old")
    assert old is not None
    assert old.data == b"old"


async def test_damaged_snapshot_warns_through_a_coroutine_callback() -> None:
    seen: list[StoreWarning] = []

    async def on_warning(warning: StoreWarning) -> None:
        seen.append(warning)

    store = _Damaging(clock=ManualClock(), on_warning=on_warning)
    await store.put("scope", "s", b"data")
    store.damage("scope", "s")
    with pytest.raises(CorruptSnapshotError):
        await store.get("scope", "s")
    assert [w.snapshot_id for w in seen] == ["s"]


class _Limited(MemorySnapshotStore):
    max_snapshot_bytes: ClassVar[int | None] = 1000


async def test_size_limit_names_size_limit_and_remedy() -> None:
    store = _Limited(clock=ManualClock())
    info = await store.put("scope", "fits", b"\x00" * 1000)
    assert info.size == 1000
    with pytest.raises(SnapshotTooLargeError) as err:
        await store.put("scope", "too-big", bytearray(1001))
    message = str(err.value)
    assert "1,001 bytes" in message
    assert "1,000 bytes" in message
    assert "memory backend" in message
    assert "connect(url, snapshots=other_url)" in message
    assert isinstance(err.value, InvalidInputError)
    assert await store.get("scope", "too-big") is None


async def test_default_limit_is_none_for_memory() -> None:
    assert MemorySnapshotStore.max_snapshot_bytes is None


async def test_memoryview_of_non_bytes_is_copied_as_raw_bytes() -> None:
    import array

    store = MemorySnapshotStore(clock=ManualClock())
    numbers = array.array("H", [1, 2, 3])
    info = await store.put("scope", "s", memoryview(numbers))
    assert info.size == 6
    numbers[0] = 99
    got = await store.get("scope", "s")
    assert got is not None
    assert got.data == array.array("H", [1, 2, 3]).tobytes()
    assert info.sha256 == hashlib.sha256(got.data).hexdigest()


async def test_snapshots_can_be_kept_forever() -> None:
    clock = ManualClock()
    store = MemorySnapshotStore(clock=clock, snapshot_ttl=None)
    info = await store.put("scope", "s", b"x")
    assert info.expires_at is None
    clock.advance(timedelta(days=36_500))
    assert await store.get("scope", "s") is not None
    assert await store.purge_expired() == 0


async def test_snapshot_ttl_is_configurable() -> None:
    clock = ManualClock()
    store = MemorySnapshotStore(clock=clock, snapshot_ttl=timedelta(minutes=1))
    info = await store.put("scope", "s", b"x")
    assert info.expires_at == clock() + timedelta(minutes=1)
    clock.advance(timedelta(minutes=1))
    assert await store.get("scope", "s") is None
    assert await store.purge_expired() == 1
    assert await store.purge_expired() == 0


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"snapshot_ttl": 30}, "snapshot_ttl must be a datetime.timedelta"),
        ({"snapshot_ttl": timedelta(0)}, "snapshot_ttl must be at least 1 ms"),
        ({"snapshot_ttl": -timedelta(days=1)}, "snapshot_ttl must be at least 1 ms"),
        ({"on_warning": "log"}, "on_warning"),
    ],
)
def test_bad_options_are_configuration_errors(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        MemorySnapshotStore(**options)


def test_snapshot_models_hide_data_and_metadata_in_reprs() -> None:
    info = SnapshotInfo(
        scope="scope",
        snapshot_id="s",
        size=7,
        sha256=hashlib.sha256(b"hunter2").hexdigest(),
        metadata={"owner": "secret-person"},
        created_at="2030-01-01T00:00:00.000Z",
    )
    snapshot = Snapshot(info=info, data=b"hunter2")
    assert "secret-person" not in repr(info)
    assert "hunter2" not in repr(snapshot)
    dumped = snapshot.to_json()
    assert dumped["data"] == "aHVudGVyMg=="  # base64 in JSON
    assert dumped["info"]["snapshotId"] == "s"
    assert Snapshot.model_validate_json(snapshot.model_dump_json()) == snapshot


async def _drain(store: MemorySnapshotStore, scope: str, snapshot_id: str) -> list[bytes]:
    reader = await store.open(scope, snapshot_id)
    assert reader is not None
    handed: list[bytes] = []
    await _read_into(reader, handed)
    return handed


async def _read_into(reader: SnapshotReader, handed: list[bytes]) -> None:
    async with reader:
        async for chunk in reader:
            handed.append(chunk)


async def test_a_damaged_snapshot_never_hands_out_its_last_chunk() -> None:
    warnings: list[StoreWarning] = []
    store = _Damaging(clock=ManualClock(), on_warning=warnings.append)
    data = bytes(range(256)) * 4096 * 3  # three chunks of 1 MiB
    await store.put("scope", "s", data)
    store.damage("scope", "s", data=data[:-1] + b"\x00")  # the last byte: the last chunk
    reader = await store.open("scope", "s")
    assert reader is not None
    handed: list[bytes] = []
    with pytest.raises(CorruptSnapshotError, match="does not match its size and SHA-256"):
        await _read_into(reader, handed)
    assert len(handed) == 2, "the last chunk is held back until the digest matched"
    assert [w.snapshot_id for w in warnings] == ["s"]
    store.damage("scope", "s", data=data[: 2 * 1024 * 1024])  # truncated
    with pytest.raises(CorruptSnapshotError):
        await _drain(store, "scope", "s")


async def test_a_longer_snapshot_is_refused_as_soon_as_it_passes_its_size() -> None:
    store = _Damaging(clock=ManualClock(), on_warning=lambda w: None)
    await store.put("scope", "s", b"x" * 1024 * 1024)
    store.damage("scope", "s", data=b"x" * 5 * 1024 * 1024)
    reader = await store.open("scope", "s")
    assert reader is not None
    handed: list[bytes] = []
    with pytest.raises(CorruptSnapshotError):
        await _read_into(reader, handed)
    assert handed == []  # the second chunk passed the size: nothing was handed out


async def test_bad_data_names_every_accepted_kind() -> None:
    store = MemorySnapshotStore(clock=ManualClock())
    with pytest.raises(
        InvalidInputError,
        match=r"bytes .or a bytearray or memoryview., a binary file object or an async iterable",
    ):
        await store.put("scope", "s", "text")  # type: ignore[arg-type]
