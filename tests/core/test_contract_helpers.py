"""The core helpers a backend author calls (``docs/backend-authors.md``), through public names.

``assert_commit_input`` validates a commit input mechanically;
``apply_thread_root_update`` stamps the root a normalized backend writes;
``apply_thread_changes`` is the reference model and never modifies its input;
a list plan runs over roots held in memory (``select``) or kept sorted
(``select_sorted``), with the same pages; page tokens bind the scope through
its digest, never the scope key itself. The conformance plugin is a ``pytest11``
entry point; ``--pai-url`` (else ``PAI_TEST_<NAME>_URL``) names the server, and
an unreachable one fails the run loudly.
"""

from __future__ import annotations

import base64
import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pai_storage import (
    CommitThreadInput,
    ConflictResult,
    ListThreadsInput,
    ThreadLease,
    ThreadRecord,
)
from pai_storage import builders as b
from pai_storage.backend import (
    ListPlan,
    PageTokenCodec,
    SelectionHelpers,
    apply_thread_changes,
    apply_thread_root_update,
    assert_commit_input,
    default_scope_digest,
)
from pai_storage.errors import (
    ThreadStoreInvariantError,
    ThreadStorePageTokenError,
    ThreadStoreSerializationError,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(seconds=5)


def test_the_core_helpers_are_public_names() -> None:
    import pai_storage.backend as backend
    import pai_storage.parsing as parsing

    for name in (
        "assert_commit_input",
        "apply_thread_changes",
        "apply_thread_root_update",
        "relationship_check",
        "SelectionHelpers",
        "PageTokenCodec",
        "default_scope_digest",
        "read_aggregate",
    ):
        assert name in backend.__all__, name
        assert getattr(backend, name) is not None
    for name in (
        "parse",
        "parse_thread",
        "parse_message",
        "parse_run",
        "parse_queued_item",
        "parse_aggregate",
        "parse_commit_result",
    ):
        assert name in parsing.__all__, name
    helpers = SelectionHelpers("pai-test")
    for method in ("plan_read", "plan_list"):
        assert callable(getattr(helpers, method))
    plan = helpers.plan_list(ListThreadsInput.model_validate({"scopeKey": "s", "limit": 1}))
    for method in ("matches", "finish", "select", "select_sorted"):
        assert callable(getattr(plan, method))


# ------------------------------------------------------------------ assert_commit_input


def test_assert_commit_input_takes_the_json_form_and_the_model() -> None:
    form = b.create("scope", "t1", {"messages": [b.insert(b.message("m1"))]}, title="x")
    parsed = assert_commit_input(form)
    assert isinstance(parsed, CommitThreadInput)
    assert (parsed.scope_key, parsed.thread_id) == ("scope", "t1")
    assert parsed.condition.type == "missing"
    assert assert_commit_input(parsed) is parsed


@pytest.mark.parametrize("value", [["scopeKey"], "commit", 7, None])
def test_assert_commit_input_refuses_what_is_not_a_commit(value: Any) -> None:
    with pytest.raises(ThreadStoreInvariantError) as caught:
        assert_commit_input(value)
    assert "commit input" in str(caught.value)


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda c: c.pop("scopeKey"), "scopeKey"),
        (lambda c: c["mutation"]["root"].pop("agent"), "agent"),
        (
            lambda c: c["mutation"]["changes"]["messages"][0]["record"].pop("messageId"),
            "messageId",
        ),
        (lambda c: c["condition"].update(type="sometimes"), "condition"),
    ],
    ids=["scope", "agent", "message-id", "condition"],
)
def test_assert_commit_input_names_the_path_of_the_problem(mutate: Any, path: str) -> None:
    form = b.create("scope", "t1", {"messages": [b.insert(b.message("m1"))]})
    mutate(form)
    with pytest.raises(ThreadStoreInvariantError) as caught:
        assert_commit_input(form)
    assert path in str(caught.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), b"bytes", {1: "int key"}])
def test_assert_commit_input_refuses_values_that_are_not_strict_json(bad: Any) -> None:
    form = b.create("scope", "t1", metadata={"bad": bad})
    with pytest.raises(ThreadStoreSerializationError):
        assert_commit_input(form)


# ------------------------------------------------------------- apply_thread_root_update


def _lease(run_id: str = "r1") -> ThreadLease:
    return ThreadLease.model_validate(
        {
            "kind": "run",
            "runId": run_id,
            "ownerId": "w",
            "operation": "send",
            "acquiredAt": "2030-01-01T00:00:00.000Z",
            "expiresAt": "2030-01-01T00:00:30.000Z",
        }
    )


