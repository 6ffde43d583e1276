"""`ComputeLedger`: the one owner of a run's compute.

It holds the FLOP meter (`core.flops.FlopMeter`, its cache outliving hosts), the training FLOPs
spent, the budget (None: none) with the episode's budget scale, its slice per decision, and the
learning-rate multiplier over the budget spent. The Trainer callbacks and the Fabric envs all
keep their compute here, so each rule lives once: `ComputeBudget` owns the ledger of a fit with
a budget (a `MorphogenesisCallback` beside it reads the same ledger), a `MorphogenesisCallback`
alone owns one without a budget, an env owns one for all its episodes (`reset` per episode).
Validation and counterfactual FLOPs never spend a budget and are counted apart by the engine.

Example:
    >>> import torch
    >>> from torch import nn
    >>> ledger = ComputeLedger(budget_flops=1e6, schedule=LRSchedule("wsd"), decisions=4)
    >>> cost = ledger.training_cost(nn.Linear(64, 32), torch.zeros(8, 64))
    >>> ledger.charge(cost)
    >>> cost, ledger.fraction, ledger.slice_end(1)
    (65536, 0.065536, 250000.0)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from torch import Tensor, nn

from esper_lightning.core.flops import FlopMeter, structure
from esper_lightning.schedule import LRSchedule, apply_multiplier, batch_fraction

__all__ = ["ComputeLedger"]

Forward = Callable[[nn.Module, Tensor], Tensor]


class ComputeLedger:
    """The FLOPs a run spends against its budget, and what that means for its learning rate.

    Args:
        budget_flops: The run's (or episode's) budget in training FLOPs; None: none.
        schedule: The learning-rate schedule over the share of the budget spent (or of the
            planned steps without a budget); constant by default.
        decisions: Equal slices the budget is spent in (one per decision of an episode); None:
            the run is not sliced.
        budget_scale: The budget over the run's base budget when budgets vary by episode.
    """

    def __init__(self, budget_flops: float | None = None, schedule: LRSchedule | None = None,
                 decisions: int | None = None, budget_scale: float = 1.0) -> None:
        self.meter = FlopMeter()
        self.schedule = schedule or LRSchedule()
        self.decisions = decisions
        self.budget_flops: float | None = None
        self.budget_scale = 1.0
        #: Training FLOPs spent so far (host and every live seed, forward and backward).
        self.train_flops = 0.0
        #: Bumped by the engine whenever a slot may have changed what a step computes.
        self.revision = 0
        self._arch: tuple[Hashable, tuple[Any, ...]] | None = None
        self.reset(budget_flops, budget_scale)

    def reset(self, budget_flops: float | None = None, budget_scale: float = 1.0) -> None:
        """Start a new run (an env's episode) under ``budget_flops``: nothing spent yet. The
        meter's cache is kept: architectures do not change between episodes."""
        if budget_flops is not None and not budget_flops > 0:
            raise ValueError(f"budget_flops must be > 0 or None, got {budget_flops!r}")
        self.budget_flops = None if budget_flops is None else float(budget_flops)
        self.budget_scale = float(budget_scale)
        self.train_flops = 0.0
        self._arch = None

    # --- metering -----------------------------------------------------------------------------
    def architecture(self, module: nn.Module, key: Hashable) -> tuple[Any, ...]:
        """``module``'s `core.flops.structure`, read again only when ``key`` (what the caller
        knows changes it: epoch, train or eval mode) or `revision` moves."""
        full = (key, self.revision)
        if self._arch is None or self._arch[0] != full:
            self._arch = (full, structure(module))
        return self._arch[1]

    def training_cost(self, module: nn.Module, x: Tensor, forward: Forward | None = None,
                      arch: tuple[Any, ...] | None = None, key: Hashable = None) -> int:
        """FLOPs of one training step of ``module`` on a batch like ``x`` (its forward as
        ``forward(module, x)``). ``arch`` is the module's `core.flops.structure` when the caller
        knows it; else it is read once per ``key`` and `revision` (`architecture`), or at every
        call without a key."""
        if arch is None and key is not None:
            arch = self.architecture(module, key)
        return self.meter.training_step(module, x, forward, arch)

    def charge(self, flops: float) -> None:
        """Spend ``flops`` of training."""
        self.train_flops += flops

    # --- the budget ---------------------------------------------------------------------------
    @property
    def fraction(self) -> float | None:
        """The share of the budget spent (None without a budget)."""
        return None if self.budget_flops is None else self.train_flops / self.budget_flops

    @property
    def exhausted(self) -> bool:
        """Whether the budget is spent (never without one)."""
        return self.budget_flops is not None and self.train_flops >= self.budget_flops

    def slice_end(self, decision: int) -> float:
        """The training FLOPs by which the 1-based ``decision``-th slice ends: the budget
        itself, exactly, for the last one."""
        if self.budget_flops is None or self.decisions is None:
            raise RuntimeError("slices need a budget and a number of decisions")
        if decision >= self.decisions:
            return self.budget_flops
        return self.budget_flops * decision / self.decisions

    # --- the learning rate --------------------------------------------------------------------
    def lr_multiplier(self, cost: float, step: int = 0, planned_steps: int | None = None) -> float:
        """The schedule's multiplier for a batch of ``cost`` FLOPs taken now: at the middle of
        the batch's share of the budget; without a budget, of the planned steps (``step`` of
        ``planned_steps``). 1 for a constant schedule."""
        if self.schedule.kind == "constant":
            return 1.0
        if self.budget_flops is not None:
            return self.schedule.multiplier(batch_fraction(self.train_flops, cost,
                                                           self.budget_flops))
        if not planned_steps:
            raise RuntimeError(f"an lr_schedule {self.schedule.kind!r} needs a budget or a "
                               "planned number of steps")
        return self.schedule.multiplier(batch_fraction(step, 1, planned_steps))

    def apply_lr(self, param_groups: Iterable[dict[str, Any]], cost: float, step: int = 0,
                 planned_steps: int | None = None) -> float:
        """Set every group's ``lr`` to its base times `lr_multiplier` (`schedule.set_base_lrs`
        first); returns the multiplier. A constant schedule leaves the groups alone."""
        multiplier = self.lr_multiplier(cost, step, planned_steps)
        if self.schedule.kind != "constant":
            apply_multiplier(param_groups, multiplier)
        return multiplier

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"train_flops": self.train_flops, "budget_flops": self.budget_flops,
                "budget_scale": self.budget_scale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the FLOPs spent (the budget is the owner's to check: it was configured)."""
        self.train_flops = float(state["train_flops"])
