"""Snapshots: in-place capture and restore of what a governor rollback brings back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_lightning.core.lifecycle import SeedStage
from esper_lightning.core.slots import SeedSlot
from esper_lightning.core.snapshot import (
    SnapshotMismatchError,
    live_seed_prefixes,
    restore_snapshot,
    take_snapshot,
)


def grow(slot: SeedSlot, stage: SeedStage) -> None:
    """Move an empty slot to TRAINING or FOSSILIZED through the slot's own operations."""
    slot.germinate("conv_light", tempo=2)
    assert slot.advance().passed  # → TRAINING
    if stage == SeedStage.TRAINING:
        return
    for _ in range(10):
        slot.tick()
    slot.state.metrics.gradient_health = 1.0
    assert slot.advance().passed  # → BLENDING
    for _ in range(2):
        slot.tick()
    assert slot.advance().passed  # → HOLDING
    slot.record_contribution(1.0)
    assert slot.fossilize().passed
    assert slot.stage == SeedStage.FOSSILIZED


def make_model() -> nn.Sequential:
    """conv → bn → slot a (fossilized) → conv → slot b (live, TRAINING) → conv."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        SeedSlot("a", channels=8),
        nn.Conv2d(8, 8, 3, padding=1),
        SeedSlot("b", channels=8),
        nn.Conv2d(8, 4, 1),
    )
    grow(model[2], SeedStage.FOSSILIZED)
    grow(model[4], SeedStage.TRAINING)
    return model


def make_optimizer(model: nn.Sequential, cls=torch.optim.SGD, **kwargs) -> torch.optim.Optimizer:
    """Host and seeds in named groups, as the engine builds them (``seed/<slot>``)."""
    seeds = {id(p) for slot in (model[2], model[4]) for p in slot.seed_parameters()}
    host = [p for p in model.parameters() if id(p) not in seeds]
    groups = [
        {"params": host, "name": "host"},
        {"params": model[2].seed_parameters(), "name": "seed/a"},
        {"params": model[4].seed_parameters(), "name": "seed/b", "lr": 0.05},
    ]
    return cls(groups, **({"lr": 0.1, "momentum": 0.9} if cls is torch.optim.SGD else {}), **kwargs)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, scaler=None) -> None:
    gen = torch.Generator().manual_seed(steps)
    x = torch.randn(4, 3, 6, 6, generator=gen)
    target = torch.randn(4, 4, 6, 6, generator=gen)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((model(x) - target) ** 2).mean()
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


def prune_live(model: nn.Sequential, optimizer: torch.optim.Optimizer) -> None:
    """What the engine does before restoring: prune live seeds, drop their groups and state."""
    for params in [g["params"] for g in optimizer.param_groups if g["name"] == "seed/b"]:
        for param in params:
            optimizer.state.pop(param, None)
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["name"] != "seed/b"]
    model[4].prune("governor_rollback")


def test_live_seed_prefixes_name_only_live_seeds():
    model = make_model()
    assert live_seed_prefixes(model) == {"4.seed.", "4.gate."}
    model[4].prune("test")
    assert live_seed_prefixes(model) == set()


def test_snapshot_excludes_live_seeds_and_copies_to_cpu():
    model = make_model()
    optimizer = make_optimizer(model)
    train(model, optimizer, 2)
    snap = take_snapshot(model, optimizer)
    assert not any(k.startswith("4.") for k in snap.tensors)
    assert not any(k.startswith("4.") for k in snap.optimizer_state)
    assert any(k.startswith("2.seed.") for k in snap.tensors)  # the fossil is kept
    assert "1.running_mean" in snap.tensors and "1.num_batches_tracked" in snap.tensors
    assert not any(k.endswith("_extra_state") for k in snap.tensors)
    assert snap.manifests["a"]["state"]["stage"] == int(SeedStage.FOSSILIZED)
    assert snap.manifests["b"]["state"]["stage"] == int(SeedStage.TRAINING)
    assert set(snap.param_groups) == {"host", "seed/a"}  # the live seed's group is skipped
    weight = model[0].weight
    assert snap.tensors["0.weight"].data_ptr() != weight.data_ptr()  # a copy, not a view
    assert all(t.device.type == "cpu" for t in snap.tensors.values())


def test_rollback_restores_host_fossil_and_momentum_in_place():
    model = make_model()
    optimizer = make_optimizer(model)
    train(model, optimizer, 3)
    snap = take_snapshot(model, optimizer)
    frozen = {n: s["momentum_buffer"].clone() for n, s in snap.optimizer_state.items()}
    ids = {name: id(p) for name, p in model.named_parameters() if not name.startswith("4.")}
    train(model, optimizer, 3)
    assert not torch.equal(model[0].weight, snap.tensors["0.weight"])  # training moved it
    fossil = [k for k in snap.tensors if k.startswith("2.seed.")]
    assert fossil and any(not torch.equal(model.state_dict()[k], snap.tensors[k]) for k in fossil)

    prune_live(model, optimizer)
    restore_snapshot(snap, model, optimizer)

    state = model.state_dict()
    for key, saved in snap.tensors.items():
        assert torch.equal(state[key], saved), key
    assert {n: id(p) for n, p in model.named_parameters()} == ids
    params = dict(model.named_parameters())
    assert {n for n, p in params.items() if p in optimizer.state} == set(snap.optimizer_state)
    for name, saved in snap.optimizer_state.items():
        assert torch.equal(optimizer.state[params[name]]["momentum_buffer"],
                           saved["momentum_buffer"]), name
    assert not any(k.startswith("4.") for k in snap.tensors)

    train(model, optimizer, 2)  # training goes on without touching the snapshot ...
    restore_snapshot(snap, model, optimizer)  # ... so it can be restored again
    assert all(torch.equal(model.state_dict()[k], v) for k, v in snap.tensors.items())
    for name, momentum in frozen.items():
        assert torch.equal(optimizer.state[params[name]]["momentum_buffer"], momentum), name


def test_restore_clears_state_of_params_without_captured_state():
    model = make_model()
    optimizer = make_optimizer(model)
    snap = take_snapshot(model, optimizer)  # before any step: no momentum yet
    train(model, optimizer, 2)
    assert len(optimizer.state) > 0
    prune_live(model, optimizer)
    restore_snapshot(snap, model, optimizer)
    assert len(optimizer.state) == 0


def test_restore_raises_when_a_fossil_is_gone_and_changes_nothing():
    model = make_model()
    optimizer = make_optimizer(model)
    snap = take_snapshot(model, optimizer)
    train(model, optimizer, 2)
    prune_live(model, optimizer)
    model[2].seed = None  # the fossilized seed disappeared
    before = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    momentum = optimizer.state[model[0].weight]["momentum_buffer"].clone()
    with pytest.raises(SnapshotMismatchError, match=r"missing from the model.*'2\.seed\."):
        restore_snapshot(snap, model, optimizer)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert torch.equal(optimizer.state[model[0].weight]["momentum_buffer"], momentum)


def test_restore_raises_when_the_fossil_was_replaced():
    model = make_model()
    snap = take_snapshot(model)
    model[2].state.seed_id = "someone-else"
    with pytest.raises(SnapshotMismatchError, match="slot 'a': fossilized seed 'a:seed0'"):
        restore_snapshot(snap, model)


@pytest.mark.parametrize("finite", [True, False])
def test_a_fossil_newer_than_the_snapshot_keeps_its_weights_unless_they_are_not_finite(finite):
    """No snapshot holds a newer fossil's weights: finite, they stay as they are; not finite,
    the restore would hand back a broken model, so it refuses and changes nothing."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 1), SeedSlot("a", channels=8), nn.Conv2d(8, 4, 1))
    snap = take_snapshot(model)
    grow(model[1], SeedStage.FOSSILIZED)
    with torch.no_grad():
        model[0].weight.add_(1.0)
        model[1].seed_parameters()[0].view(-1)[0] = 0.5 if finite else float("nan")
    before = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    if finite:
        restore_snapshot(snap, model)
        assert torch.equal(model[0].weight, snap.tensors["0.weight"])
        kept = {k: v for k, v in model.state_dict().items() if k.startswith("1.seed.")}
        assert kept and all(torch.equal(v, before[k]) for k, v in kept.items())
        return
    message = r"slot 'a' \(1\): its seed fossilized after the snapshot and now holds non-finite"
    with pytest.raises(SnapshotMismatchError, match=message):
        restore_snapshot(snap, model)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items() if "seed" not in k)


