"""One operation of a :class:`~pai_storage_sql.client.SqlClient`, and the
statements it runs precompiled on the driver connection.

Invariants: a :class:`Statement` is compiled once, for one dialect, and binds
its parameters by name in the order the SQL text takes them (an expanding
``IN`` parameter takes a non-empty sequence; its text is made once per
number of values); an :class:`Operation` runs every statement on the driver
connection of its own SQLAlchemy connection, inside the one transaction the
client began, and announces each to the engine's ``before_cursor_execute``
listeners; it maps no errors itself (the client's error mapping surrounds
every operation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .sqlite_thread import InlineDriver

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .held import Held

__all__ = ["Operation", "Statement"]


class Statement:
    """A SQLAlchemy Core statement compiled once for the dialect of a connection.

    Run by :class:`Operation` directly on the driver connection: the SQL text in
    the driver's paramstyle and its parameters in order, taken by name from a
    mapping (a name the statement bound a value for defaults to that value).
    An expanding ``IN`` parameter takes a non-empty sequence.
    """

    __slots__ = ("_expanding", "_mark", "_names", "_plan", "_texts", "defaults", "text")

    def __init__(self, statement: Any, dialect: Any) -> None:
        compiled = statement.compile(dialect=dialect)
        binds = compiled.binds
        self._names: tuple[str, ...] = tuple(compiled.positiontup or ())
        self.defaults: dict[str, Any] = {n: binds[n].value for n in self._names}
        self._expanding = frozenset(n for n in self._names if binds[n].expanding)
        self._plan = tuple((n, n in self._expanding) for n in self._names)
        self.text: str = compiled.string
        self._texts: dict[tuple[int, ...], str] = {}
        self._mark = "?" if dialect.paramstyle == "qmark" else "%s"

    def bind(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL text and positional parameters for ``params``."""
        defaults = self.defaults
        if not self._expanding:
            try:
                return self.text, [params[n] for n in self._names]
            except KeyError:
                return self.text, [params[n] if n in params else defaults[n] for n in self._names]
        args: list[Any] = []
        sizes: list[int] = []
        for name, expanding in self._plan:
            value = params[name] if name in params else defaults[name]
            if expanding:
                values = value if type(value) is list else list(value)
                if not values:
                    raise ValueError(f"expanding parameter {name} needs at least one value")
                sizes.append(len(values))
                args.extend(values)
            else:
                args.append(value)
        key = tuple(sizes)
        text = self._texts.get(key)
        if text is None:
            text = self.text
            counts = iter(sizes)
            for name, expanding in self._plan:
                if expanding:
                    marks = ", ".join([self._mark] * next(counts))
                    text = text.replace(f"__[POSTCOMPILE_{name}]", marks)
            self._texts[key] = text
        return text, args


class Operation:
    """One write transaction or read snapshot of a :class:`SqlClient`.

    ``conn`` is its SQLAlchemy connection; :meth:`rows`, :meth:`execute` and
    :meth:`executemany` run a precompiled :class:`Statement` on the same
    connection's driver (aiosqlite or asyncmy) without SQLAlchemy's per-statement
    work, inside the same transaction. Driver exceptions are left to the
    client's error mapping around the operation. The engine's SQLAlchemy
    ``before_cursor_execute`` listeners still see every such
    statement (with ``cursor`` and ``context`` ``None``; their return value is
    not used).
    """

    __slots__ = ("conn", "dialect", "driver", "held", "listeners", "sqlite")

    def __init__(
        self, conn: AsyncConnection, driver: Any, sqlite: bool, held: Held | None = None
    ) -> None:
        self.conn = conn
        self.driver = driver
        self.sqlite = sqlite
        self.held = held
        self.dialect = conn.dialect
        events = conn.sync_engine.dispatch.before_cursor_execute
        self.listeners: Any = events if events else None
        """The engine's ``before_cursor_execute`` listeners (``None``: none to call)."""

    @property
    def inline(self) -> bool:
        """Whether this operation runs whole in the database's thread
        (:meth:`SqlClient.run_write`)."""
        return isinstance(self.driver, InlineDriver)

    def announce(self, text: str, args: Any, many: bool) -> None:
        """Tell the engine's listeners (when :attr:`listeners`) of a statement about to run."""
        self.listeners(self.conn.sync_connection, None, text, args, None, many)

    def compile(self, statement: Any) -> Statement:
        return Statement(statement, self.dialect)

    async def rows(self, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """The rows (tuples) of a query."""
        text, args = statement.bind(params)
        if self.listeners is not None:
            self.announce(text, args, False)
        if self.sqlite:
            return cast(list[Any], await self.driver.execute_fetchall(text, args))
        async with self.driver.cursor() as cursor:
            await cursor.execute(text, args)
            return list(await cursor.fetchall())

    async def execute(self, statement: Statement, params: Mapping[str, Any]) -> None:
        """Run a statement that returns no rows."""
        text, args = statement.bind(params)
        if self.listeners is not None:
            self.announce(text, args, False)
        if self.sqlite:
            await self.driver.execute_fetchall(text, args)
            return
        async with self.driver.cursor() as cursor:
            await cursor.execute(text, args)

    async def changed(self, statement: Statement, params: Mapping[str, Any]) -> int:
        """Run a statement that returns no rows; the number of rows it changed."""
        text, args = statement.bind(params)
        if self.listeners is not None:
            self.announce(text, args, False)
        if self.sqlite:
            cursor = await self.driver.execute(text, args)
            return int(cursor.rowcount)
        async with self.driver.cursor() as cursor:
            await cursor.execute(text, args)
            return int(cursor.rowcount)

    async def executemany(self, statement: Statement, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement once per parameter set (MySQL: one multi-row ``INSERT``)."""
        if not params:
            return
        text = statement.text
        rows = [statement.bind(p)[1] for p in params]
        if self.listeners is not None:
            self.announce(text, [tuple(r) for r in rows], True)
        if self.sqlite:
            await self.driver.executemany(text, rows)
            return
        async with self.driver.cursor() as cursor:
            await cursor.executemany(text, rows)

    async def run_text(self, sql: str) -> None:
        """Run one SQL text without parameters or rows (transaction control)."""
        if self.listeners is not None:
            self.announce(sql, (), False)
        if self.sqlite:
            await self.driver.execute_fetchall(sql, ())
            return
        async with self.driver.cursor() as cursor:
            await cursor.execute(sql)

    async def commit(self) -> None:
        """Commit the transaction (begun on the driver, or by SQLAlchemy statements)."""
        if self.conn.in_transaction():
            await self.conn.commit()
        else:
            await self.driver.commit()

    async def rollback(self) -> None:
        """Roll the transaction back, if one is open."""
        if self.conn.in_transaction():
            await self.conn.rollback()
        elif not self.sqlite or self.driver.in_transaction:
            await self.driver.rollback()
