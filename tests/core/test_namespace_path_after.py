"""namespace_path_after: where a listing of namespaces continues past a found one."""

from __future__ import annotations

from pai_storage.backend import namespace_path, namespace_path_after


def test_untruncated_namespace_is_passed_but_not_its_sub_namespaces() -> None:
    after = namespace_path_after(("a",), None)
    assert namespace_path(("a",)) < after  # past the items of ("a",) itself
    assert after <= namespace_path(("a", "")) < namespace_path(("a", "b"))
    assert after == namespace_path_after(("a",), 2)  # shallower than max_depth: the same


def test_truncated_namespace_is_passed_with_everything_under_it() -> None:
    after = namespace_path_after(("a",), 1)
    assert after > namespace_path(("a", "\U0010ffff", "z"))
    assert after <= namespace_path(("a ",))  # the next name at that depth
    assert after == "a "  # U+001F raised to U+0020
    assert namespace_path_after(("a", "b"), 1) == namespace_path_after(("a", "b"), 2)


def test_empty_namespace() -> None:
    assert namespace_path_after((), None) == "\x01"
