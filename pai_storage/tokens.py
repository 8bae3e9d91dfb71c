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
import importlib
import json
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from .errors import ThreadStoreConfigurationError, ThreadStorePageTokenError

__all__ = ["PageTokenCodec", "ScopeDigest", "default_scope_digest", "query_digest"]

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


def _canonical(value: Any) -> bytes:
    return _ENCODE(value).encode()


def _reused_encoder() -> Callable[[Any], str]:
    """:data:`_ENCODE` without its set-up on every call: CPython's C encoder,
    made once, gives the same text (checked here; ``_ENCODE`` itself where
    there is no C encoder or it differs). A page's position is encoded on
    every read, and the set-up cost more than the encoding."""
    make = getattr(json.encoder, "c_make_encoder", None)
    sample = {"p": 3, "a": [None, True, -1.5, 2**63], '\u00e9"\n': {"z": "\ud800", "b": {}}}
    text = r'{"a":[null,true,-1.5,9223372036854775808],"p":3,"\u00e9\"\n":{"b":{},"z":"\ud800"}}'
    try:
        encoder = make(  # type: ignore[misc]
            None,  # no cycle check: positions are flat values the stores build
            json.JSONEncoder().default,
            json.encoder.encode_basestring_ascii,
            None,
            ":",
            ",",
            True,
            False,
            True,
        )
        same = "".join(encoder(sample, 0)) == text
    except Exception:  # absent (None), another signature or behaviour
        return _ENCODE
    if not same:
        return _ENCODE

    def encode(value: Any) -> str:
        return "".join(encoder(value, 0))

    return encode


_encode_position = _reused_encoder()


@lru_cache(maxsize=4096)
def _payload_frame(kind: str, scope: str, query: str) -> tuple[str, str]:
    """The canonical payload of a token around its position, remembered per query.

    Keys sort as ``k, p, q, s, v``: the text is ``{"k":<kind>,"p":`` + the
    canonical position + ``,"q":<query>,"s":<scope>,"v":1}``, exactly
    :func:`_canonical` of the whole payload.
    """
    return (
        f'{{"k":{_ENCODE(kind)},"p":',
        f',"q":{_ENCODE(query)},"s":{_ENCODE(scope)},"v":1}}',
    )


@lru_cache(maxsize=4096)
def default_scope_digest(scope_key: str) -> str:
    """SHA-256 of the JSON-encoded scope key, base64url, 128 bits.

    Remembered for the most recently used scope keys: a page read digests its
    scope once per token.
    """
    return _b64(hashlib.sha256(_canonical(scope_key)).digest()[:16])


def query_digest(query: Any) -> str:
    """A digest of a canonical query description (a JSON-able value).

    A flat query (see :func:`_flat_items`: what the stores' page queries are)
    is remembered by its items, so a repeated query is not encoded again;
    anything else is encoded each time. Both give the digest of the same
    canonical JSON.
    """
    items = _flat_items(query)
    if items is not None:
        return _flat_digest(items)
    return _digest(_canonical(query))


def _flat_items(value: Any) -> tuple[Any, ...] | None:
    """A hashable key of a ``dict`` with string keys whose values are strings,
    integers, booleans, ``None`` or tuples of strings: equal keys encode to the
    same canonical JSON (the value types are part of the key, since ``True == 1``).
    ``None`` for any other value."""
    if type(value) is not dict or not _STR.issuperset(map(type, value)):
        return None
    kinds = tuple(map(type, value.values()))
    if not _FLAT.issuperset(kinds):
        return None
    if tuple in kinds:
        for item in value.values():
            if type(item) is tuple and not all(type(part) is str for part in item):
                return None
    return (*value.items(), kinds)


_FLAT = frozenset({str, int, bool, type(None), tuple})
_STR = frozenset({str})


@lru_cache(maxsize=4096)
def _flat_digest(items: tuple[Any, ...]) -> str:
    return _digest(_canonical(dict(items[:-1])))


@lru_cache(maxsize=4096)
def _digest(canonical: bytes) -> str:
    # Remembered: a thread's reads repeat a handful of queries.
    return _b64(hashlib.sha256(canonical).digest()[:16])


