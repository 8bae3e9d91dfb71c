"""session_ranges: the index ranges a listing of every session reads, in order."""

from __future__ import annotations

from pai_storage.state import ANONYMOUS_USER, SessionKey, SessionRange, session_ranges


def test_a_first_page_reads_the_anonymous_user_then_below_then_above() -> None:
    assert session_ranges(None) == [
        SessionRange("anonymous", None),
        SessionRange("below", None),
        SessionRange("above", None),
    ]


def test_a_page_after_an_anonymous_session_resumes_inside_its_range() -> None:
    assert session_ranges((None, "s1")) == [
        SessionRange("anonymous", SessionKey(ANONYMOUS_USER, "s1")),
        SessionRange("below", None),
        SessionRange("above", None),
    ]


def test_a_user_below_the_anonymous_key_still_has_the_above_range_to_read() -> None:
    assert session_ranges(("\x01u", "s")) == [
        SessionRange("below", SessionKey("\x01u", "s")),
        SessionRange("above", None),
    ]


def test_a_user_above_the_anonymous_key_is_in_the_last_range() -> None:
    assert session_ranges(("alice", "s")) == [SessionRange("above", SessionKey("alice", "s"))]


def test_the_ranges_follow_the_listing_order() -> None:
    """Every (user, session) falls in exactly one range, and the ranges in
    order list user id None first, then users by code point."""
    users = ["\x01a", "\x1e", ANONYMOUS_USER, " ", "alice", "\U0010ffff"]

    def where(user: str) -> str:
        if user == ANONYMOUS_USER:
            return "anonymous"
        return "below" if user < ANONYMOUS_USER else "above"

    order = [r.users for r in session_ranges(None)]
    listed = sorted(users, key=lambda u: (order.index(where(u)), u))
    assert listed[0] == ANONYMOUS_USER
    assert listed[1:] == sorted(u for u in users if u != ANONYMOUS_USER)
