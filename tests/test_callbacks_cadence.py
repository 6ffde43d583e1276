"""Where `MorphogenesisCallback` decides in the loop a user runs: after every validation run,
every N steps, at the first step past a controller's ``tau``; the run's plan in steps and
decisions; a growth schedule the run cannot finish refused at its first step; an exact resume
from a mid-epoch checkpoint."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import UserModule
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from user_models import user_model

from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback
from esper_lightning.callbacks._cadence import RunPlan, run_fraction
from esper_lightning.controllers import HeuristicController, StackController, StaticController
from esper_lightning.core.depth import DepthGrowth
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.report import EpochReport
from esper_lightning.core.timing import SeedTiming
from esper_lightning.data import CIFAR10DataModule, TextDataModule


class Reports(StaticController):
    """Never acts; keeps the step, epoch and spent fraction of every report it is asked."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int | None, float | None]] = []
        self.trainer: L.Trainer | None = None

    def decide(self, report: EpochReport):
        step = None if self.trainer is None else self.trainer.global_step
        self.seen.append((report.epoch, step, report.spent_fraction))
        return super().decide(report)


def _trainer(tmp_path: Path, callbacks, **kwargs) -> L.Trainer:
    options = {"default_root_dir": tmp_path, "logger": False, "enable_checkpointing": False,
               "enable_progress_bar": False, "enable_model_summary": False,
               "deterministic": True, "num_sanity_val_steps": 0, **kwargs}
    return L.Trainer(callbacks=callbacks, **options)


class StopAtTrainStart(L.Callback):
    """Ends a fit right after its start-of-training hooks: the run's plan and the durations it
    sets are made there, and a test that reads only those needs no training step."""

    def on_train_start(self, trainer, pl_module):
        trainer.should_stop = True


def _cifar(cifar_dir: Path) -> CIFAR10DataModule:
    return CIFAR10DataModule(cifar_dir, batch_size=4, rng_seed=3)  # 20 batches an epoch


def _fit_reports(tmp_path, cifar_dir, **kwargs) -> tuple[L.Trainer, Reports]:
    torch.manual_seed(0)
    controller = Reports()
    every = kwargs.pop("every_n_train_steps", None)
    callback = MorphogenesisCallback(controller, slots=["net.3"], every_n_train_steps=every)
    trainer = _trainer(tmp_path, [callback], **kwargs)
    controller.trainer = trainer
    trainer.fit(UserModule(), datamodule=_cifar(cifar_dir))
    return trainer, controller


def test_a_decision_follows_every_validation_run_of_a_one_epoch_run(cifar_dir, tmp_path):
    trainer, controller = _fit_reports(tmp_path, cifar_dir, max_steps=20, max_epochs=-1,
                                       val_check_interval=5, limit_val_batches=2)
    # Four validation runs in the epoch, none more at its end; the report's length is the
    # decisions the run plans, its fraction the steps done over max_steps.
    assert [(e, s) for e, s, _ in controller.seen] == [(0, 5), (1, 10), (2, 15), (3, 20)]
    assert [f for _, _, f in controller.seen] == [0.25, 0.5, 0.75, 1.0]
    assert trainer.callbacks[0]._plan == RunPlan(steps=20, steps_per_epoch=20,
                                                 steps_per_decision=5.0)


@pytest.mark.parametrize(("interval", "every_epochs", "epochs", "decisions"), [
    (3, 1, 2, 12),  # batches 3, 6, ..., 18 of each 20-batch epoch: none at an epoch's end
    (7, 1, 2, 4),
    (30, None, 3, 2),  # batches 30 and 60 of the run: epoch 0, with none, adds no decision
])
def test_the_planned_decisions_are_the_validation_runs_lightning_makes(
        cifar_dir, tmp_path, interval, every_epochs, epochs, decisions):
    """An integer val_check_interval counts an epoch's batches, restarting each epoch (the
    plan counted the run's); with check_val_every_n_epoch=None it counts the run's."""
    trainer, controller = _fit_reports(tmp_path, cifar_dir, max_epochs=epochs,
                                       limit_val_batches=1, val_check_interval=interval,
                                       check_val_every_n_epoch=every_epochs)
    assert len(controller.seen) == trainer.callbacks[0]._plan.decisions == decisions