def _small_sha256() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 (``_sha2``, ``_sha256`` before 3.12), else hashlib's.

    Both give the same digests. A MAC copies two states and takes two
    digests; OpenSSL's (behind ``hashlib.sha256``) runs through its generic
    digest layer for each, CPython's small module does not. A page read mints
    its token right after a round trip to the database, when little of either
    is in the processor's caches: there the small module's MAC took 9-14 µs
    less (in ``bench/postgres_bench.py``'s interleaving), though it is slower
    in a tight loop.
    """
    for name in ("_sha2", "_sha256"):
        try:
            made: Callable[[bytes], Any] = importlib.import_module(name).sha256
        except (ImportError, AttributeError):
            continue
        return made
    return hashlib.sha256


_sha256 = _small_sha256()


def _hmac_states(key: bytes, sha256: Callable[[bytes], Any] = _sha256) -> tuple[Any, Any]:
    """SHA-256 states after the inner and the outer padded key of HMAC (RFC 2104)."""
    if len(key) > _SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_SHA256_BLOCK, b"\0")
    return sha256(key.translate(_IPAD)), sha256(key.translate(_OPAD))


def _parse(payload: str | bytes) -> dict[str, Any] | None:
    """A token's JSON payload, or ``None`` when it is not a JSON object."""
    try:
        found = json.loads(payload)
    except (ValueError, RecursionError):  # bad UTF-8, bad JSON, integers too long
        raise ThreadStorePageTokenError("page token is malformed") from None
    return found if isinstance(found, dict) else None


_MINTED_KEPT = 1024
"""How many recently minted (and verified) tokens a codec remembers."""
_KNOWN_LENGTH = 1024
"""The longest token a codec remembers having verified (its own tokens are
shorter unless a thread id is long): a caller's tokens cost bounded memory."""
_SHA256_BLOCK = 64
_MAC_BYTES = 16
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


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
        self._inner, self._outer = _hmac_states(key)
        self._inner.update(self._head)  # every MAC starts with it
        self._minted: dict[str, str] = {}  # payload -> token
        self._known: dict[str, str | bytes] = {}  # token minted or verified -> payload

    def _mac(self, payload: bytes) -> bytes:
        # HMAC-SHA256 of prefix, dot and payload (hmac.digest gives the same bytes),
        # from the key's two padded states hashed once (the inner one with the
        # prefix and dot), here: every page pays for two state copies instead
        # of the key schedule.
        inner = self._inner.copy()
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        digest: bytes = outer.digest()
        return digest[:_MAC_BYTES]

    def encode(self, kind: str, scope_key: str, query: str, position: dict[str, Any]) -> str:
        """Mint a token for page ``kind`` of ``query`` in ``scope_key`` at ``position``.

        Tokens are deterministic (a token is a function of its payload text),
        and the most recent ones are remembered by that text: a page read
        again unchanged does not compute its token's MAC again. They are
        also remembered by the token: :meth:`decode` of a token this codec
        has just minted (the next page of a listing) parses and checks its
        payload without base64 or MAC.
        """
        head, tail = _payload_frame(kind, self.scope_digest(scope_key), query)
        payload = f"{head}{_encode_position(position)}{tail}"
        token = self._minted.get(payload)
        if token is None:
            data = payload.encode()
            token = _b64(self._head + data + self._mac(data))
            self._remember(token, payload)
            self._minted[payload] = token
        return token

    def _remember(self, token: str, payload: str | bytes) -> None:
        """Remember ``token`` as authentic, with its payload (bounded: both
        memories start over when either is full)."""
        if len(self._known) >= _MINTED_KEPT or len(self._minted) >= _MINTED_KEPT:
            # Atomic clears: safe when several threads mint and decode.
            self._minted.clear()
            self._known.clear()
        self._known[token] = payload

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
        fields are the caller's to validate.

        A token this codec minted, or verified and accepted, recently is known
        by its text: only its payload is parsed and checked again (no base64,
        no MAC).
        """
        body = self._known.get(token) if type(token) is str else None
        known = body is not None
        if body is None:
            body, mac = self._split(token)
            if not hmac.compare_digest(mac, self._mac(body)):
                raise ThreadStorePageTokenError("page token failed its integrity check (tampered)")
        position = self._position(body, kind, scope_key, query)
        if not known and len(token) <= _KNOWN_LENGTH:
            self._remember(token, body)
        return position

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
        return position
