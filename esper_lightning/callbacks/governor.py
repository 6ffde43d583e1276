"""`GovernorCallback`: roll a diverging run back in place and keep training."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

import esper_lightning.callbacks._distributed as dist
from esper_lightning.callbacks.morphogenesis import MorphogenesisCallback
from esper_lightning.callbacks.width_growth import WidthGrowthCallback
from esper_lightning.core.divergence import Governor, GovernorConfig, check_num_classes
from esper_lightning.core.rollback import roll_back
from esper_lightning.core.snapshot import Snapshot, take_snapshot
from esper_lightning.core.telemetry import ROLLBACKS_TAG

log = logging.getLogger(__name__)


class GovernorCallback(Callback):
    r"""Watch every training loss and the validation loss; on NaN/Inf, lobotomy or divergence,
    roll the model back to the last snapshot in place.

    A rollback (`core.rollback.roll_back`, the same routine as an env's) prunes every live seed
    (through the `MorphogenesisCallback`'s engine when there is one), restores the host and
    fossilized seeds, the optimizer state and the grad scaler from an in-memory CPU snapshot
    (same Parameter objects, so the optimizer stays valid), drops the gradients, logs
    ``governor/rollbacks`` and lets training continue. Snapshots are taken every
    ``config.snapshot_every`` healthy epochs and before the first optimizer step after the
    model's structure changed (a seed fossilized, when healthy; a `WidthGrowthCallback`
    widened, always): the snapshot before it could not restore the new fossil's weights or the
    widened tensors. The losses of an
    optimizer step that a non-finite seed spoiled and the engine dropped
    (`MorphogenesisEngine.prune_nonfinite`: the seed is pruned, the host did not move) are not
    the host's, so they roll nothing back.

    It must come before `MorphogenesisCallback` in ``callbacks=[...]``, so a diverged epoch is
    rolled back before the controller decides, and before `WidthGrowthCallback`, so a
    divergence is rolled back before the model widens past its snapshot (losses not yet read
    are read at the batch it widens at); the other order is refused at setup.

    Under DDP every check reads values reduced over the ranks (a non-finite loss on any rank, the
    mean validation loss), so every rank rolls back at the same step to the same snapshot.

    Args:
        config: thresholds of the rules (`GovernorConfig` defaults when None).
        monitor: the logged validation loss to watch.
        num_classes: enables the lobotomy rule (loss stuck near ln(num_classes)): the number of
            classes (or the vocabulary size), >= 2; None leaves the rule off.
        check_every_n_steps: read the non-finite-loss flag back from the device every this many
            training steps (and at each epoch end). 1 reacts at once; on a GPU a larger value
            avoids a host sync per step (the rollback restores the weights either way).

    Example:
        >>> trainer = L.Trainer(callbacks=[GovernorCallback(num_classes=10),
        ...                                MorphogenesisCallback(HeuristicController())])
        ... # doctest: +SKIP
    """

    def __init__(
        self,
        config: GovernorConfig | None = None,
        monitor: str = "val_loss",
        num_classes: int | None = None,
        check_every_n_steps: int = 1,
    ) -> None:
        every = check_every_n_steps
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"check_every_n_steps must be an int >= 1, got {every!r}")
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor must name the logged validation loss, got {monitor!r}")
        check_num_classes(num_classes)
        self.governor = Governor(config)
        self.check_every_n_steps = check_every_n_steps
        self._nonfinite: torch.Tensor | None = None
        #: Non-finite losses of the batches since the last optimizer step: they join
        #: ``_nonfinite`` once that step was taken, not when a non-finite seed spoiled it.
        self._window: torch.Tensor | None = None
        self._window_step = 0  # trainer.global_step when the window opened
        self._window_dropped = 0  # the engine's dropped_steps when the window opened
        self.monitor = monitor
        self.num_classes = num_classes
        self.snapshot: Snapshot | None = None
        self._growth: MorphogenesisCallback | None = None
        self._widths: list[WidthGrowthCallback] = []
        self._structure_seen: tuple[Any, ...] = ()
        self._warned_monitor = False
        self._resumed = False

    @property
    def rollbacks(self) -> int:
        return self.governor.rollbacks

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        callbacks = trainer.callbacks
        growth = next((i for i, c in enumerate(callbacks) if isinstance(c, MorphogenesisCallback)),
                      None)
        mine = callbacks.index(self)
        width = next((i for i, c in enumerate(callbacks) if isinstance(c, WidthGrowthCallback)),
                     None)
        if width is not None and width < mine:
            raise MisconfigurationException(
                f"GovernorCallback must come before WidthGrowthCallback in the Trainer's "
                f"callbacks (found at positions {mine} and {width}), so a divergence is rolled "
                f"back before the model widens past its snapshot: list the governor first")
        if growth is not None and growth < mine:
            raise MisconfigurationException(
                f"GovernorCallback must come before MorphogenesisCallback in the Trainer's "
                f"callbacks (found at positions {mine} and {growth}), so a diverged epoch is "
                f"rolled back before the controller decides: list the governor first"
            )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fresh fit forgets the last fit's loss readings (another model may be training now);
        # a resumed one keeps those its checkpoint restored (load_state_dict runs before).
        if not self._resumed:
            self.governor.reset()
        self._resumed = False
        self._warned_monitor = False
        self._nonfinite = self._window = None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning restored the optimizer, scaler and callbacks of a resumed run.
        growth = [c for c in trainer.callbacks if isinstance(c, MorphogenesisCallback)]
        self._growth = growth[0] if growth else None  # the lifecycle's owner prunes for us
        self._widths = [c for c in trainer.callbacks if isinstance(c, WidthGrowthCallback)]
        self._structure_seen = self._structure()
        self._window_step, self._window_dropped = trainer.global_step, self._dropped_steps()
        self._snapshot(trainer, pl_module)

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        # At the batch a WidthGrowthCallback (listed after this one) widens at, losses not yet
        # read (check_every_n_steps > 1) are read first: a rollback they call for must come
        # while the snapshot still fits the model. One read, at that batch only.
        if self._nonfinite is not None and any(w.widens_at(trainer, batch_idx) is not None
                                               for w in self._widths):
            self._check_train_losses(trainer, pl_module)

    @override
    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        bad = ~torch.isfinite(loss.detach())  # stays on the device
        self._window = bad if self._window is None else self._window | bad
        if trainer.global_step != self._window_step:  # this batch ended an optimizer step
            self._close_window(trainer.global_step)
        if (batch_idx + 1) % self.check_every_n_steps == 0:
            self._check_train_losses(trainer, pl_module)

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        # After every callback's batch-start hook (a widening) and decision (a fossilization),
        # before the step that first trains the new structure: snapshot it, so a rollback
        # restores the new fossil's weights and the widened tensors (the old snapshot has
        # neither). Losses of earlier steps not yet read are read first (with
        # check_every_n_steps > 1; a rollback they call for comes first). A widened model never
        # fits the old snapshot, so it is taken even while anomalies are being counted; a new
        # fossil, only when healthy (the old snapshot restores around it, `restore_snapshot`).
        structure = self._structure()
        if structure == self._structure_seen:
            return
        widened = structure[1:] != self._structure_seen[1:]
        self._structure_seen = structure
        self._check_train_losses(trainer, pl_module)
        if widened or self.governor.consecutive_anomalies == 0:
            self._snapshot(trainer, pl_module)

    def _close_window(self, step: int) -> None:
        """Count the losses since the last optimizer step as the host's, unless the engine
        dropped that step for a non-finite seed (every rank alike: its decision is reduced)."""
        dropped = self._dropped_steps()
        window, self._window = self._window, None
        if dropped == self._window_dropped and window is not None:
            self._nonfinite = window if self._nonfinite is None else self._nonfinite | window
        self._window_step, self._window_dropped = step, dropped

    def _dropped_steps(self) -> int:
        engine = None if self._growth is None else self._growth.engine
        return 0 if engine is None else engine.dropped_steps

    def _check_train_losses(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        flag, self._nonfinite = self._nonfinite, None
        if dist.any_rank(trainer, flag):  # under DDP a NaN on one rank rolls every rank back
            reason = self.governor.check_train_loss(float("nan"))
            if reason is not None:
                self._rollback(trainer, pl_module, reason)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        # The mean over the ranks: every rank takes the same decision, synced logging or not.
        value = dist.mean_over_ranks(trainer, trainer.callback_metrics.get(self.monitor))
        if value is None:
            if not self._warned_monitor:
                self._warned_monitor = True
                rank_zero_warn(
                    f"GovernorCallback: monitor {self.monitor!r} is not logged, so the lobotomy "
                    f"and divergence rules are off; logged: {sorted(trainer.callback_metrics)} "
                    f"(name your validation loss with GovernorCallback(monitor=...))"
                )
            return
        reason = self.governor.check_validation(value, num_classes=self.num_classes)
        if reason is not None:
            self._rollback(trainer, pl_module, reason)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window(trainer.global_step)  # the epoch's last step has been taken
        self._check_train_losses(trainer, pl_module)
        # Never snapshot while anomalies are being counted: that state may be diverging.
        healthy = self.governor.consecutive_anomalies == 0
        if healthy and self.governor.should_snapshot(trainer.current_epoch + 1):
            self._snapshot(trainer, pl_module)
        metrics = {ROLLBACKS_TAG: float(self.governor.rollbacks)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # --- rollback -----------------------------------------------------------------------------
    def _rollback(self, trainer: L.Trainer, pl_module: L.LightningModule, reason: str) -> None:
        prune = None if self._growth is None else self._growth.prune_live
        pruned = roll_back(self.snapshot, pl_module, self.governor, reason, prune=prune,
                           optimizer=self._optimizer(trainer), scaler=_scaler(trainer))
        log.warning(
            "governor: %s at epoch %d (loss %s); rolled back, pruned %s",
            reason, trainer.current_epoch, self.governor.last_panic_loss, pruned or "no seeds",
        )

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.snapshot = take_snapshot(pl_module, self._optimizer(trainer), _scaler(trainer))

    @staticmethod
    def _optimizer(trainer: L.Trainer) -> torch.optim.Optimizer | None:
        return trainer.optimizers[0] if trainer.optimizers else None

    def _structure(self) -> tuple[Any, ...]:
        """What changes when the model's structure does: the fossils, each widening."""
        fossils = 0 if self._growth is None else self._growth.fossils
        return (fossils, *(w.widened_step for w in self._widths))

    # --- state --------------------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        # Snapshots stay in memory: after a resume the first snapshot is the restored state.
        return {"governor": self.governor.state_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.governor.load_state_dict(state_dict["governor"])
        self._resumed = True


def _scaler(trainer: L.Trainer) -> Any:
    return getattr(trainer.precision_plugin, "scaler", None)

