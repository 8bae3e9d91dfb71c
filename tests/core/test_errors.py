"""The error hierarchy: one root, general classes, thread-store classes beneath both."""

from __future__ import annotations

import pytest

import pai_storage
from pai_storage import errors as e

# Each thread-store class and the general class it also belongs to.
THREAD_STORE_CLASSES: list[tuple[type[Exception], type[Exception]]] = [
    (e.ThreadStorePageTokenError, e.PageTokenError),
    (e.ThreadStoreInvariantError, e.InvalidInputError),
    (e.ThreadStoreSerializationError, e.SerializationError),
    (e.ThreadStoreCommitUnknownError, e.OutcomeUnknownError),
    (e.ThreadStoreUnavailableError, e.UnavailableError),
    (e.ThreadStoreConfigurationError, e.ConfigurationError),
]

GENERAL_CLASSES: list[type[Exception]] = [
    e.InvalidInputError,
    e.SerializationError,
    e.UnavailableError,
    e.OutcomeUnknownError,
    e.ConfigurationError,
    e.PageTokenError,
    e.CorruptSnapshotError,
    e.SnapshotTooLargeError,
    e.LockTimeoutError,
    e.ThreadStoreError,
]


@pytest.mark.parametrize("cls", [c for c, _ in THREAD_STORE_CLASSES] + GENERAL_CLASSES)
def test_every_class_derives_from_storage_error(cls: type[Exception]) -> None:
    assert issubclass(cls, e.StorageError)
    with pytest.raises(e.StorageError):
        raise cls("boom")


@pytest.mark.parametrize(("cls", "general"), THREAD_STORE_CLASSES)
def test_thread_store_classes_are_caught_by_both_roots(
    cls: type[Exception], general: type[Exception]
) -> None:
    error = cls("boom")
    assert isinstance(error, e.ThreadStoreError)
    assert isinstance(error, general)
    with pytest.raises(e.ThreadStoreError):
        raise error
    with pytest.raises(general):
        raise cls("again")


@pytest.mark.parametrize("cls", GENERAL_CLASSES[:-1])
def test_general_classes_are_not_thread_store_errors(cls: type[Exception]) -> None:
    # `except ThreadStoreError` keeps catching exactly the thread store's errors.
    assert not issubclass(cls, e.ThreadStoreError)


def test_the_exact_parents() -> None:
    assert e.SerializationError.__bases__ == (e.InvalidInputError,)
    assert e.SnapshotTooLargeError.__bases__ == (e.InvalidInputError,)
    assert e.CorruptSnapshotError.__bases__ == (e.StorageError,)
    assert e.LockTimeoutError.__bases__ == (e.StorageError,)
    assert e.ThreadStoreError.__bases__ == (e.StorageError,)
    assert e.ThreadStoreSerializationError.__bases__ == (
        e.ThreadStoreInvariantError,
        e.SerializationError,
    )
    assert issubclass(e.ThreadStoreSerializationError, e.ThreadStoreInvariantError)


@pytest.mark.parametrize(
    "cls",
    [
        e.InvalidInputError,
        e.SerializationError,
        e.SnapshotTooLargeError,
        e.ThreadStoreInvariantError,
        e.ThreadStoreSerializationError,
    ],
)
def test_invalid_input_is_a_value_error(cls: type[Exception]) -> None:
    with pytest.raises(ValueError, match="bad"):
        raise cls("bad input")


@pytest.mark.parametrize("cls", [e.ThreadStoreSerializationError, e.SerializationError])
def test_serialization_error_names_path_and_reason(cls: type[e.SerializationError]) -> None:
    error = cls.at("metadata.items[3]", "NaN is not JSON")
    assert type(error) is cls
    assert error.path == "metadata.items[3]"
    assert error.reason == "NaN is not JSON"
    assert str(error) == "metadata.items[3]: NaN is not JSON"
    assert str(cls.at("", "NaN is not JSON")) == "<value>: NaN is not JSON"


def test_old_handlers_keep_working() -> None:
    # Code written against the first release: a ThreadStoreError handler and a
    # ValueError handler for invariant errors.
    for cls, _ in THREAD_STORE_CLASSES:
        caught: Exception | None = None
        try:
            raise cls("x")
        except e.ThreadStoreError as err:
            caught = err
        assert type(caught) is cls
    with pytest.raises(e.ThreadStoreInvariantError):
        raise e.ThreadStoreSerializationError.at("p", "r")


def test_every_error_is_exported() -> None:
    names = {name for name in dir(e) if name.endswith("Error") and not name.startswith("_")}
    assert names == set(e.__all__)
    # The top level offers the general classes an application catches; the
    # thread store's own subclasses are imported from pai_storage.errors.
    for name in e.__all__:
        if name.startswith("ThreadStore"):
            assert name not in pai_storage.__all__, name
        else:
            assert getattr(pai_storage, name) is getattr(e, name)


def test_the_module_docstring_draws_the_whole_tree() -> None:
    doc = e.__doc__ or ""
    for name in e.__all__:
        assert name in doc, name
    assert "ConflictResult" in doc
    assert "CommitConflict" not in doc
