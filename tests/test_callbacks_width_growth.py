"""`WidthGrowthCallback` in a real Trainer: the model widens before the first step past ``at``
(steps, a compute budget, gradient accumulation), the ledger charges the wide model's cost from
that step (the natively built wide model's, in either callback order), width then depth beside a
`MorphogenesisCallback`, an exact resume of a widened checkpoint into the model built narrow, a
widened Hugging Face model handed back at its width, the μP-style ``lr_scale`` arithmetic, and
every schedule that cannot happen refused in one line."""

from __future__ import annotations

import functools
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import UserModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from user_models import NanoGPT, UserBlock, user_model

from esper_lightning.callbacks import ComputeBudget, MorphogenesisCallback, WidthGrowthCallback
from esper_lightning.controllers import HeuristicController, StackController
from esper_lightning.core.depth import DepthGrowth, materialize
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.width import WidthGrowth
from esper_lightning.data import TextDataModule

X = torch.zeros(8, 16, dtype=torch.long)  # a training batch's inputs (8 blocks of 16 tokens)


def _trainer(tmp_path: Path, callbacks, **kwargs) -> L.Trainer:
    options = {"default_root_dir": tmp_path, "logger": False, "enable_checkpointing": False,
               "enable_progress_bar": False, "enable_model_summary": False,
               "deterministic": True, "num_sanity_val_steps": 0, "max_epochs": -1, **kwargs}
    return L.Trainer(callbacks=callbacks, **options)


def _text_dm(text_file: Path) -> TextDataModule:
    return TextDataModule(text_file, block_size=16, batch_size=8, rng_seed=1)


