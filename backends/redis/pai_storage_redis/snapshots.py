"""The Redis snapshot store: one hash per snapshot, one sorted set per scope for the order.

Keys (``R`` is the store's root, ``{pai:snapshots}`` by default; ``<c>`` is
the creation time in ms as 15 decimal digits):

- ``R:d:<scope>\\0<id>``: the snapshot's hash -- ``d`` (the data), ``m``
  (metadata JSON), ``z`` (size), ``h`` (SHA-256), ``c`` (created, ms) and
  ``e`` (expires, ms) when it expires;
- ``R:o:<scope>``: a sorted set of ``<c>\\0<id>`` at score 0; read backwards
  by bytes (``ZREVRANGEBYLEX``) it is newest first, then snapshot id
  descending, the order of :meth:`list`, and a page starts strictly before
  the last position;
- ``R:exp``: ``<scope>\\0<c>\\0<id>`` scored by expiry, for :meth:`purge_expired`.

A snapshot is at most 64 MiB (:attr:`RedisSnapshotStore.max_snapshot_bytes`):
Redis holds it in memory and sends it in one reply. Every operation is one
Lua script. With the server's clock the snapshot's hash also gets a Redis
expiry (``PEXPIREAT``); entries of the order and expiry sets that outlive it
are skipped by every read and removed by :meth:`purge_expired`.
"""

from __future__ import annotations

import builtins
import json
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pai_storage.backend import Clock, SnapshotDraft, SnapshotStore, StoreURL, WarningCallback
from pai_storage.snapshots import DEFAULT_SNAPSHOT_TTL, Snapshot, SnapshotInfo
from pai_storage.state import ENUMERATE

from .client import CLOCK_LUA, from_ms, ms, to_ms
from .runtime import RedisRuntimeStore

__all__ = ["RedisSnapshotStore"]

PURGE_BATCH = 500

_SNAP_LUA = (
    CLOCK_LUA
    + """
local function pad(c) return string.format('%015.0f', tonumber(c)) end
-- The live snapshot hash behind an order entry ('<c>\\0<id>'), or false.
local function fetch(D, entry, now, fields)
  local r = redis.call('HMGET', D, 'c', 'e', unpack(fields))
  if not r[1] or pad(r[1]) ~= string.sub(entry, 1, 15) then return false end
  if r[2] and tonumber(r[2]) <= now then return false end
  return r
end
"""
)

# KEYS: hash, order set, expiry index, scope index. ARGV: clock, id, data, metadata,
# size, sha256, ttl ms or '', native, scope.
PUT = (
    _SNAP_LUA
    + """
local now = clock(ARGV[1])
local D, O, X, id, scope = KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[9]
local old = redis.call('HGET', D, 'c')
if old then
  redis.call('ZREM', O, pad(old) .. '\\0' .. id)
  redis.call('ZREM', X, scope .. '\\0' .. pad(old) .. '\\0' .. id)
end
redis.call('DEL', D)
local c = num(now)
local e = false
if ARGV[7] ~= '' then
  e = num(now + tonumber(ARGV[7]))
  redis.call('HSET', D, 'd', ARGV[3], 'm', ARGV[4], 'z', ARGV[5], 'h', ARGV[6], 'c', c, 'e', e)
  redis.call('ZADD', X, e, scope .. '\\0' .. pad(c) .. '\\0' .. id)
  if ARGV[8] == '1' then redis.call('PEXPIREAT', D, e) end
else
  redis.call('HSET', D, 'd', ARGV[3], 'm', ARGV[4], 'z', ARGV[5], 'h', ARGV[6], 'c', c)
end
redis.call('ZADD', O, 0, pad(c) .. '\\0' .. id)
redis.call('ZADD', KEYS[4], 0, scope)
return {c, e}
"""
)

# KEYS: hash. ARGV: clock. Returns false or {c, e, data, metadata, size, sha256}.
GET = (
    _SNAP_LUA
    + """
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], 'c', 'e', 'd', 'm', 'z', 'h')
if not r[1] or (r[2] and tonumber(r[2]) <= now) then return false end
return r
"""
)

