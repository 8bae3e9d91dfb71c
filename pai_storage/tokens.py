"""The page-token codec: opaque, scope-bound, query-bound, tamper-evident.

A token is one base64url string (no padding) of ``<prefix>.<payload><mac>``:
the payload is canonical JSON, the mac the first 16 bytes of an HMAC-SHA256 of
prefix, dot and payload. Tokens are not secret (anyone can base64-decode one)
but any edit is detected, and they cannot widen authority:
every token records a digest of its scope key and of its complete query, and
the store re-checks both against the request that carries it.

The payload holds only positions and digests, never record contents.

Without a secret the MAC key is derived from the public prefix, so anyone who
reads this code can mint a token with any contents: set ``token_secret`` in
production. Either way a decoded token is only ever a *position*: the store
checks every field's type and range before using it (see
:mod:`pai_storage.selection`), and anything that is not a well-formed token of
this store -- non-ASCII text, a lone surrogate, bad base64, bad JSON, a
truncation -- raises :class:`ThreadStorePageTokenError`, never another
exception.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from functools import lru_cache
from json.encoder import encode_basestring_ascii
from typing import Any

from .errors import ThreadStoreConfigurationError, ThreadStorePageTokenError
from .frozen import freeze

__all__ = ["PageTokenCodec", "ScopeDigest", "default_scope_digest", "json_text", "query_digest"]

ScopeDigest = Callable[[str], str]
"""Maps a scope key to a short, deterministic, stable digest."""


_B64URL = re.compile(r"[A-Za-z0-9_-]*\Z")
_KIND = re.compile(r"[A-Za-z]{1,32}\Z")


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _b64(data: bytes) -> str:
    # base64.urlsafe_b64encode without its two Python-level calls.
    return binascii.b2a_base64(data, newline=False).translate(_URLSAFE).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode


json_text = encode_basestring_ascii
"""A string as canonical JSON text (what the token codec's encoder makes of it)."""


def _canonical(value: Any) -> bytes:
    return _ENCODE(value).encode()


@lru_cache(maxsize=4096)
def default_scope_digest(scope_key: str) -> str:
    """SHA-256 of the JSON-encoded scope key, base64url, 128 bits."""
    return _b64(hashlib.sha256(_canonical(scope_key)).digest()[:16])


def query_digest(query: Any) -> str:
    """A digest of a canonical query description (a JSON-able value)."""
    return _b64(hashlib.sha256(_canonical(query)).digest()[:16])


def _parse(payload: str | bytes) -> dict[str, Any] | None:
    """A token's JSON payload, or ``None`` when it is not a JSON object."""
    try:
        found = json.loads(payload)
    except (ValueError, RecursionError):  # bad UTF-8, bad JSON, integers too long
        raise ThreadStorePageTokenError("page token is malformed") from None
    return found if isinstance(found, dict) else None


_MAC_BYTES = 16
_VERIFIED_TOKENS = 1024
"""How many verified tokens a codec remembers (a deep page is usually followed
by the next one, and a client retrying a page sends the same token)."""


class PageTokenCodec:
    """Encode and verify page tokens for one provider.

    .. warning::
       Set ``secret`` (the store option ``token_secret``) in production.
       Without it the key is derived from the public ``prefix``: tokens still
       detect accidental edits, but anyone can forge one. A forged token can
       only name a position in a query its bearer may already run (scope and
       query are re-checked on every request), and every decoded field is
       validated, but it is not proof that this store issued it.

    Parameters
    ----------
    prefix:
        Distinguishes this provider's tokens (``"pai-memory"``); a token minted
        with another prefix is rejected.
    secret:
        Non-empty ``bytes``, the key of the integrity check. A value of another
        type (a ``str`` included) or empty raises
        :class:`ThreadStoreConfigurationError` here, when the store is made.
    scope_digest:
        The scope binding; the default is :func:`default_scope_digest`.
    """

    def __init__(
        self,
        prefix: str = "pai",
        *,
        secret: bytes | None = None,
        scope_digest: ScopeDigest = default_scope_digest,
    ) -> None:
        if type(prefix) is not str or not _B64URL.match(prefix) or not prefix:
            raise ThreadStoreConfigurationError(
                "page token prefix must be non-empty letters, digits, '-' or '_' (no '.')"
            )
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            what = "empty bytes" if isinstance(secret, bytes) else type(secret).__qualname__
            raise ThreadStoreConfigurationError(
                f"option token_secret must be non-empty bytes, not {what} "
                "(encode a text secret first, e.g. secret.encode())"
            )
        self.prefix = prefix
        self.scope_digest = scope_digest
        key = secret if secret is not None else hashlib.sha256(prefix.encode()).digest()
        self._head = f"{prefix}.".encode()
        self._key = key
        # A token's position is a pure function of (token, kind, scope, query)
        # and the key, so a verified one is remembered; failures are not.
        self._verified = lru_cache(maxsize=_VERIFIED_TOKENS)(self._verify)

    def _mac(self, payload: bytes) -> bytes:
        """The first 16 bytes of the HMAC-SHA256 of prefix, dot and payload."""
        return hmac.digest(self._key, self._head + payload, "sha256")[:_MAC_BYTES]

    def encode(self, kind: str, scope_key: str, query: str, position: dict[str, Any]) -> str:
        """Mint a token for page ``kind`` of ``query`` in ``scope_key`` at ``position``.

        Tokens are deterministic: a token is a function of its payload.
        """
        return self.encode_json(kind, scope_key, query, _ENCODE(position))

    def encode_json(self, kind: str, scope_key: str, query: str, position: str) -> str:
        """:meth:`encode` of a position given as its canonical JSON text (keys
        sorted, no spaces, ASCII: what :meth:`encode` makes of a ``dict``)."""
        # The payload's canonical JSON, keys in order; the texts as json encodes them.
        data = (
            f'{{"k":{json_text(kind)},"p":{position},"q":{json_text(query)},'
            f'"s":{json_text(self.scope_digest(scope_key))},"v":1}}'
        ).encode()
        return _b64(self._head + data + self._mac(data))

    def payload(self, token: str) -> dict[str, Any]:
        """The JSON payload of a token of this codec's prefix, *not* verified.

        Tokens are not secret: this is what anyone can read from one (kind,
        scope and query digests, position). For tests and diagnostics; a store
        uses :meth:`decode`. Raises :class:`ThreadStorePageTokenError` when
        ``token`` is not of this shape.
        """
        payload = _parse(self._split(token)[0])
        if payload is None:
            raise ThreadStorePageTokenError("page token is malformed")
        return payload

    def _split(self, token: str) -> tuple[bytes, bytes]:
        """``(payload, mac)`` of a token of this codec's prefix."""
        if type(token) is not str:
            raise ThreadStorePageTokenError("page token must be a string")
        # Only base64url text can be a token; checking first keeps non-ASCII
        # text and lone surrogates away from the decoder.
        if not token or not _B64URL.match(token):
            raise ThreadStorePageTokenError("page token is malformed")
        try:
            blob = _unb64(token)
        except (binascii.Error, ValueError):
            raise ThreadStorePageTokenError("page token is malformed") from None
        if _b64(blob) != token:  # one spelling: no stray bits in the last character
            raise ThreadStorePageTokenError("page token is malformed")
        if not blob.startswith(self._head):
            raise ThreadStorePageTokenError("page token is malformed or from another store")
        if len(blob) <= len(self._head) + _MAC_BYTES:
            raise ThreadStorePageTokenError("page token is malformed")
        return blob[len(self._head) : -_MAC_BYTES], blob[-_MAC_BYTES:]

    def decode(self, token: str, kind: str, scope_key: str, query: str) -> dict[str, Any]:
        """Verify ``token`` for this kind, scope and query; return its position.

        Raises :class:`ThreadStorePageTokenError` for anything but a token this
        codec minted for exactly this kind, scope and query. The position's
        fields are the caller's to validate; it is read-only (a
        :class:`~pai_storage.frozen.FrozenDict`), shared by every decode of the
        same token: the last 1,024 verified tokens are remembered.
        """
        if type(token) is not str:
            raise ThreadStorePageTokenError("page token must be a string")
        return self._verified(token, kind, scope_key, query)

    def _verify(self, token: str, kind: str, scope_key: str, query: str) -> dict[str, Any]:
        body, mac = self._split(token)
        if not hmac.compare_digest(mac, self._mac(body)):
            raise ThreadStorePageTokenError("page token failed its integrity check (tampered)")
        return self._position(body, kind, scope_key, query)

    def _position(self, body: str | bytes, kind: str, scope_key: str, query: str) -> dict[str, Any]:
        """The position in a verified token's payload, once it is checked to be
        of this kind, scope and query."""
        payload = _parse(body)
        if payload is None or payload.get("v") != 1:
            raise ThreadStorePageTokenError("page token has an unknown format version")
        token_kind = payload.get("k")
        if token_kind != kind:
            # Name the token's kind only when it looks like one: never echo arbitrary text.
            named = (
                f"a {token_kind} page"
                if type(token_kind) is str and _KIND.match(token_kind)
                else "another kind of page"
            )
            raise ThreadStorePageTokenError(f"page token belongs to {named}, not {kind}")
        if payload.get("s") != self.scope_digest(scope_key):
            raise ThreadStorePageTokenError("page token belongs to another scope")
        if payload.get("q") != query:
            raise ThreadStorePageTokenError(
                "page token belongs to another query: a continuation must repeat the same "
                "selection, filters, order and bounds (only limit may change)"
            )
        position = payload.get("p")
        if not isinstance(position, dict):
            raise ThreadStorePageTokenError("page token is malformed")
        frozen: dict[str, Any] = freeze(position)
        return frozen
