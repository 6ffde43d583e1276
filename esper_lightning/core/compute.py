"""`ComputeLedger`: the one owner of a run's compute.

It holds the FLOP meter (`core.flops.FlopMeter`, its cache outliving hosts), the FLOPs spent by
kind (`FLOP_KINDS`), the budget (None: none) with the episode's budget scale, its slice per
decision, and the learning-rate multiplier over the budget spent. Every loop that trains under
a ledger steps it the same way (the Trainer's `ComputeBudget`, a Fabric env, the frontier's
runs): `begin_step` (the step's cost, metered once per architecture, and the learning rate at
the middle of the batch) before the optimizer step, `end_step` (the cost charged; whether the
budget is spent) after it; a validation run is charged by `charge_validation`, with one rule
for what the counterfactual adds. `invalidate` says the architecture may have changed (a slot
did, or a growth), so the next step is metered again.

The rate's schedule is an `LRSchedule` over the share of the budget spent, or a
`BudgetSchedule` whose warmup is an amount of compute (the frontier's: runs of different budgets
share their steps up to the smaller one's decay); `rewarm` re-warms it from 0 after a growth,
and `set_budget` moves the budget without touching what was spent (a branched cooldown trains
the shared run toward the largest budget and each branch toward its own). The ledger's state
(`state_dict`) holds what a branch must put back: the FLOPs of every kind and the re-warm.

The kinds split every FLOP a run spends once, by what it is for:

- ``train``: training steps' FLOPs of the host (every fossilized seed is the host's);
- ``growth``: what the *live* seeds (germinated and running, not yet fossilized:
  `core.flops.live_slots`) add to each training step, forward and backward: the price of
  trying a growth while it is judged (`StepCost`);
- ``validation``: validation forwards;
- ``counterfactual``: the counterfactual's configurations beyond the plain forward.

A budget counts the training steps whole (`BUDGET_KINDS`, `spent`: ``train`` + ``growth``),
exactly what it counted before the two were told apart. Why growth is the live seeds' share of
the steps: a growth costs no FLOP outside a step (a germination, a widening or a deepening runs
no forward), so what a growth costs is the work its seeds do in the steps that judge them; once
fossilized, a seed is the model the user keeps, and its FLOPs are those of a bigger host,
exactly as a host born that big or widened in place (the frontier's growth, which has no live
seed) spends ``train`` alone. The split costs no forward: the step with the live seeds off
(`core.flops.FlopMeter.host_step`) is metered once per architecture, like the step itself, and
is the host's own earlier measurement when the seeds germinated after it.

Who holds a run's ledger: a Fabric env one for all its episodes (`reset` per episode); in a
Trainer, the `ComputeBudget` when there is one, else the `MorphogenesisCallback`
(`callbacks.compute_budget.fit_budget`, the one rule); the holder charges the steps and saves and
resumes the ledger with its own state.

Example:
    >>> import torch
    >>> from torch import nn
    >>> ledger = ComputeLedger(budget_flops=1e6, schedule=LRSchedule("wsd"), decisions=4)
    >>> cost = ledger.begin_step(nn.Linear(64, 32), torch.zeros(8, 64))
    >>> ledger.end_step(cost)
    False
    >>> cost, ledger.fraction, ledger.slice_end(1)
    (StepCost(train=65536, growth=0), 0.065536, 250000.0)
    >>> ledger.charge(2048, "validation")
    >>> ledger.flops
    {'train': 65536.0, 'growth': 0.0, 'validation': 2048.0, 'counterfactual': 0.0}
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from esper_lightning.core.flops import FlopMeter, host_structure, structure
from esper_lightning.schedule import BudgetSchedule, LRSchedule, apply_multiplier, batch_fraction

__all__ = ["BUDGET_KINDS", "FLOP_KINDS", "ComputeLedger", "StepCost"]

#: What a run spends FLOPs on (module docstring): the host's training steps, what live seeds
#: add to them, validation forwards and the counterfactual's configurations beyond the plain
#: forward.
FLOP_KINDS = ("train", "growth", "validation", "counterfactual")
#: The kinds a budget counts: the training steps, whole.
BUDGET_KINDS = ("train", "growth")

Forward = Callable[[nn.Module, Tensor], Tensor]
Structure = tuple[Any, ...]


@dataclass(frozen=True)
class StepCost:
    """One training step's FLOPs (forward and backward), split by who computes them.

    Attributes:
        train: the host's, fossilized seeds included: the step with every live seed off.
        growth: what the live seeds add (the step's cost minus ``train``).
    """

    train: int
    growth: int = 0

    @property
    def total(self) -> int:
        """The whole step: what a budget spends."""
        return self.train + self.growth

    def times(self, ranks: int) -> StepCost:
        """The step over ``ranks`` data-parallel ranks that each take such a batch."""
        return StepCost(self.train * ranks, self.growth * ranks)


class ComputeLedger:
    """The FLOPs a run spends against its budget, and what that means for its learning rate.

    Args:
        budget_flops: The run's (or episode's) budget in training FLOPs; None: none.
        schedule: The learning-rate schedule over the share of the budget spent (or of the
            planned steps without a budget), or a `BudgetSchedule` over the FLOPs spent (it
            needs a budget); constant by default.
        decisions: Equal slices the budget is spent in (one per decision of an episode); None:
            the run is not sliced.
        budget_scale: The budget over the run's base budget when budgets vary by episode.
        meter: The FLOP meter, when runs share one (its cache: one meta pass per architecture
            over all of them); None: a meter of the ledger's own.
    """

    def __init__(self, budget_flops: float | None = None,
                 schedule: LRSchedule | BudgetSchedule | None = None,
                 decisions: int | None = None, budget_scale: float = 1.0,
                 meter: FlopMeter | None = None) -> None:
        self.meter = meter if meter is not None else FlopMeter()
        self.schedule = schedule or LRSchedule()
        self.decisions = decisions
        self.budget_flops: float | None = None
        self.budget_scale = 1.0
        #: FLOPs spent so far by kind (`FLOP_KINDS`): a training step's host share is
        #: ``train``, its live seeds' ``growth`` (forward and backward of both).
        self.flops: dict[str, float] = dict.fromkeys(FLOP_KINDS, 0.0)
        self._revision = 0
        self._arch: tuple[Hashable, Structure, Structure] | None = None
        self._last_cost: tuple[tuple[Any, ...], StepCost] | None = None
        self._last_given: tuple[Structure, Structure, tuple[Any, ...], StepCost] | None = None
        #: The learning-rate multiplier `begin_step` set last in param groups (1 before any).
        self.multiplier = 1.0
        self._rewarm: tuple[float, float] | None = None
        self.reset(budget_flops, budget_scale)

    def reset(self, budget_flops: float | None = None, budget_scale: float = 1.0) -> None:
        """Start a new run (an env's episode) under ``budget_flops``: nothing spent yet, no
        re-warm. The meter's cache is kept: architectures do not change between episodes."""
        self.set_budget(budget_flops)
        self.budget_scale = float(budget_scale)
        self.flops = dict.fromkeys(FLOP_KINDS, 0.0)
        self._rewarm = None
        self._arch = None
        self._last_cost = self._last_given = None

    def set_budget(self, budget_flops: float | None) -> None:
        """The budget from now on (None: none), what was spent kept: a branched cooldown
        trains the shared run toward the largest budget and each branch toward its own."""
        if budget_flops is not None and not budget_flops > 0:
            raise ValueError(f"budget_flops must be > 0 or None, got {budget_flops!r}")
        self.budget_flops = None if budget_flops is None else float(budget_flops)

    @property
    def spent(self) -> float:
        """The training steps' FLOPs spent so far, host and live seeds (``train`` +
        ``growth``): what the budget counts."""
        return self.flops["train"] + self.flops["growth"]

    @property
    def train_flops(self) -> float:
        """`spent`, by the name every report and log uses for it (``train_flops``: the
        training steps' FLOPs; ``flops["train"]`` is the host's share of them)."""
        return self.spent

    @property
    def revision(self) -> int:
        """Moves whenever what a step computes may have changed (`invalidate`): a caller that
        caches a step's cost or the architecture reads them again when it moves."""
        return self._revision

    def invalidate(self) -> None:
        """Say that a slot may have changed what a step computes (a germination, a blend's
        start, a prune): the next step's architecture is read again."""
        self._revision += 1

    # --- metering -----------------------------------------------------------------------------
    def architecture(self, module: nn.Module, key: Hashable) -> Structure:
        """``module``'s `core.flops.structure`, read again only when ``key`` (what the caller
        knows changes it: epoch, train or eval mode) or `revision` moves."""
        return self._architectures(module, key)[0]

    def _architectures(self, module: nn.Module, key: Hashable) -> tuple[Structure, Structure]:
        """`architecture` and its `core.flops.host_structure`, read together."""
        full = (key, self.revision)
        if self._arch is None or self._arch[0] != full:
            arch = structure(module)
            self._arch = (full, arch, host_structure(module, arch))
        return self._arch[1], self._arch[2]

    def training_cost(self, module: nn.Module, x: Tensor, forward: Forward | None = None,
                      arch: Structure | None = None, key: Hashable = None) -> int:
        """FLOPs of one training step of ``module`` on a batch like ``x`` (its forward as
        ``forward(module, x)``), whole: `step_cost`'s total. ``arch`` is the module's
        `core.flops.structure` when the caller knows it; else it is read once per ``key`` and
        `revision` (`architecture`), or at every call without a key."""
        if arch is None and key is not None:
            return self.step_cost(module, x, forward, key=key).total
        return self.meter.training_step(module, x, forward, arch)

    def step_cost(self, module: nn.Module, x: Tensor, forward: Forward | None = None,
                  arch: Structure | None = None, host_arch: Structure | None = None,
                  key: Hashable = None) -> StepCost:
        """One training step of ``module`` on a batch like ``x``, split into the host's share
        and what its live seeds add (`StepCost`), each metered once per architecture.
        ``arch`` and ``host_arch`` are the module's `core.flops.structure` and
        `core.flops.host_structure` when the caller read them (an env, once per epoch); else
        they are read once per ``key`` and `revision`, or at every call without a key."""
        if arch is None and key is not None:
            # The same step again (the architecture unchanged since ``key`` and `revision` were
            # read, a batch of the same shape): the last cost, without hashing the signature.
            last = (key, self._revision, tuple(x.shape), x.dtype, forward)
            if self._last_cost is not None and self._last_cost[0] == last:
                return self._last_cost[1]
            cost = self._split(module, x, forward, *self._architectures(module, key))
            self._last_cost = (last, cost)
            return cost
        if arch is not None and host_arch is not None:
            # The structures the caller read, the very same objects again (an env's, for its
            # epoch) on a batch of the same shape: the last cost, without hashing them.
            shape = (tuple(x.shape), x.dtype, forward)
            given = self._last_given
            if given is not None and given[0] is arch and given[1] is host_arch and (
                    given[2] == shape):
                return given[3]
            cost = self._split(module, x, forward, arch, host_arch)
            self._last_given = (arch, host_arch, shape, cost)
            return cost
        arch = structure(module) if arch is None else arch
        return self._split(module, x, forward, arch, host_structure(module, arch))

    def _split(self, module: nn.Module, x: Tensor, forward: Forward | None, arch: Structure,
               host_arch: Structure) -> StepCost:
        whole = self.meter.training_step(module, x, forward, arch)
        # No live seed: the host is the whole model (the same object), no second lookup.
        host = whole if host_arch is arch else self.meter.host_step(module, x, forward,
                                                                     host_arch)
        return StepCost(host, whole - host)

    def charge(self, flops: float, kind: str = "train") -> None:
        """Spend ``flops`` (>= 0) of ``kind`` (`FLOP_KINDS`); only the training steps'
        kinds (`BUDGET_KINDS`) spend the budget."""
        if kind not in self.flops:
            raise ValueError(f"unknown FLOP kind {kind!r}; accepted: {', '.join(FLOP_KINDS)}")
        if not flops >= 0:
            raise ValueError(f"a charge must be >= 0 FLOPs, got {flops!r}")
        self.flops[kind] += flops

    def charge_validation(self, forward: float, counterfactual: float | None = None,
                          forward_included: bool = False) -> None:
        """Charge one validation batch: its plain ``forward`` and, when a counterfactual was
        evaluated, what it added: the configurations beyond the plain forward. Where the
        counterfactual's main configuration *is* the validation forward (an env validates
        through it: ``forward_included``), it adds ``counterfactual - forward``; where it runs
        beside the module's own validation step (a Trainer), all of ``counterfactual``."""
        self.charge(forward, "validation")
        if counterfactual is not None:
            self.charge(counterfactual - forward if forward_included else counterfactual,
                        "counterfactual")

    # --- stepping -----------------------------------------------------------------------------
    def begin_step(self, module: nn.Module, x: Tensor, forward: Forward | None = None,
                   arch: Structure | None = None, key: Hashable = None,
                   param_groups: Iterable[dict[str, Any]] = (), step: int = 0,
                   planned_steps: int | None = None, ranks: int = 1,
                   host_arch: Structure | None = None) -> StepCost:
        """Before a training step on a batch like ``x``: its cost (`step_cost`, times the
        data-parallel ``ranks`` that each take such a batch), and every group in
        ``param_groups`` set to its base learning rate times the schedule's multiplier at the
        middle of the batch (`apply_lr`; kept as `multiplier`). Returns the cost, for
        `end_step`."""
        cost = self.step_cost(module, x, forward, arch, host_arch, key).times(ranks)
        groups = list(param_groups)
        if groups:
            self.multiplier = self.apply_lr(groups, cost.total, step, planned_steps)
        return cost

    def end_step(self, cost: StepCost | float) -> bool:
        """After the step: its ``cost`` charged, the host's share to ``train`` and the live
        seeds' to ``growth`` (a plain number, from a loop that meters no seed, is all
        ``train``); whether the budget is spent."""
        if isinstance(cost, StepCost):
            self.charge(cost.train)
            self.charge(cost.growth, "growth")
        else:
            self.charge(cost)
        return self.exhausted

    # --- the budget ---------------------------------------------------------------------------
    @property
    def fraction(self) -> float | None:
        """The share of the budget spent (None without a budget)."""
        return None if self.budget_flops is None else self.spent / self.budget_flops

    @property
    def exhausted(self) -> bool:
        """Whether the budget is spent (never without one)."""
        return self.budget_flops is not None and self.spent >= self.budget_flops

    def slice_end(self, decision: int) -> float:
        """The training FLOPs by which the 1-based ``decision``-th slice ends: the budget
        itself, exactly, for the last one."""
        if self.budget_flops is None or self.decisions is None:
            raise RuntimeError("slices need a budget and a number of decisions")
        if decision >= self.decisions:
            return self.budget_flops
        return self.budget_flops * decision / self.decisions

    # --- the learning rate --------------------------------------------------------------------
    def middle(self, cost: float) -> float:
        """The training FLOPs spent at the middle of a batch of ``cost`` FLOPs taken now: where
        its rate is read (`schedule.batch_fraction`'s convention, in FLOPs)."""
        return self.spent + 0.5 * cost

    def rewarm(self, flops: float) -> None:
        """From now on the rate re-warms: the schedule's multiplier times one rising linearly
        from 0 at the FLOPs spent now to 1 after ``flops`` more (read at each batch's middle,
        as the schedule is), then 1; a later call starts the ramp again. A growth's new
        blocks start without AdamW moments, so their first steps at the full rate would be the
        run's largest (the frontier's ``+rewarm`` and phase rates)."""
        if not flops > 0:
            raise ValueError(f"a re-warm takes > 0 FLOPs, got {flops!r}")
        self._rewarm = (self.spent, float(flops))

    @property
    def _sets_rate(self) -> bool:
        """Whether the rate is the ledger's to set: any schedule but a constant `LRSchedule`
        (a `BudgetSchedule` warms up whatever its shape), or a re-warm."""
        return (isinstance(self.schedule, BudgetSchedule) or self.schedule.kind != "constant"
                or self._rewarm is not None)

    def lr_multiplier(self, cost: float, step: int = 0, planned_steps: int | None = None) -> float:
        """The schedule's multiplier for a batch of ``cost`` FLOPs taken now: at the middle of
        the batch's share of the budget (a `BudgetSchedule`: of the FLOPs spent, `middle`);
        without a budget, of the planned steps (``step`` of ``planned_steps``); times the
        `rewarm` ramp after one. 1 for a constant `LRSchedule` without a re-warm."""
        multiplier = self._scheduled(cost, step, planned_steps)
        if self._rewarm is not None:
            start, flops = self._rewarm
            multiplier *= min(1.0, (self.middle(cost) - start) / flops)
        return multiplier

    def _scheduled(self, cost: float, step: int, planned_steps: int | None) -> float:
        if isinstance(self.schedule, BudgetSchedule):
            if self.budget_flops is None:
                raise RuntimeError("a BudgetSchedule needs a budget; accepted: set_budget(> 0) "
                                   "before the first step")
            return self.schedule.multiplier(self.middle(cost), self.budget_flops)
        if self.schedule.kind == "constant":
            return 1.0
        if self.budget_flops is not None:
            return self.schedule.multiplier(batch_fraction(self.spent, cost,
                                                           self.budget_flops))
        if not planned_steps:
            raise RuntimeError(f"an lr_schedule {self.schedule.kind!r} needs a budget or a "
                               "planned number of steps")
        return self.schedule.multiplier(batch_fraction(step, 1, planned_steps))

    def apply_lr(self, param_groups: Iterable[dict[str, Any]], cost: float, step: int = 0,
                 planned_steps: int | None = None) -> float:
        """Set every group's ``lr`` to its base times `lr_multiplier` (`schedule.set_base_lrs`
        first); returns the multiplier. A constant `LRSchedule` without a re-warm leaves the
        groups alone."""
        multiplier = self.lr_multiplier(cost, step, planned_steps)
        if self._sets_rate:
            apply_multiplier(param_groups, multiplier)
        return multiplier

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The FLOPs spent by kind, the budget and its scale, and the `rewarm` in progress
        (None: none), copied: what a resume or a branch's end puts back."""
        return {"flops": dict(self.flops), "budget_flops": self.budget_flops,
                "budget_scale": self.budget_scale,
                "rewarm": None if self._rewarm is None else list(self._rewarm)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the FLOPs spent and the re-warm (the budget is the holder's to check: it was
        configured). A kind the state does not name starts at 0: a state written before
        ``growth`` was told apart charged the live seeds' share to ``train``, which then holds
        the whole steps (`spent` is the same). A state written before the kinds holds the
        training FLOPs alone (``train_flops``); the other kinds are then left as they are (the
        engine's state held them). A state written before re-warms has none."""
        if "flops" in state:
            self.flops = {kind: float(state["flops"].get(kind, 0.0)) for kind in FLOP_KINDS}
        else:
            self.flops["train"] = float(state["train_flops"])
        rewarm = state.get("rewarm")
        self._rewarm = None if rewarm is None else (float(rewarm[0]), float(rewarm[1]))

    def restore_train_flops(self, flops: float) -> None:
        """Set the training steps' FLOPs spent (`spent`; a run restored from a snapshot of its
        own, or a checkpoint that kept them elsewhere): a total whose split is not known, so
        all ``train`` and no ``growth``."""
        if not flops >= 0:
            raise ValueError(f"training FLOPs must be >= 0, got {flops!r}")
        self.flops["train"] = float(flops)
        self.flops["growth"] = 0.0
