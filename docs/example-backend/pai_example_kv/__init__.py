"""``kv://``: an example third-party backend, using public names only.

Records and errors come from ``pai_storage``, author helpers from
``pai_storage.backend`` and the test harness base from
``pai_storage_conformance.provision``. It provides two components — threads
(normalized rows through the core's pipelines, :mod:`.threads`) and a
key-value store (:mod:`.kv`) — on a stand-in key-value server, and no agent
state, snapshots or guard: a partial backend, which ``connect()`` and the
conformance suite report as such.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pai_storage_conformance.provision import TestHarness  # standard library only: cheap

from pai_storage import ThreadStore
from pai_storage.backend import Backend, Clock, ManagedStore, StoreURL, make_url

from .kv import KeyValueItemStore
from .server import Server
from .threads import KeyValueThreadStore

__all__ = ["KeyValueItemStore", "KeyValueThreadStore", "Server", "backend"]

_COMMON = ("clock", "on_warning", "token_secret")


class _Backend(Backend):
    name = "examplekv"
    url_schemes = ("kv",)
    components = frozenset({"threads", "kv"})

    def _open(self, url: StoreURL, **options: Any) -> ThreadStore:
        self.check_options(url, options, _COMMON)
        return KeyValueThreadStore(**options)

    def _open_components(
        self, url: StoreURL, components: Sequence[str], **options: Any
    ) -> dict[str, ManagedStore]:
        accepted = {"threads": _COMMON, "kv": (*_COMMON, "max_value_bytes")}
        shares = self.split_options(url, options, {c: accepted[c] for c in components})
        server = Server()  # one server for every component of this URL
        kinds = {"threads": KeyValueThreadStore, "kv": KeyValueItemStore}
        return {c: kinds[c](server=server, **shares[c]) for c in components}

    def test_harness(self, url: str | None = None) -> TestHarness:
        return _Harness()


class _Harness(TestHarness):
    components = frozenset({"threads", "kv"})

    @asynccontextmanager
    async def store(self, clock: Clock | None = None) -> AsyncIterator[ThreadStore]:
        async with KeyValueThreadStore(clock=clock) as store:
            yield store

    @asynccontextmanager
    async def component(self, name: str, clock: Clock | None = None) -> AsyncIterator[Any]:
        opened = backend.open_components(make_url("kv://"), [name], clock=clock)[name]
        async with opened:
            yield opened

    def describe(self) -> str:
        return "examplekv (in-process key-value map)"


backend = _Backend()
