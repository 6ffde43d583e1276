"""MorphogenesisCallback with a real lightning.Trainer on a tiny CIFAR-format fixture."""

import logging
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import UserModule, one_line_message
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from torch import nn

from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.callbacks._cadence import run_plan
from esper_lightning.callbacks.morphogenesis import EVENTS_TAG, TIMELINE_TAG
from esper_lightning.controllers import (
    ControllerBase,
    HeuristicConfig,
    HeuristicController,
    ScriptedController,
    StaticController,
)
from esper_lightning.core.actions import Action, AlphaSpeed, LifecycleOp, Tempo
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.optim import SeedOptimConfig, seed_group_names
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.telemetry import STAGE_LEGEND
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.hosts import CifarCNNHost

FAST_GATES = GateConfig(min_training_epochs=1)


def germinate(slot: int = 0, blueprint="conv_light") -> Action:
    return Action(LifecycleOp.GERMINATE, slot, blueprint=blueprint, tempo=Tempo.STANDARD)


def advance(slot: int = 0) -> Action:
    return Action(LifecycleOp.ADVANCE, slot)


class PlainModule(UserModule):
    """A user's module that imports nothing from esper_lightning, its LR on a StepLR schedule."""

    def __init__(self) -> None:
        super().__init__(step_lr=True)


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


def test_without_validation_the_fossilize_gate_fails_closed(cifar_dir, tmp_path):
    torch.manual_seed(0)
    script = ScriptedController({0: germinate(blueprint="norm"), 1: advance(),
                                 2: advance(), 8: advance(), 9: Action(LifecycleOp.FOSSILIZE)})
    callback = MorphogenesisCallback(script, slots=["net.3"], gate_config=FAST_GATES)
    # One training batch an epoch: the gate reads what was measured, not how much was trained.
    trainer = _trainer(tmp_path, 10, [callback], limit_val_batches=0, limit_train_batches=1)
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
    # Two batches an epoch (of 5): a resume that replayed or skipped a batch, or reshuffled an
    # epoch, still moves some weight.
    trainer = _trainer(tmp_path, epochs, [callback, checkpoint], enable_checkpointing=True,
                       limit_train_batches=2)
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


class _SeedsWhere(L.Callback):
    """The devices and dtypes of the seeds' parameters, read while training (Trainer.fit moves
    the model back to the CPU at teardown)."""

    def __init__(self, slots_of) -> None:
        self.slots_of, self.seen = slots_of, set()

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        for slot in self.slots_of(pl_module):
            self.seen.update((p.device.type, p.dtype) for p in slot.seed_parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_16_mixed_on_cuda_with_a_live_seed(cifar_dir, tmp_path):
    torch.manual_seed(0)
    script = ScriptedController({0: germinate(), 1: advance(), 2: advance()})
    callback = MorphogenesisCallback(script, slots=["r0c1"], gate_config=FAST_GATES)
    seeds_where = _SeedsWhere(lambda host: [host.slots["r0c1"]])
    trainer = _trainer(tmp_path, 5, [callback, seeds_where], precision="16-mixed",
                       accelerator="gpu", devices=1, deterministic=False)
    host = CifarCNNHost("baseline", slots=["r0c1"])
    trainer.fit(host, datamodule=_dm(cifar_dir))
    slot = host.slots["r0c1"]
    assert slot.stage == SeedStage.BLENDING and slot.alpha > 0
    # The seed trained on the GPU in float32 (mixed precision keeps fp32 master weights), and
    # left with the host at teardown.
    assert seeds_where.seen == {("cuda", torch.float32)}
    assert all(p.device.type == "cpu" for p in slot.seed_parameters())
    assert all(torch.isfinite(p).all() for p in host.parameters())


def test_bad_configuration_is_refused_at_construction():
    with pytest.raises(ValueError, match="unknown gate mode 'strictt'; accepted: permissive"):
        MorphogenesisCallback(StaticController(), gate_mode="strictt")
    with pytest.raises(ValueError,
                       match="unknown topology 'rnn'; accepted: cnn, transformer, linear or None"):
        MorphogenesisCallback(StaticController(), topology="rnn")
    with pytest.raises(TypeError, match="controller must implement decide"):
        MorphogenesisCallback(object())
    with pytest.raises(TypeError, match=r"^growth must be a DepthGrowth, got int$"):
        MorphogenesisCallback(StaticController(), growth=3)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"controller": StaticController}, "controller must be a controller instance, got the class "
                                       "StaticController; accepted: StaticController(...)"),
    ({"slots": []}, "slots must name one or more modules (e.g. slots=['net.3']), or be None (a "
                    "growth= or a built-in host's slots), got []"),
    ({"slots": [3]}, "slots must name one or more modules"),
    ({"batch_to_xy": 3}, "batch_to_xy must be a function or None, got 3"),
    ({"logits_fn": "head"}, "logits_fn must be a function or None, got 'head'"),
    ({"loss_key": None}, "loss_key must name the logged validation loss (e.g. 'val_loss'), got "
                         "None"),
    ({"rng_seed": "a"}, "rng_seed must be an int >= 0 or None, got 'a'"),
    ({"rng_seed": 1.5}, "rng_seed must be an int >= 0 or None, got 1.5"),
    ({"seed_lr": float("nan")}, "seed lr must be a finite number >= 0 or None, got nan"),
    ({"seed_momentum": 2.0}, "seed momentum must be in [0, 1) or None, got 2.0"),
])
def test_what_would_fail_mid_fit_or_never_act_is_refused_at_construction(kwargs, message):
    """Each was accepted and then failed deep in the fit with another message (a class for an
    instance, an empty slot list) or silently never acted (no validation loss to read)."""
    kwargs = {"controller": StaticController(), **kwargs}
    with pytest.raises((TypeError, ValueError)) as err:
        MorphogenesisCallback(**kwargs)
    assert one_line_message(err).startswith(message)
    MorphogenesisCallback(StaticController(), rng_seed=np.int64(3))  # any integer type


