"""The Redis agent-state store: one hash per session, one Redis list per state list.

Keys (``R`` is the store's root, ``{pai:state}`` by default; ``<s>`` is the
stored user key, a U+0000 and the session id):

- ``R:s:<s>``: the session's hash -- ``v:<key>`` (a single value's canonical
  JSON) and ``n:<key>`` (its version); ``l:<key>`` (a list's length) and
  ``h:<key>`` (its content hash); ``~e`` (the session's expiry, ms);
- ``R:l:<s>\\0<key>``: a list's items, one canonical JSON text per element,
  so an append is an ``RPUSH`` of the new items only;
- ``R:u:<user>``: the user's session ids (a sorted set at score 0, ordered by
  bytes, which is code-point order) for :meth:`list_session_ids`;
- ``R:exp``: every session with an expiry, scored by it, for :meth:`purge_expired`.

Every operation is one Lua script, so each check-and-set (versions, the
list head) is atomic and a session expires all at once: a write to an
expired session first deletes what is left of it. With the server's clock the
session's keys also get a Redis expiry (``PEXPIREAT``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

from pai_storage.backend import (
    AgentStateStore,
    Clock,
    ListHead,
    ListWrite,
    SessionKey,
    StoreURL,
    WarningCallback,
)
from pai_storage.runtime import DEFAULT_MAX_VALUE_BYTES
from pai_storage.state import (
    ANONYMOUS_USER,
    DEFAULT_SESSION_TTL,
    ENUMERATE,
    StaleVersion,
    StoredKind,
    VersionedState,
)

from .client import CLOCK_LUA, ms
from .runtime import RedisRuntimeStore

__all__ = ["RedisAgentStateStore"]

PURGE_BATCH = 200
"""Sessions one purge script deletes at most (the purge loops until none are due)."""

_PUSH_CHUNK = 1000
"""Items one ``RPUSH`` sends (Lua's ``unpack`` has a stack limit)."""

# Shared helpers. S is the session hash, LB the start of its list keys.
_SESSION_LUA = (
    CLOCK_LUA
    + """
local function live(S, now)
  local e = redis.call('HGET', S, '~e')
  return not e or tonumber(e) > now
end
local function states(S)
  local n = redis.call('HLEN', S)
  if redis.call('HEXISTS', S, '~e') == 1 then n = n - 1 end
  return n
end
local function drop(S, LB)
  for _, f in ipairs(redis.call('HKEYS', S)) do
    if string.sub(f, 1, 2) == 'l:' then redis.call('DEL', LB .. string.sub(f, 3)) end
  end
  redis.call('DEL', S)
end
-- The session's entry in the enumeration index (KEYS[#KEYS]): the member with the
-- anonymous user's key (the only one starting with U+001F) cut to '', so it sorts first.
local function entry(member)
  if string.byte(member, 1) ~= 31 then return member end
  local sep = string.find(member, '\\0', 1, true)
  return string.sub(member, sep)
end
local function fresh(S, LB, now)
  if not live(S, now) then drop(S, LB) end
end
-- After a write: the session's expiry, its index entries, Redis's own expiry.
-- Every script that calls it has the enumeration index as its last key.
local function touch(S, LB, now, ttl, native, U, X, member, sid)
  redis.call('ZADD', U, 0, sid)
  redis.call('ZADD', KEYS[#KEYS], 0, entry(member))
  local e = false
  if ttl ~= '' then
    e = num(now + tonumber(ttl))
    redis.call('HSET', S, '~e', e)
    redis.call('ZADD', X, e, member)
  else
    redis.call('HDEL', S, '~e')
    redis.call('ZREM', X, member)
  end
  if native == '1' then
    local keys = {S}
    for _, f in ipairs(redis.call('HKEYS', S)) do
      if string.sub(f, 1, 2) == 'l:' then keys[#keys + 1] = LB .. string.sub(f, 3) end
    end
    for _, k in ipairs(keys) do
      if e then redis.call('PEXPIREAT', k, e) else redis.call('PERSIST', k) end
    end
  end
end
"""
)

# KEYS: session, user index, expiry index, enumeration index. ARGV: clock, key, text,
# expected or '',
# ttl, native, list base, member, session id. Returns {'list'} (the key holds a list),
# {'stale', current version or '0'} (nothing written) or {'saved', new version}.
SAVE = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local S, k = KEYS[1], ARGV[2]
fresh(S, ARGV[7], now)
if redis.call('HEXISTS', S, 'l:' .. k) == 1 then return {'list'} end
local cur = redis.call('HGET', S, 'n:' .. k)
if (ARGV[4] == '0' and cur) or (ARGV[4] ~= '' and ARGV[4] ~= '0' and cur ~= ARGV[4]) then
  return {'stale', cur or '0'}
end
local v = 1
if cur then v = tonumber(cur) + 1 end
redis.call('HSET', S, 'v:' .. k, ARGV[3], 'n:' .. k, num(v))
touch(S, ARGV[7], now, ARGV[5], ARGV[6], KEYS[2], KEYS[3], ARGV[8], ARGV[9])
return {'saved', num(v)}
"""
)

# KEYS: session. ARGV: clock, key. Returns false, {'list'} or {'value', text, version}.
GET_VALUE = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local S, k = KEYS[1], ARGV[2]
if not live(S, now) then return false end
if redis.call('HEXISTS', S, 'l:' .. k) == 1 then return {'list'} end
local r = redis.call('HMGET', S, 'v:' .. k, 'n:' .. k)
if not r[1] then return false end
return {'value', r[1], r[2]}
"""
)

