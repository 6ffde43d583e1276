"""examples/grow_gpt.py (a user's own GPT, its own block class, grown 1 -> 4 blocks at half a
compute budget, WSD, loss against FLOPs in TensorBoard) on a tiny text fixture, in process."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import example_module
from lightning.pytorch.callbacks import RichProgressBar
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from esper_lightning import load_grown
from esper_lightning.blueprints.growth import GrownBlocks
from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback
from esper_lightning.callbacks.compute_budget import FLOPS_PER_STEP
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.lifecycle import SeedStage
from esper_lightning.schedule import batch_fraction

BLOCK, BATCH, TAU, GFLOPS, DECAY = 16, 8, 0.5, 2.0, 0.2


@pytest.fixture
def example():
    with example_module("grow_gpt") as module:
        yield module


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # tied weights counted once


def _step_flops(example, n_layer: int) -> int:
    model = example.TinyGPT(n_layer=n_layer, block_size=BLOCK)
    return FlopMeter().training_step(model, torch.zeros(BATCH, BLOCK, dtype=torch.long))


def _scalars(run) -> dict[str, list]:
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}


def test_grows_one_block_to_four_at_tau_and_stops_at_the_budget(example, text_file, tmp_path):
    cli, _ = example.fit([
        "--text", str(text_file), "--gflops", str(GFLOPS), "--data.block_size", str(BLOCK),
        "--data.batch_size", str(BATCH), "--data.train_blocks", "32", "--data.val_blocks", "8",
        "--morpho.controller.tau", str(TAU), "--logdir", str(tmp_path / "runs"),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "true",
    ])
    model, callbacks = cli.model, cli.trainer.callbacks
    morpho = next(c for c in callbacks if isinstance(c, MorphogenesisCallback))
    budget = next(c for c in callbacks if isinstance(c, ComputeBudget))
    # The host keeps its 1 block; the growth slot after it holds 3 more of the user's own
    # class, kept: a 4-block model.
    slot = morpho.engine.slots["blocks.0+1"]
    assert len(model.blocks) == 1 and slot.stage == SeedStage.FOSSILIZED
    assert isinstance(slot.seed, GrownBlocks) and len(slot.seed) == 3
    assert all(type(block) is example.Block for block in slot.seed)
    assert morpho.engine.host_params == _params(example.TinyGPT(n_layer=1, block_size=BLOCK))
    assert _params(model) == _params(example.TinyGPT(n_layer=4, block_size=BLOCK))
    assert morpho.engine.seed_params == 3 * _params(example.Block(32, 4))
    # The checkpoint rebuilds it: the growth slot with its 3 blocks, strictly.
    checkpoint = cli.trainer.checkpoint_callback.best_model_path  # the last: no monitor
    again = load_grown(example.TinyGPT, checkpoint).eval()
    tokens = torch.randint(0, 256, (2, BLOCK), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(again(tokens), model.eval()(tokens))
    lines = example.summary(model, morpho, budget, val_loss=2.0, seconds=1.0).splitlines()
    assert "blocks            1 -> 4" in lines
    assert f"training compute  {budget.spent / 1e9:.1f} of 2.0 GFLOP" in lines
    # The fit stopped at the budget: the last step (of the grown model) crossed it.
    grown_step = _step_flops(example, 4)
    assert budget.budget_flops == GFLOPS * 1e9
    assert budget.spent - grown_step < budget.budget_flops <= budget.spent
    # WSD: the last step trained at the middle of its own slice of the decay, down to the floor.
    multiplier = budget.schedule.multiplier(
        batch_fraction(budget.spent - grown_step, grown_step, budget.budget_flops))
    assert 0.0 <= multiplier <= 0.5 * grown_step / budget.budget_flops / DECAY + 1e-12
    for group in cli.trainer.optimizers[0].param_groups:  # host and seed groups alike
        assert group["lr"] == pytest.approx(group["initial_lr"] * multiplier)

    scalars = _scalars(tmp_path / "runs" / "version_0")
    # Growth at the first step past tau (a decision of its own, not the next validation's):
    # the fraction logged with each decision.
    fractions = [s.value for s in scalars["morpho/budget_fraction"]]
    germinated = [s.value for s in scalars["morpho/seeds_germinated"]]
    grew = germinated.index(1.0)
    assert fractions[grew] >= TAU and all(f < TAU for f in fractions[:grew])
    assert fractions[grew] - TAU < _step_flops(example, 1) / budget.budget_flops
    seed_params = [s.value for s in scalars["morpho/seed_params"]]
    assert seed_params[grew] == morpho.engine.seed_params and not any(seed_params[:grew])
    # The loss-vs-FLOPs chart: every validation's loss, at the GFLOPs spent by then.
    chart = scalars["compute/val_loss_vs_flops"]
    assert [s.value for s in chart] == [s.value for s in scalars["val_loss"]]
    steps = [s.step for s in chart]
    # The FLOPs spent, unrounded, as the step: a run of 2 GFLOP has distinct points.
    assert steps == sorted(steps) == list(dict.fromkeys(steps))
    assert steps[-1] == int(budget.spent // FLOPS_PER_STEP) and FLOPS_PER_STEP == 1
    train_flops = [s.value for s in scalars["morpho/train_flops"]]  # at each decision
    # Every validation decides; the growth's own decisions come between them.
    assert set(steps) <= {int(f // FLOPS_PER_STEP) for f in train_flops}


def test_the_defaults_grow_at_tau_inside_one_long_epoch(example, tmp_path):
    """The example as shipped (the data module's defaults: one epoch longer than the budget),
    at a smaller budget: growth at the first step past tau, three quarters of it trained
    grown, validation every 200 steps deciding nothing early."""
    from test_docs_recipes import write_long_text

    write_long_text(tmp_path / "plays.txt")
    cli, _ = example.fit(["--text", str(tmp_path / "plays.txt"), "--gflops", "20",
                          "--logdir", str(tmp_path / "runs"),
                          "--trainer.enable_progress_bar", "false"])
    trainer = cli.trainer
    morpho = next(c for c in trainer.callbacks if isinstance(c, MorphogenesisCallback))
    budget = next(c for c in trainer.callbacks if isinstance(c, ComputeBudget))
    assert budget.ledger.exhausted and trainer.global_step < trainer.num_training_batches
    assert [e.kind for e in morpho.engine.events] == ["germinated", "fossilized"]
    scalars = _scalars(tmp_path / "runs" / "version_0")
    fractions = [s.value for s in scalars["morpho/budget_fraction"]]
    grew = [s.value for s in scalars["morpho/seeds_germinated"]].index(1.0)
    tau = morpho.controller.tau
    step = FlopMeter().training_step(example.TinyGPT(n_layer=1, block_size=32),
                                     torch.zeros(32, 32, dtype=torch.long))  # the defaults'
    assert tau == 0.25 and tau <= fractions[grew] < tau + step / 20e9
    assert 1.0 - fractions[grew] >= 0.5  # most of the budget trained grown
    assert morpho.engine.seed_params == 3 * _params(cli.model.blocks[0])


def test_bad_input_is_one_line(example, text_file, tmp_path, capsys):
    status = example.main(["--text", str(tmp_path / "nothing.txt"),
                           "--logdir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "--download" not in err  # an option this example does not have
    assert not (tmp_path / "runs").exists()
    assert example.main(["--logdir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == ("error: no text to learn: pass --text FILE (a text file "
                                       "or a folder holding one)\n")
    for flag, value, message in (
            ("--gflops", "0", "--gflops must be a number > 0, got 0.0"),
            ("--grow", "0", "--grow must be an int >= 1, got 0"),
            ("--model.n_head", "5", "n_head=5 must divide the width 32"),
            # The parser's own refusal: its message, not the 80-line usage before it.
            ("--gflops", "abc", 'Parser key "gflops": Expected a <class \'float\'>. Got value: '
                                "abc")):
        assert example.main(["--text", str(text_file), flag, value,
                             "--logdir", str(tmp_path / "runs")]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "runs").exists()


def test_a_fit_that_ends_before_its_first_validation_still_prints_its_summary(
        example, text_file, tmp_path, capsys):
    # It raised KeyError: 'val_loss' after the fit, with a traceback.
    assert example.main(["--text", str(text_file), "--gflops", str(GFLOPS), "--trainer.max_steps",
                         "3", "--data.block_size", str(BLOCK), "--data.batch_size", str(BATCH),
                         "--trainer.enable_progress_bar", "false",
                         "--logdir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "validation loss   none: the fit ended before its first validation" in out


def test_a_bad_model_argument_prints_one_line_and_no_serialization_warning(
        example, text_file, tmp_path, capsys):
    # The model's class refuses n_head=5 after LightningCLI dumped the whole config, --grow's
    # DepthGrowth included: the dump must write it without a JsonargparseWarning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = example.main(["--text", str(text_file), "--model.n_head", "5", "--grow", "2",
                               "--logdir", str(tmp_path / "runs")])
    assert status == 2
    assert capsys.readouterr().err == "error: n_head=5 must divide the width 32\n"
    assert not [w for w in caught if w.category.__name__ == "JsonargparseWarning"
                or "serialize" in str(w.message)]


def _cli(example, text_file, tmp_path, *flags: str):
    return example.GrowCLI(example.TinyGPT, example.TextDataModule, run=False,
                           seed_everything_default=0, args=[
                               "--text", str(text_file), "--logdir", str(tmp_path / "runs"),
                               "--data.block_size", str(BLOCK), "--data.train_blocks", "8",
                               "--data.val_blocks", "8", "--grow", "2", *flags])


def test_growth_is_instantiated_from_grow_and_dumped_as_its_arguments(
        example, text_file, tmp_path):
    cli = _cli(example, text_file, tmp_path)
    morpho = next(c for c in cli.trainer.callbacks if isinstance(c, MorphogenesisCallback))
    growth = morpho._engine_kwargs["growth"]
    assert (growth.stack, growth.events) == ("blocks", (2,))
    assert cli.config_dump["morpho"]["growth"] == {"stack": "blocks", "blocks": 2}


def test_the_progress_bar_has_no_epoch_total_and_shows_the_budget_spent(
        example, text_file, tmp_path):
    cli = _cli(example, text_file, tmp_path)
    bar = cli.trainer.progress_bar_callback
    # The budget ends the fit (max_epochs=-1): Lightning's RichProgressBar says "Epoch 58/-2".
    assert cli.trainer.max_epochs == -1 and isinstance(bar, example.BudgetProgressBar)
    budget = next(c for c in cli.trainer.callbacks if isinstance(c, ComputeBudget))
    budget.ledger.restore_train_flops(0.25 * budget.budget_flops)
    assert bar.get_metrics(cli.trainer, cli.model)["budget"] == "25%"
    # A bar of the user's own is kept, and no bar is added to a fit without one.
    own = _cli(example, text_file, tmp_path, "--trainer.callbacks",
               "lightning.pytorch.callbacks.RichProgressBar")
    assert isinstance(own.trainer.progress_bar_callback, RichProgressBar)
    off = _cli(example, text_file, tmp_path, "--trainer.enable_progress_bar", "false")
    assert off.trainer.progress_bar_callback is None


def test_a_block_seed_blends_at_germination_so_a_late_growth_is_not_too_short(
        example, text_file, tmp_path, recwarn):
    # 20 epochs, growth past half of them: an incubating seed would need 9 + 2 + 10 epochs
    # (germinate, advance, G2's default incubation), a block seed blends when it is germinated.
    example.fit([
        "--text", str(text_file), "--gflops", "1000", "--trainer.max_epochs", "20",
        "--data.block_size", str(BLOCK), "--data.batch_size", str(BATCH),
        "--data.train_blocks", "8", "--data.val_blocks", "8", "--logdir", str(tmp_path / "runs"),
        "--trainer.enable_progress_bar", "false",
    ])
    assert not [w for w in recwarn if "too short" in str(w.message)]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_training_loss_in_tensorboard_is_what_a_log_every_step_writes(
        example, text_file, tmp_path, monkeypatch, accumulate):
    """The module logs ``train_loss`` only on the steps the logger writes (and the budget's
    last): TensorBoard holds the same points, steps and values as the module logging it in
    every ``training_step``, with gradient accumulation too (where the ``loss`` Lightning hands
    on is divided by it)."""
    def fit(logdir: str) -> list[tuple[int, float]]:
        cli, _ = example.fit([
            "--text", str(text_file), "--gflops", str(GFLOPS), "--data.block_size", str(BLOCK),
            "--data.batch_size", str(BATCH), "--data.train_blocks", "32",
            "--data.val_blocks", "8", "--logdir", logdir, "--trainer.log_every_n_steps", "4",
            "--trainer.enable_progress_bar", "false",
            "--trainer.accumulate_grad_batches", str(accumulate),
        ])
        points = [(s.step, s.value) for s in _scalars(f"{logdir}/version_0")["train_loss"]]
        if accumulate == 1:  # the budget's last step is off the cadence: logged all the same
            assert cli.trainer.global_step % 4 != 0
            assert points[-1][0] == cli.trainer.global_step - 1
        return points

    cadence = fit(str(tmp_path / "cadence"))

    def log_every_step(self, batch, batch_idx):  # the example before it logged on the cadence
        loss, _ = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    monkeypatch.setattr(example.TinyGPT, "training_step", log_every_step)
    monkeypatch.setattr(example.TinyGPT, "on_train_batch_end",
                        example.L.LightningModule.on_train_batch_end)
    assert fit(str(tmp_path / "every")) == cadence
    assert len(cadence) >= 5 and cadence[0][0] == 3  # every fourth step (Lightning counts from 0)
