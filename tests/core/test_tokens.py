"""Page tokens: opaque, scope-bound, query-bound, tamper-evident (SPEC section 6)."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pai_storage import (
    PageTokenCodec,
    ThreadStorePageTokenError,
    open_store,
    query_digest,
)
from pai_storage import builders as b

from . import strategies as s

B64 = string.ascii_letters + string.digits + "-_"


def _flip(char: str) -> str:
    if char == ".":
        return "_"
    return "A" if char != "A" else "B"


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["messages", "runs", "queuedItems", "threads"]),
    scope=s.ids,
    query=st.text(max_size=20),
    position=s.json_objects,
)
def test_round_trip(kind: str, scope: str, query: str, position: dict[str, Any]) -> None:
    codec = PageTokenCodec("pai-test")
    token = codec.encode(kind, scope, query, position)
    assert token.startswith("pai-test.")
    assert token.count(".") == 2
    assert codec.decode(token, kind, scope, query) == position


def _token(codec: PageTokenCodec | None = None) -> tuple[PageTokenCodec, str]:
    codec = codec or PageTokenCodec("pai-test")
    return codec, codec.encode("messages", "scope", query_digest({"q": 1}), {"c": 3, "a": 9})


def test_every_single_character_tamper_is_rejected() -> None:
    codec, token = _token()
    query = query_digest({"q": 1})
    for index in range(len(token)):
        tampered = token[:index] + _flip(token[index]) + token[index + 1 :]
        assert tampered != token
        with pytest.raises(ThreadStorePageTokenError):
            codec.decode(tampered, "messages", "scope", query)


def test_truncated_tokens_rejected() -> None:
    codec, token = _token()
    query = query_digest({"q": 1})
    for end in range(len(token)):
        with pytest.raises(ThreadStorePageTokenError):
            codec.decode(token[:end], "messages", "scope", query)
    for junk in ("", "...", "pai-test..", token + ".x", "not a token"):
        with pytest.raises(ThreadStorePageTokenError):
            codec.decode(junk, "messages", "scope", query)


def test_other_prefix_rejected() -> None:
    _, token = _token(PageTokenCodec("pai-other"))
    with pytest.raises(ThreadStorePageTokenError, match=r"another store|malformed"):
        PageTokenCodec("pai-test").decode(token, "messages", "scope", query_digest({"q": 1}))


def test_cross_scope_rejected() -> None:
    codec, token = _token()
    with pytest.raises(ThreadStorePageTokenError, match="scope"):
        codec.decode(token, "messages", "other scope", query_digest({"q": 1}))


def test_cross_query_rejected() -> None:
    codec, token = _token()
    with pytest.raises(ThreadStorePageTokenError, match="query"):
        codec.decode(token, "messages", "scope", query_digest({"q": 2}))


def test_cross_kind_rejected() -> None:
    codec, token = _token()
    with pytest.raises(ThreadStorePageTokenError, match="runs"):
        codec.decode(token, "runs", "scope", query_digest({"q": 1}))


def test_secret_option() -> None:
    plain, token = _token()
    secret = PageTokenCodec("pai-test", secret=b"deployment secret")
    query = query_digest({"q": 1})
    with pytest.raises(ThreadStorePageTokenError, match="tampered"):
        secret.decode(token, "messages", "scope", query)
    minted = secret.encode("messages", "scope", query, {"c": 1})
    assert secret.decode(minted, "messages", "scope", query) == {"c": 1}
    with pytest.raises(ThreadStorePageTokenError):
        plain.decode(minted, "messages", "scope", query)
    with pytest.raises(ThreadStorePageTokenError):
        PageTokenCodec("pai-test", secret=b"other").decode(minted, "messages", "scope", query)


@pytest.mark.parametrize("prefix", ["", "a.b"])
def test_bad_prefix(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        PageTokenCodec(prefix)


def test_query_digest_is_order_independent_and_distinct() -> None:
    assert query_digest({"a": 1, "b": 2}) == query_digest({"b": 2, "a": 1})
    assert query_digest({"a": 1}) != query_digest({"a": 2})


# ---------------------------------------------------------------- via the memory store


def _messages_page(limit: int, token: str | None = None, **extra: Any) -> dict[str, Any]:
    page: dict[str, Any] = {"limit": limit}
    if token is not None:
        page["pageToken"] = token
    return {"type": "page", "view": "raw", "page": page, **extra}


async def _seed(store: Any, scope: str = "s", thread: str = "t", n: int = 3) -> Any:
    inserts = [{"type": "insert", "record": b.message(f"m{i}")} for i in range(n)]
    result = await store.commit_thread(b.create(scope, thread, {"messages": inserts}))
    assert result.type == "committed"
    return result.thread


async def test_store_tokens_continue_and_bind_scope_query_and_incarnation() -> None:
    async with open_store("memory://") as store:
        root = await _seed(store)
        await _seed(store, scope="other")
        first = await store.read_thread(b.read("s", "t", messages=_messages_page(2)))
        token = first.messages.next_page_token
        assert token is not None
        # only limit may change
        second = await store.read_thread(b.read("s", "t", messages=_messages_page(5, token)))
        assert [m.message_id for m in second.messages.items] == ["m2"]
        assert second.messages.next_page_token is None
        with pytest.raises(ThreadStorePageTokenError, match="scope"):
            await store.read_thread(b.read("other", "t", messages=_messages_page(2, token)))
        with pytest.raises(ThreadStorePageTokenError, match="query"):
            await store.read_thread(
                b.read("s", "t", messages=_messages_page(2, token, order="newest"))
            )
        with pytest.raises(ThreadStorePageTokenError, match="query"):
            await store.read_thread(
                b.read("s", "t", messages={**_messages_page(2, token), "view": "transcript"})
            )
        with pytest.raises(ThreadStorePageTokenError):
            await store.read_thread(
                b.read("s", "t", runs={"type": "page", "page": {"limit": 2, "pageToken": token}})
            )
        with pytest.raises(ThreadStorePageTokenError):
            await store.list_threads({"scopeKey": "s", "limit": 2, "pageToken": token})
        # delete and re-create: the old incarnation's token is rejected
        assert (await store.commit_thread(b.delete("s", "t", root.version))).type == "committed"
        await _seed(store)
        with pytest.raises(ThreadStorePageTokenError, match="incarnation"):
            await store.read_thread(b.read("s", "t", messages=_messages_page(2, token)))


async def test_store_list_token_bound_to_filters() -> None:
    async with open_store("memory://") as store:
        for i in range(3):
            await _seed(store, thread=f"t{i}", n=0)
        page = await store.list_threads({"scopeKey": "s", "limit": 2})
        token = page.next_page_token
        assert token is not None
        rest = await store.list_threads({"scopeKey": "s", "limit": 9, "pageToken": token})
        assert len(rest.items) == 1
        with pytest.raises(ThreadStorePageTokenError, match="query"):
            await store.list_threads(
                {"scopeKey": "s", "limit": 2, "pageToken": token, "includeHidden": True}
            )
        with pytest.raises(ThreadStorePageTokenError, match="scope"):
            await store.list_threads({"scopeKey": "x", "limit": 2, "pageToken": token})


async def test_store_token_secret_option() -> None:
    async with (
        open_store("memory://", token_secret=b"k1") as one,
        open_store("memory://", token_secret=b"k2") as two,
    ):
        await _seed(one)
        await _seed(two)
        page = await one.read_thread(b.read("s", "t", messages=_messages_page(1)))
        token = page.messages.next_page_token
        assert token is not None
        with pytest.raises(ThreadStorePageTokenError, match="tampered"):
            await two.read_thread(b.read("s", "t", messages=_messages_page(1, token)))


async def test_continuation_never_shows_records_committed_after_first_page() -> None:
    async with open_store("memory://") as store:
        root = await _seed(store, n=3)
        first = await store.read_thread(b.read("s", "t", messages=_messages_page(1)))
        token = first.messages.next_page_token
        assert token is not None
        later = b.update(
            "s", "t", root.version, {"messages": [{"type": "insert", "record": b.message("late")}]}
        )
        assert (await store.commit_thread(later)).type == "committed"
        seen = [m.message_id for m in first.messages.items]
        while token is not None:
            nxt = await store.read_thread(b.read("s", "t", messages=_messages_page(1, token)))
            seen.extend(m.message_id for m in nxt.messages.items)
            token = nxt.messages.next_page_token
        assert seen == ["m0", "m1", "m2"]
        fresh = await store.read_thread(b.read("s", "t", messages=_messages_page(10)))
        assert [m.message_id for m in fresh.messages.items] == ["m0", "m1", "m2", "late"]
