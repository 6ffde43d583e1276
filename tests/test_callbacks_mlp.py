"""A user's MLP in a plain Trainer: linear slots inferred from ``[B, D]`` activations, grown end
to end (germinate, blend, fossilize; counterfactual; resume; load and export), and the models the
callback cannot measure refused at fit start in one line."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import ClassifierSteps
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from esper_lightning import load_grown
from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import GrowerController, HeuristicConfig, HeuristicController
from esper_lightning.core import SeedStage, export
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.errors import ConfigError

SLOT = "net.2"  # after the first ReLU: activations [B, 32]


class MLPModule(ClassifierSteps):
    """A user's MLP classifier on 16 features; it imports nothing from esper_lightning."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, 4))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class RegressionModule(MLPModule):
    """Predicts one number per sample: nothing the counterfactual can count as right."""

    def __init__(self) -> None:
        super().__init__()
        self.net[-1] = nn.Linear(32, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x).squeeze(1), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x).squeeze(1), y))


def _loaders(regression: bool = False) -> tuple[DataLoader, DataLoader]:
    """Four Gaussian blobs in 16 dimensions (or a linear target), 128 train / 64 validation."""
    generator = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(4, 16, generator=generator)
    labels = torch.arange(192) % 4
    x = centres[labels] + torch.randn(192, 16, generator=generator)
    y = x.sum(dim=1) if regression else labels
    train = TensorDataset(x[:128], y[:128])
    val = TensorDataset(x[128:], y[128:])
    # Unshuffled: a resumed fit sees the batches a straight one does.
    return DataLoader(train, batch_size=32), DataLoader(val, batch_size=32)


def _trainer(root: Path, epochs: int, callbacks: list, **kwargs) -> L.Trainer:
    options = {"max_epochs": epochs, "default_root_dir": root, "logger": False,
               "enable_checkpointing": False, "enable_progress_bar": False,
               "enable_model_summary": False, "deterministic": True, **kwargs}
    return L.Trainer(callbacks=callbacks, **options)


def _grow(root: Path, epochs: int, ckpt: str | None = None):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(GrowerController("mlp_bottleneck"), slots=SLOT,
                                     gate_config=GateConfig(min_training_epochs=1))
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_last=True)
    trainer = _trainer(root, epochs, [callback, checkpoint], enable_checkpointing=True)
    module = MLPModule()
    trainer.fit(module, *_loaders(), ckpt_path=ckpt)
    return module, trainer, callback


def test_an_mlp_grows_a_linear_seed_from_germination_to_fossil(tmp_path):
    module, _, callback = _grow(tmp_path, 8)
    slot = callback.engine.slots[SLOT]  # one slot from a string, its topology inferred
    assert (slot.topology, slot.channels) == ("linear", 32)
    assert [e.kind for e in callback.engine.events] == ["germinated", "fossilized"]
    assert slot.stage == SeedStage.FOSSILIZED and slot.state.blueprint == "mlp_bottleneck"
    assert slot.state.metrics.counterfactual_contribution is not None  # measured while blending
    stages = [e.stage for e in callback.engine.timeline]
    assert stages[:3] == ["GERMINATED", "TRAINING", "BLENDING"] and "HOLDING" in stages
    # The seed changed the host's function: the fossil is not the identity it was born as.
    x = _loaders()[1].dataset.tensors[0]
    h = module.net[:2](x)
    assert not torch.allclose(slot.seed(h), h)

    shipped = export(module.eval(), x[:8])  # folded into plain torch
    torch.testing.assert_close(shipped(x[:8]), module(x[:8]), rtol=0, atol=1e-6)
    loaded = load_grown(MLPModule, tmp_path / "ckpt" / "last.ckpt").eval()
    assert torch.equal(loaded(x), module(x))


def test_an_mlp_fit_resumes_exactly(tmp_path):
    straight, _, straight_cb = _grow(tmp_path / "a", 8)
    _, _, first = _grow(tmp_path / "b", 4)
    assert first.engine.slots[SLOT].stage == SeedStage.BLENDING  # mid-ramp at the save
    resumed, _, resumed_cb = _grow(tmp_path / "c", 8, str(tmp_path / "b" / "ckpt" / "last.ckpt"))
    a, b = straight.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        same = a[key] == b[key] if key.endswith("_extra_state") else torch.equal(a[key], b[key])
        assert same, key
    assert straight_cb.state_dict() == resumed_cb.state_dict()


def test_the_heuristic_germinates_its_linear_rotation_in_an_mlp(tmp_path):
    torch.manual_seed(0)
    # Eager, and germinating though no seed can be judged in 2 decisions (finish_by_end off):
    # the test reads which blueprint comes first.
    eager = HeuristicConfig.fixed_timing(min_epochs_before_germinate=0, stabilization_epochs=0,
                                         plateau_epochs_to_germinate=0, finish_by_end=False)
    callback = MorphogenesisCallback(HeuristicController(eager), slots=[SLOT, "net.3"])
    _trainer(tmp_path, 2, [callback], num_sanity_val_steps=0).fit(MLPModule(), *_loaders())
    germinated = [e.blueprint for e in callback.engine.events if e.kind == "germinated"]
    assert germinated[:1] == ["mlp_bottleneck"]


def test_a_grower_of_a_cnn_blueprint_in_an_mlp_fails_at_fit_start(tmp_path):
    callback = MorphogenesisCallback(GrowerController("conv_light"), slots=SLOT)
    trainer = _trainer(tmp_path, 3, [callback])
    with pytest.raises(ConfigError) as failure:
        trainer.fit(MLPModule(), *_loaders())
    assert str(failure.value) == ("grower: blueprint 'conv_light' does not exist for topology "
                                  "'linear'; accepted: norm, mlp_bottleneck, mlp_small, mlp")
    assert trainer.global_step == 0


def test_a_regression_model_is_refused_at_fit_start_naming_what_is_supported(tmp_path):
    # Once: "slot 'net.1' (cnn) needs activations of rank 4", then "pass logits_fn=", which
    # cannot help a model without class logits.
    callback = MorphogenesisCallback(HeuristicController(), slots=SLOT)
    trainer = _trainer(tmp_path, 3, [callback])
    with pytest.raises(MisconfigurationException) as failure:
        trainer.fit(RegressionModule(), *_loaders(regression=True))
    message = str(failure.value)
    assert "\n" not in message and trainer.global_step == 0
    assert message.startswith("MorphogenesisCallback cannot measure RegressionModule: targets "
                              "must be class indices (an integer tensor), got torch.float32; it "
                              "measures classifiers only (logits [B, C], C >= 2, for class-index "
                              "targets [B], or per-token logits [B, T, C] for targets [B, T])")