# KEYS: order set. ARGV: clock, hash base of the scope, start, limit, '1' with data.
# Returns {id, c, e, metadata, size, sha256[, data]} per live snapshot, newest first.
LIST = (
    _SNAP_LUA
    + """
local now = clock(ARGV[1])
local base, start, limit = ARGV[2], ARGV[3], tonumber(ARGV[4])
local fields = {'m', 'z', 'h'}
if ARGV[5] == '1' then fields[4] = 'd' end
local out = {}
while #out < limit do
  local want = limit - #out
  local batch = redis.call('ZREVRANGEBYLEX', KEYS[1], start, '-', 'LIMIT', 0, want)
  for _, entry in ipairs(batch) do
    local id = string.sub(entry, 17)
    local r = fetch(base .. id, entry, now, fields)
    if r then
      r[#r + 1] = id
      out[#out + 1] = r
    end
    start = '(' .. entry
  end
  if #batch < want then break end
end
return out
"""
)

# KEYS: hash, order set, expiry index, scope index. ARGV: clock, id, scope.
DELETE = (
    _SNAP_LUA
    + """
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], 'c', 'e')
if not r[1] then return 0 end
redis.call('ZREM', KEYS[2], pad(r[1]) .. '\\0' .. ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[3] .. '\\0' .. pad(r[1]) .. '\\0' .. ARGV[2])
redis.call('DEL', KEYS[1])
if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('ZREM', KEYS[4], ARGV[3]) end
if r[2] and tonumber(r[2]) <= now then return 0 end
return 1
"""
)

# KEYS: expiry index, scope index. ARGV: clock, hash base, order set base, batch.
PURGE = (
    _SNAP_LUA
    + """
local now = clock(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now), 'LIMIT', 0, tonumber(ARGV[4]))
for _, m in ipairs(due) do
  local sep = string.find(m, '\\0', 1, true)
  local scope, entry = string.sub(m, 1, sep - 1), string.sub(m, sep + 1)
  local id = string.sub(entry, 17)
  local D = ARGV[2] .. scope .. '\\0' .. id
  local c = redis.call('HGET', D, 'c')
  if c and pad(c) == string.sub(entry, 1, 15) then redis.call('DEL', D) end
  redis.call('ZREM', ARGV[3] .. scope, entry)
  if redis.call('ZCARD', ARGV[3] .. scope) == 0 then redis.call('ZREM', KEYS[2], scope) end
  redis.call('ZREM', KEYS[1], m)
end
return #due
"""
)

# KEYS: scope index. ARGV: clock, order set base, hash base, start, limit. Returns the
# scopes (after start) holding a live snapshot.
LIST_SCOPES = (
    _SNAP_LUA
    + """
local now = clock(ARGV[1])
local start, limit = ARGV[4], tonumber(ARGV[5])
local out = {}
while #out < limit do
  local want = limit - #out
  local scopes = redis.call('ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, want)
  for _, scope in ipairs(scopes) do
    local O, from, found = ARGV[2] .. scope, '+', false
    repeat
      local batch = redis.call('ZREVRANGEBYLEX', O, from, '-', 'LIMIT', 0, 50)
      for _, entry in ipairs(batch) do
        if fetch(ARGV[3] .. scope .. '\\0' .. string.sub(entry, 17), entry, now, {}) then
          found = true
          break
        end
        from = '(' .. entry
      end
    until found or #batch < 50
    if found then out[#out + 1] = scope end
    start = '(' .. scope
  end
  if #scopes < want then break end
end
return out
"""
)


