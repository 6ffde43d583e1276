"""A diverging seed in both adapters, a user's Trainer and a Fabric env: the host's trajectory
is bitwise that of the same run without the seed, the seed is pruned (``seed_nonfinite``) before
the step, and the governor has nothing to roll back."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from esper_lightning.callbacks import GovernorCallback, MorphogenesisCallback
from esper_lightning.controllers import ScriptedController
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import SEED_NONFINITE
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.data import CIFAR10DataModule, load_cifar10
from esper_lightning.envs import EnvPool, EnvSpec

SLOT = "net.3"  # after the second convolution, before its in-place ReLU


class SmallCNN(L.LightningModule):
    """A user's CIFAR classifier as the reviewer's: SGD at lr 0.05 with momentum 0.9, which
    never goes NaN on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(16, 10),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Trajectory(Callback):
    """The host's parameters (those a plain `SmallCNN` has, by name) after every step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        names = dict(SmallCNN().named_parameters()).keys()
        params = dict(pl_module.named_parameters())
        self.steps.append({n: params[n].detach().clone() for n in names})


class Poison(Callback):
    """Once the seed in `SLOT` reaches ``stage``, its output is ``+inf`` (``inf``: finite
    gradients, only the output shows it) or NaN (``nan``) from then on."""

    def __init__(self, growth: MorphogenesisCallback, stage: SeedStage, kind: str) -> None:
        self.growth, self.stage, self.kind = growth, stage, kind
        self.step: int | None = None  # the global step of the first poisoned batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        slot = self.growth.engine.slots[SLOT]
        if self.step is None and slot.stage == self.stage:
            self.step = trainer.global_step
            value = float("inf") if self.kind == "inf" else float("nan")
            slot.seed.register_forward_hook(
                lambda m, a, out: out + value if self.kind == "inf" else out * value)


def _fit(cifar_dir: Path, tmp_path: Path, epochs: int, callbacks: list[Callback]) -> SmallCNN:
    torch.manual_seed(0)
    module = SmallCNN()
    trainer = L.Trainer(
        max_epochs=epochs, default_root_dir=tmp_path, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=True, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=CIFAR10DataModule(cifar_dir, batch_size=16, rng_seed=3))
    return module


def _growth(script: dict[int, Action]) -> MorphogenesisCallback:
    return MorphogenesisCallback(ScriptedController(script), slots=[SLOT],
                                 gate_config=GateConfig(min_training_epochs=1))


GERMINATE = Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light")
ADVANCE = Action(LifecycleOp.ADVANCE, 0)


@pytest.mark.parametrize("kind", ["inf", "nan"])
def test_an_incubating_seed_gone_nonfinite_leaves_the_hosts_trajectory_bitwise_its_own(
        cifar_dir, tmp_path, kind: str):
    plain = Trajectory()
    _fit(cifar_dir, tmp_path, 3, [plain])
    growth = _growth({0: GERMINATE, 1: ADVANCE})
    governor, grown = GovernorCallback(), Trajectory()
    poison = Poison(growth, SeedStage.TRAINING, kind)
    _fit(cifar_dir, tmp_path, 3, [governor, growth, poison, grown])

    assert poison.step is not None  # the seed incubated, poisoned, in the last epoch
    slot = growth.engine.slots[SLOT]
    assert slot.stage == SeedStage.EMBARGOED and slot.state.prune_reason == SEED_NONFINITE
    pruned = [e for e in growth.engine.events if e.kind == "pruned"]
    assert [(e.slot_id, e.reason) for e in pruned] == [(SLOT, SEED_NONFINITE)]
    assert governor.rollbacks == 0 and growth.engine.dropped_steps == 0
    assert len(grown.steps) == len(plain.steps)
    for step, (ours, theirs) in enumerate(zip(grown.steps, plain.steps, strict=True)):
        for name, value in theirs.items():
            assert torch.equal(ours[name], value), (step, name)


def test_a_blending_seed_gone_nonfinite_is_pruned_its_step_dropped_and_nothing_rolled_back(
        cifar_dir, tmp_path):
    growth = _growth({0: GERMINATE, 1: ADVANCE, 2: ADVANCE})
    governor, trajectory = GovernorCallback(), Trajectory()
    poison = Poison(growth, SeedStage.BLENDING, "nan")
    _fit(cifar_dir, tmp_path, 5, [governor, growth, poison, trajectory])

    assert poison.step is not None  # BLENDING from the fourth epoch on
    slot = growth.engine.slots[SLOT]
    assert slot.stage == SeedStage.EMBARGOED  # pruned, then the epoch's decision ticked
    assert slot.state.prune_reason == SEED_NONFINITE
    assert growth.engine.dropped_steps == 1 and governor.rollbacks == 0
    # The spoiled step moved nothing; the fit went on and trained after it.
    steps = trajectory.steps
    before, spoiled, after = steps[poison.step - 1], steps[poison.step], steps[-1]
    assert all(torch.equal(spoiled[n], before[n]) for n in before)
    assert any(not torch.equal(after[n], spoiled[n]) for n in before)
    assert all(torch.isfinite(v).all() for v in after.values())


ENV_SPEC = EnvSpec(slots=("r0c1",), batch_size=16, episode_length=5,
                   seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=1)))
WAIT = Action()


def _episode(cifar_dir: Path, actions: list[Action], stage: SeedStage | None = None):
    """One env episode of ``actions`` (rng seed 7); the seed in ``r0c1`` goes NaN once it
    reaches ``stage``. Returns the env and the last step."""
    env = EnvPool(ENV_SPEC, load_cifar10(cifar_dir, True), load_cifar10(cifar_dir, False),
                  ["cpu"]).envs[0]
    env.reset(7)
    for _ in range(env.start_epoch()):  # the first epoch trains before the first decision
        env.train_batch()
    env.validate()
    env.observe()
    poisoned, step = False, None
    for action in actions:
        outcome = env.execute(action)
        slot = env.engine.slots["r0c1"]
        if not poisoned and slot.stage == stage:
            poisoned = True
            slot.seed.register_forward_hook(lambda m, a, out: out * float("nan"))
        for _ in range(env.start_epoch()):
            env.train_batch()
        env.validate()
        step = env.finish_step(outcome)
    assert poisoned == (stage is not None)
    return env, step


def _host_state(env) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in env.host.named_parameters()
            if ".seed." not in n and ".gate." not in n}


def test_in_an_env_an_incubating_seed_gone_nan_leaves_the_host_bitwise_its_own(cifar_dir):
    plain, _ = _episode(cifar_dir, [WAIT, WAIT])
    grown, step = _episode(cifar_dir, [GERMINATE, ADVANCE], stage=SeedStage.TRAINING)
    slot = grown.engine.slots["r0c1"]
    assert slot.stage == SeedStage.PRUNED and slot.state.prune_reason == SEED_NONFINITE
    assert step.observation.rollback_reason is None and grown.engine.dropped_steps == 0
    theirs, ours = _host_state(plain), _host_state(grown)
    assert theirs.keys() == ours.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name


def test_in_an_env_a_blending_seed_gone_nan_drops_its_step_and_rolls_nothing_back(cifar_dir):
    env, step = _episode(cifar_dir, [GERMINATE, ADVANCE, ADVANCE], stage=SeedStage.BLENDING)
    slot = env.engine.slots["r0c1"]
    assert slot.stage == SeedStage.PRUNED and slot.state.prune_reason == SEED_NONFINITE
    assert env.engine.dropped_steps == 1
    # The spoiled batch's NaN loss is not the host's: no rollback, a finite training loss.
    assert step.observation.rollback_reason is None and env.governor.rollbacks == 0
    assert step.observation.train_loss is not None and step.observation.train_loss < 10
    assert all(torch.isfinite(v).all() for v in _host_state(env).values())
