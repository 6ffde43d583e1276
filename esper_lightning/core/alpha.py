"""Alpha: how strongly a seed's output replaces the host activation at its slot.

`AlphaController` is a pure scalar scheduler ticked once per epoch. It ramps alpha from its current
value to a target over a number of ticks along a curve and lands exactly on the target.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

from esper_lightning.core.lifecycle import ALPHA_TOLERANCE

DEFAULT_STEEPNESS = 12.0
MIN_STEEPNESS = 0.1


class AlphaMode(IntEnum):
    HOLD = 0
    UP = 1
    DOWN = 2


class AlphaCurve(IntEnum):
    LINEAR = 1
    COSINE = 2
    SIGMOID = 3


class AlphaAlgorithm(IntEnum):
    """How the seed output is combined with the host activation."""

    ADD = 1  # h + a·(s − h)
    MULTIPLY = 2  # h · (1 + a·tanh(s − x))
    GATE = 3  # h + a·g(x)·(s − h), g a learned per-sample gate


def _sigmoid(x: float) -> float:
    # Numerically stable for large |x|.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def curve_progress(curve: AlphaCurve, t: float, steepness: float = DEFAULT_STEEPNESS) -> float:
    """Map schedule progress ``t`` in [0, 1] to blend progress in [0, 1] (0 -> 0, 1 -> 1)."""
    t = min(1.0, max(0.0, t))
    if curve == AlphaCurve.LINEAR:
        return t
    if curve == AlphaCurve.COSINE:
        return 0.5 * (1.0 - math.cos(math.pi * t))
    if curve == AlphaCurve.SIGMOID:
        k = max(MIN_STEEPNESS, steepness)
        low, high = _sigmoid(-k / 2), _sigmoid(k / 2)
        if high - low <= 0.0:
            return t
        return (_sigmoid(k * (t - 0.5)) - low) / (high - low)
    raise ValueError(f"unknown alpha curve {curve!r}; accepted: {[c.name for c in AlphaCurve]}")


class AlphaController:
    """Schedules alpha toward a target over ``steps`` ticks. Retargeting is legal only in HOLD.

    Example:
        >>> ctrl = AlphaController()
        >>> ctrl.retarget(1.0, steps=4, curve=AlphaCurve.COSINE)
        >>> alphas = []
        >>> for _ in range(4):
        ...     _ = ctrl.step()
        ...     alphas.append(round(ctrl.alpha, 3))
        >>> alphas
        [0.146, 0.5, 0.854, 1.0]
    """

    def __init__(self, alpha: float = 0.0) -> None:
        _check_unit("alpha", alpha)
        self.alpha = float(alpha)
        self.start = float(alpha)
        self.target = float(alpha)
        self.mode = AlphaMode.HOLD
        self.curve = AlphaCurve.LINEAR
        self.steepness = DEFAULT_STEEPNESS
        self.steps_total = 0
        self.steps_done = 0

    def retarget(
        self,
        target: float,
        steps: int,
        curve: AlphaCurve = AlphaCurve.LINEAR,
        steepness: float = DEFAULT_STEEPNESS,
    ) -> None:
        """Start a ramp from the current alpha to ``target`` over ``steps`` ticks."""
        if self.mode != AlphaMode.HOLD:
            raise RuntimeError(f"alpha retarget while ramping ({self.mode.name}); wait for HOLD")
        _check_unit("alpha target", target)
        if steps < 0:
            raise ValueError(f"alpha steps must be >= 0, got {steps}")
        self.start, self.target = self.alpha, float(target)
        self.curve, self.steepness = AlphaCurve(curve), max(MIN_STEEPNESS, float(steepness))
        self.steps_total, self.steps_done = int(steps), 0
        if steps == 0 or abs(self.target - self.alpha) <= ALPHA_TOLERANCE:
            self.snap(self.target)
            return
        self.mode = AlphaMode.UP if self.target > self.alpha else AlphaMode.DOWN

    def step(self) -> bool:
        """One tick. Returns True when this tick reached the target."""
        if self.mode == AlphaMode.HOLD:
            return False
        self.steps_done += 1
        if self.steps_done >= self.steps_total:
            self.alpha, self.mode = self.target, AlphaMode.HOLD
            return True
        progress = curve_progress(self.curve, self.steps_done / self.steps_total, self.steepness)
        proposed = self.start + (self.target - self.start) * progress
        # Clamp so alpha never moves away from the target (monotone ramps).
        if self.mode == AlphaMode.UP:
            self.alpha = min(self.target, max(self.alpha, proposed))
        else:
            self.alpha = max(self.target, min(self.alpha, proposed))
        return False

    def snap(self, value: float) -> None:
        """Set alpha and target to ``value`` immediately and HOLD there."""
        _check_unit("alpha", value)
        self.alpha = self.start = self.target = float(value)
        self.mode = AlphaMode.HOLD
        self.steps_done = self.steps_total


    @property
    def velocity(self) -> float:
        """Alpha change per tick of the current ramp (0 in HOLD)."""
        if self.mode == AlphaMode.HOLD or self.steps_total == 0:
            return 0.0
        return (self.target - self.start) / self.steps_total

    def state_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "start": self.start,
            "target": self.target,
            "mode": int(self.mode),
            "curve": int(self.curve),
            "steepness": self.steepness,
            "steps_total": self.steps_total,
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha = float(state["alpha"])
        self.start = float(state["start"])
        self.target = float(state["target"])
        self.mode = AlphaMode(state["mode"])
        self.curve = AlphaCurve(state["curve"])
        self.steepness = float(state["steepness"])
        self.steps_total = int(state["steps_total"])
        self.steps_done = int(state["steps_done"])

    def __repr__(self) -> str:
        return (
            f"AlphaController(alpha={self.alpha:.3f}, target={self.target:.3f}, "
            f"mode={self.mode.name}, {self.steps_done}/{self.steps_total} {self.curve.name})"
        )


def _check_unit(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ValueError(f"{name} must be in [0, 1], got {value}")
