"""The engines of a :class:`~pai_storage_sql.client.SqlClient`, made per dialect.

SQLite (aiosqlite): the file turned to the WAL journal once, when the client
connects (:func:`turn_to_wal`); ``busy_timeout`` and ``foreign_keys=ON`` on
every connection, the driver's own transactions off (the client begins them);
one writer engine (one connection the client holds, one overflow) and one
reader engine (``pool_size`` held, one overflow); a ``:memory:`` database is
one connection (``StaticPool``) that reads and writes take in turn under one
lock. MySQL / MariaDB (asyncmy or aiomysql): one pool at ``REPEATABLE READ``
with ``charset=utf8mb4``. An application's engine is used through a proxy of
its own (same pool) that carries the client's settings.

Invariants: nothing here changes an application's engine; a URL query
parameter the driver's ``connect()`` does not take is refused here, by name,
before any connection; an application's MySQL engine must connect with
``utf8mb4``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from pai_storage.backend import StoreURL
from pai_storage.errors import ThreadStoreConfigurationError

from .errors import Phase, is_busy
from .held import Held
from .sqlite_thread import thread_executor

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = [
    "MYSQL_SCHEMES",
    "SQLITE_SCHEMES",
    "Dialect",
    "Engines",
    "check_driver_options",
    "check_engine",
    "check_given_mysql",
    "check_int",
    "check_seconds",
    "given_engines",
    "mysql_engines",
    "sqlite_engines",
    "turn_to_wal",
]

Dialect = Literal["sqlite", "mysql"]

SQLITE_SCHEMES = {"sqlite": ("aiosqlite",)}
"""URL schemes of SQLite and the drivers each takes."""
MYSQL_SCHEMES = {"mysql": ("asyncmy", "aiomysql"), "mariadb": ("asyncmy", "aiomysql")}
"""URL schemes of MySQL / MariaDB and the drivers each takes."""

_ACCEPTED_CLIENTS = (
    "a SQLAlchemy AsyncEngine (sqlite+aiosqlite, mysql+asyncmy or mysql+aiomysql) "
    "or a pai_storage_sql SqlClient"
)


@dataclass(slots=True)
class Engines:
    """The connected engines: ``writer`` and ``reader`` are the same engine on MySQL
    and for an in-memory SQLite database."""

    writer: AsyncEngine
    reader: AsyncEngine
    lock: asyncio.Lock | None
    """Serializes every operation of an in-memory SQLite database (one connection)."""
    held_writer: Held | None = None
    """SQLite engines the client made: the connections its writes keep checked out."""
    held_reader: Held | None = None
    """The same for reads (the writer's for an in-memory database)."""
    executor: ThreadPoolExecutor | None = None
    """SQLite engines the client made: the threads operations run whole in
    (one per held connection, so each connection is used by one at a time)."""


def sqlite_engines(path: str, *, memory: bool, busy_timeout: float, pool_size: int) -> Engines:
    """New SQLite engines for the database at ``path`` (``":memory:"``: ``memory``)."""
    from sqlalchemy import event
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import StaticPool

    sa_url = URL.create("sqlite+aiosqlite", database=path)
    # An operation may run whole in a thread of the client's executor,
    # on the connection's sqlite3 connection (see SqlClient.run_write).
    connect_args = {"timeout": busy_timeout, "check_same_thread": False}
    if memory:
        engine = create_async_engine(sa_url, poolclass=StaticPool, connect_args=connect_args)
        _sqlite_hooks(engine, event, busy_timeout)
        held = Held(engine, 1)
        return Engines(engine, engine, asyncio.Lock(), held, held, thread_executor(1))
    # Each operation ends its own transaction (commit, or rollback on
    # close), so the pool's own rollback on return would only repeat it.
    # The client's operations keep their connections checked out (Held:
    # one writer, pool_size readers); one overflow connection serves a
    # direct use of the engines meanwhile.
    writer = create_async_engine(
        sa_url,
        pool_size=1,
        max_overflow=1,
        pool_timeout=None,
        pool_reset_on_return=None,
        connect_args=connect_args,
    )
    reader = create_async_engine(
        sa_url,
        pool_size=pool_size,
        max_overflow=1,
        pool_timeout=None,
        pool_reset_on_return=None,
        connect_args=connect_args,
    )
    _sqlite_hooks(writer, event, busy_timeout)
    _sqlite_hooks(reader, event, busy_timeout)
    held_writer, held_reader = Held(writer, 1), Held(reader, pool_size)
    executor = thread_executor(1 + pool_size)
    return Engines(writer, reader, None, held_writer, held_reader, executor)


def mysql_engines(url: StoreURL, driver: str, *, pool_size: int, connect_timeout: float) -> Engines:
    """A new MySQL / MariaDB engine (one pool for reads and writes) for ``url``."""
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import create_async_engine

    query = dict(url.query)
    query.setdefault("charset", "utf8mb4")
    sa_url = URL.create(
        f"mysql+{driver}",
        username=url.username,
        password=url.password,
        host=url.host or "127.0.0.1",
        port=url.port,
        database=url.database,
        query=query,
    )
    # The driver's connect() arguments, as SQLAlchemy's dialect makes them.
    _, params = sa_url.get_dialect()().create_connect_args(sa_url)
    check_driver_options(params, driver)
    engine = create_async_engine(
        sa_url,
        pool_size=pool_size,
        max_overflow=0,
        pool_recycle=3600,
        isolation_level="REPEATABLE READ",
        async_creator=_bounded_connect(params, driver, connect_timeout),
    )
    return Engines(engine, engine, None)


def _bounded_connect(
    params: Mapping[str, Any], driver: str, timeout: float
) -> Callable[[], Awaitable[Any]]:
    """A new driver connection for the pool, the whole of it (TCP, the server's
    greeting, the login) within ``timeout``: the drivers' ``connect_timeout``
    bounds the TCP connect alone, so a server that accepts and never answers
    would hold the caller forever."""
    params = {**params, "connect_timeout": timeout}
    connect = importlib.import_module(driver).connect

    async def bounded() -> Any:
        try:
            return await asyncio.wait_for(connect(**params), timeout)
        except TimeoutError:
            raise TimeoutError(f"no connection within connect_timeout={timeout:g}s") from None

    return bounded


def check_driver_options(given: Mapping[str, Any], driver: str) -> None:
    """Refuse URL query parameters (in ``given``, the driver's ``connect()``
    arguments) the driver does not take (a ConfigurationError naming them, not
    the driver's TypeError later)."""
    try:
        accepted = inspect.signature(importlib.import_module(driver).connect).parameters
    except (TypeError, ValueError):  # not introspectable: let the driver judge
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise ThreadStoreConfigurationError(
            f"unknown URL query parameter(s) for the {driver} driver: "
            f"{', '.join(unknown)} (store options are keyword arguments, not URL parameters)"
        )


def given_engines(
    engine: AsyncEngine, dialect: Dialect, *, memory: bool, busy_timeout: float | None
) -> Engines:
    """The application's engine, through a proxy of its own (same pool) that
    carries this client's settings (``busy_timeout``: when given); nothing is
    changed on ``engine`` itself."""
    from sqlalchemy import event

    if dialect == "mysql":
        return Engines(engine, engine, None)  # isolation checked by check_given_mysql
    own = engine.execution_options()
    settings = ["PRAGMA foreign_keys=ON"]
    if busy_timeout is not None:
        settings.append(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
    key = f"pai_storage_sql:{';'.join(settings)}"

    def on_engine_connect(conn: Any) -> None:
        # Once per driver connection (the pool keeps ``info`` with it).
        info = conn.connection.info
        if info.get(key):
            return
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            for statement in settings:
                cursor.execute(statement)
        finally:
            cursor.close()
        info[key] = True

    event.listen(own.sync_engine, "engine_connect", on_engine_connect)
    return Engines(own, own, asyncio.Lock() if memory else None)


def _sqlite_hooks(engine: AsyncEngine, event: Any, busy_timeout: float) -> None:
    busy_ms = int(busy_timeout * 1000)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # The transactions are begun explicitly (BEGIN IMMEDIATE / BEGIN):
        # the driver must not begin its own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    event.listen(engine.sync_engine, "connect", on_connect)


async def turn_to_wal(conn: AsyncConnection, busy_timeout: float) -> None:
    """Turn the SQLite file to the WAL journal (the file keeps it: every later
    connection, of any process, writes through it).

    SQLite refuses the change at once, without waiting ``busy_timeout``, when
    another connection writes the file meanwhile: having read the file, this one
    would have to wait for the other's write, which SQLite treats as a deadlock.
    That happens when several processes open a fresh file together, so the
    change is retried here, with short pauses, until ``busy_timeout`` has passed
    (then the driver's error, "database is locked", is raised). Each attempt
    waits up to ``busy_timeout`` for a lock SQLite does wait for (another
    connection holding the file exclusively), so the whole can take up to
    twice that."""
    from sqlalchemy.exc import OperationalError

    deadline = time.monotonic() + busy_timeout
    pause = 0.001
    while True:
        try:
            await conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            await conn.commit()
            return
        except OperationalError as exc:
            if not is_busy(exc) or time.monotonic() + pause > deadline:
                raise
            await conn.rollback()
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)


async def check_given_mysql(
    made: Engines, errors: Callable[[Phase], AbstractContextManager[None]]
) -> None:
    """An application's MySQL engine: ``utf8mb4`` connections, and transactions
    at ``REPEATABLE READ`` (through a proxy of the engine when it uses another level).

    ``errors`` maps the driver's exceptions (the client's ``errors``)."""
    with errors("connect"):
        async with made.writer.connect() as conn:
            result = await conn.exec_driver_sql(
                "SELECT @@character_set_client, @@character_set_connection, @@character_set_results"
            )
            charsets = list(result.one())
            isolation = await conn.get_isolation_level()
            await conn.rollback()
    if any(str(c).lower() != "utf8mb4" for c in charsets):
        raise ThreadStoreConfigurationError(
            f"the application's engine connects with character set {charsets[0]}; "
            "pai-storage needs utf8mb4 (add ?charset=utf8mb4 to the engine's URL)"
        )
    if isolation != "REPEATABLE READ":
        own = made.writer.execution_options(isolation_level="REPEATABLE READ")
        made.writer = made.reader = own


def check_engine(engine: object) -> None:
    """An application's engine must be a SQLAlchemy ``AsyncEngine`` of a driver this
    backend speaks."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    if not isinstance(engine, AsyncEngine):
        raise ThreadStoreConfigurationError(
            f"option client must be {_ACCEPTED_CLIENTS}, not {type(engine).__qualname__}"
        )
    name, driver = engine.dialect.name, engine.dialect.driver
    if (name, driver) not in (
        ("sqlite", "aiosqlite"),
        ("mysql", "asyncmy"),
        ("mysql", "aiomysql"),
        ("mariadb", "asyncmy"),
        ("mariadb", "aiomysql"),
    ):
        raise ThreadStoreConfigurationError(
            f"option client must be {_ACCEPTED_CLIENTS}, not an engine for {name}+{driver}"
        )


def check_int(name: str, value: object, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ThreadStoreConfigurationError(f"option {name} must be an integer >= {minimum}")


def check_seconds(name: str, value: object) -> None:
    if type(value) not in (int, float) or not 0 < cast(float, value) < 86_400:
        raise ThreadStoreConfigurationError(f"option {name} must be a number of seconds > 0")
