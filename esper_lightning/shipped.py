"""The trained policies shipped with the package, and where they are.

The PPO policies the results were measured with (docs/results.md: the timing policies
``grow124-timing-s1..3``, the all-blueprint ones ``grow124-all-*``) are package data, with the
``manifest.json`` that holds each one's SHA-256, commands and cost. Installed from a wheel they
lie in ``esper_lightning/policies/``; in a checkout that folder is a link to the repository's
``policies/``, where ``esper-lightning ship`` writes them, so ``policy:policies/NAME.pt`` (run
from the checkout) and `shipped_policy` name the same file::

    from esper_lightning.controllers import PolicyController
    from esper_lightning.shipped import shipped_policy

    controller = PolicyController(shipped_policy("grow124-timing-s1"))
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MANIFEST", "policies_dir", "shipped_policies", "shipped_policy"]

#: The file beside the policies that records each one (`app.ppo.ship`).
MANIFEST = "manifest.json"
_SUFFIX = ".pt"
_PACKAGE = Path(__file__).resolve().parent


def policies_dir() -> Path:
    """The folder of the shipped policies: the package's ``policies/`` (a wheel's, or a
    checkout's link to the repository's), else the repository's ``policies/`` itself (a
    checkout whose link was written as a plain file, as git does where links are off).

    Raises:
        FileNotFoundError: Neither folder exists (one line naming both).
    """
    for folder in (_PACKAGE / "policies", _PACKAGE.parent / "policies"):
        if folder.is_dir():
            return folder
    raise FileNotFoundError(f"no shipped policies at {str(_PACKAGE / 'policies')!r} or "
                            f"{str(_PACKAGE.parent / 'policies')!r}; reinstall esper-lightning")


def shipped_policies() -> tuple[str, ...]:
    """The names of the shipped policies (their files' names without ``.pt``), sorted.

    Example:
        >>> "grow124-timing-s1" in shipped_policies()
        True
    """
    return tuple(sorted(p.stem for p in policies_dir().glob(f"*{_SUFFIX}")))


def shipped_policy(name: str) -> Path:
    """The file of the shipped policy ``name`` (``grow124-timing-s1``, ``.pt`` optional).

    Raises:
        ValueError: No policy of that name is shipped (one line listing those that are).

    Example:
        >>> shipped_policy("grow124-timing-s1.pt").name
        'grow124-timing-s1.pt'
    """
    stem = name[:-len(_SUFFIX)] if name.endswith(_SUFFIX) else name
    names = shipped_policies()
    if stem not in names:
        raise ValueError(f"no shipped policy {name!r}; accepted: {', '.join(names)}")
    return policies_dir() / f"{stem}{_SUFFIX}"
