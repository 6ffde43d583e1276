"""Which code and machine wrote a result: the package version and, in a git checkout, the
commit; the CPU, torch's kernels and threads.

A report names them in its header so a reader can rerun the exact code; an installed wheel (no
checkout) says so instead of guessing. The machine matters because a CPU run's floating-point
rounding depends on it: the same code and episode give the same numbers bit for bit only on a
machine whose kernels and thread count match.

Example::

    code_version()  # "esper-lightning 0.1.0, commit 1220ac4 (with uncommitted changes)"
    machine_description()  # "AMD EPYC; torch 2.13.0+cpu, kernels AVX2, 1 thread"
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from esper_lightning import __version__

#: Where Linux names the CPU model.
CPUINFO = Path("/proc/cpuinfo")
#: The folder git is asked about: the checkout that holds the package, if any.
SOURCE = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    """Git's answer in ``SOURCE``, None when git is missing or ``SOURCE`` is no checkout."""
    try:
        done = subprocess.run(["git", "-C", str(SOURCE), *args], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_version() -> str:
    """``esper-lightning VERSION`` and the checkout's short commit, marked when the working
    tree has uncommitted changes to tracked files; ``(not a git checkout)`` otherwise."""
    name = f"esper-lightning {__version__}"
    # An installed package inside someone else's repository (a venv in a project) is no
    # checkout of this one: the package must be tracked at the top of the repository.
    tracked = _git("ls-files", "--full-name", "esper_lightning/__init__.py")
    top = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "--short=12", "HEAD")
    if not tracked or top is None or Path(top).resolve() != SOURCE or commit is None:
        return f"{name} (not a git checkout)"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{name}, commit {commit}" + (" (with uncommitted changes)" if dirty else "")


def machine_description() -> str:
    """The CPU model, torch's version, the instruction set its CPU kernels use and its thread
    count, and the GPU where one is visible: what a CPU result's rounding depends on."""
    import torch  # here, not at the top: code_version must not load torch

    threads = torch.get_num_threads()
    text = (f"{cpu_model()}; torch {torch.__version__}, kernels "
            f"{torch.backends.cpu.get_cpu_capability()}, {threads} "
            f"thread{'' if threads == 1 else 's'}")
    if torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name()}"
    return text


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``; elsewhere what `platform` says)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
