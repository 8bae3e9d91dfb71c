"""LangGraph on pai-storage: a checkpoint saver and a long-term memory store.

``pip install 'pai-storage[langgraph]'``; see ``docs/langgraph.md``.

:class:`PaiCheckpointSaver` is a ``BaseCheckpointSaver`` and :class:`PaiStore`
a ``BaseStore``, both on pai-storage's key-value store, so they work on every
backend URL. Checkpoints of a thread live under the namespaces
``(scope_key, "langgraph", thread_id, "ns:" + checkpoint_ns, ...)``:

``... "checkpoints"``
    one item per checkpoint, keyed by its id with every hex digit inverted, so
    the store's ascending key order is newest first: the latest checkpoint is
    the first item (one read) and history is a keyset walk. The item holds the
    serialized checkpoint and metadata, the parent id, the values of the
    channels this checkpoint wrote, and for every channel where its current
    value is stored (``channels``: ``{name: [version, checkpoint_id]}``, or
    ``[version, checkpoint_id, false]`` when that checkpoint stored the channel
    empty, as when a node consumed it: a read has nothing to fetch for it).
``... "writes", checkpoint_id``
    one item per task: its pending writes.

A checkpoint is one write (its channel values travel in it), so nothing is
half-written; an unchanged channel is not stored again.
"""

from __future__ import annotations

import asyncio
import base64
import random
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Self

from .. import bundle
from ..bundle import Stores
from ..errors import InvalidInputError
from ..kv import Item as KVItem
from ..kv import KeyValueStore, KVConflict
from .support import (
    LoopBridge,
    delete_under,
    every_item,
    every_key,
    every_page,
    get_all,
    kv_of,
    missing_framework,
    text_id,
)

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
    )
except ImportError as exc:  # the extra is not installed
    raise missing_framework(__name__, "LangGraph", "langgraph") from exc

__all__ = ["PaiCheckpointSaver", "PaiStore"]

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_INVERT = str.maketrans("0123456789abcdef", "fedcba9876543210")
_PAGE = 100
_REMEMBERED = 1024  # checkpoints whose channel map a saver keeps (a few KB each)


def _key(checkpoint_id: str) -> str:
    """The item key of a checkpoint: ascending key order is newest first."""
    if not isinstance(checkpoint_id, str) or not _UUID.fullmatch(checkpoint_id):
        raise InvalidInputError(
            "checkpoint_id must be a LangGraph checkpoint id (a lower-case UUID string)"
        )
    return checkpoint_id.translate(_INVERT)


def _checkpoint_id(key: str) -> str:
    return key.translate(_INVERT)  # the inversion is its own inverse


def _dump(serde: SerializerProtocol, value: Any) -> list[str]:
    kind, data = serde.dumps_typed(value)
    return [kind, base64.b64encode(data).decode("ascii")]


def _load(serde: SerializerProtocol, stored: Sequence[str]) -> Any:
    return serde.loads_typed((stored[0], base64.b64decode(stored[1])))