def test_a_create_gets_revision_one_a_fresh_instance_and_now() -> None:
    commit = assert_commit_input(
        b.create(
            "scope",
            "t1",
            agent="helper",
            parentThreadId="parent",
            category="cat",
            title="hello",
            metadata={"a": 1},
            privateMetadata={"p": True},
        )
    )
    lease = _lease()
    root = apply_thread_root_update(None, commit, T0, lease, instance_id=lambda: "inst-1")
    assert isinstance(root, ThreadRecord)
    assert (root.scope_key, root.thread_id) == ("scope", "t1")
    assert root.version.thread_instance_id == "inst-1"
    assert root.version.revision == 1
    assert root.created_at == root.updated_at == T0
    assert (root.agent, root.parent_thread_id, root.category, root.title) == (
        "helper",
        "parent",
        "cat",
        "hello",
    )
    assert root.direct_execution_allowed is True
    assert root.metadata == {"a": 1}
    assert root.private_metadata == {"p": True}
    assert root.lease == lease
    # Without an instance-id source, every create gets a new one.
    first = apply_thread_root_update(None, commit, T0, None)
    second = apply_thread_root_update(None, commit, T0, None)
    assert first.version.thread_instance_id != second.version.thread_instance_id


def test_an_update_keeps_creation_fields_and_replaces_every_mutable_one() -> None:
    created = apply_thread_root_update(
        None,
        assert_commit_input(
            b.create(
                "scope",
                "t1",
                agent="helper",
                parentThreadId="parent",
                category="cat",
                title="hello",
                metadata={"a": 1},
                privateMetadata={"p": 1},
            )
        ),
        T0,
        _lease(),
        instance_id=lambda: "inst-1",
    )
    update = assert_commit_input(
        b.update_at(
            "scope",
            "t1",
            created.version,
            root=b.root(visibility="hidden", metadata={"b": 2}, privateMetadata={"q": 2}),
        )
    )
    root = apply_thread_root_update(created, update, T1, None)
    assert root.version.thread_instance_id == "inst-1"
    assert root.version.revision == 2
    # Creation-only fields are kept.
    assert (root.agent, root.parent_thread_id, root.direct_execution_allowed) == (
        "helper",
        "parent",
        True,
    )
    assert root.created_at == T0
    # Every mutable field is replaced; an omitted title or category is removed.
    assert root.list_visibility == "hidden"
    assert root.title is None
    assert root.category is None
    assert root.metadata == {"b": 2}
    assert root.private_metadata == {"q": 2}
    assert root.lease is None
    assert root.updated_at == T1
    # The previous root is not modified.
    assert created.version.revision == 1
    assert created.title == "hello"


def test_a_root_update_refuses_a_delete_and_an_update_without_its_root() -> None:
    created = apply_thread_root_update(None, assert_commit_input(b.create("s", "t")), T0, None)
    with pytest.raises(ValueError, match="delete"):
        apply_thread_root_update(
            created, assert_commit_input(b.delete("s", "t", created.version)), T1, None
        )
    with pytest.raises(ValueError, match="previous"):
        apply_thread_root_update(
            None,
            assert_commit_input(b.update_at("s", "t", created.version, root=b.root())),
            T1,
            None,
        )


# ------------------------------------------------------------------ apply_thread_changes


def test_the_reference_model_never_modifies_its_input() -> None:
    turn = {
        "messages": [b.insert(b.message("m1", run_id="r1"))],
        "runs": [b.insert(b.run("r1", inputs=["m1"]))],
        "lease": b.acquire("r1", "w"),
    }
    created = apply_thread_changes(None, b.create("s", "t", turn), T0)
    assert created.aggregate is not None
    before = copy.deepcopy(created.aggregate)
    version = created.aggregate.root.version
    # A stale version: the conflict carries the current version, the state is returned as is.
    stale = b.update_at("s", "t", {"threadInstanceId": "other", "revision": 1}, root=b.root())
    conflict = apply_thread_changes(created.aggregate, stale, T1)
    assert isinstance(conflict.result, ConflictResult)
    assert conflict.result.current_version == version
    assert conflict.aggregate is created.aggregate
    # A commit that applies leaves the old aggregate as it was.
    closed = apply_thread_changes(
        created.aggregate,
        b.update_at(
            "s",
            "t",
            version,
            {
                "runs": [b.replace(b.run("r1", "completed", inputs=["m1"]))],
                "lease": b.release("r1", "w"),
            },
            root=b.root(),
        ),
        T1,
    )
    assert closed.aggregate is not None
    assert closed.aggregate.root.version.revision == 2
    assert created.aggregate == before
    # A rule broken by the commit applies nothing and raises.
    with pytest.raises(ThreadStoreInvariantError):
        apply_thread_changes(
            closed.aggregate,
            b.update_at(
                "s",
                "t",
                closed.aggregate.root.version,
                {"messages": [b.insert(b.message("m2", run_id="nope", relation="output"))]},
                root=b.root(),
            ),
            T1,
        )


