"""The Redis key-value store: one hash per item, one sorted set as the ordered index.

Keys (``R`` is the store's root, ``{pai:kv}`` by default):

- ``R:i:<member>``: a hash per item -- ``v`` (canonical JSON text), ``n``
  (version), ``c`` / ``u`` (created / updated, ms), ``e`` (expires, ms) and
  ``t`` (TTL, ms) when it has a TTL;
- ``R:idx``: a sorted set of every ``<member>`` at score 0, so Redis orders
  them by bytes (``ZRANGEBYLEX``);
- ``R:exp``: a sorted set of the members with a TTL, scored by expiry, for
  :meth:`purge_expired`.

A ``<member>`` is the namespace path (:func:`~pai_storage.backend.namespace_path`:
each segment followed by U+001F), a U+0000, and the key. Names never hold
U+0000 or U+001F, and UTF-8 byte order is code-point order, so the index's
order is (namespace path, key) and a namespace prefix or a key prefix is a
lexicographic range, never a pattern. Every operation is one Lua script, so
every check-and-set is atomic; expiry is judged in the script on the store's
clock. With the server's clock the item's key also gets a Redis expiry
(``PEXPIREAT``), which frees its memory; index entries of expired items are
skipped by every read and removed by :meth:`purge_expired`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

from pai_storage.backend import (
    Clock,
    KeyValueStore,
    KVRecord,
    StoreURL,
    VersionMismatch,
    WarningCallback,
    namespace_from_path,
    namespace_path,
    namespace_path_after,
    prefix_upper_bound,
)
from pai_storage.runtime import DEFAULT_MAX_VALUE_BYTES

from .client import CLOCK_LUA, from_ms, ms
from .runtime import RedisRuntimeStore

__all__ = ["RedisKeyValueStore"]

PURGE_BATCH = 1000
"""Index entries one purge script looks at (the purge loops until none are due)."""

_FIELDS = "'v', 'n', 'c', 'u', 'e', 't'"
_LIVE = "(r[1] and (not r[5] or tonumber(r[5]) > now))"

GET_MANY = (
    CLOCK_LUA
    + f"""
local now = clock(ARGV[1])
local out = {{}}
for i, k in ipairs(KEYS) do
  local r = redis.call('HMGET', k, {_FIELDS})
  if {_LIVE} then out[i] = r else out[i] = false end
end
return out
"""
)

# KEYS: item, index, expiry index. ARGV: clock, member, text, ttl ms or '', mode
# ('put' | 'create' | 'update'), expected version or '', native expiry '1' / '0'.
WRITE = (
    CLOCK_LUA
    + f"""
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], {_FIELDS})
local live = {_LIVE}
local mode = ARGV[5]
if (mode == 'create' and live) or (mode == 'update' and (not live or r[2] ~= ARGV[6])) then
  if live then return {{0, r}} end
  return {{0, false}}
end
local version, created = 1, num(now)
if live then
  version = tonumber(r[2]) + 1
  created = r[3]
end
redis.call('DEL', KEYS[1])
local expires = false
if ARGV[4] ~= '' then
  expires = num(now + tonumber(ARGV[4]))
  redis.call('HSET', KEYS[1], 'v', ARGV[3], 'n', num(version), 'c', created, 'u', num(now),
    'e', expires, 't', ARGV[4])
  redis.call('ZADD', KEYS[3], expires, ARGV[2])
  if ARGV[7] == '1' then redis.call('PEXPIREAT', KEYS[1], expires) end
else
  redis.call('HSET', KEYS[1], 'v', ARGV[3], 'n', num(version), 'c', created, 'u', num(now))
  redis.call('ZREM', KEYS[3], ARGV[2])
end
redis.call('ZADD', KEYS[2], 0, ARGV[2])
local ttl = false
if ARGV[4] ~= '' then ttl = ARGV[4] end
return {{1, {{false, num(version), created, num(now), expires, ttl}}}}
"""
)

# KEYS: item, expiry index. ARGV: clock, member, native expiry.
REFRESH = (
    CLOCK_LUA
    + f"""
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], {_FIELDS})
if not {_LIVE} then return false end
if r[6] then
  r[5] = num(now + tonumber(r[6]))
  redis.call('HSET', KEYS[1], 'e', r[5])
  redis.call('ZADD', KEYS[2], r[5], ARGV[2])
  if ARGV[3] == '1' then redis.call('PEXPIREAT', KEYS[1], r[5]) end
end
return r
"""
)

# KEYS: item, index, expiry index. ARGV: clock, member, expected version or ''.
DELETE = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local r = redis.call('HMGET', KEYS[1], 'n', 'e')
if not r[1] or (r[2] and tonumber(r[2]) <= now) then return 0 end
if ARGV[3] ~= '' and r[1] ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return 1
"""
)

