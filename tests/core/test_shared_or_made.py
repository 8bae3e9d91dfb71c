"""SharedClient.shared_or_made: the shared holder (never with options) or a new one."""

from __future__ import annotations

from typing import Any

import pytest

from pai_storage.backend import SharedClient
from pai_storage.errors import ConfigurationError, ThreadStoreConfigurationError


class _Holder(SharedClient[object]):
    def __init__(self, client: object = None, **options: Any) -> None:
        super().__init__(owned=client is None)
        self.client = client
        self.options = options

    def _make(self) -> object:
        return object()

    async def _connect(self, made: object) -> None:
        pass

    async def _disconnect(self, made: object, *, failed: bool) -> None:
        pass


def test_a_shared_holder_is_used_as_it_is() -> None:
    shared = _Holder(prefix="p_")
    assert _Holder.shared_or_made(shared, {}, _Holder) is shared


def test_anything_else_makes_a_holder_with_the_options() -> None:
    app_driver = object()
    made = _Holder.shared_or_made(
        app_driver, {"prefix": "q_"}, lambda **o: _Holder(app_driver, **o)
    )
    assert made.client is app_driver
    assert made.options == {"prefix": "q_"}
    assert _Holder.shared_or_made(None, {}, _Holder).client is None


def test_options_with_a_shared_holder_are_refused_by_name() -> None:
    with pytest.raises(ThreadStoreConfigurationError) as caught:
        _Holder.shared_or_made(_Holder(), {"timeout": 1, "prefix": "p_"}, _Holder)
    assert isinstance(caught.value, ConfigurationError)
    assert "option(s) prefix, timeout cannot be combined with a shared client" in str(caught.value)


async def test_the_holder_is_not_counted_as_used() -> None:
    shared = _Holder()
    _Holder.shared_or_made(shared, {}, _Holder).attach()  # the caller counts itself
    await shared.release()
    assert shared.closed  # one user, released: shared_or_made counted nobody
