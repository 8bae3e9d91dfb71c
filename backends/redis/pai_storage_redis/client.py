"""The one redis-py asyncio client every Redis store of a ``connect()`` call shares.

:class:`RedisClient` owns (or borrows) the client, names the keys of every
runtime component, loads the Lua scripts and counts the stores using it (the
counting, the shared lazy connect and the close are
:class:`pai_storage.backend.SharedClient`'s):

- a store takes its holder in its constructor with :meth:`RedisClient.attached`
  (a new holder from the URL and options, an application's own client
  wrapped, or the holder the backend's opener gives every component);
- ``await holder.ready()`` connects on first call (one ``PING``);
- :meth:`RedisClient.run` runs one Lua script and maps every driver error to
  the contract's errors (:func:`contract_error`), the one error mapping of the
  backend.

Keys: every key of a component starts with the hash tag ``{<prefix><component>}``
(``{pai:kv}``, ``{pai:state}``, ``{pai:snapshots}``, ``{pai:guard}``), so on
Redis Cluster all keys of one component live in one hash slot and every Lua
script runs on one node. See ``docs/redis.md``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from redis import exceptions as rex

from pai_storage import (
    ConfigurationError,
    OutcomeUnknownError,
    StorageError,
    UnavailableError,
)
from pai_storage.backend import SharedClient, StoreURL, make_url, redact

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

__all__ = [
    "CLIENT_OPTIONS",
    "CLOCK_LUA",
    "DEFAULT_PREFIX",
    "URL_QUERY_OPTIONS",
    "RedisClient",
    "contract_error",
    "from_ms",
    "ms",
    "to_ms",
]

DEFAULT_PREFIX: Final = "pai:"
"""The default start of every key (inside the hash tag)."""

DEFAULT_MAX_CONNECTIONS: Final = 50
"""The connection pool's size unless ``max_connections`` says otherwise."""

CLIENT_OPTIONS: Final = frozenset(
    {"key_prefix", "cluster", "connect_timeout", "socket_timeout", "max_connections"}
)
"""The options that shape a :class:`RedisClient` (every store takes them, beside ``client``)."""

URL_FORM: Final = "redis://[[user]:password@]host[:port][/db]"

URL_QUERY_OPTIONS: Final = frozenset(
    {
        "client_name",
        "db",
        "health_check_interval",
        "legacy_responses",
        "lib_name",
        "lib_version",
        "password",
        "protocol",
        "retry_on_error",
        "retry_on_timeout",
        "socket_keepalive",
        "socket_read_size",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_cert_reqs",
        "ssl_certfile",
        "ssl_check_hostname",
        "ssl_ciphers",
        "ssl_exclude_verify_flags",
        "ssl_include_verify_flags",
        "ssl_keyfile",
        "ssl_min_version",
        "ssl_password",
        "username",
    }
)
"""The redis-py options a URL's query may set: those redis-py reads from text
(``ssl_*`` with ``rediss://`` only). Not ``decode_responses`` nor ``encoding``
and ``encoding_errors`` (the stores read and write bytes and UTF-8 of their
own: any other would make what they stored unreadable), not the options that
take objects (``retry``, ``parser_class``, ...), and not the timeouts and pool
size the store's keyword options set (redis-py would let the URL's win). Of
these, a URL accepts the ones the installed redis-py's constructors take
(:func:`query_options`)."""

_DIGITS: Final = re.compile(r"[0-9]+")

_DRIVER_ERRORS: Final = (rex.RedisError, rex.RedisClusterException, OSError)
"""What redis-py raises (``RedisClusterException`` is not a ``RedisError``)."""

CLOCK_LUA: Final = """
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function num(x) return string.format('%.0f', x) end
"""
"""Lua: ``clock(ARGV[1])`` is the store's time in ms -- the test clock's when the
argument is given, else the server's (``TIME``); ``num(x)`` an integer's text."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def to_ms(moment: datetime) -> int:
    """An aware datetime as whole milliseconds since the epoch."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def from_ms(value: Any) -> datetime:
    """Milliseconds since the epoch (an int or its text) as an aware UTC datetime."""
    return _EPOCH + timedelta(milliseconds=int(value))


