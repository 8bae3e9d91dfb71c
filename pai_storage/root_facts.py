"""Relationship facts kept on the root, so the common commit checks the rules without a query.

The relationship check (:mod:`.relationships`) of a commit that appends
messages or starts or finishes a run asks for the thread's open runs, its
last message and the facts of the runs it names. A backend that stores the
answer on the root (:class:`RootFacts`, written by every commit beside the
root) derives the next answer from the previous one and the commit's writes
(:func:`derive_facts`) and checks the rules with no query at all
(:class:`FactsReader`); a commit whose facts do not follow (it deletes or
replaces messages, touches queued items, truncates) queries the children as
before and reads the facts back (:func:`read_facts`) for the next one. A root
stored without facts is valid too: its next commit queries.

The facts of an open run are only the rule-relevant part of its messages (its
input messages, its first other message and its last one, plus whether a
foreign message lies inside), so they stay small however long the run is.
:meth:`RootFacts.document` and :func:`facts_from_document` are their JSON
form, the same on every backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ThreadStoreInvariantError
from .models import InsertChange, ReplaceChange, ThreadChanges
from .pipeline import RelationshipContext
from .relationships import (
    OPEN_STATUSES,
    MessageRef,
    RelationshipReader,
    RunRef,
    RunRelations,
)

__all__ = [
    "NO_FACTS",
    "Derived",
    "FactsReader",
    "OpenRunFacts",
    "RootFacts",
    "check_rules",
    "derive_facts",
    "facts_after",
    "facts_follow",
    "facts_from_document",
    "facts_text",
    "read_facts",
    "relevant_messages",
    "stored_facts",
]


@dataclass(frozen=True, slots=True)
class OpenRunFacts:
    """What the relationship rules need about one open (running or waiting) run.

    ``messages`` is the rule-relevant part of the run's messages in position
    order: its input messages, its first other message and its last one
    (which breaks a rule exactly when the full list does); ``foreign`` says
    whether another message lies between its first and last.
    """

    run: RunRef
    messages: tuple[MessageRef, ...]
    foreign: bool


@dataclass(frozen=True, slots=True)
class RootFacts:
    """The thread's open runs and its last message, after a commit.

    A commit that inserts messages and inserts or replaces runs (with any
    root or lease change) derives the next facts from these and its writes
    (:meth:`after`), so its relationship check needs no query; any other
    commit reads them back from the children after its check.
    """

    tail: MessageRef | None
    open: tuple[OpenRunFacts, ...]

    def document(self) -> dict[str, Any]:
        """The JSON form (read back by :func:`facts_from_document`)."""
        return {
            "tail": _ref_document(self.tail),
            "open": [
                {
                    "runId": o.run.run_id,
                    "status": o.run.status,
                    "admitted": o.run.admitted,
                    "queueItemId": o.run.queue_item_id,
                    "inputMessageIds": list(o.run.input_message_ids),
                    "messages": [_ref_document(m) for m in o.messages],
                    "foreign": o.foreign,
                }
                for o in self.open
            ],
        }

    def after(
        self, runs: Sequence[tuple[RunRef, bool]], inserted: Sequence[MessageRef]
    ) -> tuple[RootFacts, dict[str, OpenRunFacts]] | None:
        """The facts after a commit that writes ``runs`` and appends ``inserted``.

        ``runs`` are the commit's run writes in order, each ``(run, True)``
        for an insert (a new run: no stored message or queued item names it
        in a valid thread) or ``(run, False)`` for a replacement, which must
        be of an open run (whose messages these facts know); ``inserted`` are
        the new messages in position order, after every stored one. Returns
        the new facts and the facts of every run they know (the open runs
        before and after, the inserted ones), or ``None`` when a replaced run
        was not open.
        """
        known: dict[str, OpenRunFacts] = {o.run.run_id: o for o in self.open}
        for run, is_insert in runs:
            before = known.get(run.run_id)
            if before is not None:
                known[run.run_id] = OpenRunFacts(run, before.messages, before.foreign)
            elif is_insert:
                known[run.run_id] = OpenRunFacts(run, (), False)
            else:
                return None
        if inserted:
            known = {run_id: self._appended(facts, inserted) for run_id, facts in known.items()}
        tail = inserted[-1] if inserted else self.tail
        still_open = tuple(f for f in known.values() if f.run.status in OPEN_STATUSES)
        return RootFacts(tail, still_open), known

    def _appended(self, facts: OpenRunFacts, inserted: Sequence[MessageRef]) -> OpenRunFacts:
        run_id = facts.run.run_id
        messages = list(facts.messages)
        foreign = facts.foreign
        # Whether some other message follows the run's last one (so far).
        gap = bool(messages) and (self.tail is None or self.tail.position != messages[-1].position)
        for ref in inserted:
            if ref.run_id != run_id:
                gap = gap or bool(messages)
                continue
            foreign = foreign or gap
            messages = relevant_messages([*messages, ref])
            gap = False
        return OpenRunFacts(facts.run, tuple(messages), foreign)


NO_FACTS = RootFacts(None, ())
"""The facts of a thread with no message and no open run (a create starts from them)."""


Derived = tuple[RootFacts, dict[str, OpenRunFacts]]
"""The facts after a commit and those of every run they know (:func:`derive_facts`)."""


def relevant_messages(messages: list[MessageRef]) -> list[MessageRef]:
    """Input messages, the first other message and the last one, in position order."""
    other = next((m for m in messages if m.relation != "input"), None)
    keep = {m.position: m for m in messages if m.relation == "input"}
    for m in (other, messages[-1] if messages else None):
        if m is not None:
            keep[m.position] = m
    return [keep[p] for p in sorted(keep)]


def facts_follow(changes: ThreadChanges | None) -> bool:
    """Whether a commit's facts follow from the previous ones and its writes.

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


