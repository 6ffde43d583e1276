"""GovernorCallback with a real lightning.Trainer."""

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset
from user_models import VOCAB, NanoGPT

from esper_lightning.callbacks import GovernorCallback, MorphogenesisCallback, WidthGrowthCallback
from esper_lightning.controllers import ScriptedController, StackController, StaticController
from esper_lightning.core.actions import Action, LifecycleOp, Tempo
from esper_lightning.core.depth import DepthGrowth
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.hosts import CifarCNNHost

FAST_GATES = GateConfig(min_training_epochs=1)
NAN_EPOCH, NAN_BATCH = 8, 2


class InjectNaN(Callback):
    """Poisons a host weight once, mid-epoch."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == NAN_EPOCH and batch_idx == NAN_BATCH:
            with torch.no_grad():
                pl_module.blocks[0].conv.weight[0, 0, 0, 0] = float("nan")


class CheckRestore(Callback):
    """Right after a rollback, compares the model with the governor's snapshot."""

    def __init__(self, governor: GovernorCallback) -> None:
        self.governor = governor
        self.seen = 0
        self.mismatches: list[str] = []
        self.param_ids: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.governor.rollbacks == self.seen:
            return
        self.seen = self.governor.rollbacks
        state = pl_module.state_dict()
        snapshot = self.governor.snapshot
        self.mismatches = [k for k, v in snapshot.tensors.items() if not torch.equal(state[k], v)]
        self.param_ids = [id(p) for p in pl_module.blocks.parameters()]


def _trainer(tmp_path: Path, epochs: int, callbacks, **kwargs) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs, default_root_dir=tmp_path, callbacks=callbacks,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        **{"logger": False, **kwargs},
    )


def test_nan_mid_epoch_rolls_back_prunes_live_keeps_fossil(cifar_dir, tmp_path):
    torch.manual_seed(0)
    grow = lambda slot, bp: Action(LifecycleOp.GERMINATE, slot, blueprint=bp, tempo=Tempo.FAST)  # noqa: E731
    script = ScriptedController({
        0: grow(0, "conv_light"), 1: Action(LifecycleOp.ADVANCE, 0),
        2: Action(LifecycleOp.ADVANCE, 0), 5: Action(LifecycleOp.ADVANCE, 0),
        6: Action(LifecycleOp.FOSSILIZE, 0), 7: grow(1, "norm"),
    })
    governor = GovernorCallback(num_classes=10)
    probe = CheckRestore(governor)
    morpho = MorphogenesisCallback(script, slots=["r0c1", "r0c2"], gate_config=FAST_GATES)
    logger = TensorBoardLogger(tmp_path, name="tb", version=0)
    host = CifarCNNHost("baseline", slots=["r0c1", "r0c2"])
    ids_before = [id(p) for p in host.blocks.parameters()]
    trainer = _trainer(tmp_path, 10, [InjectNaN(), governor, morpho, probe], logger=logger)
    trainer.fit(host, datamodule=CIFAR10DataModule(cifar_dir, batch_size=16))

    assert governor.rollbacks == 1
    assert probe.mismatches == [] and probe.param_ids == ids_before
    assert host.slots["r0c1"].stage == SeedStage.FOSSILIZED
    assert host.slots["r0c2"].state.prune_reason == "governor_nan"
    assert any(k.startswith("slots.r0c1.seed.") for k in governor.snapshot.tensors)
    assert all(torch.isfinite(p).all() for p in host.parameters())
    assert torch.isfinite(trainer.callback_metrics["train_loss"])
    logger.experiment.flush()
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    rollbacks = [e.value for e in events.Scalars("governor/rollbacks")]
    assert rollbacks[0] == 0.0 and rollbacks[-1] == 1.0


def test_no_rollback_on_a_normal_run(cifar_dir, tmp_path):
    torch.manual_seed(0)
    governor = GovernorCallback(num_classes=10)
    morpho = MorphogenesisCallback(StaticController(), slots=["r0c1"])
    trainer = _trainer(tmp_path, 4, [governor, morpho])
    trainer.fit(CifarCNNHost("baseline"), datamodule=CIFAR10DataModule(cifar_dir, batch_size=16))
    assert governor.rollbacks == 0
    assert len(governor.governor.history) == 4