def ms(duration: timedelta | None) -> str:
    """A duration as a script argument: whole milliseconds, ``""`` for none."""
    return "" if duration is None else str(duration // timedelta(milliseconds=1))


def contract_error(exc: Exception, write: bool, url: StoreURL | None) -> StorageError:
    """The contract error for a redis-py exception.

    A failure to connect means nothing was sent: :class:`UnavailableError`. A
    connection lost or a timeout during a write script may come after Redis
    ran it: :class:`OutcomeUnknownError` (read it back before retrying). The
    clients this backend makes never retry a command on their own, so a
    script runs at most once per call. Messages name the failure class only,
    never a stored value or a password.
    """
    name = type(exc).__name__
    text = redact(str(exc), url)
    if isinstance(exc, rex.RedisClusterException):
        if "Cluster mode is not enabled" in text:
            return ConfigurationError(
                "the Redis server is not a cluster node (cluster mode is not enabled), but it "
                "was opened as a Redis Cluster; open it without cluster=True"
            )
        if isinstance(exc.__cause__, rex.RedisError | OSError):  # e.g. no node reachable
            return contract_error(exc.__cause__, write, url)
    if isinstance(exc, rex.ResponseError) and "DB index is out of range" in text:
        return ConfigurationError(
            "the Redis server refused the database number: the database index is out of "
            "range for this server (its 'databases' setting allows 0 to databases-1)"
        )
    if isinstance(exc, rex.AuthenticationError | rex.NoPermissionError):
        return ConfigurationError(f"Redis refused the credentials or the command ({name})")
    if isinstance(exc, rex.MaxConnectionsError) or "No connection available" in text:
        return UnavailableError(
            f"no Redis connection became free in time ({name}); nothing was sent; retry later"
        )
    if isinstance(exc, rex.ConnectionError | rex.TimeoutError | OSError):
        if not write or "connecting to" in text or isinstance(exc, rex.BusyLoadingError):
            return UnavailableError(
                f"Redis is unreachable ({name}: {text}); nothing was written; retry later"
            )
        return OutcomeUnknownError(
            f"the connection to Redis was lost during a write ({name}); it may or may not "
            "have been applied: read it back before retrying"
        )
    if isinstance(exc, rex.ReadOnlyError | rex.TryAgainError | rex.ClusterDownError):
        return UnavailableError(f"Redis cannot take writes now ({name}); nothing was written")
    if isinstance(exc, rex.ResponseError) and str(exc).startswith("OOM"):
        return UnavailableError("Redis is out of memory (maxmemory); nothing was written")
    return StorageError(f"Redis failed ({name}: {text[:200]})")


class RedisClient(SharedClient["Redis"]):
    """One redis-py asyncio client, the key names of the stores, and their users.

    Parameters
    ----------
    url:
        ``redis://[[user]:password@]host[:port][/db]`` or ``rediss://`` (TLS); its
        query options go to redis-py (``Redis.from_url``). Not needed with
        ``client=``; without it, checked here (:func:`check_url`).
    client:
        An application's own ``redis.asyncio.Redis`` or ``RedisCluster`` (also
        a Sentinel's ``master_for(...)``), made with ``decode_responses=False``;
        pai-storage never closes it.
    key_prefix:
        The start of every key, inside the hash tag (default ``"pai:"``); no
        braces.
    cluster:
        Open ``url`` as a Redis Cluster (``RedisCluster.from_url``).
    connect_timeout, socket_timeout:
        Seconds (default 5 and 10).
    max_connections:
        The pool's size (default 50); a call waits up to ``socket_timeout``
        for a free connection.
    """

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: object = None,
        key_prefix: str = DEFAULT_PREFIX,
        cluster: bool = False,
        connect_timeout: float = 5.0,
        socket_timeout: float = 10.0,
        max_connections: int | None = None,
    ) -> None:
        super().__init__(owned=client is None)
        if client is None and url is None:
            raise ConfigurationError("a Redis store needs a redis:// URL or client=")
        self.url: StoreURL = make_url(url if url is not None else "redis://")
        if self.url.scheme not in ("redis", "rediss"):
            raise ConfigurationError(
                f"the redis backend serves redis:// and rediss:// URLs, not {self.url.scheme}://"
            )
        if type(key_prefix) is not str or not key_prefix or any(c in key_prefix for c in "{}"):
            raise ConfigurationError("option key_prefix must be a non-empty str without braces")
        if type(cluster) is not bool:
            raise ConfigurationError("option cluster must be a bool")
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("socket_timeout", socket_timeout),
        ):
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigurationError(f"option {name} must be a positive number of seconds")
        if max_connections is not None and (
            type(max_connections) is not int or max_connections < 1
        ):
            raise ConfigurationError("option max_connections must be None or an integer >= 1")
        if client is not None:
            _check_client(client)
        else:
            check_url(self.url, cluster=cluster)
        self._given = client
        self.key_prefix = key_prefix
        self._cluster = cluster
        self._options: dict[str, Any] = {
            "socket_connect_timeout": float(connect_timeout),
            "socket_timeout": float(socket_timeout),
        }
        self._max_connections = max_connections or DEFAULT_MAX_CONNECTIONS
        if max_connections is not None:
            self._options["max_connections"] = max_connections
        self._scripts: dict[str, AsyncScript] = {}

    @classmethod
    def attached(cls, url: str | StoreURL | None, client: object, **options: Any) -> RedisClient:
        """The holder a store uses, counted as one more user.

        ``client`` is the holder shared by one ``connect()`` call (then no
        other option may be given), an application's own client, or ``None``
        (a new client from ``url``).
        """
        holder = cls.shared_or_made(client, options, lambda **o: cls(url, client=client, **o))
        holder.attach()
        return holder

    def root(self, component: str) -> str:
        """The hash-tagged start of every key of ``component``: ``{<prefix><component>}``."""
        return "{" + self.key_prefix + component + "}"

    # ------------------------------------------------------------ SharedClient

    def _make(self) -> Redis:
        if self._given is not None:
            return self._given  # type: ignore[return-value]
        from redis.asyncio import BlockingConnectionPool, Redis
        from redis.asyncio.cluster import RedisCluster
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No automatic retry: a write script sent again after a lost reply could
        # be applied twice (a version counted twice, a lock taken twice).
        no_retry = Retry(NoBackoff(), 0)
        full = self.url.render(hide_password=False)
        if self._cluster:
            cluster = RedisCluster.from_url(full, retry=no_retry, **self._options)
            return cluster  # type: ignore[return-value]
        # A blocking pool: a burst of calls waits for a free connection (up to
        # the socket timeout) rather than failing at max_connections.
        pool = BlockingConnectionPool.from_url(
            full,
            retry=no_retry,
            timeout=self._options["socket_timeout"],
            max_connections=self._max_connections,
            socket_connect_timeout=self._options["socket_connect_timeout"],
            socket_timeout=self._options["socket_timeout"],
        )
        return Redis(connection_pool=pool)

    async def _connect(self, made: Redis) -> None:
        try:
            await made.ping()
        except _DRIVER_ERRORS as exc:
            raise contract_error(exc, False, self.url) from exc

    async def _disconnect(self, made: Redis, *, failed: bool) -> None:
        try:
            if self._cluster:
                await made.aclose()
            else:
                await made.aclose(close_connection_pool=True)
        except Exception:  # closing is best effort
            pass

    async def ready(self) -> Redis:
        """The connected client (connects on first call)."""
        return await self._ready()

    # ------------------------------------------------------------ scripts

    async def run(
        self,
        script: str,
        keys: Sequence[str | bytes],
        args: Sequence[str | bytes | int],
        *,
        write: bool,
    ) -> Any:
        """Run the Lua ``script`` (``EVALSHA``, loaded on first use) with ``keys`` and ``args``.

        Every redis-py error becomes a contract error (:func:`contract_error`).
        """
        redis = await self._ready()
        registered = self._scripts.get(script)
        if registered is None:
            registered = self._scripts[script] = redis.register_script(script)
        try:
            return await registered(keys=list(keys), args=list(args))
        except _DRIVER_ERRORS as exc:
            raise contract_error(exc, write, self.url) from exc

    async def server_info(self) -> dict[str, str]:
        """The server's version and persistence settings, for ``pai-storage check``."""
        redis = await self._ready()
        try:
            server = await redis.info("server")
            persistence = await redis.info("persistence")
            config: dict[Any, Any] = dict(await redis.config_get("appendfsync"))
            config.update(await redis.config_get("save"))
        except _DRIVER_ERRORS as exc:
            raise contract_error(exc, False, self.url) from exc
        return describe_persistence(server, persistence, config)


