"""A user's blueprint from outside the package (docs/how-to/extend.md, "Your own blueprint"):
one registration in the user's own module, germinated by the user's own controller in a real
Trainer run, and trained there; a seed that breaks the slot's shape is refused in one line."""

from __future__ import annotations

from collections.abc import Iterator

import lightning as L
import pytest
import torch
from helpers import ClassifierSteps
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from esper_lightning import blueprints
from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import ControllerBase
from esper_lightning.core import Action, EpochReport, GateConfig, LifecycleOp, SeedStage
from esper_lightning.core.actions import canonicalize

NAME = "user_mix"
#: The gain the user's seed starts with: live at birth, near the identity.
GAMMA = 1e-2


# --- the user's module: a seed, its registration and a controller that grows it ------------------
class ChannelMix(nn.Module):
    """``x + gamma * pw(x)``: a 1x1 channel mix on a small per-channel gain (C^2 + 2C params)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.mix = nn.Conv2d(channels, channels, 1)
        self.gamma = nn.Parameter(torch.full((channels,), GAMMA))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma.view(-1, 1, 1) * self.mix(x)


class GrowMine(ControllerBase):
    """Advance slot 0's seed whenever the masks allow it, else germinate ``user_mix`` there."""

    def decide(self, report: EpochReport) -> Action:
        for op in (LifecycleOp.ADVANCE, LifecycleOp.GERMINATE):
            action = canonicalize(Action(op, slot=0, blueprint=NAME))
            if report.masks.allows(action):
                self.last_reason = f"{op.name.lower()} slot 0"
                return action
        self.last_reason = None
        return Action()


@pytest.fixture
def user_blueprint() -> Iterator[str]:
    """The user's one registration, undone after the test (the table is append-only)."""
    with blueprints.scratch_registry():
        blueprints.register(blueprints.BlueprintSpec(NAME, "cnn", ChannelMix, "x + g*pw(x)"))
        yield NAME


# --- a tiny run ---------------------------------------------------------------------------------
class TinyNet(ClassifierSteps):
    """A user's classifier that names nothing of esper_lightning; the slot goes after ``net.1``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(rng_seed: int) -> DataLoader:
    """32 random 6x6 images whose class is the sign pattern of two pixel sums (learnable)."""
    generator = torch.Generator().manual_seed(rng_seed)
    x = torch.randn(32, 3, 6, 6, generator=generator)
    y = 2 * (x[:, 0].sum((1, 2)) > 0).long() + (x[:, 1].sum((1, 2)) > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=8)


def test_the_users_controller_germinates_the_users_seed_in_a_real_run_and_it_trains(
        user_blueprint, tmp_path):
    assert blueprints.blueprint_index(NAME) == len(blueprints.blueprint_table()) - 1
    torch.manual_seed(0)
    # No ``blueprints=``: the engine allows every registered blueprint of the slot's topology.
    callback = MorphogenesisCallback(GrowMine(), slots=["net.1"],
                                     gate_config=GateConfig(min_training_epochs=1))
    trainer = L.Trainer(max_epochs=4, default_root_dir=tmp_path, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[callback])
    model = TinyNet()
    trainer.fit(model, train_dataloaders=_loader(1), val_dataloaders=_loader(2))
    slot = callback.engine.slots["net.1"]
    # Germinated once by name, at the first decision, then advanced by the user's controller.
    assert [(e.kind, e.blueprint, e.epoch) for e in callback.engine.events] == [
        ("germinated", NAME, 0)]
    assert isinstance(slot.seed, ChannelMix)
    assert slot.stage in (SeedStage.BLENDING, SeedStage.HOLDING) and slot.alpha > 0.0
    assert callback.engine.seed_params == 8 * 8 + 8 + 8  # built at the slot's width (8)
    # Trained: the optimizer stepped its weights away from birth, and the model reads it.
    assert not torch.allclose(slot.seed.gamma, torch.full_like(slot.seed.gamma, GAMMA))
    x = _loader(3).dataset.tensors[0]
    with torch.no_grad():
        grown = model(x)
        slot.seed.gamma.zero_()  # the seed's branch off: the output must change
        assert not torch.allclose(model(x), grown)


class Widen(nn.Module):
    """A seed that doubles the channels: not a seed of a slot that keeps its input's shape."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 2 * channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_a_seed_that_changes_the_shape_is_refused_in_one_line(user_blueprint):
    blueprints.register(blueprints.BlueprintSpec("user_widen", "cnn", Widen, "2C channels"))
    with pytest.raises(blueprints.BlueprintError) as err:
        blueprints.build("user_widen", 8)
    message = str(err.value)
    assert "\n" not in message and "user_widen" in message and "shape" in message
