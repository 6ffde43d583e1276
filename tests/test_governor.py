"""Governor: the upstream watchdog rules, its state, and in-place snapshot/restore."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from esper_lightning.governor import (
    REASON_DIVERGENCE,
    REASON_LOBOTOMY,
    REASON_NAN,
    Governor,
    GovernorConfig,
    SnapshotMismatchError,
    live_seed_prefixes,
    restore_snapshot,
    take_snapshot,
)
from esper_lightning.lifecycle import SeedStage
from esper_lightning.slots import SeedSlot


# ================================================================================================
# Governor rules
# ================================================================================================
def stable(n: int, level: float = 1.0) -> list[float]:
    """``n`` readings wobbling ±1% around ``level``."""
    return [level * (1.0 + 0.01 * math.sin(i)) for i in range(n)]


def feed(governor: Governor, losses: list[float], **kwargs) -> list[str | None]:
    return [governor.check_validation(loss, **kwargs) for loss in losses]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_train_loss_panics_at_once(bad):
    governor = Governor()
    assert governor.check_train_loss(0.5) is None
    assert governor.check_train_loss(bad) == REASON_NAN
    assert governor.last_reason == REASON_NAN
    assert governor.history == ()  # train losses never enter the history


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_validation_panics_even_without_history(bad):
    governor = Governor()
    assert governor.check_validation(bad) == REASON_NAN
    assert governor.check_validation(1.0, val_accuracy=bad) == REASON_NAN
    assert governor.history == ()


def test_divergence_on_the_third_consecutive_anomaly_not_before():
    governor = Governor()
    assert feed(governor, stable(15)) == [None] * 15
    assert feed(governor, [20.0, 20.0, 20.0]) == [None, None, REASON_DIVERGENCE]
    assert governor.consecutive_anomalies == 3
    assert governor.last_panic_loss == 20.0
    assert governor.history == tuple(stable(15))  # anomalies were not appended


def test_two_anomalies_then_a_normal_reading_reset_the_count():
    governor = Governor()
    feed(governor, stable(15))
    assert feed(governor, [20.0, 20.0, 1.0]) == [None, None, None]
    assert governor.consecutive_anomalies == 0 and governor.last_reason is None
    assert feed(governor, [20.0, 20.0]) == [None, None]  # needs three in a row again
    assert governor.check_validation(20.0) == REASON_DIVERGENCE


def test_readings_below_the_absolute_threshold_never_diverge():
    # 10 is far above mean + 6σ and 3× mean, but below the absolute threshold of 12.
    governor = Governor()
    feed(governor, stable(15))
    assert feed(governor, [10.0] * 5) == [None] * 5


def test_no_check_before_min_history():
    governor = Governor()
    assert feed(governor, [*stable(5), 100.0, 100.0, 100.0]) == [None] * 8
    assert len(governor.history) == 8  # appended: not enough history to judge them


def test_history_window_slides():
    governor = Governor()
    feed(governor, [float(i) for i in range(30)])
    assert governor.history == tuple(float(i) for i in range(10, 30))


def test_lobotomy_when_a_good_model_jumps_to_the_uniform_guess_loss():
    guess = math.log(10)
    governor = Governor()
    assert feed(governor, stable(12, 0.8), num_classes=10) == [None] * 12
    history = governor.history
    assert governor.check_validation(guess + 0.1, num_classes=10) == REASON_LOBOTOMY
    assert governor.history == history  # the panicking reading is not recorded


def test_lobotomy_needs_tolerance_good_history_and_num_classes():
    guess = math.log(10)
    outside = Governor(GovernorConfig(num_classes=10))
    feed(outside, stable(12, 0.8))
    assert outside.check_validation(guess + 0.2) is None  # 0.2 > 0.065·ln 10 ≈ 0.15
    assert outside.check_validation(guess - 0.1) == REASON_LOBOTOMY  # config num_classes

    never_learned = Governor(GovernorConfig(num_classes=10))
    feed(never_learned, stable(12, 1.5))  # mean 1.5 is not < 0.6·ln 10 ≈ 1.38
    assert never_learned.check_validation(guess) is None

    short = Governor(GovernorConfig(num_classes=10))
    feed(short, stable(9, 0.8))
    assert short.check_validation(guess) is None  # history 9 < 10

    unknown = Governor()
    feed(unknown, stable(12, 0.8))
    assert unknown.check_validation(guess) is None  # rule off without num_classes


def test_normal_noisy_decreasing_curve_never_panics():
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(100, generator=gen).mul(0.05).tolist()
    curve = [0.3 + 2.0 * math.exp(-t / 15) + noise[t] for t in range(100)]
    governor = Governor(GovernorConfig(num_classes=10))
    assert feed(governor, curve) == [None] * 100
    assert all(governor.check_train_loss(loss) is None for loss in curve)


def test_panics_do_not_pollute_history():
    governor = Governor(GovernorConfig(num_classes=10))
    feed(governor, stable(12, 0.8))
    before = governor.history
    governor.check_validation(float("nan"))
    governor.check_validation(0.8, val_accuracy=float("nan"))
    governor.check_validation(math.log(10))
    governor.check_validation(50.0)
    governor.check_train_loss(float("inf"))
    assert governor.history == before


def test_rollback_keeps_history_and_resets_the_count():
    governor = Governor()
    feed(governor, stable(15))
    feed(governor, [20.0] * 3)
    governor.record_rollback()
    assert governor.rollbacks == 1
    assert governor.consecutive_anomalies == 0 and governor.last_reason is None
    assert governor.history == tuple(stable(15))
    assert governor.check_validation(20.0) is None  # a fresh run of three is needed


def test_immediate_panic_without_rollback_arms_divergence():
    # Upstream: NaN/lobotomy jump the counter to the rollback level.
    governor = Governor()
    feed(governor, stable(15))
    assert governor.check_train_loss(float("nan")) == REASON_NAN
    assert governor.check_validation(20.0) == REASON_DIVERGENCE


def test_reset_clears_readings_but_not_the_rollback_total():
    governor = Governor()
    feed(governor, stable(15))
    governor.check_validation(20.0)
    governor.record_rollback()
    governor.reset()
    assert governor.history == () and governor.consecutive_anomalies == 0
    assert governor.last_reason is None and governor.last_panic_loss is None
    assert governor.rollbacks == 1


def test_snapshot_cadence_and_reward():
    governor = Governor(GovernorConfig(snapshot_every=5, rollback_penalty=10.0))
    assert [e for e in range(12) if governor.should_snapshot(e)] == [0, 5, 10]
    assert governor.should_snapshot(3, fossilized=True)
    assert governor.rollback_reward == -10.0


def test_state_dict_round_trip_continues_identically():
    config = GovernorConfig(num_classes=10)
    original = Governor(config)
    feed(original, stable(14, 0.8))
    original.check_validation(20.0)  # one pending anomaly
    original.record_rollback()
    original.check_validation(20.0)

    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    restored = Governor(config)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.state_dict() == original.state_dict()

    tail = [20.0, 0.7, 20.0, 20.0, 20.0, 0.75, math.log(10), *stable(25, 0.6), 30.0]
    assert feed(restored, tail) == feed(original, tail)
    assert restored.state_dict() == original.state_dict()
    assert restored.rollbacks == 1


def test_load_state_dict_rejects_bad_state():
    governor = Governor(GovernorConfig(history_length=12))
    state = governor.state_dict()
    with pytest.raises(ValueError, match="keys"):
        governor.load_state_dict({k: v for k, v in state.items() if k != "rollbacks"})
    with pytest.raises(ValueError, match="<= 12 finite losses, got 13"):
        governor.load_state_dict({**state, "history": [1.0] * 13})
    with pytest.raises(ValueError, match="last_reason 'boom'"):
        governor.load_state_dict({**state, "last_reason": "boom"})


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("absolute_threshold", float("nan"), "finite number > 0"),
        ("sigma", 0.0, "finite number > 0"),
        ("multiplier", -3.0, "finite number > 0"),
        ("rollback_penalty", -1.0, "finite number >= 0"),
        ("lobotomy_mean_fraction", 1.5, "in (0, 1]"),
        ("lobotomy_tolerance", 0.0, "in (0, 1]"),
        ("min_history", 1, "int >= 2"),
        ("history_length", 5, "int >= 10"),
        ("history_length", 20.0, "int >= 10"),
        ("consecutive", 0, "int >= 1"),
        ("consecutive", True, "int >= 1"),
        ("snapshot_every", 0, "int >= 1"),
        ("num_classes", 1, "int >= 2"),
    ],
)
def test_config_rejects_bad_values_naming_them(field, value, accepted):
    with pytest.raises(ValueError) as info:
        GovernorConfig(**{field: value})
    message = str(info.value)
    assert f"GovernorConfig.{field}" in message and accepted in message
    assert repr(value) in message and "\n" not in message


def test_bad_num_classes_at_check_time():
    governor = Governor()
    feed(governor, stable(12))
    with pytest.raises(ValueError, match="num_classes must be an int >= 2, got 1"):
        governor.check_validation(1.0, num_classes=1)


# ================================================================================================
# Snapshots
# ================================================================================================
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
    expected = sum(t.numel() * t.element_size() for t in snap.tensors.values())
    expected += sum(s["momentum_buffer"].numel() * 4 for s in snap.optimizer_state.values())
    assert snap.nbytes == expected


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
