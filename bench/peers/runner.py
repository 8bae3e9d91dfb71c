"""Drives the workload (see :mod:`bench.peers.workload`) through each peer."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

from .workload import Infra, Peer, turn_messages

GROW_TENANT = "tenant-grow"
LIST_TENANT = "tenant-list"


@dataclass
class Config:
    lengths: tuple[int, ...] = (10, 100, 1000)
    big: int = 10_000  # 0: skip the 10,000-message measurement
    window: int = 30  # turns timed at each length
    reads: int = 50  # timed reads of the newest 20 at each length
    list_threads: int = 10_000
    lists: int = 20  # timed list calls
    concurrency: int = 8  # populating the tenant
    storage_at: int = 1000  # messages
    grow_cap: float = 180.0  # seconds of timed growth turns
    seed_cap: float = 150.0  # seconds to fast-forward to `big`
    big_cap: float = 60.0  # seconds of timed turns at `big`
    populate_cap: float = 240.0  # seconds to populate the tenant
    read_cap: float = 30.0
    list_cap: float = 60.0


def summarize(seconds: list[float]) -> dict[str, Any]:
    ms = sorted(s * 1000.0 for s in seconds)
    if not ms:
        return {"n": 0}
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return {
        "n": len(ms),
        "median": statistics.median(ms),
        "p95": p95,
        "min": ms[0],
        "max": ms[-1],
    }


def log(message: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def _timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = await call
    return time.perf_counter() - start, value


class PeerRun:
    """Runs every phase on one peer and collects one result row per variant."""

    def __init__(self, peer: Peer, infra: Infra, config: Config) -> None:
        self.peer = peer
        self.infra = infra
        self.config = config
        self.rows: dict[str, dict[str, Any]] = {}
        for variant in peer.variants:
            self.rows[variant] = {
                "key": peer.key + (f"/{variant}" if variant else ""),
                "system": peer.system,
                "component": peer.component,
                "variant": variant,
                "label": peer.label(variant),
                "database": peer.database,
                "turn_shape": peer.turn_shape,
                "read_shape": peer.read_shape,
                "list_shape": peer.list_shape,
                "primary": variant == peer.variants[0],
                "growth": [],
                "turn": {},
                "read": {},
                "list": None,
                "storage": None,
                "notes": [],
                "errors": [],
            }

    def _error(self, variant: str, phase: str, exc: BaseException) -> None:
        detail = f"{phase}: {type(exc).__name__}: {exc}"
        log(f"{self.peer.key}: {detail}")
        traceback.print_exc(file=sys.stderr)
        self.rows[variant]["errors"].append(detail[:500])

    async def run(self) -> list[dict[str, Any]]:
        peer, cfg = self.peer, self.config
        first = peer.variants[0]
        log(f"{peer.key}: open")
        await peer.open(self.infra)
        try:
            baseline = None
            try:
                await self._warm_up()
                baseline = await peer.storage()
            except Exception as exc:
                self._error(first, "storage baseline", exc)
            for index, variant in enumerate(peer.variants):
                await self._grow(variant, index, baseline)
            if cfg.big:
                for index, variant in enumerate(peer.variants):
                    await self._big(variant, index)
            await self._list(first)
        finally:
            try:
                await peer.close()
            except Exception as exc:
                self._error(first, "close", exc)
        return list(self.rows.values())

    async def _warm_up(self) -> None:
        """A few untimed turns and reads: pools connected, code paths warm."""
        for index, variant in enumerate(self.peer.variants):
            conv = f"warmup-{index}"
            await self.peer.start(conv, GROW_TENANT, variant)
            for turn in range(5):
                user, reply = turn_messages(conv, turn)
                await self.peer.turn(conv, turn, user, reply)
            for _ in range(3):
                await self.peer.read_recent(conv)

    async def _reads(self, variant: str, conv: str, length: int) -> None:
        cfg = self.config
        samples: list[float] = []
        started = time.perf_counter()
        got = 0
        for _ in range(cfg.reads):
            seconds, got = await _timed(self.peer.read_recent(conv))
            samples.append(seconds)
            if time.perf_counter() - started > cfg.read_cap:
                self.rows[variant]["notes"].append(f"read@{length}: capped after {len(samples)}")
                break
        stats = summarize(samples)
        stats["returned"] = got
        self.rows[variant]["read"][str(length)] = stats

    async def _grow(self, variant: str, index: int, baseline: Any) -> None:
        peer, cfg, row = self.peer, self.config, self.rows[variant]
        conv = f"grow-{index}"
        target = max(cfg.lengths) + 2 * cfg.window
        log(f"{peer.key}{' ' + variant if variant else ''}: grow to {target} messages")
        try:
            await peer.start(conv, GROW_TENANT, variant)
            timed = 0.0
            turn = 0
            windows = set(cfg.lengths)
            while 2 * turn < target:
                if 2 * turn in windows:
                    await peer.settle()
                user, reply = turn_messages(conv, turn)
                seconds, _ = await _timed(peer.turn(conv, turn, user, reply))
                row["growth"].append([2 * turn, seconds * 1000.0])
                timed += seconds
                turn += 1
                if 2 * turn == cfg.storage_at and row["primary"]:
                    at = await peer.storage()
                    if at is not None and baseline is not None:
                        row["storage"] = {
                            "messages": cfg.storage_at,
                            "baseline": asdict(baseline),
                            "at": asdict(at),
                            "bytes_per_msg": (at.primary - baseline.primary) / cfg.storage_at,
                            "detail_per_msg": {
                                k: (v - baseline.detail.get(k, 0)) / cfg.storage_at
                                for k, v in at.detail.items()
                            },
                        }
                if timed > cfg.grow_cap:
                    row["notes"].append(
                        f"growth capped at {2 * turn} messages after {timed:.0f} s of turns"
                    )
                    break
            for length in cfg.lengths:
                window = [ms for (n, ms) in row["growth"] if length <= n < length + 2 * cfg.window]
                if window:
                    row["turn"][str(length)] = summarize([ms / 1000.0 for ms in window])
            if row["primary"] and 2 * turn >= max(cfg.lengths):
                await peer.settle()
                await self._reads(variant, conv, max(cfg.lengths))
        except Exception as exc:
            self._error(variant, "grow", exc)

    async def _big(self, variant: str, index: int) -> None:
        peer, cfg, row = self.peer, self.config, self.rows[variant]
        conv = f"big-{index}"
        log(f"{peer.key}{' ' + variant if variant else ''}: seed {cfg.big} messages")
        try:
            await peer.start(conv, GROW_TENANT, variant)
            turns = [turn_messages(conv, t) for t in range(cfg.big // 2)]
            started = time.perf_counter()
            try:
                async with asyncio.timeout(cfg.seed_cap):
                    await peer.seed(conv, turns)
            except TimeoutError:
                row["turn"][str(cfg.big)] = {
                    "n": 0,
                    "skipped": f"seeding exceeded {cfg.seed_cap:.0f} s",
                }
                row["notes"].append(f"turn@{cfg.big}: seeding exceeded {cfg.seed_cap:.0f} s")
                return
            row.setdefault("seed_seconds", {})[str(cfg.big)] = time.perf_counter() - started
            await peer.settle()
            log(f"{peer.key}: seeded in {time.perf_counter() - started:.1f} s; timed turns")
            samples: list[float] = []
            spent = 0.0
            for t in range(cfg.big // 2, cfg.big // 2 + cfg.window):
                user, reply = turn_messages(conv, t)
                seconds, _ = await _timed(peer.turn(conv, t, user, reply))
                samples.append(seconds)
                spent += seconds
                if spent > cfg.big_cap:
                    row["notes"].append(
                        f"turn@{cfg.big}: capped after {len(samples)} turns ({spent:.0f} s)"
                    )
                    break
            row["turn"][str(cfg.big)] = summarize(samples)
            if row["primary"]:
                await self._reads(variant, conv, cfg.big)
        except Exception as exc:
            self._error(variant, f"big {cfg.big}", exc)

    async def _list(self, variant: str) -> None:
        peer, cfg, row = self.peer, self.config, self.rows[variant]
        if peer.list_shape is None:
            row["list"] = {"n": 0, "unsupported": True}
            return
        log(f"{peer.key}: populate {cfg.list_threads} conversations")
        try:
            started = time.perf_counter()
            try:
                async with asyncio.timeout(cfg.populate_cap):
                    await peer.populate(LIST_TENANT, cfg.list_threads, cfg.concurrency)
            except TimeoutError:
                row["list"] = {"n": 0, "skipped": f"populating exceeded {cfg.populate_cap:.0f} s"}
                return
            populate_s = time.perf_counter() - started
            await peer.settle()
            log(f"{peer.key}: populated in {populate_s:.1f} s; timed lists")
            samples: list[float] = []
            got = 0
            started = time.perf_counter()
            for _ in range(cfg.lists):
                try:
                    # One call can scan every checkpoint of every thread (LangGraph's
                    # metadata filter): cap each call, not only the series.
                    async with asyncio.timeout(cfg.list_cap):
                        seconds, got = await _timed(peer.list_recent(LIST_TENANT))
                except TimeoutError:
                    row["list"] = {"n": 0, "skipped": f"one list exceeded {cfg.list_cap:.0f} s"}
                    row["notes"].append(f"list: one call exceeded {cfg.list_cap:.0f} s")
                    return
                samples.append(seconds)
                if time.perf_counter() - started > cfg.list_cap:
                    row["notes"].append(f"list: capped after {len(samples)} calls")
                    break
            stats = summarize(samples)
            stats["returned"] = got
            stats["populate_seconds"] = populate_s
            row["list"] = stats
        except Exception as exc:
            self._error(variant, "list", exc)