def test_every_n_train_steps_decides_without_validation(cifar_dir, tmp_path):
    _, controller = _fit_reports(tmp_path, cifar_dir, max_steps=12, max_epochs=-1,
                                 limit_val_batches=0, every_n_train_steps=4)
    assert [(e, s) for e, s, _ in controller.seen] == [(0, 4), (1, 8), (2, 12)]


def test_a_run_that_never_validates_is_told_it_is_too_short_once_the_slots_know_their_shape(
        cifar_dir, tmp_path):
    """Without a sanity check the slots learn their shape at the first step's forward: the
    length check waits for it (it raised "run a forward pass" at fit start before)."""
    torch.manual_seed(0)
    callback = MorphogenesisCallback(HeuristicController(), slots=["net.3"], every_n_train_steps=4)
    trainer = _trainer(tmp_path, [callback], max_steps=12, max_epochs=-1, limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"too short for any seed to reach blending"):
        trainer.fit(UserModule(), datamodule=_cifar(cifar_dir))
    assert trainer.global_step == 12 and callback.engine.epoch == 3


@pytest.mark.parametrize("accumulate", [1, 2])
def test_every_n_train_steps_counts_optimizer_steps_under_accumulation(cifar_dir, tmp_path,
                                                                       accumulate):
    """The same decisions at the same optimizer steps whatever the accumulation: none at
    step 0 (before any step) nor on a batch inside an accumulation window."""
    _, controller = _fit_reports(tmp_path, cifar_dir, max_steps=6, max_epochs=-1,
                                 limit_val_batches=0, every_n_train_steps=2,
                                 accumulate_grad_batches=accumulate)
    assert [(e, s) for e, s, _ in controller.seen] == [(0, 2), (1, 4), (2, 6)]


def test_epochs_without_validation_still_decide_at_their_end(cifar_dir, tmp_path):
    _, controller = _fit_reports(tmp_path, cifar_dir, max_epochs=4, limit_train_batches=3,
                                 limit_val_batches=1, check_val_every_n_epoch=2)
    assert [(e, s) for e, s, _ in controller.seen] == [(0, 3), (1, 6), (2, 9), (3, 12)]


def test_run_fraction_reads_max_time_from_lightnings_timer(cifar_dir, tmp_path):
    trainer = _trainer(tmp_path, [], max_time="00:00:10:00")
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    timer.time_elapsed = lambda stage: 150.0  # a quarter of the 600 s
    assert run_fraction(trainer, RunPlan(None, None, None)) == 0.25
    assert run_fraction(_trainer(tmp_path, []), RunPlan(None, None, None)) is None


def _text_dm(text_file: Path) -> TextDataModule:
    return TextDataModule(text_file, block_size=16, batch_size=8, rng_seed=1)


def test_growth_at_tau_is_the_first_step_past_it_not_the_next_validation(text_file, tmp_path):
    torch.manual_seed(0)
    model = user_model("nanogpt")
    morpho = MorphogenesisCallback(StackController(tau=0.25, operator="identity"),
                                   growth=DepthGrowth("blocks", blocks=3), rng_seed=5)
    seen = []

    class Watch(L.Callback):  # the depth each step trains at
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(morpho.engine.slots["blocks.0+1"].seed is not None)

    # One long epoch: validation only at its end, after max_steps.
    trainer = _trainer(tmp_path, [morpho, Watch()], max_steps=40, max_epochs=-1)
    trainer.fit(model, datamodule=_text_dm(text_file))
    assert trainer.num_training_batches > 40
    assert seen.index(True) == 10  # steps 0-9 at one block; step 10 (10/40 = tau) grown
    assert [e.kind for e in morpho.engine.events] == ["germinated", "fossilized"]


