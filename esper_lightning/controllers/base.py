"""The `Controller` protocol: what decides, once per epoch, what happens to the seeds.

A controller reads one `EpochReport` after validation and returns one `Action`. The engine
re-checks the action against the live slot states before executing it; an illegal action becomes
WAIT with a recorded reason, so a controller never breaks the lifecycle, it only wastes a turn.

Besides the four methods of `Controller`, a controller may offer optional hooks that the callback
uses: `ExplainsDecisions` (``last_reason``), `PlansGermination` (``earliest_germination``,
``timing``), `NamesBlueprints` (``check_blueprints``) and `SchedulesDecisions`
(``next_decision``). `ControllerBase` has all of them at
their defaults, ready to subclass.

Controller state must be plain data (ints, floats, strings, bools, None, lists and dicts of
them) so that a Lightning checkpoint holding it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from esper_lightning.blueprints import available
from esper_lightning.core.actions import Action
from esper_lightning.core.report import EpochReport
from esper_lightning.errors import ConfigError

#: The action every controller falls back to; legal in every state.
WAIT = Action()
#: Version of the state dict layout shared by the built-in controllers.
STATE_VERSION = 1


@runtime_checkable
class Controller(Protocol):
    """Decides one lifecycle action per epoch.

    These four methods are all a controller needs; a plain class with them is a controller.
    `MorphogenesisCallback` also uses the optional hooks below when a controller has them
    (`ExplainsDecisions`, `PlansGermination`); `ControllerBase` gives every hook its default.

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


@runtime_checkable
class ExplainsDecisions(Protocol):
    """Optional hook: a controller that says why it took its last decision."""

    #: Why the last `decide` returned its action, in a few words (None: not given). The
    #: callback records it with the lifecycle event the action causes (``"policy: <reason>"``
    #: in the event log and in the seed's prune reason).
    last_reason: str | None


@runtime_checkable
class PlansGermination(Protocol):
    """Optional hooks: a controller that knows how soon it can germinate.

    With them, the callback warns at fit start when ``max_epochs`` is too short for any seed to
    reach blending (earliest germination, one epoch to start training, then the G2 incubation).
    """

    def earliest_germination(self, max_epochs: int | None) -> int | None:
        """The first epoch (0-based) at which a run of ``max_epochs`` epochs can germinate;
        None when the controller cannot tell (no warning)."""
        ...

    def timing(self, max_epochs: int | None) -> Mapping[str, int]:
        """The controller's knobs counted in epochs, as a run of ``max_epochs`` epochs uses them
        (named in the warning, so the user knows what to lower; may be empty)."""
        ...


@runtime_checkable
class PlansLifecycle(Protocol):
    """Optional hook: a controller that asks the run for lifecycle durations of its own (the
    heuristic's incubation, scaled with the run length). The Trainer callback applies them at
    fit start where its own ``timing`` and ``gate_config`` set none."""

    def lifecycle(self, max_epochs: int | None) -> Mapping[str, int]:
        """Durations in decisions (``incubation``, ``blend``, ``hold``, ``embargo``: the keys of
        `core.timing.SeedTiming`) for a run of ``max_epochs`` decisions."""
        ...


@runtime_checkable
class SchedulesDecisions(Protocol):
    """Optional hook: a controller whose decisions are due at points of the run it knows in
    advance (a growth at ``tau`` of the budget), sooner than the adapter's own cadence.

    The Trainer callback asks it after every decision, with the report of the state the
    decision left, and polls the answer at every training step: when the run's spent fraction
    (`EpochReport.spent_fraction`) reaches it, the callback decides before that step. So a
    growth at ``tau`` happens at the first step past ``tau``, not at the next validation run.
    """

    def next_decision(self, report: EpochReport) -> float | None:
        """The spent fraction at which the next decision is due: the report's own (or less)
        for "at the next step", None for "at the adapter's cadence"."""
        ...


