"""The token a child page mints is the codec's token of its position: canonical
JSON of the whole payload (``docs/reads.md``), whatever the thread's instance id
and the page's positions, and a continuation decodes it back to the same bounds.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pai_storage.models import ReadThreadInput, ThreadVersion
from pai_storage.selection import ChildPagePlan, SelectionHelpers, Window

from . import strategies as s

_POSITION = st.integers(min_value=0, max_value=2**63 - 2)


def _plan(helpers: SelectionHelpers, token: str | None = None) -> ChildPagePlan:
    page: dict[str, Any] = {"limit": 2} if token is None else {"limit": 2, "pageToken": token}
    request = ReadThreadInput.model_validate(
        {
            "scopeKey": "scope",
            "threadId": "t",
            "include": {
                "messages": {"type": "page", "view": "raw", "order": "newest", "page": page}
            },
        }
    )
    plan = helpers.plan_read(request).messages
    assert isinstance(plan, ChildPagePlan)
    return plan


@settings(max_examples=200, deadline=None)
@given(
    instance=s.ids,
    anchor=_POSITION,
    lower=_POSITION,
    upper=st.none() | _POSITION,
    last=_POSITION,
)
def test_a_page_token_is_the_codecs_token_of_its_position(
    instance: str, anchor: int, lower: int, upper: int | None, last: int
) -> None:
    helpers = SelectionHelpers("pai-test")
    version = ThreadVersion(thread_instance_id=instance, revision=1)
    window = Window(lower, anchor + 1, "newest", 3, anchor, lower, upper)
    rows = [(last + 2, "a"), (last, "b"), (max(last - 1, 0), "c")]
    token = _plan(helpers).finish(window, rows, version).next_page_token
    assert token is not None
    position = {"i": instance, "a": anchor, "lo": lower, "hi": upper, "c": last}
    payload = helpers.codec.payload(token)
    assert payload["p"] == position
    assert token == helpers.codec.encode("messages", "scope", payload["q"], position)
    blob = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert blob[len(b"pai-test.") : -16] == canonical.encode()
    # A continuation reads the same bounds back.
    again = _plan(helpers, token)
    assert again.is_continuation
    bound = anchor + 1 if upper is None else min(upper, anchor + 1)
    expected = Window(lower, min(bound, last), "newest", 3, anchor, lower, upper)
    assert again.window(version, 0) == expected