def test_the_keywords_are_a_shorthand_for_one_seeding_config(cifar_dir, tmp_path):
    shorthand = MorphogenesisCallback(StaticController(), slots=["net.3"], gate_mode="strict",
                                      layer_scale_init=0.5, seed_lr=0.2, max_seeds=1)
    whole = MorphogenesisCallback(StaticController(), slots=["net.3"], seeding=SeedingConfig(
        gate_mode="strict", layer_scale_init=0.5, seed_optim=SeedOptimConfig(lr=0.2),
        max_seeds=1))
    assert shorthand.seeding == whole.seeding
    assert MorphogenesisCallback(StaticController()).seeding == SeedingConfig()
    # The layer scale reaches the slots (the callback had no such option before).
    torch.manual_seed(0)
    script = ScriptedController({0: germinate()})
    callback = MorphogenesisCallback(script, slots=["net.3"], layer_scale_init=0.5)
    _trainer(tmp_path, 1, [callback]).fit(PlainModule(), datamodule=_dm(cifar_dir))
    slot = callback.engine.slots["net.3"]
    assert slot.layer_scale_init == 0.5 and torch.all(slot.seed.ls.gamma == 0.5)
    assert callback.engine.seeding.layer_scale_init == 0.5


def test_a_keyword_that_contradicts_seeding_is_refused_in_one_line():
    seeding = SeedingConfig(blend_gradient="detached", seed_optim=SeedOptimConfig(lr=0.1))
    with pytest.raises(ValueError) as err:
        MorphogenesisCallback(StaticController(), seeding=seeding, blend_gradient="through")
    assert str(err.value) == ("MorphogenesisCallback: blend_gradient='through' contradicts "
                              "seeding.blend_gradient='detached'; accepted: one of them, or "
                              "equal values")
    with pytest.raises(ValueError, match=r"seed_lr=0\.3 contradicts seeding\.seed_optim\.lr=0\.1"):
        MorphogenesisCallback(StaticController(), seeding=seeding, seed_lr=0.3)
    both = MorphogenesisCallback(StaticController(), seeding=seeding, blend_gradient="detached",
                                 seed_momentum=0.9)
    assert both.seeding.seed_optim == SeedOptimConfig(lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match="seeding must be a SeedingConfig or None, got dict"):
        MorphogenesisCallback(StaticController(), seeding={"max_seeds": 1})


# --- one callback, several fits ----------------------------------------------------------------
class CountingController(StaticController):
    """Never acts; records the epoch of every report it is asked to decide on."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def decide(self, report):
        self.epochs.append(report.epoch)
        return super().decide(report)


def test_a_reused_callback_decides_every_epoch_of_a_fresh_fit(cifar_dir, tmp_path):
    torch.manual_seed(0)
    controller = CountingController()
    callback = MorphogenesisCallback(controller, slots=["net.3"])
    _trainer(tmp_path, 1, [callback]).fit(PlainModule(), datamodule=_dm(cifar_dir))
    assert controller.epochs == [0]
    controller.epochs.clear()
    _trainer(tmp_path, 3, [callback]).fit(PlainModule(), datamodule=_dm(cifar_dir))
    assert controller.epochs == [0, 1, 2]  # a new model: a new engine, every epoch decided
    assert callback.engine.epoch == 3


# --- the counterfactual's contract with the user's module --------------------------------------
class TupleModule(PlainModule):
    """forward returns (logits, features)."""

    def forward(self, x):
        features = self.net[:-1](x)
        return self.net[-1](features), features

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x)[0], y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x)[0], y))


class NoForwardModule(PlainModule):
    """No forward at all (legal for a LightningModule): the steps call the network."""

    forward = L.LightningModule.forward

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))


class BatchSizeModule(PlainModule):
    """Reads the batch size before the slot and reshapes with it after."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4))
        self.head = nn.Linear(8 * 8 * 8, 10)
        del self.net

    def forward(self, x):
        b = x.shape[0]
        return self.head(self.features(x).reshape(b, -1))  # [B, 512] -> [B, 10]


