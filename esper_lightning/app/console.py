"""What every ``esper-lightning`` command prints when it refuses: one line, one status.

`fail` is the command line's one error printer (the ``ppo`` and ``compare`` commands and those
with a parser of their own: ``frontier``, ``lookup``, ``ship``): ``PROG: error: MESSAGE`` on
stderr, its whitespace folded so a message written over several lines (jsonargparse's, a
wrapped f-string) stays one line, and exit status 2. `missing_lab` says which of the lab's
dependencies (the ``esper-lightning[lab]`` extra) are not installed, so a lab command without
them is refused in the same way before it imports anything.

Example::

    return fail("esper-lightning lookup", f"bad judged {name!r}; accepted: final_bits")
"""

from __future__ import annotations

import importlib.util
import sys

#: The exit status of every refusal: a bad command line, configuration, input file or install.
EXIT_USAGE = 2
#: The lab's own dependencies (the ``lab`` extra): the comparison and frontier harness needs
#: them; the plugin (the callbacks, the PPO trainer and its command) does not.
LAB_MODULES = ("pandas", "scipy", "matplotlib")
#: What installs them.
LAB_INSTALL = "pip install 'esper-lightning[lab]'"


def fail(prog: str, message: object) -> int:
    """Print ``PROG: error: MESSAGE`` on one line on stderr; return `EXIT_USAGE`.

    Example::

        sys.exit(fail("esper-lightning ship", err))
    """
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return EXIT_USAGE


def missing_lab(prog: str) -> str | None:
    """The one-line refusal of a lab command (``prog``) whose dependencies are not installed,
    naming them and the install line; None when they all are.

    Example::

        missing_lab("esper-lightning compare")  # None with the extra installed
    """
    missing = [name for name in LAB_MODULES if not _installed(name)]
    if not missing:
        return None
    return (f"{prog} is part of the lab, which needs {', '.join(missing)} (not installed); "
            f"accepted: {LAB_INSTALL}")


def require_lab(function: str) -> None:
    """Refuse a lab function called from Python (``function``, e.g. ``"compare()"``) without the
    extra: `missing_lab`'s line as an `ImportError`, before anything is read or run."""
    missing = missing_lab(function)
    if missing is not None:
        raise ImportError(missing)


def _installed(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (a finder that refuses it, as
    a test's does, counts as not installed)."""
    if name in sys.modules:  # imported already, or blocked by a None entry
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


__all__ = ["EXIT_USAGE", "LAB_INSTALL", "LAB_MODULES", "fail", "missing_lab", "require_lab"]
