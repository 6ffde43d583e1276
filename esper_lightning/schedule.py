"""Learning-rate schedules indexed by the fraction of the run spent, not by steps.

A run under a compute budget does not know how many optimizer steps it will take (a host that
grows takes fewer batches for the same FLOPs), so its schedule is a function of the fraction of
the budget spent, ``f`` in [0, 1]: every arm, whatever it grows into, warms up, holds and decays
over its own budget and reaches the end of its decay exactly when the budget is spent. Without a
budget the fraction is the share of the planned batches done.

`LRSchedule.multiplier` scales each param group's base learning rate (its ``initial_lr``, the key
PyTorch's schedulers use): `apply_multiplier` sets ``lr = initial_lr × multiplier`` on every group,
host and seed alike; a seed group born mid-run (`core.optim.add_seed_group`) starts from its own
base lr times the current multiplier. A batch takes the multiplier at the middle of its own FLOPs
(`batch_fraction`), so the first batch of a warmup does not train at 0 and the last one not
exactly at the floor.

Kinds:

* ``constant``: 1 throughout (the groups are left alone);
* ``wsd`` (warmup-stable-decay): linear warmup from 0 over the first ``warmup_fraction``, 1, then
  a linear decay to ``min_lr_ratio`` over the last ``decay_fraction`` (0.2 by default);
* ``cosine``: the same warmup, then a half cosine from 1 to ``min_lr_ratio`` over the last
  ``decay_fraction`` (by default everything after the warmup).

At ``f >= 1`` every kind returns exactly its floor (``min_lr_ratio``; 1 for constant).

Plain Python, no torch: the command line checks a schedule (`schedule_error`) before it imports
torch, and the envs, the Trainer callback (`ComputeBudget`) and the config share this one module.

Example:
    >>> schedule = LRSchedule("wsd", warmup_fraction=0.05, decay_fraction=0.2, min_lr_ratio=0.1)
    >>> [round(schedule.multiplier(f), 3) for f in (0.025, 0.5, 0.9, 1.0)]
    [0.5, 1.0, 0.55, 0.1]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: The schedule kinds (``--lr_schedule``).
LR_SCHEDULES = ("constant", "wsd", "cosine")
#: The share of the run a ``wsd`` schedule decays over when none is given.
WSD_DECAY_FRACTION = 0.2


@dataclass(frozen=True)
class LRSchedule:
    """A learning-rate multiplier as a function of the fraction of the run spent.

    Args:
        kind: ``"constant"``, ``"wsd"`` or ``"cosine"`` (module docstring).
        warmup_fraction: share of the run warming up linearly from 0, in [0, 1).
        decay_fraction: share of the run at the end decaying to the floor, in (0, 1]; None:
            0.2 for ``wsd``, everything after the warmup for ``cosine``.
        min_lr_ratio: the floor as a share of the base learning rate, in [0, 1].

    Raises:
        ValueError: a bad kind or fraction (one line naming it and what is accepted), or
            settings that have no effect with ``constant``.
    """

    kind: str = "constant"
    warmup_fraction: float = 0.0
    decay_fraction: float | None = None
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        message = schedule_error(self.kind, self.warmup_fraction, self.decay_fraction,
                                 self.min_lr_ratio)
        if message is not None:
            raise ValueError(message)

    @property
    def decay_span(self) -> float:
        """The share of the run the decay takes."""
        if self.decay_fraction is not None:
            return self.decay_fraction
        return WSD_DECAY_FRACTION if self.kind == "wsd" else 1.0 - self.warmup_fraction

    def multiplier(self, fraction: float) -> float:
        """The multiplier of the base learning rate after ``fraction`` of the run (clamped to
        [0, 1]); exactly the floor at 1."""
        if self.kind == "constant":
            return 1.0
        f = min(max(float(fraction), 0.0), 1.0)
        if f >= 1.0:
            return self.min_lr_ratio
        if f < self.warmup_fraction:
            return f / self.warmup_fraction
        start = 1.0 - self.decay_span
        if f <= start:
            return 1.0
        progress = (f - start) / self.decay_span  # (0, 1): how far into the decay
        shape = 1.0 - progress if self.kind == "wsd" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape


@dataclass(frozen=True)
class BudgetSchedule:
    """An `LRSchedule` over a budget whose warmup is a fixed amount of compute, not a share.

    Runs of different budgets then train at the same rate at every step until the smaller one
    starts its decay (`decays_before`), so the warmup and stable phase of every budget is one
    shared run and each budget's cooldown can branch from it: a branched cooldown is the
    separate run of its budget, step for step (Hägele et al. 2024's WSD cooldowns; the
    frontier's fixed-size arms, `esper_lightning.app.frontier`).

    Args:
        shape: The decay's shape (kind, ``decay_fraction``, ``min_lr_ratio``); its
            ``warmup_fraction`` must be 0: the warmup is ``warmup_flops``.
        warmup_flops: Compute over which the rate warms up linearly from 0 (> 0).

    Example:
        >>> s = BudgetSchedule(LRSchedule("wsd", decay_fraction=0.2), warmup_flops=10.0)
        >>> [round(s.multiplier(spent, budget=100.0), 3) for spent in (5.0, 50.0, 90.0, 100.0)]
        [0.5, 1.0, 0.5, 0.0]
        >>> s.multiplier(5.0, budget=1000.0)  # the same warmup at any budget
        0.5
    """

    shape: LRSchedule
    warmup_flops: float

    def __post_init__(self) -> None:
        if self.shape.warmup_fraction != 0.0:
            raise ValueError(f"a BudgetSchedule warms up over warmup_flops; its shape's "
                             f"warmup_fraction must be 0, got {self.shape.warmup_fraction!r}")
        if not self.warmup_flops > 0:
            raise ValueError(f"warmup_flops must be > 0, got {self.warmup_flops!r}")

    def multiplier(self, spent: float, budget: float) -> float:
        """The rate's multiplier after ``spent`` FLOPs of a run of ``budget`` FLOPs (the
        middle of a batch: `batch_fraction`'s convention, in FLOPs)."""
        if spent < self.warmup_flops:
            return spent / self.warmup_flops
        return self.shape.multiplier(spent / budget)

    def check_budget(self, budget: float) -> None:
        """Refuse a budget whose decay would start inside the warmup (one line)."""
        if self.warmup_flops > (1.0 - self.shape.decay_span) * budget:
            raise ValueError(f"budget {budget:g} FLOPs starts its decay before its warmup of "
                             f"{self.warmup_flops:g} FLOPs ends; accepted: a budget of at least "
                             f"{self.warmup_flops / (1.0 - self.shape.decay_span):g}")


def schedule_error(kind: str, warmup: float, decay: float | None, floor: float) -> str | None:
    """The one-line problem with these schedule settings, None when they are good (the config
    and `LRSchedule` share it)."""
    if kind not in LR_SCHEDULES:
        return f"unknown lr_schedule {kind!r}; accepted: {', '.join(LR_SCHEDULES)}"
    if kind == "constant":
        given = [f"{name}={value!r}" for name, value, default in (
            ("warmup_fraction", warmup, 0.0), ("decay_fraction", decay, None),
            ("min_lr_ratio", floor, 0.0)) if value != default]
        if given:
            return (f"{given[0]} has no effect with lr_schedule 'constant'; accepted: its "
                    f"default, or lr_schedule wsd or cosine")
        return None
    if not 0.0 <= warmup < 1.0:
        return f"warmup_fraction must be in [0, 1), got {warmup!r}"
    if decay is not None and not 0.0 < decay <= 1.0:
        return f"decay_fraction must be in (0, 1] or null, got {decay!r}"
    span = WSD_DECAY_FRACTION if decay is None and kind == "wsd" else decay
    if span is not None and warmup + span > 1.0 + 1e-12:
        return (f"warmup_fraction={warmup!r} + decay_fraction={span!r} exceed the whole run; "
                f"accepted: a sum of at most 1")
    if not 0.0 <= floor <= 1.0:
        return f"min_lr_ratio must be in [0, 1], got {floor!r}"
    return None


def batch_fraction(spent: float, cost: float, total: float) -> float:
    """The fraction of the run at the middle of a batch that costs ``cost`` after ``spent``
    (in FLOPs, or in batches without a budget) out of ``total``."""
    return (spent + 0.5 * cost) / total


def set_base_lrs(param_groups: Iterable[dict[str, Any]]) -> None:
    """Record each group's current ``lr`` as its base (``initial_lr``) where it has none."""
    for group in param_groups:
        group.setdefault("initial_lr", group["lr"])


def apply_multiplier(param_groups: Iterable[dict[str, Any]], multiplier: float) -> None:
    """``lr = initial_lr × multiplier`` on every group (`set_base_lrs` first)."""
    for group in param_groups:
        group["lr"] = group["initial_lr"] * multiplier


__all__ = ["LR_SCHEDULES", "BudgetSchedule", "LRSchedule", "apply_multiplier", "batch_fraction",
           "schedule_error", "set_base_lrs"]
