"""Run code where a shipped model runs: a fresh Python process that cannot import esper_lightning.

The process is isolated (``python -I``: no PYTHONPATH, no current folder, no user site) and a
meta-path finder refuses ``esper_lightning`` before any other finder (the venv's editable install
included) is asked; the process checks that the import really fails before it runs the code.
"""

from __future__ import annotations

import subprocess
import sys
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

#: Loads ``argv[1]`` with torch.export, runs it on each tensor saved in ``argv[2]`` and saves the
#: outputs to ``argv[3]``.
RUN_PROGRAM = """
import torch
program = torch.export.load(sys.argv[1]).module()
with torch.no_grad():
    torch.save([program(x) for x in torch.load(sys.argv[2])], sys.argv[3])
"""


def run_without_package(code: str, *args: object) -> str:
    """Run ``code`` (after the guard) with ``args`` as ``sys.argv[1:]``; its stdout."""
    done = subprocess.run([sys.executable, "-I", "-c", _GUARD + code, *map(str, args)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr or done.stdout
    return done.stdout


def outputs_elsewhere(program: Path, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """What the ``.pt2`` file ``program`` computes on ``inputs`` in a fresh process."""
    x_file, y_file = program.with_suffix(".inputs.pt"), program.with_suffix(".outputs.pt")
    torch.save(inputs, x_file)
    run_without_package(RUN_PROGRAM, program, x_file, y_file)
    return torch.load(y_file)
