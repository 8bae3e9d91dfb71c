"""The directory and S3 stores: 200 MB snapshots, damaged objects, two writer processes.

- a 200 MB snapshot is streamed in and out with the test process's peak
  resident memory growing by less than 64 MiB, and its SHA-256 checked;
- a data object damaged on disk or in the bucket, or missing, raises
  :class:`CorruptSnapshotError` on read; a damaged info object too;
- two processes writing the same snapshot ids of one scope, while this one
  reads them, never leave (or show) a torn or mixed snapshot.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pai_storage import StoreWarning
from pai_storage.bundle import open_snapshot_store
from pai_storage.errors import CorruptSnapshotError
from pai_storage.snapshots import SnapshotStore

from .conftest import s3_url
from .race_writer import IDS, payload

pytest.importorskip("obstore")
from pai_storage_objects.harness import MotoServer

pytestmark = pytest.mark.asyncio

MIB = 1024 * 1024
BIG = 200 * MIB
RSS_BOUND = 64 * MIB


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


async def _random_chunks(total: int, digest: Any) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        chunk = os.urandom(min(MIB, total - sent))
        digest.update(chunk)
        sent += len(chunk)
        yield chunk


def _can_measure() -> bool:
    return Path("/proc/self/clear_refs").exists()


async def _big_round_trip(store: SnapshotStore) -> None:
    if not _can_measure():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure the peak RSS")
    _reset_peak()
    before = _rss_kib("VmRSS") * 1024
    written = hashlib.sha256()
    info = await store.put("big", "200mb", _random_chunks(BIG, written))
    assert (info.size, info.sha256) == (BIG, written.hexdigest())
    read = hashlib.sha256()
    size = 0
    reader = await store.open("big", "200mb")
    assert reader is not None
    async with reader:
        async for chunk in reader:
            read.update(chunk)
            size += len(chunk)
    growth = _rss_kib("VmHWM") * 1024 - before
    assert (size, read.hexdigest()) == (BIG, written.hexdigest())
    assert growth < RSS_BOUND, f"peak RSS grew by {growth / MIB:.1f} MiB"
    print(f"\n{store.backend_name}: 200 MB put and read, peak RSS growth {growth / MIB:.1f} MiB")
    assert await store.delete("big", "200mb")


async def test_a_200_mb_snapshot_in_a_directory(tmp_path: Path) -> None:
    async with open_snapshot_store(f"file://{tmp_path}") as store:
        await _big_round_trip(store)


async def test_a_200_mb_snapshot_in_s3(moto: MotoServer) -> None:
    async with open_snapshot_store(s3_url(), **moto.options()) as store:
        await _big_round_trip(store)


# ---------------------------------------------------------------------------- damage


async def _damaged_data_is_corrupt(
    store: SnapshotStore, warnings: list[StoreWarning], rewrite: Any, remove: Any
) -> None:
    data = os.urandom(3 * MIB + 17)
    await store.put("scope", "s", data, metadata={"secret": "hunter2"})
    await rewrite(data[:-1] + bytes([data[-1] ^ 1]))  # one bit of the last chunk
    with pytest.raises(CorruptSnapshotError, match="does not match its size and SHA-256"):
        await store.get("scope", "s")
    reader = await store.open("scope", "s")
    assert reader is not None
    with pytest.raises(CorruptSnapshotError, match="SHA-256"):
        await reader.read()
    await reader.aclose()
    await rewrite(data + b"x")  # longer than stored
    with pytest.raises(CorruptSnapshotError):
        await store.latest("scope")
    await remove()
    with pytest.raises(CorruptSnapshotError, match="data object is missing"):
        await store.get("scope", "s")
    assert warnings
    assert all("hunter2" not in repr(w) for w in warnings)
    assert await store.delete("scope", "s")  # a damaged snapshot can be deleted


async def test_damaged_files_are_corrupt(tmp_path: Path) -> None:
    warnings: list[StoreWarning] = []
    async with open_snapshot_store(f"file://{tmp_path}", on_warning=warnings.append) as store:

        def data_file() -> Path:
            (found,) = tmp_path.glob("*/*/*.data")
            return found

        async def rewrite(data: bytes) -> None:
            data_file().write_bytes(data)

        async def remove() -> None:
            data_file().unlink()

        await _damaged_data_is_corrupt(store, warnings, rewrite, remove)
        await store.put("scope", "t", b"x")
        _damage_info(tmp_path)
        with pytest.raises(CorruptSnapshotError, match="info does not decode"):
            await store.get("scope", "t")
        assert (await store.list("scope")).items == []  # skipped, with a warning
        assert warnings[-1].kind == "invalid_record"


def _damage_info(root: Path) -> None:
    (info,) = root.glob("*/*/info.json")
    info.write_text('{"v": 1, "scope": "scope"')


async def test_damaged_objects_are_corrupt(moto: MotoServer) -> None:
    import obstore
    from obstore.store import S3Store

    warnings: list[StoreWarning] = []
    url = s3_url()
    prefix = url.removeprefix("s3://snapshots/")
    options = moto.options()
    raw = S3Store(
        "snapshots",
        prefix=prefix,
        config=dict(options),  # type: ignore[arg-type]
        client_options={"allow_http": True},
    )

    async def data_key() -> str:
        keys = [m["path"] for b in obstore.list(raw) for m in b if m["path"].endswith(".data")]
        assert len(keys) == 1, keys
        return keys[0]

    async def rewrite(data: bytes) -> None:
        await obstore.put_async(raw, await data_key(), data)

    async def remove() -> None:
        await obstore.delete_async(raw, await data_key())

    async with open_snapshot_store(url, on_warning=warnings.append, **options) as store:
        await _damaged_data_is_corrupt(store, warnings, rewrite, remove)


# ---------------------------------------------------------------------------- two processes

WRITER = Path(__file__).with_name("race_writer.py")
ROUNDS = 6


async def _two_writers(url: str, options: dict[str, str]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [
        await asyncio.create_subprocess_exec(
            sys.executable, str(WRITER), url, str(n), str(ROUNDS), json.dumps(options), env=env
        )
        for n in (1, 2)
    ]
    async with open_snapshot_store(url, orphan_grace=timedelta(milliseconds=1), **options) as store:

        async def check_all() -> int:
            seen = 0
            for snapshot_id in IDS:
                got = await store.get("shared", snapshot_id)  # verified: size and digest
                if got is not None:
                    meta = got.info.metadata
                    assert got.data == payload(meta["writer"], meta["round"]), "mixed snapshot"
                    seen += 1
            return seen

        seen = 0
        while any(w.returncode is None for w in writers):
            seen += await check_all()
            await asyncio.sleep(0.05)
        assert [await w.wait() for w in writers] == [0, 0]
        assert seen > 0, "the reader saw snapshots while they were written"
        assert await check_all() >= 1
        await store.purge_expired()  # with a tiny grace: every unnamed data object goes
        listed = (await store.list("shared")).items
        blobs = await store._blobs.list("")  # type: ignore[attr-defined]
        data = [b.key for b in blobs if b.key.endswith(".data")]
        temporaries = [b.key for b in blobs if b.key.endswith(".tmp")]
        assert len(data) == len(listed), "one data object per snapshot, nothing torn left"
        assert temporaries == []


async def test_two_processes_share_a_directory(tmp_path: Path) -> None:
    await _two_writers(f"file://{tmp_path}", {})


async def test_two_processes_share_a_bucket(moto: MotoServer) -> None:
    await _two_writers(s3_url(), moto.options())
