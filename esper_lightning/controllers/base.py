"""The `Controller` protocol: what decides, once per epoch, what happens to the seeds.

A controller reads one `EpochReport` after validation and returns one `Action`. The engine
re-checks the action against the live slot states before executing it; an illegal action becomes
WAIT with a recorded reason, so a controller never breaks the lifecycle, it only wastes a turn.

Controller state must be plain data (ints, floats, strings, bools, None, lists and dicts of
them) so that a Lightning checkpoint holding it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from esper_lightning.core.actions import Action
from esper_lightning.core.report import EpochReport

#: The action every controller falls back to; legal in every state.
WAIT = Action()
#: Version of the state dict layout shared by the built-in controllers.
STATE_VERSION = 1


@runtime_checkable
class Controller(Protocol):
    """Decides one lifecycle action per epoch.

    Example:
        >>> from esper_lightning.controllers import StaticController
        >>> isinstance(StaticController(), Controller)
        True
    """

    def decide(self, report: EpochReport) -> Action:
        """Return the action for the epoch that ``report`` describes (call once per epoch)."""
        ...

    def reset(self) -> None:
        """Forget per-run state at the start of a new run or episode."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (loadable with ``torch.load(weights_only=True)``)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned; continues exactly where the saved one left off."""
        ...


def check_state(state: Mapping[str, Any], kind: str, keys: Iterable[str]) -> None:
    """Reject a state dict saved by another controller, another version, or with odd keys.

    Args:
        state: the dict passed to ``load_state_dict``.
        kind: the controller name this state must have been saved by.
        keys: every key besides ``controller`` and ``version`` the state must hold.

    Raises:
        ValueError: naming what is wrong and what is accepted.
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"{kind} controller state must be a dict, got {type(state).__name__}")
    saved_kind = state.get("controller")
    if saved_kind != kind:
        raise ValueError(f"controller state is for {saved_kind!r}; expected {kind!r}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"{kind} controller state version {state.get('version')!r}; accepted: {STATE_VERSION}"
        )
    expected = {"controller", "version", *keys}
    missing, unknown = expected - state.keys(), state.keys() - expected
    if missing or unknown:
        raise ValueError(
            f"{kind} controller state: missing keys {sorted(missing)}, unknown keys "
            f"{sorted(unknown)}; accepted: {sorted(expected)}"
        )


def state_header(kind: str) -> dict[str, Any]:
    """The ``controller`` and ``version`` entries every controller state starts with."""
    return {"controller": kind, "version": STATE_VERSION}

