"""Names a package exports without importing them until first use (PEP 562), so that
``import esper_lightning`` and its light subpackages load no torch and no Lightning.

Example:
    >>> namespace = {}
    >>> getattr_, dir_ = lazy_exports("pkg", {"sqrt": "math"}, namespace)
    >>> getattr_("sqrt")(4.0), "sqrt" in namespace, "sqrt" in dir_()
    (2.0, True, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """A package's module ``__getattr__`` and ``__dir__`` for ``names`` (exported name ->
    the module that defines it): a name is imported on first access and kept in ``namespace``
    (the package's ``globals()``), so the next access is a plain lookup."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
