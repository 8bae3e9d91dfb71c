"""A commit's relationship queries inside its transaction.

The core's relationship check (``docs/commits.md``) asks a
:class:`~pai_storage.backend.RelationshipReader` for the thread's open runs,
its tail and each named run's facts. :class:`Reader` answers with queries
inside the commit's transaction (they see its writes); when the root's
``_facts`` (:class:`~pai_storage.root_facts.RootFacts`) follow from the
commit's writes, :class:`~pai_storage.root_facts.FactsReader` answers from
them and asks :class:`Reader` only about runs they do not know.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pymongo import ASCENDING, DESCENDING

from pai_storage.backend import OPEN_STATUSES, Entry, MessageRef, QueueRef, RunRef, RunRelations
from pai_storage.errors import ThreadStoreInvariantError

from .indexes import Doc

_A, _D = ASCENDING, DESCENDING

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession

    from .store import MongoThreadStore


__all__ = ["Reader", "message_ref", "run_ref"]


def run_ref(doc: Mapping[str, Any]) -> RunRef:
    try:
        admission = doc["admission"]
        queue_item_id = admission.get("queueItemId")
        return RunRef(
            str(doc["runId"]),
            str(doc["status"]),
            bool(admission["admitted"]),
            queue_item_id if isinstance(queue_item_id, str) else None,
            tuple(str(i) for i in doc["inputMessageIds"]),
        )
    except (KeyError, TypeError, AttributeError):
        raise ThreadStoreInvariantError("invalid stored run: malformed fields") from None


def message_ref(doc: Mapping[str, Any]) -> MessageRef:
    try:
        assoc = doc["association"]
        run_id = assoc.get("runId") if assoc.get("kind") == "run" else None
        relation = assoc.get("relation") if run_id is not None else None
        return MessageRef(str(doc["messageId"]), int(doc["_order"]), run_id, relation)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise ThreadStoreInvariantError("invalid stored message: malformed fields") from None


class Reader:
    """The relationship planner's post-commit queries, inside the commit's transaction.

    It sees the transaction's own writes. Round trips are saved where the
    commit already knows the answer: runs are fetched once for the ids the check names
    and the open runs together; the tail is the last inserted message when the
    commit inserted any; and when the commit changes no run and no queued item,
    each run's queued items are unchanged from the (valid) previous state, so
    they follow from the run itself.
    """

    def __init__(
        self,
        store: MongoThreadStore,
        session: AsyncClientSession,
        key: Doc,
        *,
        prefetch: set[str],
        tail: Entry[Any] | None,
        queue_unchanged: bool,
    ) -> None:
        self._store = store
        self._session = session
        self._key = key
        self._prefetch = prefetch
        self._tail = tail
        self._queue_unchanged = queue_unchanged
        self._runs: dict[str, RunRef] | None = None
        self._open: list[RunRef] | None = None
        self._facts: dict[str, RunRelations] = {}

    async def _load_runs(self, ids: Iterable[str], with_open: bool) -> None:
        wanted = sorted(set(ids))
        query: Doc = {**self._key, "runId": {"$in": wanted}}
        if with_open:
            query = {
                **self._key,
                "$or": [
                    {"runId": {"$in": wanted}},
                    {"status": {"$in": ["running", "waiting"]}},
                ],
            }
        cursor = self._store._col("runs").find(
            query,
            projection={"_id": 0, "runId": 1, "status": 1, "admission": 1, "inputMessageIds": 1},
            session=self._session,
        )
        runs = self._runs if self._runs is not None else {}
        async for doc in cursor:
            ref = run_ref(doc)
            runs[ref.run_id] = ref
        self._runs = runs

    async def open_runs(self) -> Sequence[RunRef]:
        if self._open is None:
            await self._load_runs(self._prefetch, with_open=True)
            assert self._runs is not None
            self._open = [r for r in self._runs.values() if r.status in OPEN_STATUSES]
        return self._open

    async def tail(self) -> MessageRef | None:
        if self._tail is not None:
            return MessageRef.of(self._tail.position, self._tail.record)
        doc = await self._store._col("messages").find_one(
            self._key,
            projection={"_id": 0, "messageId": 1, "_order": 1, "association": 1},
            sort=[("_order", _D)],
            session=self._session,
        )
        return message_ref(doc) if doc is not None else None

    async def _run_messages(
        self, ids: list[str]
    ) -> tuple[dict[str, list[MessageRef]], dict[str, tuple[int, int, int]]]:
        """Each run's rule-relevant messages and its span ``(first, last, count)``.

        The rules look at a run's input-relation messages, whether anything
        precedes them, and its last message; so one grouped query returns, per
        run, the input messages, the first other message and the last one (in
        position order) instead of every message the run owns. That subset
        breaks rules 1 to 5 exactly when the full list does.
        """

        def ref(field: str) -> Doc:
            # ``o`` (the position) comes first: MongoDB compares embedded documents field
            # by field in stored order, so ``$min`` below picks the first by position.
            return {"o": "$_order", "m": "$messageId", "r": f"${field}"}

        is_input = {"$eq": ["$association.relation", "input"]}
        cursor = await self._store._col("messages").aggregate(
            [
                {
                    "$match": {
                        **self._key,
                        "association.kind": "run",
                        "association.runId": {"$in": ids},
                    }
                },
                {"$sort": {"_order": 1}},
                {
                    "$group": {
                        "_id": "$association.runId",
                        "n": {"$sum": 1},
                        "first": {"$first": "$_order"},
                        "last": {"$last": ref("association.relation")},
                        "inputs": {
                            "$push": {"$cond": [is_input, ref("association.relation"), "$$REMOVE"]}
                        },
                        "other": {"$min": {"$cond": [is_input, None, ref("association.relation")]}},
                    }
                },
            ],
            session=self._session,
        )
        messages: dict[str, list[MessageRef]] = {i: [] for i in ids}
        spans: dict[str, tuple[int, int, int]] = {}
        async for group in cursor:
            run_id = group["_id"]
            if run_id not in messages:
                continue
            try:
                picked = {
                    int(d["o"]): MessageRef(str(d["m"]), int(d["o"]), run_id, d.get("r"))
                    for d in (*group["inputs"], group["other"], group["last"])
                    if isinstance(d, dict)
                }
                last = int(group["last"]["o"])
                spans[run_id] = (int(group["first"]), last, int(group["n"]))
            except (KeyError, TypeError, ValueError):
                raise ThreadStoreInvariantError(
                    "invalid stored message: malformed fields"
                ) from None
            messages[run_id] = [picked[o] for o in sorted(picked)]
        return messages, spans

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        """Facts for each id, each loaded once per commit."""
        ids = list(dict.fromkeys(run_ids))
        missing = [i for i in ids if i not in self._facts]
        if missing:
            self._facts.update(await self._load_facts(missing))
        return {i: self._facts[i] for i in ids}

    async def _load_facts(self, ids: list[str]) -> dict[str, RunRelations]:
        key, session = self._key, self._session
        missing = [i for i in ids if self._runs is None or i not in self._runs]
        known_absent = self._runs is not None and set(missing) <= self._prefetch
        if missing and not known_absent:
            await self._load_runs(missing, with_open=False)
        runs = self._runs or {}
        messages, spans = await self._run_messages(ids)
        items: dict[str, list[tuple[int, QueueRef]]] = {i: [] for i in ids}
        if self._queue_unchanged:
            for run_id in ids:
                run = runs.get(run_id)
                if run is not None and run.status == "queued" and run.queue_item_id is not None:
                    items[run_id].append((0, QueueRef(run.queue_item_id, run_id)))
        else:
            item_cursor = self._store._col("queuedItems").find(
                {**key, "runId": {"$in": ids}},
                projection={"_id": 0, "queueItemId": 1, "runId": 1, "_order": 1},
                session=session,
            )
            async for doc in item_cursor:
                try:
                    run_id, item_id = str(doc["runId"]), str(doc["queueItemId"])
                    order = int(doc["_order"])
                except (KeyError, TypeError, ValueError):
                    raise ThreadStoreInvariantError("invalid stored queued item") from None
                if run_id in items:
                    items[run_id].append((order, QueueRef(item_id, run_id)))
        facts: dict[str, RunRelations] = {}
        for run_id in ids:
            owned = messages[run_id]
            foreign = False
            if run_id in spans:
                first, last, count = spans[run_id]
                if last - first + 1 != count:  # gaps: count what lies in between
                    between = await self._store._col("messages").count_documents(
                        {**key, "_order": {"$gte": first, "$lte": last}}, session=session
                    )
                    foreign = between != count
            facts[run_id] = RunRelations(
                run=runs.get(run_id),
                messages=owned,
                foreign_inside=foreign,
                queued_items=[ref for _, ref in sorted(items[run_id], key=lambda p: p[0])],
            )
        return facts
