"""One observation for both adapters: the same host seed run through the Fabric env and through
a Lightning Trainer with `MorphogenesisCallback` gives the controller the same reports — the
same cadence of decisions (after each trained epoch), the same gradient-health measurements
and the same new-seed weights — so a policy trained in envs meets what it learned on."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import ScriptedController
from esper_lightning.core.actions import Action, LifecycleOp, Tempo
from esper_lightning.core.counterfactual import VALIDATION_READS
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.data import TensorLoader, load_cifar10
from esper_lightning.data.tensor_loader import normalize
from esper_lightning.envs import EnvSpec, MorphogenesisEnv
from esper_lightning.envs.tasks import VAL_BATCH
from esper_lightning.hosts import CifarCNNHost

RNG_SEED = 1234
EPOCHS = 5
GATES = GateConfig(min_training_epochs=1)
SCRIPT = {
    0: Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light", tempo=Tempo.FAST),
    1: Action(LifecycleOp.ADVANCE, 0),
    2: Action(LifecycleOp.ADVANCE, 0),
}


class _Recorder(ScriptedController):
    """The script, plus every report it was shown."""

    #: It reads the whole report (a script alone reads no validation, and the callback then
    #: measures none: `core.counterfactual.validation_reads`).
    validation_reads = VALIDATION_READS

    def __init__(self) -> None:
        super().__init__(SCRIPT)
        self.reports = []

    def decide(self, report):
        self.reports.append(report)
        return super().decide(report)


def _env_reports(train, val) -> list:
    spec = EnvSpec(slots=("r0c1",), batch_size=16, episode_length=EPOCHS,
                   seeding=SeedingConfig(gate_config=GATES))
    env = MorphogenesisEnv(0, spec, train, val)
    env.reset(RNG_SEED)
    controller, reports = _Recorder(), []
    for epoch in range(EPOCHS):
        if epoch:
            env.execute(controller.decide(reports[-1]))
        for _ in range(env.start_epoch()):
            env.train_batch()
        env.validate()
        reports.append(env.observe().report)
    return reports


def _trainer_reports(train, val, tmp_path) -> list:
    with torch.random.fork_rng():
        torch.manual_seed(RNG_SEED)  # the env draws its host the same way
        host = CifarCNNHost("baseline", slots=["r0c1"])
    loader = TensorLoader(*train, 16, drop_last=True, rng_seed=RNG_SEED)
    val_x, val_y = normalize(val[0]), val[1]
    val_batches = DataLoader([(val_x[i:i + VAL_BATCH], val_y[i:i + VAL_BATCH])
                              for i in range(0, len(val_y), VAL_BATCH)], batch_size=None)
    controller = _Recorder()
    callback = MorphogenesisCallback(controller, gate_config=GATES, rng_seed=RNG_SEED,
                                     accuracy_key=None)
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(host, train_dataloaders=loader, val_dataloaders=val_batches)
    return controller.reports


def test_env_and_callback_show_the_controller_the_same_reports(cifar_dir, tmp_path):
    train, val = load_cifar10(cifar_dir, True), load_cifar10(cifar_dir, False)
    env, callback = _env_reports(train, val), _trainer_reports(train, val, tmp_path)
    assert len(callback) == EPOCHS
    for e, c in zip(env, callback, strict=True):
        assert (e.epoch, e.max_epochs, e.slot_ids) == (c.epoch, c.max_epochs, c.slot_ids)
        assert e.val_accuracy == pytest.approx(c.val_accuracy, abs=1e-9)
        assert e.val_loss == pytest.approx(c.val_loss, rel=1e-5)
        assert e.train_loss == pytest.approx(c.train_loss, rel=1e-5)
        assert (e.host_params, e.seed_params) == (c.host_params, c.seed_params)
        for es, cs in zip(e.slots, c.slots, strict=True):
            assert (es.stage, es.blueprint, es.alpha) == (cs.stage, cs.blueprint, cs.alpha)
            for name in ("gradient_health", "gradient_norm", "counterfactual_contribution",
                         "contribution_se", "current_accuracy", "epochs_in_stage"):
                a, b = getattr(es.metrics, name), getattr(cs.metrics, name)
                assert (a is None) == (b is None), name
                if a is not None:
                    assert a == pytest.approx(b, rel=1e-4, abs=1e-6), name
    blended = env[-1].slots[0]
    assert blended.stage.name == "BLENDING" and blended.metrics.gradient_norm is not None
    # Measured in both adapters with its standard error over the 40 validation images.
    assert blended.metrics.counterfactual_contribution is not None
    assert blended.metrics.contribution_se is not None and blended.metrics.contribution_se >= 0
