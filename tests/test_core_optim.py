"""Seed param groups are decayed as the host is, and stay right through prune, rollback and a
checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

from esper_lightning.core.actions import Action, AlphaSpeed, LifecycleOp
from esper_lightning.core.divergence import Governor
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.optim import SeedOptimConfig, seed_group_names
from esper_lightning.core.rollback import roll_back
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.snapshot import take_snapshot
from esper_lightning.hosts import CifarCNNHost, GPTHost


def _gpt(**engine_kwargs):
    torch.manual_seed(0)
    host = GPTHost("tiny", slots=["r0c0", "r0c1"])
    seeding = SeedingConfig(gate_config=GateConfig(min_training_epochs=1), **engine_kwargs)
    engine = MorphogenesisEngine(host, rng_seed=0, seeding=seeding)
    optimizer = host.configure_optimizers()
    engine.attach_optimizer(optimizer)
    return host, engine, optimizer


def _germinate(engine, slot, blueprint, train=False):
    action = Action(LifecycleOp.GERMINATE, slot, blueprint=blueprint)
    assert engine.execute(action).success
    if train:  # into TRAINING (gate G1 always passes): the seed runs and gets gradients
        assert engine.execute(Action(LifecycleOp.ADVANCE, slot)).success


def _groups(optimizer):
    return {g["name"]: g for g in optimizer.param_groups}


def _ids(params):
    return {id(p) for p in params}


def test_a_transformer_seed_is_decayed_as_the_host_is():
    _, engine, optimizer = _gpt(seed_optim=SeedOptimConfig(weight_decay=0.05))
    _germinate(engine, 0, "attention")
    assert seed_group_names(optimizer) == ["seed/r0c0", "seed/r0c0/no_decay"]
    groups = _groups(optimizer)
    decayed, exempt = groups["seed/r0c0"], groups["seed/r0c0/no_decay"]
    assert decayed["weight_decay"] == 0.05  # the seed override; the host decays by 0.1
    assert exempt["weight_decay"] == 0.0  # never overridden: these are the host's exemptions
    assert decayed["betas"] == exempt["betas"] == groups["host/decay"]["betas"]
    seed = dict(engine.slots["r0c0"].seed.named_parameters())
    assert _ids(decayed["params"]) == _ids([seed["qkv.weight"], seed["proj.weight"]])
    assert _ids(exempt["params"]) == _ids(p for n, p in seed.items()
                                          if n.endswith(("bias", "gamma", "norm.weight")))
    # Zero gradients: AdamW's decoupled decay alone moves a parameter.
    gamma, qkv = seed["ls.gamma"].detach().clone(), seed["qkv.weight"].detach().clone()
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    assert torch.equal(seed["ls.gamma"], gamma)  # LayerScale gamma is not pulled to 0
    lr = decayed["lr"]
    assert torch.allclose(seed["qkv.weight"], qkv * (1 - lr * 0.05))


def test_a_seed_of_vectors_only_has_only_the_exempt_group():
    _, engine, optimizer = _gpt()
    gated = Action(LifecycleOp.GERMINATE, 1, blueprint="norm")
    assert engine.execute(gated).success
    assert seed_group_names(optimizer) == ["seed/r0c1/no_decay"]


def test_a_host_that_decays_everything_gets_one_group_per_seed():
    torch.manual_seed(0)
    host = CifarCNNHost("baseline", slots=["r0c1"], weight_decay=5e-4)
    engine = MorphogenesisEngine(host, rng_seed=0)
    optimizer = host.configure_optimizers()
    engine.attach_optimizer(optimizer)
    _germinate(engine, 0, "conv_light")
    assert seed_group_names(optimizer) == ["seed/r0c1"]
    (group,) = [g for g in optimizer.param_groups if g["name"] == "seed/r0c1"]
    assert group["weight_decay"] == 5e-4
    assert _ids(group["params"]) == _ids(engine.slots["r0c1"].seed_parameters())


def _train(host, optimizer, steps=2):
    gen = torch.Generator().manual_seed(steps)
    x = torch.randint(0, 256, (2, 16), generator=gen)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(host(x).flatten(0, 1), x.flatten()).backward()
        optimizer.step()


def test_prune_and_rollback_drop_both_groups_and_their_state():
    host, engine, optimizer = _gpt()
    snapshot = take_snapshot(host, optimizer)
    _germinate(engine, 0, "attention", train=True)
    seed = engine.slots["r0c0"].seed_parameters()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    engine.schedulers = [scheduler]
    _train(host, optimizer)
    assert all(p in optimizer.state for p in seed)
    roll_back(snapshot, host, Governor(), "governor_nan", prune=engine.prune_live,
              optimizer=optimizer)
    assert seed_group_names(optimizer) == []
    assert not any(p in optimizer.state for p in seed)
    assert len(scheduler.base_lrs) == len(optimizer.param_groups) == 2

    host, engine, optimizer = _gpt()
    _germinate(engine, 1, "attention", train=True)
    _train(host, optimizer)
    seed = engine.slots["r0c1"].seed_parameters()
    for _ in range(5):
        engine.tick()
    prune = Action(LifecycleOp.PRUNE, 1, alpha_speed=AlphaSpeed.INSTANT)
    assert engine.execute(prune).success
    assert seed_group_names(optimizer) == []
    assert not any(p in optimizer.state for p in seed)


def test_a_checkpoint_restores_split_groups_in_their_order():
    host, engine, optimizer = _gpt()
    _germinate(engine, 1, "norm", train=True)  # only vectors: one group, exempt
    engine.tick()
    _train(host, optimizer)
    engine.record_epoch(40.0, 2.0, 2.0)
    engine.slots["r0c1"].state.metrics.gradient_health = 1.0
    assert engine.execute(Action(LifecycleOp.ADVANCE, 1)).success  # into BLENDING
    _germinate(engine, 0, "attention", train=True)
    order = ["seed/r0c1/no_decay", "seed/r0c0", "seed/r0c0/no_decay"]
    assert seed_group_names(optimizer) == order
    _train(host, optimizer)
    saved = (copy.deepcopy(host.state_dict()), copy.deepcopy(optimizer.state_dict()),
             engine.state_dict())
    assert saved[2]["seed_group_order"] == order

    torch.manual_seed(1)
    other = GPTHost("tiny", slots=["r0c0", "r0c1"])
    engine_b = MorphogenesisEngine(other, rng_seed=0)
    for slot_id, blueprint in (("r0c1", "norm"), ("r0c0", "attention")):
        engine_b.slots[slot_id].germinate(blueprint)  # a checkpoint rebuilds its seeds
        engine_b.slots[slot_id].advance()
    other.load_state_dict(saved[0])
    engine_b.load_state_dict(saved[2])
    optimizer_b = other.configure_optimizers()
    engine_b.attach_optimizer(optimizer_b)
    assert seed_group_names(optimizer_b) == order  # slot order alone would start with r0c0
    optimizer_b.load_state_dict(saved[1])
    for group, group_b in zip(optimizer.param_groups, optimizer_b.param_groups, strict=True):
        assert group["name"] == group_b["name"]
        for p, p_b in zip(group["params"], group_b["params"], strict=True):
            assert p.shape == p_b.shape
            assert torch.equal(optimizer.state[p]["exp_avg"], optimizer_b.state[p_b]["exp_avg"])


def test_an_exempt_group_needs_an_exempting_host():
    from esper_lightning.core.optim import add_seed_group

    torch.manual_seed(0)
    host = CifarCNNHost("baseline", slots=["r0c1"])
    optimizer = host.configure_optimizers()
    with pytest.raises(RuntimeError, match="exempts no parameter from weight decay"):
        add_seed_group(optimizer, "seed/r0c1/no_decay", [torch.nn.Parameter(torch.ones(2))],
                       SeedOptimConfig())
