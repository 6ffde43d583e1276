"""MorphogenesisCallback with a real lightning.Trainer on a tiny CIFAR-format fixture."""

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import HeuristicController, ScriptedController, StaticController
from esper_lightning.core.actions import Action, AlphaSpeed, BlueprintAction, LifecycleOp, Tempo
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.optim import seed_group_names
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.hosts import CifarCNNHost

FAST_GATES = GateConfig(min_training_epochs=1)


def germinate(slot: int = 0, blueprint=BlueprintAction.CONV_LIGHT) -> Action:
    return Action(LifecycleOp.GERMINATE, slot, blueprint=blueprint, tempo=Tempo.STANDARD)


def advance(slot: int = 0) -> Action:
    return Action(LifecycleOp.ADVANCE, slot)


class PlainModule(L.LightningModule):
    """A user's module that imports nothing from esper_lightning."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(16, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def _trainer(tmp_path: Path, epochs: int, callbacks, **kwargs) -> L.Trainer:
    options = {
        "max_epochs": epochs,
        "default_root_dir": tmp_path,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "deterministic": True,
        **kwargs,
    }
    return L.Trainer(callbacks=callbacks, **options)


def _dm(cifar_dir: Path) -> CIFAR10DataModule:
    return CIFAR10DataModule(cifar_dir, batch_size=16, rng_seed=3)


def test_grows_a_seed_in_a_plain_module_and_logs_tensorboard_tags(cifar_dir, tmp_path):
    torch.manual_seed(0)
    script = ScriptedController({0: germinate(), 1: advance(), 2: advance()})
    callback = MorphogenesisCallback(script, slots=["net.3"], gate_config=FAST_GATES)
    logger = TensorBoardLogger(tmp_path, name="tb", version=0)
    trainer = _trainer(tmp_path, 6, [callback], logger=logger)
    module = PlainModule()
    trainer.fit(module, datamodule=_dm(cifar_dir))

    slot = callback.engine.slots["net.3"]
    assert slot.stage == SeedStage.BLENDING and 0 < slot.alpha < 1
    assert "esper_slots.net__3.seed.ls.gamma" in module.state_dict()
    optimizer = trainer.optimizers[0]
    assert seed_group_names(optimizer) == ["seed/net.3"]
    assert optimizer.param_groups[1]["lr"] == optimizer.param_groups[0]["lr"]  # scheduled too
    assert [e.kind for e in callback.engine.events] == ["germinated"]

    logger.experiment.flush()
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"morpho/net.3/alpha", "morpho/net.3/stage", "morpho/net.3/contribution",
            "morpho/seed_params", "morpho/seeds_germinated"} <= tags
    stages = [e.value for e in events.Scalars("morpho/net.3/stage")]
    assert stages[0] == SeedStage.GERMINATED and stages[-1] == SeedStage.BLENDING
    alphas = [e.value for e in events.Scalars("morpho/net.3/alpha")]
    assert alphas == sorted(alphas) and alphas[-1] == pytest.approx(slot.alpha)
    seed_params = events.Scalars("morpho/seed_params")[-1].value
    assert seed_params == sum(p.numel() for p in slot.seed_parameters())


def test_heuristic_on_the_cifar_host_runs_and_measures(cifar_dir, tmp_path):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(HeuristicController(), slots=["r0c1", "r0c2"])
    trainer = _trainer(tmp_path, 3, [callback])
    trainer.fit(CifarCNNHost("baseline"), datamodule=_dm(cifar_dir))
    report = callback.engine.report()
    assert report.epoch == 3 and len(report.accuracy_history) == 3
    assert report.slot_ids == ("r0c1", "r0c2")


def test_refuses_ddp_in_setup(cifar_dir, tmp_path):
    callback = MorphogenesisCallback(StaticController(), slots=["net.3"])
    trainer = _trainer(tmp_path, 1, [callback], strategy="ddp", accelerator="cpu", devices=1)
    try:
        with pytest.raises(MisconfigurationException, match=r"single-device training only.*DDP"):
            trainer.fit(PlainModule(), datamodule=_dm(cifar_dir))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_without_validation_the_fossilize_gate_fails_closed(cifar_dir, tmp_path):
    torch.manual_seed(0)
    script = ScriptedController({0: germinate(blueprint=BlueprintAction.NORM), 1: advance(),
                                 2: advance(), 8: advance(), 9: Action(LifecycleOp.FOSSILIZE)})
    callback = MorphogenesisCallback(script, slots=["net.3"], gate_config=FAST_GATES)
    trainer = _trainer(tmp_path, 10, [callback], limit_val_batches=0)
    trainer.fit(PlainModule(), datamodule=_dm(cifar_dir))
    slot = callback.engine.slots["net.3"]
    assert slot.stage == SeedStage.HOLDING
    assert callback.last_outcome.reason == "G5 failed: counterfactual_measured"


def test_bf16_mixed_with_a_live_seed(cifar_dir, tmp_path):
    torch.manual_seed(0)
    script = ScriptedController({0: germinate(), 1: advance(), 2: advance()})
    callback = MorphogenesisCallback(script, slots=["r0c1"], gate_config=FAST_GATES)
    trainer = _trainer(tmp_path, 5, [callback], precision="bf16-mixed")
    host = CifarCNNHost("baseline", slots=["r0c1"])
    trainer.fit(host, datamodule=_dm(cifar_dir))
    slot = host.slots["r0c1"]
    assert slot.stage == SeedStage.BLENDING and slot.alpha > 0
    assert all(p.dtype == torch.float32 for p in slot.seed_parameters())
    assert all(torch.isfinite(p).all() for p in host.parameters())
    assert torch.isfinite(trainer.callback_metrics["train_loss"])


def _resume_run(cifar_dir: Path, tmp_path: Path, epochs: int, ckpt: str | None = None):
    torch.manual_seed(0)
    script = ScriptedController({
        0: germinate(), 1: advance(), 2: advance(),
        5: Action(LifecycleOp.SET_ALPHA_TARGET, 0, alpha_target=1, alpha_speed=AlphaSpeed.FAST),
    })
    callback = MorphogenesisCallback(script, slots=["net.3"], gate_config=FAST_GATES)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = _trainer(tmp_path, epochs, [callback, checkpoint], enable_checkpointing=True)
    module = PlainModule()
    trainer.fit(module, datamodule=_dm(cifar_dir), ckpt_path=ckpt)
    return module, trainer, callback


def test_resume_continues_exactly(cifar_dir, tmp_path):
    straight, straight_trainer, straight_cb = _resume_run(cifar_dir, tmp_path / "a", 6)
    _, _, first_cb = _resume_run(cifar_dir, tmp_path / "b", 3)
    assert first_cb.engine.slots["net.3"].stage == SeedStage.BLENDING  # mid-ramp at the save
    assert 0 < first_cb.engine.slots["net.3"].alpha < 1
    resumed, resumed_trainer, resumed_cb = _resume_run(
        cifar_dir, tmp_path / "c", 6, ckpt=str(tmp_path / "b" / "ckpt" / "last.ckpt")
    )
    a, b = straight.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        if key.endswith("_extra_state"):
            assert a[key] == b[key], key
        else:
            assert torch.equal(a[key], b[key]), key
    opt_a = straight_trainer.optimizers[0].state_dict()
    opt_b = resumed_trainer.optimizers[0].state_dict()
    assert opt_a["param_groups"] == opt_b["param_groups"]
    for index, state in opt_a["state"].items():
        for name, value in state.items():
            assert torch.equal(value, opt_b["state"][index][name]), (index, name)
    assert straight_cb.state_dict() == resumed_cb.state_dict()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_16_mixed_on_cuda_with_a_live_seed(cifar_dir, tmp_path):
    torch.manual_seed(0)
    script = ScriptedController({0: germinate(), 1: advance(), 2: advance()})
    callback = MorphogenesisCallback(script, slots=["r0c1"], gate_config=FAST_GATES)
    trainer = _trainer(tmp_path, 5, [callback], precision="16-mixed", accelerator="gpu",
                       devices=1, deterministic=False)
    host = CifarCNNHost("baseline", slots=["r0c1"])
    trainer.fit(host, datamodule=_dm(cifar_dir))
    slot = host.slots["r0c1"]
    assert slot.stage == SeedStage.BLENDING and slot.alpha > 0
    assert all(p.is_cuda and p.dtype == torch.float32 for p in slot.seed_parameters())
    assert all(torch.isfinite(p).all() for p in host.parameters())


def test_bad_configuration_is_refused_at_construction():
    with pytest.raises(ValueError, match="unknown gate mode 'strictt'; accepted: permissive"):
        MorphogenesisCallback(StaticController(), gate_mode="strictt")
    with pytest.raises(ValueError, match="unknown topology 'rnn'; accepted: cnn, transformer"):
        MorphogenesisCallback(StaticController(), topology="rnn")
    with pytest.raises(TypeError, match="controller must implement decide"):
        MorphogenesisCallback(object())