GROWTH = {0: germinate(), 1: advance(), 2: advance()}  # blending after epoch 2's decision


@pytest.mark.parametrize(
    ("module_cls", "slot", "fix", "broken", "message"),
    [
        (TupleModule, "net.3", {"logits_fn": lambda m, x: m(x)[0]}, {},
         r"cannot measure TupleModule: the forward returned a tuple, not a logits tensor; "
         r"it measures classifiers only \(.*\): pass logits_fn="),
        (NoForwardModule, "net.3", {"logits_fn": lambda m, x: m.net(x)}, {},
         r"cannot measure NoForwardModule: it has no forward\(\); pass logits_fn="),
        (BatchSizeModule, "features.1", {"counterfactual": "separate"},
         {"counterfactual": "fused"},
         r"counterfactual='fused' does not work with BatchSizeModule \(.*\): .*"
         r"pass counterfactual='separate'$"),
    ],
    ids=["tuple", "no_forward", "batch_size"],
)
def test_measurement_works_with_the_right_option_and_fails_early_without(
    cifar_dir, tmp_path, module_cls, slot, fix, broken, message
):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(ScriptedController(GROWTH), slots=[slot],
                                     gate_config=FAST_GATES, **broken)
    trainer = _trainer(tmp_path, 4, [callback])
    with pytest.raises(MisconfigurationException, match=message) as failure:
        trainer.fit(module_cls(), datamodule=_dm(cifar_dir))
    assert "\n" not in str(failure.value)  # one line
    assert trainer.global_step == 0  # in the sanity check, before any training

    callback = MorphogenesisCallback(ScriptedController(GROWTH), slots=[slot],
                                     gate_config=FAST_GATES, **fix)
    # One training batch an epoch: the measurement is the validation's, each epoch a decision.
    _trainer(tmp_path, 4, [callback], limit_train_batches=1).fit(module_cls(),
                                                                 datamodule=_dm(cifar_dir))
    state = callback.engine.slots[slot].state
    assert state.stage == SeedStage.BLENDING
    assert state.metrics.counterfactual_contribution is not None  # measured at epoch 3


class RngRecorder(L.Callback):
    def __init__(self) -> None:
        self.states: list[torch.Tensor] = []

    def on_train_start(self, trainer, pl_module):
        self.states.append(torch.get_rng_state())


def test_without_a_sanity_check_the_measurement_still_fails_before_training(cifar_dir, tmp_path):
    callback = MorphogenesisCallback(StaticController(), slots=["net.3"])
    trainer = _trainer(tmp_path, 1, [callback], num_sanity_val_steps=0)
    with pytest.raises(MisconfigurationException, match="pass logits_fn=") as failure:
        trainer.fit(TupleModule(), datamodule=_dm(cifar_dir))
    assert "\n" not in str(failure.value) and trainer.global_step == 0

    before, after = RngRecorder(), RngRecorder()
    callback = MorphogenesisCallback(StaticController(), slots=["net.3"],
                                     logits_fn=lambda m, x: m(x)[0])
    trainer = _trainer(tmp_path, 1, [before, callback, after], num_sanity_val_steps=0)
    trainer.fit(TupleModule(), datamodule=_dm(cifar_dir))
    assert callback._probed  # measured one validation batch at train start,
    assert torch.equal(before.states[0], after.states[0])  # drawing nothing from the RNG


def test_a_batch_the_default_cannot_read_names_batch_to_xy(cifar_dir, tmp_path):
    class DictBatches(PlainModule):
        def validation_step(self, batch, batch_idx):
            pass

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            return {"image": batch[0].to(device), "label": batch[1].to(device)}

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self(batch["image"]), batch["label"])

    callback = MorphogenesisCallback(StaticController(), slots=["net.3"])
    trainer = _trainer(tmp_path, 1, [callback])
    with pytest.raises(TypeError, match="as \\(inputs, targets\\); pass batch_to_xy="):
        trainer.fit(DictBatches(), datamodule=_dm(cifar_dir))
    assert trainer.global_step == 0
    callback = MorphogenesisCallback(StaticController(), slots=["net.3"],
                                     batch_to_xy=lambda b: (b["image"], b["label"]))
    _trainer(tmp_path, 1, [callback]).fit(DictBatches(), datamodule=_dm(cifar_dir))
    assert callback.engine.epoch == 1


