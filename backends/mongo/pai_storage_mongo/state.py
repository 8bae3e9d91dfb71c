"""The MongoDB agent-state store: one document per session in ``pai_agent_sessions``.

A session document is ``{_id: {user, session}, states, versions, hashes,
lengths, _updated_at}``. ``states.<field>`` holds a single value's canonical
JSON text (a string) or a list as a BSON array of item texts; a single value's
version is ``versions.<field>`` (Int64), a list's content hash
``hashes.<field>`` and its length ``lengths.<field>`` (Int64). ``<field>`` is
the state key with ``%``, ``.`` and ``$`` percent-encoded, so dot notation
addresses exactly one key. ``_updated_at`` (a BSON date) is set by every
write; a session is live while ``_updated_at`` is after now - ``session_ttl``
(checked by every read) and the TTL index on ``_updated_at`` removes it in the
background. Appends are updates guarded by the stored hash and length that
send only the new items (set at the positions after the stored length, or
``$push``-ed when there are many); a document that would exceed
16 MiB is refused whole by the server. Session listing is a range on the
``_id`` index; so is the enumeration of every session (a copy of the store),
in up to three ranges that put the anonymous user first. See
``docs/mongodb.md``.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.errors import DuplicateKeyError

from pai_storage import InvalidInputError, StorageError
from pai_storage.backend import (
    ENUMERATE,
    AgentStateStore,
    ListHead,
    ListWrite,
    SessionKey,
)
from pai_storage.state import (
    ANONYMOUS_USER,
    StaleVersion,
    StoredKind,
    VersionedState,
    session_ranges,
)

from .client import Doc
from .documents import decoded, stored_count
from .errors import is_too_large
from .runtime import MongoRuntimeStore

__all__ = ["MongoAgentStateStore", "decode_field", "encode_field", "indexes"]

_ALL = ("states", "versions", "hashes", "lengths")


def encode_field(key: str) -> str:
    """The document field of a state key: ``%``, ``.`` and ``$`` percent-encoded."""
    return key.replace("%", "%25").replace(".", "%2E").replace("$", "%24")


_ENCODED = re.compile("%(25|2E|24)")
_DECODED = {"25": "%", "2E": ".", "24": "$"}


def decode_field(field: str) -> str:
    """The state key of a document field (the inverse of :func:`encode_field`)."""
    return _ENCODED.sub(lambda m: _DECODED[m.group(1)], field)


TTL_INDEX = "_updated_at_ttl"


def indexes(session_ttl: timedelta | None) -> list[IndexModel]:
    """The session collection's indexes: the TTL index on ``_updated_at`` (sparse).

    ``expireAfterSeconds`` is ``session_ttl`` rounded up to whole seconds (the
    background sweep may run later; reads are exact). Without a TTL there is no
    index: sessions are kept forever.
    """
    if session_ttl is None:
        return []
    seconds = max(1, math.ceil(session_ttl.total_seconds()))
    return [
        IndexModel(
            [("_updated_at", ASCENDING)],
            name=TTL_INDEX,
            expireAfterSeconds=seconds,
            sparse=True,
        )
    ]


class MongoAgentStateStore(MongoRuntimeStore, AgentStateStore):
    """Agent sessions in MongoDB 4.2+, on the shared client of :class:`MongoClientHolder`.

    Takes the parameters of :class:`~pai_storage_mongo.runtime.MongoRuntimeStore`
    (``url``, ``client``, where the collection lives) and the options of
    :class:`~pai_storage.AgentStateStore` (``clock``, ``on_warning``,
    ``token_secret``, ``session_ttl``, ``max_value_bytes``);
    ``max_value_bytes`` is at most 15 MiB here (a session is one document of
    at most 16 MiB).
    """

    component = "state"
    ttl_index = TTL_INDEX
    ttl_option = "session_ttl"
    value_bytes_limit: ClassVar[int | None] = 15 * 1024 * 1024
    capabilities: ClassVar[frozenset[str]] = frozenset({ENUMERATE})

    def _indexes(self) -> list[IndexModel]:
        return indexes(self.session_ttl)

    # ------------------------------------------------------------ time and liveness

    def _live_expr(self, now: datetime | None = None) -> Doc:
        """An expression: the session document exists and has not expired."""
        if self.session_ttl is None:
            return {"$ne": [{"$type": "$_updated_at"}, "missing"]}
        ms = Int64(self.session_ttl // timedelta(milliseconds=1))
        at = self._now() if now is None else now
        return {"$gt": ["$_updated_at", {"$subtract": [at, ms]}]}

    def _live(self) -> Doc:
        return {"$expr": self._live_expr()}

    async def _upsert_time(self) -> datetime:
        """The time of a conditional upsert: an upsert's filter cannot use ``$expr``
        (so not ``$$NOW``), so the server's time is read first and used for the
        filter and the write alike."""
        return self.now() or await self._holder.server_time()

    def _absent_or_expired(self, f: str, now: datetime) -> Doc:
        """A plain filter (no ``$expr``): field ``f`` is absent, or the session expired."""
        clauses: list[Doc] = [{f"states.{f}": {"$exists": False}}]
        if self.session_ttl is not None:
            clauses.append({"_updated_at": {"$lte": now - self.session_ttl}})
        return {"$or": clauses}

    @staticmethod
    def _id(session: SessionKey) -> Doc:
        return {"user": session.user, "session": session.session}

    def _fresh_stages(self, now: datetime | None = None) -> list[Doc]:
        """Pipeline stages that empty an expired (or new) session before a write."""
        return [
            {"$set": {"_live": self._live_expr(now)}},
            {"$set": {f: {"$cond": ["$_live", {"$ifNull": [f"${f}", {}]}, {}]} for f in _ALL}},
        ]

    def _too_large(self, exc: BaseException) -> None:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if is_too_large(cause):
            raise InvalidInputError(
                "this write would make the session document larger than MongoDB's 16 MiB "
                "document limit; nothing was written (delete states or use another session)"
            ) from cause

    # ------------------------------------------------------------ single values

    async def _save_value(
        self,
        session: SessionKey,
        key: str,
        value: Any,
        text: str,
        expected_version: int | None,
    ) -> int | StoredKind | StaleVersion:
        f = encode_field(key)
        if expected_version is None:
            return await self._save_always(session, f, text)
        upsert = expected_version == 0
        now: datetime | None = None
        if upsert:
            now = await self._upsert_time()
            query: Doc = {"_id": self._id(session), **self._absent_or_expired(f, now)}
        else:
            query = {"_id": self._id(session), f"versions.{f}": expected_version}
            query.update(self._live())
        at = self._now() if now is None else now
        update = [
            *self._fresh_stages(now),
            {
                "$set": {
                    f"states.{f}": {"$literal": text},
                    f"versions.{f}": {
                        "$add": [{"$ifNull": [f"$versions.{f}", Int64(0)]}, Int64(1)]
                    },
                    "_updated_at": at,
                }
            },
            {"$unset": "_live"},
        ]
        try:
            with self._holder.errors("write"):
                doc = decoded(
                    await self._modify.find_one_and_update(
                        query,
                        update,
                        {f"versions.{f}": 1},
                        upsert=upsert,
                        return_document=ReturnDocument.AFTER,
                    )
                )
        except Exception as exc:
            self._too_large(exc)
            if not isinstance(exc.__cause__, DuplicateKeyError):
                raise
            doc = None  # a live session holds the key (or a racing insert won)
        if doc is not None:
            return int(doc["versions"][f])
        return await self._stale(session, f)

    async def _stale(self, session: SessionKey, f: str) -> StoredKind | StaleVersion:
        """What a conditional save that wrote nothing found under field ``f``."""
        query = {"_id": self._id(session), **self._live()}
        with self._holder.errors("read"):
            doc = await self.collection.find_one(query, {f"versions.{f}": 1, f"hashes.{f}": 1})
        if doc is not None and f in (doc.get("hashes") or {}):
            return StoredKind.LIST
        version = ((doc or {}).get("versions") or {}).get(f)
        return StaleVersion(version if isinstance(version, int) and stored_count(version) else 0)

    async def _save_always(self, session: SessionKey, f: str, text: str) -> int | StoredKind:
        """An unconditional save: one upsert on ``_id`` alone (the server retries a
        racing insert itself), a no-op when the key holds a live list."""
        now = self._now()
        is_list = "$_list"
        update = [
            *self._fresh_stages(),
            {"$set": {"_list": {"$eq": [{"$type": f"$states.{f}"}, "array"]}}},
            {
                "$set": {
                    f"states.{f}": {"$cond": [is_list, f"$states.{f}", {"$literal": text}]},
                    f"versions.{f}": {
                        "$cond": [
                            is_list,
                            "$$REMOVE",
                            {"$add": [{"$ifNull": [f"$versions.{f}", Int64(0)]}, Int64(1)]},
                        ]
                    },
                    "_updated_at": {"$cond": [is_list, "$_updated_at", now]},
                }
            },
            {"$unset": ["_live", "_list"]},
        ]
        try:
            with self._holder.errors("write"):
                doc = decoded(
                    await self._modify.find_one_and_update(
                        {"_id": self._id(session)},
                        update,
                        {f"versions.{f}": 1, f"hashes.{f}": 1},
                        upsert=True,
                        return_document=ReturnDocument.AFTER,
                    )
                )
        except Exception as exc:
            self._too_large(exc)
            raise
        assert doc is not None  # an upsert returning the document after it always has one
        if f in (doc.get("hashes") or {}):
            return StoredKind.LIST
        return int(doc["versions"][f])

    async def _kind(self, session: SessionKey, f: str) -> StoredKind | None:
        """What the live session holds under field ``f`` (``None``: nothing)."""
        query = {"_id": self._id(session), **self._live()}
        with self._holder.errors("read"):
            doc = await self.collection.find_one(query, {f"versions.{f}": 1, f"hashes.{f}": 1})
        if doc is None:
            return None
        if f in (doc.get("hashes") or {}):
            return StoredKind.LIST
        if f in (doc.get("versions") or {}):
            return StoredKind.VALUE
        return None

    async def _get_value(self, session: SessionKey, key: str) -> VersionedState | StoredKind | None:
        f = encode_field(key)
        query = {"_id": self._id(session), **self._live()}
        with self._holder.errors("read"):
            doc = await self.collection.find_one(
                query, {f"versions.{f}": 1, f"hashes.{f}": 1, f"states.{f}": 1}
            )
        if doc is None:
            return None
        if f in (doc.get("hashes") or {}):
            return StoredKind.LIST
        versions = doc.get("versions") or {}
        if f not in versions:
            return None
        version = versions[f]
        sound = stored_count(version)
        # A damaged version: the value is treated as absent (and reported).
        text = (doc.get("states") or {}).get(f) if sound else None
        return await self.stored_value(session, key, text, int(version) if sound else 0)

    # ------------------------------------------------------------ lists

    async def _list_head(self, session: SessionKey, key: str) -> ListHead | StoredKind | None:
        f = encode_field(key)
        query = {"_id": self._id(session), **self._live()}
        with self._holder.errors("read"):
            doc = await self.collection.find_one(
                query, {f"versions.{f}": 1, f"hashes.{f}": 1, f"lengths.{f}": 1}
            )
        if doc is None:
            return None
        if f in (doc.get("versions") or {}):
            return StoredKind.VALUE
        hashes = doc.get("hashes") or {}
        if f not in hashes:
            return None
        length, digest = (doc.get("lengths") or {}).get(f, 0), hashes[f]
        valid = isinstance(digest, str) and _HASH.fullmatch(digest)
        if not (stored_count(length, low=0) and valid):
            raise StorageError(
                f"the stored list under key {key!r} is damaged (its length or content hash "
                "is not what this store writes); delete_state() removes it"
            )
        return ListHead(int(length), digest)

    async def _write_list(
        self, session: SessionKey, key: str, write: ListWrite
    ) -> bool | StoredKind:
        f = encode_field(key)
        head = {
            f"hashes.{f}": write.head.hash,
            f"lengths.{f}": Int64(write.head.length),
        }
        items = list(write.texts)
        upsert = False
        update: Doc | list[Doc]
        if write.expect is None:
            # Absent (or its session expired): the whole list, in a session
            # emptied first when it had expired.
            now = await self._upsert_time()
            query: Doc = {"_id": self._id(session), **self._absent_or_expired(f, now)}
            update = [
                *self._fresh_stages(now),
                {"$set": {f"states.{f}": {"$literal": items}, **head}},
                {"$set": {"_updated_at": now}},
                {"$unset": "_live"},
            ]
            upsert = True
        else:
            query = {
                "_id": self._id(session),
                f"hashes.{f}": write.expect.hash,
                f"lengths.{f}": write.expect.length,
                **self._live(),
            }
            touch = _touch(self.now())
            if write.replace:
                update = {"$set": {f"states.{f}": items, **head, **touch.get("$set", {})}}
            elif len(items) <= SET_APPEND_MAX:
                # The stored length is guarded, so the new items go to exactly the
                # positions after it: one $set per position skips the count of the
                # existing elements a $push makes first (see append_update).
                update = {"$set": {**append_update(f, write.expect.length, items)}}
                update["$set"].update(head, **touch.get("$set", {}))
            else:
                update = {
                    "$push": {f"states.{f}": {"$each": items}},
                    "$set": {**head, **touch.get("$set", {})},
                }
            if "$currentDate" in touch:
                update["$currentDate"] = touch["$currentDate"]
        try:
            with self._holder.errors("write"):
                result = await self.collection.update_one(query, update, upsert=upsert)
        except Exception as exc:
            self._too_large(exc)
            if not isinstance(exc.__cause__, DuplicateKeyError):
                raise
            return StoredKind.VALUE if await self._kind(session, f) is StoredKind.VALUE else False
        if result.matched_count or result.upserted_id is not None:
            return True
        return StoredKind.VALUE if await self._kind(session, f) is StoredKind.VALUE else False

    async def _get_list(self, session: SessionKey, key: str) -> list[Any] | StoredKind | None:
        f = encode_field(key)
        query = {"_id": self._id(session), **self._live()}
        with self._holder.errors("read"):
            doc = await self.collection.find_one(query, {f"versions.{f}": 1, f"states.{f}": 1})
        if doc is None:
            return None
        if f in (doc.get("versions") or {}):
            return StoredKind.VALUE
        stored = (doc.get("states") or {}).get(f)
        if not isinstance(stored, list):
            return None
        return await self.stored_items(session, key, stored)

    # ------------------------------------------------------------ sessions

    async def _exists(self, session: SessionKey) -> bool:
        query = {"_id": self._id(session), **self._live()}
        with self._holder.errors("read"):
            doc = await self.collection.find_one(query, {"_id": 1})
        return doc is not None

    async def _delete(self, session: SessionKey) -> bool:
        with self._holder.errors("write"):
            live = await self.collection.delete_one({"_id": self._id(session), **self._live()})
            if live.deleted_count:
                return True
            # An expired one goes too: it is garbage either way.
            await self.collection.delete_one({"_id": self._id(session)})
        return False

    async def _delete_state(self, session: SessionKey, key: str) -> bool:
        f = encode_field(key)
        query = {"_id": self._id(session), f"states.{f}": {"$exists": True}, **self._live()}
        update: Doc = {"$unset": {f"{part}.{f}": "" for part in _ALL}}
        touch = _touch(self.now())
        update.update(touch)
        with self._holder.errors("write"):
            result = await self.collection.update_one(query, update)
            if not result.matched_count:
                return False
            # The session's last state: the session goes (only while still empty).
            await self.collection.delete_one({"_id": self._id(session), "states": {}})
        return True

    async def _list_session_ids(self, user: str, after: str | None, limit: int) -> list[str]:
        low: Any = MinKey() if after is None else after
        # The range on the _id index selects the user's sessions in order; the
        # equality on _id.user (the shard key) lets a sharded cluster route the
        # query to that user's chunks instead of every shard.
        query = {
            "_id": {
                "$gt": {"user": user, "session": low},
                "$lt": {"user": user, "session": MaxKey()},
            },
            "_id.user": user,
            **self._live(),
        }
        with self._holder.errors("read"):
            docs = await self.collection.find(
                query, {"_id": 1}, sort=[("_id", ASCENDING)], limit=limit, hint="_id_"
            ).to_list(None)
        return [str(d["_id"]["session"]) for d in docs]

    async def _purge_expired(self) -> int:
        if self.session_ttl is None:
            return 0
        now = self.now() or await self._holder.server_time()
        with self._holder.errors("write"):
            result = await self.collection.delete_many(
                {"_updated_at": {"$lte": now - self.session_ttl}}
            )
        return result.deleted_count

    async def _erase_scope(self, user: str) -> int:
        # Every session of the user, expired or not: the user's range of the _id
        # index (the equality on _id.user routes it on a sharded cluster).
        query = {
            "_id": {
                "$gt": {"user": user, "session": MinKey()},
                "$lt": {"user": user, "session": MaxKey()},
            },
            "_id.user": user,
        }
        with self._holder.errors("write"):
            result = await self.collection.delete_many(query)
        return int(result.deleted_count)

    # ------------------------------------------------------------ enumeration

    async def _list_sessions(
        self, after: tuple[str | None, str] | None, limit: int
    ) -> list[tuple[str | None, str]]:
        # The ranges of session_ranges() on the _id index, each in index order
        # (BSON compares strings by code point, as the plan does), each read
        # only from where the page starts, `limit` entries at most.
        anon_low = {"user": ANONYMOUS_USER, "session": MinKey()}
        anon_high = {"user": ANONYMOUS_USER, "session": MaxKey()}
        ranges: list[Doc] = []
        for users, start in session_ranges(after):
            if users == "anonymous":
                low: Any = MinKey() if start is None else start.session
                # An equality on _id.user (the shard key) routes it to one user's chunks.
                ranges.append(
                    {
                        "_id": {"$gt": {"user": ANONYMOUS_USER, "session": low}, "$lt": anon_high},
                        "_id.user": ANONYMOUS_USER,
                    }
                )
                continue
            key = None if start is None else {"user": start.user, "session": start.session}
            if users == "below":
                ranges.append({"_id": {"$gt": MinKey() if key is None else key, "$lt": anon_low}})
            else:
                ranges.append({"_id": {"$gt": anon_high if key is None else key}})
        found: list[tuple[str | None, str]] = []
        for query in ranges:
            remaining = limit - len(found)
            if remaining <= 0:
                break
            with self._holder.errors("read"):
                docs = await self.collection.find(
                    {**query, **self._live()},
                    {"_id": 1},
                    sort=[("_id", ASCENDING)],
                    limit=remaining,
                    hint="_id_",
                ).to_list(None)
            for doc in docs:
                user, session = doc["_id"]["user"], doc["_id"]["session"]
                found.append((None if user == ANONYMOUS_USER else str(user), str(session)))
        return found

    async def _session_keys(
        self, user_id: str | None, session_id: str
    ) -> tuple[list[str], list[str]]:
        # A single value has a version, a list a content hash (never both):
        # these two small subdocuments name every key without reading a value.
        session = SessionKey(ANONYMOUS_USER if user_id is None else user_id, session_id)
        query = {"_id": self._id(session), **self._live()}
        with self._holder.errors("read"):
            doc = await self.collection.find_one(query, {"_id": 0, "versions": 1, "hashes": 1})
        if doc is None:
            return [], []
        values = sorted(decode_field(f) for f in doc.get("versions") or {})
        lists = sorted(decode_field(f) for f in doc.get("hashes") or {})
        return values, lists


SET_APPEND_MAX = 4
"""Appends of at most this many items set each new position; longer ones ``$push``."""


def append_update(field: str, length: int, texts: list[str]) -> Doc:
    """The ``$set`` of an append of ``texts`` to the list ``field`` of ``length`` items.

    MongoDB applies ``$push`` by counting the array's elements first and then
    writing the document back, two walks over every item; setting the
    positions ``length``, ``length + 1``, ... (the length is guarded by the
    same update's filter, so these are exactly the next positions) walks the
    items once. The stored array is the same.
    """
    return {f"states.{field}.{length + i}": text for i, text in enumerate(texts)}


_HASH = re.compile("[0-9a-f]{64}")


def _touch(now: datetime | None) -> Doc:
    """The operator update that sets ``_updated_at`` to now (the server's, or the test clock's)."""
    if now is None:
        return {"$currentDate": {"_updated_at": True}}
    return {"$set": {"_updated_at": now.astimezone(UTC)}}
