"""Shard-key audit: record the commands the MongoDB stores send, and check their targeting.

Every collection has a documented shard key (``docs/mongodb.md``, "Sharding").
A command on a sharded collection is routed to the shards owning the chunks
its filter selects; a filter without the shard key's leading field is sent to
every shard (scatter-gather). This module checks, from a log of the commands
actually sent, that every command the stores send stays on the chunks of one
scope.

**Recording.** :func:`install` registers a PyMongo
:class:`~pymongo.monitoring.CommandListener` for every client created
afterwards in the process (``pymongo.monitoring.register``); the test harness
calls :func:`install_from_env`, so setting ``PAI_MONGO_COMMAND_LOG=<path>``
makes a test run append one JSON line per command to ``<path>``. A line holds
the command name, the database and collection, the *shape* of the filter,
updates, deletes, pipeline or inserted documents (every value replaced by its
BSON type, so no stored value reaches the log), whether it ran in a
transaction, and ``origin``: the functions of the store modules that sent it,
innermost first (``["kv._put", "kv.put"]``). Commands sent by anything else
(test code inspecting collections, the harness dropping them) have an empty
origin and are not audited: they are not the stores'.
:func:`recording` captures lines in memory too (for tests).

**Auditing.** :func:`audit` (and ``python -m pai_storage_mongo.shardaudit
LOG``) classifies each recorded command on a store collection as

- *targeted*: an equality on the shard key's leading field (for a write of
  one document: on every shard-key field, as a sharded cluster requires);
- *range*: a range with both bounds on the leading field (range sharding
  sends it to the chunks overlapping the range only);
- *administrative*: index and collection maintenance (``createIndexes``,
  ``listIndexes``, ``drop`` ...) and cursor continuations (``getMore``,
  ``killCursors``, routed like the command that opened the cursor);
- *cross-scope*: an operation documented to cover every scope
  (:data:`CROSS_SCOPE`: the ``purge_expired`` sweeps, key-value search
  and namespace listing under the empty namespace prefix, the thread
  store's updated-at index read across every scope by a retention sweep
  without a scope, ``prune_threads(None, ...)``, and the enumeration of
  every session and every snapshot scope by a copy of the runtime stores);
- a *violation*: anything else.

A command sent by a module of this package the audit does not map to a
collection kind is a violation too (unless it is maintenance). The command
exits with status 1 when there is a violation, printing each distinct one
(command, collection kind, origin, filter shape) with its count, and when a
kind of collection saw no command at all (a full run touches every one;
``--partial`` for the log of a partial run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pymongo import monitoring

__all__ = [
    "ADMIN_COMMANDS",
    "CROSS_SCOPE",
    "ENV_VAR",
    "SHARD_KEYS",
    "CommandRecorder",
    "Finding",
    "audit",
    "collection_kind",
    "install",
    "install_from_env",
    "main",
    "read_log",
    "recording",
    "shape",
]

ENV_VAR: Final = "PAI_MONGO_COMMAND_LOG"
"""The environment variable naming the command log (JSON lines, appended)."""

SHARD_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "threads": ("scopeKey", "threadId"),
    "messages": ("scopeKey", "threadId"),
    "queuedItems": ("scopeKey", "threadId"),
    "runs": ("scopeKey", "threadId"),
    "kv": ("ns", "key"),
    "state": ("_id.user",),
    "snapshots": ("_id.scope",),
    "snapshotFiles": ("_id",),
    "snapshotChunks": ("files_id",),
    "guard": ("_id",),
}
"""The documented shard key of each collection kind (all range-sharded)."""

ADMIN_COMMANDS: Final = frozenset(
    {
        "createIndexes",
        "listIndexes",
        "dropIndexes",
        "drop",
        "create",
        "collMod",
        "collStats",
        "validate",
        "getMore",
        "killCursors",
    }
)
"""Commands that maintain a collection or continue a cursor: never audited."""

CROSS_SCOPE: Final[Mapping[str, str]] = {
    "kv._purge_expired": "deletes expired items of every namespace",
    "state._purge_expired": "deletes expired sessions of every user",
    "snapshots._purge_expired": "deletes expired snapshots of every scope",
    "guard._purge_expired": "deletes expired locks of every resource",
    "kv._search": "search under the empty namespace prefix (the whole store)",
    "kv._list_namespaces": "namespace listing under the empty prefix (the whole store)",
    "lifecycle.heads_of_every_scope": "the retention sweep's updated-at index of every scope",
    "state._list_sessions": "enumerates the sessions of every user (a copy of the store)",
    "snapshots._list_scopes": "enumerates the scopes holding snapshots (a copy of the store)",
    "snapshot_files.sweep": "removes the GridFS files no snapshot names, of every scope",
    "watch._follow": "the store's one change stream on the roots (every shard reports its "
    "changes; the pipeline keeps the watched scopes and threads)",
}
"""Operations documented to span every scope: allowed to reach every shard.

