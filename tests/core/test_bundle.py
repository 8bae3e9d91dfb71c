"""connect(): every component of a backend from one URL, per-component URLs, options, closing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pai_example_kv import KeyValueItemStore, KeyValueThreadStore

import pai_storage
from pai_storage import (
    AgentStateStore,
    ConfigurationError,
    ExecutionGuard,
    KeyValueStore,
    ManualClock,
    SnapshotStore,
    ThreadStore,
    connect,
    open_guard,
    open_kv_store,
    open_snapshot_store,
    open_state_store,
)


async def test_memory_provides_every_component() -> None:
    async with connect("memory://") as stores:
        assert stores.provided == {"threads", "kv", "state", "snapshots", "guard"}
        assert isinstance(stores.threads, ThreadStore)
        assert isinstance(stores.kv, KeyValueStore)
        assert isinstance(stores.state, AgentStateStore)
        assert isinstance(stores.snapshots, SnapshotStore)
        assert isinstance(stores.guard, ExecutionGuard)
        await stores.kv.put(("a",), "k", {"x": 1})
        assert (await stores.kv.get(("a",), "k")) is not None
    assert all(store.closed for store in (stores.kv, stores.threads, stores.guard))


async def test_a_partial_backend_names_what_it_lacks() -> None:
    async with connect("kv://") as stores:
        assert stores.provided == {"threads", "kv"}
        assert isinstance(stores.threads, KeyValueThreadStore)
        assert isinstance(stores.kv, KeyValueItemStore)
        # One connect() call shares one server between the components of a URL.
        assert stores.kv.server is stores.threads.server
        with pytest.raises(
            ConfigurationError, match="examplekv backend does not provide the guard"
        ):
            _ = stores.guard
    assert "guard" not in stores


async def test_a_component_can_come_from_another_url() -> None:
    async with connect("kv://", guard="memory://", snapshots="memory://") as stores:
        assert stores.provided == {"threads", "kv", "guard", "snapshots"}
        assert type(stores.guard).__module__.startswith("pai_storage_memory")
        assert "guard=memory" in repr(stores)
        assert "kv=examplekv" in repr(stores)


def test_a_component_url_whose_backend_lacks_it_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="examplekv backend does not provide the guard"):
        connect("memory://", guard="kv://")


def test_backend_options_go_to_the_components_that_take_them() -> None:
    stores = connect("memory://", max_value_bytes=10, session_ttl=None, lease_ttl=timedelta(1))
    assert stores.kv.max_value_bytes == 10
    assert stores.state.max_value_bytes == 10
    assert stores.state.session_ttl is None
    assert stores.guard.lease_ttl == timedelta(1)


def test_an_option_no_component_takes_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="bogus"):
        connect("memory://", bogus=1)


def test_main_url_options_are_not_dropped_when_it_opens_nothing() -> None:
    with pytest.raises(ConfigurationError, match="max_value_bytes"):
        connect("kv://", threads="memory://", kv="memory://", max_value_bytes=10)


async def test_common_options_go_to_every_url() -> None:
    clock = ManualClock()
    async with connect("kv://", guard="memory://", clock=clock) as stores:
        lock = await stores.guard.acquire("r", owner="w", lease_ttl=timedelta(seconds=5))
        assert lock.expires_at == clock() + timedelta(seconds=5)
        item = await stores.kv.put(("a",), "k", 1)
        assert item.created_at == clock()


async def test_closing_releases_the_guards_locks() -> None:
    stores = connect("memory://")
    lock = await stores.guard.acquire("sandbox", owner="w")
    await stores.close()
    assert lock.lost.is_set()
    await stores.close()  # idempotent


async def test_each_component_opens_alone() -> None:
    for opener, kind in (
        (open_kv_store, KeyValueStore),
        (open_state_store, AgentStateStore),
        (open_snapshot_store, SnapshotStore),
        (open_guard, ExecutionGuard),
    ):
        async with opener("memory://") as store:
            assert isinstance(store, kind)
    with pytest.raises(ConfigurationError, match="does not provide the state"):
        open_state_store("kv://")


def test_secrets_never_show() -> None:
    with pytest.raises(ConfigurationError) as caught:
        connect("nosuch://user:hunter2@host/db")
    assert "hunter2" not in str(caught.value)
    assert "redact" not in pai_storage.__all__