# KEYS: index. ARGV: clock, item key base, start, stop (ZRANGEBYLEX), key prefix or '',
# its upper bound or '', limit, '1' for members only. A key prefix skips, per
# namespace, straight to its first key and past its last one.
SCAN = (
    CLOCK_LUA
    + f"""
local now = clock(ARGV[1])
local base, start, stop = ARGV[2], ARGV[3], ARGV[4]
local kp, kpu, limit, only = ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8] == '1'
local out = {{}}
while #out < limit do
  local want = limit - #out
  local batch = redis.call('ZRANGEBYLEX', KEYS[1], start, stop, 'LIMIT', 0, want)
  local jumped = false
  for _, m in ipairs(batch) do
    local sep = string.find(m, '\\0', 1, true)
    local path, key = string.sub(m, 1, sep - 1), string.sub(m, sep + 1)
    if kp ~= '' and key < kp then
      start = '[' .. path .. '\\0' .. kp
      jumped = true
      break
    end
    if kp ~= '' and kpu ~= '' and key >= kpu then
      start = '[' .. path .. '\\1'
      jumped = true
      break
    end
    local r = redis.call('HMGET', base .. m, {_FIELDS})
    if {_LIVE} then
      if only then
        out[#out + 1] = m
      else
        out[#out + 1] = {{m, r[1], r[2], r[3], r[4], r[5], r[6]}}
      end
    end
    start = '(' .. m
  end
  if not jumped and #batch < want then break end
end
return out
"""
)

