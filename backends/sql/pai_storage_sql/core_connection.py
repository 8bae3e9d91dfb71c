"""SQLAlchemy Core statements of the runtime stores, run on the driver connection.

:class:`CoreConnection` is what a runtime store's operation gets on SQLite
engines the client made (:meth:`SqlClient.connection
<pai_storage_sql.client.SqlClient.connection>`): ``execute`` of a Core
statement compiles it once per statement object and set of parameter names,
with SQLAlchemy's public API only (``statement.compile``, the bind and result
processors of the column types), and runs it in one trip on the driver.

Invariants: the compiled form is kept while the statement object lives (a
weak-keyed cache of the client's), so a store that builds its statements once
compiles each once; values are bound and rows read with the same processors
SQLAlchemy's own execution would use, so a row reads the same either way;
what the prepared path does not cover (``RETURNING``, Python-side defaults,
an insert that gives an auto-increment key or inserts several rows with one,
text, a statement without a cache key) runs through SQLAlchemy's connection
in the same transaction, or, inside the database thread, raises instead of
waiting on the event loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .operation import Operation

__all__ = ["CoreConnection", "CoreResult", "value_rows"]


class _Prepared:
    """A Core statement compiled for one dialect (``statement.compile``), and what
    binding its values and reading its rows need, from SQLAlchemy's public API."""

    __slots__ = (
        "compiled",
        "expands",
        "keys",
        "lastrowid_key",
        "positions",
        "processors",
        "row_processors",
    )

    @classmethod
    def make(cls, statement: Any, dialect: Any, keys: list[str], many: bool) -> _Prepared | None:
        """The prepared form, or ``None`` for what :class:`CoreConnection` leaves
        to SQLAlchemy."""
        from sqlalchemy.sql import ClauseElement

        if not isinstance(statement, ClauseElement):
            return None
        statement = cast(Any, statement)
        compiled: Any = statement.compile(dialect=dialect, column_keys=keys, for_executemany=many)
        dml = compiled.isinsert or compiled.isupdate or compiled.isdelete
        # A query is a statement with selected columns (not text).
        columns = None if dml else getattr(statement, "selected_columns", None)
        if (
            not compiled.positional
            or (not dml and columns is None)
            or compiled.effective_returning
            or compiled.insert_prefetch
            or compiled.update_prefetch
            or compiled.schema_translate_map
        ):
            return None
        prepared = cls(compiled, dialect, [] if columns is None else list(columns))
        if compiled.isinsert and statement.table.autoincrement_column is not None:
            # The key comes back as the driver's lastrowid, as SQLAlchemy takes it;
            # a key given in the statement or one of several columns: SQLAlchemy.
            if not compiled.postfetch_lastrowid or len(statement.table.primary_key) != 1:
                return None
            prepared.lastrowid_key = True
        return prepared

    def __init__(self, compiled: Any, dialect: Any, columns: list[Any]) -> None:
        self.compiled = compiled
        self.lastrowid_key = False
        self.expands = bool(compiled.literal_execute_params or compiled.post_compile_params)
        self.positions: tuple[str, ...] = tuple(compiled.positiontup or ())
        processors = {
            name: bind.type.dialect_impl(dialect).bind_processor(dialect)
            for name, bind in compiled.binds.items()
        }
        self.processors: Mapping[str, Any] = {n: p for n, p in processors.items() if p}
        self.keys: list[str] | None = [c.key for c in columns] if columns else None
        results = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
        self.row_processors: tuple[tuple[int, Any], ...] = tuple(
            (i, process) for i, process in enumerate(results) if process is not None
        )


class CoreResult:
    """The result of a Core statement run on the driver: its rows (SQLAlchemy
    ``Row`` objects, by position, name and attribute; or :meth:`value_rows`),
    ``rowcount`` and, for an insert into a table keyed by an auto-increment
    column, ``inserted_primary_key``."""

    __slots__ = ("_prepared", "_result", "_rows", "inserted_primary_key", "rowcount")

    def __init__(
        self,
        rows: list[Any] | None,
        rowcount: int,
        inserted_primary_key: tuple[Any, ...] | None = None,
        prepared: _Prepared | None = None,
    ) -> None:
        self._rows = rows
        self._prepared = prepared
        self._result: Any = None
        self.rowcount = rowcount
        self.inserted_primary_key = inserted_primary_key

    def value_rows(self) -> list[Any]:
        """The rows as sequences of their values (the columns' result processors
        applied), without building SQLAlchemy ``Row`` objects: for a caller that
        reads rows by position (see :func:`value_rows`)."""
        rows = self._rows or []
        prepared = self._prepared
        if prepared is None or not prepared.row_processors:
            return rows
        processors = prepared.row_processors
        out = []
        for row in rows:
            values = list(row)
            for i, process in processors:
                values[i] = process(values[i])
            out.append(values)
        return out

    def _rows_result(self, name: str) -> Any:
        if self._result is None:
            if self._prepared is None or self._prepared.keys is None:
                raise AttributeError(f"the result of a statement without rows has no {name!r}")
            from sqlalchemy.engine import IteratorResult
            from sqlalchemy.engine.result import SimpleResultMetaData

            rows = [tuple(row) for row in self.value_rows()]
            self._result = IteratorResult(SimpleResultMetaData(self._prepared.keys), iter(rows))
        return self._result

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows_result("__iter__"))

    def __getattr__(self, name: str) -> Any:
        # first(), one(), all(), scalar(), scalar_one(), ... of SQLAlchemy's Result.
        return getattr(self._rows_result(name), name)