# --- no silent non-growth ---------------------------------------------------------------------
class SlashKeys(PlainModule):
    """Logs its metrics under other names than the callback's defaults."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.log("val/acc", (logits.argmax(1) == y).float().mean())


def _fit_warnings(trainer: L.Trainer, module, dm) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=dm)
    return [str(w.message) for w in caught if "MorphogenesisCallback" in str(w.message)]


@pytest.mark.parametrize("slot", ["net.7", "net"])  # the output layer, the whole network
def test_a_slot_after_the_last_layer_is_refused_at_fit_start(cifar_dir, tmp_path, slot):
    callback = MorphogenesisCallback(StaticController(), slots=[slot])
    trainer = _trainer(tmp_path, 1, [callback])
    with pytest.raises(MisconfigurationException, match=(
            rf"^MorphogenesisCallback: slot '{slot}' comes after PlainModule's last layer \(its "
            r"output is the logits, \(16, 10\)\); accepted: a slot after a layer whose output "
            r"another layer reads$")):
        trainer.fit(PlainModule(), datamodule=_dm(cifar_dir))
    assert trainer.global_step == 0
    inside = MorphogenesisCallback(StaticController(), slots=["net.6"])  # Flatten, then Linear
    _trainer(tmp_path, 1, [inside]).fit(PlainModule(), datamodule=_dm(cifar_dir))
    assert inside.engine.epoch == 1


def test_two_morphogenesis_callbacks_in_one_trainer_are_refused(cifar_dir, tmp_path):
    first = MorphogenesisCallback(StaticController(), slots=["net.3"])
    second = MorphogenesisCallback(StaticController(), slots=["net.6"])
    trainer = _trainer(tmp_path, 1, [first, L.Callback(), second])
    with pytest.raises(MisconfigurationException, match=(
            r"^MorphogenesisCallback: one per Trainer, found 2 \(at positions 0, 2\); give one "
            r"callback every slot \(slots=\[\.\.\.\]\) and its growth \(growth=\.\.\.\)$")):
        trainer.fit(PlainModule(), datamodule=_dm(cifar_dir))
    assert trainer.global_step == 0 and first.engine is None


def test_metric_keys_that_are_never_logged_draw_one_warning_per_fit(cifar_dir, tmp_path):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(HeuristicController(), slots=["net.3"],
                                     train_loss_key="train_loss")
    messages = _fit_warnings(_trainer(tmp_path, 3, [callback]), SlashKeys(), _dm(cifar_dir))
    messages = [m for m in messages if "is never logged" in m]  # not: a run too short to blend
    assert len(messages) == 1
    (message,) = messages
    for option, key in (("loss_key", "val_loss"), ("accuracy_key", "val_acc"),
                        ("train_loss_key", "train_loss")):
        assert f"{option}='{key}' is never logged" in message
    assert "logged keys: ['train/loss', 'val/acc', 'val/loss']" in message
    assert "never germinates" in message

    # A controller that reads no accuracy (a growth schedule) misses none: no word about it.
    callback = MorphogenesisCallback(StaticController(), slots=["net.3"])
    (message,) = _fit_warnings(_trainer(tmp_path, 2, [callback]), SlashKeys(), _dm(cifar_dir))
    assert "loss_key='val_loss' is never logged" in message and "accuracy_key" not in message

    callback = MorphogenesisCallback(StaticController(), slots=["net.3"], loss_key="val/loss",
                                     accuracy_key="val/acc", train_loss_key="train/loss")
    trainer = _trainer(tmp_path, 2, [callback])
    assert _fit_warnings(trainer, SlashKeys(), _dm(cifar_dir)) == []
    assert callback.engine.report().val_loss == pytest.approx(
        float(trainer.callback_metrics["val/loss"]))


class StopAtTrainStart(L.Callback):
    """Ends a fit right after its start-of-training checks (the tests read only those)."""

    def on_train_start(self, trainer, pl_module):
        trainer.should_stop = True


def test_a_run_too_short_for_any_seed_to_blend_is_warned_about(cifar_dir, tmp_path):
    # The user's own incubation of 10 (the heuristic alone would scale it to 2 at this length).
    callback = MorphogenesisCallback(HeuristicController(), slots=["net.3"],
                                     gate_config=GateConfig(min_training_epochs=10))
    trainer = _trainer(tmp_path, 12, [callback, StopAtTrainStart()], limit_train_batches=1,
                       limit_val_batches=1)
    messages = _fit_warnings(trainer, PlainModule(), _dm(cifar_dir))
    # At 12 epochs the default knobs scale to 1 epoch each: germination at epoch 1 at the
    # earliest, then 1 + 10 epochs of incubation before a seed may blend.
    assert messages == [
        "MorphogenesisCallback: max_epochs=12 is too short for any seed to reach blending: the "
        "controller germinates at decision 1 at the earliest (timing knobs at this length: "
        "plateau_epochs_to_germinate=1, min_epochs_before_germinate=1, stabilization_epochs=1, "
        "embargo_epochs_after_prune=1, min_epochs_before_prune=1), then a seed needs 1 decision "
        "to start training and 10 decisions of training before G2 lets it blend, 13 decisions "
        "in all; lower the controller's timing knobs or the incubation "
        "(timing=SeedTiming(incubation=...)), validate more often, or train longer"
    ]
    callback = MorphogenesisCallback(HeuristicController(), slots=["net.3"],
                                     gate_config=GateConfig(min_training_epochs=9))
    trainer = _trainer(tmp_path, 12, [callback, StopAtTrainStart()], limit_train_batches=1,
                       limit_val_batches=1)
    assert _fit_warnings(trainer, PlainModule(), _dm(cifar_dir)) == []


def test_a_run_bounded_by_max_steps_has_its_length_in_epochs(cifar_dir, tmp_path):
    # Trainer(max_steps=...) leaves max_epochs at -1: the run's length comes from the steps and
    # the batches per epoch (5 here: 80 images in batches of 16), so the heuristic's timing is
    # scaled to it and a run too short is warned about (once silently the 50-epoch timing).
    seen = []
    callback = MorphogenesisCallback(Recording(seen), slots=["net.3"])
    trainer = _trainer(tmp_path, None, [callback], max_steps=60, limit_val_batches=1)
    messages = _fit_warnings(trainer, PlainModule(), _dm(cifar_dir))
    assert trainer.max_epochs == -1 and seen == [12] * 12  # 60 steps / 5 per epoch
    assert messages == [
        "MorphogenesisCallback: a run of 12 decisions (60 steps, one per epoch; max_steps=60, 5 "
        "batches per epoch) is too short for any seed to reach blending: the controller "
        "germinates at decision 1 at the earliest (timing knobs at this length: "
        "plateau_epochs_to_germinate=1, min_epochs_before_germinate=1, stabilization_epochs=1, "
        "embargo_epochs_after_prune=1, min_epochs_before_prune=1), then a seed needs 1 decision "
        "to start training and 10 decisions of training before G2 lets it blend, 13 decisions "
        "in all; lower the controller's timing knobs or the incubation "
        "(timing=SeedTiming(incubation=...)), validate more often, or train longer"
    ]
    # Gradient accumulation: 3 optimizer steps per epoch of 5 batches; max_epochs ends first.
    trainer = _trainer(tmp_path, 4, [StopAtTrainStart()], max_steps=60,
                       accumulate_grad_batches=2)
    trainer.fit(PlainModule(), datamodule=_dm(cifar_dir))
    assert run_plan(trainer, None).decisions == 4
    trainer = _trainer(tmp_path, 100, [StopAtTrainStart()], max_steps=60,
                       accumulate_grad_batches=2)
    trainer.fit(PlainModule(), datamodule=_dm(cifar_dir))
    assert run_plan(trainer, None).decisions == 20


def test_a_run_of_unknown_length_is_warned_about_in_one_line(cifar_dir, tmp_path):
    callback = MorphogenesisCallback(HeuristicController(), slots=["net.3"])
    trainer = _trainer(tmp_path, -1, [callback, StopAtTrainStart()])
    assert _fit_warnings(trainer, PlainModule(), _dm(cifar_dir)) == [
        "MorphogenesisCallback: the run's length is unknown (max_epochs=-1, "
        "max_steps=-1, 5 batches per epoch), so the controller's timing knobs are used as given, "
        "not scaled to the run; set max_epochs, max_steps (with a sized training loader) or a "
        "ComputeBudget"
    ]
    fixed = MorphogenesisCallback(HeuristicController(HeuristicConfig.fixed_timing()),
                                  slots=["net.3"])
    trainer = _trainer(tmp_path, -1, [fixed, StopAtTrainStart()])
    assert _fit_warnings(trainer, PlainModule(), _dm(cifar_dir)) == []  # nothing to scale


class Recording(StaticController):
    """Waits, noting the run length each report carries."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def decide(self, report):
        self.seen.append(report.max_epochs)
        return super().decide(report)

    def earliest_germination(self, max_epochs):
        return HeuristicController().earliest_germination(max_epochs)

    def timing(self, max_epochs):
        return HeuristicController().timing(max_epochs)