def test_restore_raises_on_new_state_or_changed_shape():
    model = make_model()
    snap = take_snapshot(model)
    model.add_module("extra", nn.Linear(2, 2))
    with pytest.raises(SnapshotMismatchError, match=r"not in the snapshot.*'extra\.bias'"):
        restore_snapshot(snap, model)
    del model.extra
    model[5] = nn.Conv2d(8, 4, 3)
    with pytest.raises(SnapshotMismatchError, match=r"'5\.weight' has shape \(4, 8, 3, 3\)"):
        restore_snapshot(snap, model)


def test_live_seed_still_present_is_left_alone():
    # Restore never prunes: an unpruned live seed keeps its (uncaptured) weights.
    model = make_model()
    snap = take_snapshot(model)
    live = [p.clone() for p in model[4].seed_parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    restore_snapshot(snap, model)
    assert model[4].stage == SeedStage.TRAINING
    pairs = zip(model[4].seed_parameters(), live, strict=True)
    assert all(torch.equal(p, q + 1.0) for p, q in pairs)


def test_exclude_prefixes():
    model = make_model()
    with pytest.raises(TypeError, match="collection of key prefixes"):
        take_snapshot(model, exclude="5.")
    snap = take_snapshot(model, exclude=["5."])
    assert not any(k.startswith("5.") for k in snap.tensors)
    with torch.no_grad():
        model[5].weight.fill_(3.0)
    restore_snapshot(snap, model)
    assert bool((model[5].weight == 3.0).all())


def test_adam_state_and_named_group_hyperparameters():
    model = make_model()
    optimizer = make_optimizer(model, torch.optim.Adam, lr=1e-3)
    train(model, optimizer, 2)
    snap = take_snapshot(model, optimizer)
    train(model, optimizer, 2)
    optimizer.param_groups[0]["lr"] = 0.5
    prune_live(model, optimizer)
    restore_snapshot(snap, model, optimizer)
    assert optimizer.param_groups[0]["lr"] == 0.5  # schedulers own the lr by default
    params = dict(model.named_parameters())
    for name, saved in snap.optimizer_state.items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[params[name]][key], saved[key]), (name, key)
    restore_snapshot(snap, model, optimizer, restore_hyperparameters=True)
    assert optimizer.param_groups[0]["lr"] == 1e-3
    train(model, optimizer, 1)  # Adam accepts the restored state