def test_a_monitor_never_logged_is_warned_about_naming_the_option(cifar_dir, tmp_path):
    torch.manual_seed(0)
    governor = GovernorCallback(num_classes=10, monitor="val/loss")
    trainer = _trainer(tmp_path, 1, [governor])
    with pytest.warns(UserWarning, match=(
            r"^GovernorCallback: monitor 'val/loss' is not logged, so the lobotomy and "
            r"divergence rules are off; logged: \[.*'val_loss'.*\] \(name your validation loss "
            r"with GovernorCallback\(monitor=\.\.\.\)\)$")):
        trainer.fit(CifarCNNHost("baseline"),
                    datamodule=CIFAR10DataModule(cifar_dir, batch_size=16))


@pytest.mark.parametrize("every", [1, 3])
def test_governor_alone_rolls_back_a_plain_host(cifar_dir, tmp_path, every):
    torch.manual_seed(0)
    governor = GovernorCallback(check_every_n_steps=every)
    host = CifarCNNHost("baseline")
    trainer = _trainer(tmp_path, NAN_EPOCH + 2, [InjectNaN(), governor])
    trainer.fit(host, datamodule=CIFAR10DataModule(cifar_dir, batch_size=16))
    assert governor.rollbacks == 1
    assert all(torch.isfinite(p).all() for p in host.parameters())


def test_state_round_trip():
    governor = GovernorCallback()
    for loss in (2.0, 1.8, 1.7):
        governor.governor.check_validation(loss)
    other = GovernorCallback()
    other.load_state_dict(governor.state_dict())
    assert other.governor.history == governor.governor.history


def test_a_fresh_fit_forgets_the_last_fits_losses_and_a_resumed_one_keeps_them(cifar_dir,
                                                                                  tmp_path):
    torch.manual_seed(0)
    governor = GovernorCallback(num_classes=10)
    dm = CIFAR10DataModule(cifar_dir, batch_size=16)
    _trainer(tmp_path, 2, [governor], limit_train_batches=1).fit(CifarCNNHost("baseline"),
                                                                  datamodule=dm)
    assert len(governor.governor.history) == 2
    _trainer(tmp_path, 1, [governor], limit_train_batches=1).fit(CifarCNNHost("baseline"),
                                                                  datamodule=dm)
    assert len(governor.governor.history) == 1  # only this fit's validation loss
    saved = governor.state_dict()
    governor.load_state_dict(saved)  # what a resumed fit does before on_fit_start
    governor.on_fit_start(None, None)
    assert list(governor.governor.history) == saved["governor"]["history"] != []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"check_every_n_steps": 1.5}, "check_every_n_steps must be an int >= 1, got 1.5"),
    ({"check_every_n_steps": float("nan")}, "check_every_n_steps must be an int >= 1, got nan"),
    ({"check_every_n_steps": True}, "check_every_n_steps must be an int >= 1, got True"),
    ({"monitor": None}, "monitor must name the logged validation loss, got None"),
])
def test_a_bad_cadence_or_monitor_is_refused_at_construction(kwargs, message):
    # A NaN cadence was accepted and checked no step (`x % nan` is never 0).
    with pytest.raises(ValueError) as failure:
        GovernorCallback(**kwargs)
    assert str(failure.value) == message


@pytest.mark.parametrize("num_classes", [0, 1, -3, 2.5, True])
def test_a_class_count_the_lobotomy_rule_cannot_use_is_refused_at_construction(num_classes):
    # Once accepted silently (and only failing at the first validation, or never).
    with pytest.raises(ValueError) as failure:
        GovernorCallback(num_classes=num_classes)
    assert str(failure.value) == (f"num_classes must be an int >= 2 (classes or vocabulary "
                                  f"size) or None (lobotomy rule off), got {num_classes!r}")
    assert GovernorCallback(num_classes=None).num_classes is None


def test_a_governor_listed_after_the_growth_callback_is_refused_at_setup(cifar_dir, tmp_path):
    governor = GovernorCallback(num_classes=10)
    morpho = MorphogenesisCallback(StaticController(), slots=["r0c1"])
    trainer = _trainer(tmp_path, 1, [morpho, governor])
    with pytest.raises(MisconfigurationException) as failure:
        trainer.fit(CifarCNNHost("baseline", slots=["r0c1"]),
                    datamodule=CIFAR10DataModule(cifar_dir, batch_size=16))
    assert str(failure.value) == (
        "GovernorCallback must come before MorphogenesisCallback in the Trainer's callbacks "
        "(found at positions 1 and 0), so a diverged epoch is rolled back before the controller "
        "decides: list the governor first")
    assert trainer.global_step == 0