# ------------------------------------------------------------------------- list plans


def _roots(count: int) -> list[ThreadRecord]:
    roots = []
    for i in range(count):
        commit = assert_commit_input(
            b.create(
                "s",
                f"t{i:02d}",
                agent="a" if i % 3 else "b",
                visibility="hidden" if i % 4 == 0 else "visible",
            )
        )
        # Pairs of threads share a commit time: the thread id breaks the tie.
        roots.append(
            apply_thread_root_update(None, commit, T0 + timedelta(milliseconds=i // 2), None)
        )
    return roots


@pytest.mark.parametrize(
    "filters",
    [{}, {"includeHidden": True}, {"agent": "a"}, {"agent": "b", "includeHidden": True}],
    ids=["visible", "hidden", "agent", "agent-hidden"],
)
def test_select_sorted_pages_exactly_like_select(
    filters: dict[str, Any],
) -> None:
    helpers = SelectionHelpers("pai-test")
    roots = _roots(24)
    ordered = sorted(roots, key=lambda r: (-r.updated_at.timestamp(), r.thread_id))
    token: str | None = None
    seen: list[str] = []
    pages = 0
    while True:
        request = ListThreadsInput.model_validate(
            {"scopeKey": "s", "limit": 3, "pageToken": token, **filters}
        )
        plan = helpers.plan_list(request)

        def after(key: tuple[int, str] | None) -> Iterator[ThreadRecord]:
            return (r for r in ordered if key is None or ListPlan.sort_key(r) > key)

        sorted_page = plan.select_sorted(after)
        plain_page = helpers.plan_list(request).select(list(reversed(roots)))
        assert sorted_page == plain_page
        seen += [r.thread_id for r in sorted_page.items]
        pages += 1
        token = sorted_page.next_page_token
        if token is None:
            break
    expected = [
        r.thread_id
        for r in ordered
        if (filters.get("includeHidden") or r.list_visibility == "visible")
        and ("agent" not in filters or r.agent == filters["agent"])
    ]
    assert seen == expected
    assert pages == max(1, -(-len(expected) // 3))


def test_select_sorted_stops_reading_once_the_page_is_full() -> None:
    helpers = SelectionHelpers("pai-test")
    roots = _roots(40)
    ordered = sorted(roots, key=lambda r: (-r.updated_at.timestamp(), r.thread_id))
    plan = helpers.plan_list(ListThreadsInput.model_validate({"scopeKey": "s", "limit": 2}))
    read: list[str] = []

    def after(key: tuple[int, str] | None) -> Iterator[ThreadRecord]:
        for root in ordered:
            read.append(root.thread_id)
            yield root

    page = plan.select_sorted(after)
    assert len(page.items) == 2
    assert page.next_page_token is not None
    # Three visible roots (two for the page, one to know there is more), and the
    # hidden roots in between: never the whole scope.
    visible = [r for r in ordered if r.list_visibility == "visible"]
    assert read[-1] == visible[2].thread_id
    assert len(read) < len(ordered)


# ------------------------------------------------------------------ token scope binding


def _payload(token: str) -> str:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))[:-16].decode()


def test_a_token_binds_the_scope_through_its_digest_only() -> None:
    codec = PageTokenCodec("pai-test")
    scope = "tenant-with-a-recognizable-name"
    token = codec.encode("threads", scope, "q", {"u": 1, "t": "x"})
    payload = _payload(token)
    assert scope not in payload
    assert default_scope_digest(scope) in payload
    assert codec.decode(token, "threads", scope, "q") == {"u": 1, "t": "x"}
    with pytest.raises(ThreadStorePageTokenError):
        codec.decode(token, "threads", scope.upper(), "q")


def test_a_backend_chooses_the_scope_binding() -> None:
    # A provider whose scopes are case-insensitive binds tokens to the folded scope.
    folded = PageTokenCodec("pai-test", scope_digest=lambda s: default_scope_digest(s.casefold()))
    token = folded.encode("threads", "Tenant", "q", {"u": 1, "t": "x"})
    assert folded.decode(token, "threads", "tenant", "q") == {"u": 1, "t": "x"}
    with pytest.raises(ThreadStorePageTokenError):
        folded.decode(token, "threads", "other", "q")
    helpers = SelectionHelpers(
        "pai-test", scope_digest=lambda s: default_scope_digest(s.casefold())
    )
    assert helpers.codec.scope_digest("A") == default_scope_digest("a")
    digests = {default_scope_digest(s) for s in ("a", "b", "a\x00", "\x00a", "\u00e9", "e\u0301")}
    assert len(digests) == 6


# ------------------------------------------------------------- the conformance plugin

PG_URL = os.environ.get("PAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
UNREACHABLE = "postgresql://postgres:hunter2-secret@127.0.0.1:1/test"


def _suite(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PAI_TEST_")}
    environment.update(env or {})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-q",
            "-k",
            "TestWorkedExample",
            *args,
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_plugin_is_a_pytest11_entry_point() -> None:
    from importlib.metadata import entry_points

    (plugin,) = [e for e in entry_points(group="pytest11") if e.name == "pai_storage"]
    assert plugin.value == "pai_storage_conformance.plugin"


UNREACHABLE_BY_BACKEND = {
    "postgres": (UNREACHABLE, "cannot reach PostgreSQL"),
    "sql": ("mysql://root:hunter2-secret@127.0.0.1:1/test", "cannot reach the database"),
    "mongo": (
        "mongodb://app:hunter2-secret@127.0.0.1:1/?serverSelectionTimeoutMS=300",
        "cannot reach MongoDB",
    ),
}


@pytest.mark.parametrize(
    ("backend", "how"),
    [("postgres", "option"), ("postgres", "environment"), ("sql", "option"), ("mongo", "option")],
)
def test_an_unreachable_server_is_a_loud_failure_without_the_password(
    tmp_path: Path, backend: str, how: str
) -> None:
    url, words = UNREACHABLE_BY_BACKEND[backend]
    if how == "option":
        run = _suite(tmp_path, f"--pai-backend={backend}", f"--pai-url={url}")
    else:
        variable = f"PAI_TEST_{backend.upper()}_URL"
        run = _suite(tmp_path, f"--pai-backend={backend}", env={variable: url})
    output = run.stdout + run.stderr
    assert run.returncode not in (0, 5), output  # neither a pass nor "nothing collected"
    assert "skipped" not in output
    assert words in output
    assert "127.0.0.1:1" in output
    assert "hunter2-secret" not in output


def test_the_url_option_wins_over_the_environment(tmp_path: Path) -> None:
    run = _suite(
        tmp_path,
        "--pai-backend=postgres",
        f"--pai-url={PG_URL}",
        env={"PAI_TEST_POSTGRES_URL": UNREACHABLE},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    # And the environment alone reaches the server.
    alone = _suite(tmp_path, "--pai-backend=postgres", env={"PAI_TEST_POSTGRES_URL": PG_URL})
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "1 passed" in alone.stdout


# ------------------------------------------------------------------------- the layout

ROOT = Path(__file__).resolve().parents[2]
BACKEND_PACKAGES = {
    "pai_storage_memory": ROOT / "backends" / "memory" / "pai_storage_memory",
    "pai_storage_mongo": ROOT / "backends" / "mongo" / "pai_storage_mongo",
    "pai_storage_postgres": ROOT / "backends" / "postgres" / "pai_storage_postgres",
    "pai_storage_sql": ROOT / "backends" / "sql" / "pai_storage_sql",
}


def _imported_packages(directory: Path) -> dict[str, set[str]]:
    """Every top-level package each module of ``directory`` imports (at any depth)."""
    import ast

    found: dict[str, set[str]] = {}
    for path in sorted(directory.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_a_backend_never_imports_another_and_the_core_imports_none() -> None:
    for package, directory in BACKEND_PACKAGES.items():
        others = set(BACKEND_PACKAGES) - {package}
        for module, names in _imported_packages(directory).items():
            assert not names & others, (module, names & others)
    for module, names in _imported_packages(ROOT / "pai_storage").items():
        assert not names & set(BACKEND_PACKAGES), (module, names & set(BACKEND_PACKAGES))