# KEYS: index. ARGV: clock, item key base, start, stop, depth or '', limit.
NAMESPACES = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local base, start, stop = ARGV[2], ARGV[3], ARGV[4]
local depth, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
while #out < limit do
  local b = redis.call('ZRANGEBYLEX', KEYS[1], start, stop, 'LIMIT', 0, 1)
  if #b == 0 then break end
  local m = b[1]
  local path = string.sub(m, 1, string.find(m, '\\0', 1, true) - 1)
  local r = redis.call('HMGET', base .. m, 'n', 'e')
  if r[1] and (not r[2] or tonumber(r[2]) > now) then
    local cut, count, i = path, 0, 0
    if depth then
      while true do
        i = string.find(path, '\\31', i + 1, true)
        if not i then break end
        count = count + 1
        if count == depth then
          cut = string.sub(path, 1, i)
          break
        end
      end
    end
    out[#out + 1] = cut
    if depth and count >= depth then
      start = '[' .. string.sub(cut, 1, -2) .. ' '
    else
      start = '[' .. path .. '\\1'
    end
  else
    start = '(' .. m
  end
end
return out
"""
)

# KEYS: index, expiry index. ARGV: clock, item key base, batch.
PURGE = (
    CLOCK_LUA
    + """
local now = clock(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', num(now), 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
for _, m in ipairs(due) do
  local e = redis.call('HGET', ARGV[2] .. m, 'e')
  if not e or tonumber(e) <= now then
    redis.call('DEL', ARGV[2] .. m)
    redis.call('ZREM', KEYS[1], m)
    n = n + 1
  end
  redis.call('ZREM', KEYS[2], m)
  if e and tonumber(e) > now then redis.call('ZADD', KEYS[2], e, m) end
end
return {n, #due}
"""
)


class RedisKeyValueStore(RedisRuntimeStore, KeyValueStore):
    """Key-value items in Redis 6.2+ (redis-py asyncio), one Lua script per operation.

    Parameters
    ----------
    url:
        ``redis://`` or ``rediss://`` URL (not needed with ``client=``).
    client:
        An application's own ``redis.asyncio.Redis`` / ``RedisCluster`` (never
        closed by pai-storage), or the holder shared by one ``connect()`` call.
    key_prefix, cluster, connect_timeout, socket_timeout, max_connections:
        The client's options (:class:`~pai_storage_redis.client.RedisClient`).
    clock, on_warning, token_secret, max_value_bytes:
        The options of :class:`~pai_storage.KeyValueStore`; ``max_value_bytes``
        is at most 64 MiB here.
    """

    component = "kv"
    value_bytes_limit: ClassVar[int | None] = 64 * 1024 * 1024

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        **client_options: Any,
    ) -> None:
        super().__init__(
            url,
            client,
            clock=clock,
            on_warning=on_warning,
            token_secret=token_secret,
            max_value_bytes=max_value_bytes,
            **client_options,
        )
        self._idx = self.root + ":idx"
        self._exp = self.root + ":exp"
        self._base = self.root + ":i:"

    def _item_key(self, member: str) -> str:
        return self._base + member

    # ------------------------------------------------------------ hooks

    async def _get_many(self, namespace: tuple[str, ...], keys: list[str]) -> list[KVRecord]:
        path = namespace_path(namespace)
        found = await self.read(GET_MANY, [self._item_key(f"{path}\x00{k}") for k in keys])
        return [_record(namespace, k, r) for k, r in zip(keys, found, strict=False) if r]

    async def _refresh_ttl(self, namespace: tuple[str, ...], key: str) -> KVRecord | None:
        member = f"{namespace_path(namespace)}\x00{key}"
        found = await self.write(
            REFRESH, [self._item_key(member), self._exp], member, self.native_expiry()
        )
        return _record(namespace, key, found) if found else None

    async def _write(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        mode: str,
        expected: int | None,
    ) -> KVRecord | VersionMismatch:
        member = f"{namespace_path(namespace)}\x00{key}"
        done, row = await self.write(
            WRITE,
            [self._item_key(member), self._idx, self._exp],
            member,
            text,
            ms(ttl),
            mode,
            "" if expected is None else str(expected),
            self.native_expiry(),
        )
        if not done:
            return VersionMismatch(_record(namespace, key, row) if row else None)
        return _record(namespace, key, [text.encode(), *row[1:]])

    async def _put(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None
    ) -> KVRecord:
        written = await self._write(namespace, key, text, ttl, "put", None)
        assert isinstance(written, KVRecord)
        return written

    async def _put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        expected_version: int | None,
    ) -> KVRecord | VersionMismatch:
        mode = "create" if expected_version is None else "update"
        return await self._write(namespace, key, text, ttl, mode, expected_version)

    async def _delete(
        self, namespace: tuple[str, ...], key: str, expected_version: int | None
    ) -> bool:
        member = f"{namespace_path(namespace)}\x00{key}"
        expected = "" if expected_version is None else str(expected_version)
        keys = [self._item_key(member), self._idx, self._exp]
        return bool(await self.write(DELETE, keys, member, expected))

    async def _search(
        self,
        prefix: tuple[str, ...],
        key_prefix: str,
        after: tuple[tuple[str, ...], str] | None,
        limit: int,
    ) -> list[KVRecord]:
        low = namespace_path(prefix)
        start = "[" + low if after is None else f"({namespace_path(after[0])}\x00{after[1]}"
        upper = prefix_upper_bound(key_prefix) if key_prefix else None
        rows = await self.read(
            SCAN,
            [self._idx],
            self._base,
            start,
            _stop(low),
            key_prefix,
            upper or "",
            limit,
            "0",
        )
        spaces: dict[bytes, tuple[str, ...]] = {}
        out = []
        for row in rows:
            path, _, key = row[0].partition(b"\x00")
            namespace = spaces.get(path)
            if namespace is None:
                namespace = spaces[path] = namespace_from_path(path.decode())
            out.append(_record(namespace, key.decode(), row[1:]))
        return out

    async def _list_keys(
        self, namespace: tuple[str, ...], prefix: str, after: str | None, limit: int
    ) -> list[str]:
        head = namespace_path(namespace) + "\x00"
        start = "[" + head + prefix if after is None else "(" + head + after
        upper = prefix_upper_bound(prefix) if prefix else None
        stop = "(" + head + upper if upper else "(" + head[:-1] + "\x01"
        members = await self.read(SCAN, [self._idx], self._base, start, stop, "", "", limit, "1")
        return [m.partition(b"\x00")[2].decode() for m in members]

    async def _list_namespaces(
        self,
        prefix: tuple[str, ...],
        max_depth: int | None,
        after: tuple[str, ...] | None,
        limit: int,
    ) -> list[tuple[str, ...]]:
        low = namespace_path(prefix)
        if after is not None:
            low = max(low, namespace_path_after(after, max_depth))
        depth = "" if max_depth is None else str(max_depth)
        paths = await self.read(
            NAMESPACES,
            [self._idx],
            self._base,
            "[" + low,
            _stop(namespace_path(prefix)),
            depth,
            limit,
        )
        return [namespace_from_path(p.decode()) for p in paths]

    async def _purge_expired(self) -> int:
        total = 0
        while True:
            deleted, seen = await self.write(PURGE, [self._idx, self._exp], self._base, PURGE_BATCH)
            total += int(deleted)
            if int(seen) < PURGE_BATCH:
                return total


def _stop(low: str) -> str:
    """The exclusive end of the members under the namespace path ``low``."""
    high = prefix_upper_bound(low) if low else None
    return "+" if high is None else "(" + high


def _record(namespace: tuple[str, ...], key: str, row: list[Any]) -> KVRecord:
    """A record from the fields ``v, n, c, u, e, t`` of an item's hash."""
    text, version, created, updated, expires, ttl = row
    return KVRecord(
        namespace=namespace,
        key=key,
        text=text.decode("utf-8", errors="surrogateescape") if text is not None else "",
        version=int(version),
        created_at=from_ms(created),
        updated_at=from_ms(updated),
        expires_at=None if expires is None else from_ms(expires),
        ttl=None if ttl is None else timedelta(milliseconds=int(ttl)),
    )