# KEYS: session. ARGV: clock, key. Returns false, {'value'} or {'list', length, hash}.
LIST_HEAD = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local S, k = KEYS[1], ARGV[2]
if not live(S, now) then return false end
if redis.call('HEXISTS', S, 'v:' .. k) == 1 then return {'value'} end
local r = redis.call('HMGET', S, 'l:' .. k, 'h:' .. k)
if not r[1] then return false end
return {'list', r[1], r[2]}
"""
)

# KEYS: session, list, user index, expiry index, enumeration index. ARGV: clock, key,
# expected length or
# '' (absent), expected hash, replace '1'/'0', new length, new hash, ttl, native, list
# base, member, session id, then the items. Returns -1 (a value), 0 (head moved) or 1.
WRITE_LIST = (
    _SESSION_LUA
    + f"""
local now = clock(ARGV[1])
local S, L, k = KEYS[1], KEYS[2], ARGV[2]
fresh(S, ARGV[10], now)
if redis.call('HEXISTS', S, 'v:' .. k) == 1 then return -1 end
local cur = redis.call('HMGET', S, 'l:' .. k, 'h:' .. k)
if ARGV[3] == '' then
  if cur[1] then return 0 end
elseif cur[1] ~= ARGV[3] or cur[2] ~= ARGV[4] then
  return 0
end
if ARGV[5] == '1' then redis.call('DEL', L) end
local first = 13
while first <= #ARGV do
  local last = math.min(first + {_PUSH_CHUNK - 1}, #ARGV)
  redis.call('RPUSH', L, unpack(ARGV, first, last))
  first = last + 1
end
redis.call('HSET', S, 'l:' .. k, ARGV[6], 'h:' .. k, ARGV[7])
touch(S, ARGV[10], now, ARGV[8], ARGV[9], KEYS[3], KEYS[4], ARGV[11], ARGV[12])
return 1
"""
)

# KEYS: session, list. ARGV: clock, key. Returns false, {'value'} or {'list', items}.
GET_LIST = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local S, k = KEYS[1], ARGV[2]
if not live(S, now) then return false end
if redis.call('HEXISTS', S, 'v:' .. k) == 1 then return {'value'} end
if redis.call('HEXISTS', S, 'l:' .. k) == 0 then return false end
return {'list', redis.call('LRANGE', KEYS[2], 0, -1)}
"""
)

# KEYS: session. ARGV: clock.
EXISTS = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
if live(KEYS[1], now) and states(KEYS[1]) > 0 then return 1 end
return 0
"""
)

# KEYS: session, user index, expiry index, enumeration index. ARGV: clock, list base,
# member, session id.
DELETE = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local S = KEYS[1]
local existed = live(S, now) and states(S) > 0
drop(S, ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], entry(ARGV[3]))
if existed then return 1 end
return 0
"""
)

# KEYS: session, list, user index, expiry index, enumeration index. ARGV: clock, key,
# ttl, native, list base, member, session id.
DELETE_STATE = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local S, k = KEYS[1], ARGV[2]
fresh(S, ARGV[5], now)
local gone = redis.call('HDEL', S, 'v:' .. k, 'n:' .. k, 'l:' .. k, 'h:' .. k)
redis.call('DEL', KEYS[2])
if gone == 0 then return 0 end
if states(S) == 0 then
  redis.call('DEL', S)
  redis.call('ZREM', KEYS[3], ARGV[7])
  redis.call('ZREM', KEYS[4], ARGV[6])
  redis.call('ZREM', KEYS[5], entry(ARGV[6]))
else
  touch(S, ARGV[5], now, ARGV[3], ARGV[4], KEYS[3], KEYS[4], ARGV[6], ARGV[7])