def _holds_value(ref: Sequence[Any]) -> bool:
    """Whether the checkpoint a channel reference names stored a value for it.

    Items written before the third element existed have two: they may hold
    one (the read finds out)."""
    return len(ref) < 3 or bool(ref[2])


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class PaiCheckpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on pai-storage's key-value store.

    Parameters
    ----------
    stores:
        An open :func:`pai_storage.connect` bundle (its ``kv`` is used), or a
        :class:`~pai_storage.KeyValueStore`.
    scope_key:
        The tenant: the first segment of every namespace written, so
        :meth:`Stores.erase_scope <pai_storage.Stores.erase_scope>` erases it.
    serde:
        LangGraph's serializer (default: its ``JsonPlusSerializer``).

    The async methods are the primary API. The sync ones (``get_tuple``,
    ``put``, ...) work from other threads while the loop that opened the
    stores runs, as for LangGraph's own async savers.
    """

    def __init__(
        self,
        stores: Stores | KeyValueStore,
        *,
        scope_key: str = "default",
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.kv = kv_of(stores, "PaiCheckpointSaver")
        self.scope_key = text_id("scope_key", scope_key)
        self._bridge = LoopBridge("PaiCheckpointSaver")
        # Where the channels of recent checkpoints live: a checkpoint is written
        # once and never changes, so a put whose parent is here skips reading it.
        self._channels: OrderedDict[tuple[str, ...], Any] = OrderedDict()

    def _keep_channels(self, namespace: tuple[str, ...], checkpoint_id: str, channels: Any) -> None:
        self._channels[(*namespace, checkpoint_id)] = channels
        self._channels.move_to_end((*namespace, checkpoint_id))
        while len(self._channels) > _REMEMBERED:
            self._channels.popitem(last=False)

    @classmethod
    @asynccontextmanager
    async def from_url(
        cls,
        url: str,
        *,
        scope_key: str = "default",
        serde: SerializerProtocol | None = None,
        **options: Any,
    ) -> AsyncIterator[Self]:
        """Open the key-value store at ``url`` (``options`` as for
        :func:`pai_storage.open_kv_store`), yield a saver on it, close it after."""
        async with bundle.open_kv_store(url, **options) as kv:
            yield cls(kv, scope_key=scope_key, serde=serde)

    # ------------------------------------------------------------ layout

    def _thread(self, thread_id: object) -> tuple[str, ...]:
        return (self.scope_key, "langgraph", text_id("thread_id", thread_id))

    def _namespace(self, thread_id: object, checkpoint_ns: str, *rest: str) -> tuple[str, ...]:
        return (*self._thread(thread_id), "ns:" + checkpoint_ns, *rest)

    @staticmethod
    def _target(config: RunnableConfig) -> tuple[str, str]:
        configurable = config.get("configurable") or {}
        thread_id = text_id("thread_id", configurable.get("thread_id"))
        return thread_id, configurable.get("checkpoint_ns") or ""

    # ------------------------------------------------------------ reads

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's latest (one read)."""
        self._bridge.bind()
        thread_id, checkpoint_ns = self._target(config)
        namespace = self._namespace(thread_id, checkpoint_ns, "checkpoints")
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            item = await self.kv.get(namespace, _key(checkpoint_id))
            found = [] if item is None else [item]
        else:
            found = list((await self.kv.search(namespace, limit=1)).items)
        if not found:
            return None
        return (await self._tuples(thread_id, checkpoint_ns, found))[0]

    async def _tuples(
        self, thread_id: str, checkpoint_ns: str, items: list[KVItem]
    ) -> list[CheckpointTuple]:
        """Checkpoint tuples of items of one checkpoint namespace: one round trip
        for their pending writes and, in parallel, the checkpoints holding the
        values of channels they did not write (none when those are empty)."""
        namespace = self._namespace(thread_id, checkpoint_ns, "checkpoints")
        by_id = {_checkpoint_id(item.key): item for item in items}
        elsewhere = sorted(
            {
                ref[1]
                for item in items
                for ref in item.value["channels"].values()
                if ref[1] not in by_id and _holds_value(ref)
            }
        )
        holders, writes = await asyncio.gather(
            get_all(self.kv, namespace, [_key(i) for i in elsewhere]),
            asyncio.gather(*(self._writes(thread_id, checkpoint_ns, i) for i in by_id)),
        )
        values_of = {cid: item.value for cid, item in by_id.items()}
        for cid, item in by_id.items():
            self._keep_channels(namespace, cid, item.value["channels"])
        values_of.update({_checkpoint_id(key): item.value for key, item in holders.items()})
        return [
            self._tuple(thread_id, checkpoint_ns, cid, item.value, values_of, pending)
            for (cid, item), pending in zip(by_id.items(), writes, strict=True)
        ]

    def _tuple(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        stored: Any,
        values_of: Mapping[str, Any],
        pending: list[PendingWrite],
    ) -> CheckpointTuple:
        checkpoint: Checkpoint = _load(self.serde, stored["checkpoint"])
        channel_values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            ref = stored["channels"].get(channel)
            if ref is None or ref[0] != version or not _holds_value(ref):
                continue
            holder = values_of.get(ref[1])
            blob = None if holder is None else holder["blobs"].get(channel)
            if blob is not None:
                channel_values[channel] = _load(self.serde, blob)
        parent = stored["parent"]
        return CheckpointTuple(
            config=_config(thread_id, checkpoint_ns, checkpoint_id),
            checkpoint={**checkpoint, "channel_values": channel_values},
            metadata=_load(self.serde, stored["metadata"]),
            parent_config=None if parent is None else _config(thread_id, checkpoint_ns, parent),
            pending_writes=pending,
        )

    async def _writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[PendingWrite]:
        namespace = self._namespace(thread_id, checkpoint_ns, "writes", checkpoint_id)
        rows: list[tuple[tuple[str, str, int], PendingWrite]] = []
        async for item in every_item(self.kv, namespace):
            task = item.value
            for idx, channel, *blob in task["writes"]:
                write = (item.key, channel, _load(self.serde, blob))
                rows.append(((task["path"], item.key, idx), write))
        rows.sort(key=lambda row: row[0])  # LangGraph's writes_sort_key order
        return [write for _, write in rows]

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, in keyset pages.

        ``config`` names the thread (and ``checkpoint_ns``; without it every
        namespace of the thread, one after the other; with ``checkpoint_id``
        that checkpoint alone); ``None`` lists every thread. ``filter`` matches
        metadata keys exactly; ``before`` starts after that checkpoint;
        ``limit`` (``0`` or less: nothing) stops the walk once that many are
        yielded.

        Only the checkpoints yielded are built (their channel values and
        pending writes read): the filter is tested on each item's stored
        metadata first, so a filter that matches few checkpoints of a long
        thread costs a read of its values by the page, not a tuple each.
        """
        self._bridge.bind()
        if limit is not None and limit <= 0:
            return
        remaining = limit
        before_key = None
        if before is not None and (before_id := get_checkpoint_id(before)):
            before_key = _key(before_id)
        only_id = get_checkpoint_id(config) if config else None
        only_key = _key(only_id) if only_id else None
        async for thread_id, checkpoint_ns in self._sources(config):
            if only_key is not None:  # that checkpoint alone, as LangGraph's savers list
                found = self._list_id(thread_id, checkpoint_ns, only_key, before_key, filter or {})
            else:
                found = self._list_one(
                    thread_id, checkpoint_ns, before_key, filter or {}, remaining
                )
            async for tup in found:
                yield tup
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        return

    async def _sources(self, config: RunnableConfig | None) -> AsyncIterator[tuple[str, str]]:
        configurable = (config or {}).get("configurable") or {}
        if config is not None and configurable.get("checkpoint_ns") is not None:
            yield self._target(config)
            return
        prefix = (
            self._thread(configurable["thread_id"]) if config else (self.scope_key, "langgraph")
        )
        async for namespace in every_page(
            lambda token: self.kv.list_namespaces(prefix, limit=1000, page_token=token)
        ):
            if len(namespace) == 5 and namespace[4] == "checkpoints":
                yield namespace[2], namespace[3].removeprefix("ns:")

    async def _list_id(
        self,
        thread_id: str,
        checkpoint_ns: str,
        key: str,
        before_key: str | None,
        filter: Mapping[str, Any],
    ) -> AsyncIterator[CheckpointTuple]:
        """The checkpoint keyed ``key`` of one checkpoint namespace, if it is
        older than ``before_key`` and its metadata matches ``filter``."""
        if before_key is not None and key <= before_key:
            return
        namespace = self._namespace(thread_id, checkpoint_ns, "checkpoints")
        item = await self.kv.get(namespace, key)
        if item is not None and self._metadata_matches(item.value, filter):
            for tup in await self._tuples(thread_id, checkpoint_ns, [item]):
                yield tup

    async def _list_one(
        self,
        thread_id: str,
        checkpoint_ns: str,
        before_key: str | None,
        filter: Mapping[str, Any],
        limit: int | None,
    ) -> AsyncIterator[CheckpointTuple]:
        """At most ``limit`` (a positive count, or ``None``) tuples of one
        checkpoint namespace whose metadata matches ``filter``, newest first."""
        namespace = self._namespace(thread_id, checkpoint_ns, "checkpoints")
        # Keys first (a key page is small), values by the page: a `before`
        # cursor skips the newer keys without reading their values.
        token: str | None = None
        while True:
            page = await self.kv.list_keys(namespace, limit=1000, page_token=token)
            keys = [k for k in page.items if before_key is None or k > before_key]
            start = 0
            while start < len(keys):
                # Unfiltered, every value read is yielded: read no more than the
                # limit takes. Filtered, a whole page: any of it may match.
                size = _PAGE if filter or limit is None else min(_PAGE, limit)
                chunk = keys[start : start + size]
                start += size
                found = await self.kv.get_many(namespace, chunk)
                items = [
                    found[k]
                    for k in chunk
                    if k in found and self._metadata_matches(found[k].value, filter)
                ]
                if limit is not None:
                    items = items[:limit]
                    limit -= len(items)
                if items:
                    for tup in await self._tuples(thread_id, checkpoint_ns, items):
                        yield tup
                if limit == 0:
                    return
            token = page.next_page_token
            if token is None:
                return

    def _metadata_matches(self, stored: Any, filter: Mapping[str, Any]) -> bool:
        """Whether a stored checkpoint's metadata has every key of ``filter``
        with an equal value (LangGraph's savers' test), decoding only the
        metadata."""
        if not filter:
            return True
        metadata = _load(self.serde, stored["metadata"])
        return not any(metadata.get(k) != v for k, v in filter.items())

    # ------------------------------------------------------------ writes

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint in one write; unchanged channels point at the
        checkpoint that holds their value."""
        self._bridge.bind()
        thread_id, checkpoint_ns = self._target(config)
        namespace = self._namespace(thread_id, checkpoint_ns, "checkpoints")
        checkpoint_id = checkpoint["id"]
        key = _key(checkpoint_id)
        parent_id = get_checkpoint_id(config)
        stripped: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stripped.pop("channel_values")
        versions = checkpoint["channel_versions"]
        channels: dict[str, list[Any]] = {}
        unchanged = [c for c in versions if c not in new_versions]
        if unchanged and parent_id:
            known = self._channels.get((*namespace, parent_id))
            if known is None:
                parent = await self.kv.get(namespace, _key(parent_id))
                known = {} if parent is None else parent.value["channels"]
            for channel in unchanged:
                ref = known.get(channel)
                if ref is not None and ref[0] == versions[channel]:
                    channels[channel] = ref
        blobs: dict[str, Any] = {}
        for channel, version in new_versions.items():
            if channel in values:
                channels[channel] = [version, checkpoint_id]
                blobs[channel] = _dump(self.serde, values[channel])
            else:  # empty (consumed): later reads of this version fetch nothing
                channels[channel] = [version, checkpoint_id, False]
                blobs[channel] = None
        await self.kv.put(
            namespace,
            key,
            {
                "checkpoint": _dump(self.serde, stripped),
                "metadata": _dump(self.serde, get_checkpoint_metadata(config, metadata)),
                "parent": parent_id,
                "channels": channels,
                "blobs": blobs,
            },
        )
        self._keep_channels(namespace, checkpoint_id, channels)
        return _config(thread_id, checkpoint_ns, checkpoint_id)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes: a write already stored at the same
        index is kept, except the special channels (errors, interrupts), which
        are replaced."""
        self._bridge.bind()
        thread_id, checkpoint_ns = self._target(config)
        checkpoint_id = text_id("checkpoint_id", get_checkpoint_id(config))
        _key(checkpoint_id)
        namespace = self._namespace(thread_id, checkpoint_ns, "writes", checkpoint_id)
        task = text_id("task_id", task_id)
        incoming = {
            WRITES_IDX_MAP.get(channel, idx): [channel, *_dump(self.serde, value)]
            for idx, (channel, value) in enumerate(writes)
        }
        # Most tasks write once: try to create the item (one round trip); a
        # conflict hands back the stored item to merge into.
        item: KVItem | None = None
        while True:
            stored: dict[int, list[Any]] = (
                {} if item is None else {w[0]: w[1:] for w in item.value["writes"]}
            )
            merged = dict(stored)
            for idx, write in incoming.items():
                if idx < 0 or idx not in stored:
                    merged[idx] = write
            if item is not None and merged == stored:
                return
            value = {"path": task_path, "writes": [[i, *w] for i, w in sorted(merged.items())]}
            expected = None if item is None else item.version
            result = await self.kv.put_if_version(namespace, task, value, expected)
            if not isinstance(result, KVConflict):
                return
            item = result.current

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of the thread (one delete per item)."""
        self._bridge.bind()
        prefix = self._thread(thread_id)
        for remembered in [k for k in self._channels if k[: len(prefix)] == prefix]:
            del self._channels[remembered]
        await delete_under(self.kv, prefix)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another thread id.

        Oldest checkpoint first, each after its pending writes: a copy cut
        short (cancelled, a lost connection) leaves the target an earlier
        state of the thread, never a checkpoint whose channel values or
        pending writes are not there."""
        self._bridge.bind()
        source = self._thread(source_thread_id)
        target = self._thread(target_thread_id)

        async def copy(items: Iterable[KVItem]) -> None:
            for item in items:
                await self.kv.put((*target, *item.namespace[len(source) :]), item.key, item.value)

        async for thread_id, checkpoint_ns in self._sources(
            {"configurable": {"thread_id": source_thread_id}}
        ):
            namespace = self._namespace(thread_id, checkpoint_ns, "checkpoints")
            keys = [key async for key in every_key(self.kv, namespace)]
            keys.reverse()  # oldest first
            for start in range(0, len(keys), _PAGE):
                chunk = keys[start : start + _PAGE]
                found = await self.kv.get_many(namespace, chunk)
                for key in chunk:
                    writes = self._namespace(
                        thread_id, checkpoint_ns, "writes", _checkpoint_id(key)
                    )
                    await copy([item async for item in every_item(self.kv, writes)])
                    if key in found:
                        await copy([found[key]])

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions as LangGraph's own savers make them: a zero-padded counter
        and a random tail, so they compare as strings."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # ------------------------------------------------------------ sync variants

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._bridge.run(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            found = self.alist(config, filter=filter, before=before, limit=limit)
            return [tup async for tup in found]

        yield from self._bridge.run(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._bridge.run(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._bridge.run(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._bridge.run(self.adelete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._bridge.run(self.acopy_thread(source_thread_id, target_thread_id))


# ---------------------------------------------------------------- the store


class PaiStore(BaseStore):
    """LangGraph's long-term memory store on pai-storage's key-value store.

    A LangGraph namespace *is* a key-value namespace (after ``prefix``), so
    what a graph remembers is also ``stores.kv``'s. Values must be strict
    JSON objects. ``ttl`` (minutes, LangGraph's unit) becomes the item's
    expiry; with ``ttl_config`` ``refresh_on_read`` a read extends it. Search
    filters (exact values and ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``,
    ``$lte``) are applied to the items under the namespace prefix in store
    order; there is no vector index, so ``query`` is ignored and scores are
    ``None``.

    Parameters
    ----------
    stores:
        A :func:`pai_storage.connect` bundle or a
        :class:`~pai_storage.KeyValueStore`.
    prefix:
        Segments put before every namespace (e.g. ``(tenant,)``, so
        :meth:`Stores.erase_scope <pai_storage.Stores.erase_scope>` covers it).
    ttl_config:
        LangGraph's ``TTLConfig`` (``default_ttl`` in minutes, ``refresh_on_read``).
    """

    supports_ttl = True

    def __init__(
        self,
        stores: Stores | KeyValueStore,
        *,
        prefix: Sequence[str] = (),
        ttl_config: TTLConfig | None = None,
    ) -> None:
        self.kv = kv_of(stores, "PaiStore")
        self.prefix = tuple(text_id("prefix", segment) for segment in prefix)
        self.ttl_config = ttl_config
        self._bridge = LoopBridge("PaiStore")

    @classmethod
    @asynccontextmanager
    async def from_url(
        cls,
        url: str,
        *,
        prefix: Sequence[str] = (),
        ttl_config: TTLConfig | None = None,
        **options: Any,
    ) -> AsyncIterator[Self]:
        """Open the key-value store at ``url``, yield a store on it, close it after."""
        async with bundle.open_kv_store(url, **options) as kv:
            yield cls(kv, prefix=prefix, ttl_config=ttl_config)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self._bridge.run(self.abatch(ops))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order (a put is seen by a later get of the batch)."""
        self._bridge.bind()
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(await self._get(op))
            elif isinstance(op, PutOp):
                await self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._list_namespaces(op))
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__qualname__}")
        return results

    def _outside(self, namespace: Sequence[str]) -> tuple[str, ...]:
        return (*self.prefix, *namespace)

    def _item(self, item: KVItem, cls: type[Item] = Item) -> Any:
        value = item.value
        if not isinstance(value, dict):
            value = {"value": value}  # written through stores.kv as a non-object
        fields: dict[str, Any] = {
            "namespace": item.namespace[len(self.prefix) :],
            "key": item.key,
            "value": value,
            "created_at": item.created_at,
            "updated_at": item.updated_at,
        }
        return cls(**fields)

    async def _get(self, op: GetOp) -> Item | None:
        found = await self.kv.get(
            self._outside(op.namespace), op.key, refresh_ttl=bool(op.refresh_ttl)
        )
        return None if found is None else self._item(found)

    async def _put(self, op: PutOp) -> None:
        namespace = self._outside(op.namespace)
        if op.value is None:
            await self.kv.delete(namespace, op.key)
            return
        if op.ttl is not None and op.ttl <= 0:
            raise InvalidInputError(f"ttl must be a positive number of minutes (got {op.ttl})")
        ttl = None if op.ttl is None else timedelta(minutes=op.ttl)
        await self.kv.put(namespace, op.key, dict(op.value), ttl=ttl)

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        wanted = op.offset + op.limit
        matched: list[SearchItem] = []
        if wanted <= 0:
            return matched
        prefix = self._outside(op.namespace_prefix)
        page_size = 1000 if op.filter else min(max(wanted, 1), 1000)
        async for item in every_page(
            lambda token: self.kv.search(prefix, limit=page_size, page_token=token)
        ):
            found = self._item(item, SearchItem)
            if _reserved(found.namespace):
                continue
            if op.filter and not _matches(found.value, op.filter):
                continue
            matched.append(found)
            if len(matched) >= wanted:
                break
        result = matched[op.offset :]
        if op.refresh_ttl:
            for found in result:
                await self.kv.get(self._outside(found.namespace), found.key, refresh_ttl=True)
        return result

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        literal: list[str] = []
        for condition in conditions:
            if condition.match_type == "prefix":
                for segment in condition.path:
                    if segment == "*":
                        break
                    literal.append(segment)
                break
        prefix = self._outside(literal)
        found: set[tuple[str, ...]] = set()
        async for namespace in every_page(
            lambda token: self.kv.list_namespaces(prefix, limit=1000, page_token=token)
        ):
            outside = namespace[len(self.prefix) :]
            if _reserved(outside):
                continue
            if all(_namespace_matches(c, outside) for c in conditions):
                found.add(outside if op.max_depth is None else outside[: op.max_depth])
        return sorted(found)[op.offset : op.offset + op.limit]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def _reserved(namespace: Sequence[str]) -> bool:
    """Whether a namespace is LangGraph's (its first label ``"langgraph"``, which
    no store put may use): where a saver with the store's tenant as
    ``scope_key`` keeps its checkpoints, not memories."""
    return bool(namespace) and namespace[0] == "langgraph"


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise InvalidInputError(f"unknown namespace match type {condition.match_type!r}")
    return all(want == "*" or have == want for have, want in pairs)


_OPERATORS = {
    "$eq": lambda a, b: a == b,
    "$ne": lambda a, b: a != b,
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: nested objects, exact lists, comparison operators."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            for op, operand in wanted.items():
                compare = _OPERATORS.get(op)
                if compare is None:
                    raise InvalidInputError(f"unknown filter operator {op!r}")
                try:
                    if not compare(value, operand):
                        return False
                except TypeError:  # values of different types never compare true
                    return False
            return True
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_matches(a, b) for a, b in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)
