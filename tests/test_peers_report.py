"""``bench/peers/report.py``: the generated comparisons say what the results hold."""

from __future__ import annotations

from typing import Any

from bench.peers.report import _one_commit, section


def _row(
    key: str,
    system: str,
    label: str,
    turns: dict[int, float | None],
    *,
    primary: bool = True,
    database: str = "postgresql",
) -> dict[str, Any]:
    return {
        "key": key,
        "system": system,
        "component": label,
        "label": label,
        "database": database,
        "primary": primary,
        "turn": {str(n): {"n": 0 if ms is None else 30, "median": ms} for n, ms in turns.items()},
        "read": {},
        "turn_shape": "",
        "read_shape": "",
        "list_shape": "",
    }


def _results(*rows: dict[str, Any]) -> dict[str, Any]:
    config = {"lengths": [10, 1000], "big": None, "window": 30, "reads": 50}
    config |= {"list_threads": 100, "lists": 20, "concurrency": 8, "storage_at": 1000}
    meta = {"config": config, "date": "d", "machine": "m", "python": "3", "servers": {}}
    meta["versions"] = {}
    return {"meta": meta, "rows": list(rows)}


RESULTS = _results(
    _row("pai-postgres/2 commits/turn", "pai-storage", "pai two", {10: 4.0, 1000: 5.0}),
    _row(
        "pai-postgres/1 commit/turn", "pai-storage", "pai one", {10: 2.0, 1000: 2.0}, primary=False
    ),
    _row("peer", "Peer", "Peer Session", {10: 2.0, 1000: 400.0}),
)


def test_one_commit_turn_is_shown_against_every_turn_of_its_database() -> None:
    assert _one_commit(RESULTS) == [
        "**PostgreSQL**: 0.40-0.50x of its 2-commit turn; 0.005-1.00x of Peer Session's."
    ]


def test_one_commit_turn_needs_both_pai_storage_rows() -> None:
    assert _one_commit(_results(*RESULTS["rows"][::2])) == []
    assert "### The 1-commit turn" not in section(_results(*RESULTS["rows"][::2]), [], "")
    assert "### The 1-commit turn" in section(RESULTS, [], "")


def test_shares_are_spans_over_the_measured_lengths() -> None:
    results = _results(
        _row(
            "pai-memory/2 commits/turn",
            "pai-storage",
            "two",
            {10: 2.0, 1000: 2.0},
            database="memory",
        ),
        _row(
            "pai-memory/1 commit/turn",
            "pai-storage",
            "one",
            {10: 1.0, 1000: 1.0},
            primary=False,
            database="memory",
        ),
        _row("tiny", "Peer", "Slow", {10: 2_000.0, 1000: None}, database="memory"),
    )
    # One share when both ends print alike; a length without a median is left out;
    # a share below a thousandth is printed as such.
    assert _one_commit(results) == [
        "**In process (no database)**: 0.50x of its 2-commit turn; <0.001x of Slow's."
    ]
