"""`WidthGrowthCallback`: widen a transformer once, at a point of a Trainer's fit."""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import chain
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from esper_lightning.callbacks._cadence import (
    RunPlan,
    grown_step_bound,
    run_fraction,
    run_plan,
)
from esper_lightning.callbacks.compute_budget import fit_budget
from esper_lightning.callbacks.morphogenesis import MorphogenesisCallback
from esper_lightning.controllers.stack import StackController
from esper_lightning.core.compute import ComputeLedger
from esper_lightning.core.slots import SeedSlot
from esper_lightning.core.width import Widening, WidthGrowth, check_widen, widen

__all__ = ["WidthGrowthCallback"]


class WidthGrowthCallback(Callback):
    r"""Widen a transformer by a `core.width.WidthGrowth` once, at fraction ``at`` of the fit.

    Width growth is one event, not a seed: no slot, no lifecycle. Before the first training step
    past ``at`` of the run (`core.width.widen`, function-preserving at birth; read its method
    card) the LightningModule, or its submodule ``module``, takes its new width in place: the
    same ``nn.Parameter`` objects, so the Trainer's optimizer keeps its param groups, and its
    AdamW state follows into the new shapes (``growth.moments``); an LR scheduler goes on. The
    run is what `MorphogenesisCallback` measures it in: a `ComputeBudget`'s share spent when the
    fit has one, else the optimizer steps over the planned ones (``max_steps``, ``max_epochs``)
    or the time over ``max_time``, whichever is further. Under gradient accumulation it waits for
    the first batch of an optimizer step, so no gradient of the old shapes is lost.

    **Compute.** The fit's `core.compute.ComputeLedger` (the `ComputeBudget`'s, else a
    `MorphogenesisCallback`'s) is told the model changed (`ComputeLedger.invalidate`), so the
    widening step and every step after it are charged at the wide model's cost, in either
    callback order.

    **Beside depth growth.** With a `MorphogenesisCallback` growing a stack
    (`controllers.StackController`, `core.depth.DepthGrowth`) the order is width first: the empty
    growth slots take the new width and the new blocks are made from the widened ones. Width
    growth does not widen a slot holding a seed (a growth seed stays in its slot, fossilized,
    until `core.depth.materialize`), so a fit is refused at setup, in one line, where ``at`` is
    not below the controller's first ``tau``, where the controller is not a `StackController`
    (its seeds could be live at any time), or where this callback is not listed before the
    `MorphogenesisCallback` (so a widening and a germination due at one step widen first).

    **Resume.** A checkpoint written after the widening resumes into the model built narrow:
    a ``load_state_dict`` pre-hook on the widened module widens it (the same ``growth``) when the
    checkpoint's tensors are whole multiples of its own, before the weights load; Lightning then
    restores the optimizer state of the wide shapes. The fit goes on bitwise as it would have.

    **Refused**, in one line: ``at`` outside (0, 1) (at construction); a module that cannot be
    widened (`core.width.check_widen`) at setup; a run with no training step past ``at``
    (``max_steps``, ``max_epochs``) at its start, or under a budget at its first step, when the
    cost of a step is known, as is a budget too short for the depth growth after the widening
    (each step then up to the widened and grown model's cost); more than one optimizer, or more
    than one process (DDP's buckets
    are built for the old shapes). A fit that ends before ``at`` (an early stop) warns that the
    model was not widened.

    Args:
        at: The fraction of the run, in (0, 1), after which the model is widened.
        growth: How it grows (`core.width.WidthGrowth`; None: twice the width, random split,
            AdamW moments carried).
        module: The path of the submodule to widen from the LightningModule (``"model"`` for a
            Hugging Face model held as ``self.model``); None: the LightningModule itself. Its
            ``growth.stack`` path is inside that module.
        lr_scale: Multiplies, at the widening, the learning rate of every param group holding a
            widened matrix (a 2-D parameter), its base (``initial_lr``, a `ComputeBudget`'s
            schedule's) and its LR scheduler's ``base_lrs``: ``1 / growth.factor`` is the
            μP-style rule (a hidden matrix k times wider takes a k times smaller rate). 1: the
            rates stay.

    Example:
        >>> from esper_lightning.callbacks import ComputeBudget
        >>> trainer = L.Trainer(max_epochs=-1, callbacks=[
        ...     WidthGrowthCallback(at=0.1, growth=WidthGrowth(factor=2), module="model"),
        ...     ComputeBudget(2e12, lr_schedule="wsd")])  # wide from a tenth of the budget
        >>> trainer.fit(lm, datamodule=dm)  # doctest: +SKIP
    """

    def __init__(self, at: float, growth: WidthGrowth | None = None, module: str | None = None,
                 lr_scale: float = 1.0) -> None:
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0.0 < at < 1.0:
            raise ValueError(f"WidthGrowthCallback at must be a fraction of the run in (0, 1) "
                             f"(the model widens at the first training step past it), got {at!r}")
        if growth is not None and not isinstance(growth, WidthGrowth):
            raise TypeError(f"WidthGrowthCallback growth must be a WidthGrowth or None, got "
                            f"{type(growth).__name__}")
        if module is not None and (not isinstance(module, str) or not module):
            raise ValueError(f"WidthGrowthCallback module must be a submodule path (e.g. "
                             f"'model') or None (the LightningModule), got {module!r}")
        if isinstance(lr_scale, bool) or not isinstance(lr_scale, int | float) or not (
                math.isfinite(lr_scale) and lr_scale > 0):
            raise ValueError(f"WidthGrowthCallback lr_scale must be a number > 0 (1: the rates "
                             f"stay; 1/factor: the μP-style rule), got {lr_scale!r}")
        self.at, self.module, self.lr_scale = float(at), module, float(lr_scale)
        self.growth = growth or WidthGrowth()
        #: The global step before which the model was widened (None: not yet); checkpointed.
        self.widened_step: int | None = None
        #: What this process's widening grew (`core.width.Widening`); None before it, and in a
        #: fit resumed after it.
        self.widening: Widening | None = None
        self._hook: RemovableHandle | None = None
        self._plan: RunPlan | None = None
        self._budget_checked = False
        self._resumed = False

    # --- setup: what can be refused before training -------------------------------------------
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            raise MisconfigurationException(
                f"WidthGrowthCallback trains in one process, got {trainer.world_size} "
                f"({type(trainer.strategy).__name__}): DDP's gradient buckets are built for the "
                "old shapes; accepted: one device")
        target = self._target(pl_module)
        if stage == "fit":
            self._check_growth_callbacks(trainer)
            try:
                check_widen(target, self.growth)
            except ValueError as err:
                raise MisconfigurationException(f"WidthGrowthCallback: {err}") from None
        if self._hook is not None:
            self._hook.remove()
        # Before Lightning loads a checkpoint's weights (after every setup hook), so a widened
        # checkpoint finds the module at its width.
        self._hook = target.register_load_state_dict_pre_hook(self._widen_to_load)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._resumed = False  # a checkpoint read by validate or test resumes no later fit

    def _target(self, pl_module: L.LightningModule) -> nn.Module:
        """The module to widen: ``pl_module`` or its submodule at ``module``, or one line."""
        if self.module is None:
            return pl_module
        try:
            return pl_module.get_submodule(self.module)
        except AttributeError:
            names = [n for n, _ in pl_module.named_children()]
            raise MisconfigurationException(
                f"WidthGrowthCallback module={self.module!r} is not a submodule of "
                f"{type(pl_module).__name__}; accepted: a path from it (its children: "
                f"{', '.join(names) or 'none'}) or None") from None

    def _check_growth_callbacks(self, trainer: L.Trainer) -> None:
        """Refuse, in one line, depth growth beside this widening that would leave a seed in a
        slot when it comes (class docstring, "Beside depth growth")."""
        mine = trainer.callbacks.index(self)
        for index, callback in enumerate(trainer.callbacks):
            if not isinstance(callback, MorphogenesisCallback):
                continue
            controller = callback.controller
            if not isinstance(controller, StackController):
                raise MisconfigurationException(
                    f"WidthGrowthCallback beside a MorphogenesisCallback needs a StackController, "
                    f"whose tau says when its seeds live; {type(controller).__name__} may hold a "
                    "seed when the model widens, which width growth does not widen; accepted: "
                    f"StackController(tau > {self.at:g})")
            if controller.tau <= self.at:
                raise MisconfigurationException(
                    f"WidthGrowthCallback(at={self.at:g}) falls at or after "
                    f"StackController(tau={controller.tau:g}), when its growth seed is in its slot "
                    "(live, then fossilized), which width growth does not widen; accepted: at < "
                    "tau (widen first: the new blocks are made from the widened ones)")
            if index < mine:
                raise MisconfigurationException(
                    f"WidthGrowthCallback must come before MorphogenesisCallback in the Trainer's "
                    f"callbacks (found at positions {mine} and {index}), so a widening and a "
                    "germination due at one step widen first: list the width growth first")

    # --- the run's plan and its checks --------------------------------------------------------
    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise MisconfigurationException(
                f"WidthGrowthCallback needs exactly one optimizer, whose state follows the new "
                f"shapes; got {len(trainer.optimizers)}")
        if not self._resumed:  # a fresh fit; a resumed one keeps what its checkpoint said
            self.widened_step, self.widening = None, None
        self._resumed, self._budget_checked, self._plan = False, False, None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The training batches are counted by now, so max_epochs says its steps.
        self._plan = run_plan(trainer, None)
        if self.widened_step is None and fit_budget(trainer) is None:
            self._check_steps(trainer, self._plan)

    def _check_steps(self, trainer: L.Trainer, plan: RunPlan) -> None:
        """Refuse a run without a training step past ``at`` (one line)."""
        if plan.steps is None:
            if run_fraction(trainer, plan) is None:  # neither steps nor max_time bound it
                raise MisconfigurationException(
                    f"WidthGrowthCallback(at={self.at:g}) needs the run's length; set "
                    "max_steps, max_epochs (with a sized training loader), max_time or a "
                    "ComputeBudget")
            return
        first = _first_step(self.at, lambda k: k / plan.steps)
        if first >= plan.steps:
            raise MisconfigurationException(
                f"WidthGrowthCallback(at={self.at:g}) would widen before step {first}, and the "
                f"run has {plan.steps} (max_steps={trainer.max_steps}, "
                f"max_epochs={trainer.max_epochs}): no training step past at; lower at or train "
                "longer")

    def _check_budget(self, trainer: L.Trainer, ledger: ComputeLedger) -> None:
        """Under a budget, once the first step's cost is known: refuse a budget (or a
        ``max_steps``) that ends before a step past ``at`` (one line)."""
        budget = ledger.budget_flops
        assert budget is not None
        per_step = ledger.train_flops / trainer.global_step
        if per_step <= 0:
            return
        first = _first_step(self.at, lambda k: k * per_step / budget)
        steps = self._plan.steps if self._plan is not None else None
        if first * per_step >= budget or (steps is not None and first >= steps):
            allowed = math.ceil(budget / per_step)
            what = (f"the budget ({budget:g} FLOPs) allows about {allowed} steps at the narrow "
                    f"cost" if steps is None or allowed <= steps else f"the run has {steps} steps "
                    f"(max_steps={trainer.max_steps}, max_epochs={trainer.max_epochs})")
            raise MisconfigurationException(
                f"WidthGrowthCallback(at={self.at:g}) would widen before step {first}, and {what}:"
                " no training step past at; lower at or train longer")
        self._check_depth_after_width(trainer, budget / per_step)

    def step_cost_bound(self) -> float:
        """How many times this step's cost a later step can cost at most (`GrowsSteps`):
        before the widening, ``factor * max(factor, mlp_factor)`` (the blocks' matrices grow in
        both dimensions, the rest by ``factor`` at most); after it, 1."""
        if self.widened_step is not None:
            return 1.0
        return float(self.growth.factor * max(self.growth.factor, self.growth.mlp_factor))

    def _check_depth_after_width(self, trainer: L.Trainer, narrow_steps: float) -> None:
        """Under a budget beside a `StackController`: refuse (one line) a budget whose steps
        after ``tau``, each at up to the widened and grown model's cost, are fewer than the
        depth growth needs to finish. The `MorphogenesisCallback`'s own check bounds a grown
        step by depth alone; widening first makes every later step up to ``factor *
        max(factor, mlp)``-fold dearer (the blocks' matrices grow in both dimensions), so a
        budget that check passed could still leave the growth seed half-born."""
        morpho = next((c for c in trainer.callbacks if isinstance(c, MorphogenesisCallback)),
                      None)
        if morpho is None or not isinstance(morpho.controller, StackController):
            return
        sites = [s.growth for s in morpho.engine.slots.values() if s.growth is not None]
        if not sites:
            return
        controller, growth = morpho.controller, self.growth
        dearer = growth.factor * max(growth.factor, growth.mlp_factor) * grown_step_bound(sites)
        left = (1.0 - controller.last_tau) * narrow_steps / dearer
        needed = controller.decisions_after_tau(len(sites))
        if left < needed:
            raise MisconfigurationException(
                f"WidthGrowthCallback(at={self.at:g}) with StackController(tau="
                f"{controller.last_tau:g}): after the widening and the growth a step costs up to "
                f"{dearer:g}x the first, so the budget leaves about {int(left)} steps after tau "
                f"and the depth growth needs >= {needed}; lower tau or raise the budget")

    # --- the widening -------------------------------------------------------------------------
    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.widened_step is not None:
            return
        budget = fit_budget(trainer)
        if budget is not None and not self._budget_checked and trainer.global_step >= 1:
            self._budget_checked = True
            self._check_budget(trainer, budget.ledger)
        fraction = self.widens_at(trainer, batch_idx)
        if fraction is not None:
            self._widen(trainer, pl_module, fraction)

    def widens_at(self, trainer: L.Trainer, batch_idx: int) -> float | None:
        """The run's fraction if this batch's start widens the model (past ``at``, at the first
        batch of an accumulation window, not widened yet), else None: what a callback before
        this one (the governor) asks before the widening."""
        if self.widened_step is not None or batch_idx % trainer.accumulate_grad_batches:
            return None
        budget = fit_budget(trainer)
        fraction = (budget.ledger.fraction if budget is not None
                    else None if self._plan is None else run_fraction(trainer, self._plan))
        return None if fraction is None or fraction < self.at else fraction

    def _widen(self, trainer: L.Trainer, pl_module: L.LightningModule, fraction: float) -> None:
        """Widen now, before this step: the optimizer's state follows, slots outside the widened
        module take the new width, the ledger meters the new cost from this step."""
        target = self._target(pl_module)
        inside = {id(m) for m in target.modules()}
        outside = [m for m in pl_module.modules()
                   if isinstance(m, SeedSlot) and id(m) not in inside]
        held = [s.slot_id for s in outside if s.seed is not None or s.gate is not None]
        if held:
            raise MisconfigurationException(f"WidthGrowthCallback: slot {held[0]!r} holds a seed, "
                                            "which width growth does not widen; accepted: "
                                            "empty slots (widen before the depth growth)")
        optimizer = trainer.optimizers[0]
        try:
            widening = widen(target, self.growth, optimizer)
        except ValueError as err:
            raise MisconfigurationException(f"WidthGrowthCallback: {err}") from None
        old, new = widening.hidden
        for slot in outside:
            if slot.channels == old:
                slot.resize(new)
        self._scale_lr(trainer, optimizer, target, widening)
        ledger = _fit_ledger(trainer)
        if ledger is not None:
            ledger.invalidate()  # this step is metered (and charged) at the wide model's cost
        self.widened_step, self.widening = trainer.global_step, widening
        rank_zero_info(f"WidthGrowthCallback: widened {type(target).__name__} before step "
                       f"{trainer.global_step} ({fraction:.3f} of the run): hidden width "
                       f"{old} -> {new}, MLP width {widening.mlp[0]} -> {widening.mlp[1]}")

    def _scale_lr(self, trainer: L.Trainer, optimizer: torch.optim.Optimizer, target: nn.Module,
                  widening: Widening) -> None:
        """``lr_scale`` on every group holding a widened matrix: its rate, its base and its
        schedulers' bases (so a schedule or a `ComputeBudget` keeps the scaled rate)."""
        if self.lr_scale == 1.0:
            return
        matrices = {id(target.get_parameter(name)) for name in widening.fresh
                    if target.get_parameter(name).dim() >= 2}
        schedulers = [c.scheduler for c in trainer.lr_scheduler_configs
                      if getattr(c.scheduler, "optimizer", None) is optimizer]
        for index, group in enumerate(optimizer.param_groups):
            if not any(id(p) in matrices for p in group["params"]):
                continue
            group["lr"] *= self.lr_scale
            if "initial_lr" in group:
                group["initial_lr"] *= self.lr_scale
            for scheduler in schedulers:
                bases = getattr(scheduler, "base_lrs", None)
                if bases is not None:
                    bases[index] *= self.lr_scale

    def _widen_to_load(self, module: nn.Module, state_dict: dict[str, Any], prefix: str,
                       *_: Any) -> None:
        """A ``load_state_dict`` pre-hook: widen ``module`` (without an optimizer: Lightning
        restores its state afterwards) when the incoming tensors are the wider shapes, every
        one that differs a whole multiple of the module's own, before they load. Anything else
        is left to ``load_state_dict`` to report."""
        wider = False
        for name, tensor in chain(module.named_parameters(), module.named_buffers()):
            incoming = state_dict.get(prefix + name)
            if not isinstance(incoming, Tensor) or incoming.shape == tensor.shape:
                continue
            pairs = zip(incoming.shape, tensor.shape, strict=False)
            if incoming.dim() != tensor.dim() or not all(o > 0 and n % o == 0 for n, o in pairs):
                return
            wider = True
        if wider:
            widening = widen(module, self.growth)
            rank_zero_info(f"WidthGrowthCallback: widened {type(module).__name__} to load a "
                           f"checkpoint of its wider shapes (hidden width {widening.hidden[0]} -> "
                           f"{widening.hidden[1]})")

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.widened_step is None:
            rank_zero_warn(f"WidthGrowthCallback(at={self.at:g}): the fit ended at step "
                           f"{trainer.global_step}, before at: the model was not widened")

    # --- state --------------------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"at": self.at, "widened_step": self.widened_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume whether (and where) the model was widened. The weights of a widened
        checkpoint were loaded at its width already (`_widen_to_load`)."""
        step = state_dict.get("widened_step")
        self.widened_step = None if step is None else int(step)
        self._resumed = True


def _fit_ledger(trainer: L.Trainer) -> ComputeLedger | None:
    """The fit's ledger: its `ComputeBudget`'s, else a `MorphogenesisCallback`'s, else none."""
    budget = fit_budget(trainer)
    if budget is not None:
        return budget.ledger
    growth = next((c for c in trainer.callbacks if isinstance(c, MorphogenesisCallback)), None)
    return None if growth is None else growth.ledger


def _first_step(at: float, fraction: Callable[[int], float]) -> int:
    """The first optimizer step ``k`` whose start is at least ``at`` of the run
    (``fraction(k) >= at``; ``fraction`` non-decreasing, computed as the run computes it).

    Example:
        >>> _first_step(0.3, lambda k: k / 10), _first_step(0.31, lambda k: k / 10)
        (3, 4)
    """
    step = max(0, math.ceil(at / max(fraction(1), 1e-300)))
    while step > 0 and fraction(step - 1) >= at:
        step -= 1
    while fraction(step) < at:
        step += 1
    return step