The key-value entries apply only to the whole-store forms: a search or
namespace listing under a non-empty prefix is a bounded range on ``ns`` and
is judged like any other query (a missing bound is a violation).
"""

_STORE_MODULES: Final = {
    "store": "threads",
    "commit": "threads",
    "hold": "threads",
    "relations": "threads",
    "reads": "threads",
    "lifecycle": "threads",
    "watch": "threads",
    "kv": "kv",
    "state": "state",
    "snapshots": "snapshots",
    "snapshot_files": "snapshot_files",
    "guard": "guard",
    "client": "",
}
_NOT_STORES: Final = frozenset({"harness", "shardaudit"})
_THREAD_SUFFIXES: Final = (
    ("_pending_messages", "queuedItems"),
    ("_messages", "messages"),
    ("_runs", "runs"),
)
_PACKAGE: Final = __name__.rpartition(".")[0]
_MAX_ITEMS: Final = 4
_OPERATORS_KEEP: Final = frozenset({"$$NOW", "$$ROOT", "$$REMOVE"})

Doc = dict[str, Any]


# ---------------------------------------------------------------------- recording


def shape(value: Any, depth: int = 0) -> Any:
    """``value`` with every scalar replaced by its BSON type name (``"<str>"``).

    Keys and operators stay (they are the query's structure); long arrays keep
    their first items and a count. Field paths and system variables inside
    pipelines (``"$version"``, ``"$$NOW"``) are kept too: they are code, not data.
    """
    if depth > 12:
        return "<...>"
    if isinstance(value, Mapping):
        return {str(k): shape(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [shape(v, depth + 1) for v in value[:_MAX_ITEMS]]
        if len(value) > _MAX_ITEMS:
            items.append(f"<+{len(value) - _MAX_ITEMS} more>")
        return items
    if isinstance(value, str):
        if value in _OPERATORS_KEEP or (value.startswith("$") and not value.startswith("$$")):
            return value if len(value) <= 200 else "<str>"
        return "<str>"
    if isinstance(value, bool):
        return "<bool>"
    if value is None:
        return "<null>"
    if isinstance(value, datetime):
        return "<date>"
    return f"<{type(value).__name__}>"


def _origin() -> list[str]:
    """The store-module functions on the call stack, innermost first."""
    frames: list[str] = []
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(_PACKAGE + "."):
            short = module[len(_PACKAGE) + 1 :]
            if short not in _NOT_STORES:
                name = f"{short}.{frame.f_code.co_name}"
                if not frames or frames[-1] != name:
                    frames.append(name)
                if len(frames) >= 6:
                    break
        frame = frame.f_back  # type: ignore[assignment]
    return frames


def collection_kind(collection: str, origin: Sequence[str]) -> str | None:
    """The kind of a store collection (a :data:`SHARD_KEYS` key), from who sent the command.

    The innermost store module decides (``kv`` -> ``kv``; the thread store's
    collections by their suffix); shared plumbing (``client``) and modules
    this audit does not know defer to the next frame. ``None``: no known store
    module sent it (the auditor reports such a command unless it is
    maintenance).
    """
    for frame in origin:
        module = frame.partition(".")[0]
        kind = _STORE_MODULES.get(module)
        if kind == "snapshot_files":  # the GridFS bucket of large snapshots
            if collection.endswith(".files"):
                return "snapshotFiles"
            return "snapshotChunks" if collection.endswith(".chunks") else "snapshots"
        if kind == "threads":
            for suffix, child in _THREAD_SUFFIXES:
                if collection.endswith(suffix):
                    return child
            return "threads"
        if kind:
            return kind
    return None


_COMMAND_PARTS: Final = {
    "find": ("filter",),
    "count": ("query",),
    "distinct": ("query",),
    "aggregate": ("pipeline",),
    "findAndModify": ("query", "upsert", "remove"),
    "update": ("updates",),
    "delete": ("deletes",),
    "insert": ("documents",),
    "explain": ("explain",),
}


def _record(event: monitoring.CommandStartedEvent) -> Doc | None:
    command = event.command
    name = event.command_name
    target = command.get(name)
    if name == "getMore":
        target = command.get("collection")
    origin = _origin()
    line: Doc = {
        "command": name,
        "db": event.database_name,
        "collection": target if isinstance(target, str) else None,
        "origin": origin,
        "txn": "txnNumber" in command and command.get("autocommit") is False,
    }
    if line["collection"] is not None:
        line["kind"] = collection_kind(line["collection"], origin)
    for part in _COMMAND_PARTS.get(name, ()):
        if part in command:
            value = command[part]
            # The statement options (multi, upsert, limit) are kept as they are:
            # they decide which routing rule applies, and they are not data.
            if part == "updates":
                line[part] = [
                    {
                        "q": shape(u.get("q", {})),
                        "u": shape(u.get("u", {})),
                        "upsert": bool(u.get("upsert", False)),
                        "multi": bool(u.get("multi", False)),
                    }
                    for u in value
                ]
            elif part == "deletes":
                line[part] = [
                    {"q": shape(d.get("q", {})), "limit": int(d.get("limit", 0))} for d in value
                ]
            elif part in ("upsert", "remove"):
                line[part] = bool(value)
            else:
                line[part] = shape(value)
    return line


class CommandRecorder(monitoring.CommandListener):
    """Appends one JSON line per command started to a file and to in-memory sinks."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.sinks: list[list[Doc]] = []
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.path is None and not self.sinks:
            return
        try:
            line = _record(event)
        except Exception:  # never break a command because of the log
            return
        if line is None:
            return
        with self._lock:
            for sink in self.sinks:
                sink.append(line)
            if self.path is not None:
                data = (json.dumps(line) + "\n").encode()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, data)  # one write per line: whole lines across processes
                finally:
                    os.close(fd)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


