"""`ComputeBudget`: end a fit when its training FLOPs reach a budget, with a learning-rate
schedule over the fraction of the budget spent."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from typing_extensions import override

from esper_lightning.callbacks._cadence import RESUME_OR_RAISE, run_limit, run_plan, took_step
from esper_lightning.callbacks._metering import (
    GrowsSteps,
    MetersSteps,
    check_metering_functions,
    step_cost,
)
from esper_lightning.core.compute import ComputeLedger, StepCost
from esper_lightning.schedule import LRSchedule, set_base_lrs

#: FLOPs per step of the loss-vs-FLOPs chart: one. A TensorBoard step is a 64-bit integer, so
#: the training FLOPs spent, unrounded, are its step (up to 9.2e18 FLOPs).
FLOPS_PER_STEP = 1


class ComputeBudget(Callback):
    r"""Stop training when its FLOPs reach ``budget_flops``; schedule the learning rate over the
    fraction of the budget spent.

    It owns the fit's compute (`core.compute.ComputeLedger`, `ledger`): every training step is
    metered (forward and backward of the module and every seed in it, once per architecture, on
    meta tensors, so training is untouched), summed over DDP ranks, and charged to the ledger:
    the host's share (fossilized seeds included) as ``train``, what the live seeds add as
    ``growth``. The budget counts both (`spent`).
    The step that brings the total to the budget is the last one: the Trainer stops after it
    (``trainer.should_stop``, as `EarlyStopping` does; the epoch's validation still runs, so the
    last validation is at the budget), so a fit ends within one batch past its budget.

    The schedule (``lr_schedule``: ``"constant"``, ``"wsd"`` or ``"cosine"``, `schedule`) sets
    every param group's ``lr`` to its base (``initial_lr``, recorded at fit start) times the
    multiplier at the middle of the batch's FLOPs, before each step; a seed group that a
    `MorphogenesisCallback` adds mid-run starts at its own base times the current multiplier. So
    any arm, however it grows, ends its decay at its budget: its last step trains at the
    multiplier of that step's middle, within one step of the floor. A non-constant schedule
    replaces an LR scheduler: one configured by the module is refused at fit start.

    The budget ends the fit (``max_epochs=-1``). A run whose own length ends it first
    (``max_steps``, or ``max_epochs`` of a loader of known length) draws one warning at its
    first step when even its dearest steps could not spend the budget (each growth callback
    says how much dearer its growth can make a step: `GrowsSteps`), and a fit that ends short
    unannounced (a controller whose seeds' cost has no bound, ``max_time``, another callback)
    one at its end: what the budget plans after that point does not happen in that fit. Not
    refused: a fit cut short on purpose is resumed from its checkpoint.

    With a `MorphogenesisCallback` in the same Trainer (any order) its engine reports this
    ledger (the controller sees the budget: `EpochReport.budget_fraction`), and steps are
    metered its way (its ``batch_to_xy`` and ``logits_fn``); without one, ``batch_to_xy`` and
    ``logits_fn`` here say how to read the inputs and compute logits (defaults: ``(x, y)``
    batches, ``module(x)``).

    Logged to every logger on the steps the Trainer writes its own step metrics (every
    ``log_every_n_steps`` and the step that ends the fit, at Lightning's step numbers):
    ``compute/train_flops`` (the training steps' FLOPs, `spent`), ``compute/growth_flops``
    (the live seeds' share of them), ``compute/budget_fraction`` and, with a schedule,
    ``compute/lr_multiplier``; straight to the loggers, so ``trainer.callback_metrics`` does not
    hold them (`spent` and `budget_fraction` say the same, always current). After each
    validation of the fit, the logged validation loss (``loss_key``) goes to every TensorBoard
    logger again as ``compute/<loss_key>_vs_flops`` with the training FLOPs spent, unrounded, as
    its step (`FLOPS_PER_STEP`): TensorBoard's chart of that tag is the loss against training
    compute, so runs that spend their FLOPs differently (a host that grows, one born big)
    compare on one axis. A logger whose metrics share one step axis (CSV, W&B, MLflow) gets
    the same tag at the fit's step instead, beside ``compute/train_flops``, to chart one
    against the other. The ledger is part of the callback's state: a fit resumed from a
    checkpoint goes on from the FLOPs it had spent.

    Args:
        budget_flops: the budget in training FLOPs (> 0).
        lr_schedule: ``"constant"`` (the learning rate is left alone), ``"wsd"`` or ``"cosine"``.
        warmup_fraction: share of the budget warming up (`LRSchedule`).
        decay_fraction: share at the end decaying to ``min_lr_ratio`` (None: the schedule's
            default, `LRSchedule`).
        min_lr_ratio: the last learning rate as a share of the base one.
        batch_to_xy: ``batch -> (inputs, targets)`` of a training batch (without a
            `MorphogenesisCallback`).
        logits_fn: ``(module, x) -> logits`` (without a `MorphogenesisCallback`).
        loss_key: the logged validation loss to chart against the FLOPs spent (None: no chart).
            A key the module never logs draws one warning per fit naming the logged keys.

    Example:
        >>> budget = ComputeBudget(2e12, lr_schedule="wsd", warmup_fraction=0.03,
        ...                        decay_fraction=0.2)
        >>> trainer = L.Trainer(max_epochs=-1, callbacks=[budget])  # the budget ends the fit
        >>> trainer.fit(GPTHost("tiny"), datamodule=dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        budget_flops: float,
        lr_schedule: str = "constant",
        warmup_fraction: float = 0.0,
        decay_fraction: float | None = None,
        min_lr_ratio: float = 0.0,
        batch_to_xy: Callable[[Any], tuple[Tensor, Any]] | None = None,
        logits_fn: Callable[[L.LightningModule, Tensor], Tensor] | None = None,
        loss_key: str | None = "val_loss",
    ) -> None:
        if isinstance(budget_flops, bool) or not isinstance(budget_flops, int | float) or not (
                math.isfinite(budget_flops) and budget_flops > 0):
            raise ValueError(f"budget_flops must be a number > 0, got {budget_flops!r}")
        if loss_key is not None and (not isinstance(loss_key, str) or not loss_key):
            raise ValueError(f"loss_key must name a logged validation loss, or be None for no "
                             f"chart, got {loss_key!r}")
        check_metering_functions(batch_to_xy, logits_fn)
        self.budget_flops = float(budget_flops)
        self.schedule = LRSchedule(lr_schedule, warmup_fraction, decay_fraction, min_lr_ratio)
        #: The fit's compute: what is spent against this budget (saved with the state).
        self.ledger = ComputeLedger(self.budget_flops, self.schedule)
        self.batch_to_xy = batch_to_xy
        self.logits_fn = logits_fn
        self.loss_key = loss_key
        self._warned = False
        self._reach_checked = self._told_short = False
        self._resumed = False  # load_state_dict ran since the last fit started
        self._step_at_batch_start = -1  # trainer.global_step when this batch began
        self._step_cost = StepCost(0)
        self._revision = -1  # the ledger's revision when this step was metered
        self._metering: MetersSteps | None = None

    @property
    def spent(self) -> float:
        """Training steps' FLOPs spent so far in this run, host and live seeds (the ledger's
        `ComputeLedger.spent`)."""
        return self.ledger.spent

    @property
    def budget_fraction(self) -> float:
        """The share of the budget spent."""
        return self.spent / self.budget_flops

    @property
    def told_short(self) -> bool:
        """Whether this fit was told, at its first step, that its own length (``max_steps``,
        ``max_epochs``) ends it before the budget is spent: what the budget plans later (a
        decay, a growth) will not happen in this fit."""
        return self._told_short

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning restores a resumed fit's callback state before this hook.
        resumed, self._resumed = self._resumed, False
        if self.spent > 0 and not resumed:
            raise MisconfigurationException(
                f"ComputeBudget({self.budget_flops:g} FLOPs) already spent {self.spent:.4g} "
                "FLOPs in an earlier fit; give each fit its own ComputeBudget, or resume that "
                "fit from its checkpoint (trainer.fit(..., ckpt_path=...))")
        self._metering = next((c for c in trainer.callbacks if c is not self
                               and isinstance(c, MetersSteps)), None)
        if self._metering is not None and not getattr(self._metering, "meter_flops", True):
            raise MisconfigurationException("ComputeBudget needs the FLOPs the "
                                            "MorphogenesisCallback meters; drop its "
                                            "meter_flops=False")
        if self.schedule.kind != "constant" and trainer.lr_scheduler_configs:
            raise MisconfigurationException(
                f"ComputeBudget(lr_schedule={self.schedule.kind!r}) schedules the learning rate "
                f"itself; {type(pl_module).__name__}.configure_optimizers also returns an LR "
                "scheduler: drop it, or use lr_schedule='constant'")
        for optimizer in trainer.optimizers:
            set_base_lrs(optimizer.param_groups)
        self._warned = False
        self._reach_checked = self._told_short = False

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fit resumed from the checkpoint of its budget's last step trains nothing more.
        if self.ledger.exhausted:
            trainer.should_stop = True

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step
        groups = [g for optimizer in trainer.optimizers for g in optimizer.param_groups]
        self._step_cost = self._cost(trainer, pl_module, batch, groups)
        self._revision = self.ledger.revision
        if not self._reach_checked:
            self._reach_checked = True
            self._check_reach(trainer)

    def _check_reach(self, trainer: L.Trainer) -> None:
        """Warn, in one line, when the run's own length (``max_steps``, or ``max_epochs`` of a
        loader of known length) ends it before the budget is spent even if every step left cost
        the most the growth callbacks allow (`GrowsSteps`): its schedule will not finish
        decaying, and what the budget plans later will not happen in this fit. Not refused: a
        fit cut short on purpose is resumed from its checkpoint. A budget under one optimizer
        step is refused: nothing it could train would follow its schedule."""
        # Batches a step (an epoch shorter than the window steps at its last batch).
        per_step = self._step_cost.total * min(trainer.accumulate_grad_batches,
                                               trainer.num_training_batches)
        if per_step > self.budget_flops:
            raise MisconfigurationException(
                f"ComputeBudget({self.budget_flops:g} FLOPs) is less than one optimizer step of "
                f"this fit ({per_step:.4g} FLOPs); accepted: a budget of at least one step")
        limit = run_plan(trainer, None).steps
        dearest = math.prod(c.step_cost_bound() for c in trainer.callbacks
                            if isinstance(c, GrowsSteps))
        if (limit is None or trainer.fast_dev_run or not math.isfinite(dearest)
                or self._step_cost.total <= 0):
            return
        most = self.spent + (limit - trainer.global_step) * per_step * dearest
        if most >= self.budget_flops:
            return
        self._told_short = True
        grown = f", {dearest:g}x this step's cost once grown" if dearest > 1 else ""
        share = most / self.budget_flops
        rank_zero_warn(
            f"ComputeBudget({self.budget_flops:g} FLOPs): {run_limit(trainer, limit)} ends the "
            f"fit after {limit} steps, which spend at most {most:.3g} FLOPs ({share:.0%} of the "
            f"budget{grown}): what the budget plans after that (a decay, a growth) will not "
            f"happen in this fit ({RESUME_OR_RAISE})")

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ledger.revision != self._revision:
            # A callback after this one changed the model before the step (a growth decided
            # at this batch's start): the step trained the new one, so that is what it cost.
            self._step_cost = self._cost(trainer, pl_module, batch)
        # Stopped and logged where an optimizer step ends, never inside an accumulation
        # window: its last batches would be charged and never applied, and Lightning writes
        # a step's metrics once, at the batch that took it.
        stepped = took_step(trainer, pl_module, self._step_at_batch_start)
        if self.ledger.end_step(self._step_cost) and stepped:
            trainer.should_stop = True
        if stepped and _logs_this_step(trainer):
            self._log(trainer)

    def _log(self, trainer: L.Trainer) -> None:
        """Write the budget's scalars to every logger, at the step Lightning writes this step's
        own metrics at. Straight to the loggers, not through ``LightningModule.log``: one
        ``log`` call costs about a millisecond (Lightning moves its whole result record to the
        value's device), as much as a small model's optimizer step, for values only loggers
        read; the Trainer saves the loggers right after this hook."""
        metrics = {"compute/train_flops": self.spent,
                   "compute/growth_flops": self.ledger.flops["growth"],
                   "compute/budget_fraction": self.budget_fraction}
        if self.schedule.kind != "constant":
            metrics["compute/lr_multiplier"] = self.ledger.multiplier
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.ledger.exhausted and not self._told_short:  # stopped first, unannounced
            rank_zero_warn(f"ComputeBudget: the fit ended at step {trainer.global_step}, "
                           f"{self.budget_fraction:.0%} of its budget ({self.budget_flops:g} "
                           "FLOPs): what the budget planned after that point (a decay, a "
                           "growth) did not happen")

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING or not self.loss_key:
            return
        loss = trainer.callback_metrics.get(self.loss_key)
        if loss is None:
            if not self._warned:
                self._warned = True
                rank_zero_warn(f"ComputeBudget: loss_key={self.loss_key!r} is never logged, so "
                               f"no loss-vs-FLOPs chart is written; logged keys: "
                               f"{sorted(trainer.callback_metrics)}")
            return
        tag = f"compute/{self.loss_key}_vs_flops"
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):  # a step axis per tag: FLOPs on this one
                logger.log_metrics({tag: float(loss)}, step=int(self.spent // FLOPS_PER_STEP))
            else:  # one step axis for every metric (CSV, W&B, MLflow): the FLOPs beside it
                logger.log_metrics({tag: float(loss), "compute/train_flops": self.spent},
                                   step=step)

    def _cost(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
              param_groups: list[dict[str, Any]] | None = None) -> StepCost:
        """This step's cost over every rank (`begin_step`: the rate set in ``param_groups``
        at the middle of the batch's share of the budget)."""
        metering = self._metering
        read = metering.batch_to_xy if metering is not None else (self.batch_to_xy or _inputs)
        logits_fn = metering.logits_fn if metering is not None else self.logits_fn
        remedy = ("pass logits_fn= with a forward that runs on any device" if metering is None
                  else "pass logits_fn= to MorphogenesisCallback if its forward needs more than "
                  "the batch's inputs")
        return step_cost(self.ledger, trainer, pl_module, read(batch)[0], logits_fn,
                         "ComputeBudget", remedy, param_groups or ())

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"ledger": self.ledger.state_dict(), "budget_flops": self.budget_flops}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the FLOPs spent; a checkpoint written under another budget is refused (its
        learning-rate schedule would jump to another point of the decay mid-run).

        Raises:
            MisconfigurationException: If the checkpoint's budget is not this callback's.
        """
        saved = state_dict.get("budget_flops", self.budget_flops)
        if float(saved) != self.budget_flops:
            raise MisconfigurationException(
                f"ComputeBudget: the checkpoint was written under budget_flops={saved:g}, this "
                f"fit has {self.budget_flops:g}; resume with the same budget")
        self._resumed = True
        if "ledger" in state_dict:
            self.ledger.load_state_dict(state_dict["ledger"])
        else:  # written before the ledger: the FLOPs spent
            self.ledger.restore_train_flops(float(state_dict["spent"]))


def fit_budget(trainer: L.Trainer) -> ComputeBudget | None:
    """The fit's `ComputeBudget`, if it has one. The one rule for who holds a fit's
    `core.compute.ComputeLedger`: the budget, when there is one (it charges every step, saves
    and resumes the ledger; a `MorphogenesisCallback` reads the same ledger and charges its
    validation FLOPs to it), else the `MorphogenesisCallback`, with a ledger of its own. (A
    Trainer refuses a second `ComputeBudget` itself: its state key would not be unique.)
    """
    return next((c for c in trainer.callbacks if isinstance(c, ComputeBudget)), None)


def _logs_this_step(trainer: L.Trainer) -> bool:
    """Whether the Trainer writes this training step's metrics to its loggers: Lightning's own
    rule (every ``log_every_n_steps``, the step that stops the fit, every step of a
    ``fast_dev_run``), asked of its logger connector so the two cannot drift apart."""
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


def _inputs(batch: Any) -> tuple[Tensor, Any]:
    """``(x, rest)`` of an ``(x, y)`` batch (or of a batch that is the inputs alone)."""
    if isinstance(batch, Tensor):
        return batch, None
    if isinstance(batch, list | tuple) and batch and isinstance(batch[0], Tensor):
        return batch[0], batch[1:]
    raise TypeError(f"cannot read the inputs of a training batch of type "
                    f"{type(batch).__name__}; pass batch_to_xy= to ComputeBudget")


__all__ = ["FLOPS_PER_STEP", "ComputeBudget", "fit_budget"]
