"""The Redis execution guard: one hash per held lock, fencing tokens from one counter.

Keys (``R`` is the guard's root, ``{pai:guard}`` by default):

- ``R:k:<resource>``: the lock's hash -- ``k`` (token), ``o`` (owner), ``f``
  (fencing token), ``a`` (acquired, ms) and ``e`` (expires, ms);
- ``R:fence``: the last fencing token handed out; it never expires and is
  never deleted by the guard;
- ``R:exp``: the resources of held locks scored by expiry, for
  :meth:`purge_expired`.

Every primitive is one Lua script judged on the store's clock, so of
concurrent acquisitions exactly one wins and renew / release act only on the
caller's token. A new fencing token is the greater of the last one + 1 and
the server's time in microseconds: with persistence that loses the last
second of writes (``appendfsync everysec``) a restarted server still hands
out larger tokens than any it acknowledged before, as long as its clock does
not go back. With the server's clock the lock's key also gets a Redis expiry.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pai_storage.guard import ExecutionGuard, LockInfo

from .client import CLOCK_LUA, from_ms, ms
from .runtime import RedisRuntimeStore

__all__ = ["RedisExecutionGuard"]

PURGE_BATCH = 1000

# KEYS: lock, fence counter, expiry index. ARGV: clock, resource, token, owner,
# lease ms, native. Returns false (held) or {fencing token, acquired, expires}.
ACQUIRE = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local held = redis.call('HGET', KEYS[1], 'e')
if held and tonumber(held) > now then return false end
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = math.max(last + 1, floor)
redis.call('SET', KEYS[2], num(fence))
local e = num(now + tonumber(ARGV[5]))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'k', ARGV[3], 'o', ARGV[4], 'f', num(fence), 'a', num(now), 'e', e)
redis.call('ZADD', KEYS[3], e, ARGV[2])
if ARGV[6] == '1' then redis.call('PEXPIREAT', KEYS[1], e) end
return {num(fence), num(now), e}
"""
)

# KEYS: lock, expiry index. ARGV: clock, resource, token, lease ms, native.
RENEW = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], 'k', 'e')
if r[1] ~= ARGV[3] or not r[2] or tonumber(r[2]) <= now then return false end
local e = num(now + tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], 'e', e)
redis.call('ZADD', KEYS[2], e, ARGV[2])
if ARGV[5] == '1' then redis.call('PEXPIREAT', KEYS[1], e) end
return e
"""
)

# KEYS: lock, expiry index. ARGV: clock, resource, token.
RELEASE = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], 'k', 'e')
if r[1] ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
if tonumber(r[2]) <= now then return 0 end
return 1
"""
)

# KEYS: lock. ARGV: clock.
INSPECT = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], 'o', 'f', 'a', 'e')
if not r[4] or tonumber(r[4]) <= now then return false end
return r
"""
)

# KEYS: expiry index. ARGV: clock, lock key base, batch.
PURGE = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now), 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
for _, resource in ipairs(due) do
  local L = ARGV[2] .. resource
  local e = redis.call('HGET', L, 'e')
  if e and tonumber(e) > now then
    redis.call('ZADD', KEYS[1], e, resource)
  else
    if e then
      redis.call('DEL', L)
      n = n + 1
    end
    redis.call('ZREM', KEYS[1], resource)
  end
end
return {n, #due}
"""
)


class RedisExecutionGuard(RedisRuntimeStore, ExecutionGuard):
    """Locks in Redis, sharing the client of a ``connect()`` call.

    Parameters
    ----------
    url, client, key_prefix, cluster, connect_timeout, socket_timeout, max_connections:
        As for :class:`~pai_storage_redis.RedisKeyValueStore`.
    lock_timeout, lease_ttl, retry_interval, clock, on_warning, token_secret:
        The options of :class:`~pai_storage.guard.ExecutionGuard`.
    """

    component = "guard"

    def __init__(self, url: Any = None, *, client: object = None, **options: Any) -> None:
        super().__init__(url, client, **options)
        self._exp = self.root + ":exp"
        self._fence = self.root + ":fence"

    def _lock(self, resource: str) -> str:
        return f"{self.root}:k:{resource}"

    # ------------------------------------------------------------ primitives

    async def _acquire(
        self, resource: str, owner: str, token: str, lease_ttl: timedelta
    ) -> LockInfo | None:
        found = await self.write(
            ACQUIRE,
            [self._lock(resource), self._fence, self._exp],
            resource,
            token,
            owner,
            ms(lease_ttl),
            self.native_expiry(),
        )
        if not found:
            return None
        fence, acquired, expires = found
        return LockInfo.model_construct(
            resource=resource,
            owner=owner,
            fencing_token=int(fence),
            acquired_at=from_ms(acquired),
            expires_at=from_ms(expires),
        )

    async def _renew(self, resource: str, token: str, lease_ttl: timedelta) -> datetime | None:
        found = await self.write(
            RENEW,
            [self._lock(resource), self._exp],
            resource,
            token,
            ms(lease_ttl),
            self.native_expiry(),
        )
        return None if found is None else from_ms(found)

    async def _release(self, resource: str, token: str) -> bool:
        return bool(await self.write(RELEASE, [self._lock(resource), self._exp], resource, token))

    async def _inspect(self, resource: str) -> LockInfo | None:
        found = await self.read(INSPECT, [self._lock(resource)])
        if not found:
            return None
        owner, fence, acquired, expires = found
        return LockInfo.model_construct(
            resource=resource,
            owner=owner.decode(),
            fencing_token=int(fence),
            acquired_at=from_ms(acquired),
            expires_at=from_ms(expires),
        )

    async def _purge_expired(self) -> int:
        total = 0
        while True:
            deleted, seen = await self.write(PURGE, [self._exp], f"{self.root}:k:", PURGE_BATCH)
            total += int(deleted)
            if int(seen) < PURGE_BATCH:
                return total