class UserGrower(ControllerBase):
    """A user's controller: germinates ``conv_small`` at one epoch, says why, and tells the
    callback how soon it can germinate (the optional hooks of `ControllerBase`)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def decide(self, report):
        if report.epoch == self.epoch:
            self.last_reason = f"my rule fires at epoch {self.epoch}"
            return germinate(blueprint="conv_small")
        self.last_reason = "not my epoch"
        return Action()

    def earliest_germination(self, max_epochs):
        return self.epoch

    def timing(self, max_epochs):
        return {"epoch": self.epoch}


class PlainGrower:
    """The same rule in a plain class with the four required methods only: no hooks."""

    def __init__(self, epoch: int) -> None:
        self.rule = UserGrower(epoch)

    def decide(self, report):
        return self.rule.decide(report)

    def reset(self) -> None:
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state) -> None:
        pass


@pytest.mark.parametrize("kind", [UserGrower, PlainGrower])
def test_a_user_controller_hooks_reach_the_event_log_and_the_warning(kind, cifar_dir, tmp_path):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(kind(1), slots=["net.3"])
    trainer = _trainer(tmp_path, 3, [callback], limit_train_batches=1, limit_val_batches=1)
    messages = _fit_warnings(trainer, PlainModule(), _dm(cifar_dir))
    (event,) = callback.engine.events
    assert (event.epoch, event.kind, event.blueprint) == (1, "germinated", "conv_small")
    if kind is PlainGrower:  # no hooks: no reason, no warning
        assert event.reason == "PlainGrower" and messages == []
        return
    assert event.reason == "UserGrower: my rule fires at epoch 1"
    assert messages == [
        "MorphogenesisCallback: max_epochs=3 is too short for any seed to reach blending: the "
        "controller germinates at decision 1 at the earliest (timing knobs at this length: "
        "epoch=1), then a seed needs 1 decision to start training and 10 decisions of training "
        "before G2 lets it blend, 13 decisions in all; lower the controller's timing knobs or "
        "the incubation (timing=SeedTiming(incubation=...)), validate more often, or train "
        "longer"
    ]


# --- what a user sees: LR tags, TensorBoard pictures, log lines --------------------------------
class MemoryLogger(Logger):
    """Keeps every logged metrics dict (what LearningRateMonitor writes, for one)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.records.append(dict(metrics))


