"""`ComputeBudget` and the FLOPs `MorphogenesisCallback` meters, in a real lightning.Trainer on a
tiny CIFAR-format fixture (80 training images: 5 batches of 16 per epoch)."""

import math
import re
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers import UserModule, one_line_message
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.flop_counter import FlopCounterMode

from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback, WidthGrowthCallback
from esper_lightning.callbacks.compute_budget import FLOPS_PER_STEP
from esper_lightning.controllers import ControllerBase, ScriptedController, StaticController
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.flops import FlopMeter, live_slots
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.width import WidthGrowth
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.schedule import LRSchedule, batch_fraction


class MemoryLogger(Logger):
    """Keeps every logged metric: ``metrics[name]`` is the list of its values, ``steps[name]``
    the steps they were logged at."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, list[float]] = {}
        self.steps: dict[str, list[int | None]] = {}

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append(float(value))
            self.steps.setdefault(key, []).append(step)


class LearningRates(Callback):
    """The host group's learning rate at every optimizer step."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])


class Budgeted(ControllerBase):
    """Waits, and keeps the budget fraction of every report it sees."""

    def __init__(self) -> None:
        self.fractions: list[float | None] = []

    def decide(self, report):
        self.fractions.append(report.budget_fraction)
        return Action()


def step_flops() -> int:
    return FlopMeter().training_step(UserModule(), torch.zeros(16, 3, 32, 32))


def fit(tmp_path: Path, cifar_dir: Path, callbacks: list, epochs: int = 10,
        module: L.LightningModule | None = None, ckpt_path: str | None = None,
        **options: Any) -> L.LightningModule:
    torch.manual_seed(0)
    module = module or UserModule()
    values = {"max_epochs": epochs, "default_root_dir": tmp_path, "logger": False,
              "enable_checkpointing": False, "enable_progress_bar": False,
              "enable_model_summary": False, "deterministic": True, **options}
    L.Trainer(callbacks=callbacks, **values).fit(
        module, datamodule=CIFAR10DataModule(cifar_dir, batch_size=16, rng_seed=3),
        ckpt_path=ckpt_path)
    return module


def test_the_fit_stops_at_the_budget(cifar_dir, tmp_path):
    step = step_flops()
    budget = ComputeBudget(7.5 * step)
    fit(tmp_path, cifar_dir, [budget])
    assert budget.spent == 8 * step  # the eighth step crossed 7.5 and was the last
    assert budget.spent - step < budget.budget_flops <= budget.spent


def test_wsd_decays_every_step_to_its_floor_at_the_budget(cifar_dir, tmp_path):
    step = step_flops()
    schedule = LRSchedule("wsd", warmup_fraction=0.1, decay_fraction=0.5, min_lr_ratio=0.0)
    rates = LearningRates()
    fit(tmp_path, cifar_dir, [ComputeBudget(20 * step, "wsd", 0.1, 0.5), rates])
    base = 0.05  # UserModule's SGD
    expected = [base * schedule.multiplier(batch_fraction(k * step, step, 20 * step))
                for k in range(20)]
    assert rates.lrs == pytest.approx(expected)
    # The last step: the middle of its 1/20 lies 0.025 before the end of a decay of 0.5.
    assert rates.lrs[-1] == pytest.approx(base * 0.025 / 0.5)


def test_a_schedule_refuses_the_modules_own_lr_scheduler(cifar_dir, tmp_path):
    with pytest.raises(MisconfigurationException, match="also returns an LR scheduler"):
        fit(tmp_path, cifar_dir, [ComputeBudget(1e12, "cosine")], module=UserModule(step_lr=True))


def test_the_growth_callback_meters_reports_and_logs_the_budget(cifar_dir, tmp_path):
    step = step_flops()
    controller = Budgeted()
    growth = MorphogenesisCallback(controller, slots=["net.3"])
    budget = ComputeBudget(12 * step)
    logger = MemoryLogger()
    fit(tmp_path, cifar_dir, [budget, growth], logger=logger, log_every_n_steps=1)
    engine = growth.engine
    # One owner of compute: the budget's ledger, which the growth callback only reads.
    assert growth.ledger is budget.ledger is engine.compute
    assert "compute" not in growth.state_dict() and "ledger" in budget.state_dict()
    assert engine.train_flops == budget.spent == 12 * step
    assert engine.budget_flops == 12 * step and engine.validation_flops > 0
    assert controller.fractions == pytest.approx([5 / 12, 10 / 12, 1.0])  # at each epoch's end
    assert logger.metrics["morpho/train_flops"] == [5 * step, 10 * step, 12 * step]
    assert logger.metrics["morpho/budget_fraction"] == pytest.approx([5 / 12, 10 / 12, 1.0])
    assert logger.metrics["compute/budget_fraction"][-1] == pytest.approx(1.0)


