"""The MongoDB key-value store: one document per item in ``pai_kv``.

A document is ``{ns, key, value, version, createdAt, updatedAt, expiresAt?,
ttlMs?, _schemaVersion: 1}``: ``ns`` is the namespace path
(:func:`~pai_storage.backend.namespace_path`: each segment followed by
U+001F), ``value`` the canonical JSON text (a string, so it round-trips exactly
and can never look like an operator or a DBRef), ``version`` and ``ttlMs``
Int64, the times BSON dates. The unique index ``{ns: 1, key: 1}`` orders items
by code point (the simple collation compares UTF-8 bytes), so a namespace or
key prefix is a range on it (``prefix <= x < prefix_upper_bound(prefix)``),
never a regex. Expiry is exact at read time: every read filters on
``expiresAt`` against ``$$NOW`` (or the test clock); the TTL index
``{expiresAt: 1}`` (``expireAfterSeconds: 0``, partial on ``expiresAt``
existing) removes expired items in the background. Every write is one
single-document operation. See ``docs/mongodb.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from bson.int64 import Int64
from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.errors import (
    DuplicateKeyError,
)

from pai_storage.backend import (
    KeyValueStore,
    KVRecord,
    VersionMismatch,
    namespace_from_path,
    namespace_path,
    namespace_path_after,
    prefix_upper_bound,
)

from .client import Doc
from .documents import decoded, stored_count
from .runtime import MongoRuntimeStore

__all__ = [
    "INDEXES",
    "MongoKeyValueStore",
]

SCHEMA_VERSION = 1

INDEXES = [
    IndexModel([("ns", ASCENDING), ("key", ASCENDING)], name="ns_key", unique=True),
    IndexModel(
        [("expiresAt", ASCENDING)],
        name="expiresAt_ttl",
        expireAfterSeconds=0,
        partialFilterExpression={"expiresAt": {"$exists": True}},
    ),
]
"""The key-value collection's indexes: created once per collection per client."""

SORT = [("ns", ASCENDING), ("key", ASCENDING)]
HINT = "ns_key"
FIELDS = {
    "_id": 0,
    "ns": 1,
    "key": 1,
    "value": 1,
    "version": 1,
    "createdAt": 1,
    "updatedAt": 1,
    "expiresAt": 1,
    "ttlMs": 1,
}
_FAR = datetime(9999, 12, 31, tzinfo=UTC)