def test_lr_tags_stay_put_and_tensorboard_gets_a_timeline_and_a_layout(cifar_dir, tmp_path,
                                                                        caplog):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(ScriptedController({1: germinate()}), slots=["net.3"])
    memory = MemoryLogger()
    tensorboard = TensorBoardLogger(tmp_path, name="tb", version=0)
    trainer = _trainer(tmp_path, 3, [LearningRateMonitor("epoch"), callback],
                       logger=[memory, tensorboard])
    with caplog.at_level(logging.INFO, logger="esper_lightning"):
        trainer.fit(PlainModule(), datamodule=_dm(cifar_dir))

    lr_records = [r for r in memory.records if any(k.startswith("lr-") for k in r)]
    tags = [sorted(k for k in r if k.startswith("lr-")) for r in lr_records]
    assert tags == [["lr-SGD/host"], ["lr-SGD/host"], ["lr-SGD/host", "lr-SGD/seed/net.3"]]
    assert [r["lr-SGD/host"] for r in lr_records] == [0.05, 0.05, 0.025]  # StepLR(2, 0.5)

    events = EventAccumulator(str(tmp_path / "tb" / "version_0"),
                              size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    (change,) = events.Tensors(f"{EVENTS_TAG}/text_summary")  # the stage by name, as text
    assert change.tensor_proto.string_val[0].decode() == (
        "step 10 (epoch 1): net.3 dormant -> germinated (conv_light)")  # 5 steps an epoch
    images = events.Images(TIMELINE_TAG)
    assert len(images) == 1 and images[0].step == trainer.global_step
    assert images[0].width > 400 and images[0].height > 100
    (layout_event,) = events.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(layout_event.tensor_proto.string_val[0])
    assert [c.title for c in layout.category] == ["morpho net.3"]
    charts = {c.title.split(" (")[0]: list(c.multiline.tag) for c in layout.category[0].chart}
    assert charts == {t: [rf"morpho/net\.3/{t}"] for t in ("alpha", "stage", "contribution")}
    assert f"stage ({STAGE_LEGEND})" in [c.title for c in layout.category[0].chart]
    assert "4 blending" in STAGE_LEGEND and "7 fossilized" in STAGE_LEGEND

    lines = [r.getMessage() for r in caplog.records if r.name.startswith("esper_lightning")]
    assert lines == ["decision 1: net.3 germinated conv_light (ScriptedController)"]
    assert [(e.epoch, e.stage) for e in callback.engine.timeline] == [
        (0, "DORMANT"), (1, "GERMINATED"), (2, "GERMINATED")]


# --- depth growth of models the project did not write, in a Trainer ---------------------------
def _text_dm(text_file: Path) -> L.LightningDataModule:
    from esper_lightning.data import TextDataModule

    return TextDataModule(text_file, block_size=16, batch_size=8, train_blocks=64, val_blocks=16,
                          rng_seed=1)


def _step_flops(kind: str, n_layer: int = 1) -> int:
    from user_models import user_model

    from esper_lightning.core.flops import FlopMeter

    return FlopMeter().training_step(user_model(kind, n_layer),
                                     torch.zeros(8, 16, dtype=torch.long))


def _grow_fit(tmp_path: Path, text_file: Path, *, epochs: int = -1, ckpt_path: str | None = None,
              module: L.LightningModule | None = None, governor: bool = False,
              kind: str = "nanogpt", extra: tuple[L.Callback, ...] = (), **trainer_kwargs):
    from user_models import STACKS, user_model

    from esper_lightning.callbacks import ComputeBudget, GovernorCallback
    from esper_lightning.controllers import StackController
    from esper_lightning.core.depth import DepthGrowth

    torch.manual_seed(0)
    model = module or user_model(kind)
    morpho = MorphogenesisCallback(StackController(tau=(0.25, 0.5), operator="copy"),
                                   growth=DepthGrowth(STACKS[kind], blocks=(1, 2)),
                                   rng_seed=5)
    # 60 steps of the one-block model: 12 decisions, each growth fossilized (4 decisions)
    # before the next begins.
    budget = ComputeBudget(60 * _step_flops(kind), "wsd", warmup_fraction=0.05)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    callbacks = [GovernorCallback()] if governor else []
    trainer = _trainer(tmp_path, epochs, [*callbacks, morpho, budget, saver, *extra],
                       enable_checkpointing=True, **trainer_kwargs)
    trainer.fit(model, datamodule=_text_dm(text_file), ckpt_path=ckpt_path)
    return model, morpho, budget


def test_a_users_model_grows_one_to_two_to_four_under_a_budget_and_resumes_exactly(
        text_file, tmp_path):
    model, morpho, budget = _grow_fit(tmp_path / "whole", text_file)
    events = [(e.slot_id, e.kind, e.blueprint) for e in morpho.engine.events]
    # Each growth at the first step past its tau, blended and fossilized before the next.
    assert events == [("blocks.0+1", "germinated", "block_copy"),
                      ("blocks.0+1", "fossilized", "block_copy"),
                      ("blocks.0+2", "germinated", "block_copy"),
                      ("blocks.0+2", "fossilized", "block_copy")]
    assert morpho.engine.seed_params == 3 * sum(p.numel() for p in model.blocks[0].parameters())
    assert budget.ledger.exhausted and morpho.ledger is budget.ledger
    # Stopped after two epochs (past the first growth), then resumed from the checkpoint.
    stopped = tmp_path / "stopped"
    _, halted, _ = _grow_fit(stopped, text_file, epochs=2)
    assert [(e.slot_id, e.kind, e.blueprint) for e in halted.engine.events] == events[:2]
    again, resumed, resumed_budget = _grow_fit(stopped, text_file,
                                               ckpt_path=str(stopped / "ckpt" / "last.ckpt"))
    assert resumed_budget.spent == budget.spent
    assert [(e.epoch, e.slot_id, e.kind) for e in resumed.engine.events] == [
        (e.epoch, e.slot_id, e.kind) for e in morpho.engine.events]
    whole, part = model.state_dict(), again.state_dict()
    assert whole.keys() == part.keys()
    assert all(torch.equal(whole[k], part[k]) for k in whole if torch.is_tensor(whole[k]))


def test_the_governor_rolls_a_grown_block_back(text_file, tmp_path):
    from user_models import NanoGPT

    class Diverging(NanoGPT):
        """Its embeddings turn NaN once, on the first step that trains a grown block: the host
        diverges before the block (which the engine does not blame: the host handed it the
        NaN), so the governor rolls back."""

        diverged = False

        def training_step(self, batch, batch_idx):
            if self.diverged or not any(s.seed is not None for s in self.esper_slots.values()):
                return super().training_step(batch, batch_idx)
            self.diverged = True
            hook = self.tok_emb.register_forward_hook(lambda m, i, out: out * float("nan"))
            try:
                return super().training_step(batch, batch_idx)
            finally:
                hook.remove()

    torch.manual_seed(0)
    model, morpho, _ = _grow_fit(tmp_path, text_file, module=Diverging(), governor=True)
    pruned = [(e.slot_id, e.reason) for e in morpho.engine.events if e.kind == "pruned"]
    assert model.diverged and pruned
    assert all(reason == "governor_nan" for _, reason in pruned)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the snapshot's weights
    # No optimizer group is left for a pruned seed.
    for name in seed_group_names(morpho.engine.optimizer):
        assert morpho.engine.slots[name.split("/")[1]].seed is not None, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["nanogpt", "gpt2", "llama"])
