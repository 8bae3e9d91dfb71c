"""The top-level ``pai_storage`` is an application's surface, and stays small.

``pai_storage.__all__`` holds at most 80 names: what an application opens,
the store contracts, the records and results it reads, the parts, the
conversation, the conflicts, the errors it catches and the builders. Every
other name lives in a submodule (``pai_storage.models``,
``pai_storage.errors``, ``pai_storage.backend``, ...). A name that left the
top level still resolves there, with a ``DeprecationWarning`` naming its home,
until the next minor release removes it.
"""

from __future__ import annotations

import importlib
import warnings

import pytest

import pai_storage

MAX_PUBLIC_NAMES = 80

# One removed name from each place a removed name can live.
REMOVED = [
    ("CreateMutation", "pai_storage.models"),
    ("VersionCondition", "pai_storage.models"),
    ("ThreadStoreInvariantError", "pai_storage.errors"),
    ("parse_thread", "pai_storage.parsing"),
    ("EXPORT_FORMAT", "pai_storage.transfer"),
    ("LostCallback", "pai_storage.guard"),
    ("public_projection", "pai_storage.store"),
    ("truncate_ms", "pai_storage.backend"),
    ("ThreadAggregate", "pai_storage.backend"),
    ("apply_thread_changes", "pai_storage.backend"),
]


def test_the_top_level_has_at_most_80_names() -> None:
    assert len(pai_storage.__all__) <= MAX_PUBLIC_NAMES, len(pai_storage.__all__)
    assert len(set(pai_storage.__all__)) == len(pai_storage.__all__), "a name is listed twice"


def test_every_public_name_resolves_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in pai_storage.__all__:
            assert getattr(pai_storage, name) is not None, name


def test_a_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec("from pai_storage import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(pai_storage.__all__)


@pytest.mark.parametrize(("name", "home"), REMOVED)
def test_a_removed_name_warns_and_names_its_home(name: str, home: str) -> None:
    assert name not in pai_storage.__all__
    with pytest.warns(DeprecationWarning, match=rf"pai_storage\.{name}\b.*\b{home}\b"):
        value = getattr(pai_storage, name)
    assert value is getattr(importlib.import_module(home), name)


def test_a_removed_name_imported_with_from_warns_at_the_importing_line() -> None:
    with pytest.warns(DeprecationWarning, match="pai_storage.models") as caught:
        from pai_storage import CreateMutation  # noqa: F401
    assert caught[0].filename == __file__


def test_every_removed_name_has_a_home_that_holds_it() -> None:
    moved = pai_storage._moved_names()
    assert not set(moved) & set(pai_storage.__all__)
    for name, home in moved.items():
        assert hasattr(importlib.import_module(home), name), (name, home)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        pai_storage.nosuch  # noqa: B018