def query_options(*, tls: bool, cluster: bool) -> frozenset[str]:
    """The :data:`URL_QUERY_OPTIONS` the installed redis-py takes for such a client."""
    from redis.asyncio import BlockingConnectionPool, Connection, SSLConnection
    from redis.asyncio.cluster import RedisCluster

    if cluster:
        takers: list[type] = [RedisCluster]
    else:
        takers = [BlockingConnectionPool, *(SSLConnection if tls else Connection).__mro__]
    taken = {name for taker in takers for name in inspect.signature(taker).parameters}
    return frozenset(
        name for name in URL_QUERY_OPTIONS & taken if tls or not name.startswith("ssl_")
    )


def check_url(url: StoreURL, *, cluster: bool) -> None:
    """Refuse, when a store is opened, a URL redis-py would fail on later or misread.

    The database (path or ``?db=``) must be one non-negative integer (redis-py
    would quietly use database 0 for ``/abc``, database 12 for ``/1/2``), and
    0 on a Cluster; every query parameter must be one of
    :func:`query_options`, with a value redis-py can read. Messages never
    contain the password.
    """
    from redis.asyncio.connection import parse_url

    path = url.path.removeprefix("/")
    given = next((value for name, value in url.query if name == "db"), None)
    for where, text in (("path", path or None), ("?db=", given)):
        if text is not None and not _DIGITS.fullmatch(text):
            raise ConfigurationError(
                redact(
                    f"the database of a Redis URL is one non-negative integer ({URL_FORM}, "
                    f"or ?db=<n>), but its {where} is {text[:40]!r}",
                    url,
                )
            )
    if path and given is not None and int(path) != int(given):
        raise ConfigurationError(
            f"the Redis URL names two databases, {int(path)} (path) and {int(given)} (?db=); "
            f"give one: {URL_FORM}, or ?db=<n>"
        )
    database = int(given if given is not None else path or 0)  # ?db= first, as redis-py
    if cluster and database != 0:
        raise ConfigurationError(
            f"a Redis Cluster has only database 0, but the URL names database {database}"
        )
    valid = query_options(tls=url.scheme == "rediss", cluster=cluster)
    refused = sorted({name for name, _ in url.query} - valid)
    if refused:
        tls = any(name.startswith("ssl_") for name in refused) and url.scheme != "rediss"
        raise ConfigurationError(
            redact(
                "URL query parameter(s) the redis backend does not accept: "
                f"{', '.join(refused)}{' (TLS options need a rediss:// URL)' if tls else ''}; "
                f"valid: {', '.join(sorted(valid))} (store options such as key_prefix, "
                "connect_timeout, socket_timeout and max_connections are keyword "
                "arguments, not URL parameters)",
                url,
            )
        )
    try:
        parse_url(url.render(hide_password=False))
    except ValueError as exc:  # "Invalid value for 'socket_timeout' in connection URL."
        raise ConfigurationError(
            f"a query parameter of the Redis URL has a bad value: {redact(str(exc), url)}"
        ) from None


