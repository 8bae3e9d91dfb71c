"""The SQL backend reaches its dependencies (SQLAlchemy, aiosqlite, asyncmy) only
through their public APIs.

A source scan with :mod:`ast`: every attribute ``x._name`` read anywhere in the
backend (``x`` not ``self`` or ``cls``), every ``getattr``/``setattr``/
``hasattr`` of a ``"_name"``, every keyword argument ``_name=`` and every import
of a ``_name`` must name something this project defines itself (a function,
class, parameter, attribute or slot of ``pai_storage``, a backend or the
conformance suite); anything else is a dependency's private attribute. So is
state kept in a dependency object's ``__dict__``. SQLAlchemy's ``Row`` names its
public API with an underscore (``row._mapping``, ...): those are allowed.

A name the project defines for itself too (``self._conn``) cannot be told
apart from a dependency's by the source alone, so the names the backend once
reached (issue 31) are also searched for by a pattern.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BACKEND = ROOT / "backends" / "sql" / "pai_storage_sql"
PROJECT = [ROOT / "pai_storage", ROOT / "backends", ROOT / "conformance"]

ROW_API = frozenset({"_mapping", "_fields", "_asdict", "_tuple", "_t", "_t_"})
"""SQLAlchemy's ``Row`` methods and attributes, public though underscored."""

ONCE_REACHED = re.compile(
    r"_compile_w_cache|_bind_processors|_result_columns|_cached_result_processor"
    r"|_process_parameters_for_postcompile|\w\.__dict__|(?<!self)\._conn\b|(?<!self)\._execute\("
)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _sources(roots: list[Path]) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _own_names(trees: list[ast.Module]) -> set[str]:
    """Every private name the project defines itself."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # __slots__ entries, setattr names
    return {n for n in names if _private(n)} | ROW_API


def private_uses(tree: ast.Module, own: set[str]) -> list[tuple[int, str]]:
    """``(line, what)`` of each use of a private name ``own`` does not hold."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            receiver = node.value
            is_self = isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")
            if node.attr == "__dict__" and not is_self:
                found.append((node.lineno, f"{ast.unparse(node)}"))
            elif _private(node.attr) and not is_self and node.attr not in own:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Name)
                and func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
                and node.args[1].value not in own
            ):
                found.append((node.lineno, ast.unparse(node)))
            for keyword in node.keywords:
                if keyword.arg and _private(keyword.arg) and keyword.arg not in own:
                    found.append((node.lineno, f"{keyword.arg}= in {ast.unparse(func)}()"))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if any(_private(part) for part in module.split(".")):
                found.append((node.lineno, f"from {module} import ..."))
            for alias in node.names:
                if _private(alias.name) and node.level == 0 and alias.name not in own:
                    found.append((node.lineno, f"from {module} import {alias.name}"))
    return found


def _project_names() -> set[str]:
    return _own_names([tree for _, tree in _sources(PROJECT)])


def test_the_sql_backend_uses_no_private_attribute_of_a_dependency() -> None:
    own = _project_names()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path, tree in _sources([BACKEND])
        for line, what in private_uses(tree, own)
    ]
    assert found == [], "private attributes of a dependency:\n" + "\n".join(found)


def test_the_names_the_backend_once_reached_are_gone() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted(BACKEND.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ONCE_REACHED.search(line)
    ]
    assert found == [], "private attributes of a dependency:\n" + "\n".join(found)
    assert ONCE_REACHED.search("raw = op.driver._conn")
    assert ONCE_REACHED.search("await driver._execute(fn)")
    assert not ONCE_REACHED.search("await self._execute(fn); self._conn")


def test_the_scan_finds_what_the_backend_once_reached() -> None:
    own = _project_names()
    source = """
from sqlalchemy.engine.result import SimpleResultMetaData
from sqlalchemy.sql._typing import _ColumnExpressionArgument

def run(statement, compiled, driver, dialect):
    found = statement._compile_w_cache(dialect, compiled_cache={})
    compiled.__dict__["_pai_prepared"] = found
    processors = compiled._bind_processors
    columns = compiled._result_columns
    meta = SimpleResultMetaData(["a"], _processors=None)
    if hasattr(driver, "_execute"):
        return driver._execute(print), processors, columns, meta
"""
    found = {what for _, what in private_uses(ast.parse(source), own)}
    assert found == {
        "from sqlalchemy.sql._typing import ...",
        "from sqlalchemy.sql._typing import _ColumnExpressionArgument",
        "statement._compile_w_cache",
        "compiled.__dict__",
        "compiled._bind_processors",
        "compiled._result_columns",
        "_processors= in SimpleResultMetaData()",
        "hasattr(driver, '_execute')",
        "driver._execute",
    }


def test_names_the_project_defines_are_its_own() -> None:
    own = _project_names()
    source = "def f(op, store):\n    return op._events, store._initialize\n"
    assert private_uses(ast.parse(source), own) == []