def value_rows(result: Any) -> Iterable[Any]:
    """The rows of ``result`` (a :class:`CoreResult` or SQLAlchemy's result) by
    position: plain sequences from a :class:`CoreResult`, SQLAlchemy's ``Row``
    objects otherwise."""
    if isinstance(result, CoreResult):
        return result.value_rows()
    return cast(Iterable[Any], result)


class CoreConnection:
    """The connection of one runtime-store operation on SQLite engines the client made.

    ``execute(statement)`` of a SQLAlchemy Core statement compiles it once per
    shape (SQLAlchemy's cache key), binds its values with SQLAlchemy's
    processors and runs it on the driver connection in one trip, inside the
    operation's transaction; its rows come back as SQLAlchemy ``Row`` objects
    with the columns' result processors applied. What this does not cover
    (``RETURNING``, Python-side column defaults, an insert that gives an
    auto-increment key or inserts several rows with one, text, a statement
    without a cache key) runs through SQLAlchemy's connection, in the same
    transaction. Everything else is the ``AsyncConnection``'s.
    """

    __slots__ = ("_cache", "_op")

    def __init__(self, op: Operation, cache: MutableMapping[Any, Any]) -> None:
        self._op = op
        self._cache = cache

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._op.conn, name)
        if self._op.inline and inspect.iscoroutinefunction(found):
            raise RuntimeError(
                f"AsyncConnection.{name} needs SQLAlchemy's execution layer, which cannot "
                "run in the database thread"
            )
        return found

    async def rollback(self) -> None:
        """Roll the operation's transaction back (nothing it wrote is applied)."""
        await self._op.rollback()

    def _prepare(
        self, statement: Any, given: Sequence[Mapping[str, Any]]
    ) -> tuple[_Prepared, list[dict[str, Any]]] | None:
        """The statement's compiled form (compiled once per statement object and
        set of parameter names; the client keeps it while the statement lives)
        and its parameter values for each mapping of ``given`` (over the bound
        ones; one set when ``given`` is empty), or ``None`` when SQLAlchemy
        runs it."""
        many = len(given) > 1
        keys = tuple(sorted(given[0])) if given else ()
        try:
            shapes = self._cache.get(statement)
        except TypeError:  # not weakly referable: not a Core statement
            return None
        if shapes is None:
            shapes = self._cache[statement] = {}
        shape = (keys, many)
        if shape in shapes:
            prepared = shapes[shape]
        else:
            prepared = shapes[shape] = _Prepared.make(statement, self._op.dialect, list(keys), many)
        if prepared is None or (
            many and (prepared.expands or prepared.keys is not None or prepared.lastrowid_key)
        ):
            return None
        compiled = prepared.compiled
        sets = [
            compiled.construct_params(p, escape_names=False)
            for p in given or [None]  # type: ignore[list-item]
        ]
        return prepared, sets

    async def execute(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        """Run ``statement`` with no parameters, one mapping of them, or a list of
        mappings (``executemany``) on the driver (see the class)."""
        prepared = None
        if not options:
            if parameters is None:
                prepared = self._prepare(statement, [])
            elif isinstance(parameters, Mapping):
                prepared = self._prepare(statement, [parameters])
            elif isinstance(parameters, list) and parameters:
                prepared = self._prepare(statement, parameters)
        if prepared is None:
            if self._op.inline:  # SQLAlchemy's asyncio layer waits on the event loop
                raise RuntimeError(
                    f"{type(statement).__name__} needs SQLAlchemy's execution layer, which "
                    "cannot run in the database thread"
                )
            return await self._op.conn.execute(statement, parameters, **options)
        entry, sets = prepared
        compiled = entry.compiled
        processors = entry.processors
        positions = entry.positions
        op = self._op
        if len(sets) > 1:
            text = compiled.string
            rows = [
                [processors[name](p[name]) if name in processors else p[name] for name in positions]
                for p in sets
            ]
            if op.listeners is not None:
                op.announce(text, rows, True)
            cursor = await op.driver.executemany(text, rows)
            return CoreResult(None, cursor.rowcount)
        params = sets[0]
        text = compiled.string
        if entry.expands:
            expanded = compiled.construct_expanded_state(params, escape_names=False)
            text = expanded.statement
            positions = expanded.positiontup
            params = expanded.parameters
            processors = {**processors, **expanded.processors}
        args = [
            processors[name](params[name]) if name in processors else params[name]
            for name in positions
        ]
        if op.listeners is not None:
            op.announce(text, args, False)
        if entry.keys is None:
            cursor = await op.driver.execute(text, args)
            key = (cursor.lastrowid,) if entry.lastrowid_key else None
            return CoreResult(None, cursor.rowcount, key)
        rows = await op.driver.execute_fetchall(text, args)
        return CoreResult(rows, -1, None, entry)
