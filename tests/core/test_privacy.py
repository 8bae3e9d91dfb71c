"""Nothing sensitive in reprs or messages: metadata contents, input values, passwords."""

from __future__ import annotations

import pytest

import pai_storage as p
from pai_storage import builders as b
from pai_storage.backend import check_json, redact
from pai_storage.errors import (
    ThreadStoreInvariantError,
    ThreadStorePageTokenError,
    ThreadStoreSerializationError,
)
from pai_storage.models import CreateRoot
from pai_storage.parsing import parse


async def test_reprs_never_show_opaque_json() -> None:
    async with p.open_store("memory://") as store:
        result = await store.commit_thread(
            b.create(
                "s",
                "t",
                {"messages": [b.insert(b.message("m1", metadata={"email": "alice@example.com"}))]},
                metadata={"email": "alice@example.com"},
                privateMetadata={"apiKey": "sk-SECRET"},
            )
        )
        read = await store.read_thread(
            b.read("s", "t", messages={"type": "page", "view": "raw", "page": {"limit": 5}})
        )
    for text in (repr(result), str(result), repr(read), repr(read.messages)):
        assert "alice@example.com" not in text
        assert "sk-SECRET" not in text
    assert "metadata=<object: 1 keys>" in repr(result)


def test_error_messages_do_not_echo_union_tags_or_keys() -> None:
    with pytest.raises(ThreadStoreInvariantError) as caught:
        parse(p.Part, {"type": "PII-alice@example.com"})
    assert "alice" not in str(caught.value)
    with pytest.raises(ThreadStoreSerializationError) as bad_key:
        check_json({("alice@example.com",): 1}, "metadata")
    assert "alice" not in str(bad_key.value)
    assert "tuple" in str(bad_key.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://127.0.0.1:1/db?password=hunter2XYZ",
        "postgresql://127.0.0.1:1/db?sslpassword=hunter2XYZ&sslmode=require",
        "mongodb://u:hunter2XYZ@127.0.0.1:1/?authSource=admin",
    ],
)
def test_url_secrets_are_masked(url: str) -> None:
    parsed = p.make_url(url)
    assert "hunter2XYZ" not in repr(parsed)
    assert "hunter2XYZ" not in str(parsed)
    assert "hunter2XYZ" in parsed.render(hide_password=False)
    assert redact(f"failed: {url}", parsed).count("hunter2XYZ") == 0


async def test_empty_page_token_is_rejected() -> None:
    async with p.open_store("memory://") as store:
        await store.commit_thread(b.create("s", "t", {"messages": [b.insert(b.message("m1"))]}))
        with pytest.raises(ThreadStorePageTokenError):
            await store.read_thread(
                b.read(
                    "s",
                    "t",
                    messages={"type": "page", "view": "raw", "page": {"limit": 5, "pageToken": ""}},
                )
            )
        with pytest.raises(ThreadStorePageTokenError):
            await store.list_threads({"scopeKey": "s", "limit": 5, "pageToken": ""})


def test_non_json_top_level_metadata_is_a_serialization_error() -> None:
    root = {
        "agent": "a",
        "directExecutionAllowed": True,
        "listVisibility": "visible",
        "privateMetadata": {},
    }
    with pytest.raises(ThreadStoreSerializationError, match="tuple"):
        CreateRoot.model_validate({**root, "metadata": (1,)})
    with pytest.raises(ThreadStoreInvariantError, match="JSON object"):
        CreateRoot.model_validate({**root, "metadata": [1]})
    with pytest.raises(ThreadStoreSerializationError, match="lone surrogate"):
        CreateRoot.model_validate({**root, "metadata": {}, "title": "a\udfff"})