def test_growth_at_tau_waits_for_the_first_batch_of_an_accumulation_window(text_file,
                                                                           tmp_path):
    """Grown before the first whole optimizer step past tau: every batch of that step trains
    the grown model (never a step half one block, half four)."""
    torch.manual_seed(0)
    morpho = MorphogenesisCallback(StackController(tau=0.1, operator="identity"),
                                   growth=DepthGrowth("blocks", blocks=3), rng_seed=5)
    grown: list[tuple[int, bool]] = []

    class Watch(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            grown.append((batch_idx, morpho.engine.slots["blocks.0+1"].seed is not None))

    model = user_model("nanogpt")
    batch = FlopMeter().training_step(model, torch.zeros(8, 16, dtype=torch.long))
    # A budget charged by the batch: tau (0.1 of 100 batches at one block) falls at batch 10,
    # inside the window of batches 9-11.
    budget = ComputeBudget(100 * batch)
    trainer = _trainer(tmp_path, [morpho, budget, Watch()], max_epochs=-1,
                       accumulate_grad_batches=3)
    trainer.fit(model, datamodule=_text_dm(text_file))
    first = next(i for i, g in grown if g)
    assert first == 12  # the next window's first batch
    assert all(g for i, g in grown if i >= first)


def test_a_schedule_the_run_cannot_finish_is_refused_at_its_first_step(text_file, tmp_path):
    morpho = MorphogenesisCallback(StackController(tau=0.99, operator="copy"),
                                   growth=DepthGrowth("blocks", blocks=3))
    trainer = _trainer(tmp_path, [morpho], max_steps=50, max_epochs=-1)
    with pytest.raises(MisconfigurationException) as err:
        trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
    message = str(err.value)
    assert message == (
        "MorphogenesisCallback: the growth schedule cannot finish: StackController(tau=0.99) "
        "needs >= 5 steps after tau (a germination per slot, 2 blend step(s), the advance and "
        "the fossilization), max_steps=50 leaves about 0; lower tau or train longer")
    assert trainer.global_step == 0


def test_a_budget_too_small_after_tau_is_refused_at_the_grown_cost(text_file, tmp_path):
    from esper_lightning.callbacks import ComputeBudget
    from esper_lightning.core.flops import FlopMeter

    step = FlopMeter().training_step(user_model("nanogpt"), torch.zeros(8, 16, dtype=torch.long))
    morpho = MorphogenesisCallback(StackController(tau=0.9, operator="identity"),
                                   growth=DepthGrowth("blocks", blocks=3))
    # 100 steps of one block: 10 after tau at one block, 2.5 at the grown (4-block) bound.
    budget = ComputeBudget(100 * step)
    trainer = _trainer(tmp_path, [morpho, budget], max_epochs=-1)
    with pytest.raises(MisconfigurationException, match=r"needs >= 3 steps after tau .* the "
                       r"budget \(.* FLOPs, at the grown cost\) leaves about 2; lower tau"):
        trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
    assert trainer.global_step == 1  # refused once the first step's cost was known


def test_a_budgets_growth_that_max_steps_cuts_short_is_told_at_the_first_step(text_file,
                                                                           tmp_path):
    """Under a budget tau is a share of the budget: a max_steps below the budget's steps can
    end the run a few steps after the growth (found by a user following the README with
    max_steps=40 on a budget of about 68 steps: grown at step 36, the fit over at step 40).
    Told, not refused: the fit resumes from its checkpoint, growth and all. One cause, one line:
    a growth that would not begin in the fit is the budget's to tell."""
    from esper_lightning.callbacks import ComputeBudget
    from esper_lightning.core.flops import FlopMeter

    step = FlopMeter().training_step(user_model("nanogpt"), torch.zeros(8, 16, dtype=torch.long))

    def fit(max_steps: int, tau: float = 0.25) -> list[str]:
        morpho = MorphogenesisCallback(StackController(tau=tau, operator="identity"),
                                       growth=DepthGrowth("blocks", blocks=3))
        # 100 one-block steps: growth at step 25, then the budget's 75 at up to 4x.
        trainer = _trainer(tmp_path, [morpho, ComputeBudget(100 * step), StopAfterSteps(2)],
                           max_steps=max_steps, max_epochs=-1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
        assert trainer.global_step == 2  # told at step 1, not stopped
        return [str(w.message) for w in caught if "MorphogenesisCallback" in str(w.message)
                or str(w.message).startswith("ComputeBudget(")]

    (message,) = fit(27)
    assert message == (
        "MorphogenesisCallback: StackController(tau=0.25) grows at about step 25 of the budget "
        f"({100 * step:g} FLOPs) and needs >= 3 steps after it, and max_steps=27 ends the fit "
        "after 27: this fit stops before its growth is done (resume it from its checkpoint, or "
        "raise that limit; -1 for max_steps and max_epochs: the budget ends the fit)")
    assert fit(40) == []  # 15 steps after the growth: enough
    # 5 steps: even at 4x the one-block cost (the growth's bound) they spend 20 of the 100, and
    # the growth at step 25 would not begin: the budget's line alone says so.
    (budget_says,) = fit(5)
    assert budget_says.startswith(f"ComputeBudget({100 * step:g} FLOPs): max_steps=5 ends the "
                                  "fit after 5 steps, which spend at most ")
    assert "(20% of the budget, 4x this step's cost once grown): what the budget plans after " \
        "that (a decay, a growth) will not happen in this fit" in budget_says
    # tau 0.1 and 12 steps: the growth begins at step 10 and cannot finish (a seed half-born at
    # the fit's end), and the budget is not spent (at most 48 of 100): two consequences, a line
    # each.
    budget_says, growth_says = fit(12, tau=0.1)
    assert "max_steps=12 ends the fit after 12 steps" in budget_says
    assert growth_says.startswith("MorphogenesisCallback: StackController(tau=0.1) grows at "
                                  "about step 10 of the budget")
    assert "this fit stops before its growth is done" in growth_says


class StopAfterSteps(L.Callback):
    """Ends a fit after ``steps`` training steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        trainer.should_stop = trainer.global_step >= self.steps


def test_durations_in_steps_become_decisions_at_fit_start(cifar_dir, tmp_path):
    timing = SeedTiming(incubation="10 steps", blend="25%", hold=2, embargo="1 epochs")
    morpho = MorphogenesisCallback(StaticController(), slots=["net.3"], timing=timing)
    trainer = _trainer(tmp_path, [morpho, StopAtTrainStart()], max_steps=40, max_epochs=-1,
                       val_check_interval=5, limit_val_batches=1)
    trainer.fit(UserModule(), datamodule=_cifar(cifar_dir))
    assert trainer.global_step == 0  # set at the fit's start, before any step
    (slot,) = morpho.engine.slots.values()
    # A decision every 5 steps, 8 in the run: 10 steps = 2, 25 % = 2, an epoch (20 steps) = 4.
    assert slot.gates.config.min_training_epochs == 2
    assert slot.gates.config.min_blending_epochs == 2
    assert (slot.blend_ticks, slot.embargo_ticks) == (2, 4)


def test_a_duration_the_run_cannot_count_is_refused_in_one_line(cifar_dir, tmp_path):
    morpho = MorphogenesisCallback(StaticController(), slots=["net.3"],
                                   timing=SeedTiming(incubation="10%"))
    trainer = _trainer(tmp_path, [morpho], max_epochs=-1, max_steps=-1, limit_val_batches=0)
    trainer.should_stop = False
    with pytest.raises(MisconfigurationException) as err:
        trainer.fit(UserModule(), datamodule=_cifar(cifar_dir))
    assert str(err.value) == (
        "MorphogenesisCallback: SeedTiming.incubation: a duration of 0.1 of the run needs the "
        "run's length; set max_steps, max_epochs or a ComputeBudget")


def test_the_heuristic_incubation_follows_the_run_unless_the_user_set_one(cifar_dir, tmp_path):
    from esper_lightning.core import GateConfig

    def incubation(**options) -> int:
        morpho = MorphogenesisCallback(HeuristicController(), slots=["net.3"], **options)
        trainer = _trainer(tmp_path, [morpho, StopAtTrainStart()], max_epochs=20,
                           limit_train_batches=1, limit_val_batches=1)
        trainer.fit(UserModule(), datamodule=_cifar(cifar_dir))
        return next(iter(morpho.engine.slots.values())).gates.config.min_training_epochs

    assert incubation() == 4  # 10 of 50 decisions, scaled to 20
    assert incubation(gate_config=GateConfig(min_training_epochs=7)) == 7
    assert incubation(timing=SeedTiming(incubation=3)) == 3


def _mid_epoch_fit(tmp_path: Path, text_file: Path, ckpt_path: str | None = None):
    torch.manual_seed(0)
    model = user_model("nanogpt")
    morpho = MorphogenesisCallback(StackController(tau=(0.3, 0.6), operator="copy"),
                                   growth=DepthGrowth("blocks", blocks=(1, 2)), rng_seed=5)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=13, save_top_k=-1,
                            filename="{step}")
    trainer = _trainer(tmp_path, [morpho, saver], max_steps=40, max_epochs=-1,
                       val_check_interval=7, limit_val_batches=2, enable_checkpointing=True)
    trainer.fit(model, datamodule=_text_dm(text_file), ckpt_path=ckpt_path)
    return model, morpho


def test_a_fit_resumes_exactly_from_a_mid_epoch_checkpoint(text_file, tmp_path):
    model, morpho = _mid_epoch_fit(tmp_path / "whole", text_file)
    assert [e.kind for e in morpho.engine.events] == ["germinated", "fossilized"] * 2
    # Step 26: between the growths, between two validations, inside the one epoch.
    again, resumed = _mid_epoch_fit(tmp_path / "again", text_file,
                                    str(tmp_path / "whole" / "ckpt" / "step=26.ckpt"))
    assert [(e.epoch, e.slot_id, e.kind) for e in resumed.engine.events] == [
        (e.epoch, e.slot_id, e.kind) for e in morpho.engine.events]
    whole, part = model.state_dict(), again.state_dict()
    assert whole.keys() == part.keys()
    assert all(torch.equal(whole[k], part[k]) for k in whole if torch.is_tensor(whole[k]))


@pytest.mark.parametrize("budget_first", [False, True], ids=["morpho-first", "budget-first"])
def test_a_growth_step_is_charged_at_the_grown_cost_in_either_callback_order(
        budget_first, text_file, tmp_path):
    from esper_lightning.callbacks import ComputeBudget
    from esper_lightning.core.flops import FlopMeter

    x = torch.zeros(8, 16, dtype=torch.long)
    one, four = (FlopMeter().training_step(user_model("nanogpt", n), x) for n in (1, 4))
    torch.manual_seed(0)
    morpho = MorphogenesisCallback(StackController(tau=0.5, operator="identity"),
                                   growth=DepthGrowth("blocks", blocks=3), rng_seed=5)
    # 28 one-block steps: 14 after tau, 3.5 at the grown cost's bound (4x), enough for the 3
    # steps the identity growth needs (a budget too small for them is refused, as tested above).
    budget = ComputeBudget(28 * one)
    callbacks = [budget, morpho] if budget_first else [morpho, budget]
    trainer = _trainer(tmp_path, callbacks, max_epochs=-1)
    trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
    # Fourteen one-block steps reach tau; every step after trains (and is charged as) four blocks.
    grown = trainer.global_step - 14
    assert grown > 0 and budget.spent == 14 * one + grown * four
