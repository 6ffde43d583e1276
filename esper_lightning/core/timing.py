"""Lifecycle durations in the units a training loop has: decisions, steps, epochs, or a share of
the run.

The lifecycle counts *decisions* (`SeedState.tick` runs once per decision). Where decisions fall
is the adapter's business: the Trainer callback decides after every validation run (or every N
optimizer steps), an RL env once per env epoch. A user thinks in steps, epochs or "a tenth of
the run", so a `Duration` says which, and a `DecisionPlan` (what the adapter knows of the run:
optimizer steps per decision and per epoch, decisions planned) turns it into decisions.

Example:
    >>> plan = DecisionPlan(steps_per_decision=200, steps_per_epoch=4445, decisions=9)
    >>> Duration.parse("500 steps").decisions(plan)  # ceil(500 / 200)
    3
    >>> Duration.parse("20%").decisions(plan)  # ceil(0.2 * 9)
    2
    >>> Duration.parse(4).decisions(plan)
    4
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

#: The units of a `Duration`, with what each counts.
UNITS = {
    "decisions": "lifecycle decisions (ticks)",
    "steps": "optimizer steps",
    "epochs": "training epochs",
    "run": "a share of the run (of the compute budget under one, else of the planned steps)",
}
_DURATION = re.compile(r"\s*(?P<value>[0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(?P<unit>%|[a-z]+)?\s*")
_ALIASES = {"decision": "decisions", "step": "steps", "epoch": "epochs", "%": "run",
            "ticks": "decisions", "tick": "decisions"}
_ACCEPTED = ("an int (decisions), '<N> steps', '<N> epochs', '<N> decisions', '<P>%' or "
             "'<F> run' (a share of the run, F in [0, 1])")


@dataclass(frozen=True)
class DecisionPlan:
    """What an adapter knows of its run, to count durations in decisions.

    Attributes:
        steps_per_decision: optimizer steps between two regular decisions (None: unknown).
        steps_per_epoch: optimizer steps in one training epoch (None: unknown).
        decisions: regular decisions the run will make (None: unknown, an open-ended run).
    """

    steps_per_decision: float | None = None
    steps_per_epoch: float | None = None
    decisions: int | None = None


@dataclass(frozen=True)
class Duration:
    """A lifecycle duration: ``value`` in ``unit`` (`UNITS`).

    Example:
        >>> Duration.parse("0.1 run"), Duration.parse("10%")
        (Duration(value=0.1, unit='run'), Duration(value=0.1, unit='run'))
        >>> Duration.parse("3 epochs").decisions(DecisionPlan(50, 500, 40))  # 3 * 500 / 50
        30
    """

    value: float
    unit: str = "decisions"

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"duration unit {self.unit!r} is unknown; accepted: "
                             f"{', '.join(UNITS)}")
        value = self.value
        if isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"a duration must be a finite number >= 0, got {value!r}")
        if self.unit == "run" and value > 1:
            raise ValueError(f"a share of the run must be in [0, 1], got {value!r}")

    @classmethod
    def parse(cls, spec: Duration | int | str) -> Duration:
        """A duration from a `Duration`, an int (decisions) or a string such as ``"200 steps"``,
        ``"3 epochs"``, ``"10%"`` or ``"0.1 run"``; one line naming the accepted forms
        otherwise."""
        if isinstance(spec, Duration):
            return spec
        if isinstance(spec, int) and not isinstance(spec, bool):
            return cls(spec, "decisions")
        match = _DURATION.fullmatch(spec.lower()) if isinstance(spec, str) else None
        if match is None:
            raise ValueError(f"bad duration {spec!r}; accepted: {_ACCEPTED}")
        unit = _ALIASES.get(match["unit"] or "decisions", match["unit"] or "decisions")
        value = float(match["value"]) / (100.0 if match["unit"] == "%" else 1.0)
        if unit not in UNITS:
            raise ValueError(f"bad duration {spec!r}: unknown unit {match['unit']!r}; "
                             f"accepted: {_ACCEPTED}")
        return cls(value, unit)

    def decisions(self, plan: DecisionPlan) -> int:
        """This duration in decisions of ``plan`` (rounded up: a seed never gets less time
        than asked; a non-zero duration is at least one decision).

        Raises:
            ValueError: When ``plan`` lacks what the unit needs (one line saying what).
        """
        if self.unit == "decisions":
            return math.ceil(self.value)
        if self.unit == "run":
            if plan.decisions is None:
                raise ValueError(f"a duration of {self.value:g} of the run needs the run's "
                                 "length; set max_steps, max_epochs or a ComputeBudget")
            return _at_least_one(self.value * plan.decisions, self.value)
        steps = self.value
        if self.unit == "epochs":
            if plan.steps_per_epoch is None:
                raise ValueError(f"a duration of {self.value:g} epochs needs the steps per "
                                 "epoch, and the training loader has no length")
            steps = self.value * plan.steps_per_epoch
        if plan.steps_per_decision is None:
            raise ValueError(f"a duration in {self.unit} needs the steps between decisions "
                             "(unknown: the training loader has no length)")
        return _at_least_one(steps / plan.steps_per_decision, self.value)

    def __str__(self) -> str:
        return f"{self.value:.0%} of the run" if self.unit == "run" else (
            f"{self.value:g} {self.unit}")


@dataclass(frozen=True)
class SeedTiming:
    """Lifecycle durations for every slot, each a `Duration` (or what `Duration.parse` reads);
    None keeps the slot's own (its `GateConfig`, the blueprint's blend tempo, the lifecycle's
    embargo).

    Attributes:
        incubation: TRAINING time before a seed may blend (G2's ``min_training_epochs``).
        blend: the alpha ramp of a new seed (its blend tempo; block seeds keep their own pace).
        hold: BLENDING time before a seed may be held (G3's ``min_blending_epochs``, strict
            gates).
        embargo: how long a slot stays EMBARGOED after a prune.

    Example:
        >>> timing = SeedTiming(incubation="10%", blend="200 steps")
        >>> timing.resolve(DecisionPlan(steps_per_decision=100, decisions=30))
        {'incubation': 3, 'blend': 2}
    """

    incubation: Duration | int | str | None = None
    blend: Duration | int | str | None = None
    hold: Duration | int | str | None = None
    embargo: Duration | int | str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                try:
                    object.__setattr__(self, f.name, Duration.parse(value))
                except ValueError as err:
                    raise ValueError(f"SeedTiming.{f.name}: {err}") from None

    def resolve(self, plan: DecisionPlan) -> dict[str, int]:
        """The given durations in decisions of ``plan``, by name (blend at least 1)."""
        resolved: dict[str, int] = {}
        for f in fields(self):
            value: Any = getattr(self, f.name)
            if value is None:
                continue
            try:
                decisions = value.decisions(plan)
            except ValueError as err:
                raise ValueError(f"SeedTiming.{f.name}: {err}") from None
            resolved[f.name] = max(1, decisions) if f.name == "blend" else decisions
        return resolved


def _at_least_one(decisions: float, value: float) -> int:
    return 0 if value == 0 else max(1, math.ceil(decisions - 1e-9))