def derive_facts(previous: RootFacts | None, context: RelationshipContext) -> Derived | None:
    """The facts after a commit, from the previous ones and its writes, when they follow.

    Returns the new facts and the facts of every run they know (see
    :meth:`RootFacts.after`), or ``None``: the previous facts are unknown,
    or the commit's facts do not follow from its writes.
    """
    if previous is None or not facts_follow(context.changes):
        return None
    final = context.writes["runs"].final
    runs: list[tuple[RunRef, bool]] = []
    for change in context.changes.runs or ():
        if isinstance(change, InsertChange | ReplaceChange):
            entry = final.get(change.record.run_id)
            if entry is None:  # pragma: no cover - inserted or replaced runs exist
                return None
            runs.append((RunRef.of(entry.record), isinstance(change, InsertChange)))
    inserted = [MessageRef.of(e.position, e.record) for e in context.writes["messages"].inserts]
    return previous.after(runs, inserted)


class FactsReader:
    """The relationship queries of a commit whose facts follow from its writes.

    The open runs, the tail and the facts of every run the facts know (open
    before or after the commit, or inserted by it) need no query; other runs
    (which such a commit rarely names) are asked of ``reader``.
    """

    def __init__(
        self,
        facts: RootFacts,
        known: Mapping[str, OpenRunFacts],
        reader: RelationshipReader,
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


async def read_facts(reader: RelationshipReader) -> RootFacts:
    """The thread's facts after the commit, through the commit's relationship reader.

    Each open run keeps only its rule-relevant messages (:func:`relevant_messages`),
    so the facts stay small however many messages the run has.
    """
    open_runs = await reader.open_runs()
    tail = await reader.tail()
    facts = await reader.run_facts([r.run_id for r in open_runs]) if open_runs else {}
    return RootFacts(
        tail,
        tuple(
            OpenRunFacts(
                run,
                tuple(relevant_messages(list(facts[run.run_id].messages))),
                facts[run.run_id].foreign_inside,
            )
            for run in open_runs
        ),
    )


async def check_rules(
    previous: RootFacts | None, context: RelationshipContext, reader: RelationshipReader
) -> Derived | None:
    """Check the relationship rules of a commit, from the root's facts where they follow.

    ``previous`` are the facts stored with the held root (``None``: unknown),
    ``reader`` the commit's relationship queries. When the facts follow from
    ``previous`` and the commit's writes (:func:`derive_facts`) they answer the
    rules' queries, and ``reader`` is asked only about runs they do not know;
    otherwise ``reader`` answers. Returns the derived facts, if any (for
    :func:`facts_after`).
    """
    derived = derive_facts(previous, context)
    await context.check.check(FactsReader(*derived, reader) if derived is not None else reader)
    return derived


async def facts_after(
    previous: RootFacts | None,
    context: RelationshipContext,
    reader: RelationshipReader,
    derived: Derived | None,
) -> RootFacts:
    """The facts to store with a commit's root, once :func:`check_rules` passed.

    The derived ones; the previous ones when no message or run changed; or
    else read back through ``reader`` (:func:`read_facts`).
    """
    if derived is not None:
        return derived[0]
    if previous is not None and not context.check.check_tail:
        return previous  # no message or run changed: nor did the facts
    return await read_facts(reader)


# ------------------------------------------------------------------ JSON form


def _ref_document(ref: MessageRef | None) -> dict[str, Any] | None:
    if ref is None:
        return None
    return {
        "messageId": ref.message_id,
        "order": ref.position,
        "runId": ref.run_id,
        "relation": ref.relation,
    }


def _optional_str(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise TypeError
    return value


def _parse_ref(value: Any) -> MessageRef | None:
    if value is None:
        return None
    if type(value) is not dict or set(value) != {"messageId", "order", "runId", "relation"}:
        raise TypeError
    if type(value["messageId"]) is not str or type(value["order"]) is not int:
        raise TypeError
    return MessageRef(
        value["messageId"],
        value["order"],
        _optional_str(value["runId"]),
        _optional_str(value["relation"]),
    )


_OPEN_FIELDS = frozenset(
    {"runId", "status", "admitted", "queueItemId", "inputMessageIds", "messages", "foreign"}
)


def _parse_open(value: Any) -> OpenRunFacts:
    if type(value) is not dict or set(value) != _OPEN_FIELDS:
        raise TypeError
    run_id, status, admitted = value["runId"], value["status"], value["admitted"]
    inputs, messages, foreign = value["inputMessageIds"], value["messages"], value["foreign"]
    if type(run_id) is not str or type(status) is not str or type(admitted) is not bool:
        raise TypeError
    if type(inputs) is not list or any(type(i) is not str for i in inputs):
        raise TypeError
    if type(messages) is not list or type(foreign) is not bool:
        raise TypeError
    refs: list[MessageRef] = []
    for item in messages:
        ref = _parse_ref(item)
        if ref is None:
            raise TypeError
        refs.append(ref)
    run = RunRef(run_id, status, admitted, _optional_str(value["queueItemId"]), tuple(inputs))
    return OpenRunFacts(run, tuple(refs), foreign)


def facts_from_document(value: Any) -> RootFacts:
    """The facts of a :meth:`RootFacts.document` (decoded JSON).

    Raises ``TypeError`` when it is malformed (the backend reports the stored
    root invalid).
    """
    if type(value) is not dict or set(value) != {"tail", "open"}:
        raise TypeError
    if type(value["open"]) is not list:
        raise TypeError
    return RootFacts(_parse_ref(value["tail"]), tuple(_parse_open(o) for o in value["open"]))


def facts_text(facts: RootFacts, revision: int) -> str:
    """The stored text of a root's facts, naming the revision of the root they belong to."""
    return json.dumps({"revision": revision, "facts": facts.document()}, separators=(",", ":"))


def stored_facts(text: str | None, revision: int) -> RootFacts | None:
    """The facts of a root at ``revision`` from their stored text (:func:`facts_text`).

    ``None`` when there are none, or they belong to another revision (a process
    that does not keep them updated the root since). Raises
    :class:`~pai_storage.errors.ThreadStoreInvariantError` when they are malformed.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
        if type(value) is not dict or set(value) != {"revision", "facts"}:
            raise TypeError
        if type(value["revision"]) is not int:
            raise TypeError
        if value["revision"] != revision:
            return None
        return facts_from_document(value["facts"])
    except (TypeError, ValueError, RecursionError):
        raise ThreadStoreInvariantError(
            "invalid stored thread: malformed relationship facts"
        ) from None