_RECORDER: CommandRecorder | None = None
_INSTALL_LOCK = threading.Lock()


def install(path: str | None = None) -> CommandRecorder:
    """Register the process's one recorder (idempotent) for every client made after this.

    ``path``: the JSON-lines log to append to (kept if already set).
    """
    global _RECORDER
    with _INSTALL_LOCK:
        if _RECORDER is None:
            _RECORDER = CommandRecorder(path)
            monitoring.register(_RECORDER)
        elif path is not None and _RECORDER.path is None:
            _RECORDER.path = path
        return _RECORDER


def install_from_env() -> CommandRecorder | None:
    """:func:`install` with the log named by ``PAI_MONGO_COMMAND_LOG``, if set."""
    path = os.environ.get(ENV_VAR)
    return install(os.path.abspath(path)) if path else None


@contextlib.contextmanager
def recording() -> Iterator[list[Doc]]:
    """Collect the lines of the commands sent inside the block (by clients made after
    the first :func:`install`; make the stores inside the block)."""
    recorder = install()
    sink: list[Doc] = []
    with recorder._lock:
        recorder.sinks.append(sink)
    try:
        yield sink
    finally:
        with recorder._lock:
            recorder.sinks.remove(sink)


def read_log(path: str) -> list[Doc]:
    """The lines of a command log."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------- auditing


@dataclass(frozen=True)
class Finding:
    """One audited command: its verdict and why."""

    verdict: str  # targeted | range | administrative | cross-scope | violation
    command: str
    kind: str
    collection: str
    origin: tuple[str, ...]
    reason: str
    detail: str

    def describe(self) -> str:
        where = " < ".join(self.origin) or "?"
        return f"{self.command} on {self.kind} ({self.collection}) from {where}: {self.reason}"


def _is_literal(value: Any) -> bool:
    """An equality value: not an operator document."""
    return not (isinstance(value, Mapping) and any(str(k).startswith("$") for k in value))


def _field_conditions(key: str, value: Any, path: str) -> list[Any]:
    """The conditions on ``path`` that the clause ``{key: value}`` states.

    An equality on a parent document holding the path (``{_id: {user: ...}}``
    for ``_id.user``) is an equality on the path, as the router sees it.
    """
    if key == path:
        return [value]
    if path.startswith(key + ".") and isinstance(value, Mapping) and _is_literal(value):
        head, _, rest = path[len(key) + 1 :].partition(".")
        if head in value:
            return _field_conditions(head, value[head], head + ("." + rest if rest else ""))
    return []


def _route(query: Any, path: str) -> int:
    """How a query can be routed on ``path``: 2 equality, 1 bounded range, 0 neither.

    Clauses combine as the router combines them: a conjunction (top level,
    ``$and``) takes its best clause, and a range's bounds may come from
    different clauses; a disjunction (``$or``) is only as good as its worst
    branch.
    """
    if not isinstance(query, Mapping):
        return 0
    best = low = high = 0
    for key, value in query.items():
        if key == "$and" and isinstance(value, list):
            for clause in value:
                best = max(best, _route(clause, path))
        elif key == "$or" and isinstance(value, list) and value:
            best = max(best, min(_route(branch, path) for branch in value))
        else:
            for cond in _field_conditions(str(key), value, path):
                if _is_literal(cond):
                    if not isinstance(cond, list):  # an array cannot be a shard key value
                        best = 2
                elif isinstance(cond, Mapping):
                    if "$eq" in cond and not isinstance(cond["$eq"], list):
                        best = 2
                    low |= bool({"$gt", "$gte"} & set(cond))
                    high |= bool({"$lt", "$lte"} & set(cond))
    if low and high:
        best = max(best, 1)
    return best


def _judge_filter(query: Any, key: tuple[str, ...], single: bool) -> tuple[str, str]:
    if single:
        missing = [field for field in key if _route(query, field) < 2]
        if not missing:
            return "targeted", "equality on the whole shard key"
        return "violation", (
            "a single-document write without an equality on shard-key field(s) "
            + ", ".join(missing)
        )
    route = _route(query, key[0])
    if route == 2:
        return "targeted", f"equality on {key[0]}"
    if route == 1:
        return "range", f"bounded range on {key[0]}"
    return "violation", f"no equality (or bounded range) on the shard key's leading field {key[0]}"


def _has_field(doc: Any, path: str) -> bool:
    head, _, rest = path.partition(".")
    if not isinstance(doc, Mapping) or head not in doc:
        return False
    value = doc[head]
    return _has_field(value, rest) if rest else not isinstance(value, list)


def _judge(line: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(verdict, reason, detail) for each statement of a recorded command."""
    name = line["command"]
    key = SHARD_KEYS[line["kind"]]
    if name in ADMIN_COMMANDS:
        return [("administrative", "collection maintenance or cursor continuation", "")]
    if name == "insert":
        out = []
        for doc in line.get("documents") or [{}]:
            if isinstance(doc, str):  # "<+N more>"
                continue
            missing = [field for field in key if not _has_field(doc, field)]
            if missing:
                out.append(("violation", "inserted document lacks " + ", ".join(missing), ""))
            else:
                out.append(("targeted", "document carries the shard key", ""))
        return out
    statements: list[tuple[Any, bool]] = []
    if name == "find":
        statements.append((line.get("filter", {}), False))
    elif name in ("count", "distinct"):
        statements.append((line.get("query", {}), False))
    elif name == "aggregate":
        pipeline = line.get("pipeline") or []
        first = pipeline[0] if pipeline and isinstance(pipeline[0], Mapping) else {}
        statements.append((first.get("$match", {}), False))
    elif name == "findAndModify":
        statements.append((line.get("query", {}), True))
    elif name == "update":
        for u in line.get("updates") or []:
            if isinstance(u, Mapping):
                statements.append((u.get("q", {}), not u.get("multi")))
    elif name == "delete":
        for d in line.get("deletes") or []:
            if isinstance(d, Mapping):
                statements.append((d.get("q", {}), d.get("limit") == 1))
    else:
        return [("violation", f"unexpected command {name} on a store collection", "")]
    out = []
    for query, single in statements:
        verdict, reason = _judge_filter(query, key, single)
        out.append((verdict, reason, json.dumps(query)))
    return out


