"""connect() and the runtime stores raise the general error classes, never a ThreadStore* one.

The thread store keeps its own classes (``open_store`` and the thread store's
operations); everything else -- opening a bundle, a runtime store alone, and
every runtime store operation -- raises ``ConfigurationError``,
``SerializationError``, ``UnavailableError``, ...
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pai_storage
from pai_storage import ConfigurationError, SerializationError, StorageError, UnavailableError
from pai_storage.errors import ThreadStoreConfigurationError, ThreadStoreError


@contextlib.contextmanager
def general(cls: type[StorageError], match: str | None = None) -> Iterator[None]:
    with pytest.raises(cls, match=match) as raised:
        yield
    assert not isinstance(raised.value, ThreadStoreError), type(raised.value)


BAD_URLS = [
    ("nope://", "no backend serves URL scheme 'nope'"),
    ("not a url", "scheme://"),
    ("memory://?x=1", "memory://"),
    ("postgresql://u:pw@h:notaport/db", "malformed"),
]


@pytest.mark.parametrize(("url", "words"), BAD_URLS)
def test_connect_refuses_a_bad_url_with_the_general_class(url: str, words: str) -> None:
    with general(ConfigurationError, match=words):
        pai_storage.connect(url)
    for opener in (
        pai_storage.open_kv_store,
        pai_storage.open_state_store,
        pai_storage.open_snapshot_store,
        pai_storage.open_guard,
    ):
        with general(ConfigurationError, match=words):
            opener(url)


def test_connect_refuses_unknown_options_with_the_general_class() -> None:
    with general(ConfigurationError, match="unknown option"):
        pai_storage.connect("memory://", colour="blue")
    with general(ConfigurationError, match="unknown option"):
        pai_storage.connect("sqlite:///:memory:", pool_sise=3)


def test_open_store_keeps_the_thread_store_class() -> None:
    with pytest.raises(ThreadStoreConfigurationError, match="nope"):
        pai_storage.open_store("nope://")


@pytest.mark.asyncio
async def test_a_server_that_cannot_be_reached_is_a_general_unavailable_error() -> None:
    stores = pai_storage.connect("postgresql://nobody@127.0.0.1:1/test", connect_timeout=2)
    with general(UnavailableError):
        async with stores:
            pass


@pytest.mark.asyncio
async def test_a_sqlite_file_that_cannot_be_opened_is_a_general_configuration_error(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/missing-dir/app.db"
    before = set(threading.enumerate())
    with general(ConfigurationError):
        async with pai_storage.connect(url):
            pass
    kv = pai_storage.open_kv_store(url)
    with general(ConfigurationError):
        await kv.put(("ns",), "k", 1)
    await kv.close()
    await _driver_threads_ended(before)


async def _driver_threads_ended(before: set[threading.Thread]) -> None:
    """Wait for the driver's threads started since ``before`` to end.

    aiosqlite stops the thread of a connection that failed to open without
    waiting for it, and the thread reports to the event loop as it ends: the
    test's loop must not be closed under it (the thread would raise "Event
    loop is closed")."""
    for thread in set(threading.enumerate()) - before:
        if thread.name.endswith("(_connection_worker_thread)"):
            await asyncio.to_thread(thread.join, 30)
            assert not thread.is_alive()


@pytest.mark.asyncio
@pytest.mark.parametrize("url", ["memory://", "sqlite:///:memory:"])
async def test_runtime_stores_refuse_values_with_the_general_class(url: str) -> None:
    nan = float("nan")
    async with pai_storage.connect(url) as stores:
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: stores.kv.put(("ns",), "k", {"a": [nan]}),
            lambda: stores.kv.put_if_version(("ns",), "k", nan, None),
            lambda: stores.state.save("u", "s", "k", nan),
            lambda: stores.state.save_if_version("u", "s", "k", nan, 0),
            lambda: stores.state.save_list("u", "s", "l", [nan]),
            lambda: stores.state.append_list("u", "s", "l", [1, nan]),
        ]
        for call in calls:
            with general(SerializationError, match="NaN"):
                await call()
        with pytest.raises(SerializationError) as raised:
            await stores.kv.put(("ns",), "k", {"a": [nan]})
        assert raised.value.path == "value.a[0]"
        assert "NaN" in raised.value.reason


@pytest.mark.parametrize("url", ["sqlite://foo.db", "sqlite+aiosqlite://foo.db", "sqlite://h/x.db"])
def test_a_sqlite_url_with_a_host_part_is_refused(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with general(ConfigurationError, match="in-memory"):
        pai_storage.connect(url)
    with pytest.raises(ThreadStoreConfigurationError) as raised:
        pai_storage.open_store(url)
    for form in ("sqlite:///foo.db", "sqlite:////abs/path.db", "three slashes"):
        assert form in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # nothing was created


@pytest.mark.asyncio
async def test_sqlite_urls_without_a_host_still_open(tmp_path: Path) -> None:
    for url in ("sqlite://", "sqlite:///:memory:", f"sqlite:///{tmp_path}/app.db"):
        async with pai_storage.connect(url) as stores:
            await stores.kv.put(("ns",), "k", 1)
    assert (tmp_path / "app.db").exists()
