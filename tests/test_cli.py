"""The ``pai-storage`` command line: demo, check, bench, --version."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import types
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from pai_storage_conformance.provision import TestHarness

import pai_storage
from pai_storage import ThreadStore
from pai_storage.backend import Backend, StoreURL, get_backend
from pai_storage.cli import main


def _revisions(out: str) -> set[int]:
    return {int(n) for n in re.findall(r"\brev (\d+)\b", out)}


def _assert_demo_story(out: str) -> None:
    assert {1, 2, 3, 4, 5, 6} <= _revisions(out)
    assert re.search(r"rev 6 . instance [0-9a-f]{8}", out)
    # the stale writer at revision 5 is refused, and told the current version
    assert re.search(r"conflict .*current version is rev 6", out)
    # the expired lease is taken over by another worker
    assert "takes over r2" in out
    assert "r2 held by w3 (resume)" in out
    # regenerate: r1 runs again with operation regenerate, its lease re-acquired
    assert "Regenerate" in out
    assert "r1 held by w1 (regenerate)" in out
    assert "op regenerate" in out
    assert "thread deleted" in out
    assert "demo complete" in out


def test_demo_on_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    captured = capsys.readouterr()
    _assert_demo_story(captured.out)
    assert captured.err == ""


def test_demo_json_shows_each_commit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "memory://", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"type": "truncate"' in out
    assert '"operation": "regenerate"' in out


def test_demo_as_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pai_storage", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    _assert_demo_story(done.stdout)
    assert "Traceback" not in done.stderr


class _RealClockMemory(Backend):
    """memory under another scheme, so the demo takes its real-clock path."""

    name = "cli-test-realclock"
    url_schemes = ("cli-test-realclock",)

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        assert "clock" not in options  # only memory:// gets the manual clock
        return get_backend("memory").open(pai_storage.make_url("memory://"), **options)

    def test_harness(self, url: str | None = None) -> TestHarness:
        raise NotImplementedError


@pytest.fixture
def realclock_backend() -> Iterator[str]:
    backend = _RealClockMemory()
    pai_storage.register_backend(backend)
    try:
        yield "cli-test-realclock://"
    finally:
        pai_storage.unregister_backend(backend.name)


def test_demo_waits_for_expiry_on_a_real_clock(
    realclock_backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", realclock_backend]) == 0
    out = capsys.readouterr().out
    _assert_demo_story(out)
    assert "for the lease to expire on the server clock" in out


def test_demo_plays_the_runtime_part_on_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--runtime"]) == 0
    out = capsys.readouterr().out
    assert "Part 2: one agent turn with every store" in out
    assert "Create the thread" not in out  # part 1 not played
    assert "fencing token 1" in out
    assert "saved       plan v1" in out
    assert "history     1 item(s)" in out
    assert "worker-2    fencing token 3" in out
    assert "renew refused; lock.lost is set" in out
    assert out.rstrip().endswith("demo complete")


def test_demo_plays_both_parts_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.index("Create the thread") < out.index("Part 2: one agent turn")


def test_demo_threads_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--threads-only"]) == 0
    assert "Part 2" not in capsys.readouterr().out


def test_demo_skips_the_runtime_part_for_a_threads_only_backend(
    realclock_backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", realclock_backend, "--runtime"]) == 0
    out = capsys.readouterr().out
    assert "Part 2 (the runtime stores) skipped: the cli-test-realclock backend" in out
    assert "guard" in out


def test_demo_with_unknown_scheme_fails_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "nosuch://x"]) == 1
    err = capsys.readouterr().err
    assert "installed schemes" in err
    assert "Traceback" not in err


def test_check_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "memory://"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^backend\s+memory$", out, re.MULTILINE)
    assert re.search(r"^transactions\s+yes$", out, re.MULTILINE)


def test_check_unknown_scheme_lists_installed_schemes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "nosuch://x"]) == 1
    captured = capsys.readouterr()
    assert "installed schemes" in captured.err
    assert "memory" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_check_bad_options_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "memory://somewhere"]) == 1
    assert "ThreadStoreConfigurationError" in capsys.readouterr().err


def test_check_never_prints_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on port 1; whether the backend or its driver is installed,
    # the check fails -- and must not show the password on the way.
    assert main(["check", "postgresql://u:secret@127.0.0.1:1/db"]) == 1
    captured = capsys.readouterr()
    assert "secret" not in captured.out + captured.err
    assert "Traceback" not in captured.err


def test_check_as_module_never_prints_the_password() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pai_storage", "check", "postgres://u:secret@127.0.0.1:1/db"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "secret" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert pai_storage.__version__ in capsys.readouterr().out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_bench_is_wired_to_the_benchmark_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[argparse.Namespace] = []
    fake = types.ModuleType("pai_storage.benchmark")

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("url")
        parser.add_argument("--threads", type=int, default=10)
        parser.add_argument("--messages", type=int, default=100)
        parser.add_argument("--writers", type=int, default=4)

    async def bench_main(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    fake.add_arguments = add_arguments  # type: ignore[attr-defined]
    fake.main = bench_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pai_storage.benchmark", fake)
    assert main(["bench", "memory://", "--threads", "3", "--writers", "2"]) == 0
    assert len(seen) == 1
    args = seen[0]
    assert (args.url, args.threads, args.messages, args.writers) == ("memory://", 3, 100, 2)


# ---------------------------------------------------------------- copy, export, import


class _NamedMemory(Backend):
    """memory stores that share their threads by URL host (``cli-test-mem://a``), so
    that one command can read what an earlier one wrote."""

    name = "cli-test-mem"
    url_schemes = ("cli-test-mem",)

    def __init__(self) -> None:
        self.stores: dict[str, Any] = {}

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        from pai_storage_memory import MemoryThreadStore

        store = MemoryThreadStore(**options)
        shared = self.stores.setdefault(url.host or "", store)
        # The new store (closed by the command) uses the shared one's contents.
        store._scopes = shared._scopes
        store._updates = shared._updates
        store._lock = shared._lock
        return store

    def test_harness(self, url: str | None = None) -> TestHarness:
        raise NotImplementedError


@pytest.fixture
def named_memory() -> Iterator[_NamedMemory]:
    backend = _NamedMemory()
    pai_storage.register_backend(backend)
    try:
        yield backend
    finally:
        pai_storage.unregister_backend(backend.name)


async def _fill(url: str, scopes: dict[str, int], turns: int = 2) -> None:
    from pai_storage_conformance.suite.lifecycle import build_conversation

    async with pai_storage.open_store(url) as store:
        for scope, count in scopes.items():
            for i in range(count):
                await build_conversation(store, None, scope, f"t{i}", turns=turns)


async def _digests(url: str, scope: str, count: int) -> list[str | None]:
    async with pai_storage.open_store(url) as store:
        return [await store.thread_digest(scope, f"t{i}") for i in range(count)]


def test_copy_every_scope_then_resume_and_verify(
    named_memory: _NamedMemory, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    asyncio.run(_fill("cli-test-mem://src", {"a": 3, "b\x00/$": 2}))
    assert main(["copy", "cli-test-mem://src", "cli-test-mem://dst"]) == 0
    captured = capsys.readouterr()
    assert "copied 5 thread(s), 0 already present, 5 verified, 0 mismatched" in captured.out
    assert "copy: 5/5 threads" in captured.err  # the plain progress line
    for scope, count in {"a": 3, "b\x00/$": 2}.items():
        source = asyncio.run(_digests("cli-test-mem://src", scope, count))
        assert None not in source
        assert asyncio.run(_digests("cli-test-mem://dst", scope, count)) == source
    # Run again: everything is there already, with the same content.
    assert main(["copy", "cli-test-mem://src", "cli-test-mem://dst"]) == 0
    assert "copied 0 thread(s), 5 already present, 5 verified" in capsys.readouterr().out


def test_copy_one_scope_and_report_a_thread_that_differs(
    named_memory: _NamedMemory, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    asyncio.run(_fill("cli-test-mem://src", {"a": 2, "b": 1}))
    asyncio.run(_fill("cli-test-mem://dst", {"a": 1}, turns=1))  # a/t0 exists, other content
    assert main(["copy", "cli-test-mem://src", "cli-test-mem://dst", "--scope", "a"]) == 1
    captured = capsys.readouterr()
    assert "copied 1 thread(s), 0 already present, 1 verified, 1 mismatched" in captured.out
    assert "mismatch: scope 'a' thread 't0'" in captured.err
    assert asyncio.run(_digests("cli-test-mem://dst", "b", 1)) == [None]


class _NamedMemoryBundle(_NamedMemory):
    """Every memory component, each shared by URL host like the threads."""

    name = "cli-test-all"
    url_schemes = ("cli-test-all",)
    components = frozenset({"threads", "kv", "state", "snapshots", "guard"})
    _SHARED: ClassVar[dict[str, tuple[str, ...]]] = {
        "kv": ("_entries", "_lock"),
        "state": ("_users", "_lock"),
        "snapshots": ("_scopes", "_lock"),
        "guard": (),
    }

    def __init__(self) -> None:
        super().__init__()
        self.runtime: dict[tuple[str, str], Any] = {}

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, Any]:
        import pai_storage_memory as memory

        classes = {
            "kv": memory.MemoryKeyValueStore,
            "state": memory.MemoryAgentStateStore,
            "snapshots": memory.MemorySnapshotStore,
            "guard": memory.MemoryExecutionGuard,
        }
        opened: dict[str, Any] = {}
        for component in components:
            if component == "threads":
                opened[component] = self._open(url, **options)
                continue
            store = classes[component](**options)
            shared = self.runtime.setdefault((url.host or "", component), store)
            for attribute in self._SHARED[component]:
                setattr(store, attribute, getattr(shared, attribute))
            opened[component] = store
        return opened


@pytest.fixture
def named_bundle() -> Iterator[_NamedMemoryBundle]:
    backend = _NamedMemoryBundle()
    pai_storage.register_backend(backend)
    try:
        yield backend
    finally:
        pai_storage.unregister_backend(backend.name)


async def _fill_runtime(url: str) -> None:
    async with pai_storage.connect(url) as stores:
        await stores.kv.put(("tenant", "docs"), "readme", {"b": 1, "a": 1.0})
        await stores.kv.put(("tenant",), "short", "x", ttl=timedelta(hours=1))
        await stores.state.save(None, "anon", "mood", "curious")
        await stores.state.save_list("alice", "s1", "history", [1, {"two": 2.0}])
        await stores.snapshots.put("scope-a", "snap", b"\x00tar", metadata={"k": [1.0]})


async def _runtime_dump(url: str) -> list[Any]:
    async with pai_storage.connect(url) as stores:
        items = (await stores.kv.search((), limit=100)).items
        return [
            [(i.namespace, i.key, repr(i.value)) for i in items],
            await stores.state.get(None, "anon", "mood"),
            repr(await stores.state.get_list("alice", "s1", "history")),
            await stores.state.get_list("alice", "missing", "history"),
            (await stores.snapshots.get("scope-a", "snap") or _absent()).data,
        ]


def _absent() -> Any:
    raise AssertionError("snapshot missing")


def test_copy_all_copies_threads_then_runtime_data_and_resumes(
    named_bundle: _NamedMemoryBundle, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    asyncio.run(_fill("cli-test-all://src", {"a": 2}))
    asyncio.run(_fill_runtime("cli-test-all://src"))
    assert main(["copy", "cli-test-all://src", "cli-test-all://dst", "--all"]) == 0
    captured = capsys.readouterr()
    assert "copied 2 thread(s), 0 already present, 2 verified, 0 mismatched" in captured.out
    assert (
        "copied 5 runtime item(s), 0 already present (2 item(s), 2 session(s), 1 snapshot(s) "
        "in all), 5 verified, 0 mismatched"
    ) in captured.out
    assert "copy runtime data: 5/5 items" in captured.err
    source = asyncio.run(_runtime_dump("cli-test-all://src"))
    assert asyncio.run(_runtime_dump("cli-test-all://dst")) == source
    assert asyncio.run(_digests("cli-test-all://dst", "a", 2)) == asyncio.run(
        _digests("cli-test-all://src", "a", 2)
    )
    # Run again: everything is present; then a differing item makes it exit 1.
    assert main(["copy", "cli-test-all://src", "cli-test-all://dst", "--all"]) == 0
    assert "copied 0 runtime item(s), 5 already present" in capsys.readouterr().out

    async def differ() -> None:
        async with pai_storage.connect("cli-test-all://dst") as stores:
            await stores.state.save(None, "anon", "mood", "grumpy")

    asyncio.run(differ())
    assert main(["copy", "cli-test-all://src", "cli-test-all://dst", "--all"]) == 1
    captured = capsys.readouterr()
    assert "1 mismatched" in captured.out
    assert "mismatch: state (None, 'anon')" in captured.err


def test_copy_all_from_memory_to_sqlite_files(
    named_bundle: _NamedMemoryBundle, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    import asyncio

    pytest.importorskip("aiosqlite", reason="the sql extra is not installed")
    first, second = f"sqlite:///{tmp_path}/first.db", f"sqlite:///{tmp_path}/second.db"
    asyncio.run(_fill("cli-test-all://src", {"a": 2, "b": 1}))
    asyncio.run(_fill_runtime("cli-test-all://src"))
    source = asyncio.run(_runtime_dump("cli-test-all://src"))
    threads = asyncio.run(_digests("cli-test-all://src", "a", 2))
    assert main(["copy", "cli-test-all://src", first, "--all"]) == 0
    assert "copied 5 runtime item(s), 0 already present" in capsys.readouterr().out
    # SQLite to SQLite: what the first file holds is read from the database itself.
    assert main(["copy", first, second, "--all"]) == 0
    out = capsys.readouterr().out
    assert "copied 3 thread(s), 0 already present, 3 verified, 0 mismatched" in out
    assert "copied 5 runtime item(s), 0 already present" in out
    assert "5 verified, 0 mismatched" in out
    for url in (first, second):
        assert asyncio.run(_runtime_dump(url)) == source
        assert asyncio.run(_digests(url, "a", 2)) == threads
    assert main(["copy", first, second, "--all"]) == 0
    assert "copied 0 runtime item(s), 5 already present" in capsys.readouterr().out


def test_copy_all_is_refused_when_a_store_cannot_enumerate(
    named_memory: _NamedMemory, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    asyncio.run(_fill("cli-test-mem://src", {"a": 1}))
    assert main(["copy", "cli-test-mem://src", "cli-test-mem://dst", "--all"]) == 1
    err = capsys.readouterr().err
    assert "the source provides no kv store" in err
    assert "--all" in err
    # Refused before anything was written.
    assert asyncio.run(_digests("cli-test-mem://dst", "a", 1)) == [None]


def test_copy_all_with_a_scope_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["copy", "memory://", "memory://", "--all", "--scope", "a"]) == 1
    assert "cannot be combined with --scope" in capsys.readouterr().err


def test_export_to_a_file_then_import(
    named_memory: _NamedMemory, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    import asyncio
    import json

    asyncio.run(_fill("cli-test-mem://src", {"a": 2, "b": 1}))
    path = tmp_path / "threads.jsonl"
    assert main(["export", "cli-test-mem://src", "--scope", "a", "-o", str(path)]) == 0
    assert "exported 2 thread(s)" in capsys.readouterr().err
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"format": "pai-storage.threads", "version": 1}
    assert main(["import", "cli-test-mem://dst", str(path)]) == 0
    assert "imported 2 thread(s), skipped 0 existing" in capsys.readouterr().out
    source = asyncio.run(_digests("cli-test-mem://src", "a", 2))
    assert asyncio.run(_digests("cli-test-mem://dst", "a", 2)) == source
    assert main(["import", "cli-test-mem://dst", str(path)]) == 0
    assert "imported 0 thread(s), skipped 2 existing" in capsys.readouterr().out
    assert main(["import", "cli-test-mem://dst", str(path), "--fail-on-existing"]) == 1
    assert "ThreadExistsError: line 2" in capsys.readouterr().err


def test_export_to_stdout_of_every_scope(
    named_memory: _NamedMemory, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    import json

    asyncio.run(_fill("cli-test-mem://src", {"a": 1, "b": 1}, turns=1))
    assert main(["export", "cli-test-mem://src"]) == 0
    out = capsys.readouterr().out
    roots = [json.loads(line)["thread"] for line in out.splitlines() if '"kind":"thread"' in line]
    assert sorted((r["scopeKey"], r["threadId"]) for r in roots) == [("a", "t0"), ("b", "t0")]


def test_import_of_a_corrupt_file_names_the_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"format":"pai-storage.threads","version":1}\n{"kind":"thread"\n')
    assert main(["import", "memory://", str(path)]) == 1
    err = capsys.readouterr().err
    assert "ThreadStoreInvariantError: line 2: not JSON" in err
    assert "Traceback" not in err
    assert main(["import", "memory://", str(tmp_path / "missing.jsonl")]) == 1
    assert "missing.jsonl" in capsys.readouterr().err


def test_copy_never_prints_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["copy", "memory://", "nosuch://user:s3cret@host/db"]) == 1
    err = capsys.readouterr().err
    assert "s3cret" not in err
    assert "pai-storage: error:" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_copy_progress_is_a_bar_on_a_terminal() -> None:
    from pai_storage.cli import _Progress

    stream = _Terminal()
    progress = _Progress("copy", stream)
    progress.start(3)
    for _ in range(3):
        progress.advance()
    progress.close()
    shown = stream.getvalue()
    assert "copy" in shown
    assert "3/3" in shown
    assert "threads" not in shown  # not the plain line
