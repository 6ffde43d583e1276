"""`MorphogenesisCallback`: grow seeds in any LightningModule while a Trainer fits it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from typing_extensions import override

from esper_lightning.blueprints import TOPOLOGIES
from esper_lightning.controllers.base import Controller
from esper_lightning.core.counterfactual import CounterfactualAccumulator, make_plan
from esper_lightning.core.engine import MorphogenesisEngine, StepOutcome
from esper_lightning.core.lifecycle import PRESENT_STAGES, GateConfig, GateMode, QualityGates
from esper_lightning.core.optim import SeedOptimConfig
from esper_lightning.core.telemetry import morpho_metrics

log = logging.getLogger(__name__)

BatchToXY = Callable[[Any], tuple[Tensor, Tensor]]
#: Strategies that keep one copy of the model on one device.
_SINGLE_DEVICE_STRATEGIES = ("SingleDeviceStrategy",)


class MorphogenesisCallback(Callback):
    r"""Let a controller germinate, blend, fossilize and prune seeds once per epoch.

    After each validation epoch (never during the sanity check) the callback measures every
    blending seed's counterfactual contribution with one fused forward per validation batch,
    builds an `EpochReport`, asks the controller for an action, executes it (illegal actions
    become WAIT with a reason) and ticks every slot. Seeds join the optimizer as param groups
    named ``seed/<slot>``; LR schedulers are extended to schedule them too.

    Args:
        controller: decides the action each epoch (e.g. `HeuristicController`).
        slots: `SeedSlot` ids in the model and/or module paths after which a slot is injected
            (``"net.3"``); None uses every `SeedSlot` in the model.
        blueprints: blueprint names the controller may germinate (default: all of the topology).
        max_seeds: maximum seeds present at once (None = unlimited).
        seed_lr, seed_momentum, seed_weight_decay: seed param-group settings (None: copied from
            the host's first param group).
        topology: ``"cnn"`` or ``"transformer"`` for injected slots.
        gate_mode, gate_config: quality-gate mode and thresholds for every slot (None: each
            slot keeps its own; injected slots are permissive with the default thresholds).
        batch_to_xy: maps a validation batch to ``(inputs, class targets)`` for the
            counterfactual; the default accepts ``(x, y)`` pairs.
        accuracy_key: a logged validation accuracy in [0, 1] used when no seed needs measuring
            (saves the extra forward); missing -> measured by the callback.
        loss_key, train_loss_key: logged metrics copied into the controller's report.
        grad_stats_every: measure seed gradient health every this many optimizer steps.

    Example:
        >>> from esper_lightning.controllers import HeuristicController
        >>> trainer = L.Trainer(
        ...     max_epochs=30,
        ...     callbacks=[MorphogenesisCallback(HeuristicController(), slots=["net.3"])],
        ... )
        >>> trainer.fit(my_module, datamodule=dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        controller: Controller,
        slots: Sequence[str] | None = None,
        blueprints: Sequence[str] | None = None,
        max_seeds: int | None = None,
        seed_lr: float | None = None,
        seed_momentum: float | None = None,
        seed_weight_decay: float | None = None,
        topology: str = "cnn",
        gate_mode: GateMode | str | None = None,
        gate_config: GateConfig | None = None,
        batch_to_xy: BatchToXY | None = None,
        accuracy_key: str | None = "val_acc",
        loss_key: str = "val_loss",
        train_loss_key: str = "train_loss",
        grad_stats_every: int = 25,
    ) -> None:
        if not isinstance(controller, Controller):
            raise TypeError(
                f"controller must implement decide/reset/state_dict/load_state_dict, got "
                f"{type(controller).__name__}"
            )
        if grad_stats_every < 1:
            raise ValueError(f"grad_stats_every must be >= 1, got {grad_stats_every}")
        if topology not in TOPOLOGIES:
            raise ValueError(f"unknown topology {topology!r}; accepted: {', '.join(TOPOLOGIES)}")
        if gate_mode is not None:
            gate_mode = QualityGates(gate_mode).mode  # one-line error naming accepted modes
        self.controller = controller
        self._engine_kwargs: dict[str, Any] = {
            "slots": None if slots is None else list(slots),
            "blueprints": None if blueprints is None else list(blueprints),
            "max_seeds": max_seeds,
            "topology": topology,
            "gate_mode": gate_mode,
            "gate_config": gate_config,
            "seed_optim": SeedOptimConfig(seed_lr, seed_momentum, seed_weight_decay),
        }
        self.batch_to_xy = batch_to_xy or _pair
        self.accuracy_key = accuracy_key
        self.loss_key, self.train_loss_key = loss_key, train_loss_key
        self.grad_stats_every = grad_stats_every
        self.engine: MorphogenesisEngine | None = None
        self.last_outcome: StepOutcome | None = None
        self._accumulator: CounterfactualAccumulator | None = None
        self._decided_epoch = -1
        self._validated_epoch = -1
        self._stats_epoch = -1
        self._pending_state: dict[str, Any] | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(slots=self._engine_kwargs["slots"])

    # --- setup --------------------------------------------------------------------------------
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        strategy = type(trainer.strategy).__name__
        if strategy not in _SINGLE_DEVICE_STRATEGIES or trainer.world_size > 1:
            raise MisconfigurationException(
                f"MorphogenesisCallback supports single-device training only (strategy='auto' "
                f"with devices=1); got {strategy} with world size {trainer.world_size}"
            )
        if self.engine is None or self.engine.model is not pl_module:
            # Slots are injected here, before Lightning loads a checkpoint's weights, so grown
            # seeds are rebuilt from each slot's saved manifest during strict loading.
            self.engine = MorphogenesisEngine(pl_module, **self._engine_kwargs)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        engine = self._require_engine()
        if len(trainer.optimizers) != 1:
            raise MisconfigurationException(
                f"MorphogenesisCallback needs exactly one optimizer (automatic optimization); "
                f"got {len(trainer.optimizers)}"
            )
        if self._pending_state is not None:
            engine.load_state_dict(self._pending_state["engine"])
            self._pending_state = None
        else:  # a fresh fit: forget any earlier run (a recurrent policy's state, trackers)
            self.controller.reset()
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        # Runs before Lightning restores the optimizer state, so saved seed groups line up.
        engine.attach_optimizer(trainer.optimizers[0], schedulers)

    # --- training -----------------------------------------------------------------------------
    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        engine = self._require_engine()
        present = sum(s.stage in PRESENT_STAGES for s in engine.slots.values())
        pl_module.log("seeds", float(present), prog_bar=True, logger=False, on_epoch=True)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Gradients are already unscaled here under AMP. Measure at least once per epoch so the
        # gates always have fresh gradient health.
        first_of_epoch = self._stats_epoch != trainer.current_epoch
        if first_of_epoch or trainer.global_step % self.grad_stats_every == 0:
            self._stats_epoch = trainer.current_epoch
            self._require_engine().capture_gradient_stats()

    # --- validation: counterfactual measurement -----------------------------------------------
    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._accumulator = None
        if trainer.sanity_checking:
            return
        engine = self._require_engine()
        plan = make_plan(engine.slots)
        logged = self.accuracy_key is not None and self.accuracy_key in trainer.callback_metrics
        if plan.slot_ids or not logged:  # otherwise the logged accuracy is enough
            self._accumulator = CounterfactualAccumulator(plan)

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._accumulator is None or dataloader_idx != 0:
            return
        x, y = self.batch_to_xy(batch)
        with trainer.precision_plugin.forward_context():  # same autocast as validation_step
            self._accumulator.update(pl_module, x, y, self._require_engine().slots)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Before ModelCheckpoint (always ordered last) saves, so a checkpoint holds the decision.
        if not trainer.sanity_checking and trainer.state.fn == TrainerFn.FITTING:
            self._validated_epoch = trainer.current_epoch
            self._decide(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._decide(trainer)  # epochs without validation still decide (no counterfactual)

    # --- the decision -------------------------------------------------------------------------
    def _decide(self, trainer: L.Trainer) -> None:
        if self._decided_epoch == trainer.current_epoch:
            return
        self._decided_epoch = trainer.current_epoch
        engine = self._require_engine()
        validated = self._validated_epoch == trainer.current_epoch
        accuracy, contributions = self._measurements(trainer) if validated else (None, {})
        metrics = trainer.callback_metrics
        engine.record_epoch(  # without validation this epoch, no stale validation numbers
            accuracy,
            _scalar(metrics.get(self.loss_key)) if validated else None,
            _scalar(metrics.get(self.train_loss_key)),
            contributions,
        )
        report = engine.report(max_epochs=trainer.max_epochs)
        action = self.controller.decide(report)
        reason = getattr(self.controller, "last_reason", None)
        self.last_outcome = outcome = engine.execute(action, reason)
        engine.tick()
        if action.op != 0:
            verdict = "done" if outcome.success else f"refused ({outcome.reason})"
            log.info("epoch %d: %s %s", trainer.current_epoch,
                     action.describe(engine.slot_ids), verdict)
        self._log(trainer, contributions)

    def _measurements(self, trainer: L.Trainer) -> tuple[float | None, dict[str, float]]:
        acc = self._accumulator
        self._accumulator = None
        if acc is not None and acc.total > 0:
            accuracies = acc.accuracies()
            return accuracies["main"], acc.contributions(accuracies)
        logged = None if self.accuracy_key is None else trainer.callback_metrics.get(
            self.accuracy_key
        )
        return (None if logged is None else 100.0 * float(logged)), {}

    def _log(self, trainer: L.Trainer, contributions: dict[str, float]) -> None:
        engine = self._require_engine()
        metrics = morpho_metrics(engine.seed_params, engine.event_counts(), engine.slots,
                                 contributions)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # --- state --------------------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        engine = self._require_engine()
        return {
            "engine": engine.state_dict(),
            "controller": self.controller.state_dict(),
            "decided_epoch": self._decided_epoch,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.controller.load_state_dict(state_dict["controller"])
        self._decided_epoch = int(state_dict["decided_epoch"])
        # The engine adopts its state in on_fit_start, next to the optimizer it re-groups.
        self._pending_state = {"engine": state_dict["engine"]}

    def _require_engine(self) -> MorphogenesisEngine:
        if self.engine is None:
            raise RuntimeError("MorphogenesisCallback used before setup(); add it to a Trainer")
        return self.engine


def _pair(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, list | tuple) and len(batch) == 2:
        x, y = batch
        if isinstance(x, Tensor) and isinstance(y, Tensor):
            return x, y
    raise TypeError(
        f"cannot read a validation batch of type {type(batch).__name__} as (inputs, targets); "
        "pass batch_to_xy= to MorphogenesisCallback"
    )


def _scalar(value: Any) -> float | None:
    return None if value is None else float(value)
