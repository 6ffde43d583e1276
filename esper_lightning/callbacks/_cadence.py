"""Where `MorphogenesisCallback` decides in a Trainer's loop, and how long the run is.

A decision follows every validation run (``val_check_interval``, ``check_val_every_n_epoch``),
or every ``every_n_train_steps`` optimizer steps; an epoch that validated nowhere decides at its
end. This module reads the Trainer for what that means in optimizer steps (`run_plan`) and how
far the run is (`run_fraction`), so the lifecycle's durations (`core.timing`) and a
controller's growth times follow the loop the user runs: ``max_steps``, ``max_epochs``,
``max_time`` or a compute budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer

from esper_lightning.core.timing import DecisionPlan


@dataclass(frozen=True)
class RunPlan:
    """The run in optimizer steps, as far as the Trainer tells.

    Attributes:
        steps: optimizer steps the run plans (``max_steps``, ``max_epochs`` times the steps per
            epoch, or a budget over the cost of a step; the least of those known), None when
            unbounded or unknown.
        steps_per_epoch: optimizer steps in an epoch (None: a loader of unknown length).
        steps_per_decision: optimizer steps between two regular decisions (None: unknown).
    """

    steps: int | None
    steps_per_epoch: int | None
    steps_per_decision: float | None

    @property
    def decisions(self) -> int | None:
        """Regular decisions the run makes (None: unknown)."""
        if self.steps is None or not self.steps_per_decision:
            return None
        return max(1, math.ceil(self.steps / self.steps_per_decision))

    def for_durations(self) -> DecisionPlan:
        """What `core.timing.Duration` needs to count in decisions."""
        return DecisionPlan(self.steps_per_decision, self.steps_per_epoch, self.decisions)


def run_plan(trainer: L.Trainer, every_n_train_steps: int | None,
             budget_steps: int | None = None) -> RunPlan:
    """The plan of ``trainer``'s fit (call once the training loader is set up: at
    ``on_train_start`` or later). ``budget_steps``: the steps a compute budget allows, when
    known."""
    batches = trainer.num_training_batches
    accumulate = trainer.accumulate_grad_batches
    per_epoch = (math.ceil(batches / accumulate) if math.isfinite(batches) and batches >= 1
                 else None)
    bounds = []
    if trainer.max_steps >= 1:
        bounds.append(trainer.max_steps)
    if trainer.max_epochs is not None and trainer.max_epochs >= 1 and per_epoch is not None:
        bounds.append(trainer.max_epochs * per_epoch)
    if budget_steps is not None:
        bounds.append(budget_steps)
    return RunPlan(min(bounds, default=None), per_epoch,
                   _steps_per_decision(trainer, every_n_train_steps, per_epoch))


def _steps_per_decision(trainer: L.Trainer, every_n_train_steps: int | None,
                        per_epoch: int | None) -> float | None:
    if every_n_train_steps is not None:
        return float(every_n_train_steps)
    validates = trainer.enable_validation and _has_validation(trainer)
    interval = getattr(trainer, "val_check_batch", None)
    if validates and isinstance(interval, int | float) and math.isfinite(interval):
        every_epochs = trainer.check_val_every_n_epoch
        if per_epoch is None or every_epochs is None:  # by the run's batches, across epochs
            return max(1.0, interval / trainer.accumulate_grad_batches)
        if interval < trainer.num_training_batches:
            # Lightning validates where an epoch's batch count is a multiple of the interval
            # (it restarts each epoch, so an epoch's remainder holds none), in every
            # ``every_epochs``-th epoch; any other epoch decides once, at its end.
            per_cycle = trainer.num_training_batches // int(interval) + every_epochs - 1
            return per_epoch * every_epochs / per_cycle
    return None if per_epoch is None else float(per_epoch)  # a decision per epoch


def took_step(trainer: L.Trainer, pl_module: L.LightningModule, step_at_batch_start: int) -> bool:
    """Whether the batch now ending took an optimizer step (not one inside an accumulation
    window). Under manual optimization every batch counts: there are no windows, and a raw
    optimizer's step does not move ``trainer.global_step``."""
    return not pl_module.automatic_optimization or trainer.global_step != step_at_batch_start


def validates_by_step(trainer: L.Trainer) -> bool:
    """Whether the fit validates every ``val_check_interval`` batches of the whole run
    (``check_val_every_n_epoch=None``): its decisions follow those, never an epoch's end."""
    return (trainer.check_val_every_n_epoch is None and trainer.enable_validation
            and _has_validation(trainer))


def _has_validation(trainer: L.Trainer) -> bool:
    batches = trainer.num_val_batches
    return any(b > 0 for b in batches) if isinstance(batches, list) else bool(batches)


#: What to do about a run whose own length ends it before its budget (said by both callbacks).
RESUME_OR_RAISE = ("resume it from its checkpoint, or raise that limit; -1 for max_steps and "
                   "max_epochs: the budget ends the fit")


def run_limit(trainer: L.Trainer, steps: int) -> str:
    """The Trainer option that ends a run after ``steps`` optimizer steps (`RunPlan.steps`), as
    a user wrote it: ``max_steps=40`` or ``max_epochs=3``."""
    if steps == trainer.max_steps:
        return f"max_steps={trainer.max_steps}"
    return f"max_epochs={trainer.max_epochs}"


def run_fraction(trainer: L.Trainer, plan: RunPlan) -> float | None:
    """How far a run without a compute budget is: optimizer steps over the planned ones, or the
    training time over ``max_time``, whichever is further (the run ends at the first limit it
    reaches); None when neither bounds it."""
    fractions = []
    if plan.steps:
        fractions.append(trainer.global_step / plan.steps)
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None and timer._duration:  # max_time: Lightning's own Timer
        elapsed = timer.time_elapsed("train") / timer._duration
        # Clocks differ between ranks: rank 0's, so every rank decides alike (as the Timer
        # itself broadcasts its stop).
        fractions.append(float(trainer.strategy.broadcast(elapsed)))
    return max(fractions, default=None)


def grown_step_bound(sites: Sequence[Any]) -> float:
    """How many times a training step of the model once its growth ``sites``
    (`blueprints.growth.GrowthSite`s, its slots') have all grown
    costs at most a step now: the stack's blocks grow from its depth to depth plus every
    site's blocks, and nothing else in a step grows (what the schedule checks count the steps
    after ``tau`` at)."""
    depth = max(len(site.stack()) for site in sites)
    return (depth + sum(site.blocks for site in sites)) / depth