end
return 1
"""
)

# KEYS: user index. ARGV: clock, session key base of the user, start, limit.
LIST_SESSIONS = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local start, limit = ARGV[3], tonumber(ARGV[4])
local out = {}
while #out < limit do
  local want = limit - #out
  local batch = redis.call('ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, want)
  for _, sid in ipairs(batch) do
    local S = ARGV[2] .. sid
    if live(S, now) and states(S) > 0 then out[#out + 1] = sid end
    start = '(' .. sid
  end
  if #batch < want then break end
end
return out
"""
)

# KEYS: expiry index, enumeration index. ARGV: clock, session base, list base, user
# index base, batch.
PURGE = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now), 'LIMIT', 0, tonumber(ARGV[5]))
local n = 0
for _, m in ipairs(due) do
  local S = ARGV[2] .. m
  local e = redis.call('HGET', S, '~e')
  if e and tonumber(e) > now then
    redis.call('ZADD', KEYS[1], e, m)
  elseif redis.call('EXISTS', S) == 1 and not e then
    redis.call('ZREM', KEYS[1], m)
  else
    local sep = string.find(m, '\\0', 1, true)
    drop(S, ARGV[3] .. m .. '\\0')
    redis.call('ZREM', ARGV[4] .. string.sub(m, 1, sep - 1), string.sub(m, sep + 1))
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', KEYS[2], entry(m))
    n = n + 1
  end
