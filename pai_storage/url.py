"""Store URLs: parsed once, immutable, never showing their password."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, quote, quote_plus, unquote, urlsplit

from .errors import ThreadStoreConfigurationError

__all__ = ["StoreURL", "make_url", "redact"]


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL such as ``postgresql+asyncpg://user:pw@host:5432/db``.

    ``str()`` and ``repr()`` mask the password; :meth:`render` with
    ``hide_password=False`` gives the full string for the driver.
    """

    scheme: str
    driver: str | None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    host: str | None = None
    port: int | None = None
    path: str = ""
    query: tuple[tuple[str, str], ...] = ()
    _raw: SplitResult | None = field(default=None, repr=False, compare=False)

    @property
    def full_scheme(self) -> str:
        return f"{self.scheme}+{self.driver}" if self.driver else self.scheme

    @property
    def database(self) -> str | None:
        name = self.path.lstrip("/")
        return name or None

    def render(self, *, hide_password: bool = True, scheme: str | None = None) -> str:
        userinfo = ""
        if self.username is not None:
            userinfo = quote(self.username, safe="")
            if self.password is not None:
                userinfo += ":" + ("***" if hide_password else quote(self.password, safe=""))
            userinfo += "@"
        host = self.host or ""
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        port = f":{self.port}" if self.port is not None else ""
        netloc = userinfo + host + port
        raw_netloc = self._raw.netloc if self._raw else netloc
        if "," in raw_netloc.rsplit("@", 1)[-1]:  # multi-host seed lists are kept verbatim
            netloc = raw_netloc.rsplit("@", 1)[-1]
            netloc = userinfo + netloc
        query = "&".join(
            f"{quote(k, safe='')}={'***' if hide_password and _is_secret(k) else quote(v, safe='')}"
            for k, v in self.query
        )
        return f"{scheme or self.full_scheme}://{netloc}{self.path}" + (
            f"?{query}" if query else ""
        )

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"StoreURL({self.render()!r})"


_SECRET_WORDS = ("password", "passwd", "secret", "token", "authmechanismproperties")


def _is_secret(query_key: str) -> bool:
    """Query options that carry credentials (``password=``, ``sslpassword=``, ...)."""
    key = query_key.lower()
    return any(word in key for word in _SECRET_WORDS)


def redact(text: str, url: StoreURL | None) -> str:
    """Remove ``url``'s secrets from ``text``: the password and credential query values.

    Both the raw and the percent-encoded forms are replaced.
    """
    if url is None:
        return text
    secrets = [url.password] if url.password else []
    secrets += [v for k, v in url.query if v and _is_secret(k)]
    for secret in secrets:
        for form in {secret, quote(secret, safe=""), quote_plus(secret)}:
            text = text.replace(form, "***")
    return text


def make_url(url: str | StoreURL) -> StoreURL:
    """Parse ``url``; a malformed one raises :class:`ThreadStoreConfigurationError`.

    The error never contains the password.
    """
    if isinstance(url, StoreURL):
        return url
    if not isinstance(url, str) or "://" not in url:
        raise ThreadStoreConfigurationError(
            "a store URL looks like 'scheme://...', e.g. 'memory://' or 'postgresql://user@host/db'"
        )
    try:
        parts = urlsplit(url)
        scheme, _, driver = parts.scheme.lower().partition("+")
        multi_host = "," in parts.netloc.rsplit("@", 1)[-1]
        port = None if multi_host else parts.port
        hostname = None if multi_host else parts.hostname
        if multi_host:
            hostname = parts.netloc.rsplit("@", 1)[-1]
        username = unquote(parts.username) if parts.username is not None else None
        password = unquote(parts.password) if parts.password is not None else None
    except ValueError:
        raise ThreadStoreConfigurationError(
            "the store URL is malformed (check the host and port)"
        ) from None
    if not scheme:
        raise ThreadStoreConfigurationError("the store URL has no scheme")
    if scheme == "sqlite" and parts.netloc:
        # SQLAlchemy reads sqlite://foo.db as host "foo.db" and no path: a private
        # in-memory database, nothing written to any file. Never that by accident.
        raise ThreadStoreConfigurationError(
            f"a SQLite URL has no host part, but '{scheme}://' is followed by "
            f"{hostname or 'one'!r}: that would open a private in-memory database and "
            "write nothing to any file. Write a relative path as sqlite:///foo.db "
            "(three slashes), an absolute one as sqlite:////abs/path.db (four), or "
            "sqlite:///:memory: for an in-memory database"
        )
    return StoreURL(
        scheme=scheme,
        driver=driver or None,
        username=username,
        password=password,
        host=hostname,
        port=port,
        path=parts.path,
        query=tuple(parse_qsl(parts.query, keep_blank_values=True)),
        _raw=parts,
    )
