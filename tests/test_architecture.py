"""The layout's promises, checked on the source: a Lightning-free core, controllers that never
reach into the application, no import cycles, no references to documents outside the repository,
short functions."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "esper_lightning"
MAX_FUNCTION_LINES = 60
#: Words that point at the research code base or documents a reader of this repository lacks.
FOREIGN = re.compile(r"SPEC|reference/|Tamiyo|Leyline|Tolaria|Kasmina|Simic|Obs V3|[Uu]pstream")


def modules(package: Path = PACKAGE) -> list[Path]:
    return sorted(package.rglob("*.py"))


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """Absolute names a module imports (module level, inside functions and under
    ``TYPE_CHECKING``; relative imports resolved)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path, package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _absolute(node: ast.ImportFrom, path: Path, package: Path) -> str:
    if node.level == 0:
        return str(node.module)
    here = module_name(path, package).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # a module's relative imports start from its package
    base = here[: len(here) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Package module -> the package modules its import statements name (every statement:
    module level, inside functions, under ``TYPE_CHECKING``).

    ``from a.b import c`` names module ``a.b.c`` when it exists, else ``a.b`` (``c`` is then an
    attribute of it); ``import a.b.c`` names ``a.b.c``. A package's ``__init__`` is a module
    like any other: importing the package (``from esper_lightning.envs import EnvPool``) is an
    edge to its ``__init__``, and through its re-exports to the modules it imports. The parent
    packages Python initialises on the way to a module are not edges: every module of a
    subpackage whose ``__init__`` re-exports it would be in a cycle otherwise. So the rule is:
    a module imports its siblings by their own names, never its own package's ``__init__``. The
    root package's lazy names (``esper_lightning._LAZY``, imported on first attribute access)
    count as imports of the root.
    """
    by_name = {module_name(p, package): p for p in modules(package)}
    graph = {name: _imported_modules(path, package, by_name.keys())
             for name, path in by_name.items()}
    if package == PACKAGE:
        graph[package.name] |= set(importlib.import_module(package.name)._LAZY.values())
    return graph


def _imported_modules(path: Path, package: Path, known: Iterable[str]) -> set[str]:
    known = set(known)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path, package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.update([full] if full in known else [base] if base in known else [])
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it is acyclic (depth-first
    search; a module on the current path reached again closes a cycle)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle is not None:
            return cycle
    return None


def package_closure(start: str) -> set[str]:
    """Package modules reachable by imports from ``start`` (itself included)."""
    by_name = {module_name(p): p for p in modules()}
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        for imported in imports(by_name[name]):
            parts = imported.split(".")
            # "a.b.c" may name module a.b.c or attribute c of module a.b: follow both, and the
            # package __init__ modules on the way.
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return seen


@pytest.mark.parametrize("path", [p for p in modules() if "core" in p.parts], ids=str)
def test_core_modules_never_import_lightning(path):
    lightning = {n for n in imports(path) if n.split(".")[0] in ("lightning", "pytorch_lightning")}
    assert not lightning, f"{path.name} imports {sorted(lightning)}"


def test_core_imports_without_lightning_installed():
    code = (
        "import sys; sys.modules['lightning'] = None; sys.modules['pytorch_lightning'] = None\n"
        "import esper_lightning.core, esper_lightning.rl\n"
        "import esper_lightning.core.engine, esper_lightning.core.exporter\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("start", ["esper_lightning.controllers", "esper_lightning.rl"])
def test_controllers_and_rl_never_reach_the_application(start):
    reached = package_closure(start)
    assert not {m for m in reached if m.startswith("esper_lightning.app")}, sorted(reached)
    assert not {m for m in reached if m.startswith("esper_lightning.envs")}, sorted(reached)


def test_closure_helper_can_see_the_application():
    # The check above would pass vacuously if the closure never followed imports.
    assert "esper_lightning.app.config" in package_closure("esper_lightning.app.ppo.trainer")


def own_package_imports(package: Path = PACKAGE) -> list[str]:
    """``module: line`` of every ``from <own package> import ...`` in ``package``: a module that
    names its own package imports its ``__init__`` (docs/design.md), even when what it takes is
    a sibling module (``from esper_lightning.callbacks import _distributed``)."""
    found = []
    for path in modules(package):
        name = module_name(path, package)
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and path.name != "__init__.py"
                    and _absolute(node, path, package) == own):
                found.append(f"{name}:{node.lineno}")
    return found


def test_no_module_imports_its_own_package():
    assert own_package_imports() == []


def test_the_own_package_rule_sees_a_sibling_taken_from_the_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("import pkg.sub.a as a\n")
    assert own_package_imports(package) == ["pkg.sub.a:1"]


def test_package_imports_have_no_cycles():
    """Every import statement counts (see `import_graph` for how packages count): a cycle means
    two modules each need the other, which only import order (or a deferred import) holds
    together; shared types belong in a module both import."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_check_sees_deferred_type_checking_and_package_imports(tmp_path):
    # The check above would pass vacuously if the graph missed any kind of import.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "def f():\n    from pkg import a\n",
        "sub/__init__.py": "from .c import C\n",
        "sub/c.py": "from pkg.sub.d import D\nC = D\n",
        "sub/d.py": "import pkg.sub\nD = 1\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.sub"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.sub.d"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    del graph["pkg.a"]
    assert find_cycle(graph) == ["pkg.sub", "pkg.sub.c", "pkg.sub.d", "pkg.sub"]
    graph["pkg.sub.d"] = set()  # only parent packages left: Python initialises them, no edge
    assert find_cycle(graph) is None


@pytest.mark.parametrize("path", modules(), ids=str)
def test_no_references_to_documents_outside_the_repository(path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if FOREIGN.search(line)]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("path", modules(), ids=str)
def test_functions_fit_on_a_screen(path):
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_every_integration_file_the_conftest_marks_exists():
    """A renamed test file would silently lose its ``integration`` mark."""
    from conftest import INTEGRATION_FILES

    tests = Path(__file__).resolve().parent
    assert sorted(f for f in INTEGRATION_FILES if not (tests / f).is_file()) == []