class PoisonedLoss(NanoGPT):
    """A user's GPT whose loss is NaN at one step: the host's divergence, not a seed's."""

    def __init__(self, nan_step: int) -> None:
        super().__init__(n_layer=1)
        self.nan_step = nan_step

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step == self.nan_step else loss


def _token_loaders() -> tuple[DataLoader, DataLoader]:
    tokens = torch.randint(0, VOCAB, (64, 17), generator=torch.Generator().manual_seed(0))
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    return DataLoader(data, batch_size=8), DataLoader(data, batch_size=8)


@pytest.mark.parametrize("growth", ["depth", "width"])
def test_a_rollback_after_growth_restores_the_grown_model(growth, tmp_path):
    """A NaN a few steps after a mid-epoch growth (a fossilized block; a widening) rolls back
    once to a snapshot of the grown model: the fit goes on finite. Before the governor
    snapshotted at a structural change, the new fossil kept its NaN weights (a rollback at
    every later step) and a widened model no longer fit its snapshot."""
    torch.manual_seed(0)
    model = PoisonedLoss(nan_step=7)
    governor = GovernorCallback()
    grow = (MorphogenesisCallback(StackController(0.1, "identity"),
                                  growth=DepthGrowth("blocks", blocks=1)) if growth == "depth"
            else WidthGrowthCallback(0.3))
    grown_at_nan: list[bool] = []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == model.nan_step:
                grown_at_nan.append(grow.fossils == 1 if growth == "depth"
                                    else grow.widened_step is not None)

    trainer = _trainer(tmp_path, 3, [governor, grow, Watch()], max_steps=20,
                       num_sanity_val_steps=0)
    trainer.fit(model, *_token_loaders())
    assert grown_at_nan == [True]  # the NaN came after the growth, in the grown model's step
    assert governor.rollbacks == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert trainer.global_step == 20


@pytest.mark.parametrize("healthy", [True, False])
def test_a_new_fossil_is_snapshotted_before_its_first_step_only_while_healthy(healthy, tmp_path):
    """While anomalies are being counted the state may be diverging: a new fossil is then not
    snapshotted (the older snapshot restores around it); healthy, it is, before the first step
    that trains it. (A widening is snapshotted either way: the old snapshot cannot fit it.)"""
    torch.manual_seed(0)
    model, governor = NanoGPT(n_layer=1), GovernorCallback()
    grow = MorphogenesisCallback(StackController(0.1, "identity"),
                                 growth=DepthGrowth("blocks", blocks=1))
    seen: list[tuple[int, int, object]] = []  # (step, fossils, snapshot) at each batch start

    class Watch(Callback):
        def on_train_start(self, trainer, pl_module):
            if not healthy:
                governor.governor._consecutive = 1  # as after one anomalous validation

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append((trainer.global_step, grow.fossils, governor.snapshot))

    trainer = _trainer(tmp_path, 1, [governor, grow, Watch()], max_steps=7,
                       num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(model, *_token_loaders())
    born = next(i for i, (_, fossils, _) in enumerate(seen) if fossils == 1)
    after = seen[-1][2]
    assert 0 < born < len(seen) - 1 and seen[born][2] is seen[0][2]  # nothing taken before
    if healthy:
        assert after is not seen[0][2]
        assert any(".seed." in key for key in after.tensors)  # the fossil's weights held
    else:
        assert after is seen[0][2]


def test_a_divergence_not_yet_read_is_rolled_back_before_a_widening(tmp_path):
    """With check_every_n_steps=4 a NaN at step 5 was still unread when the model widened at
    step 6: the widening met NaN weights and failed with a misleading message. The governor
    reads pending losses at each batch start until the widening, and rolls back first."""
    torch.manual_seed(0)
    model, governor = PoisonedLoss(nan_step=5), GovernorCallback(check_every_n_steps=4)
    width = WidthGrowthCallback(0.3)
    trainer = _trainer(tmp_path, 3, [governor, width], max_steps=20, num_sanity_val_steps=0)
    trainer.fit(model, *_token_loaders())
    assert governor.rollbacks == 1 and width.widened_step == 6
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_governor_listed_after_the_width_callback_is_refused_at_setup(tmp_path):
    trainer = _trainer(tmp_path, 1, [WidthGrowthCallback(0.3), GovernorCallback()], max_steps=2)
    with pytest.raises(MisconfigurationException, match=r"^GovernorCallback must come before "
                                                        r"WidthGrowthCallback .*positions 1 and 0"):
        trainer.fit(NanoGPT(n_layer=1), *_token_loaders())