def test_a_users_model_grows_on_cuda_in_bf16_mixed(kind, text_file, tmp_path):
    from user_models import stack_of

    grown_where = _SeedsWhere(lambda model: model.esper_slots.values())
    model, morpho, budget = _grow_fit(tmp_path, text_file, kind=kind, extra=(grown_where,),
                                      accelerator="gpu", devices=1, precision="bf16-mixed",
                                      deterministic=False)
    assert [e.kind for e in morpho.engine.events] == ["germinated", "fossilized"] * 2
    assert budget.ledger.exhausted
    # The grown blocks trained on the GPU with fp32 master weights (autocast computes in bf16).
    assert grown_where.seen == {("cuda", torch.float32)}
    assert morpho.engine.seed_params == 3 * sum(p.numel() for p in stack_of(model, kind)[0]
                                                .parameters())
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(("kind", "slot"), [("nanogpt", "blocks.0"),
                                            ("gpt2", "model.transformer.h.0")])
def test_a_stacking_controller_without_a_growth_slot_is_refused_at_fit_start(
        kind, slot, text_file, tmp_path):
    from user_models import user_model

    from esper_lightning.controllers import StackController
    from esper_lightning.errors import ConfigError

    morpho = MorphogenesisCallback(StackController(tau=0.5, operator="identity"), slots=[slot])
    trainer = _trainer(tmp_path, 1, [morpho])
    with pytest.raises(ConfigError) as err:
        trainer.fit(user_model(kind), datamodule=_text_dm(text_file))
    assert str(err.value).startswith("stack: no slot of this run is a growth slot, so nothing "
                                     "can grow deeper; accepted: MorphogenesisCallback(growth=")
    assert "\n" not in str(err.value) and trainer.global_step == 0


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_hugging_face_model_grows_under_a_budget_and_saves_at_its_new_depth(
        kind, text_file, tmp_path):
    from transformers import AutoModelForCausalLM
    from user_models import stack_of

    from esper_lightning.core.depth import materialize

    lm, morpho, budget = _grow_fit(tmp_path, text_file, kind=kind)
    assert [e.kind for e in morpho.engine.events] == ["germinated", "fossilized"] * 2
    assert budget.ledger.exhausted
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    lm.eval()
    with torch.no_grad():
        grown = lm(idx)
    materialize(lm)
    assert len(stack_of(lm, kind)) == 4 and lm.model.config.num_hidden_layers == 4
    lm.model.save_pretrained(tmp_path / "grown")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "grown").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, grown)


