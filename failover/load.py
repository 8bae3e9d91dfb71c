"""A bounded load of racing writers on every store, and the checks after a fault.

:class:`Load` drives one :class:`pai_storage.Stores` bundle on one event loop:

- **threads**: several conversation threads, two writers racing on each. A
  writer commits one message per attempt at the version it last saw; the text
  names the writer, its attempt and the base revision;
- **kv**: two writers racing ``put_if_version`` on one key whose value is the
  log of every write so far (each write appends its own entry to the value it
  read), so the final value is the whole history;
- **state**: two writers racing ``append_list`` on one list;
- **guard**: two writers racing ``try_acquire`` on a fresh resource per round,
  holding it briefly and releasing it.

Every attempt is recorded with its outcome: acknowledged, conflict (nothing
applied), ``UnavailableError`` (nothing applied), ``OutcomeUnknownError``
(either), another typed error, or a raw exception (a contract breach). After
the fault, :meth:`Load.verify` reads everything back through an independent
:class:`~failover.witness.Witness` (a plain driver client on the server, never
the stores that wrote it) and judges every attempt: an acknowledged write is
present with its exact content at the version it was acknowledged with, an
unknown one is present once or not at all, a write reported as not applied is
absent, and no version was acknowledged twice. (The execution guard's holds
and fencing tokens are judged from what the writers saw while they ran.)
"""

from __future__ import annotations

import asyncio
import itertools
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from failover.witness import Witness
from pai_storage import (
    CommittedResult,
    Item,
    Lock,
    LockInfo,
    OutcomeUnknownError,
    StorageError,
    Stores,
    ThreadVersion,
    UnavailableError,
)
from pai_storage import builders as b

SCOPE = "failover"
KV_NS = ("failover",)
KV_KEY = "history"
STATE_USER = "failover-user"
STATE_SESSION = "failover-session"
STATE_KEY = "events"
LEASE = timedelta(seconds=60)
STORES = ("threads", "kv", "state", "guard")
LISTED = 15  # entries of each kind the report lists

ACK = "acknowledged"
CONFLICT = "conflict"
UNAVAILABLE = "unavailable"
UNKNOWN = "unknown"
OTHER = "other-error"
RAW = "raw-exception"


@dataclass
class Attempt:
    """One write and what the store said about it."""

    store: str
    writer: str
    key: str
    """What identifies the write in the stored data (message id, log entry, ...)."""
    started: float
    ended: float = 0.0
    outcome: str = ""
    error: str = ""
    version: int | None = None
    """The version (revision, KV version, list length) the store acknowledged."""
    content: Any = None
    resolution: str = ""
    """For an unknown outcome: ``applied once`` or ``not applied`` after the re-read."""


