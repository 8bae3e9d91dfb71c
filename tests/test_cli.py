"""The ``pai-storage`` command line: demo, check, bench, --version."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from pai_storage_conformance.provision import TestHarness

import pai_storage
from pai_storage import ThreadStore
from pai_storage.backend import Backend, StoreURL
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
        return pai_storage.get_backend("memory").open(pai_storage.make_url("memory://"), **options)

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