@runtime_checkable
class NamesBlueprints(Protocol):
    """Optional hook: a controller that germinates blueprints it names itself (a grower's
    blueprint, the heuristic's rotation) rather than ones it reads from the masks.

    The callback calls it once the slots' topology is known (at fit start), `compare` before
    it plays anything, and such a controller calls it itself at its first decision, so a
    blueprint that can never be germinated fails at once instead of leaving a run that never
    grows.
    """

    def check_blueprints(self, topology: str, allowed: Sequence[str]) -> None:
        """Raise `ConfigError` (one line, via `check_named_blueprint`) when a blueprint it
        names does not exist for ``topology`` or is not among the run's ``allowed`` ones."""
        ...


class BlueprintCheck:
    """Calls a `NamesBlueprints` controller's ``check_blueprints`` from its ``decide``, once per
    run context (topology, allowed blueprints): a blueprint the run refuses fails at the first
    decision instead of leaving a run that silently never grows.

    Example:
        >>> class Named(ControllerBase):
        ...     checks = 0
        ...     def check_blueprints(self, topology, allowed):
        ...         self.checks += 1
        >>> from types import SimpleNamespace
        >>> report = SimpleNamespace(topology="cnn",
        ...                          mask_context=SimpleNamespace(blueprints=("norm",)))
        >>> named, check = Named(), BlueprintCheck()
        >>> check(named, report); check(named, report); named.checks
        1
    """

    def __init__(self) -> None:
        self.context: tuple[str, tuple[str, ...]] | None = None

    def __call__(self, controller: NamesBlueprints, report: EpochReport) -> None:
        context = (report.topology, tuple(report.mask_context.blueprints))
        if context != self.context:
            controller.check_blueprints(*context)
            self.context = context


def check_named_blueprint(owner: str, name: str, topology: str,
                          allowed: Sequence[str] | None = None) -> None:
    """Refuse a blueprint ``owner`` names that a run of ``topology`` allowing ``allowed`` (None:
    every blueprint of the topology) can never germinate: one line naming the blueprint, the
    topology and the accepted names.

    Example:
        >>> try:
        ...     check_named_blueprint("grower", "lora", "cnn", allowed=("norm", "conv_light"))
        ... except ConfigError as err:
        ...     print(err)
        grower: blueprint 'lora' does not exist for topology 'cnn'; accepted: norm, conv_light
    """
    registered = available(topology)
    accepted = tuple(registered if allowed is None else allowed)
    if name not in registered:
        raise ConfigError(f"{owner}: blueprint {name!r} does not exist for topology "
                          f"{topology!r}; accepted: {', '.join(accepted)}")
    if name not in accepted:
        raise ConfigError(f"{owner}: blueprint {name!r} is not allowed in this run "
                          f"({topology}); accepted: {', '.join(accepted)}")


class ControllerBase:
    """A controller with every optional hook at its default: subclass it and write `decide`.

    The defaults: no reason (`last_reason` None), no known earliest germination (no too-short
    warning), no timing knobs, and no state (`reset` does nothing, `state_dict` is empty and
    `load_state_dict` accepts only an empty dict). Override what your controller has.

    Example:
        >>> class Waiter(ControllerBase):
        ...     def decide(self, report: EpochReport) -> Action:
        ...         self.last_reason = "nothing to do"
        ...         return WAIT
        >>> waiter = Waiter()
        >>> isinstance(waiter, Controller), waiter.state_dict(), waiter.earliest_germination(30)
        (True, {}, None)
    """

    last_reason: str | None = None

    def decide(self, report: EpochReport) -> Action:
        """Return the action for the epoch that ``report`` describes (call once per epoch)."""
        raise NotImplementedError(f"{type(self).__name__} must implement decide(report)")

    def reset(self) -> None:
        """Forget per-run state at the start of a new run or episode (none by default)."""

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state; empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned; by default only an empty dict."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state; got keys {sorted(state)}")

    def earliest_germination(self, max_epochs: int | None) -> int | None:
        """The first epoch a run of ``max_epochs`` epochs can germinate; None: unknown."""
        return None

    def timing(self, max_epochs: int | None) -> Mapping[str, int]:
        """Knobs counted in epochs at this run length; none by default."""
        return {}

    def check_blueprints(self, topology: str, allowed: Sequence[str]) -> None:
        """Names no blueprint of its own by default: nothing to check."""

    def next_decision(self, report: EpochReport) -> float | None:
        """No decision of its own between the adapter's (`SchedulesDecisions`)."""
        return None


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