def audit(lines: Iterable[Mapping[str, Any]]) -> list[Finding]:
    """Judge every recorded command a store sent on one of its collections.

    Lines without an origin or collection (test code, the harness, commands
    like ``hello`` or ``commitTransaction``) are skipped.
    """
    findings: list[Finding] = []
    for line in lines:
        kind = line.get("kind")
        collection = line.get("collection")
        origin = tuple(line.get("origin") or ())
        if not collection or not origin:
            continue
        if not kind:
            name = line["command"]
            allowed = next((f for f in origin if f in CROSS_SCOPE), None)
            if name in ADMIN_COMMANDS:
                verdict, reason = "administrative", "collection maintenance or cursor continuation"
            elif allowed is not None:
                verdict, reason = "cross-scope", CROSS_SCOPE[allowed]
            else:
                verdict = "violation"
                reason = "sent by a module the audit does not know (add it to shardaudit)"
            findings.append(Finding(verdict, name, "?", collection, origin, reason, ""))
            continue
        for verdict, reason, detail in _judge(line):
            if verdict == "violation":
                allowed = next((f for f in origin if f in CROSS_SCOPE), None)
                if allowed is not None:
                    verdict, reason = "cross-scope", CROSS_SCOPE[allowed]
            findings.append(
                Finding(verdict, line["command"], kind, collection, origin, reason, detail)
            )
    return findings


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pai_storage_mongo.shardaudit LOG``: 1 when a command would scatter."""
    parser = argparse.ArgumentParser(
        prog="python -m pai_storage_mongo.shardaudit",
        description="Check a MongoDB command log (PAI_MONGO_COMMAND_LOG) against the shard keys.",
    )
    parser.add_argument("log", help="the JSON-lines command log")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every verdict")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="do not require a command on every kind of collection (a log of a partial run)",
    )
    args = parser.parse_args(argv)
    lines = read_log(args.log)
    findings = audit(lines)
    verdicts = Counter(f.verdict for f in findings)
    print(
        f"{len(lines)} commands recorded, {len(findings)} store statements audited: "
        + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
    )
    if not findings:
        print("nothing audited: was the log written by a run of the stores?")
        return 1
    if args.verbose:
        seen = Counter((f.verdict, f.describe()) for f in findings)
        for (verdict, text), n in sorted(seen.items()):
            print(f"  {verdict:14} x{n:<6} {text}")
    bad = Counter((f.describe(), f.detail) for f in findings if f.verdict == "violation")
    for (text, detail), n in sorted(bad.items()):
        print(f"VIOLATION x{n}: {text}\n    filter: {detail}")
    unseen = sorted(set(SHARD_KEYS) - {f.kind for f in findings})
    if unseen and not args.partial:
        # A store renamed or moved would otherwise pass unaudited.
        print("NOT AUDITED: no command on " + ", ".join(unseen) + " (use --partial for a part)")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
