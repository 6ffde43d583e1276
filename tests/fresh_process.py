"""Run code where a shipped model runs: a fresh Python process that cannot import esper_lightning.

The process is isolated (``python -I``: no PYTHONPATH, no current folder, no user site) and a
meta-path finder refuses ``esper_lightning`` before any other finder (the venv's editable install
included) is asked; the process checks that the import really fails before it runs the code.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

_GUARD = f"""
import importlib.abc, sys

class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "esper_lightning":
            raise ModuleNotFoundError(f"{{name}} is not installed here", name=name)
        return None

sys.meta_path.insert(0, _Refuse())
sys.path[:] = [p for p in sys.path if not p.startswith({str(ROOT)!r})]
try:
    import esper_lightning
except ImportError:
    pass
else:
    raise SystemExit("esper_lightning is importable in the fresh process")
"""

#: Loads each program of ``argv[2::2]`` with torch.export, runs it on each tensor saved in the
#: file after it and saves the list of each program's outputs to ``argv[1]``.
RUN_PROGRAMS = """
import torch
outputs = []
with torch.no_grad():
    for program, inputs in zip(sys.argv[2::2], sys.argv[3::2], strict=True):
        module = torch.export.load(program).module()
        outputs.append([module(x) for x in torch.load(inputs)])
torch.save(outputs, sys.argv[1])
"""


def run_without_package(code: str, *args: object) -> str:
    """Run ``code`` (after the guard) with ``args`` as ``sys.argv[1:]``; its stdout."""
    done = subprocess.run([sys.executable, "-I", "-c", _GUARD + code, *map(str, args)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr or done.stdout
    return done.stdout


def outputs_elsewhere(programs: Sequence[tuple[Path, list[torch.Tensor]]]
                      ) -> list[list[torch.Tensor]]:
    """What each ``.pt2`` file computes on its inputs, ``[(program, inputs), ...]``, in one
    fresh process (a launch costs seconds of importing torch: the programs share it)."""
    args: list[Path] = []
    for program, inputs in programs:
        x_file = program.with_suffix(".inputs.pt")
        torch.save(inputs, x_file)
        args += [program, x_file]
    y_file = programs[0][0].with_suffix(".outputs.pt")
    run_without_package(RUN_PROGRAMS, y_file, *args)
    return torch.load(y_file)
