"""docs/design.md stays a true map of the package: it names every module, names no module that
does not exist, its table of package imports is the package's import graph, and its growth
operator example runs."""

from __future__ import annotations

import re

import torch
from test_architecture import PACKAGE, import_graph, modules
from torch import nn

DESIGN = PACKAGE.parent / "docs" / "design.md"
#: A path in backticks ending in ``.py`` (``core/engine.py``, ``tests/test_architecture.py``).
PY_PATH = re.compile(r"`([\w./]+\.py)`")
#: A cell naming a package or a top-level module: ``app/``, ``errors.py``.
UNIT = re.compile(r"`([a-z_]+/|[a-z_]+\.py)`")


def unit(module: str) -> str | None:
    """``app/`` for a module of ``esper_lightning.app``, ``errors.py`` for
    ``esper_lightning.errors``; None for the top-level package itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    subpackage = (PACKAGE / parts[1]).is_dir()
    return f"{parts[1]}/" if subpackage else f"{parts[1]}.py"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module graph -> graph of packages and top-level modules (edges within one unit, and
    to and from the top-level ``__init__``, left out)."""
    units: dict[str, set[str]] = {}
    for module, imported in graph.items():
        source = unit(module)
        if source is None:
            continue
        targets = {unit(m) for m in imported} - {None, source}
        units.setdefault(source, set()).update(targets)  # type: ignore[arg-type]
    return units


def documented_imports(text: str) -> dict[str, set[str]]:
    """The rows of the table under ``### Package imports``: package -> what it imports."""
    section = text.split("### Package imports", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    return {UNIT.fullmatch(left.strip())[1]: set(UNIT.findall(right))  # type: ignore[index]
            for left, right in rows}


def test_every_package_module_is_named():
    text = DESIGN.read_text()
    paths = [p.relative_to(PACKAGE).as_posix() for p in modules() if p.name != "__init__.py"]
    missing = [path for path in paths if f"`{path}`" not in text]
    assert not missing, f"docs/design.md does not name {missing}"


def test_every_named_module_exists():
    named = set(PY_PATH.findall(DESIGN.read_text()))
    gone = [n for n in sorted(named)
            if not (PACKAGE / n).is_file() and not (PACKAGE.parent / n).is_file()]
    assert named and not gone, f"docs/design.md names modules that do not exist: {gone}"


def test_package_imports_table_is_the_import_graph():
    documented, actual = documented_imports(DESIGN.read_text()), package_graph(import_graph())
    wrong = {name: f"documented {sorted(documented.get(name, ['(no row)']))}, "
                   f"imports {sorted(actual.get(name, ['(no such package)']))}"
             for name in sorted(documented.keys() | actual.keys())
             if documented.get(name) != actual.get(name)}
    assert not wrong, f"docs/design.md, Package imports: {wrong}"


def test_package_graph_sees_every_unit_and_ignores_the_top_level():
    # The comparison above would pass vacuously if the table parser or the graph lost rows.
    graph = {"esper_lightning": {"esper_lightning.core"},
             "esper_lightning.app.cli": {"esper_lightning", "esper_lightning.errors",
                                         "esper_lightning.app.config"},
             "esper_lightning.app.config": set(), "esper_lightning.errors": set()}
    assert package_graph(graph) == {"app/": {"errors.py"}, "errors.py": set()}
    text = "### Package imports\n\n| package | imports |\n|---|---|\n" \
           "| `app/` | `core/`, `errors.py` |\n| `errors.py` | — |\n\n## Next\n| `x/` | `y/` |\n"
    assert documented_imports(text) == {"app/": {"core/", "errors.py"}, "errors.py": set()}


def test_the_growth_operator_example_registers_a_working_operator():
    """docs/design.md's "A growth operator" example, run as written."""
    from esper_lightning.blueprints import get_spec, scratch_registry
    from esper_lightning.blueprints.growth import operator_of, scratch_operators

    text = DESIGN.read_text()
    section = text[text.index("### A growth operator"):text.index("### A compare metric")]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    with scratch_registry(), scratch_operators():
        namespace: dict = {}
        exec(compile(code, "design.md", "exec"), namespace)
        operator = operator_of("block_half_copy")
        assert operator is not None and get_spec("block_half_copy", "transformer").incubation == 0
        source = nn.Linear(4, 4)
        halved = operator.build(source, None)
        assert torch.equal(halved.weight, 0.5 * source.weight)
