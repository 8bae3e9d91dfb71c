"""Machine-readable CLI output (--json), durability in `check`, `copy` onto itself refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pai_storage.cli import main


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("memory://", "none"),
        ("sqlite:///:memory:", "none"),
        ("sqlite://", "none"),
        ("postgresql://postgres@127.0.0.1/test", "synchronous_commit"),
    ],
)
def test_check_reports_durability_for_every_url(
    url: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", url]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[:-1])
    assert words in rows["durability"]
    assert main(["check", url, "--json"]) == 0
    document = _json(capsys)
    assert document["ok"] is True
    assert words in document["durability"]
    assert document["url"] == url


def test_check_of_a_sqlite_file_is_durable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", f"sqlite:///{tmp_path}/app.db", "--json"]) == 0
    document = _json(capsys)
    assert document["durability"].startswith(f"file {tmp_path}/app.db")
    assert document["backend"] == "sql"


def test_check_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "nope://u:s3cret@h/db", "--json"]) == 1
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["ok"] is False
    assert "no backend serves URL scheme 'nope'" in document["error"]["message"]
    assert document["error"]["type"].endswith("ConfigurationError")
    assert "s3cret" not in captured.out + captured.err
    assert main(["check", "sqlite://foo.db", "--json"]) == 1
    assert "sqlite:///foo.db" in _json(capsys)["error"]["message"]


def _fill_file(path: Path) -> None:
    import asyncio

    import pai_storage
    from pai_storage import builders

    async def fill() -> None:
        async with pai_storage.connect(f"sqlite:///{path}") as stores:
            for i in range(3):
                await stores.threads.commit_thread(builders.create("a", f"t{i}"))
            await stores.kv.put(("ns",), "k", {"v": 1})

    asyncio.run(fill())


def test_copy_and_import_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, target = tmp_path / "source.db", tmp_path / "target.db"
    _fill_file(source)
    src, dst = f"sqlite:///{source}", f"sqlite:///{target}"
    assert main(["copy", src, dst, "--json"]) == 0
    document = _json(capsys)
    assert document == {
        "ok": True,
        "threads": {"copied": 3, "present": 0, "verified": 3, "mismatched": []},
    }
    assert main(["copy", src, dst, "--all", "--json"]) == 0
    document = _json(capsys)
    assert document["ok"] is True
    assert document["threads"]["present"] == 3
    assert document["runtime"]["copied"] == 1
    assert document["runtime"]["kv"] == 1
    export = tmp_path / "export.jsonl"
    assert main(["export", src, "-o", str(export)]) == 0
    capsys.readouterr()
    assert main(["import", f"sqlite:///{tmp_path}/third.db", str(export), "--json"]) == 0
    document = _json(capsys)
    assert document["ok"] is True
    assert len(document["imported"]) == 3
    assert {"scopeKey": "a", "threadId": "t0"} in document["imported"]
    assert document["skipped"] == []
    assert main(["import", "memory://", str(tmp_path / "missing.jsonl"), "--json"]) == 1
    assert _json(capsys)["ok"] is False


@pytest.mark.parametrize("extra", [[], ["--all"]])
def test_copy_refuses_a_source_equal_to_its_target(
    extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    _fill_file(tmp_path / "app.db")
    same = [
        ("sqlite:///app.db", f"sqlite:///{tmp_path}/app.db"),
        ("memory://", "memory://"),
        ("postgresql://postgres@127.0.0.1/test", "postgres://postgres@127.0.0.1/test"),
    ]
    for source, target in same:
        assert main(["copy", source, target, *extra]) == 1, (source, target)
        assert "the same store" in capsys.readouterr().err
    assert main(["copy", "sqlite:///app.db", "sqlite:///other.db", *extra, "--json"]) == 0
    assert _json(capsys)["ok"] is True


def test_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["bench", "memory://", "-n", "2", "-m", "2", "-k", "1", "--no-progress", "--json"]
    )
    assert status == 0
    document = _json(capsys)
    assert document["ok"] is True
    assert (document["threads"], document["messages"], document["writers"]) == (2, 2, 1)
    assert document["operations"]["commit"]["count"] == 4
    assert document["operations"]["commit"]["p50Ms"] > 0
    assert document["cleanedUp"] is True


def test_bench_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nope://", "--json"]) == 1
    document = _json(capsys)
    assert document["ok"] is False
    assert "nope" in document["error"]["message"]
