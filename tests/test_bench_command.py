"""``pai_storage.benchmark``: the standard workload behind ``pai-storage bench``."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import Any

import pytest
from pai_storage_conformance.provision import TestHarness
from pai_storage_memory import MemoryThreadStore

import pai_storage
from pai_storage import ThreadStore
from pai_storage import builders as b
from pai_storage.backend import Backend, StoreURL
from pai_storage.benchmark import (
    SCOPE_PREFIX,
    BenchFailure,
    add_arguments,
    main,
    percentile,
    run_benchmark,
)
from pai_storage.errors import ThreadStoreCommitUnknownError
from pai_storage.registry import register_backend, unregister_backend


class _FlakyMemoryStore(MemoryThreadStore):
    """Applies the create of ``t000002``, then reports its outcome as unknown."""

    async def _commit_thread(self, request: Any) -> Any:
        result = await super()._commit_thread(request)
        if request.thread_id == "t000002" and request.mutation.type == "create":
            raise ThreadStoreCommitUnknownError("connection lost after the commit was sent")
        return result


class _SharedMemoryBackend(Backend):
    """``benchmem://``: memory stores that share one state, so a test can inspect it."""

    name = "benchmem-test"
    url_schemes = ("benchmem",)

    def __init__(self) -> None:
        self.keeper = MemoryThreadStore()
        self.flaky = False

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        store = _FlakyMemoryStore() if self.flaky else MemoryThreadStore()
        store._scopes = self.keeper._scopes
        store._lock = self.keeper._lock
        shared: ThreadStore = store
        return shared

    def test_harness(self, url: str | None = None) -> TestHarness:  # pragma: no cover
        raise NotImplementedError


@pytest.fixture
def shared() -> Iterator[_SharedMemoryBackend]:
    backend = _SharedMemoryBackend()
    register_backend(backend)
    try:
        yield backend
    finally:
        unregister_backend(backend.name)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pai-storage bench")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _bench_scopes(backend: _SharedMemoryBackend) -> dict[str, int]:
    return {
        scope: len(threads)
        for scope, threads in backend.keeper._scopes.items()
        if scope.startswith(SCOPE_PREFIX)
    }


async def test_memory_run_exits_0_with_summary(capsys: pytest.CaptureFixture[str]) -> None:
    status = await main(_args("memory://", "--threads", "5", "--messages", "6", "--writers", "3"))
    out, err = capsys.readouterr()
    assert status == 0, err
    header = next(line for line in out.splitlines() if line.startswith("operation"))
    for column in ("p50", "p95", "p99"):
        assert column in header
    for operation in ("create", "commit", "read", "list", "delete"):
        assert re.search(rf"^{operation}\s+\d+\s", out, re.MULTILINE), operation
    assert re.search(r"^commit\s+30\s", out, re.MULTILINE)  # 5 threads x 6 messages
    assert re.search(r"commits/s: \d+", out)
    assert "scope is empty" in out
    # the progress bar goes to stderr, never into the summary
    assert "commit" in err
    assert "[" not in out


async def test_leaves_no_threads_of_its_scope(
    shared: _SharedMemoryBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    # Someone else's data, in another scope, must survive untouched.
    async with pai_storage.open_store("benchmem://") as store:
        other = await store.commit_thread(b.create("tenant-a", "keep-me"))
    assert other.type == "committed"

    status = await main(
        _args("benchmem://", "-n", "4", "-m", "5", "-k", "2", "--reads", "7", "--no-progress")
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    assert err == ""  # --no-progress
    scope = re.search(r"scope (pai-bench-[0-9a-f-]+)", out)
    assert scope is not None
    assert re.search(r"^read\s+7\s", out, re.MULTILINE)
    # the benchmark's scope holds no thread afterwards
    assert not any(_bench_scopes(shared).values())
    async with pai_storage.open_store("benchmem://") as store:
        page = await store.list_threads(
            {"scopeKey": scope.group(1), "limit": 100, "includeHidden": True}
        )
        assert page.items == []
        kept = await store.read_thread(b.read("tenant-a", "keep-me"))
        assert kept.thread is not None
        assert kept.thread.version == other.thread.version  # type: ignore[union-attr]


async def test_keep_leaves_the_threads(
    shared: _SharedMemoryBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    status = await main(_args("benchmem://", "-n", "3", "-m", "2", "--keep", "--no-progress"))
    out, _ = capsys.readouterr()
    assert status == 0
    assert "kept: 3 threads remain" in out
    assert list(_bench_scopes(shared).values()) == [3]


async def test_failure_exits_1_and_still_cleans_up(
    shared: _SharedMemoryBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    shared.flaky = True
    status = await main(_args("benchmem://", "-n", "4", "-m", "3", "-k", "1", "--no-progress"))
    _, err = capsys.readouterr()
    assert status == 1
    assert "ThreadStoreCommitUnknownError" in err
    # the created threads, including the one whose create outcome was unknown, are gone
    assert not any(_bench_scopes(shared).values())


async def test_refuses_a_scope_that_is_not_empty() -> None:
    async with MemoryThreadStore() as store:
        await store.commit_thread(b.create("pai-bench-taken", "someone-elses"))
        with pytest.raises(BenchFailure, match="not empty"):
            await run_benchmark(
                store, url="memory://", threads=2, messages=2, writers=1, scope="pai-bench-taken"
            )
        # nothing was written or deleted
        page = await store.list_threads({"scopeKey": "pai-bench-taken", "limit": 10})
        assert [t.thread_id for t in page.items] == ["someone-elses"]
        assert page.items[0].version.revision == 1


async def test_zero_messages_still_creates_lists_and_cleans(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = await main(_args("memory://", "-n", "3", "-m", "0", "--no-progress"))
    out, _ = capsys.readouterr()
    assert status == 0
    assert "commits/s: n/a" in out
    assert re.search(r"^create\s+3\s", out, re.MULTILINE)


async def test_bad_url_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    status = await main(_args("nosuchscheme://x", "--no-progress"))
    _, err = capsys.readouterr()
    assert status == 1
    assert "nosuchscheme" in err


def test_arguments() -> None:
    args = _args("memory://")
    assert (args.threads, args.messages, args.writers, args.reads) == (100, 100, 8, None)
    with pytest.raises(SystemExit):
        _args("memory://", "--threads", "0")


def test_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 95) == 3.0
