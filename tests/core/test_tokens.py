"""Page tokens: opaque, scope-bound, query-bound, tamper-evident; hostile tokens refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pai_storage import PageTokenError, open_store
from pai_storage import builders as b
from pai_storage.backend import PageTokenCodec, query_digest
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStorePageTokenError

from . import strategies as s

B64 = string.ascii_letters + string.digits + "-_"


_ANY_TOKEN = given(
    kind=st.sampled_from(["messages", "runs", "queuedItems", "threads"]),
    scope=s.ids,
    query=st.text(max_size=20),
    position=s.json_objects,
)
"""Any token: its page kind, scope, query and position."""


def _flip(char: str) -> str:
    if char == ".":
        return "_"
    return "A" if char != "A" else "B"


@settings(max_examples=150, deadline=None)
@_ANY_TOKEN
def test_round_trip(kind: str, scope: str, query: str, position: dict[str, Any]) -> None:
    codec = PageTokenCodec("pai-test")
    token = codec.encode(kind, scope, query, position)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", token)  # one base64url string, unpadded
    assert _blob(token).startswith(b"pai-test.")
    assert codec.decode(token, kind, scope, query) == position


@settings(max_examples=150, deadline=None)
@_ANY_TOKEN
def test_payload_is_the_canonical_json_of_the_whole_payload(
    kind: str, scope: str, query: str, position: dict[str, Any]
) -> None:
    codec = PageTokenCodec("pai-test")
    token = codec.encode(kind, scope, query, position)
    payload = {"v": 1, "k": kind, "s": codec.scope_digest(scope), "q": query, "p": position}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    blob = _blob(token)
    assert blob == b"pai-test." + canonical.encode() + blob[-16:]
    assert codec.payload(token) == payload
    assert "=" not in token


def _blob(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


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


@pytest.mark.parametrize("prefix", ["", "a.b", "pai é", 5])
def test_bad_prefix(prefix: Any) -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="prefix"):
        PageTokenCodec(prefix)


@pytest.mark.parametrize(
    ("secret", "words"),
    [
        ("secret", "not str"),
        (b"", "not empty bytes"),
        (bytearray(b"k"), "not bytearray"),
        (5, "int"),
    ],
)
def test_secret_must_be_non_empty_bytes(secret: Any, words: str) -> None:
    # A str secret used to be accepted, and every paged read then failed with a
    # raw TypeError from hmac.
    with pytest.raises(ThreadStoreConfigurationError, match="token_secret") as err:
        PageTokenCodec("pai-test", secret=secret)
    assert words in str(err.value)
    assert "secret'" not in str(err.value)  # the value itself is never echoed


@pytest.mark.parametrize("secret", ["secret", b""])
def test_store_refuses_a_bad_token_secret_when_made(secret: Any) -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="token_secret"):
        open_store("memory://", token_secret=secret)


def test_default_key_warning_is_documented() -> None:
    from pai_storage.selection import SelectionHelpers

    for cls in (PageTokenCodec, SelectionHelpers):
        assert "production" in (cls.__doc__ or "")
        assert "forge" in (cls.__doc__ or "")


# ---------------------------------------------------------------- malformed tokens


QUERY = query_digest({"q": 1})


def _decode(token: str) -> None:
    PageTokenCodec("pai-test").decode(token, "messages", "scope", QUERY)


@pytest.mark.parametrize(
    "token",
    [
        "pai-test.é.abc",  # non-ASCII body: hmac.compare_digest raised TypeError
        "pai-test.abc.é",  # non-ASCII MAC
        "pai-test.\ud800.abc",  # lone surrogate: str.encode raised UnicodeEncodeError
        "pai-test.abc.\udfff",
        "pai-test.\x00.\x00",
        "pai-test.a b.c d",
        "pai-test.====.AAAA",
        "pai-test..AAAA",
        "pai-test.🧵.🧵",
    ],
)
def test_malformed_token_text_is_a_page_token_error(token: str) -> None:
    with pytest.raises(ThreadStorePageTokenError, match="malformed"):
        _decode(token)


def test_a_token_that_is_not_a_string_is_a_page_token_error() -> None:
    tokens: list[Any] = [b"pai-test.a.b", None, 5]
    for token in tokens:
        with pytest.raises(ThreadStorePageTokenError, match="string"):
            PageTokenCodec("pai-test").decode(token, "messages", "scope", QUERY)


@settings(max_examples=300, deadline=None)
@given(tail=st.text())
def test_fuzz_any_text_after_the_prefix(tail: str) -> None:
    with pytest.raises(ThreadStorePageTokenError):
        _decode("pai-test." + tail)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200))
def test_fuzz_random_bytes(raw: bytes) -> None:
    # surrogateescape turns invalid UTF-8 into lone surrogates, as a careless
    # transport layer might.
    for token in (raw.decode("latin-1"), raw.decode("utf-8", "surrogateescape")):
        with pytest.raises(ThreadStorePageTokenError):
            _decode(token)
        with pytest.raises(ThreadStorePageTokenError):
            _decode("pai-test." + token)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_truncated_and_spliced_tokens(data: st.DataObject) -> None:
    _, token = _token()
    start = data.draw(st.integers(0, len(token)))
    end = data.draw(st.integers(start, len(token)))
    junk = data.draw(st.text(max_size=4))
    mangled = token[:start] + junk + token[end:]
    if mangled == token:
        return
    with pytest.raises(ThreadStorePageTokenError):
        _decode(mangled)


def _mint_payload(payload: bytes) -> str:
    """A token whose MAC is valid for ``payload`` (the default key is public)."""
    codec = PageTokenCodec("pai-test")
    blob = b"pai-test." + payload + codec._mac(payload)
    return base64.urlsafe_b64encode(blob).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe not utf-8",
        b"not json",
        b"[" * 100_000 + b"]" * 100_000,  # json.loads raised RecursionError
        b"1" * 5_000,  # an integer too long for int(): ValueError
        b"[1, 2]",
        b'{"v": 2}',
        b'{"v": 1, "k": "messages", "s": 5, "q": null, "p": {}}',
    ],
)
def test_valid_mac_over_garbage_is_a_page_token_error(payload: bytes) -> None:
    with pytest.raises(ThreadStorePageTokenError):
        _decode(_mint_payload(payload))


def test_a_forged_kind_is_not_echoed() -> None:
    payload = {"v": 1, "k": "x" * 500, "s": "s", "q": QUERY, "p": {}}
    with pytest.raises(ThreadStorePageTokenError, match="another kind of page") as err:
        _decode(_mint_payload(json.dumps(payload).encode()))
    assert "xxx" not in str(err.value)


def test_query_digest_is_order_independent_and_distinct() -> None:
    assert query_digest({"a": 1, "b": 2}) == query_digest({"b": 2, "a": 1})
    assert query_digest({"a": 1}) != query_digest({"a": 2})


def _canonical_digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return (
        base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:16]).decode().rstrip("=")
    )


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=4),
            st.tuples(st.text(max_size=3)),
            st.lists(st.text(max_size=3), max_size=2),
        ),
        max_size=4,
    )
)
def test_query_digest_is_the_digest_of_the_canonical_json(
    query: dict[str, Any],
) -> None:
    # Twice, and beside values that compare equal but encode differently
    # (True == 1 == 1.0), it is the digest of the canonical JSON.
    for value in (query, {k: (1 if v is True else v) for k, v in query.items()}):
        assert query_digest(value) == _canonical_digest(value)
        assert query_digest(dict(value)) == _canonical_digest(value)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"a": 1}, {"a": True}),
        ({"a": 0}, {"a": False}),
        ({"a": 1}, {"a": 1.0}),
        ({"a": ("x",)}, {"a": "x"}),
        ({1: "x"}, {True: "x"}),
        ({1: "x"}, {1.0: "x"}),
    ],
)
def test_equal_comparing_positions_mint_different_tokens(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    codec = PageTokenCodec("pai-test")
    one, two = (codec.encode("messages", "s", "q", p) for p in (first, second))
    assert one != two
    assert query_digest(first) != query_digest(second)
    assert query_digest(second) == _canonical_digest(second)
    # Minting again gives the same token, which still decodes to its position.
    assert codec.encode("messages", "s", "q", dict(first)) == one
    assert codec.decode(two, "messages", "s", "q") == json.loads(json.dumps(second))


_POSITION_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


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
        later = b.update_at(
            "s",
            "t",
            root.version,
            {"messages": [{"type": "insert", "record": b.message("late")}]},
            root=b.root(),
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


# ---------------------------------------------------------------- valid MAC, hostile position


def _payload(token: str) -> dict[str, Any]:
    blob = _blob(token)
    decoded: dict[str, Any] = json.loads(blob[blob.index(b".") + 1 : -16])
    return decoded


def _remint(codec: PageTokenCodec, token: str, scope: str, **position: Any) -> str:
    """``token`` with its position fields replaced, under a valid MAC."""
    payload = _payload(token)
    minted: str = codec.encode(payload["k"], scope, payload["q"], {**payload["p"], **position})
    return minted


def _without(codec: PageTokenCodec, token: str, scope: str, key: str) -> str:
    payload = _payload(token)
    position = {k: v for k, v in payload["p"].items() if k != key}
    minted: str = codec.encode(payload["k"], scope, payload["q"], position)
    return minted


BAD_POSITIONS = [
    2**63,
    2**63 - 1,  # the window's exclusive upper bound would be 2**63
    2**64,
    10**30,
    -1,
    -(2**63) - 1,
    "1",
    1.0,
    True,
    None,
    [1],
]
BAD_IDS = [5, "", "\ud800", "x" * 1025, None, ["i"], True]

CHILD_FAMILIES: list[tuple[str, dict[str, Any]]] = [
    ("messages", {"type": "page", "view": "raw", "page": {"limit": 1}}),
    ("messages", {"type": "page", "view": "context", "order": "newest", "page": {"limit": 1}}),
    ("runs", {"type": "page", "page": {"limit": 1}}),
    ("runs", {"type": "page", "statuses": ["queued"], "page": {"limit": 1}}),
    ("queuedItems", {"type": "page", "page": {"limit": 1}}),
    ("queuedItems", {"type": "page", "order": "newest", "page": {"limit": 1}}),
]


async def _seed_all(store: Any) -> None:
    changes = {
        "messages": [b.insert(b.message(f"m{i}")) for i in range(3)],
        "runs": [b.insert(b.run(f"r{i}", "queued", queue_item_id=f"q{i}")) for i in range(3)],
        "queuedItems": [b.insert(b.queued_item(f"q{i}", f"r{i}")) for i in range(3)],
    }
    assert (await store.commit_thread(b.create("s", "t", changes))).type == "committed"


def _with_token(selection: dict[str, Any], token: str) -> dict[str, Any]:
    return {**selection, "page": {**selection["page"], "pageToken": token}}


@pytest.mark.parametrize(("family", "selection"), CHILD_FAMILIES)
async def test_child_tokens_with_out_of_range_fields_are_page_token_errors(
    family: str, selection: dict[str, Any]
) -> None:
    async with open_store("memory://", token_secret=b"k") as store:
        codec = PageTokenCodec(store.token_prefix, secret=b"k")
        await _seed_all(store)
        first = await store.read_thread(b.read("s", "t", **{family: selection}))
        token = getattr(first, "queued_items" if family == "queuedItems" else family)
        token = token.next_page_token
        assert token is not None

        async def refused(bad: str) -> None:
            with pytest.raises(ThreadStorePageTokenError, match="malformed"):
                await store.read_thread(b.read("s", "t", **{family: _with_token(selection, bad)}))

        # The re-minted token is accepted as is: only the bad field is refused.
        same = _remint(codec, token, "s")
        await store.read_thread(b.read("s", "t", **{family: _with_token(selection, same)}))
        for key in ("a", "lo", "c"):
            for value in BAD_POSITIONS:
                await refused(_remint(codec, token, "s", **{key: value}))
            await refused(_without(codec, token, "s", key))
        for value in BAD_POSITIONS:
            if value is not None:  # hi is null when the page has no upper bound
                await refused(_remint(codec, token, "s", hi=value))
        for value in BAD_IDS:
            await refused(_remint(codec, token, "s", i=value))
        await refused(_remint(codec, token, "s", extra=1))


async def test_list_tokens_with_out_of_range_fields_are_page_token_errors() -> None:
    async with open_store("memory://", token_secret=b"k") as store:
        codec = PageTokenCodec(store.token_prefix, secret=b"k")
        for i in range(3):
            await _seed(store, thread=f"t{i}", n=0)
        for request in (
            {"scopeKey": "s", "limit": 1},
            {"scopeKey": "s", "limit": 1, "agent": "assistant", "includeHidden": True},
            {"scopeKey": "s", "limit": 1, "category": "c", "parentThreadId": "p"},
        ):
            page = await store.list_threads({**request, "limit": 1})
            token = page.next_page_token
            if token is None:  # a filter that matches nothing: mint the token by hand
                first = await store.list_threads({"scopeKey": "s", "limit": 1})
                assert first.next_page_token is not None
                probe = _payload(first.next_page_token)
                query = query_digest(
                    {
                        "agent": request.get("agent"),
                        "parent": request.get("parentThreadId"),
                        "category": request.get("category"),
                        "hidden": bool(request.get("includeHidden")),
                    }
                )
                token = codec.encode("threads", "s", query, probe["p"])
            await store.list_threads({**request, "pageToken": _remint(codec, token, "s")})
            for value in [2**63, -(2**63) - 1, 10**20, 253_402_300_800_000, "1", 1.5, None, True]:
                with pytest.raises(ThreadStorePageTokenError, match="malformed"):
                    await store.list_threads(
                        {**request, "pageToken": _remint(codec, token, "s", u=value)}
                    )
            for value in BAD_IDS:
                with pytest.raises(ThreadStorePageTokenError, match="malformed"):
                    await store.list_threads(
                        {**request, "pageToken": _remint(codec, token, "s", t=value)}
                    )
            for key in ("u", "t"):
                with pytest.raises(ThreadStorePageTokenError, match="malformed"):
                    await store.list_threads(
                        {**request, "pageToken": _without(codec, token, "s", key)}
                    )


async def test_list_token_at_the_edges_of_the_time_range_is_accepted() -> None:
    async with open_store("memory://", token_secret=b"k") as store:
        codec = PageTokenCodec(store.token_prefix, secret=b"k")
        for i in range(2):
            await _seed(store, thread=f"t{i}", n=0)
        token = (await store.list_threads({"scopeKey": "s", "limit": 1})).next_page_token
        assert token is not None
        for updated in (-62_135_596_800_000, 253_402_300_799_999):
            page = await store.list_threads(
                {"scopeKey": "s", "limit": 5, "pageToken": _remint(codec, token, "s", u=updated)}
            )
            assert len(page.items) == (2 if updated > 0 else 0)


@pytest.mark.parametrize(
    "token",
    [
        "pai-memory.é.x",
        "pai-memory.AAAA.é",
        "pai-memory.\ud800.x",
        "garbage",
        "pai-memory.AAAA.AAAA",
        "é",
    ],
)
async def test_store_refuses_malformed_tokens_on_every_form(token: str) -> None:
    async with open_store("memory://") as store:
        await _seed_all(store)
        for family, selection in CHILD_FAMILIES:
            with pytest.raises(PageTokenError, match=r"malformed|tampered|another store"):
                await store.read_thread(b.read("s", "t", **{family: _with_token(selection, token)}))
        with pytest.raises(PageTokenError, match=r"malformed|tampered|another store"):
            await store.list_threads({"scopeKey": "s", "limit": 1, "pageToken": token})


@settings(max_examples=100, deadline=None)
@given(
    secret=st.one_of(
        st.binary(min_size=1, max_size=63),
        st.binary(min_size=64, max_size=64),  # exactly one SHA-256 block
        st.binary(min_size=65, max_size=300),  # longer keys are hashed first
    ),
    body=st.text(alphabet=B64, max_size=300),
)
def test_mac_is_hmac_sha256_of_prefix_and_payload(secret: bytes, body: str) -> None:
    # The MAC is HMAC-SHA256 truncated to 128 bits, whatever the key's length:
    # tokens minted by one version of the store verify on another.
    codec = PageTokenCodec("pai-test", secret=secret)
    expected = hmac.digest(secret, f"pai-test.{body}".encode(), hashlib.sha256)[:16]
    assert codec._mac(body.encode()) == expected


@settings(max_examples=100, deadline=None)
@_ANY_TOKEN
def test_a_token_decodes_in_a_new_codec_with_the_same_key(
    kind: str, scope: str, query: str, position: dict[str, Any]
) -> None:
    minter = PageTokenCodec("pai-test", secret=b"k")
    token = minter.encode(kind, scope, query, position)
    fresh = PageTokenCodec("pai-test", secret=b"k")
    assert fresh.decode(token, kind, scope, query) == position  # base64, MAC, JSON
    assert minter.decode(token, kind, scope, query) == position


def test_a_remembered_token_is_still_checked_against_each_request() -> None:
    """Verified tokens are remembered; a later decode of the same token for
    another scope, query or kind still fails, and so does any edit of it."""
    codec, token = _token()
    query = query_digest({"q": 1})
    position = codec.decode(token, "messages", "scope", query)
    assert codec.decode(token, "messages", "scope", query) is position  # remembered
    with pytest.raises(TypeError):
        position["x"] = 1  # type: ignore[index]  # shared, so read-only
    with pytest.raises(ThreadStorePageTokenError, match="scope"):
        codec.decode(token, "messages", "other scope", query)
    with pytest.raises(ThreadStorePageTokenError, match="query"):
        codec.decode(token, "messages", "scope", query_digest({"q": 2}))
    with pytest.raises(ThreadStorePageTokenError, match="runs"):
        codec.decode(token, "runs", "scope", query)
    edited = token[:-3] + _flip(token[-3]) + token[-2:]
    with pytest.raises(ThreadStorePageTokenError):
        codec.decode(edited, "messages", "scope", query)
    with pytest.raises(ThreadStorePageTokenError, match="string"):
        codec.decode([token], "messages", "scope", query)  # type: ignore[arg-type]  # unhashable
