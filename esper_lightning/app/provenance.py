"""Which code wrote a result: the package version and, in a git checkout, the commit.

A report names it in its header so a reader can rerun the exact code; an installed wheel (no
checkout) says so instead of guessing.

Example::

    code_version()  # "esper-lightning 0.1.0, commit 1220ac4 (with uncommitted changes)"
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from esper_lightning import __version__

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