def _native(n_layer: int = 1, width: int = 64) -> NanoGPT:
    """The nanoGPT built at the widened shape: heads of the narrow model's head width (8)."""
    torch.manual_seed(0)
    return NanoGPT(n_layer, width=width, block=functools.partial(UserBlock, n_head=width // 8))


def _cost(model: torch.nn.Module) -> int:
    return FlopMeter().training_step(model, X)


class Widths(L.Callback):
    """The hidden width each training batch trains at (listed after the width growth)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(pl_module.blocks[0].ln_1.weight.shape[0])


def test_the_model_widens_before_the_first_step_past_at_with_its_adamw_state(
        text_file, tmp_path):
    model, widths = user_model("nanogpt"), Widths()
    width = WidthGrowthCallback(at=0.45, growth=WidthGrowth(factor=2, rng_seed=3))
    trainer = _trainer(tmp_path, [width, widths], max_steps=10)
    trainer.fit(model, datamodule=_text_dm(text_file))
    assert widths.seen == [32] * 5 + [64] * 5  # 5/10 is the first step's start past 0.45
    assert width.widened_step == 5 and width.widening.hidden == (32, 64)
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in _native().parameters())
    state = trainer.optimizers[0].state
    # Every parameter kept its identity and AdamW state at its new shape, ten steps counted.
    assert all(state[p]["exp_avg"].shape == p.shape and int(state[p]["step"]) == 10
               for p in model.parameters())


@pytest.mark.parametrize("budget_first", [False, True], ids=["width-first", "budget-first"])
def test_a_budget_charges_the_wide_cost_from_the_widening_step(budget_first, text_file,
                                                               tmp_path):
    narrow, wide = _cost(user_model("nanogpt")), _cost(_native())
    assert wide > 2 * narrow
    width = WidthGrowthCallback(at=0.25)
    budget = ComputeBudget(30 * narrow)
    callbacks = [budget, width] if budget_first else [width, budget]
    trainer = _trainer(tmp_path, callbacks)
    trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
    # Steps 0-7 narrow (8/30 >= 0.25), then wide ones until the budget is spent.
    assert width.widened_step == 8
    grown = trainer.global_step - 8
    assert grown == math.ceil(22 * narrow / wide) and budget.spent == 8 * narrow + grown * wide


def test_under_accumulation_the_widening_waits_for_an_optimizer_steps_first_batch(
        text_file, tmp_path):
    narrow = _cost(user_model("nanogpt"))
    width, widths = WidthGrowthCallback(at=0.225), Widths()
    trainer = _trainer(tmp_path, [width, widths, ComputeBudget(20 * narrow)],
                       accumulate_grad_batches=2)
    trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
    # Batch 5 starts at 0.25 of the budget, inside an optimizer step: batch 6 is widened.
    assert widths.seen.index(64) == 6 and width.widened_step == 3


def test_width_then_depth_beside_a_stack_controller(text_file, tmp_path):
    model = user_model("nanogpt")
    width = WidthGrowthCallback(at=0.2)
    morpho = MorphogenesisCallback(StackController(tau=0.5, operator="identity"),
                                   growth=DepthGrowth("blocks", blocks=3), rng_seed=5)
    trainer = _trainer(tmp_path, [width, morpho], max_steps=20, limit_val_batches=0)
    trainer.fit(model, datamodule=_text_dm(text_file))
    assert width.widened_step == 4
    assert [e.kind for e in morpho.engine.events] == ["germinated", "fossilized"]
    slot = morpho.engine.slots["blocks.0+1"]
    assert slot.channels == 64 and all(b.ln_1.weight.shape == (64,) for b in slot.seed)
    # The grown model is the natively built wide four-block one, parameter for parameter.
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in _native(4).parameters())
    # The ledger the callback owns: 4 narrow steps, 6 wide, 10 wide and four blocks deep.
    one, wide, deep = _cost(user_model("nanogpt")), _cost(_native()), _cost(_native(4))
    assert morpho.ledger.train_flops == 4 * one + 6 * wide + 10 * deep


def _resumable_fit(tmp_path: Path, text_file: Path, ckpt_path: str | None = None):
    model = user_model("nanogpt")  # built narrow, whatever the checkpoint holds
    width = WidthGrowthCallback(at=0.3, growth=WidthGrowth(factor=2, rng_seed=7), lr_scale=0.5)
    morpho = MorphogenesisCallback(StackController(tau=0.6, operator="copy"),
                                   growth=DepthGrowth("blocks", blocks=1), rng_seed=5)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=13, save_top_k=-1,
                            filename="{step}")
    trainer = _trainer(tmp_path, [width, morpho, saver], max_steps=40, val_check_interval=7,
                       limit_val_batches=2, enable_checkpointing=True)
    trainer.fit(model, datamodule=_text_dm(text_file), ckpt_path=ckpt_path)
    return model, width, trainer


@pytest.fixture(scope="module")
def whole_fit(_text_master: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """`_resumable_fit` straight through, once for both checkpoints it is resumed from:
    ``model``, ``width``, ``trainer``, its checkpoints in ``ckpt`` (read-only) and its
    ``text``."""
    root = tmp_path_factory.mktemp("whole_fit")
    text = root / "text" / "plays.txt"
    text.parent.mkdir()
    shutil.copyfile(_text_master, text)
    model, width, trainer = _resumable_fit(root / "whole", text)
    return SimpleNamespace(model=model, width=width, trainer=trainer, text=text,
                           ckpt=root / "whole" / "ckpt")


@pytest.mark.parametrize("step", [13, 26], ids=["after-width", "after-width-and-depth"])
def test_a_widened_checkpoint_resumes_exactly_into_the_model_built_narrow(step, whole_fit,
                                                                          tmp_path):
    model, width, trainer = whole_fit.model, whole_fit.width, whole_fit.trainer
    assert width.widened_step == 12  # 12/40 >= 0.3; the growth at 24/40 >= 0.6
    again, resumed, other = _resumable_fit(tmp_path / "again", whole_fit.text,
                                           str(whole_fit.ckpt / f"step={step}.ckpt"))
    assert resumed.widened_step == 12 and resumed.widening is None  # widened by the checkpoint
    whole, part = model.state_dict(), again.state_dict()
    assert whole.keys() == part.keys()
    grown = [k for k in whole if k.startswith("esper_slots.blocks__0+1.seed.")]
    assert sum(whole[k].numel() for k in grown) == sum(  # a block grew, a wide one
        p.numel() for p in _native().blocks[0].parameters())
    assert all(torch.equal(whole[k], part[k]) for k in whole if torch.is_tensor(whole[k]))
    assert [g["lr"] for g in other.optimizers[0].param_groups] == [
        g["lr"] for g in trainer.optimizers[0].param_groups]


def test_a_widened_hugging_face_model_goes_back_at_its_width(text_file, tmp_path):
    from transformers import AutoModelForCausalLM

    lm = user_model("gpt2")
    width = WidthGrowthCallback(at=0.5, growth=WidthGrowth(factor=2), module="model")
    trainer = _trainer(tmp_path, [width], max_steps=6, limit_val_batches=0)
    trainer.fit(lm, datamodule=_text_dm(text_file))
    assert width.widened_step == 3
    assert materialize(lm) == []  # no depth growth: nothing to move
    lm.model.save_pretrained(tmp_path / "wide")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "wide").eval()
    assert (again.config.n_embd, again.config.n_head) == (64, 8)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    narrow = user_model("gpt2")  # the hook widens the Hugging Face model inside to load
    width.setup(trainer, narrow, "validate")
    narrow.load_state_dict(lm.state_dict())
    width.teardown(trainer, narrow, "validate")
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, lm.eval()(idx))
        assert torch.equal(narrow.eval()(idx), lm(idx))


class ScheduledNanoGPT(NanoGPT):
    """The nanoGPT with an LR scheduler: the rate halves every step."""

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule,
                                                         "interval": "step"}}


def test_lr_scale_divides_the_matrices_groups_rate_its_base_and_its_schedulers(
        text_file, tmp_path):
    torch.manual_seed(0)
    width = WidthGrowthCallback(at=0.5, lr_scale=0.5)
    trainer = _trainer(tmp_path, [width], max_steps=6, limit_val_batches=0)
    trainer.fit(ScheduledNanoGPT(), datamodule=_text_dm(text_file))
    (config,) = trainer.lr_scheduler_configs
    matrices, vectors = trainer.optimizers[0].param_groups  # nanoGPT's decayed, not decayed
    assert config.scheduler.base_lrs == [1.5e-3, 3e-3]
    assert matrices["lr"] == 1.5e-3 * 0.5 ** 6 and vectors["lr"] == 3e-3 * 0.5 ** 6


def test_lr_scale_holds_under_a_budgets_schedule(text_file, tmp_path):
    narrow = _cost(user_model("nanogpt"))
    width = WidthGrowthCallback(at=0.5, lr_scale=0.25)
    budget = ComputeBudget(12 * narrow, lr_schedule="cosine")
    trainer = _trainer(tmp_path, [width, budget])
    trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
    matrices, vectors = trainer.optimizers[0].param_groups
    assert (matrices["initial_lr"], vectors["initial_lr"]) == (3e-3 * 0.25, 3e-3)
    assert matrices["lr"] / vectors["lr"] == pytest.approx(0.25, rel=1e-12)


# --- refusals, one line each --------------------------------------------------------------------
@pytest.mark.parametrize("at", [0, 0.0, 1, 1.5, -0.1, True, "0.5", math.nan])
def test_an_at_outside_the_run_is_refused(at):
    with pytest.raises(ValueError) as err:
        WidthGrowthCallback(at=at)
    assert str(err.value) == (f"WidthGrowthCallback at must be a fraction of the run in (0, 1) "
                              f"(the model widens at the first training step past it), got {at!r}")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lr_scale": 0}, "lr_scale must be a number > 0 (1: the rates stay; 1/factor: the "
                      "μP-style rule), got 0"),
    ({"lr_scale": math.inf}, "lr_scale must be a number > 0"),
    ({"module": ""}, "module must be a submodule path (e.g. 'model') or None"),
    ({"growth": 2}, "growth must be a WidthGrowth or None, got int"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(
            ")", r"\)")):
        WidthGrowthCallback(at=0.5, **kwargs)


def _refused(tmp_path: Path, text_file: Path, callbacks, model=None, **kwargs) -> tuple[str, int]:
    trainer = _trainer(tmp_path, callbacks, **kwargs)
    with pytest.raises(MisconfigurationException) as err:
        trainer.fit(model or user_model("nanogpt"), datamodule=_text_dm(text_file))
    assert "\n" not in str(err.value)
    return str(err.value), trainer.global_step


def test_a_run_without_a_step_past_at_is_refused_at_its_start(text_file, tmp_path):
    message, step = _refused(tmp_path, text_file, [WidthGrowthCallback(at=0.95)], max_steps=10)
    assert message == ("WidthGrowthCallback(at=0.95) would widen before step 10, and the run has "
                       "10 (max_steps=10, max_epochs=-1): no training step past at; lower at or "
                       "train longer")
    assert step == 0


def test_a_run_of_unknown_length_is_refused(text_file, tmp_path):
    message, _ = _refused(tmp_path, text_file, [WidthGrowthCallback(at=0.5)], max_steps=-1)
    assert message.startswith("WidthGrowthCallback(at=0.5) needs the run's length; set max_steps")


def test_a_budget_too_short_is_refused_at_its_first_step(text_file, tmp_path):
    narrow = _cost(user_model("nanogpt"))
    message, step = _refused(tmp_path, text_file,
                             [WidthGrowthCallback(at=0.9), ComputeBudget(1.5 * narrow)])
    assert message == (f"WidthGrowthCallback(at=0.9) would widen before step 2, and the budget "
                       f"({1.5 * narrow:g} FLOPs) allows about 2 steps at the narrow cost: no "
                       "training step past at; lower at or train longer")
    assert step == 1


def test_a_budget_the_depth_growth_cannot_finish_after_the_widening_is_refused(
        text_file, tmp_path):
    # 40 narrow steps; after tau 0.5 a wide (2x: 4-fold matrices) four-block (4-fold) step costs
    # up to 16 narrow ones: about 1 step left where the depth growth needs 3. Depth alone (the
    # MorphogenesisCallback's own check: 4-fold, 5 steps left) would pass it.
    narrow = _cost(user_model("nanogpt"))
    controller = StackController(tau=0.5, operator="identity")
    morpho = MorphogenesisCallback(controller, growth=DepthGrowth("blocks", blocks=3))
    message, step = _refused(tmp_path, text_file, [WidthGrowthCallback(at=0.2), morpho,
                                                   ComputeBudget(40 * narrow)])
    assert message == ("WidthGrowthCallback(at=0.2) with StackController(tau=0.5): after the "
                       "widening and the growth a step costs up to 16x the first, so the budget "
                       "leaves about 1 steps after tau and the depth growth needs >= 3; lower "
                       "tau or raise the budget")
    assert step == 1 and controller.decisions_after_tau(1) == 3


@pytest.mark.parametrize(("controller", "order", "message"), [
    (HeuristicController(), "width-first", "WidthGrowthCallback beside a MorphogenesisCallback "
     "needs a StackController, whose tau says when its seeds live; HeuristicController may hold "
     "a seed when the model widens, which width growth does not widen; accepted: "
     "StackController(tau > 0.5)"),
    (StackController(tau=0.5), "width-first", "WidthGrowthCallback(at=0.5) falls at or after "
     "StackController(tau=0.5), when its growth seed is in its slot (live, then fossilized), "
     "which width growth does not widen; accepted: at < tau (widen first: the new blocks are "
     "made from the widened ones)"),
    (StackController(tau=0.7), "depth-first", "WidthGrowthCallback must come before "
     "MorphogenesisCallback in the Trainer's callbacks (found at positions 1 and 0), so a "
     "widening and a germination due at one step widen first: list the width growth first"),
])
def test_depth_growth_that_would_hold_a_seed_at_the_widening_is_refused(
        controller, order, message, text_file, tmp_path):
    width = WidthGrowthCallback(at=0.5)
    morpho = MorphogenesisCallback(controller, growth=DepthGrowth("blocks", blocks=1))
    callbacks = [width, morpho] if order == "width-first" else [morpho, width]
    assert _refused(tmp_path, text_file, callbacks, max_steps=10) == (message, 0)


def test_a_module_that_cannot_be_widened_is_refused_at_setup(text_file, tmp_path):
    message, _ = _refused(tmp_path, text_file, [WidthGrowthCallback(at=0.5)], model=UserModule(),
                          max_steps=10)
    assert message.startswith("WidthGrowthCallback: WidthGrowth(stack=None) finds no stack of "
                              "same-shape blocks in UserModule")
    message, _ = _refused(tmp_path, text_file, [WidthGrowthCallback(at=0.5, module="model")],
                          max_steps=10)
    assert message == ("WidthGrowthCallback module='model' is not a submodule of NanoGPT; "
                       "accepted: a path from it (its children: tok_emb, pos_emb, blocks, ln_f, "
                       "head) or None")


def test_a_fit_that_ends_before_at_warns_that_nothing_widened(text_file, tmp_path):
    class StopAtTwo(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trainer.should_stop = trainer.global_step >= 2

    width = WidthGrowthCallback(at=0.5)
    trainer = _trainer(tmp_path, [width, StopAtTwo()], max_steps=10, limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"the fit ended at step 2, before at: the model was "
                      "not widened"):
        trainer.fit(user_model("nanogpt"), datamodule=_text_dm(text_file))
    assert width.widened_step is None
