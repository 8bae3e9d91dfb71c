"""StoreModel.trusted: the hot-path constructor gives the same frozen model as validation."""

from datetime import UTC, datetime

import pydantic
import pytest

from pai_storage import Item


def test_trusted_model_equals_the_validated_one() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    fields = {
        "namespace": ("a", "b"),
        "key": "k",
        "value": {"secret-word": 1, "a": [1.0, None]},
        "version": 3,
        "created_at": now,
        "updated_at": now,
        "expires_at": None,
        "ttl": None,
    }
    validated = Item(**fields)
    trusted = Item.trusted(dict(fields))
    assert trusted == validated
    assert trusted.to_json() == validated.to_json()
    assert repr(trusted) == repr(validated)
    assert "secret-word" not in repr(trusted)  # values never shown
    with pytest.raises(pydantic.ValidationError):
        trusted.key = "other"  # type: ignore[misc]
