"""The governor's rollback routine, and both adapters carrying it out alike."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from esper_lightning.callbacks import GovernorCallback
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.divergence import Governor
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.rollback import roll_back
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.core.snapshot import take_snapshot
from esper_lightning.data import load_cifar10
from esper_lightning.envs import EnvSpec, MorphogenesisEnv

GATES = GateConfig(min_training_epochs=1)
GERMINATE = Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light")


class _Host(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.slot = SeedSlot("r0c0", channels=8)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.slot(self.conv(x)))


def _train(host: nn.Module, optimizer: torch.optim.Optimizer, scaler, steps: int = 2) -> None:
    gen = torch.Generator().manual_seed(steps)
    x, target = torch.randn(4, 3, 5, 5, generator=gen), torch.randn(4, 2, 5, 5, generator=gen)
    for _ in range(steps):
        optimizer.zero_grad()
        scaler.scale(((host(x) - target) ** 2).mean()).backward()
        scaler.step(optimizer)
        scaler.update()


def test_roll_back_prunes_restores_drops_gradients_and_counts():
    torch.manual_seed(0)
    host = _Host()
    optimizer = torch.optim.SGD(host.parameters(), lr=0.1, momentum=0.9)
    engine = MorphogenesisEngine(host, rng_seed=0, seeding=SeedingConfig(gate_config=GATES))
    engine.attach_optimizer(optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    _train(host, optimizer, scaler)
    snapshot = take_snapshot(host, optimizer, scaler)
    saved = copy.deepcopy((host.state_dict(), optimizer.state_dict(), scaler.state_dict()))
    groups = len(optimizer.param_groups)
    assert engine.execute(GERMINATE).success
    assert len(optimizer.param_groups) == groups + 1  # the seed's group
    _train(host, optimizer, scaler)  # moves the host, the momentum and the loss scale
    assert scaler.state_dict()["scale"] != saved[2]["scale"]
    governor = Governor()

    assert roll_back(snapshot, host, governor, "governor_nan", prune=engine.prune_live,
                     optimizer=optimizer, scaler=scaler) == ["r0c0"]
    assert host.slot.stage == SeedStage.PRUNED and host.slot.state.prune_reason == "governor_nan"
    assert engine.events[-1].kind == "pruned" and engine.events[-1].reason == "governor_nan"
    assert len(optimizer.param_groups) == groups  # the pruned seed's group is gone
    weights = {k: v for k, v in saved[0].items() if torch.is_tensor(v)}  # not the manifest
    assert weights and all(torch.equal(host.state_dict()[k], v) for k, v in weights.items())
    restored = optimizer.state_dict()["state"]
    for index, entry in saved[1]["state"].items():
        assert torch.equal(restored[index]["momentum_buffer"], entry["momentum_buffer"])
    assert scaler.state_dict() == saved[2]
    assert all(p.grad is None for p in host.parameters())
    assert governor.rollbacks == 1


def test_roll_back_without_an_engine_prunes_the_slots_and_without_a_snapshot_raises():
    torch.manual_seed(0)
    host = _Host()
    snapshot = take_snapshot(host)
    host.slot.germinate("conv_light")
    assert roll_back(snapshot, host, Governor(), "governor_divergence") == ["r0c0"]
    assert host.slot.stage == SeedStage.PRUNED
    with pytest.raises(RuntimeError, match=r"governor panic \(governor_nan\) before any snapshot"):
        roll_back(None, host, Governor(), "governor_nan")


def _poisoned_env(cifar_dir) -> MorphogenesisEnv:
    """An env with a fossil (born grown) and a live seed, a loss scale and
    momentum that moved since its snapshot, whose last epoch trained on a NaN host weight."""
    spec = EnvSpec(slots=("r0c1", "r0c2"), batch_size=16, episode_length=4,
                   seeding=SeedingConfig(gate_config=GATES))
    env = MorphogenesisEnv(0, spec, load_cifar10(cifar_dir, True), load_cifar10(cifar_dir, False))
    # A scaler on the precision plugin, so the env's rollback has one to restore (on the CPU
    # a 32-true run has none; reset gives the env a fresh one, as under 16-mixed).
    env.fabric.strategy.precision.scaler = torch.amp.GradScaler("cpu")
    env.reset(7, implants=[("r0c2", "norm")])
    for _ in range(env.start_epoch()):  # the first epoch, then a decision after each epoch
        env.train_batch()
    env.validate()
    env.observe()
    for action in (GERMINATE, Action(LifecycleOp.ADVANCE, 0)):
        outcome = env.execute(action)
        for _ in range(env.start_epoch()):
            env.train_batch()
        env.validate()
        assert env.finish_step(outcome).observation.rollback_reason is None
    scaler = env.fabric.strategy.precision.scaler
    scaler.load_state_dict({**scaler.state_dict(), "scale": 1024.0})
    with torch.no_grad():
        env.host.blocks[0].conv.weight[0, 0, 0, 0] = float("nan")
    for _ in range(env.start_epoch()):
        env.train_batch()
    env.validate()
    return env


def _state(host, optimizer, scaler, engine, governor) -> dict:
    return {
        "weights": {k: v.clone() for k, v in host.state_dict().items() if torch.is_tensor(v)},
        "optimizer": optimizer.state_dict(),
        "groups": [g.get("name") for g in optimizer.param_groups],
        "grads": [p.grad for p in host.parameters()],
        "scaler": scaler.state_dict(),
        "stages": {sid: (s.stage, s.state and s.state.prune_reason)
                   for sid, s in engine.slots.items()},
        "events": [(e.slot_id, e.kind, e.reason) for e in engine.events],
        "rollbacks": governor.rollbacks,
    }


def test_the_callback_and_the_env_roll_back_to_the_same_state(cifar_dir):
    """The same world (host, optimizer, scaler, engine, governor, snapshot) rolled back once by
    `GovernorCallback` and once by the env ends in the same state."""
    torch.manual_seed(0)
    env = _poisoned_env(cifar_dir)
    scaler = env.fabric.strategy.precision.scaler
    # One deepcopy keeps the references between them (the engine holds the host and optimizer).
    host, optimizer, scaler_copy, engine, governor, snapshot = copy.deepcopy(
        (env.host, env.optimizer.optimizer, scaler, env.engine, env.governor, env.snapshot))
    callback = GovernorCallback()
    callback.governor, callback.snapshot = governor, snapshot
    callback._growth = SimpleNamespace(prune_live=engine.prune_live)  # the lifecycle's owner
    trainer = SimpleNamespace(optimizers=[optimizer], current_epoch=engine.epoch,
                              precision_plugin=SimpleNamespace(scaler=scaler_copy))
    callback._rollback(trainer, host, "governor_nan")

    assert env.observe().rollback_reason == "governor_nan"  # the env's own rollback
    by_env = _state(env.host, env.optimizer.optimizer, scaler, env.engine, env.governor)
    by_callback = _state(host, optimizer, scaler_copy, engine, governor)
    assert by_env["rollbacks"] == 1 and by_env["scaler"]["scale"] != 1024.0
    assert by_env["stages"]["r0c1"] == (SeedStage.PRUNED, "governor_nan")
    assert by_env["stages"]["r0c2"][0] == SeedStage.FOSSILIZED
    assert all(g is None for g in by_env["grads"])
    assert all(torch.isfinite(v).all() for v in by_env["weights"].values())
    assert _same(by_env, by_callback)


def _same(a, b) -> bool:
    """Exact equality of nested containers of tensors (bitwise) and plain values."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_the_env_snapshots_at_the_decision_that_fossilizes(cifar_dir):
    """The epoch after a fossilizing decision trains the new fossil: a rollback in it must
    restore the fossil's weights too, so the env snapshots right after that decision (its
    snapshot was the last healthy epoch's, which left the then-live seed out)."""
    torch.manual_seed(0)
    spec = EnvSpec(slots=("r0c1",), batch_size=16, episode_length=4,
                   seeding=SeedingConfig(gate_config=GATES))
    env = MorphogenesisEnv(0, spec, load_cifar10(cifar_dir, True), load_cifar10(cifar_dir, False))
    env.reset(7)
    for _ in range(env.start_epoch()):
        env.train_batch()
    env.validate()
    env.observe()
    env.execute(GERMINATE)
    slot = env.engine.slots["r0c1"]
    assert slot.advance().passed  # -> TRAINING, then on to HOLDING by the slot's own steps
    for _ in range(3):
        slot.tick()
    slot.state.metrics.gradient_health = 1.0
    assert slot.advance().passed
    while slot.alpha < 1.0:
        slot.tick()
    assert slot.advance().passed and slot.stage == SeedStage.HOLDING
    slot.record_contribution(1.0)
    before = env.snapshot
    env.execute(Action(LifecycleOp.FOSSILIZE, 0))
    assert slot.stage == SeedStage.FOSSILIZED
    assert env.snapshot is not before
    assert env.snapshot.manifests["r0c1"]["state"]["stage"] == int(SeedStage.FOSSILIZED)
    seed_keys = [k for k in env.snapshot.tensors if ".seed." in k]
    assert seed_keys and all(torch.equal(env.snapshot.tensors[k], v.cpu())
                             for k, v in env.host.state_dict().items() if k in seed_keys)