def test_the_validation_loss_is_charted_against_the_gflops_spent(cifar_dir, tmp_path):
    step = step_flops()
    budget = ComputeBudget(12 * step)
    logger = MemoryLogger()
    fit(tmp_path, cifar_dir, [budget], logger=logger)
    # One point per validation (5, 10, 12 steps spent), the loss Lightning logged; a logger
    # with one step axis gets it at the fit's step, beside the FLOPs spent.
    assert logger.metrics["compute/val_loss_vs_flops"] == logger.metrics["val_loss"]
    assert len(logger.metrics["val_loss"]) == 3
    assert logger.steps["compute/val_loss_vs_flops"] == [4, 9, 11]  # the steps Lightning uses
    flops = dict(zip(logger.steps["compute/train_flops"], logger.metrics["compute/train_flops"],
                     strict=True))
    assert [flops[s] for s in (4, 9, 11)] == [k * step for k in (5, 10, 12)]
    # TensorBoard, read back from its files: this tag's step is the FLOPs spent (GFLOP).
    board = TensorBoardLogger(tmp_path / "tb", name="run")
    fit(tmp_path / "t", cifar_dir, [ComputeBudget(12 * step)], logger=board)
    events = EventAccumulator(board.log_dir)
    events.Reload()
    chart = events.Scalars("compute/val_loss_vs_flops")
    assert [e.step for e in chart] == [int(k * step // FLOPS_PER_STEP) for k in (5, 10, 12)]
    assert [e.value for e in chart] == pytest.approx(
        [e.value for e in events.Scalars("val_loss")])
    quiet = MemoryLogger()
    fit(tmp_path / "b", cifar_dir, [ComputeBudget(6 * step, loss_key=None)], logger=quiet)
    assert "val_loss" in quiet.metrics
    assert not any(key.startswith("compute/val_loss") for key in quiet.metrics)


def test_a_loss_key_never_logged_warns_once(cifar_dir, tmp_path):
    logger = MemoryLogger()
    with pytest.warns(UserWarning, match=r"loss_key='val/loss' is never logged, so no "
                      r"loss-vs-FLOPs chart is written; logged keys: \[.*'val_loss'\]$"
                      ) as record:
        fit(tmp_path, cifar_dir, [ComputeBudget(12 * step_flops(), loss_key="val/loss")],
            logger=logger)
    assert sum("never logged" in str(w.message) for w in record) == 1
    assert not any(key.startswith("compute/val") for key in logger.metrics)


def test_a_run_that_ends_before_its_budget_is_told_at_its_first_step(cifar_dir, tmp_path):
    step = step_flops()
    steps, short = Steps(), ComputeBudget(20 * step)
    with pytest.warns(UserWarning) as record:
        fit(tmp_path, cifar_dir, [short, steps], max_steps=12)
    assert short.told_short  # what a growth callback reads before it says the same again
    (message,) = [str(w.message) for w in record if "ComputeBudget" in str(w.message)]
    assert message == (
        f"ComputeBudget({20 * step:g} FLOPs): max_steps=12 ends the fit after 12 steps, which "
        f"spend at most {12 * step:.3g} FLOPs (60% of the budget): what the budget plans after "
        "that (a decay, a growth) will not happen in this fit (resume it from its checkpoint, or "
        "raise that limit; -1 for max_steps and max_epochs: the budget ends the fit)")  # once
    assert steps.count == 12
    with pytest.warns(UserWarning, match=r"max_epochs=3 ends the fit after 15 steps"):
        fit(tmp_path, cifar_dir, [ComputeBudget(20 * step)], epochs=3)
    # Exactly enough steps, and enough optimizer steps of two batches each (five batches an
    # epoch: steps of 2, 2 and 1): the budget ends them, no word.
    for batches, steps, accumulate in ((20, 20, 1), (15, 10, 2)):
        budget = ComputeBudget(batches * step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(tmp_path, cifar_dir, [budget], max_steps=steps, epochs=-1,
                accumulate_grad_batches=accumulate)
        assert budget.ledger.exhausted, accumulate
        assert not [w for w in caught if "ComputeBudget" in str(w.message)], accumulate
        assert not budget.told_short, accumulate


def test_a_growth_that_makes_steps_dearer_counts_at_its_bound(cifar_dir, tmp_path):
    """A static host's bound is 1: told at the first step as a plain model is. A
    seed-growing controller's steps have no bound known: told at the end instead."""
    step = step_flops()
    static = MorphogenesisCallback(StaticController(), slots=["net.3"])
    assert static.step_cost_bound() == 1.0
    with pytest.warns(UserWarning, match=r"max_steps=12 ends the fit after 12 steps"):
        fit(tmp_path, cifar_dir, [ComputeBudget(20 * step), static], max_steps=12)
    widening = WidthGrowthCallback(at=0.5, growth=WidthGrowth(factor=2, mlp=3))
    assert widening.step_cost_bound() == 2 * 3  # the blocks' matrices, in and out
    growing = MorphogenesisCallback(Budgeted(), slots=["net.3"])
    assert growing.step_cost_bound() == math.inf
    budget = ComputeBudget(20 * step)
    with pytest.warns(UserWarning, match=r"^ComputeBudget: the fit ended at step 12, 60% of its "
                      rf"budget \({re.escape(f'{20 * step:g}')} FLOPs\): what the budget planned "
                      r"after that point \(a decay, a growth\) did not happen$"):
        fit(tmp_path, cifar_dir, [budget, growing], max_steps=12)


class Steps(Callback):
    """Counts the training steps taken."""

    def __init__(self) -> None:
        self.count = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.count += 1


def test_a_resumed_fit_goes_on_from_the_flops_it_had_spent(cifar_dir, tmp_path):
    step = step_flops()
    checkpoints = tmp_path / "ckpt"
    first = ComputeBudget(12 * step)
    growth = MorphogenesisCallback(Budgeted(), slots=["net.3"])
    saver = ModelCheckpoint(dirpath=checkpoints, save_last=True)
    fit(tmp_path, cifar_dir, [first, growth, saver], epochs=1, enable_checkpointing=True)
    assert first.spent == 5 * step
    saved = dict(first.ledger.flops)
    assert saved["validation"] > 0  # the growth callback charged the budget's ledger
    resumed = ComputeBudget(12 * step)
    again = MorphogenesisCallback(Budgeted(), slots=["net.3"])
    fit(tmp_path, cifar_dir, [resumed, again], enable_checkpointing=True,
        ckpt_path=str(checkpoints / "last.ckpt"))
    assert resumed.spent == again.engine.train_flops == 12 * step  # neither lost nor doubled
    # Every kind goes on from the checkpoint: two more validations of the same cost.
    assert resumed.ledger.flops["validation"] == pytest.approx(3 * saved["validation"])



class CountedSteps(Callback):
    """Every real training step's FLOPs, counted by `FlopCounterMode` around it (after the
    callbacks before this one metered it on meta tensors), and whether a live seed ran in it:
    a count taken apart from the ledger's meter."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, bool]] = []
        self._counter: FlopCounterMode | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._counter = FlopCounterMode(display=False)
        self._counter.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        assert self._counter is not None
        self._counter.__exit__(None, None, None)
        self.steps.append((int(self._counter.get_total_flops()), bool(live_slots(pl_module))))


def test_the_live_seeds_share_is_charged_logged_and_saved_as_growth(cifar_dir, tmp_path):
    script = ScriptedController({0: Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light"),
                                 1: Action(LifecycleOp.ADVANCE, 0),
                                 2: Action(LifecycleOp.ADVANCE, 0)})
    growth = MorphogenesisCallback(script, slots=["net.3"],
                                   gate_config=GateConfig(min_training_epochs=1))
    budget = ComputeBudget(1e12)
    counted, logger = CountedSteps(), MemoryLogger()
    fit(tmp_path, cifar_dir, [budget, growth, counted], epochs=4, logger=logger,
        log_every_n_steps=1)
    assert growth.engine.slots["net.3"].stage == SeedStage.BLENDING
    # Germinated after epoch 0 (it does not run yet), incubating in epoch 2, blending in 3.
    assert [live for _, live in counted.steps] == [False] * 10 + [True] * 10
    bare = step_flops()  # the host alone, its slot empty
    assert {flops for flops, live in counted.steps if not live} == {bare}
    flops = budget.ledger.flops
    # The budget spends every step whole, as it did before growth was told apart...
    assert budget.spent == sum(f for f, _ in counted.steps) == flops["train"] + flops["growth"]
    # ...of which the host's share is the bare host's step, and the seed's the rest.
    assert flops["train"] == 20 * bare
    assert flops["growth"] == sum(f - bare for f, live in counted.steps if live) > 0
    logged = logger.metrics["compute/growth_flops"]
    assert len(logged) == 20 and logged[:10] == [0.0] * 10 and logged[-1] == flops["growth"]
    assert logger.metrics["compute/train_flops"][-1] == budget.spent
    assert logger.metrics["morpho/growth_flops"][-1] == flops["growth"]  # per epoch
    assert budget.state_dict()["ledger"]["flops"] == flops


def test_a_checkpoint_written_before_growth_was_told_apart_resumes_its_flops():
    budget = ComputeBudget(1e9)
    old = {"flops": {"train": 4e8, "validation": 5e6, "counterfactual": 1e6},
           "budget_flops": 1e9, "budget_scale": 1.0}
    budget.load_state_dict({"ledger": old, "budget_flops": 1e9})
    assert budget.ledger.flops == {"train": 4e8, "growth": 0.0, "validation": 5e6,
                                   "counterfactual": 1e6}
    assert budget.spent == 4e8 and budget.budget_fraction == pytest.approx(0.4)


def fit_args(cifar_dir: Path, tmp_path: Path, **options: Any) -> dict[str, torch.Tensor]:
    """The weights after a fit that grows a seed: it incubates, then blends."""
    script = ScriptedController({0: Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light"),
                                 1: Action(LifecycleOp.ADVANCE, 0),
                                 2: Action(LifecycleOp.ADVANCE, 0)})
    growth = MorphogenesisCallback(script, slots=["net.3"],
                                   gate_config=GateConfig(min_training_epochs=1), **options)
    module = fit(tmp_path, cifar_dir, [growth], epochs=4)
    assert growth.engine.slots["net.3"].stage == SeedStage.BLENDING
    return {k: v.clone() for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}


def test_metering_leaves_a_fit_bitwise_unchanged(cifar_dir, tmp_path):
    metered = fit_args(cifar_dir, tmp_path / "a")
    bare = fit_args(cifar_dir, tmp_path / "b", meter_flops=False)
    assert metered.keys() == bare.keys()
    assert all(torch.equal(metered[k], bare[k]) for k in metered)


def test_bad_budgets_are_one_line():
    for bad in (0, -1.0, float("nan"), "1e9", True):
        with pytest.raises(ValueError, match=f"budget_flops must be a number > 0, got {bad!r}"):
            ComputeBudget(bad)
    with pytest.raises(ValueError, match="decay_fraction must be in"):
        ComputeBudget(1e9, "wsd", decay_fraction=2.0)
    for bad in ("", 3):
        with pytest.raises(ValueError, match=f"loss_key must name a logged validation loss, or "
                                             f"be None for no chart, got {bad!r}"):
            ComputeBudget(1e9, loss_key=bad)
    with pytest.raises(TypeError, match="batch_to_xy must be a function or None, got 'x'"):
        ComputeBudget(1e9, batch_to_xy="x")


def test_a_checkpoint_of_another_budget_is_refused_in_one_line():
    budget = ComputeBudget(1e9)
    budget.load_state_dict({"spent": 4e8, "budget_flops": 1e9})
    assert budget.spent == 4e8
    with pytest.raises(MisconfigurationException, match=r"^ComputeBudget: the checkpoint was "
                       r"written under budget_flops=2e\+09, this fit has 1e\+09; resume with "
                       r"the same budget$"):
        ComputeBudget(1e9).load_state_dict({"spent": 4e8, "budget_flops": 2e9})


class CountsLogs(UserModule):
    """UserModule counting its ``log`` calls by name."""

    def __init__(self) -> None:
        super().__init__()
        self.log_calls: dict[str, int] = {}

    def log(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.log_calls[name] = self.log_calls.get(name, 0) + 1
        super().log(name, *args, **kwargs)


@pytest.mark.parametrize("schedule", ["constant", "wsd"])
def test_the_budget_logs_at_the_trainers_cadence_and_at_the_last_step(cifar_dir, tmp_path,
                                                                      schedule):
    import csv

    from lightning.pytorch.loggers import CSVLogger

    step = step_flops()
    budget = ComputeBudget(7.5 * step, schedule, warmup_fraction=0.1 if schedule == "wsd" else 0)
    module = CountsLogs()
    logger = CSVLogger(tmp_path, name="csv", version=0)
    rates = LearningRates()
    fit(tmp_path, cifar_dir, [budget, rates], module=module, logger=logger, log_every_n_steps=3)
    # Steps 3 and 6 (Lightning writes them as steps 2 and 5) and the eighth, which ends the fit.
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("compute/budget_fraction")]
    assert [int(row["step"]) for row in rows] == [2, 5, 7]
    assert [float(row["compute/train_flops"]) for row in rows] == [3 * step, 6 * step, 8 * step]
    assert [float(row["compute/budget_fraction"]) for row in rows] == pytest.approx(
        [k / 7.5 for k in (3, 6, 8)])
    names = ["compute/train_flops", "compute/budget_fraction"]
    if schedule == "wsd":  # the multiplier the step trained at
        names.append("compute/lr_multiplier")
        assert [float(row["compute/lr_multiplier"]) for row in rows] == pytest.approx(
            [rates.lrs[k - 1] / 0.05 for k in (3, 6, 8)])
    else:
        assert "compute/lr_multiplier" not in rows[0]
    # Straight to the loggers on those steps alone: never through the module's `log`.
    assert not any(name.startswith("compute/") for name in module.log_calls)
    assert module.log_calls["train_loss"] == 8  # (the module's own, every step)


def test_a_budget_spent_in_an_earlier_fit_is_refused_where_a_resumed_one_goes_on(cifar_dir,
                                                                                 tmp_path):
    """A second fit with the same budget would start spent: one step at the schedule's floor,
    a growth at once. Refused in one line; resumed from the first fit's checkpoint it goes on."""
    step = step_flops()
    budget = ComputeBudget(2.5 * step)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(tmp_path, cifar_dir, [budget, saver], enable_checkpointing=True)
    assert budget.spent == 3 * step
    with pytest.raises(MisconfigurationException) as err:
        fit(tmp_path, cifar_dir, [budget])
    assert one_line_message(err) == (
        f"ComputeBudget({2.5 * step:g} FLOPs) already spent {3 * step:.4g} FLOPs in an earlier "
        "fit; give each fit its own ComputeBudget, or resume that fit from its checkpoint "
        "(trainer.fit(..., ckpt_path=...))")
    again = ComputeBudget(2.5 * step)
    fit(tmp_path, cifar_dir, [again], ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert again.spent == 3 * step  # resumed spent: the fit ends, nothing more trained


def test_a_budget_under_one_optimizer_step_is_refused_at_the_first_step(cifar_dir, tmp_path):
    step = step_flops()
    with pytest.raises(MisconfigurationException) as err:
        fit(tmp_path, cifar_dir, [ComputeBudget(step / 2)], accumulate_grad_batches=1)
    assert one_line_message(err) == (
        f"ComputeBudget({step / 2:g} FLOPs) is less than one optimizer step of this fit "
        f"({step:.4g} FLOPs); accepted: a budget of at least one step")
    fit(tmp_path, cifar_dir, [ComputeBudget(1.5 * step)], accumulate_grad_batches=1)
    with pytest.raises(MisconfigurationException, match=r"less than one optimizer step"):
        fit(tmp_path, cifar_dir, [ComputeBudget(1.5 * step)], accumulate_grad_batches=2)


def test_under_accumulation_the_budget_stops_and_logs_where_an_optimizer_step_ends(cifar_dir,
                                                                                  tmp_path):
    """Crossed inside a window, the fit ends with that window's step (no batch charged and
    never applied), and each logged step is written once, as Lightning writes its own."""
    step, logger = step_flops(), MemoryLogger()
    budget = ComputeBudget(3.5 * step)  # crossed at the 4th batch, inside the window 4-5
    trained = Steps()
    fit(tmp_path, cifar_dir, [budget, trained], accumulate_grad_batches=3, logger=logger,
        log_every_n_steps=1)
    assert trained.count == 5 and budget.spent == 5 * step
    assert logger.steps["compute/budget_fraction"] == logger.steps["train_loss"] == [0, 1]


class RawManual(UserModule):
    """Manual optimization on the bare optimizer: ``trainer.global_step`` never moves."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers(use_pl_optimizer=False)
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


def test_the_budget_ends_a_fit_whose_steps_do_not_move_the_global_step(cifar_dir, tmp_path):
    # Every batch of manual optimization is a step (no windows): stopped after the third.
    step, trained = step_flops(), Steps()
    fit(tmp_path, cifar_dir, [ComputeBudget(2.5 * step), trained], module=RawManual())
    assert trained.count == 3


def test_an_epoch_shorter_than_the_window_makes_a_shorter_step(cifar_dir, tmp_path):
    """Lightning steps at an epoch's last batch: with 2-batch epochs and a window of 4, a step
    is 2 batches, so a 2.5-batch budget is not less than one step."""
    step, trained = step_flops(), Steps()
    fit(tmp_path, cifar_dir, [ComputeBudget(2.5 * step), trained], limit_train_batches=2,
        accumulate_grad_batches=4)
    assert trained.count == 4  # crossed at batch 3 (the next epoch's first), its step ends at 4
