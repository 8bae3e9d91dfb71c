"""Two systems head to head, call by call: the steadier comparison of one pair.

The full run (:mod:`bench.peers.runner`) measures the systems one after the
other, so a change in the machine's load between them moves their ratio. Here
two systems share one run: each turn and each read of one is followed by the
same call on the other (which goes first alternates), so whatever the machine
does meanwhile hits both alike::

    .venv/bin/python -m bench.peers --versus pai-mongo,openai-mongo

Each system grows one conversation turn by turn (the workload's turns, in
every variant the system has, each its own conversation) to ``length``
messages; the last ``window`` turns are timed. Then ``reads`` reads of the
newest 20 messages of each conversation are timed, alternating the same way.
Printed: medians and 95th percentiles, and each ratio against the second
system's median.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from .runner import GROW_TENANT, log, summarize
from .workload import Peer, turn_messages

Call = Callable[[], Awaitable[Any]]


async def _alternating(calls: dict[str, Call], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call per round; the order of the calls rotates every round."""
    samples: dict[str, list[float]] = {key: [] for key in calls}
    keys = list(calls)
    for i in range(rounds):
        shift = i % len(keys)
        for key in keys[shift:] + keys[:shift]:
            started = time.perf_counter()
            await calls[key]()
            samples[key].append(time.perf_counter() - started)
    return samples


async def versus(
    peers: dict[str, Peer], infra: Any, *, length: int, window: int, reads: int
) -> dict[str, Any]:
    """Turn and read-20 samples of every (system, variant), interleaved."""
    lanes: dict[str, tuple[Peer, str, str]] = {}  # label -> (peer, variant, conversation)
    for key, peer in peers.items():
        await peer.open(infra)
        for index, variant in enumerate(peer.variants):
            label = key + (f" ({variant})" if variant else "")
            conv = f"versus-{index}"
            await peer.start(conv, GROW_TENANT, variant)
            lanes[label] = (peer, variant, conv)
    try:
        turns = length // 2
        log(f"versus: {', '.join(lanes)}: grow to {length} messages, then {window} timed turns")
        done = dict.fromkeys(lanes, 0)

        def turn_call(label: str) -> Call:
            peer, _, conv = lanes[label]
            # Made before the timing: the text generator is not part of a turn.
            messages = [turn_messages(conv, number) for number in range(turns + window)]

            async def call() -> None:
                number = done[label]
                user, reply = messages[number]
                await peer.turn(conv, number, user, reply)
                done[label] = number + 1

            return call

        calls = {label: turn_call(label) for label in lanes}
        await _alternating(calls, turns)  # untimed growth, interleaved as well
        for peer in peers.values():
            await peer.settle()
        turn_samples = await _alternating(calls, window)
        for peer in peers.values():
            await peer.settle()

        def read_call(peer: Peer, conv: str) -> Call:
            return lambda: peer.read_recent(conv)

        read_calls = {  # one read per system: its first conversation
            label: read_call(peer, conv)
            for label, (peer, variant, conv) in lanes.items()
            if variant == peer.variants[0]
        }
        read_samples = await _alternating(read_calls, reads)
    finally:
        for peer in peers.values():
            await peer.close()
    return {
        "length": length,
        "turn": {label: summarize(s) for label, s in turn_samples.items()},
        "read": {label: summarize(s) for label, s in read_samples.items()},
    }


def versus_table(result: dict[str, Any], baseline: str) -> str:
    """A Markdown table of the medians, each ratio against ``baseline``'s lanes."""
    lines = [
        f"Turns at {result['length']:,} messages and reads of the newest 20, "
        "interleaved call by call.",
        "",
        "| system | turn median | turn p95 | vs baseline "
        "| read-20 median | read p95 | vs baseline |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    base_turn = next(v["median"] for k, v in result["turn"].items() if k.startswith(baseline))
    base_read = next(v["median"] for k, v in result["read"].items() if k.startswith(baseline))
    for label, turn in result["turn"].items():
        read = result["read"].get(label)
        read_cells = (
            f"{read['median']:.2f} ms | {read['p95']:.2f} ms | {read['median'] / base_read:.2f}x"
            if read
            else "| |"
        )
        lines.append(
            f"| {label} | {turn['median']:.2f} ms | {turn['p95']:.2f} ms | "
            f"{turn['median'] / base_turn:.2f}x | {read_cells} |"
        )
    return "\n".join(lines)