def test_a_checkpoints_pending_validation_loads_with_or_without_standard_errors():
    """Between a validation and the decision that reads it (decisions every N steps) a
    checkpoint holds the validation: accuracy, loss, contributions and their standard errors
    (`state_dict` writes the four as they are held). A checkpoint written before the standard
    errors holds three and still loads: its contributions are then judged without one."""
    callback = MorphogenesisCallback(StaticController(), slots=["net.3"])
    state = {"controller": callback.controller.state_dict(), "decided_epoch": 0,
             "decided_step": 40, "engine": {}}
    for saved, errors in (([71.25, 0.8, {"net.3": 2.5}, {"net.3": 1.4}], {"net.3": 1.4}),
                          ([71.25, 0.8, {"net.3": 2.5}], {})):
        callback.load_state_dict({**state, "validation": saved})
        assert callback._validation == (71.25, 0.8, {"net.3": 2.5}, errors)  # for the decision


def test_the_state_key_names_the_slots_and_tells_two_callbacks_apart():
    """Lightning keys each callback's checkpoint state by `state_key` (read at every hook):
    two callbacks on different slots have different keys, the same slots the same."""
    first = MorphogenesisCallback(HeuristicController(), slots=["r0c0"])
    assert first.state_key == "MorphogenesisCallback{'slots': ['r0c0']}"
    assert first.state_key != MorphogenesisCallback(HeuristicController(), slots=["r0c1"]).state_key
    assert first.state_key == MorphogenesisCallback(HeuristicController(), slots="r0c0").state_key


class LossRecording(PlainModule):
    """`PlainModule` noting every `training_step` loss."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.losses.append(float(loss))
        return loss


class TrainLossRecording(StaticController):
    """Waits, noting the training loss each report carries."""

    def __init__(self) -> None:
        self.seen: list[float | None] = []

    def decide(self, report):
        self.seen.append(report.train_loss)
        return super().decide(report)


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_reported_training_loss_is_training_steps_under_gradient_accumulation(
        cifar_dir, tmp_path, accumulate):
    """Lightning passes on the loss divided by ``accumulate_grad_batches`` (what it
    backpropagates); the controller's report holds the mean of `training_step`'s own."""
    torch.manual_seed(0)
    controller = TrainLossRecording()
    callback = MorphogenesisCallback(controller, slots=["net.3"])
    module = LossRecording()
    trainer = _trainer(tmp_path, 1, [callback], limit_train_batches=3, limit_val_batches=2,
                       num_sanity_val_steps=0, accumulate_grad_batches=accumulate)
    trainer.fit(module, datamodule=_dm(cifar_dir))
    assert len(module.losses) == 3 and len(controller.seen) == 1
    assert controller.seen[0] == pytest.approx(sum(module.losses) / 3, rel=1e-6)
