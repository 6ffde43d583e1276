"""The layout's promises, checked on the source: a Lightning-free core, controllers that never
reach into the application, no references to documents outside the repository, short functions."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "esper_lightning"
MAX_FUNCTION_LINES = 60
#: Words that point at the research code base or documents a reader of this repository lacks.
FOREIGN = re.compile(r"SPEC|reference/|Tamiyo|Leyline|Tolaria|Kasmina|Simic|Obs V3|[Uu]pstream")


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute names a module imports (module level and inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


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
    assert "esper_lightning.app.config" in package_closure("esper_lightning.app.trainer")


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
