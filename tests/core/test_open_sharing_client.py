"""Backend.open_sharing_client: one client for every component, options split per store."""

from __future__ import annotations

from typing import Any

import pytest

from pai_storage.backend import Backend, StoreURL, make_url
from pai_storage.errors import ThreadStoreConfigurationError

PACKAGE, _, MODULE = __name__.rpartition(".")


class Component:
    """Stands for a store class: records the client and the options it was made with."""

    def __init__(self, *, client: object, **options: Any) -> None:
        self.client = client
        self.options = options


STORES = {
    "kv": (MODULE, "Component", ("clock", "max_value_bytes")),
    "state": (MODULE, "Component", ("clock", "session_ttl", "max_value_bytes")),
}


class Sharing(Backend):
    name = "sharing"
    url_schemes = ("sharing",)
    components = frozenset({"threads", *STORES})

    def __init__(self) -> None:
        self.made: list[tuple[object, dict[str, Any]]] = []

    def _open(self, url: StoreURL, **options: Any) -> Any:
        raise NotImplementedError

    def test_harness(self, url: str | None = None) -> Any:
        raise NotImplementedError

    def _make(self, client: object, **given: Any) -> object:
        self.made.append((client, given))
        return ("client", len(self.made))

    def open_all(self, components: list[str], **options: Any) -> dict[str, Any]:
        return self.open_sharing_client(
            make_url("sharing://"),
            components,
            options,
            package=PACKAGE,
            stores=STORES,
            client_options=("client", "prefix"),
            make_client=self._make,
        )


def test_one_client_for_every_component_and_each_its_share() -> None:
    backend = Sharing()
    opened = backend.open_all(
        ["kv", "state"], client="app", prefix="p_", clock=1, session_ttl=2, max_value_bytes=3
    )
    assert backend.made == [("app", {"prefix": "p_"})]
    kv, state = opened["kv"], opened["state"]
    assert isinstance(kv, Component)
    assert isinstance(state, Component)
    assert kv.client is state.client == ("client", 1)
    assert kv.options == {"clock": 1, "max_value_bytes": 3}
    assert state.options == {"clock": 1, "session_ttl": 2, "max_value_bytes": 3}


def test_no_client_given_is_none() -> None:
    backend = Sharing()
    backend.open_all(["kv"])
    assert backend.made == [(None, {})]


def test_an_option_nothing_takes_is_refused_before_the_client_is_made() -> None:
    backend = Sharing()
    with pytest.raises(ThreadStoreConfigurationError, match="unknown option") as caught:
        backend.open_all(["kv"], session_ttl=2)  # only the state store takes it
    assert "valid: client, clock, max_value_bytes, prefix" in str(caught.value)
    assert backend.made == []
