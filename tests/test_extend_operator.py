"""A user's growth operator from outside the package (docs/how-to/extend.md, "Your own growth
operator"): one build function and one `register_operator` call in the user's module, chosen by
name by `StackController` (and by the lab's ``stack:K@TAU:NAME``), grown in a real Trainer run
of a user's nanoGPT; its contract (``preserves_function``) holds at the step it is born, and the
new block trains."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from user_models import user_model

from esper_lightning.app.compare.stack_arms import parse_stack
from esper_lightning.blueprints import scratch_registry
from esper_lightning.blueprints.growth import (
    GrowthOperator,
    GrowthSite,
    clone_block,
    register_operator,
    scratch_operators,
)
from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import StackController
from esper_lightning.core import DepthGrowth
from esper_lightning.data import TextDataModule

NAME = "scaled_copy"


# --- the user's module: the operator and its one registration ----------------------------------
class ScaledResidual(nn.Module):
    """``x + scale * (block(x) - x)``: a block's residual update on a per-channel gain that
    starts at zero, so the new block returns its input at birth."""

    def __init__(self, block: nn.Module, width: int) -> None:
        super().__init__()
        self.block = block
        self.scale = nn.Parameter(torch.zeros(width))

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> Tensor:
        return x + self.scale * (self.block(x, *args, **kwargs) - x)


def scaled_copy(source: nn.Module, site: GrowthSite) -> nn.Module:
    """A copy of the source block behind a zero gain."""
    return ScaledResidual(clone_block(source), site.width)


@pytest.fixture
def user_operator() -> Iterator[GrowthOperator]:
    """The user's one registration, undone after the test."""
    with scratch_registry(), scratch_operators():
        yield register_operator(GrowthOperator(
            NAME, scaled_copy, preserves_function=True, copies_weights=True,
            description="copies of the blocks before the slot behind a zero gain"))


# --- a tiny run ---------------------------------------------------------------------------------
class Probe(L.Callback):
    """The model's logits on a fixed batch at each training batch's start, and whether the
    growth slot holds a seed then (with its alpha): listed before the `MorphogenesisCallback`
    it sees the model before that step's decision, after it the model that step trains."""

    def __init__(self, x: Tensor, morpho: MorphogenesisCallback, slot_id: str) -> None:
        self.x, self.morpho, self.slot_id = x, morpho, slot_id
        self.logits: dict[int, Tensor] = {}
        self.alpha: dict[int, float | None] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        with torch.no_grad():
            self.logits[trainer.global_step] = pl_module(self.x)
        slot = self.morpho.engine.slots[self.slot_id]
        self.alpha[trainer.global_step] = None if slot.seed is None else slot.alpha


def test_stack_controller_grows_the_users_operator_by_name_and_it_keeps_its_contract(
        user_operator, text_file: Path, tmp_path):
    assert parse_stack(f"2@0.5:{NAME}") == (2, (0.5,), NAME)  # the lab's arm names it too
    controller = StackController(tau=0.5, operator=NAME)
    assert controller.blueprint == f"block_{NAME}"
    model, slot_id = user_model("nanogpt"), "blocks.0+1"
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    morpho = MorphogenesisCallback(controller, growth=DepthGrowth("blocks", blocks=1),
                                   rng_seed=5)
    before, after = Probe(x, morpho, slot_id), Probe(x, morpho, slot_id)
    trainer = L.Trainer(callbacks=[before, morpho, after], max_steps=12, max_epochs=-1,
                        limit_val_batches=0, default_root_dir=tmp_path, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=TextDataModule(text_file, block_size=16, batch_size=8,
                                                 rng_seed=1))
    assert [(e.slot_id, e.kind, e.blueprint) for e in morpho.engine.events] == [
        (slot_id, "germinated", f"block_{NAME}"), (slot_id, "fossilized", f"block_{NAME}")]
    born = min(step for step, alpha in after.alpha.items() if alpha is not None)
    assert born == 6  # the first step at or past tau = 0.5 of 12
    # preserves_function: at the step it is born the model computes what it did before the
    # decision, bit for bit, and the seed blends at once (alpha 1 from that step).
    assert before.alpha[born] is None and after.alpha[born] == 1.0
    assert torch.equal(before.logits[born], after.logits[born])
    slot = morpho.engine.slots[slot_id]
    (grown,) = slot.seed
    assert isinstance(grown, ScaledResidual)
    assert morpho.engine.seed_params == sum(p.numel() for p in model.blocks[0].parameters()) + 32
    # The new block trained: its gain left zero, and the model now depends on it.
    assert grown.scale.abs().max() > 0
    with torch.no_grad():
        trained = model(x)
        grown.scale.zero_()
        assert not torch.allclose(model(x), trained)
