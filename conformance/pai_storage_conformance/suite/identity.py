"""Identity and scoping (docs/data-model.md#identifiers): opaque ids, versions, isolation."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from pai_storage import CommittedResult, ConflictResult, ThreadRecord, ThreadStore, ThreadVersion
from pai_storage import builders as b
from pai_storage.errors import ThreadStoreInvariantError

from ._support import new_scope

__all__ = ["TestIdentityAndScoping"]

pytestmark = pytest.mark.asyncio

OPAQUE_IDS = [
    pytest.param("x", id="one-char"),
    pytest.param("k" * 1024, id="1024-chars"),
    pytest.param("a/b.c$d e", id="slash-dot-dollar-space"),
    pytest.param("$set", id="dollar-operator"),
    pytest.param("nul\x00inside", id="nul"),
    pytest.param("\x00", id="only-nul"),
    pytest.param("thread 🧵🚀", id="emoji"),
    pytest.param(".", id="dot"),
    pytest.param("/", id="slash"),
    pytest.param(" ", id="space"),
    pytest.param("%2F..%00", id="escape-looking"),
]

BAD_LENGTH_IDS = [pytest.param("", id="empty"), pytest.param("k" * 1025, id="1025-chars")]


async def _create(store: ThreadStore, scope: str, thread: str, **root: Any) -> ThreadRecord:
    result = await store.commit_thread(b.create(scope, thread, **root))
    assert isinstance(result, CommittedResult)
    assert result.thread is not None
    return result.thread


async def _update(
    store: ThreadStore, scope: str, thread: str, version: ThreadVersion, **root: Any
) -> CommittedResult | ConflictResult:
    return await store.commit_thread(b.update_at(scope, thread, version, root=b.root(**root)))


class TestIdentityAndScoping:
    """Scope keys and thread ids are opaque; versions; isolation by (scope, thread)."""

    # Class-level too, so the mark travels with the class when it is imported
    # or subclassed elsewhere (e.g. the collected module, third-party suites).
    pytestmark = pytest.mark.asyncio

    # ------------------------------------------------------------ opaque ids

    @pytest.mark.parametrize("thread_id", OPAQUE_IDS)
    async def test_opaque_thread_id_round_trips(self, store: ThreadStore, thread_id: str) -> None:
        scope = new_scope()
        created = await _create(store, scope, thread_id, title="t")
        assert created.thread_id == thread_id
        read = await store.read_thread(b.read(scope, thread_id))
        assert read.thread is not None
        assert read.thread.thread_id == thread_id
        assert read.thread.title == "t"
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert [t.thread_id for t in listed.items] == [thread_id]

    @pytest.mark.parametrize("scope_suffix", OPAQUE_IDS)
    async def test_opaque_scope_key_round_trips(
        self, store: ThreadStore, scope_suffix: str
    ) -> None:
        # A fresh prefix keeps the scope unique; the suffix brings the odd characters.
        scope = (uuid4().hex + scope_suffix)[:1024]
        await _create(store, scope, "t1")
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        assert read.thread.scope_key == scope
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert [(t.scope_key, t.thread_id) for t in listed.items] == [(scope, "t1")]

    async def test_1024_char_scope_and_thread_together(self, store: ThreadStore) -> None:
        scope = (uuid4().hex + "🧵" * 1024)[:1024]
        thread = "🚀" * 1024
        await _create(store, scope, thread)
        read = await store.read_thread(b.read(scope, thread))
        assert read.thread is not None
        assert (read.thread.scope_key, read.thread.thread_id) == (scope, thread)

    async def test_longest_non_ascii_ids_in_every_family(self, store: ThreadStore) -> None:
        # 1,024 four-byte characters in the scope key, the thread id and every
        # record id of one key: ids are text, whatever their size in bytes.
        longest = "\U0001f9f5" * 1024
        scope = (uuid4().hex + longest)[:1024]
        other = "\U0001f680" * 1024
        await _create(store, scope, other)
        result = await store.commit_thread(
            b.create(
                scope,
                longest,
                {
                    "messages": [b.insert(b.message(longest)), b.insert(b.message(other))],
                    "runs": [b.insert(b.run(longest, "queued", queue_item_id=longest))],
                    "queuedItems": [b.insert(b.queued_item(longest, longest, "x"))],
                },
            )
        )
        assert isinstance(result, CommittedResult)
        read = await store.read_thread(
            b.read(
                scope,
                longest,
                messages={"type": "ids", "messageIds": [other, longest]},
                runs={"type": "ids", "runIds": [longest]},
                queuedItems={"type": "page", "runId": longest, "page": {"limit": 5}},
            )
        )
        assert read.messages is not None
        assert read.runs is not None
        assert read.queued_items is not None
        assert [m.message_id for m in read.messages.items] == [other, longest]
        assert [r.run_id for r in read.runs.items] == [longest]
        assert [q.queue_item_id for q in read.queued_items.items] == [longest]
        after = await store.read_thread(
            b.read(
                scope,
                longest,
                messages={
                    "type": "page",
                    "view": "raw",
                    "afterMessageId": longest,
                    "page": {"limit": 5},
                },
            )
        )
        assert after.messages is not None
        assert [m.message_id for m in after.messages.items] == [other]
        listed = await store.list_threads({"scopeKey": scope, "limit": 1})
        rest = await store.list_threads(
            {"scopeKey": scope, "limit": 1, "pageToken": listed.next_page_token}
        )
        assert [t.thread_id for t in listed.items + rest.items] == sorted([longest, other])
        assert rest.next_page_token is None

    @pytest.mark.parametrize("bad", BAD_LENGTH_IDS)
    async def test_bad_length_thread_id_rejected(self, store: ThreadStore, bad: str) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError, match="threadId"):
            await store.commit_thread(b.create(scope, bad))
        with pytest.raises(ThreadStoreInvariantError, match="threadId"):
            await store.read_thread(b.read(scope, bad))
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert listed.items == []

    @pytest.mark.parametrize("bad", BAD_LENGTH_IDS)
    async def test_bad_length_scope_key_rejected(self, store: ThreadStore, bad: str) -> None:
        with pytest.raises(ThreadStoreInvariantError, match="scopeKey"):
            await store.commit_thread(b.create(bad, "t1"))
        with pytest.raises(ThreadStoreInvariantError, match="scopeKey"):
            await store.read_thread(b.read(bad, "t1"))
        with pytest.raises(ThreadStoreInvariantError, match="scopeKey"):
            await store.list_threads({"scopeKey": bad, "limit": 10})

    async def test_lone_surrogate_rejected(self, store: ThreadStore) -> None:
        scope = new_scope()
        with pytest.raises(ThreadStoreInvariantError, match="threadId"):
            await store.commit_thread(b.create(scope, "bad\ud800id"))
        with pytest.raises(ThreadStoreInvariantError, match="scopeKey"):
            await store.commit_thread(b.create(scope + "\udfff", "t1"))
        with pytest.raises(ThreadStoreInvariantError, match="threadId"):
            await store.read_thread(b.read(scope, "\udc00"))
        with pytest.raises(ThreadStoreInvariantError, match="scopeKey"):
            await store.list_threads({"scopeKey": "\ud83d", "limit": 1})
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert listed.items == []

    async def test_valid_surrogate_pair_is_not_a_lone_surrogate(self, store: ThreadStore) -> None:
        # "🧵" is one code point in Python; a backend must not split it.
        scope = new_scope()
        await _create(store, scope, "🧵")
        read = await store.read_thread(b.read(scope, "🧵"))
        assert read.thread is not None
        assert read.thread.thread_id == "🧵"

    async def test_similar_ids_are_distinct(self, store: ThreadStore) -> None:
        scope = new_scope()
        ids = ["a", "A", "a ", "a\x00", "a/", "a.b", "a/b", "ab"]
        for index, thread_id in enumerate(ids):
            await _create(store, scope, thread_id, title=f"title-{index}")
        for index, thread_id in enumerate(ids):
            read = await store.read_thread(b.read(scope, thread_id))
            assert read.thread is not None
            assert read.thread.title == f"title-{index}"
        listed = await store.list_threads({"scopeKey": scope, "limit": 100})
        assert sorted(t.thread_id for t in listed.items) == sorted(ids)

    async def test_scope_and_thread_do_not_concatenate(self, store: ThreadStore) -> None:
        # ("S/x", "y") and ("S", "x/y") must be different threads in different scopes.
        scope = new_scope()
        await _create(store, scope + "/x", "y", title="first")
        await _create(store, scope, "x/y", title="second")
        first = await store.read_thread(b.read(scope + "/x", "y"))
        second = await store.read_thread(b.read(scope, "x/y"))
        assert first.thread is not None
        assert second.thread is not None
        assert (first.thread.title, second.thread.title) == ("first", "second")
        assert (await store.read_thread(b.read(scope, "x"))).thread is None
        assert (await store.read_thread(b.read(scope + "/x/y", "y"))).thread is None
        listed = await store.list_threads({"scopeKey": scope, "limit": 10})
        assert [t.thread_id for t in listed.items] == ["x/y"]

    async def test_lone_surrogate_scope_key_rejected_by_reads(self, store: ThreadStore) -> None:
        for bad in ("\ud800", "scope\udfff", "\udc00x"):
            with pytest.raises(ThreadStoreInvariantError, match="scopeKey"):
                await store.read_thread(b.read(bad, "t1"))
            with pytest.raises(ThreadStoreInvariantError, match="scopeKey"):
                await store.list_threads({"scopeKey": bad, "limit": 1, "includeHidden": True})

    @pytest.mark.parametrize(
        "places",
        [("scope-b", "t"), ("scope-a", "u")],
        ids=["other-scope", "other-thread"],
    )
    async def test_every_family_is_isolated_by_scope_and_thread(
        self, store: ThreadStore, places: tuple[str, str]
    ) -> None:
        # Two threads with the same child ids: ids, pages and filters of one
        # never see the other's records.
        base = new_scope()
        scopes = {"scope-a": base + "a", "scope-b": base + "b"}
        mine = (scopes["scope-a"], "t")
        theirs = (scopes[places[0]], places[1])
        for (scope, thread), tag in ((mine, "mine"), (theirs, "theirs")):
            await store.commit_thread(
                b.create(
                    scope,
                    thread,
                    {
                        "messages": [
                            b.insert(b.message("m1", tag)),
                            b.insert(b.message(f"only-{tag}", tag)),
                        ],
                        "runs": [
                            b.insert(b.run("r1", "queued", queue_item_id="q1")),
                            b.insert(b.run(f"r-{tag}", "completed", operation=None)),
                        ],
                        "queuedItems": [b.insert(b.queued_item("q1", "r1", tag))],
                    },
                )
            )
        page = {"limit": 10}
        read = await store.read_thread(
            b.read(
                *mine,
                messages={"type": "ids", "messageIds": ["m1", "only-theirs", "only-mine"]},
                runs={"type": "page", "statuses": ["completed", "queued"], "page": page},
                queuedItems={"type": "page", "runId": "r1", "page": page},
            )
        )
        assert read.messages is not None
        assert read.runs is not None
        assert read.queued_items is not None
        assert [(m.message_id, m.parts[0].to_json()["text"]) for m in read.messages.items] == [
            ("m1", "mine"),
            ("only-mine", "mine"),
        ]
        assert [r.run_id for r in read.runs.items] == ["r1", "r-mine"]
        assert [q.input for q in read.queued_items.items] == ["mine"]
        raw = await store.read_thread(
            b.read(*mine, messages={"type": "page", "view": "raw", "page": page})
        )
        assert raw.messages is not None
        assert [m.message_id for m in raw.messages.items] == ["m1", "only-mine"]
        with pytest.raises(ThreadStoreInvariantError, match="only-theirs"):
            await store.read_thread(
                b.read(
                    *mine,
                    messages={
                        "type": "page",
                        "view": "raw",
                        "afterMessageId": "only-theirs",
                        "page": page,
                    },
                )
            )

    # ------------------------------------------------------------ versioning

    async def test_create_gives_revision_one_and_fresh_instance_id(
        self, store: ThreadStore
    ) -> None:
        scope = new_scope()
        first = await _create(store, scope, "t1")
        second = await _create(store, scope, "t2")
        assert first.version.revision == 1
        assert second.version.revision == 1
        assert isinstance(first.version.thread_instance_id, str)
        assert first.version.thread_instance_id != ""
        assert first.version.thread_instance_id != second.version.thread_instance_id

    async def test_every_commit_adds_exactly_one(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, "t1")
        version = created.version
        for expected in (2, 3, 4):
            result = await _update(store, scope, "t1", version, title=f"rev{expected}")
            assert isinstance(result, CommittedResult)
            assert result.thread is not None
            assert result.thread.version.revision == expected
            assert result.thread.version.thread_instance_id == created.version.thread_instance_id
            version = result.thread.version
        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        assert read.thread.version == version
        assert read.thread.title == "rev4"

    async def test_commit_with_changes_adds_exactly_one(self, store: ThreadStore) -> None:
        scope = new_scope()
        created = await _create(store, scope, "t1")
        changes = {
            "messages": [
                {"type": "insert", "record": b.message("m1")},
                {"type": "insert", "record": b.message("m2")},
                {"type": "insert", "record": b.message("m3")},
            ]
        }
        result = await store.commit_thread(
            b.update_at(scope, "t1", created.version, changes, root=b.root())
        )
        assert isinstance(result, CommittedResult)
        assert result.thread is not None
        assert result.thread.version.revision == 2

    async def test_delete_and_recreate_gives_new_instance_id(self, store: ThreadStore) -> None:
        scope = new_scope()
        first = await _create(store, scope, "t1")
        deleted = await store.commit_thread(b.delete(scope, "t1", first.version))
        assert isinstance(deleted, CommittedResult)
        assert deleted.thread is None
        assert (await store.read_thread(b.read(scope, "t1"))).thread is None
        second = await _create(store, scope, "t1")
        assert second.version.revision == 1
        assert second.version.thread_instance_id != first.version.thread_instance_id

    async def test_stale_version_from_before_delete_conflicts(self, store: ThreadStore) -> None:
        scope = new_scope()
        first = await _create(store, scope, "t1")
        # Bring the old incarnation to revision 2, then delete and re-create it
        # and bring the new one to revision 2 as well: same revision, new instance.
        old = await _update(store, scope, "t1", first.version, title="old")
        assert isinstance(old, CommittedResult)
        assert old.thread is not None
        old_version = old.thread.version
        await store.commit_thread(b.delete(scope, "t1", old_version))
        second = await _create(store, scope, "t1")
        new = await _update(store, scope, "t1", second.version, title="new")
        assert isinstance(new, CommittedResult)
        assert new.thread is not None
        assert new.thread.version.revision == old_version.revision

        stale_update = await _update(store, scope, "t1", old_version, title="stale")
        assert isinstance(stale_update, ConflictResult)
        assert stale_update.current_version == new.thread.version
        stale_delete = await store.commit_thread(b.delete(scope, "t1", old_version))
        assert isinstance(stale_delete, ConflictResult)
        assert stale_delete.current_version == new.thread.version

        read = await store.read_thread(b.read(scope, "t1"))
        assert read.thread is not None
        assert read.thread.title == "new"
        assert read.thread.version == new.thread.version

    # ------------------------------------------------------------ isolation

    async def test_same_thread_id_in_two_scopes_is_independent(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope(), new_scope()
        a = await _create(store, scope_a, "shared", title="A", category="ca")
        b_ = await _create(store, scope_b, "shared", title="B", category="cb")
        assert a.version.thread_instance_id != b_.version.thread_instance_id

        updated = await _update(store, scope_a, "shared", a.version, title="A2")
        assert isinstance(updated, CommittedResult)
        read_b = await store.read_thread(b.read(scope_b, "shared"))
        assert read_b.thread is not None
        assert (read_b.thread.title, read_b.thread.category) == ("B", "cb")
        assert read_b.thread.version == b_.version

        deleted = await store.commit_thread(b.delete(scope_b, "shared", b_.version))
        assert isinstance(deleted, CommittedResult)
        read_a = await store.read_thread(b.read(scope_a, "shared"))
        assert read_a.thread is not None
        assert read_a.thread.title == "A2"
        assert read_a.thread.version.revision == 2

    async def test_children_are_isolated_by_scope(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope(), new_scope()
        await store.commit_thread(
            b.create(scope_a, "t", {"messages": [{"type": "insert", "record": b.message("mA")}]})
        )
        await store.commit_thread(
            b.create(scope_b, "t", {"messages": [{"type": "insert", "record": b.message("mB")}]})
        )
        page = {"type": "page", "view": "raw", "page": {"limit": 10}}
        read_a = await store.read_thread(b.read(scope_a, "t", messages=page))
        read_b = await store.read_thread(b.read(scope_b, "t", messages=page))
        assert read_a.messages is not None
        assert read_b.messages is not None
        assert [m.message_id for m in read_a.messages.items] == ["mA"]
        assert [m.message_id for m in read_b.messages.items] == ["mB"]
        ids = {"type": "ids", "messageIds": ["mA", "mB"]}
        by_id = await store.read_thread(b.read(scope_b, "t", messages=ids))
        assert by_id.messages is not None
        assert [m.message_id for m in by_id.messages.items] == ["mB"]

    async def test_nothing_in_scope_a_reachable_through_scope_b(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope(), new_scope()
        a = await _create(store, scope_a, "t1", title="secret")

        read = await store.read_thread(
            b.read(
                scope_b,
                "t1",
                messages={"type": "page", "view": "raw", "page": {"limit": 10}},
            )
        )
        assert read.thread is None
        assert read.messages is None
        listed = await store.list_threads({"scopeKey": scope_b, "limit": 100})
        assert listed.items == []
        hidden = await store.list_threads(
            {"scopeKey": scope_b, "limit": 100, "includeHidden": True}
        )
        assert hidden.items == []

        update = await _update(store, scope_b, "t1", a.version, title="hijack")
        assert isinstance(update, ConflictResult)
        assert update.current_version is None
        delete = await store.commit_thread(b.delete(scope_b, "t1", a.version))
        assert isinstance(delete, ConflictResult)
        assert delete.current_version is None

        after = await store.read_thread(b.read(scope_a, "t1"))
        assert after.thread is not None
        assert after.thread.title == "secret"
        assert after.thread.version == a.version

    async def test_create_in_other_scope_does_not_conflict(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope(), new_scope()
        await _create(store, scope_a, "t1")
        created = await store.commit_thread(b.create(scope_b, "t1"))
        assert isinstance(created, CommittedResult)
        assert created.thread is not None
        assert created.thread.scope_key == scope_b
        assert created.thread.version.revision == 1

    async def test_list_shows_only_own_scope(self, store: ThreadStore) -> None:
        scope_a, scope_b = new_scope(), new_scope()
        for thread_id in ("a1", "a2", "a3"):
            await _create(store, scope_a, thread_id)
        await _create(store, scope_b, "b1", visibility="hidden")
        await _create(store, scope_b, "b2")
        listed_a = await store.list_threads(
            {"scopeKey": scope_a, "limit": 100, "includeHidden": True}
        )
        listed_b = await store.list_threads(
            {"scopeKey": scope_b, "limit": 100, "includeHidden": True}
        )
        assert sorted(t.thread_id for t in listed_a.items) == ["a1", "a2", "a3"]
        assert sorted(t.thread_id for t in listed_b.items) == ["b1", "b2"]
        assert {t.scope_key for t in listed_a.items} == {scope_a}