@dataclass
class Report:
    """What one scenario showed, per store and in total."""

    scenario: str
    backend: str
    acknowledged: Counter[str] = field(default_factory=Counter)
    found: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    unavailable: Counter[str] = field(default_factory=Counter)
    conflicts: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Typed errors other than unavailable/unknown, and raw exceptions (both breaches)."""
    recovery_s: dict[str, float | None] = field(default_factory=dict)
    load_s: float = 0.0
    longest_stall_s: float = 0.0
    """The longest time between two acknowledged thread commits."""
    notes: list[str] = field(default_factory=list)
    known_defects: list[str] = field(default_factory=list)
    """Violations of a kind a strict-xfail test reproduces on its own (listed, not judged)."""

    def set_aside(self, matches: Callable[[str], bool], why: str) -> None:
        """Move the violations and errors ``matches`` accepts to :attr:`known_defects`."""
        known = [entry for entry in self.violations + self.errors if matches(entry)]
        self.violations = [entry for entry in self.violations if not matches(entry)]
        self.errors = [entry for entry in self.errors if not matches(entry)]
        self.known_defects += [f"{entry} [{why}]" for entry in known]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.violations or self.errors) and all(
            self.recovery_s.get(store) is not None for store in STORES
        )

    def render(self) -> str:
        def seconds(value: float | None) -> str:
            return "never" if value is None else f"{value:.2f} s"

        lines = [
            f"[{self.backend}] {self.scenario}: {'OK' if self.ok else 'FAILED'} "
            f"(load ran {self.load_s:.1f} s)",
            f"  {'store':<8} {'acked':>6} {'found':>6} {'lost':>5} {'unknown':>8} "
            f"{'unavail':>8} {'conflict':>8}  recovery",
        ]
        lost = Counter(entry.split(" ", 1)[0] for entry in self.lost)
        unknown = Counter(entry.split(" ", 1)[0] for entry in self.unknown)
        for store in STORES:
            lines.append(
                f"  {store:<8} {self.acknowledged[store]:>6} {self.found[store]:>6} "
                f"{lost[store]:>5} {unknown[store]:>8} {self.unavailable[store]:>8} "
                f"{self.conflicts[store]:>8}  {seconds(self.recovery_s.get(store))}"
            )
        total_acked = sum(self.acknowledged.values())
        total_found = sum(self.found.values())
        lines.append(
            f"  total: acknowledged {total_acked}, found {total_found}, lost {len(self.lost)}, "
            f"unknown outcomes {len(self.unknown)}, seconds to recovery (first commit after "
            f"the fault) {seconds(self.recovery_s.get('threads'))}, longest time without "
            f"a commit {self.longest_stall_s:.2f} s"
        )
        for label, entries in (
            ("unknown outcome", self.unknown),
            ("LOST", self.lost),
            ("VIOLATION", self.violations),
            ("ERROR", self.errors),
            ("KNOWN DEFECT", self.known_defects),
        ):
            lines += [f"  {label}: {entry}" for entry in entries[:LISTED]]
            if len(entries) > LISTED:
                lines.append(f"  ... and {len(entries) - LISTED} more of {label}")
        lines += [f"  note: {entry}" for entry in self.notes]
        return "\n".join(lines)


def _describe(exc: BaseException) -> str:
    cause = exc.__cause__
    text = f"{type(exc).__name__}: {str(exc)[:160]}"
    if cause is not None:
        text += f" (from {type(cause).__module__}.{type(cause).__name__})"
    return text


def _classify(exc: BaseException) -> str:
    if isinstance(exc, OutcomeUnknownError):
        return UNKNOWN
    if isinstance(exc, UnavailableError):
        return UNAVAILABLE
    if isinstance(exc, StorageError):
        return OTHER
    return RAW


class Load:
    """Racing writers on every store of ``stores`` (see the module docstring)."""

    def __init__(self, stores: Stores, *, threads: int = 3, pause: float = 0.01) -> None:
        self.stores = stores
        self.thread_ids = [f"t{i}" for i in range(threads)]
        self.pause = pause
        self.attempts: list[Attempt] = []
        self.holds: dict[str, list[tuple[float, float, str]]] = {}
        """Per guard resource: (from, to, who) of every acquisition known to have applied."""
        self.tokens: list[tuple[str, int, float]] = []
        self._stop = asyncio.Event()
        self.fault_at: float | None = None
        self.load_s = 0.0

    # ------------------------------------------------------------ setup

    async def setup(self) -> None:
        """Create the threads (each with one seed message) before the load starts."""
        for thread_id in self.thread_ids:
            created = await self.stores.threads.commit_thread(
                b.create(SCOPE, thread_id, {"messages": [b.insert(b.message("seed", "seed"))]})
            )
            assert isinstance(created, CommittedResult), created

    # ------------------------------------------------------------ running

    async def run(
        self,
        fault: Callable[[], Awaitable[float | None]],
        *,
        heal: Callable[[], Awaitable[float | None]] | None = None,
        before: float = 1.5,
        hold: float = 2.0,
        after: float = 1.5,
        recovery_limit: float = 45.0,
    ) -> None:
        """Load, inject ``fault``, wait for recovery (then ``hold`` s, ``heal``), stop.

        ``fault`` may return the (``time.monotonic``) moment the fault took
        effect when it does more afterwards (such as promoting a standby).

        The load runs ``before`` seconds before the fault and ``after`` seconds
        after recovery (and after ``heal``). Recovery is the first acknowledged
        thread commit that started after the fault; the load goes on until every
        store has one such write (a store's writer may be a few slow round trips
        behind the threads on a busy machine), at most ``recovery_limit`` seconds.
        """
        tasks = [
            asyncio.create_task(self._thread_writer(thread_id, f"{thread_id}w{n}"))
            for thread_id in self.thread_ids
            for n in range(2)
        ]
        tasks += [asyncio.create_task(self._kv_writer(f"kv{n}")) for n in range(2)]
        tasks += [asyncio.create_task(self._state_writer(f"st{n}")) for n in range(2)]
        tasks += [asyncio.create_task(self._guard_writer(f"g{n}")) for n in range(2)]
        started = time.monotonic()
        try:
            await asyncio.sleep(before)
            # Timed from the moment the fault has happened (the step-down returned,
            # the process is dead or stopped), or from the moment ``fault`` returns.
            moment = await fault()
            self.fault_at = time.monotonic() if moment is None else moment
            deadline = self.fault_at + recovery_limit
            while (
                any(self.first_ack_after_fault(store) is None for store in STORES)
                and time.monotonic() < deadline
            ):
                if all(task.done() for task in tasks):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(hold)
            if heal is not None:
                await heal()
            await asyncio.sleep(after)
        finally:
            self._stop.set()
            done, pending = await asyncio.wait(tasks, timeout=60)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
            self.load_s = time.monotonic() - started
        failed = [task.exception() for task in done if task.exception() is not None]
        if failed:
            raise failed[0]  # type: ignore[misc]
        if pending:
            raise AssertionError(f"{len(pending)} writers did not stop within 60 s")

    def first_ack_after_fault(self, store: str) -> float | None:
        if self.fault_at is None:
            return None
        ends = [
            a.ended
            for a in self.attempts
            if a.store == store and a.outcome == ACK and a.started >= self.fault_at
        ]
        return min(ends) - self.fault_at if ends else None

    async def _attempt(self, attempt: Attempt, call: Awaitable[Any]) -> Any:
        """Await ``call``; record its outcome on ``attempt``; return its result or None."""
        self.attempts.append(attempt)
        try:
            result = await call
        except Exception as exc:
            attempt.ended = time.monotonic()
            attempt.outcome = _classify(exc)
            attempt.error = _describe(exc)
            if attempt.outcome == RAW:
                frames = traceback.extract_tb(exc.__traceback__)[-4:]
                attempt.error += " at " + " <- ".join(
                    f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames)
                )
            return None
        attempt.ended = time.monotonic()
        return result

    async def _retrying(self, read: Callable[[], Awaitable[Any]], what: str) -> Any:
        """A read retried until it answers (reads are idempotent); raw errors still count."""
        deadline = time.monotonic() + 90
        while True:
            try:
                return await read()
            except (UnavailableError, OutcomeUnknownError):
                if time.monotonic() > deadline:
                    raise
            except Exception as exc:
                self.attempts.append(
                    Attempt(
                        "read",
                        what,
                        what,
                        time.monotonic(),
                        time.monotonic(),
                        _classify(exc),
                        _describe(exc),
                    )
                )
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)

    async def _version(self, thread_id: str) -> ThreadVersion:
        read = await self._retrying(
            lambda: self.stores.threads.read_thread(b.read(SCOPE, thread_id)), f"read {thread_id}"
        )
        assert read.thread is not None
        version: ThreadVersion = read.thread.version
        return version

    async def _thread_writer(self, thread_id: str, writer: str) -> None:
        version: ThreadVersion | None = None
        n = 0
        while not self._stop.is_set():
            if version is None:
                version = await self._version(thread_id)
            n += 1
            message_id = f"{writer}-{n}"
            text = f"{writer} attempt {n} on revision {version.revision}"
            attempt = Attempt("threads", writer, f"{thread_id}/{message_id}", time.monotonic())
            attempt.content = text
            result = await self._attempt(
                attempt,
                self.stores.threads.commit_thread(
                    b.update_at(
                        SCOPE,
                        thread_id,
                        version,
                        {"messages": [b.insert(b.message(message_id, text))]},
                        root=b.root(),
                    )
                ),
            )
            if result is None:
                version = None
                await asyncio.sleep(0.05)
                continue
            if isinstance(result, CommittedResult):
                attempt.outcome = ACK
                assert result.thread is not None
                attempt.version = result.thread.version.revision
                version = result.thread.version
            else:
                attempt.outcome = CONFLICT
                version = result.current_version
            await asyncio.sleep(self.pause)

    async def _kv_writer(self, writer: str) -> None:
        kv = self.stores.kv
        current: Item | None = None
        fresh = False
        n = 0
        while not self._stop.is_set():
            if not fresh:
                current = await self._retrying(lambda: kv.get(KV_NS, KV_KEY), "kv get")
                fresh = True
            n += 1
            entry = f"{writer}-{n}"
            log = [] if current is None else list(current.value["log"])
            attempt = Attempt("kv", writer, entry, time.monotonic())
            result = await self._attempt(
                attempt,
                kv.put_if_version(
                    KV_NS,
                    KV_KEY,
                    {"log": [*log, entry]},
                    None if current is None else current.version,
                ),
            )
            if result is None:
                fresh = False
                await asyncio.sleep(0.05)
            elif isinstance(result, Item):
                attempt.outcome = ACK
                attempt.version = result.version
                attempt.content = result.value
                current = result
            else:
                attempt.outcome = CONFLICT
                current = result.current
            await asyncio.sleep(self.pause)

    async def _state_writer(self, writer: str) -> None:
        state = self.stores.state
        n = 0
        while not self._stop.is_set():
            n += 1
            item = {"writer": writer, "n": n}
            attempt = Attempt("state", writer, f"{writer}-{n}", time.monotonic())
            attempt.content = item
            length = await self._attempt(
                attempt, state.append_list(STATE_USER, STATE_SESSION, STATE_KEY, [item])
            )
            if length is None:
                await asyncio.sleep(0.05)
            else:
                attempt.outcome = ACK
                attempt.version = length
            await asyncio.sleep(self.pause)

    async def _guard_writer(self, writer: str) -> None:
        guard = self.stores.guard
        n = 0
        while not self._stop.is_set():
            n += 1
            resource = f"job-{n}"  # both writers race for round n's resource
            owner = f"{writer}-{n}"
            attempt = Attempt("guard", writer, f"{resource} by {owner}", time.monotonic())
            lock: Lock | None = await self._attempt(
                attempt, guard.try_acquire(resource, owner=owner, lease_ttl=LEASE)
            )
            if lock is not None:
                attempt.outcome = ACK
                attempt.version = lock.fencing_token
                self.tokens.append((resource, lock.fencing_token, attempt.ended))
                await asyncio.sleep(0.02)
                # Who holds it right before the release: tells a lost lock from a release
                # that answers wrongly.
                try:
                    before: LockInfo | None = await guard.inspect(resource)
                    held_before: bool | None = before is not None and before.owner == owner
                except StorageError:
                    held_before = None
                released_at = time.monotonic()
                release = Attempt("guard", writer, f"release {resource} by {owner}", released_at)
                done = await self._attempt(release, lock.release())
                if done is True:
                    release.outcome = ACK
                    self._held(resource, attempt.ended, released_at, owner)
                elif done is False:
                    release.outcome = ACK
                    self._held(resource, attempt.ended, released_at, owner)
                    release.resolution = (
                        "answered not held for a lock it held"
                        if held_before
                        else "not held any more"
                    )
                    info = await self._inspect(resource)
                    release.error = (
                        f"acquired {self._since_fault(attempt.started)}-"
                        f"{self._since_fault(attempt.ended)}, released "
                        f"{self._since_fault(released_at)}-{self._since_fault(release.ended)}, "
                        f"held right before: {held_before}, lost flag {lock.lost.is_set()}, "
                        f"fencing {lock.fencing_token}, "
                        f"now held by {info.owner if info else None}"
                    )
                else:
                    # Released or not? Re-read the lock: still ours means held to its lease.
                    info = await self._inspect(resource)
                    still = info is not None and info.owner == owner
                    release.resolution = "not applied" if still else "applied once"
                    self._held(
                        resource, attempt.ended, float("inf") if still else released_at, owner
                    )
            elif attempt.outcome == "":
                attempt.outcome = CONFLICT  # busy: another writer holds it
            elif attempt.outcome == UNKNOWN:
                info = await self._inspect(resource)
                applied = info is not None and info.owner == owner
                attempt.resolution = "applied once" if applied else "not applied"
                if applied:
                    assert info is not None
                    self.tokens.append((resource, info.fencing_token, attempt.ended))
                    self._held(resource, attempt.started, float("inf"), owner)
            elif attempt.outcome == UNAVAILABLE:
                info = await self._inspect(resource)
                if info is not None and info.owner == owner:
                    attempt.resolution = "applied although reported unavailable"
                await asyncio.sleep(0.05)
            await asyncio.sleep(self.pause)

    async def _inspect(self, resource: str) -> LockInfo | None:
        info: LockInfo | None = await self._retrying(
            lambda: self.stores.guard.inspect(resource), "inspect"
        )
        return info

    def _since_fault(self, moment: float) -> str:
        return "?" if self.fault_at is None else f"{moment - self.fault_at:+.2f}s"

    def _held(self, resource: str, start: float, end: float, owner: str) -> None:
        self.holds.setdefault(resource, []).append((start, end, owner))

    # ------------------------------------------------------------ checking

    async def verify(self, report: Report, witness: Witness) -> None:
        """Read everything back through ``witness`` and judge every attempt."""
        report.load_s = self.load_s
        for attempt in self.attempts:
            if attempt.outcome == ACK and attempt.store != "read":
                report.acknowledged[attempt.store] += 1
            elif attempt.outcome == CONFLICT:
                report.conflicts[attempt.store] += 1
            elif attempt.outcome == UNAVAILABLE:
                report.unavailable[attempt.store] += 1
            elif attempt.outcome in (OTHER, RAW):
                report.errors.append(
                    f"{attempt.store} {attempt.key}: {attempt.outcome}: {attempt.error}"
                )
        await self._verify_threads(report, witness)
        await self._verify_kv(report, witness)
        await self._verify_state(report, witness)
        report.notes.append(f"verified with {witness.describe()}")
        self._verify_guard(report)
        for store in STORES:
            report.recovery_s[store] = self.first_ack_after_fault(store)
        acks = sorted(a.ended for a in self.attempts if a.store == "threads" and a.outcome == ACK)
        report.longest_stall_s = max(
            (later - earlier for earlier, later in itertools.pairwise(acks)), default=0.0
        )
        for attempt in self.attempts:
            if attempt.outcome == UNKNOWN:
                report.unknown.append(
                    f"{attempt.store} {attempt.key}: {attempt.error.split(':', 1)[0]} -> "
                    f"{attempt.resolution or 'UNRESOLVED'}"
                )
                if attempt.resolution not in ("applied once", "not applied"):
                    report.violations.append(f"unresolved unknown outcome: {attempt.key}")

    def _judge_absent_or_once(
        self, report: Report, attempt: Attempt, count: int, store: str
    ) -> None:
        """An attempt that was not acknowledged: unknown resolves, the others stay absent."""
        if attempt.outcome == UNKNOWN:
            if count > 1:
                report.violations.append(f"{store} {attempt.key} applied {count} times")
            if store != "guard":
                attempt.resolution = "applied once" if count == 1 else "not applied"
        elif attempt.outcome in (CONFLICT, UNAVAILABLE) and count:
            report.violations.append(
                f"{store} {attempt.key} reported {attempt.outcome} (nothing applied) "
                f"but is stored {count} time(s); the error was {attempt.error}"
            )

    async def _verify_threads(self, report: Report, witness: Witness) -> None:
        for thread_id in self.thread_ids:
            revision, messages = await witness.messages(SCOPE, thread_id)
            ids = Counter(mid for mid, _ in messages)
            position = {mid: index for index, (mid, _) in enumerate(messages)}
            for mid, count in ids.items():
                if count > 1:
                    report.violations.append(f"threads {thread_id}/{mid} stored {count} times")
            # One message per commit: revision r holds the messages of commits 1..r, and
            # the commit that made revision k+1 was planned on revision k.
            if revision != len(messages):
                report.violations.append(
                    f"threads {thread_id}: revision {revision} but {len(messages)} messages"
                )
            for index, (mid, text) in enumerate(messages[1:], start=1):
                if not text.endswith(f" on revision {index}"):
                    report.violations.append(
                        f"threads {thread_id}: message {mid} at position {index} was planned "
                        f"on another revision ({text!r}): two commits for one version"
                    )
            for attempt in self.attempts:
                if attempt.store != "threads" or not attempt.key.startswith(f"{thread_id}/"):
                    continue
                mid = attempt.key.split("/", 1)[1]
                if attempt.outcome == ACK:
                    where = position.get(mid)
                    if where is None:
                        report.lost.append(f"threads {attempt.key} (revision {attempt.version})")
                        continue
                    if messages[where][1] != attempt.content:
                        report.violations.append(f"threads {attempt.key}: content differs")
                    elif attempt.version != where + 1:
                        report.violations.append(
                            f"threads {attempt.key}: acknowledged as revision {attempt.version} "
                            f"but stored at position {where}"
                        )
                    else:
                        report.found["threads"] += 1
                else:
                    self._judge_absent_or_once(report, attempt, ids[mid], "threads")

    async def _verify_kv(self, report: Report, witness: Witness) -> None:
        item = await witness.kv(KV_NS, KV_KEY)
        log: list[str] = [] if item is None else item[1]["log"]
        counts = Counter(log)
        if item is not None and item[0] != len(log):
            report.violations.append(f"kv: version {item[0]} but {len(log)} writes logged")
        versions = Counter(a.version for a in self.attempts if a.store == "kv" and a.outcome == ACK)
        for version, count in versions.items():
            if count > 1:
                report.violations.append(f"kv: version {version} acknowledged {count} times")
        for attempt in self.attempts:
            if attempt.store != "kv":
                continue
            if attempt.outcome == ACK:
                assert attempt.version is not None
                if counts[attempt.key] == 0:
                    report.lost.append(f"kv {attempt.key} (version {attempt.version})")
                elif log[: attempt.version] != list(attempt.content["log"]):
                    report.violations.append(f"kv {attempt.key}: not the acknowledged history")
                else:
                    report.found["kv"] += 1
            else:
                self._judge_absent_or_once(report, attempt, counts[attempt.key], "kv")

    async def _verify_state(self, report: Report, witness: Witness) -> None:
        items = await witness.state_list(STATE_USER, STATE_SESSION, STATE_KEY)
        keys = [f"{item['writer']}-{item['n']}" for item in items]
        counts = Counter(keys)
        for attempt in self.attempts:
            if attempt.store != "state":
                continue
            if attempt.outcome == ACK:
                assert attempt.version is not None
                if counts[attempt.key] == 0:
                    report.lost.append(f"state {attempt.key} (length {attempt.version})")
                elif attempt.version > len(items) or items[attempt.version - 1] != attempt.content:
                    report.violations.append(
                        f"state {attempt.key}: acknowledged at length {attempt.version}, "
                        f"stored elsewhere"
                    )
                else:
                    report.found["state"] += 1
            else:
                self._judge_absent_or_once(report, attempt, counts[attempt.key], "state")
            if counts[attempt.key] > 1:
                report.violations.append(f"state {attempt.key} appended {counts[attempt.key]}x")

    def _verify_guard(self, report: Report) -> None:
        for attempt in self.attempts:
            if attempt.store != "guard":
                continue
            if attempt.outcome == ACK and attempt.resolution not in (
                "not held any more",
                "answered not held for a lock it held",
            ):
                report.found["guard"] += 1  # checked below: no overlap, fencing order
            if attempt.resolution == "not held any more":
                report.lost.append(
                    f"guard {attempt.key}: the acknowledged lock was gone ({attempt.error})"
                )
            if attempt.resolution == "answered not held for a lock it held":
                report.violations.append(
                    f"guard {attempt.key}: release answered False (not held) for a lock held "
                    f"right before it ({attempt.error})"
                )
            if attempt.resolution == "applied although reported unavailable":
                report.violations.append(f"guard {attempt.key}: {attempt.resolution}")
        for resource, holds in self.holds.items():
            holds.sort()
            for (_, end, who), (start, _, other) in itertools.pairwise(holds):
                if start < end:
                    report.violations.append(f"guard {resource}: held by {who} and {other} at once")
        tokens = Counter(token for _, token, _ in self.tokens)
        for token, count in tokens.items():
            if count > 1:
                report.violations.append(f"guard: fencing token {token} issued {count} times")
        by_resource: dict[str, list[tuple[float, int]]] = {}
        for resource, token, at in self.tokens:
            by_resource.setdefault(resource, []).append((at, token))
        for resource, seen in by_resource.items():
            ordered = [token for _, token in sorted(seen)]
            if ordered != sorted(ordered):
                report.violations.append(f"guard {resource}: fencing tokens out of order")


async def commit_once_more(stores: Stores, thread_id: str) -> None:
    """One more commit and read on every store: the same objects work after the fault."""
    threads = stores.threads
    read = await threads.read_thread(b.read(SCOPE, thread_id))
    assert read.thread is not None
    result = await threads.commit_thread(
        b.update_at(
            SCOPE,
            thread_id,
            read.thread.version,
            {"messages": []},
            root=b.root(title="after the fault"),
        )
    )
    assert isinstance(result, CommittedResult), result
    assert isinstance(await stores.kv.put(KV_NS, "after", {"ok": True}), Item)
    assert await stores.state.save(STATE_USER, STATE_SESSION, "after", 1) >= 1
    lock = await stores.guard.try_acquire("after", owner="after", lease_ttl=LEASE)
    assert lock is not None
    assert await lock.release()