end
return {n, #due}
"""
)


# KEYS: enumeration index. ARGV: clock, session base, start, limit, the anonymous
# user's key. Returns the live entries ('<user>\0<session>', '' for anonymous).
LIST_ALL = (
    _SESSION_LUA
    + """
local now = clock(ARGV[1])
local start, limit = ARGV[3], tonumber(ARGV[4])
local out = {}
while #out < limit do
  local want = limit - #out
  local batch = redis.call('ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, want)
  for _, e in ipairs(batch) do
    local member = e
    if string.byte(e, 1) == 0 then member = ARGV[5] .. e end
    local S = ARGV[2] .. member
    if live(S, now) and states(S) > 0 then out[#out + 1] = e end
    start = '(' .. e
  end
  if #batch < want then break end
end
return out
"""
)

# KEYS: session. ARGV: clock. Returns the live session's fields (none when gone).
SESSION_FIELDS = (
    _SESSION_LUA
    + """
if not live(KEYS[1], clock(ARGV[1])) then return {} end
return redis.call('HKEYS', KEYS[1])
"""
)


class RedisAgentStateStore(RedisRuntimeStore, AgentStateStore):
    """Per-session agent state in Redis, one Lua script per operation.

    Parameters
    ----------
    url, client, key_prefix, cluster, connect_timeout, socket_timeout, max_connections:
        As for :class:`~pai_storage_redis.RedisKeyValueStore`.
    clock, on_warning, token_secret, session_ttl, max_value_bytes:
        The options of :class:`~pai_storage.AgentStateStore`; ``max_value_bytes``
        is at most 64 MiB here.
    """

    component = "state"
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})
    value_bytes_limit: ClassVar[int | None] = 64 * 1024 * 1024

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
        session_ttl: timedelta | None = DEFAULT_SESSION_TTL,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        **client_options: Any,
    ) -> None:
        super().__init__(
            url,
            client,
            clock=clock,
            on_warning=on_warning,
            token_secret=token_secret,
            session_ttl=session_ttl,
            max_value_bytes=max_value_bytes,
            **client_options,
        )
        self._exp = self.root + ":exp"
        self._all = self.root + ":all"

    # ------------------------------------------------------------ keys

    def _member(self, session: SessionKey) -> str:
        return f"{session.user}\x00{session.session}"

    def _hash(self, session: SessionKey) -> str:
        return f"{self.root}:s:{self._member(session)}"

    def _list_base(self, session: SessionKey) -> str:
        return f"{self.root}:l:{self._member(session)}\x00"

    def _users(self, user: str) -> str:
        return f"{self.root}:u:{user}"

    def _ttl(self) -> str:
        return ms(self.session_ttl)

    # ------------------------------------------------------------ hooks

    async def _save_value(
        self,
        session: SessionKey,
        key: str,
        value: Any,
        text: str,
        expected_version: int | None,
    ) -> int | StoredKind | StaleVersion:
        outcome, *version = await self.write(
            SAVE,
            [self._hash(session), self._users(session.user), self._exp, self._all],
            key,
            text,
            "" if expected_version is None else str(expected_version),
            self._ttl(),
            self.native_expiry(),
            self._list_base(session),
            self._member(session),
            session.session,
        )
        if outcome == b"list":
            return StoredKind.LIST
        if outcome == b"stale":
            return StaleVersion(int(version[0]))
        return int(version[0])

    async def _get_value(self, session: SessionKey, key: str) -> VersionedState | StoredKind | None:
        found = await self.read(GET_VALUE, [self._hash(session)], key)
        if not found:
            return None
        if found[0] == b"list":
            return StoredKind.LIST
        return await self.stored_value(session, key, _text(found[1]), int(found[2]))

    async def _list_head(self, session: SessionKey, key: str) -> ListHead | StoredKind | None:
        found = await self.read(LIST_HEAD, [self._hash(session)], key)
        if not found:
            return None
        if found[0] == b"value":
            return StoredKind.VALUE
        return ListHead(int(found[1]), found[2].decode())

    async def _write_list(
        self, session: SessionKey, key: str, write: ListWrite
    ) -> bool | StoredKind:
        expect = write.expect
        result = int(
            await self.write(
                WRITE_LIST,
                [
                    self._hash(session),
                    self._list_base(session) + key,
                    self._users(session.user),
                    self._exp,
                    self._all,
                ],
                key,
                "" if expect is None else str(expect.length),
                "" if expect is None else expect.hash,
                "1" if write.replace else "0",
                str(write.head.length),
                write.head.hash,
                self._ttl(),
                self.native_expiry(),
                self._list_base(session),
                self._member(session),
                session.session,
                *write.texts,
            )
        )
        if result < 0:
            return StoredKind.VALUE
        return result == 1

    async def _get_list(self, session: SessionKey, key: str) -> list[Any] | StoredKind | None:
        found = await self.read(
            GET_LIST, [self._hash(session), self._list_base(session) + key], key
        )
        if not found:
            return None
        if found[0] == b"value":
            return StoredKind.VALUE
        return await self.stored_items(session, key, (_text(t) for t in found[1]))

    async def _exists(self, session: SessionKey) -> bool:
        return bool(await self.read(EXISTS, [self._hash(session)]))

    async def _delete(self, session: SessionKey) -> bool:
        keys = [self._hash(session), self._users(session.user), self._exp, self._all]
        found = await self.write(
            DELETE, keys, self._list_base(session), self._member(session), session.session
        )
        return bool(found)

    async def _delete_state(self, session: SessionKey, key: str) -> bool:
        keys = [
            self._hash(session),
            self._list_base(session) + key,
            self._users(session.user),
            self._exp,
            self._all,
        ]
        found = await self.write(
            DELETE_STATE,
            keys,
            key,
            self._ttl(),
            self.native_expiry(),
            self._list_base(session),
            self._member(session),
            session.session,
        )
        return bool(found)

    async def _list_session_ids(self, user: str, after: str | None, limit: int) -> list[str]:
        start = "-" if after is None else "(" + after
        found: Sequence[bytes] = await self.read(
            LIST_SESSIONS, [self._users(user)], f"{self.root}:s:{user}\x00", start, limit
        )
        return [sid.decode() for sid in found]

    async def _list_sessions(
        self, after: tuple[str | None, str] | None, limit: int
    ) -> list[tuple[str | None, str]]:
        start = "-" if after is None else f"({after[0] or ''}\x00{after[1]}"
        found = await self.read(
            LIST_ALL, [self._all], f"{self.root}:s:", start, limit, ANONYMOUS_USER
        )
        out: list[tuple[str | None, str]] = []
        for raw in found:
            user, _, session = raw.partition(b"\x00")
            out.append((user.decode() or None, session.decode()))
        return out

    async def _session_keys(
        self, user_id: str | None, session_id: str
    ) -> tuple[list[str], list[str]]:
        session = SessionKey(ANONYMOUS_USER if user_id is None else user_id, session_id)
        fields = [f.decode() for f in await self.read(SESSION_FIELDS, [self._hash(session)])]
        values = sorted(f[2:] for f in fields if f.startswith("v:"))
        lists = sorted(f[2:] for f in fields if f.startswith("l:"))
        return values, lists

    async def _purge_expired(self) -> int:
        total = 0
        while True:
            deleted, seen = await self.write(
                PURGE,
                [self._exp, self._all],
                f"{self.root}:s:",
                f"{self.root}:l:",
                f"{self.root}:u:",
                PURGE_BATCH,
            )
            total += int(deleted)
            if int(seen) < PURGE_BATCH:
                return total


def _text(raw: bytes) -> str:
    # A damaged (non-UTF-8) text is kept as surrogates: the core reports it.
    return raw.decode("utf-8", errors="surrogateescape")