def describe_persistence(
    server: Mapping[str, Any], persistence: Mapping[str, Any], config: Mapping[str, Any]
) -> dict[str, str]:
    """What ``INFO`` and ``CONFIG GET`` say about durability, as ``check`` prints it."""

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    cfg = {text(k): text(v) for k, v in config.items()}
    aof = text(persistence.get("aof_enabled", "0")) == "1"
    fsync = cfg.get("appendfsync", "?")
    save = cfg.get("save", "")
    if aof and fsync == "always":
        guarantee = "every acknowledged write survives a crash (AOF, fsync always)"
    elif aof and fsync == "everysec":
        guarantee = "a crash may lose the last second of acknowledged writes (AOF, everysec)"
    elif aof:
        guarantee = "a crash may lose acknowledged writes (AOF, fsync left to the OS)"
    elif save:
        guarantee = "a crash loses every write since the last RDB snapshot"
    else:
        guarantee = "no persistence: a restart loses everything"
    return {
        "redis_version": text(server.get("redis_version", "?")),
        "appendonly": "yes" if aof else "no",
        "appendfsync": fsync,
        "save": save or '""',
        "durability": guarantee,
    }


def _check_client(client: object) -> None:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    if not isinstance(client, Redis | RedisCluster):
        raise ConfigurationError(
            "client= must be a redis.asyncio.Redis or RedisCluster, not "
            f"{type(client).__qualname__}"
        )
    kwargs = client.get_connection_kwargs()
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            "client= must be made with decode_responses=False: snapshots are bytes"
        )
