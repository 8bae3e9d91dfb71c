"""One place per backend where driver exceptions become the contract's errors.

A backend writes one function that translates any exception its driver can
raise into a pai-storage error, and wraps every block that talks to the
database in :func:`map_errors` (the shape of httpx's
``map_httpcore_exceptions``) instead of repeating ``try``/``except`` blocks::

    with map_errors(lambda exc: translate(exc, "read")):
        rows = await conn.fetch(...)

Errors that already belong to the contract pass through unchanged; anything
else is translated and chained (``raise ... from exc``), so the original stays
reachable as ``err.__cause__``; a ``translate`` that returns the exception
itself lets it through as it is. Cancellation and other ``BaseException``\\ s
are never translated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .errors import StorageError

__all__ = ["map_errors"]


@contextmanager
def map_errors(translate: Callable[[Exception], Exception]) -> Iterator[None]:
    """Translate every non-contract exception raised in the block with ``translate``
    (an exception it returns as it is goes through unchanged)."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        translated = translate(exc)
        if translated is exc:
            raise
        raise translated from exc