def test_grad_scaler_state_is_restored():
    model = make_model()
    optimizer = make_optimizer(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    train(model, optimizer, 1, scaler)
    snap = take_snapshot(model, optimizer, scaler)
    saved = scaler.state_dict()
    train(model, optimizer, 2, scaler)
    assert scaler.state_dict()["scale"] != saved["scale"]
    prune_live(model, optimizer)
    restore_snapshot(snap, model, optimizer, scaler)
    assert scaler.state_dict() == saved


def test_restore_needs_what_it_is_given_to_be_captured():
    model = make_model()
    optimizer = make_optimizer(model)
    snap = take_snapshot(model)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        restore_snapshot(snap, model, optimizer)
    with pytest.raises(ValueError, match="holds no scaler state"):
        restore_snapshot(snap, model, scaler=torch.amp.GradScaler("cpu"))


def test_optimizer_parameters_must_belong_to_the_model():
    model = make_model()
    stray = nn.Parameter(torch.zeros(3, 2))
    optimizer = torch.optim.SGD([*model.parameters(), stray], lr=0.1)
    with pytest.raises(ValueError, match=r"shape \(3, 2\) is not a parameter of the model"):
        take_snapshot(model, optimizer)


def test_restore_raises_when_a_captured_param_left_the_optimizer():
    model = make_model()
    optimizer = make_optimizer(model)
    train(model, optimizer, 1)
    snap = take_snapshot(model, optimizer)
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["name"] != "seed/a"]
    with pytest.raises(SnapshotMismatchError, match=r"'2\.seed\..*in no optimizer param group"):
        restore_snapshot(snap, model, optimizer)


class Counter(nn.Module):
    """A module with non-tensor extra state."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def get_extra_state(self) -> dict[str, int]:
        return {"count": self.count}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def test_extra_state_of_plain_modules_is_restored():
    model = nn.Sequential(nn.Linear(2, 2), Counter())
    model[1].count = 3
    snap = take_snapshot(model)
    model[1].count = 7
    restore_snapshot(snap, model)
    assert model[1].count == 3
