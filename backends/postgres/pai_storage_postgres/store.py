"""The PostgreSQL thread store: normalized tables, one transaction per commit.

Commits lock the root row (``SELECT ... FOR UPDATE``; a create inserts it with
``ON CONFLICT DO NOTHING``), read the commit time *after* holding the row, load
only the child rows the changes name, apply them through the core helpers
(:func:`~pai_storage.apply_family_changes`, :func:`~pai_storage.apply_lease_change`,
:func:`~pai_storage.apply_thread_root_update`), write the net effect, check the
relationship rules with bounded queries inside the same transaction and commit.
Reads run in one ``REPEATABLE READ READ ONLY`` snapshot, so the root and every
page agree. Every page and list is a bounded index range scan.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pai_storage import (
    ChildPagePlan,
    Clock,
    CommittedResult,
    CommitThreadInput,
    ConflictResult,
    CreateMutation,
    DeleteMutation,
    Entry,
    FamilyName,
    FamilyWrite,
    IdsPlan,
    LeaseConflict,
    ListPlan,
    ListThreadsInput,
    Message,
    MessageRef,
    Page,
    QueuedItem,
    QueueRef,
    ReadThreadInput,
    RunFacts,
    RunRecord,
    RunRef,
    SelectionHelpers,
    StoreInfo,
    StoreModel,
    StoreURL,
    StoreWarning,
    ThreadChanges,
    ThreadPage,
    ThreadReadResult,
    ThreadRecord,
    ThreadStore,
    ThreadStoreConfigurationError,
    ThreadStoreError,
    ThreadStoreInvariantError,
    ThreadStoreUnavailableError,
    ThreadVersion,
    WarningCallback,
    Window,
    apply_family_changes,
    apply_lease_change,
    apply_thread_root_update,
    change_ids,
    check_condition,
    make_url,
    plan_relationship_validation,
    record_id,
    stamp_message,
    stamp_queued_item,
    stamp_run,
    timestamp_ms,
)

from .codec import dec, dump, enc, enc_opt, parse, run_ref_fields
from .errors import Phase, is_retryable, map_error
from .schema import SCHEMA_VERSION, Tables, validate_identifier

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped]

__all__ = ["PostgresThreadStore"]

R = TypeVar("R", Message, RunRecord, QueuedItem)
M = TypeVar("M", bound=StoreModel)

COMMIT_ATTEMPTS = 3
"""Attempts for a commit that hits a serialization failure or deadlock."""

SESSION_SETTINGS = {
    "enable_sort": "off",
    "enable_incremental_sort": "off",
    "enable_hashjoin": "off",
    "enable_mergejoin": "off",
}
"""Set on every pooled connection (the pool is the store's own).

Each statement of this store has an index that delivers its rows in order, or
probes one key at a time. With generic plans the planner assumes an average
thread (a handful of rows) and would rather collect a whole thread and sort or
hash it, which costs O(thread) instead of O(page) on a long transcript. These
settings only price those plans out; nothing becomes impossible."""

_NOW_SQL = "SELECT date_trunc('milliseconds', clock_timestamp())"


@dataclass(frozen=True, slots=True)
class _Family:
    name: FamilyName
    table: str
    id_col: str
    next_col: str
    model: type[Message] | type[RunRecord] | type[QueuedItem]


class _Conflict(Exception):
    """Internal: the commit's condition or lease precondition is false."""

    def __init__(self, current: ThreadVersion | None) -> None:
        self.current = current


class _Retry(Exception):
    """Internal: a serialization failure or deadlock; the attempt rolled back."""


class PostgresThreadStore(ThreadStore):
    """Thread state in PostgreSQL 13+ (asyncpg).

    Parameters
    ----------
    url:
        ``postgresql://user:password@host:port/database`` (also ``postgres://``
        and ``postgresql+asyncpg://``); query parameters go to asyncpg.
    table_prefix:
        Base name of the tables (default ``"pai_threads"``).
    schema:
        PostgreSQL schema holding the tables (created if missing); default:
        the connection's ``search_path``.
    min_pool_size, max_pool_size:
        Connection-pool bounds (defaults 1 and 10).
    connect_timeout:
        Seconds to wait for a connection (default 10).
    command_timeout:
        Seconds a statement may run before it is abandoned (default: none).
    statement_cache_size:
        asyncpg's prepared-statement cache per connection (0 behind PgBouncer
        in transaction mode).
    clock:
        Test-only clock override; production uses the server's
        ``clock_timestamp()``.
    on_warning:
        Receives recoverable integrity warnings (:class:`~pai_storage.StoreWarning`).
    token_secret:
        Optional key that makes page tokens unforgeable.
    """

    backend_name = "postgres"

    def __init__(
        self,
        url: str | StoreURL,
        *,
        table_prefix: str = "pai_threads",
        schema: str | None = None,
        min_pool_size: int = 1,
        max_pool_size: int = 10,
        connect_timeout: float = 10.0,
        command_timeout: float | None = None,
        statement_cache_size: int = 100,
        clock: Clock | None = None,
        on_warning: WarningCallback | None = None,
        token_secret: bytes | None = None,
    ) -> None:
        super().__init__(clock=clock, on_warning=on_warning)
        self.url = make_url(url)
        if self.url.scheme not in ("postgresql", "postgres") or self.url.driver not in (
            None,
            "asyncpg",
        ):
            raise ThreadStoreConfigurationError(
                f"the postgres backend serves postgresql://, postgres:// and "
                f"postgresql+asyncpg:// URLs, not {self.url.full_scheme}://"
            )
        validate_identifier("table_prefix", table_prefix)
        if schema is not None:
            validate_identifier("schema", schema)
        _check_int("min_pool_size", min_pool_size, 0)
        _check_int("max_pool_size", max_pool_size, 1)
        if min_pool_size > max_pool_size:
            raise ThreadStoreConfigurationError("min_pool_size must not exceed max_pool_size")
        _check_seconds("connect_timeout", connect_timeout)
        if command_timeout is not None:
            _check_seconds("command_timeout", command_timeout)
        _check_int("statement_cache_size", statement_cache_size, 0)
        self.tables = Tables(table_prefix, schema)
        self._pool_options: dict[str, Any] = {
            "min_size": min_pool_size,
            "max_size": max_pool_size,
            "timeout": connect_timeout,
            "command_timeout": command_timeout,
            "statement_cache_size": statement_cache_size,
            "server_settings": dict(SESSION_SETTINGS),
            "reset": keep_session,
        }
        self._pool: asyncpg.Pool | None = None
        self._server_version: str | None = None
        self._selections = SelectionHelpers("pai-pg", secret=token_secret)
        t = self.tables
        self._families: dict[FamilyName, _Family] = {
            "messages": _Family("messages", t.messages, "message_id", "messages_next", Message),
            "runs": _Family("runs", t.runs, "run_id", "runs_next", RunRecord),
            "queuedItems": _Family(
                "queuedItems", t.queued, "queue_item_id", "queued_next", QueuedItem
            ),
        }
        self._list_sql: dict[tuple[bool, bool, bool, str, bool], str] = {}

    def __repr__(self) -> str:
        return (
            f"PostgresThreadStore({str(self.url)!r}, table_prefix={self.tables.prefix!r}, "
            f"schema={self.tables.schema!r})"
        )

    # ------------------------------------------------------------ lifecycle

    def _dsn(self) -> str:
        return self.url.render(hide_password=False, scheme="postgresql")

    async def _initialize(self) -> None:
        import asyncpg

        try:
            pool = await asyncpg.create_pool(self._dsn(), **self._pool_options)
        except Exception as exc:
            raise map_error(exc, "connect", self.url) from exc
        assert pool is not None
        self._pool = pool
        try:
            await self._ensure_schema(pool)
        except BaseException:
            self._pool = None
            pool.terminate()
            raise

    async def _close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=10)
            except Exception:  # a broken connection must not make close() fail
                pool.terminate()

    async def _info(self) -> StoreInfo:
        return StoreInfo(
            backend="postgres",
            server_version=self._server_version,
            transactions=True,
            details={
                "url": str(self.url),
                "schema": self.tables.schema or "(search_path)",
                "table_prefix": self.tables.prefix,
                "schema_version": str(SCHEMA_VERSION),
            },
        )

    async def _ensure_schema(self, pool: asyncpg.Pool) -> None:
        async with self._connection(pool, "connect") as conn:
            try:
                version = conn.get_server_version()
                shown = await conn.fetchval("SHOW server_version")
                self._server_version = f"PostgreSQL {shown}"
                if version.major < 13:
                    raise ThreadStoreConfigurationError(
                        f"the postgres backend needs PostgreSQL 13 or newer; the server runs "
                        f"{self._server_version}"
                    )
                stored = await self._schema_version(conn)
                if stored == SCHEMA_VERSION:
                    return
                if stored is None or stored < SCHEMA_VERSION:
                    async with conn.transaction():
                        # Several processes may initialize at once: DDL under one lock.
                        await conn.execute(
                            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                            self.tables.lock_key,
                        )
                        stored = await self._schema_version(conn)
                        if stored is None:
                            for statement in self.tables.ddl():
                                await conn.execute(statement)
                            await conn.execute(
                                f"INSERT INTO {self.tables.version_table} (version) "
                                "VALUES ($1) ON CONFLICT DO NOTHING",
                                SCHEMA_VERSION,
                            )
                            stored = SCHEMA_VERSION
                if stored is not None and stored > SCHEMA_VERSION:
                    raise ThreadStoreConfigurationError(
                        f"the tables {self.tables.threads} use schema version {stored}, newer "
                        f"than this pai-storage understands ({SCHEMA_VERSION}); upgrade "
                        "pai-storage"
                    )
            except ThreadStoreError:
                raise
            except Exception as exc:
                raise map_error(exc, "connect", self.url) from exc

    async def _schema_version(self, conn: asyncpg.Connection) -> int | None:
        exists = await conn.fetchval("SELECT to_regclass($1)", self.tables.version_table)
        if exists is None:
            return None
        value = await conn.fetchval(f"SELECT version FROM {self.tables.version_table}")
        return int(value) if value is not None else None

    @contextlib.asynccontextmanager
    async def _connection(
        self, pool: asyncpg.Pool | None = None, phase: Phase = "read"
    ) -> AsyncIterator[asyncpg.Connection]:
        pool = pool or self._pool
        if pool is None:
            raise ThreadStoreUnavailableError("the store is not connected")
        try:
            conn = await pool.acquire()
        except Exception as exc:
            raise map_error(exc, "connect", self.url) from exc
        try:
            yield conn
        finally:
            try:
                await pool.release(conn)
            except Exception:
                _terminate(conn)

    async def _time(self, conn: asyncpg.Connection, floor: datetime | None = None) -> datetime:
        now = self.now()
        if now is None:
            now = cast(datetime, await conn.fetchval(_NOW_SQL))
        return max(now, floor) if floor is not None else now

    # ------------------------------------------------------------ reads

    async def _read_thread(self, request: ReadThreadInput) -> ThreadReadResult:
        plan = self._selections.plan_read(request)
        paged = plan.messages is not None or plan.runs is not None or plan.queued_items is not None
        async with self._connection() as conn:
            try:
                if not paged:
                    return await self._read_root_only(conn, request)
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    return await self._read_snapshot(conn, request, plan)
            except ThreadStoreError:
                raise
            except Exception as exc:
                raise map_error(exc, "read", self.url) from exc

    async def _root_row(self, conn: asyncpg.Connection, scope: bytes, thread: bytes) -> Any:
        t = self.tables.threads
        return await conn.fetchrow(
            "SELECT date_trunc('milliseconds', clock_timestamp()) AS now, t.doc, "
            "t.messages_next, t.runs_next, t.queued_next "
            f"FROM (VALUES (1)) AS one LEFT JOIN {t} t "
            "ON t.scope_key = $1 AND t.thread_id = $2",
            scope,
            thread,
        )

    def _parse_root(self, doc: str, scope_key: str, thread_id: str) -> ThreadRecord:
        root = parse(ThreadRecord, doc)
        if root.scope_key != scope_key or root.thread_id != thread_id:
            raise ThreadStoreInvariantError(
                "stored thread root does not match its key (scope_key/thread_id)"
            )
        return root

    async def _read_root_only(
        self, conn: asyncpg.Connection, request: ReadThreadInput
    ) -> ThreadReadResult:
        row = await self._root_row(conn, enc(request.scope_key), enc(request.thread_id))
        observed = self.now() or row["now"]
        if row["doc"] is None:
            return ThreadReadResult(observed_at=observed, thread=None)
        root = self._parse_root(row["doc"], request.scope_key, request.thread_id)
        return ThreadReadResult.model_construct(observed_at=observed, thread=root)

    async def _read_snapshot(
        self, conn: asyncpg.Connection, request: ReadThreadInput, plan: Any
    ) -> ThreadReadResult:
        scope, thread = enc(request.scope_key), enc(request.thread_id)
        row = await self._root_row(conn, scope, thread)
        observed = self.now() or row["now"]
        if row["doc"] is None:
            return ThreadReadResult(observed_at=observed, thread=None)
        root = self._parse_root(row["doc"], request.scope_key, request.thread_id)
        version = root.version
        pages: dict[str, ThreadPage[Any]] = {}
        selections: tuple[tuple[str, FamilyName, Any], ...] = (
            ("messages", "messages", plan.messages),
            ("runs", "runs", plan.runs),
            ("queued_items", "queuedItems", plan.queued_items),
        )
        for attr, fam_name, sel in selections:
            if sel is None:
                continue
            family = self._families[fam_name]
            if isinstance(sel, IdsPlan):
                found = await self._load_by_ids(conn, family, scope, thread, sel.ids)
                pages[attr] = sel.finish({k: e.record for k, e in found.items()}, version)
            else:
                high_water = int(row[family.next_col]) - 1
                pages[attr] = await self._read_page(
                    conn, family, scope, thread, sel, version, high_water
                )
        return ThreadReadResult.model_construct(
            observed_at=observed,
            thread=root,
            messages=pages.get("messages"),
            runs=pages.get("runs"),
            queued_items=pages.get("queued_items"),
        )

    async def _load_by_ids(
        self,
        conn: asyncpg.Connection,
        family: _Family,
        scope: bytes,
        thread: bytes,
        ids: Iterable[str],
    ) -> dict[str, Entry[Any]]:
        wanted = [enc(i) for i in ids]
        if not wanted:
            return {}
        rows = await conn.fetch(
            by_keys(family.table, family.id_col, f"t.position, t.{family.id_col} AS id, t.doc"),
            scope,
            thread,
            wanted,
        )
        found: dict[str, Entry[Any]] = {}
        for r in rows:
            record = parse(family.model, r["doc"])
            rid = dec(r["id"])
            if record_id(record) != rid:
                raise ThreadStoreInvariantError(
                    f"stored {family.name} record does not match its id column"
                )
            found[rid] = Entry(int(r["position"]), record)
        return found

    async def _read_page(
        self,
        conn: asyncpg.Connection,
        family: _Family,
        scope: bytes,
        thread: bytes,
        plan: ChildPagePlan,
        version: ThreadVersion,
        high_water: int,
    ) -> ThreadPage[Any]:
        after_id, before_id = plan.bound_ids()
        positions: list[int | None] = [None, None]
        anchors = [i for i in (after_id, before_id) if i is not None]
        if anchors:
            rows = await conn.fetch(
                by_keys(self.tables.messages, "message_id", "t.message_id, t.position"),
                scope,
                thread,
                [enc(i) for i in anchors],
            )
            found = {dec(r["message_id"]): int(r["position"]) for r in rows}
            for index, anchor in enumerate((after_id, before_id)):
                if anchor is None:
                    continue
                if anchor not in found:
                    raise plan.missing_anchor(anchor)
                positions[index] = found[anchor]
        window = plan.window(version, high_water, positions[0], positions[1])
        rows_out: list[tuple[int, Any]] = []
        if window.lower + 1 < window.upper:
            for position, doc in await self._page_rows(conn, family, scope, thread, plan, window):
                rows_out.append((position, parse(family.model, doc)))
        return plan.finish(window, rows_out, version)

    async def _page_rows(
        self,
        conn: asyncpg.Connection,
        family: _Family,
        scope: bytes,
        thread: bytes,
        plan: ChildPagePlan,
        window: Window,
    ) -> list[tuple[int, str]]:
        args: list[Any] = [scope, thread, window.lower, window.upper, window.fetch]
        statuses = sorted(plan.statuses) if plan.statuses is not None else []
        run_filter = family.name == "queuedItems" and plan.run_id is not None
        sql = self.page_statement(family.name, window.order, plan.view, run_filter, len(statuses))
        if run_filter:
            args.append(enc(cast(str, plan.run_id)))
        args.extend(statuses)
        rows = await conn.fetch(sql, *args)
        found = [(int(r["position"]), cast(str, r["doc"])) for r in rows]
        if len(statuses) > 1:
            # One bounded index range scan per status, merged here: the same
            # streaming merge MongoDB does for an $in on a leading index key.
            found.sort(key=lambda item: item[0], reverse=window.order == "newest")
            del found[window.fetch :]
        return found

    def page_statement(
        self,
        family: FamilyName,
        order: str,
        view: str | None = None,
        run_filter: bool = False,
        statuses: int = 0,
    ) -> str:
        """The SQL of a child page: ``$1`` scope, ``$2`` thread, ``$3``/``$4`` the
        exclusive position bounds, ``$5`` the row count, then the run id or statuses."""
        table = self._families[family].table
        direction = "ASC" if order == "oldest" else "DESC"
        base = (
            f"SELECT position, doc FROM {table} WHERE scope_key = $1 AND thread_id = $2 "
            "AND position > $3 AND position < $4"
        )
        tail = f" ORDER BY position {direction} LIMIT $5"
        if family == "messages":
            views = {"transcript": " AND transcript", "context": " AND context"}
            return base + views.get(view or "raw", "") + tail
        if run_filter:
            return base + " AND run_id = $6" + tail
        if statuses == 0:
            return base + tail
        if statuses == 1:
            return base + " AND status = $6" + tail
        branches = [f"({base} AND status = ${6 + i}{tail})" for i in range(statuses)]
        return " UNION ALL ".join(branches)

    # ------------------------------------------------------------ listing

    def list_statement(
        self, agent: bool, parent: bool, category: bool, vis: str, cursor: bool
    ) -> str:
        key = (agent, parent, category, vis, cursor)
        sql = self._list_sql.get(key)
        if sql is not None:
            return sql
        where = ["scope_key = $1"]
        n = 3
        if agent:
            where.append(f"agent = ${n}")
            n += 1
        if parent:
            where.append(f"parent_thread_id = ${n}")
            n += 1
        if category:
            where.append(f"category = ${n}")
            n += 1
        if cursor:
            where.append(f"(sort_key, thread_id) > (${n}, ${n + 1})")

        def branch(visibility: str) -> str:
            conds = [*where[:1], f"list_visibility = '{visibility}'", *where[1:]]
            return (
                f"SELECT sort_key, thread_id, doc FROM {self.tables.threads} "
                f"WHERE {' AND '.join(conds)} ORDER BY sort_key, thread_id LIMIT $2"
            )

        if vis == "visible":
            sql = branch("visible")
        else:
            # Both visibility values, each a bounded ordered index scan; merged here.
            sql = f"({branch('visible')}) UNION ALL ({branch('hidden')})"
        self._list_sql[key] = sql
        return sql

    async def _list_threads(self, request: ListThreadsInput) -> Page[ThreadRecord]:
        plan = self._selections.plan_list(request)
        async with self._connection() as conn:
            try:
                return await self._list(conn, plan)
            except ThreadStoreError:
                raise
            except Exception as exc:
                raise map_error(exc, "read", self.url) from exc

    async def _list(self, conn: asyncpg.Connection, plan: ListPlan) -> Page[ThreadRecord]:
        vis = "all" if plan.include_hidden else "visible"
        filters: list[Any] = [
            enc(v) for v in (plan.agent, plan.parent_thread_id, plan.category) if v is not None
        ]
        cursor: tuple[int, bytes] | None = None
        if plan.cursor is not None:
            cursor = (-plan.cursor[0], enc(plan.cursor[1]))
        found: list[ThreadRecord] = []
        while True:
            sql = self.list_statement(
                plan.agent is not None,
                plan.parent_thread_id is not None,
                plan.category is not None,
                vis,
                cursor is not None,
            )
            args: list[Any] = [enc(plan.scope_key), plan.fetch, *filters]
            if cursor is not None:
                args.extend(cursor)
            rows = await conn.fetch(sql, *args)
            keyed = sorted(
                ((int(r["sort_key"]), bytes(r["thread_id"]), r["doc"]) for r in rows),
                key=lambda item: (item[0], item[1]),
            )[: plan.fetch]
            for sort_key, thread_id, doc in keyed:
                record = await self._list_record(plan.scope_key, sort_key, thread_id, doc)
                if record is not None and plan.matches(record):
                    found.append(record)
                    if len(found) == plan.fetch:
                        return plan.finish(found)
            if len(keyed) < plan.fetch:
                return plan.finish(found)
            # Some rows were skipped as invalid: continue after the last one seen.
            cursor = (keyed[-1][0], keyed[-1][1])

    async def _list_record(
        self, scope_key: str, sort_key: int, thread_id: bytes, doc: str
    ) -> ThreadRecord | None:
        try:
            tid = dec(thread_id)
        except UnicodeDecodeError:
            tid = None
        try:
            record = parse(ThreadRecord, doc)
            if (
                record.scope_key != scope_key
                or record.thread_id != tid
                or -timestamp_ms(record.updated_at) != sort_key
            ):
                raise ThreadStoreInvariantError("stored identity or order key does not match")
        except ThreadStoreInvariantError as exc:
            reason = str(exc).split(":", 1)[0][:200]
            await self.warn(
                StoreWarning(
                    kind="invalid_thread_skipped",
                    reason=f"stored thread root failed validation ({reason})",
                    scope_key=scope_key,
                    thread_id=tid,
                )
            )
            return None
        return record

    # ------------------------------------------------------------ commits

    async def _commit_thread(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        last: BaseException | None = None
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                return await self._commit_once(request)
            except _Retry as retry:
                last = retry.__cause__
                await asyncio.sleep(0.005 * (attempt + 1))
        assert last is not None
        raise ThreadStoreUnavailableError(
            f"the commit kept hitting serialization failures or deadlocks "
            f"({COMMIT_ATTEMPTS} attempts); nothing was applied"
        ) from last

    async def _commit_once(self, request: CommitThreadInput) -> CommittedResult | ConflictResult:
        phase: Phase = "write"
        async with self._connection() as conn:
            try:
                await conn.execute("BEGIN")
                try:
                    result = await self._apply(conn, request)
                except _Conflict as conflict:
                    await conn.execute("ROLLBACK")
                    current = conflict.current
                    if request.mutation.type == "create" and current is None:
                        current = await self._current_version(conn, request)
                    return ConflictResult(type="conflict", current_version=current)
                phase = "commit"
                await conn.execute("COMMIT")
                return result
            except ThreadStoreError:
                await _rollback(conn)
                raise
            except Exception as exc:
                if is_retryable(exc):
                    await _rollback(conn)
                    raise _Retry() from exc
                _terminate(conn)
                raise map_error(exc, phase, self.url) from exc
            except BaseException:
                # Cancelled mid-transaction: the connection's state is unknown.
                _terminate(conn)
                raise

    async def _current_version(
        self, conn: asyncpg.Connection, request: CommitThreadInput
    ) -> ThreadVersion | None:
        row = await conn.fetchrow(
            f"SELECT instance_id, revision FROM {self.tables.threads} "
            "WHERE scope_key = $1 AND thread_id = $2",
            enc(request.scope_key),
            enc(request.thread_id),
        )
        if row is None:
            return None
        return ThreadVersion(thread_instance_id=row["instance_id"], revision=int(row["revision"]))

    async def _apply(self, conn: asyncpg.Connection, request: CommitThreadInput) -> CommittedResult:
        scope, thread = enc(request.scope_key), enc(request.thread_id)
        mutation = request.mutation
        t = self.tables.threads
        previous: ThreadRecord | None = None
        counters: dict[FamilyName, int] = {"messages": 1, "runs": 1, "queuedItems": 1}
        if isinstance(mutation, CreateMutation):
            row = await conn.fetchrow(
                f"SELECT instance_id, revision FROM {t} WHERE scope_key = $1 AND thread_id = $2",
                scope,
                thread,
            )
            current = _check_condition(request, row)
            now = await self._time(conn)
        else:
            row = await conn.fetchrow(
                f"SELECT instance_id, revision, updated_at, messages_next, runs_next, "
                f"queued_next, doc FROM {t} WHERE scope_key = $1 AND thread_id = $2 FOR UPDATE",
                scope,
                thread,
            )
            current = _check_condition(request, row)
            # The time is read while holding the row: a commit that waited for
            # the lock judges leases at the moment it applies, and committedAt
            # never goes backwards within a thread.
            now = await self._time(conn, row["updated_at"])
            if isinstance(mutation, DeleteMutation):
                await self._delete_thread(conn, scope, thread)
                return CommittedResult(type="committed", thread=None, committed_at=now)
            previous = self._parse_root(row["doc"], request.scope_key, request.thread_id)
            counters = {
                "messages": int(row["messages_next"]),
                "runs": int(row["runs_next"]),
                "queuedItems": int(row["queued_next"]),
            }
        changes = mutation.changes or ThreadChanges()
        writes: dict[FamilyName, FamilyWrite[Any]] = {}
        loaded: dict[FamilyName, dict[str, Entry[Any]]] = {}
        steps: tuple[tuple[FamilyName, Any, Any], ...] = (
            ("messages", changes.messages, stamp_message),
            ("runs", changes.runs, stamp_run),
            ("queuedItems", changes.queued_items, stamp_queued_item),
        )
        for name, family_changes, stamp in steps:
            family = self._families[name]
            ids = change_ids(family_changes) if previous is not None else set()
            loaded[name] = await self._load_by_ids(conn, family, scope, thread, sorted(ids))
            writes[name] = apply_family_changes(
                name, family_changes, loaded[name], counters[name], now, stamp
            )
        lease = apply_lease_change(previous.lease if previous else None, changes.lease, now)
        if isinstance(lease, LeaseConflict):
            raise _Conflict(current)
        root = apply_thread_root_update(previous, request, now, lease)
        await self._write_root(conn, root, writes, created=previous is None)
        truncated_message_runs = await self._write_family(
            conn, self._families["messages"], scope, thread, writes["messages"]
        )
        truncated_runs = await self._write_family(
            conn, self._families["runs"], scope, thread, writes["runs"]
        )
        await self._write_family(
            conn, self._families["queuedItems"], scope, thread, writes["queuedItems"]
        )
        relationship_plan = plan_relationship_validation(
            changes,
            previous_message_runs={k: e.record.run_id for k, e in loaded["messages"].items()},
            previous_item_runs={k: e.record.run_id for k, e in loaded["queuedItems"].items()},
            truncated_message_runs=truncated_message_runs,
            truncated_run_ids=truncated_runs,
            lease=lease,
        )
        await relationship_plan.check(_Reader(conn, self.tables, scope, thread))
        return CommittedResult(type="committed", thread=root, committed_at=now)

    async def _delete_thread(self, conn: asyncpg.Connection, scope: bytes, thread: bytes) -> None:
        for table in (
            self.tables.messages,
            self.tables.runs,
            self.tables.queued,
            self.tables.threads,
        ):
            await conn.execute(
                f"DELETE FROM {table} WHERE scope_key = $1 AND thread_id = $2", scope, thread
            )

    async def _write_root(
        self,
        conn: asyncpg.Connection,
        root: ThreadRecord,
        writes: Mapping[FamilyName, FamilyWrite[Any]],
        *,
        created: bool,
    ) -> None:
        t = self.tables.threads
        args = (
            enc(root.scope_key),
            enc(root.thread_id),
            root.version.revision,
            root.list_visibility,
            enc_opt(root.category),
            root.updated_at,
            -timestamp_ms(root.updated_at),
            writes["messages"].next_position,
            writes["runs"].next_position,
            writes["queuedItems"].next_position,
            dump(root),
        )
        if not created:
            await conn.execute(
                f"UPDATE {t} SET revision = $3, list_visibility = $4, category = $5, "
                "updated_at = $6, sort_key = $7, messages_next = $8, runs_next = $9, "
                "queued_next = $10, doc = $11 WHERE scope_key = $1 AND thread_id = $2",
                *args,
            )
            return
        inserted = await conn.fetchval(
            f"INSERT INTO {t} (scope_key, thread_id, revision, list_visibility, category, "
            "updated_at, sort_key, messages_next, runs_next, queued_next, doc, instance_id, "
            "agent, parent_thread_id) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) "
            "ON CONFLICT (scope_key, thread_id) DO NOTHING RETURNING true",
            *args,
            root.version.thread_instance_id,
            enc(root.agent),
            enc_opt(root.parent_thread_id),
        )
        if not inserted:  # a concurrent create won the race
            raise _Conflict(None)

    async def _write_family(
        self,
        conn: asyncpg.Connection,
        family: _Family,
        scope: bytes,
        thread: bytes,
        write: FamilyWrite[Any],
    ) -> list[str]:
        """Apply one family's net write; returns the run ids a truncation removed."""
        table, id_col = family.table, family.id_col
        deletes = write.deletes
        truncated: list[str] = []
        key = "scope_key = $1 AND thread_id = $2"
        if write.truncate_after is not None:
            rows = await conn.fetch(
                f"DELETE FROM {table} WHERE {key} AND position > $3 RETURNING run_id",
                scope,
                thread,
                write.truncate_after,
            )
            truncated = sorted({dec(r["run_id"]) for r in rows if r["run_id"] is not None})
        if deletes:
            await conn.execute(
                f"DELETE FROM {table} AS t USING unnest($3::bytea[]) AS k(id) "
                f"WHERE t.scope_key = $1 AND t.thread_id = $2 AND t.{id_col} = k.id",
                scope,
                thread,
                [enc(i) for i in deletes],
            )
        if write.updates:
            cols = _columns(family.name, list(write.updates.values()))
            await conn.execute(_update_sql(family, table), scope, thread, *cols)
        if write.inserts:
            cols = _columns(family.name, write.inserts)
            await conn.execute(_insert_sql(family, table), scope, thread, *cols)
        return truncated


# ---------------------------------------------------------------- row helpers

_EXTRA_COLUMNS: dict[FamilyName, tuple[tuple[str, str], ...]] = {
    "messages": (
        ("run_id", "bytea"),
        ("relation", "text"),
        ("transcript", "boolean"),
        ("context", "boolean"),
    ),
    "runs": (("status", "text"),),
    "queuedItems": (("run_id", "bytea"),),
}


def _columns(name: FamilyName, entries: Sequence[Entry[Any]]) -> list[list[Any]]:
    """Column arrays ``position, id, <extra columns>, doc`` for ``unnest``."""
    positions = [e.position for e in entries]
    ids = [enc(record_id(e.record)) for e in entries]
    docs = [dump(e.record) for e in entries]
    extra: list[list[Any]]
    if name == "messages":
        records = [cast(Message, e.record) for e in entries]
        extra = [
            [enc_opt(m.run_id) for m in records],
            [getattr(m.association, "relation", None) for m in records],
            [m.visibility.transcript for m in records],
            [m.visibility.context for m in records],
        ]
    elif name == "runs":
        extra = [[cast(RunRecord, e.record).status for e in entries]]
    else:
        extra = [[enc(cast(QueuedItem, e.record).run_id) for e in entries]]
    return [positions, ids, *extra, docs]


def _insert_sql(family: _Family, table: str) -> str:
    extra = _EXTRA_COLUMNS[family.name]
    names = ["position", family.id_col, *(c for c, _ in extra), "doc"]
    types = ["bigint", "bytea", *(t for _, t in extra), "text"]
    params = ", ".join(f"${i + 3}::{t}[]" for i, t in enumerate(types))
    return (
        f"INSERT INTO {table} (scope_key, thread_id, {', '.join(names)}) "
        f"SELECT $1, $2, * FROM unnest({params})"
    )


def _update_sql(family: _Family, table: str) -> str:
    extra = _EXTRA_COLUMNS[family.name]
    names = ["position", "id", *(c for c, _ in extra), "doc"]
    types = ["bigint", "bytea", *(t for _, t in extra), "text"]
    params = ", ".join(f"${i + 3}::{t}[]" for i, t in enumerate(types))
    sets = ", ".join(f"{c} = u.{c}" for c in [*(c for c, _ in extra), "doc"])
    return (
        f"UPDATE {table} AS t SET {sets} FROM unnest({params}) AS u({', '.join(names)}) "
        f"WHERE t.scope_key = $1 AND t.thread_id = $2 AND t.position = u.position "
        f"AND t.{family.id_col} = u.id"
    )


def _check_condition(request: CommitThreadInput, row: Any) -> ThreadVersion | None:
    """The stored version; raises :class:`_Conflict` unless the commit's condition holds."""
    current = (
        None
        if row is None
        else ThreadVersion(thread_instance_id=row["instance_id"], revision=int(row["revision"]))
    )
    if check_condition(request, current) is not None:
        raise _Conflict(current)
    return current


def _terminate(conn: asyncpg.Connection) -> None:
    """Drop a connection whose state is unknown (it may already be gone)."""
    with contextlib.suppress(Exception):
        if not conn.is_closed():
            conn.terminate()


async def _rollback(conn: asyncpg.Connection) -> None:
    try:
        if conn.is_closed():
            return
        await conn.execute("ROLLBACK")
    except Exception:
        _terminate(conn)


def _check_int(name: str, value: object, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ThreadStoreConfigurationError(f"option {name} must be an integer >= {minimum}")


def _check_seconds(name: str, value: object) -> None:
    if type(value) not in (int, float) or not 0 < cast(float, value) < 86_400:
        raise ThreadStoreConfigurationError(f"option {name} must be a number of seconds > 0")


# ---------------------------------------------------------------- relationships


def by_keys(table: str, column: str, select: str) -> str:
    """Rows of one thread whose ``column`` is in the ``$3`` array, one index probe per key.

    A ``LATERAL`` probe per key rather than ``= ANY($3)`` or a plain join: a
    generic plan believes a thread holds a handful of rows (the average), and
    would happily walk the whole thread and filter, O(thread) instead of O(keys).
    """
    cols = ", ".join(c.split(" AS ")[0].removeprefix("t.") for c in select.split(", "))
    where = f"scope_key = $1 AND thread_id = $2 AND {column} = k.id"
    if column == "run_id":
        where += " AND run_id IS NOT NULL"
    return (
        f"SELECT {select} FROM unnest($3::bytea[]) AS k(id) "
        # OFFSET 0 keeps the subquery from being pulled up into a join: it runs
        # once per key, as an equality probe of the (scope, thread, key) index.
        f"CROSS JOIN LATERAL (SELECT {cols} FROM {table} WHERE {where} OFFSET 0) AS t"
    )


async def keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to undo.

    asyncpg still rolls back an open transaction on release; its default reset
    (``RESET ALL``, ``UNLISTEN *``, ...) would cost one more round trip per
    operation for session state this store never creates.
    """


def open_runs_statement(tables: Tables) -> str:
    """Up to two running or waiting runs: one equality range scan per status, so
    no plan can fall back to walking every run of the thread."""
    branch = (
        f"SELECT run_id, doc FROM {tables.runs} WHERE scope_key = $1 AND thread_id = $2 "
        "AND status = '{}' LIMIT 2"
    )
    return f"({branch.format('running')}) UNION ALL ({branch.format('waiting')})"


def tail_statement(tables: Tables) -> str:
    return (
        f"SELECT position, message_id, run_id, relation FROM {tables.messages} "
        "WHERE scope_key = $1 AND thread_id = $2 ORDER BY position DESC LIMIT 1"
    )


class _Reader:
    """Post-commit relationship facts, queried inside the commit's transaction."""

    def __init__(self, conn: asyncpg.Connection, tables: Tables, scope: bytes, thread: bytes):
        self._conn = conn
        self._t = tables
        self._scope = scope
        self._thread = thread

    async def run_facts(self, run_ids: Iterable[str]) -> Mapping[str, RunFacts]:
        ids = list(run_ids)
        keys = [enc(i) for i in ids]
        conn, s, th = self._conn, self._scope, self._thread
        runs = await conn.fetch(
            by_keys(self._t.runs, "run_id", "t.run_id, t.doc"),
            s,
            th,
            keys,
        )
        messages = await conn.fetch(
            by_keys(self._t.messages, "run_id", "t.run_id, t.position, t.message_id, t.relation"),
            s,
            th,
            keys,
        )
        messages = sorted(messages, key=lambda r: int(r["position"]))
        items = await conn.fetch(
            by_keys(self._t.queued, "run_id", "t.run_id, t.queue_item_id, t.position"),
            s,
            th,
            keys,
        )
        items = sorted(items, key=lambda r: int(r["position"]))
        facts: dict[str, RunFacts] = {i: RunFacts(None, [], False, []) for i in ids}
        for r in runs:
            rid = dec(r["run_id"])
            status, admitted, queue_item, inputs = run_ref_fields(r["doc"])
            facts[rid].run = RunRef(rid, status, admitted, queue_item, inputs)
        for r in messages:
            rid = dec(r["run_id"])
            cast(list[MessageRef], facts[rid].messages).append(
                MessageRef(dec(r["message_id"]), int(r["position"]), rid, r["relation"])
            )
        for r in items:
            rid = dec(r["run_id"])
            cast(list[QueueRef], facts[rid].queued_items).append(
                QueueRef(dec(r["queue_item_id"]), rid)
            )
        # Positions are dense as written: a run whose span has no gap cannot
        # hold a foreign message. Only spans with gaps need a look inside.
        spans = [
            (rid, f.messages[0].position, f.messages[-1].position)
            for rid, f in facts.items()
            if f.messages
            and f.messages[-1].position - f.messages[0].position + 1 != len(f.messages)
        ]
        if spans:
            rows = await conn.fetch(
                f"SELECT r.run_id FROM unnest($3::bytea[], $4::bigint[], $5::bigint[]) "
                "AS r(run_id, lo, hi) WHERE EXISTS ("
                f"SELECT 1 FROM {self._t.messages} m WHERE m.scope_key = $1 "
                "AND m.thread_id = $2 AND m.position > r.lo AND m.position < r.hi "
                "AND m.run_id IS DISTINCT FROM r.run_id)",
                s,
                th,
                [enc(rid) for rid, _, _ in spans],
                [lo for _, lo, _ in spans],
                [hi for _, _, hi in spans],
            )
            for r in rows:
                facts[dec(r["run_id"])].foreign_inside = True
        return facts

    async def open_runs(self) -> Sequence[RunRef]:
        rows = await self._conn.fetch(open_runs_statement(self._t), self._scope, self._thread)
        out = []
        for r in rows:
            status, admitted, queue_item, inputs = run_ref_fields(r["doc"])
            out.append(RunRef(dec(r["run_id"]), status, admitted, queue_item, inputs))
        return out

    async def tail(self) -> MessageRef | None:
        r = await self._conn.fetchrow(tail_statement(self._t), self._scope, self._thread)
        if r is None:
            return None
        run_id = dec(r["run_id"]) if r["run_id"] is not None else None
        return MessageRef(dec(r["message_id"]), int(r["position"]), run_id, r["relation"])
