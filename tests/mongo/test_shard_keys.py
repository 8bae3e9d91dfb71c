"""Every command the MongoDB stores send can be routed to one scope's shards.

The shard keys are documented in ``docs/mongodb.md`` ("Sharding"). The auditor
(:mod:`pai_storage_mongo.shardaudit`) is checked here on hand-made log lines in
the recorder's format, then on the commands a workload through every store
actually sends. CI also records the whole MongoDB suite
(``PAI_MONGO_COMMAND_LOG``) and audits that log.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pai_storage_mongo import shardaudit
from pai_storage_mongo.harness import MongoHarness

from pai_storage import CommittedResult, ManualClock
from pai_storage import builders as b

SECRET = "do-not-log-this-value"


def line(command: str, kind: str, origin: list[str] | None = None, **parts: Any) -> dict[str, Any]:
    """A log line as the recorder writes it (values already shapes)."""
    return {
        "command": command,
        "db": "pai",
        "collection": f"pai_{kind}",
        "kind": kind,
        "origin": origin if origin is not None else [f"{kind}._op"],
        "txn": False,
        **parts,
    }


def verdicts(*lines: dict[str, Any]) -> list[str]:
    return [f.verdict for f in shardaudit.audit(lines)]


# ---------------------------------------------------------------------- the auditor


def test_equality_on_the_leading_field_is_targeted() -> None:
    assert (
        verdicts(
            line("find", "threads", filter={"scopeKey": "<str>", "listVisibility": "<str>"}),
            line("find", "messages", filter={"scopeKey": {"$eq": "<str>"}, "threadId": "<str>"}),
            line("find", "kv", filter={"$and": [{"ns": "<str>", "key": "<str>"}, {"$expr": {}}]}),
            line("find", "guard", filter={"_id": "<str>"}),
        )
        == ["targeted"] * 4
    )


def test_a_query_without_the_leading_field_is_a_violation() -> None:
    (finding,) = shardaudit.audit(
        [line("find", "threads", ["store._list"], filter={"threadId": "<str>"})]
    )
    assert finding.verdict == "violation"
    assert "scopeKey" in finding.reason
    assert "store._list" in finding.describe()
    assert (
        verdicts(
            line("find", "kv", filter={"key": "<str>"}),
            line("find", "runs", filter={"scopeKey": {"$in": ["<str>", "<str>"]}}),
            line("find", "kv", filter={"ns": {"$gte": "<str>"}}),  # one bound only
            line("find", "threads", filter={"$or": [{"scopeKey": "<str>"}, {"threadId": "<str>"}]}),
        )
        == ["violation"] * 4
    )


def test_a_bounded_range_on_the_leading_field_is_routed_by_range() -> None:
    assert verdicts(
        line("find", "kv", filter={"ns": {"$gte": "<str>", "$lt": "<str>"}}),
        line(
            "find",
            "kv",
            filter={
                "$and": [
                    {
                        "$or": [
                            {"ns": "<str>", "key": {"$gt": "<str>"}},
                            {"ns": {"$gt": "<str>", "$lt": "<str>"}},
                        ]
                    },
                    {"$expr": {}},
                ]
            },
        ),
    ) == ["range", "range"]


def test_single_document_writes_need_the_whole_shard_key() -> None:
    one = {"q": {"scopeKey": "<str>"}, "u": {}, "multi": False}
    whole = {"q": {"scopeKey": "<str>", "threadId": "<str>"}, "u": {}}
    many = {"q": {"scopeKey": "<str>"}, "u": {}, "multi": True}
    assert verdicts(
        line("update", "messages", updates=[one, whole, many]),
        line("findAndModify", "kv", query={"ns": "<str>"}),
        line("findAndModify", "kv", query={"ns": "<str>", "key": "<str>"}),
        line("delete", "runs", deletes=[{"q": {"scopeKey": "<str>"}, "limit": 1}]),
        line("delete", "runs", deletes=[{"q": {"scopeKey": "<str>"}, "limit": 0}]),
    ) == ["violation", "targeted", "targeted", "violation", "targeted", "violation", "targeted"]


def test_an_equality_on_a_compound_id_targets_its_fields() -> None:
    session_id = {"_id": {"user": "<str>", "session": "<str>"}}
    id_range = {"$gt": {"user": "<str>", "session": "<MinKey>"}, "$lt": {"user": "<str>"}}
    assert verdicts(
        line("findAndModify", "state", query=session_id),
        line("find", "snapshots", filter={"_id": {"scope": "<str>", "snapshotId": "<str>"}}),
        line("find", "snapshots", filter={"_id.scope": "<str>", "createdAt": {"$lt": "<date>"}}),
        # A range on _id says nothing the router can use about _id.user ...
        line("find", "state", filter={"_id": id_range}),
        # ... an equality on _id.user beside it does.
        line("find", "state", filter={"_id": id_range, "_id.user": "<str>"}),
        # An operator document is not an equality on its fields.
        line("find", "state", filter={"_id": {"$eq": {"user": "<str>"}}}),
    ) == ["targeted", "targeted", "targeted", "violation", "targeted", "violation"]


def test_inserted_documents_must_carry_the_shard_key() -> None:
    assert verdicts(
        line("insert", "messages", documents=[{"scopeKey": "<str>", "threadId": "<str>"}]),
        line("insert", "messages", documents=[{"scopeKey": "<str>"}]),
        line("insert", "state", documents=[{"_id": {"user": "<str>", "session": "<str>"}}]),
        line("insert", "threads", documents=[{"scopeKey": ["<str>"], "threadId": "<str>"}]),
    ) == ["targeted", "violation", "targeted", "violation"]


def test_aggregations_are_judged_by_their_first_match() -> None:
    assert verdicts(
        line("aggregate", "threads", pipeline=[{"$match": {"scopeKey": "<str>"}}, {"$set": {}}]),
        line("aggregate", "threads", pipeline=[{"$set": {}}, {"$match": {"scopeKey": "<str>"}}]),
    ) == ["targeted", "violation"]


def test_maintenance_cross_scope_and_foreign_commands() -> None:
    findings = shardaudit.audit(
        [
            line("createIndexes", "kv", ["client._create"]),
            line("getMore", "threads"),
            line("delete", "guard", ["guard._purge_expired"], deletes=[{"q": {}, "limit": 0}]),
            line("find", "kv", ["kv._search", "kv.search"], filter={"ns": {"$gt": "<str>"}}),
            # Test code and the harness: no store origin, not audited.
            line("find", "kv", [], filter={}),
            {"command": "commitTransaction", "db": "admin", "collection": None, "origin": []},
        ]
    )
    assert [f.verdict for f in findings] == [
        "administrative",
        "administrative",
        "cross-scope",
        "cross-scope",
    ]
    # A documented cross-scope operation is only excused for what it is.
    assert verdicts(line("find", "kv", ["kv._get_many"], filter={"key": "<str>"})) == ["violation"]


def test_unknown_commands_on_store_collections_are_violations() -> None:
    assert verdicts(line("mapReduce", "kv")) == ["violation"]


def test_a_module_the_audit_does_not_know_is_reported() -> None:
    unknown = {**line("find", "kv", ["threads2._read"], filter={}), "kind": None}
    (finding,) = shardaudit.audit([unknown])
    assert finding.verdict == "violation"
    assert "does not know" in finding.reason
    maintenance = {**line("createIndexes", "kv", ["client._create"]), "kind": None}
    assert verdicts(maintenance) == ["administrative"]


def test_shapes_hide_every_value() -> None:
    shaped = shardaudit.shape(
        {
            "ns": SECRET,
            "n": 3,
            "when": None,
            "ok": True,
            "pipe": [{"$set": {"v": {"$literal": SECRET}, "w": "$version", "t": "$$NOW"}}],
            "list": list(range(10)),
        }
    )
    text = json.dumps(shaped)
    assert SECRET not in text
    assert shaped["ns"] == "<str>"
    assert shaped["n"] == "<int>"
    assert shaped["pipe"][0]["$set"]["w"] == "$version"
    assert shaped["pipe"][0]["$set"]["t"] == "$$NOW"
    assert shaped["list"][-1] == "<+6 more>"


def test_collection_kinds_follow_the_sending_module() -> None:
    kind = shardaudit.collection_kind
    assert kind("pai_threads", ["store._read"]) == "threads"
    assert kind("pai_threads_messages", ["store._read"]) == "messages"
    assert kind("pai_threads_pending_messages", ["store._read"]) == "queuedItems"
    assert kind("pai_threads_runs", ["store._commit"]) == "runs"
    assert kind("x_kv", ["client._create", "kv._initialize"]) == "kv"
    assert kind("pai_locks", ["guard._renew"]) == "guard"
    assert kind("pai_kv", []) is None


def test_the_command_line_fails_on_a_violation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(line("find", "kv", filter={"ns": "<str>"})) + "\n")
    assert shardaudit.main([str(good), "--partial"]) == 0
    # A full run's log must show every kind of collection: a store whose commands
    # went unclassified would otherwise pass unaudited.
    assert shardaudit.main([str(good)]) == 1
    assert "NOT AUDITED: no command on guard" in capsys.readouterr().out
    every = tmp_path / "every.jsonl"
    every.write_text(
        "".join(
            json.dumps(line("find", kind, filter={key[0]: "<str>"})) + "\n"
            for kind, key in shardaudit.SHARD_KEYS.items()
        )
    )
    assert shardaudit.main([str(every)]) == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "\n".join(
            json.dumps(x)
            for x in (
                line("find", "kv", filter={"ns": "<str>"}),
                line("find", "threads", ["store._x"], filter={"threadId": "<str>"}),
            )
        )
        + "\n"
    )
    assert shardaudit.main([str(bad), "--partial"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION x1: find on threads" in out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert shardaudit.main([str(empty)]) == 1  # nothing audited is not a pass


# ---------------------------------------------------------------------- live


async def _thread_workload(harness: MongoHarness, clock: ManualClock) -> None:
    async with harness.store(clock) as store:
        created = await store.commit_thread(
            b.create(
                "scope",
                "t1",
                {
                    "messages": [b.insert(b.message(f"m{i}", SECRET)) for i in range(3)],
                    "runs": [b.insert(b.run("r1", "queued", queue_item_id="q1"))],
                    "queuedItems": [b.insert(b.queued_item("q1", "r1", SECRET))],
                },
            )
        )
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        clock.advance(ms=5)
        updated = await store.commit_thread(
            b.update_at(
                "scope",
                "t1",
                created.thread.version,
                {
                    "messages": [
                        b.replace(b.message("m0", "edited")),
                        b.delete_record("m1"),
                        b.insert(b.message("m3")),
                    ],
                    "runs": [b.replace(b.run("r1", "running", queue_item_id="q1"))],
                    "queuedItems": [b.delete_record("q1")],
                },
                root=b.root(),
            )
        )
        assert isinstance(updated, CommittedResult)
        assert updated.thread is not None
        page = {"page": {"limit": 2}}
        read = await store.read_thread(
            b.read(
                "scope",
                "t1",
                messages={"type": "page", "view": "transcript", **page},
                runs={"type": "page", "statuses": ["running"], **page},
                queuedItems={"type": "page", "runId": "r1", **page},
            )
        )
        assert read is not None
        await store.read_thread(
            b.read("scope", "t1", messages={"type": "ids", "messageIds": ["m0"]})
        )
        for request in ({}, {"includeHidden": True}, {"agent": "assistant"}):
            listed = await store.list_threads({"scopeKey": "scope", "limit": 1, **request})
            assert listed.items
        await store.commit_thread(b.create("scope", "t2"))
        listed = await store.list_threads({"scopeKey": "scope", "limit": 1})
        assert listed.next_page_token is not None
        await store.list_threads(
            {"scopeKey": "scope", "limit": 1, "pageToken": listed.next_page_token}
        )
        # The lifecycle: a fork, an export and import, sweeps of one scope and of all.
        forked = await store.fork_thread("scope", "t1", "t1-fork", through_message_id="m0")
        assert isinstance(forked, CommittedResult)
        lines = [line async for line in store.export_threads("scope", thread_ids=["t1-fork"])]
        later = clock.advance(timedelta(hours=1))
        assert len(await store.prune_threads("scope", updated_before=later, limit=10)) == 2
        report = await store.import_threads(lines)
        assert report is not None
        assert len(await store.prune_threads(None, updated_before=later, limit=10)) == 1
        deleted = await store.commit_thread(b.delete("scope", "t1", updated.thread.version))
        assert isinstance(deleted, CommittedResult)
        await store.commit_thread(b.create("scope", "t3"))
        assert await store.erase_scope("scope") == 1


async def _runtime_workload(harness: MongoHarness) -> None:
    async with harness.component("kv") as kv:
        first = await kv.put(("a", "b"), "k1", {"secret": SECRET})
        await kv.put(("a", "b"), "k2", 2, ttl=timedelta(minutes=5))
        await kv.put(("a", "c"), "k1", 3)
        await kv.get(("a", "b"), "k1")
        await kv.get_many(("a", "b"), ["k1", "k2"])
        await kv.put_if_version(("a", "b"), "k1", 4, first.version)
        await kv.put_if_version(("a", "b"), "new", 5, None)
        page = await kv.search(("a",), limit=1)
        assert page.next_page_token is not None
        await kv.search(("a",), limit=1, page_token=page.next_page_token)
        await kv.search(("a", "b"), key_prefix="k")
        await kv.search((), limit=10)  # the whole store: documented cross-scope
        await kv.list_keys(("a", "b"), prefix="k")
        await kv.list_namespaces(("a",))
        await kv.list_namespaces((), max_depth=1)
        await kv.delete(("a", "b"), "k2")
        await kv.purge_expired()
    async with harness.component("state") as state:
        await state.save("u", "s1", "v", {"secret": SECRET})
        await state.save_if_version("u", "s1", "v", 2, 1)
        await state.get("u", "s1", "v")
        await state.save_list("u", "s1", "log", [1, 2, 3])
        await state.append_list("u", "s1", "log", [4])
        await state.append_list("u", "s1", "log", list(range(40)))
        await state.get_list("u", "s1", "log")
        await state.save("u", "s2", "v", 1)
        page = await state.list_session_ids("u", limit=1)
        assert page.next_page_token is not None
        await state.list_session_ids("u", limit=1, page_token=page.next_page_token)
        assert await state.exists("u", "s1")
        await state.save(None, "s1", "v", 1)
        # A copy of the store enumerates every user: documented cross-scope.
        assert await state._list_sessions(None, 10) == [(None, "s1"), ("u", "s1"), ("u", "s2")]
        assert await state._session_keys("u", "s1") == (["v"], ["log"])
        await state.delete_state("u", "s1", "v")
        await state.delete("u", "s2")
        await state.purge_expired()
    async with harness.component("snapshots") as snapshots:
        await snapshots.put("scope", "one", SECRET.encode(), metadata={"secret": SECRET})
        await snapshots.put("scope", "two", b"data")
        await snapshots.get("scope", "one")
        await snapshots.latest("scope")
        assert await snapshots._list_scopes(None, 10) == ["scope"]  # cross-scope
        page = await snapshots.list("scope", limit=1)
        assert page.next_page_token is not None
        await snapshots.list("scope", limit=1, page_token=page.next_page_token)
        await snapshots.delete("scope", "one")
        await snapshots.put("scope", "large", b"L" * (15 * 1024 * 1024 + 1))  # GridFS
        assert (await snapshots.get("scope", "large")) is not None
        await snapshots.delete("scope", "large")
        await snapshots.purge_expired()
    async with harness.component("guard") as guard:
        lock = await guard.try_acquire("resource", owner="worker")
        assert lock is not None
        assert await guard.try_acquire("resource", owner="other") is None
        await guard.inspect("resource")
        assert await lock.renew()
        assert await lock.release()
        async with guard.hold("resource", owner="worker"):
            pass
        await guard.purge_expired()


@pytest.mark.asyncio
async def test_every_store_command_is_routed_to_one_scope(
    mongo_harness: MongoHarness, clock: ManualClock
) -> None:
    with shardaudit.recording() as lines:
        await _thread_workload(mongo_harness, clock)
        await _runtime_workload(mongo_harness)
    findings = shardaudit.audit(lines)
    violations = [f"{f.describe()} {f.detail}" for f in findings if f.verdict == "violation"]
    assert violations == []
    kinds = {f.kind for f in findings}
    assert kinds == {*shardaudit.SHARD_KEYS, "?"}
    # Only maintenance (index creation from the shared client's task) has no kind.
    assert {f.verdict for f in findings if f.kind == "?"} == {"administrative"}
    commands = {(f.kind, f.command) for f in findings if f.verdict == "targeted"}
    for expected in [
        ("threads", "find"),
        ("threads", "findAndModify"),
        ("messages", "insert"),
        ("kv", "findAndModify"),
        ("kv", "find"),
        ("state", "findAndModify"),
        ("state", "update"),
        ("state", "find"),
        ("snapshots", "findAndModify"),
        ("snapshots", "find"),
        ("guard", "findAndModify"),
        ("guard", "update"),
    ]:
        assert expected in commands, expected
    excused = {f.origin[0] for f in findings if f.verdict == "cross-scope"}
    assert excused <= set(shardaudit.CROSS_SCOPE)
    assert "kv._search" in excused
    assert {"kv._purge_expired", "guard._purge_expired"} <= excused
    assert "lifecycle.heads_of_every_scope" in excused
    assert {"state._list_sessions", "snapshots._list_scopes"} <= excused
    assert {f.verdict for f in findings} >= {"targeted", "range", "administrative"}
    assert SECRET not in json.dumps(lines)
    # Statement options stay as sent: they choose the routing rule.
    updates = [u for x in lines if x["command"] == "update" for u in x["updates"]]
    assert updates
    assert all(isinstance(u["multi"], bool) and isinstance(u["upsert"], bool) for u in updates)
    limits = {d["limit"] for x in lines if x["command"] == "delete" for d in x["deletes"]}
    assert limits == {0, 1}