class MongoKeyValueStore(MongoRuntimeStore, KeyValueStore):
    """Key-value items in MongoDB 4.2+, on the shared client of :class:`MongoClientHolder`.

    Takes the parameters of :class:`~pai_storage_mongo.runtime.MongoRuntimeStore`
    (``url``, ``client``, where the collection lives) and the options of
    :class:`~pai_storage.KeyValueStore` (``clock``, ``on_warning``,
    ``token_secret``, ``max_value_bytes``); ``max_value_bytes`` is at most
    15 MiB here (a document holds one value).
    """

    component = "kv"
    value_bytes_limit: ClassVar[int | None] = 15 * 1024 * 1024

    def _indexes(self) -> list[IndexModel]:
        return INDEXES

    # ------------------------------------------------------------ time

    def _live(self) -> Doc:
        """A query filter: the item has no expiry, or it is after now."""
        return {"$expr": {"$gt": [{"$ifNull": ["$expiresAt", _FAR]}, self._now()]}}

    # ------------------------------------------------------------ hooks

    async def _get_many(self, namespace: tuple[str, ...], keys: list[str]) -> list[KVRecord]:
        query = {"ns": namespace_path(namespace), "key": {"$in": keys}, **self._live()}
        with self._holder.errors("read"):
            docs = await self.collection.find(query, FIELDS, hint=HINT).to_list(None)
        return [_record(d) for d in docs]

    async def _refresh_ttl(self, namespace: tuple[str, ...], key: str) -> KVRecord | None:
        now = self._now()
        update = [
            {
                "$set": {
                    "expiresAt": {
                        "$cond": [
                            {"$eq": [{"$type": "$ttlMs"}, "missing"]},
                            "$$REMOVE",
                            {"$add": [now, "$ttlMs"]},
                        ]
                    }
                }
            }
        ]
        query = {"ns": namespace_path(namespace), "key": key, **self._live()}
        with self._holder.errors("write"):
            doc = decoded(
                await self._modify.find_one_and_update(
                    query, update, FIELDS, hint=HINT, return_document=ReturnDocument.AFTER
                )
            )
        return None if doc is None else _record(doc)

    def _write(
        self, text: str, ttl: timedelta | None, *, fresh: bool, now: datetime | None = None
    ) -> list[Doc]:
        """The update pipeline of a write: a new version over a live item, else version 1."""
        now_expr = self._now() if now is None else now
        live: Doc = {"$gt": [{"$ifNull": ["$expiresAt", _FAR]}, now_expr]}
        if fresh:
            live = {"$literal": False}
        exists = {"$and": [{"$ne": [{"$type": "$version"}, "missing"]}, live]}
        fields: Doc = {
            "value": {"$literal": text},
            "version": {"$cond": ["$_live", {"$add": ["$version", Int64(1)]}, Int64(1)]},
            "createdAt": {"$cond": ["$_live", "$createdAt", now_expr]},
            "updatedAt": now_expr,
            "_schemaVersion": SCHEMA_VERSION,
        }
        if ttl is None:
            fields["expiresAt"] = "$$REMOVE"
            fields["ttlMs"] = "$$REMOVE"
        else:
            ms = Int64(ttl // timedelta(milliseconds=1))
            fields["expiresAt"] = {"$add": [now_expr, ms]}
            fields["ttlMs"] = ms
        return [{"$set": {"_live": exists}}, {"$set": fields}, {"$unset": "_live"}]

    async def _put(
        self, namespace: tuple[str, ...], key: str, text: str, ttl: timedelta | None
    ) -> KVRecord:
        query = {"ns": namespace_path(namespace), "key": key}
        # An upsert on exactly the unique index's fields: the server retries a
        # racing insert's duplicate key itself.
        with self._holder.errors("write"):
            doc = decoded(
                await self._modify.find_one_and_update(
                    query,
                    self._write(text, ttl, fresh=False),
                    FIELDS,
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            )
        assert doc is not None  # an upsert returning the document after it always has one
        return _record(doc)

    async def _put_if_version(
        self,
        namespace: tuple[str, ...],
        key: str,
        text: str,
        ttl: timedelta | None,
        expected_version: int | None,
    ) -> KVRecord | VersionMismatch:
        path = namespace_path(namespace)
        doc: Doc | None
        try:
            with self._holder.errors("write"):
                if expected_version is None:
                    # Matches only an expired item; an absent one is inserted, and a
                    # live one makes the insert a duplicate key: nothing written. An
                    # upsert's filter cannot use $expr ($$NOW): the server's time is
                    # read first and used for the filter and the write alike.
                    now = self.now() or await self._holder.server_time()
                    query: Doc = {"ns": path, "key": key, "expiresAt": {"$lte": now}}
                    doc = await self._modify.find_one_and_update(
                        query,
                        self._write(text, ttl, fresh=True, now=now),
                        FIELDS,
                        upsert=True,
                        hint=HINT,
                        return_document=ReturnDocument.AFTER,
                    )
                else:
                    query = {"ns": path, "key": key, "version": expected_version}
                    query.update(self._live())
                    doc = await self._modify.find_one_and_update(
                        query,
                        self._write(text, ttl, fresh=False),
                        FIELDS,
                        hint=HINT,
                        return_document=ReturnDocument.AFTER,
                    )
                doc = decoded(doc)
        except Exception as exc:
            if not isinstance(exc.__cause__, DuplicateKeyError):
                raise
            doc = None
        if doc is not None:
            return _record(doc)
        current = await self._get_many(namespace, [key])
        return VersionMismatch(current[0] if current else None)

    async def _delete(
        self, namespace: tuple[str, ...], key: str, expected_version: int | None
    ) -> bool:
        query: Doc = {"ns": namespace_path(namespace), "key": key, **self._live()}
        if expected_version is not None:
            query["version"] = expected_version
        with self._holder.errors("write"):
            result = await self.collection.delete_one(query, hint=HINT)
        return result.deleted_count > 0

    async def _search(
        self,
        prefix: tuple[str, ...],
        key_prefix: str,
        after: tuple[tuple[str, ...], str] | None,
        limit: int,
    ) -> list[KVRecord]:
        low = namespace_path(prefix)
        high = prefix_upper_bound(low) if low else None
        keys = _range(key_prefix, prefix_upper_bound(key_prefix) if key_prefix else None)
        ns_range = _range(low, high) or dict(_EVERY_PATH)
        clauses: list[Doc] = []
        if after is None:
            clauses.append({"ns": ns_range, **({"key": keys} if keys else {})})
        else:
            # Keyset: the rest of the last namespace, then the namespaces after it
            # (two index ranges the server merges in order, no sort).
            done = namespace_path(after[0])
            clauses.append({"ns": done, "key": {**keys, "$gt": after[1]}})
            rest = {**ns_range, "$gt": done}
            clauses.append({"ns": rest, **({"key": keys} if keys else {})})
        query: Doc = clauses[0] if len(clauses) == 1 else {"$or": clauses}
        query = {"$and": [query, self._live()]}
        with self._holder.errors("read"):
            docs = await self.collection.find(query, FIELDS, sort=SORT, limit=limit).to_list(None)
        return [_record(d) for d in docs]

    async def _list_keys(
        self, namespace: tuple[str, ...], prefix: str, after: str | None, limit: int
    ) -> list[str]:
        keys = _range(prefix, prefix_upper_bound(prefix) if prefix else None)
        if after is not None:
            keys["$gt"] = after
        query: Doc = {"ns": namespace_path(namespace), **({"key": keys} if keys else {})}
        query.update(self._live())
        with self._holder.errors("read"):
            docs = await self.collection.find(
                query, {"_id": 0, "key": 1}, sort=SORT, limit=limit, hint=HINT
            ).to_list(None)
        return [str(d["key"]) for d in docs]

    async def _list_namespaces(
        self,
        prefix: tuple[str, ...],
        max_depth: int | None,
        after: tuple[str, ...] | None,
        limit: int,
    ) -> list[tuple[str, ...]]:
        low = namespace_path(prefix)
        high = prefix_upper_bound(low) if low else None
        if after is not None:
            low = max(low, namespace_path_after(after, max_depth))
        found: list[tuple[str, ...]] = []
        # One index probe per distinct namespace: each finds the first live item
        # at or after the position the previous one skipped to.
        while len(found) < limit:
            query: Doc = {"ns": _range(low, high) or dict(_EVERY_PATH), **self._live()}
            with self._holder.errors("read"):
                docs = await self.collection.find(
                    query, {"_id": 0, "ns": 1}, sort=SORT, limit=1, hint=HINT
                ).to_list(None)
            if not docs:
                break
            namespace = namespace_from_path(str(docs[0]["ns"]))
            if max_depth is not None:
                namespace = namespace[:max_depth]
            found.append(namespace)
            low = namespace_path_after(namespace, max_depth)
        return found

    async def _erase_scope(self, scope: str) -> int:
        low = namespace_path((scope,))  # every item of the scope, expired or not
        with self._holder.errors("write"):
            result = await self.collection.delete_many({"ns": _range(low, prefix_upper_bound(low))})
        return int(result.deleted_count)

    async def _purge_expired(self) -> int:
        now = self.now() or await self._holder.server_time()
        with self._holder.errors("write"):
            result = await self.collection.delete_many({"expiresAt": {"$lte": now}})
        return result.deleted_count


_EVERY_PATH: Doc = {"$gte": ""}
"""Every namespace path (the empty prefix). Never ``{}``: as a field's condition
that is an equality with an empty document, which matches nothing."""


def _range(low: str, high: str | None) -> Doc:
    """A string range ``low <= x < high`` as a query condition (empty: no bound at all)."""
    out: Doc = {}
    if low:
        out["$gte"] = low
    if high is not None:
        out["$lt"] = high
    return out


def _record(doc: Mapping[str, Any]) -> KVRecord:
    """The record of a stored document.

    A document whose fields are missing or of the wrong type (edited by hand,
    written by another program) becomes a record whose text is not JSON: the
    core reports it (``invalid_record``) and treats the item as absent.
    """
    value: Any = doc.get("value")
    version: Any = doc.get("version")
    created_at, updated_at = doc.get("createdAt"), doc.get("updatedAt")
    expires_at, ttl_ms = doc.get("expiresAt"), doc.get("ttlMs")
    if not (
        isinstance(value, str)
        and stored_count(version)
        and isinstance(created_at, datetime)
        and isinstance(updated_at, datetime)
        and (expires_at is None or isinstance(expires_at, datetime))
        and (ttl_ms is None or stored_count(ttl_ms))
    ):
        # Never decodes: reported as invalid.
        value, version, created_at, updated_at = "\x00", 1, _EPOCH, _EPOCH
        expires_at = ttl_ms = None
    return KVRecord(
        namespace=namespace_from_path(str(doc["ns"])),
        key=str(doc["key"]),
        text=value,
        version=int(version),
        created_at=created_at,
        updated_at=updated_at,
        expires_at=expires_at,
        ttl=None if ttl_ms is None else timedelta(milliseconds=int(ttl_ms)),
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
