"""Guard races on the shared server: 16 workers, 3 resources, short leases.

Every worker has its own guard (its own client, as separate processes would);
each takes a random resource again and again, checks inside the critical
section that nobody else is in it and that the server agrees it holds the
lock, and records its fencing token. Then: never two holders at once, and per
resource the fencing tokens of consecutive holders strictly increase (all of
them distinct across resources).
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

from pai_storage import ExecutionGuard, open_guard

WORKERS = 16
RESOURCES = ("sandbox-a", "sandbox-b", "sandbox-c")
ROUNDS = 12
LEASE = timedelta(seconds=2)
"""Short (the default is 30 minutes), yet long enough that a renewal answered
late on a loaded machine does not lose a lock held for a few milliseconds."""


async def test_sixteen_workers_three_resources_never_two_holders(
    redis_url: str, prefix: str
) -> None:
    guards: list[ExecutionGuard] = [
        open_guard(
            redis_url,
            key_prefix=prefix,
            lease_ttl=LEASE,
            retry_interval=timedelta(milliseconds=10),
            lock_timeout=timedelta(seconds=120),
        )
        for _ in range(WORKERS)
    ]
    inside: dict[str, int | None] = dict.fromkeys(RESOURCES)
    fences: dict[str, list[int]] = {r: [] for r in RESOURCES}
    overlaps: list[str] = []
    rng = random.Random(37)

    async def worker(n: int) -> None:
        guard = guards[n]
        for _ in range(ROUNDS):
            resource = rng.choice(RESOURCES)
            async with guard.hold(resource, owner=f"worker-{n}") as lock:
                if inside[resource] is not None:
                    overlaps.append(f"{resource}: {inside[resource]} and {n}")
                inside[resource] = n
                fences[resource].append(lock.fencing_token)
                info = await guard.inspect(resource)
                assert info is not None
                assert info.fencing_token == lock.fencing_token
                await asyncio.sleep(rng.uniform(0, 0.004))
                assert not lock.lost.is_set()
                if inside[resource] != n:
                    overlaps.append(f"{resource}: {n} was joined by {inside[resource]}")
                inside[resource] = None

    try:
        await asyncio.gather(*(worker(n) for n in range(WORKERS)))
    finally:
        for guard in guards:
            await guard.close()
    assert overlaps == []
    every = [f for tokens in fences.values() for f in tokens]
    assert len(every) == WORKERS * ROUNDS
    assert len(set(every)) == len(every), "a fencing token was handed out twice"
    for resource, tokens in fences.items():
        assert tokens == sorted(tokens), f"{resource}: fencing tokens went backwards"
