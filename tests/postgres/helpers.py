"""Helpers of the PostgreSQL backend tests: the server URL and URLs through a fault proxy."""

from __future__ import annotations

import os

from pai_storage import make_url

URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def dsn(url: str = URL) -> str:
    """``url`` as asyncpg takes it (password included: for direct test connections only)."""
    return make_url(url).render(hide_password=False, scheme="postgresql")


def proxied_url(port: int, base: str = URL) -> str:
    """``base`` with its host and port replaced by a loopback proxy's."""
    parsed = make_url(base)
    user = f"{parsed.username}@" if parsed.username else ""
    return f"postgresql://{user}127.0.0.1:{port}{parsed.path}"