class RedisSnapshotStore(RedisRuntimeStore, SnapshotStore):
    """Snapshots of at most 64 MiB in Redis, one Lua script per operation.

    Parameters
    ----------
    url, client, key_prefix, cluster, connect_timeout, socket_timeout, max_connections:
        As for :class:`~pai_storage_redis.RedisKeyValueStore`.
    clock, on_warning, token_secret, snapshot_ttl:
        The options of :class:`~pai_storage.SnapshotStore`.
    """

    component = "snapshots"
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})
    max_snapshot_bytes: ClassVar[int | None] = 64 * 1024 * 1024

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
        snapshot_ttl: timedelta | None = DEFAULT_SNAPSHOT_TTL,
        **client_options: Any,
    ) -> None:
        super().__init__(
            url,
            client,
            clock=clock,
            on_warning=on_warning,
            token_secret=token_secret,
            snapshot_ttl=snapshot_ttl,
            **client_options,
        )
        self._exp = self.root + ":exp"
        self._scopes = self.root + ":scopes"

    def _hash(self, scope: str, snapshot_id: str) -> str:
        return f"{self.root}:d:{scope}\x00{snapshot_id}"

    def _order(self, scope: str) -> str:
        return f"{self.root}:o:{scope}"

    # ------------------------------------------------------------ hooks

    async def _put(self, draft: SnapshotDraft) -> SnapshotInfo:
        created, expires = await self.write(
            PUT,
            [
                self._hash(draft.scope, draft.snapshot_id),
                self._order(draft.scope),
                self._exp,
                self._scopes,
            ],
            draft.snapshot_id,
            draft.data,
            draft.metadata_json,
            draft.size,
            draft.sha256,
            ms(self.snapshot_ttl),
            self.native_expiry(),
            draft.scope,
        )
        return draft.info(from_ms(created), None if expires is None else from_ms(expires))

    async def _get(self, scope: str, snapshot_id: str) -> Snapshot | None:
        r = await self.read(GET, [self._hash(scope, snapshot_id)])
        if not r:
            return None
        created, expires, data, meta, size, sha = r
        info = _info(scope, snapshot_id, created, expires, meta, size, sha)
        return Snapshot.model_construct(info=info, data=data)

    async def _rows(
        self, scope: str, after: tuple[datetime, str] | None, limit: int, data: bool
    ) -> builtins.list[Any]:
        start = "+" if after is None else f"({to_ms(after[0]):015d}\x00{after[1]}"
        return list(
            await self.read(
                LIST,
                [self._order(scope)],
                f"{self.root}:d:{scope}\x00",
                start,
                limit,
                "1" if data else "0",
            )
        )

    async def _list(
        self, scope: str, after: tuple[datetime, str] | None, limit: int
    ) -> builtins.list[SnapshotInfo]:
        out = []
        for created, expires, meta, size, sha, sid in await self._rows(scope, after, limit, False):
            out.append(_info(scope, sid.decode(), created, expires, meta, size, sha))
        return out

    async def _latest(self, scope: str) -> Snapshot | None:
        rows = await self._rows(scope, None, 1, True)
        if not rows:
            return None
        created, expires, meta, size, sha, data, sid = rows[0]
        info = _info(scope, sid.decode(), created, expires, meta, size, sha)
        return Snapshot.model_construct(info=info, data=data)

    async def _delete(self, scope: str, snapshot_id: str) -> bool:
        keys = [self._hash(scope, snapshot_id), self._order(scope), self._exp, self._scopes]
        return bool(await self.write(DELETE, keys, snapshot_id, scope))

    async def _list_scopes(self, after: str | None, limit: int) -> builtins.list[str]:
        start = "-" if after is None else "(" + after
        found = await self.read(
            LIST_SCOPES, [self._scopes], f"{self.root}:o:", f"{self.root}:d:", start, limit
        )
        return [scope.decode() for scope in found]

    async def _purge_expired(self) -> int:
        total = 0
        while True:
            seen = int(
                await self.write(
                    PURGE,
                    [self._exp, self._scopes],
                    f"{self.root}:d:",
                    f"{self.root}:o:",
                    PURGE_BATCH,
                )
            )
            total += seen
            if seen < PURGE_BATCH:
                return total


def _info(
    scope: str,
    snapshot_id: str,
    created: bytes,
    expires: bytes | None,
    meta: bytes,
    size: bytes,
    sha: bytes,
) -> SnapshotInfo:
    return SnapshotInfo.model_construct(
        scope=scope,
        snapshot_id=snapshot_id,
        size=int(size),
        sha256=sha.decode(),
        metadata=json.loads(meta),
        created_at=from_ms(created),
        expires_at=None if expires is None else from_ms(expires),
    )
