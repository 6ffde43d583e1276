"""What the growth callbacks add to a fit besides the user's own work (issue 52, item 6): no
validation forward without a seed to measure or a controller that reads it, and a FLOP meter
that runs once per architecture and batch shape. Counted, never timed."""

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from user_models import NanoGPT

from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback
from esper_lightning.controllers import HeuristicController, StackController
from esper_lightning.core.counterfactual import (
    ACCURACY,
    FOSSIL_CONTRIBUTIONS,
    VALIDATION_READS,
    validation_reads,
)
from esper_lightning.core.depth import DepthGrowth
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.lifecycle import LIVE_STAGES, SeedStage
from esper_lightning.data import TextDataModule

VAL_BATCHES = 2  # 16 validation blocks in batches of 8


class CountingGPT(NanoGPT):
    """NanoGPT counting its real (not meta) forwards in eval mode: ``validation_step``'s own and
    any the callback adds. ``log_accuracy=False``: an LM that logs no accuracy."""

    def __init__(self, log_accuracy: bool = True) -> None:
        super().__init__()
        self.log_accuracy = log_accuracy
        self.eval_forwards = 0

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if not self.training and not idx.is_meta:
            self.eval_forwards += 1
        return super().forward(idx)

    def validation_step(self, batch, batch_idx):
        if self.log_accuracy:
            return super().validation_step(batch, batch_idx)
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).flatten(0, 1), y.flatten()))
        return None


class Reads(StackController):
    """A growth schedule that says what it reads of a validation run."""

    def __init__(self, reads: frozenset[str]) -> None:
        super().__init__(tau=0.2, operator="identity")
        self.validation_reads = reads


class ValidationForwards(Callback):
    """Per validation run of the fit (not the sanity check): the seeds' stages at its start and
    the forwards beyond one per batch (``validation_step``'s)."""

    def __init__(self) -> None:
        self.runs: list[tuple[set[SeedStage], int]] = []
        self._start = 0
        self._stages: set[SeedStage] = set()

    def on_validation_epoch_start(self, trainer, pl_module):
        self._start = pl_module.eval_forwards
        self._stages = {s.stage for s in pl_module.esper_slots.values() if s.seed is not None}

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            extra = pl_module.eval_forwards - self._start - VAL_BATCHES
            self.runs.append((self._stages, extra))


def grow_fit(tmp_path: Path, text_file: Path, controller, module: CountingGPT,
             extra_for=None) -> tuple[ValidationForwards, ComputeBudget]:
    """Grow ``module`` by one block at 0.2 of a budget of 40 one-block steps (8 steps an epoch);
    ``extra_for(budget)``: one more callback, made with the budget."""
    step = FlopMeter().training_step(NanoGPT(), torch.zeros(8, 16, dtype=torch.long))
    torch.manual_seed(0)
    watch = ValidationForwards()
    morpho = MorphogenesisCallback(controller, growth=DepthGrowth("blocks", blocks=1))
    budget = ComputeBudget(40 * step)
    extra = [] if extra_for is None else [extra_for(budget)]
    trainer = L.Trainer(max_epochs=-1, callbacks=[watch, morpho, budget, *extra],
                        default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        deterministic=True)
    dm = TextDataModule(text_file, block_size=16, batch_size=8, train_blocks=64, val_blocks=16,
                        rng_seed=1)
    trainer.fit(module, datamodule=dm)
    assert dm.val_dataloader().__len__() == VAL_BATCHES
    return watch, budget


def _without_live_seed(runs: list[tuple[set[SeedStage], int]]) -> list[int]:
    return [extra for stages, extra in runs if not stages & LIVE_STAGES]


def test_a_growth_schedule_adds_no_validation_forward_without_a_live_seed(text_file, tmp_path):
    watch, _ = grow_fit(tmp_path, text_file, StackController(tau=0.2, operator="identity"),
                        CountingGPT(log_accuracy=False))
    stages = [s for s, _ in watch.runs]
    # The run covers the first validation, runs before the growth and runs with a fossil only.
    assert stages[0] == set() and {SeedStage.FOSSILIZED} in stages
    assert _without_live_seed(watch.runs) == [0] * len(_without_live_seed(watch.runs))
    # A live (blending or holding) seed is measured: main and its slot off, two more forwards.
    live = [extra for s, extra in watch.runs if s & LIVE_STAGES]
    assert all(extra == 2 * VAL_BATCHES for extra in live)


@pytest.mark.parametrize(("reads", "log_accuracy", "extra"), [
    (frozenset(), True, 0),
    # Logged: read from the logs, except in the fit's first run (its start cannot know yet).
    (frozenset({ACCURACY}), True, 0),
    (frozenset({ACCURACY}), False, 1),  # not logged: measured, one forward a batch
    (VALIDATION_READS, True, None),  # fossils measured: main and off (accuracy comes with it)
])
def test_what_the_controller_reads_decides_the_forwards(text_file, tmp_path, reads, log_accuracy,
                                                       extra):
    watch, _ = grow_fit(tmp_path, text_file, Reads(reads), CountingGPT(log_accuracy))
    assert {SeedStage.FOSSILIZED} in [stages for stages, _ in watch.runs]
    for run, (stages, forwards) in enumerate(watch.runs):
        if stages & LIVE_STAGES:
            continue
        expected = extra if extra is not None else (2 if stages else 1 if run == 0 else 0)
        if run == 0 and ACCURACY in reads:
            expected = 1
        assert forwards == expected * VAL_BATCHES, (run, stages, forwards)


def test_the_built_in_controllers_say_what_they_read():
    assert validation_reads(StackController(tau=0.5)) == frozenset()
    assert validation_reads(HeuristicController()) == {ACCURACY}
    assert validation_reads(object()) == VALIDATION_READS  # unknown: measured as before
    assert validation_reads(Reads(frozenset({FOSSIL_CONTRIBUTIONS}))) == {FOSSIL_CONTRIBUTIONS}
    with pytest.raises(ValueError, match="names \\['loss'\\]; accepted: accuracy"):
        validation_reads(Reads(frozenset({"loss"})))


class MeterWatch(Callback):
    """The meter's measurements so far at the end of every training epoch."""

    def __init__(self, budget: ComputeBudget) -> None:
        self.budget = budget
        self.measurements: list[int] = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.measurements.append(self.budget.ledger.meter.measurements)


def test_the_meter_runs_once_per_architecture_and_shape(text_file, tmp_path):
    watch: list[MeterWatch] = []

    def meter_watch(budget: ComputeBudget) -> MeterWatch:
        watch.append(MeterWatch(budget))
        return watch[0]

    _, budget = grow_fit(tmp_path, text_file, StackController(tau=0.2, operator="identity"),
                         CountingGPT(), extra_for=meter_watch)
    # One training pass and one validation forward per architecture: the one-block model and
    # the grown one (a blending, holding or fossilized growth seed computes the same products;
    # the counterfactual of a blending seed is that forward twice). A shape seen before is
    # never measured again: the epochs after the growth's add nothing.
    assert budget.ledger.meter.measurements == 4
    counts = watch[0].measurements  # at each epoch's end: growth in the second epoch
    assert counts[0] == 2 and counts[1:] == [4] * (len(counts) - 1) and len(counts) >= 3
