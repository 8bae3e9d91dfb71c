"""A commit's relationship queries, and the facts a root keeps so the next one needs none.

The core's relationship check (``docs/commits.md``) asks a
:class:`~pai_storage.backend.RelationshipReader` for the thread's open runs,
its tail and each named run's facts. :class:`Reader` answers with queries
inside the commit's transaction (they see its writes); :class:`SummaryReader`
answers from the root's ``_facts``
(:class:`~pai_storage_mongo.documents.RootSummary`) when they follow from the
commit's writes (:func:`facts_follow`), querying only runs they do not know.
:func:`read_facts` reads the facts a root stores after a commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pymongo import ASCENDING, DESCENDING

from pai_storage.backend import OPEN_STATUSES, Entry, MessageRef, QueueRef, RunRef, RunRelations
from pai_storage.errors import ThreadStoreInvariantError
from pai_storage.models import InsertChange, ReplaceChange, ThreadChanges

from .documents import OpenRunSummary, RootSummary
from .indexes import Doc

_A, _D = ASCENDING, DESCENDING

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession

    from .store import MongoThreadStore


__all__ = ["Reader", "SummaryReader", "facts_follow", "message_ref", "read_facts", "run_ref"]


def facts_follow(changes: ThreadChanges | None) -> bool:
    """Whether a commit's facts follow from its writes (see ``RootSummary.after``).

    True when it only inserts messages and inserts or replaces runs, with any
    root or lease change.
    """
    if changes is None:
        return True
    if changes.queued_items:
        return False
    if not all(isinstance(c, InsertChange | ReplaceChange) for c in changes.runs or ()):
        return False
    return all(isinstance(c, InsertChange) for c in changes.messages or ())


async def read_facts(reader: Reader) -> RootSummary:
    """The thread's facts after the commit, through the (memoizing) relationship reader."""
    open_runs = await reader.open_runs()
    tail = await reader.tail()
    facts = await reader.run_facts([r.run_id for r in open_runs]) if open_runs else {}
    return RootSummary(
        tail,
        tuple(
            OpenRunSummary(run, tuple(facts[run.run_id].messages), facts[run.run_id].foreign_inside)
            for run in open_runs
        ),
    )


class SummaryReader:
    """The relationship queries of a commit whose facts follow from its writes.

    The open runs, the tail and the facts of every run the facts know (open
    before or after the commit, or inserted by it) need no query; other runs
    (which such a commit rarely names) are queried.
    """

    def __init__(
        self, facts: RootSummary, known: Mapping[str, OpenRunSummary], reader: Reader
    ) -> None:
        self._facts = facts
        self._known = known
        self._reader = reader

    async def open_runs(self) -> Sequence[RunRef]:
        return [o.run for o in self._facts.open]

    async def tail(self) -> MessageRef | None:
        return self._facts.tail

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunRelations]:
        ids = list(dict.fromkeys(run_ids))
        others = [i for i in ids if i not in self._known]
        found: dict[str, RunRelations] = (
            dict(await self._reader.run_facts(others)) if others else {}
        )
        for run_id in ids:
            if run_id in self._known:
                known = self._known[run_id]
                # No queued item names it: an open run is admitted (a valid thread has
                # none of its items), an inserted run is new, and the commit changes
                # no queued item.
                found[run_id] = RunRelations(known.run, list(known.messages), known.foreign, [])
        return found


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
