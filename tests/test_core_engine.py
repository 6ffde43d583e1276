import copy
import logging

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from esper_lightning.core.actions import (
    Action,
    AlphaSpeed,
    GerminationStyle,
    LifecycleOp,
)
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig, GateMode, SeedStage
from esper_lightning.core.optim import SeedOptimConfig, name_host_groups, seed_group_names
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.core.timing import SeedTiming

GERMINATE = Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light")
ADVANCE = Action(LifecycleOp.ADVANCE, 0)


class Net(nn.Module):
    """A user model that knows nothing about seeds."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _engine(**kwargs) -> tuple[Net, MorphogenesisEngine]:
    net = _net()
    seeding = SeedingConfig(gate_config=GateConfig(min_training_epochs=1), **kwargs)
    engine = MorphogenesisEngine(net, slots=["net.1", "net.3"], seeding=seeding)
    net(torch.zeros(1, 3, 8, 8))
    return net, engine


def _healthy(engine: MorphogenesisEngine, slot_id: str) -> None:
    metrics = engine.slots[slot_id].state.metrics
    metrics.gradient_health, metrics.has_exploding = 1.0, False


def test_injection_keeps_host_names_and_follows_device_and_dtype():
    net = _net()
    host_keys = set(net.state_dict())
    engine = MorphogenesisEngine(net, slots=["net.1", "net.3"])
    assert engine.slot_ids == ("net.1", "net.3")
    assert host_keys < set(net.state_dict())
    assert {k for k in net.state_dict() if k not in host_keys} == {
        "esper_slots.net__1._extra_state", "esper_slots.net__3._extra_state"
    }
    net.to(torch.float64)
    out = net(torch.zeros(2, 3, 8, 8, dtype=torch.float64))
    assert out.dtype == torch.float64 and engine.slots["net.1"].channels == 8
    engine.execute(GERMINATE)
    assert all(p.dtype == torch.float64 for p in engine.seed_parameters())


def test_injected_slot_changes_the_forward_once_it_blends():
    net, engine = _engine()
    x = torch.randn(2, 3, 8, 8)
    net.eval()
    before = net(x)
    engine.execute(GERMINATE)
    engine.execute(ADVANCE)
    engine.tick()
    _healthy(engine, "net.1")
    assert engine.execute(ADVANCE).success
    assert torch.equal(net(x), before)  # alpha 0 at BLENDING entry
    engine.tick()
    assert not torch.equal(net(x), before)


def test_reattaching_does_not_run_a_slot_twice():
    net = _net()
    MorphogenesisEngine(net, slots=["net.1"])
    engine = MorphogenesisEngine(net, slots=["net.1"])
    calls = []
    engine.slots["net.1"].register_forward_hook(lambda *a: calls.append(1))
    net(torch.zeros(1, 3, 8, 8))
    assert calls == [1]


@pytest.mark.parametrize(
    ("slots", "message"),
    [
        (["net.9"], "unknown slot 'net.9'; accepted: SeedSlot ids in Net (none) or module paths"),
        (["net.1", "net.1"], "slot 'net.1' listed twice"),
        (None, "no SeedSlot modules found in Net; pass slots="),
    ],
)
def test_bad_slots(slots, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MorphogenesisEngine(_net(), slots=slots)


def test_one_slot_name_as_a_string_is_one_slot():
    net = _net()
    engine = MorphogenesisEngine(net, slots="net.1")
    assert engine.slot_ids == ("net.1",)


def test_bad_blueprints_and_max_seeds():
    with pytest.raises(ValueError, match="unknown blueprint 'lora' for cnn; accepted: norm"):
        MorphogenesisEngine(_net(), slots=["net.1"], seeding=SeedingConfig(blueprints=["lora"]),
                            topology="cnn")
    # Inferred topology: checked as soon as the first activation told the slots what they are.
    net = _net()
    engine = MorphogenesisEngine(net, slots=["net.1"], seeding=SeedingConfig(blueprints=["lora"]))
    assert engine.topology is None
    net(torch.zeros(1, 3, 8, 8))
    with pytest.raises(ValueError, match="unknown blueprint 'lora' for cnn; accepted: norm"):
        engine.report()
    with pytest.raises(ValueError, match="max_seeds must be an int >= 1 or None, got 0"):
        MorphogenesisEngine(_net(), slots=["net.1"], seeding=SeedingConfig(max_seeds=0))
    with pytest.raises(ValueError, match="cannot inject slots into a bare Sequential"):
        MorphogenesisEngine(_net().net, slots=["1"])


def test_the_seeding_config_reaches_every_slot():
    seeding = SeedingConfig(gate_mode="strict", gate_config=GateConfig(min_blending_epochs=4),
                            blend_gradient="detached", layer_scale_init=0.5, grad_stats_every=3,
                            seed_optim=SeedOptimConfig(lr=0.5),
                            timing=SeedTiming(incubation=2, blend=6, embargo=1))
    engine = MorphogenesisEngine(_net(), slots=["net.1", "net.3"], seeding=seeding)
    for slot in engine.slots.values():
        assert slot.gates.mode == GateMode.STRICT and slot.blend_gradient == "detached"
        assert slot.layer_scale_init == 0.5 and (slot.blend_ticks, slot.embargo_ticks) == (6, 1)
        # The timing's incubation overrides the config's G2; its G3 stays.
        assert slot.gates.config == GateConfig(min_training_epochs=2, min_blending_epochs=4)
    assert engine.seeding is seeding and engine.grad_stats_every == 3
    assert engine.seed_optim == SeedOptimConfig(lr=0.5)
    # None: every slot keeps its own (a strict slot stays strict, its gain the blueprints').
    model = nn.Sequential(SeedSlot("own", channels=4, gate_mode="strict"))
    engine = MorphogenesisEngine(model)
    assert engine.slots["own"].gates.mode == GateMode.STRICT
    assert engine.slots["own"].layer_scale_init is None and engine.grad_stats_every == 25


def test_a_bad_seeding_is_refused_before_any_slot_is_injected():
    net = _net()
    keys = set(net.state_dict())
    with pytest.raises(ValueError, match=r"timing.blend='200 steps' needs the run's plan"):
        MorphogenesisEngine(net, slots=["net.1"],
                            seeding=SeedingConfig(timing=SeedTiming(blend="200 steps")))
    assert set(net.state_dict()) == keys  # nothing injected
    with pytest.raises(TypeError, match="seeding must be a SeedingConfig or None, got dict"):
        MorphogenesisEngine(net, slots=["net.1"], seeding={"max_seeds": 1})


def test_illegal_action_becomes_wait_with_reason():
    _, engine = _engine()
    outcome = engine.execute(Action(LifecycleOp.FOSSILIZE, 1))
    assert not outcome.success and outcome.executed.op == LifecycleOp.WAIT
    assert outcome.reason == "fossilize_from_dormant"
    assert engine.report().last_action_success is False
    assert engine.execute(GERMINATE).success
    assert engine.execute(ADVANCE).success  # GERMINATED -> TRAINING always passes G1
    gate = engine.execute(ADVANCE)  # TRAINING -> BLENDING: no epochs, no gradients yet
    assert not gate.success and gate.executed == ADVANCE and "G2 failed" in gate.reason


def test_optimizer_follows_seeds_and_schedulers_are_extended():
    net, engine = _engine(seed_optim=SeedOptimConfig(lr=0.5))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0)
    engine.attach_optimizer(opt, [sched, lam])
    engine.execute(GERMINATE)
    assert seed_group_names(opt) == ["seed/net.1"]
    group = opt.param_groups[1]
    assert group["lr"] == 0.5 and group["momentum"] == 0.9
    seed = engine.slots["net.1"].seed_parameters()
    assert [id(p) for p in group["params"]] == [id(p) for p in seed]
    assert len(sched.base_lrs) == 2 and len(lam.lr_lambdas) == 2
    for p in engine.seed_parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert len(opt.state) == len(engine.seed_parameters())
    sched.step()
    assert opt.param_groups[1]["lr"] == 0.25  # scheduled like every other group
    seed_params = engine.seed_parameters()
    for _ in range(5):
        engine.tick()
    assert engine.execute(Action(LifecycleOp.PRUNE, 0, alpha_speed=AlphaSpeed.INSTANT)).success
    assert seed_group_names(opt) == [] and len(sched.base_lrs) == 1 and len(lam.lr_lambdas) == 1
    assert not any(p in opt.state for p in seed_params)
    sched.step()  # still works with one group


def test_gate_blend_parameters_join_the_optimizer():
    net, engine = _engine()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    engine.attach_optimizer(opt)
    gated = GerminationStyle.GATED_GATE
    engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="norm", style=gated))
    gate_ids = {id(p) for p in engine.slots["net.1"].gate.parameters()}
    assert gate_ids <= {id(p) for p in opt.param_groups[1]["params"]}


def test_attach_strips_seed_params_and_restores_saved_group_order():
    net, engine = _engine()
    for sid in ("net.1", "net.3"):
        engine.slots[sid].germinate("norm")
    state = engine.state_dict()
    state["seed_group_order"] = ["seed/net.3", "seed/net.1"]
    engine.load_state_dict(state)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)  # includes the seeds, as a user's might
    engine.attach_optimizer(opt)
    assert seed_group_names(opt) == ["seed/net.3", "seed/net.1"]
    seeds = {id(p) for p in engine.seed_parameters()}
    assert not seeds & {id(p) for p in opt.param_groups[0]["params"]}
    assert len(opt.param_groups[0]["params"]) == len(engine.host_parameters())


def test_prune_live_keeps_fossilized_and_events_are_counted():
    _, engine = _engine()
    slot = engine.slots["net.1"]
    engine.execute(GERMINATE)
    engine.execute(ADVANCE)
    engine.tick()
    _healthy(engine, "net.1")
    engine.execute(ADVANCE)
    for _ in range(5):
        engine.tick()
    assert engine.execute(ADVANCE).success and slot.stage == SeedStage.HOLDING
    slot.record_contribution(2.0)
    assert engine.execute(Action(LifecycleOp.FOSSILIZE, 0)).success
    engine.execute(Action(LifecycleOp.GERMINATE, 1, blueprint="norm"))
    assert engine.prune_live("governor_rollback") == ["net.3"]
    assert slot.stage == SeedStage.FOSSILIZED
    kinds = [(e.slot_id, e.kind, e.reason) for e in engine.events]
    assert kinds == [
        ("net.1", "germinated", "policy"), ("net.1", "fossilized", "policy"),
        ("net.3", "germinated", "policy"), ("net.3", "pruned", "governor_rollback"),
    ]
    assert engine.event_counts()["pruned"] == 1


def test_report_and_state_dict_round_trip():
    _, engine = _engine()
    engine.record_epoch(40.0, 1.5, 1.7)
    engine.execute(GERMINATE)
    engine.tick()
    engine.record_epoch(42.0, 1.4, 1.6)
    report = engine.report(max_epochs=20)
    assert report.epoch == 1 and report.accuracy_history == (40.0, 42.0)
    assert report.val_loss == 1.4 and report.slots[0].stage == SeedStage.GERMINATED
    assert report.seed_params == sum(p.numel() for p in engine.seed_parameters()) > 0
    assert report.host_params == sum(p.numel() for p in _net().parameters())
    other = MorphogenesisEngine(_net(), slots=["net.1", "net.3"])
    other.load_state_dict(engine.state_dict())
    state = other.state_dict()
    state["seed_group_order"] = engine.state_dict()["seed_group_order"]
    assert state == engine.state_dict()
    assert state["last_action"]["blueprint"] == "conv_light"  # by name, not by table index
    other.load_state_dict({**state, "last_action": list(GERMINATE.indices())})  # older format
    assert other.last_action == GERMINATE == engine.last_action


def test_controller_reason_is_recorded_on_the_event():
    _, engine = _engine()
    engine.execute(GERMINATE, reason="plateau of 3 epochs")
    for _ in range(5):
        engine.tick()
    engine.execute(Action(LifecycleOp.PRUNE, 0), reason="no improvement")
    assert [e.reason for e in engine.events] == [
        "policy: plateau of 3 epochs", "policy: no improvement"
    ]
    assert engine.slots["net.1"].state.prune_reason == "policy: no improvement"


@pytest.mark.parametrize("kind", ["lambda", "sequential", "cyclic"])
def test_seed_groups_follow_the_host_schedule(kind):
    net, engine = _engine()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    if kind == "lambda":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5 ** e)
    elif kind == "sequential":
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
        decay = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
        sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[2])
    else:
        sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=2)
    engine.attach_optimizer(opt, [sched])
    for _ in range(3):
        opt.step()
        sched.step()
    engine.execute(GERMINATE)  # mid-schedule
    for _ in range(3):
        opt.step()
        sched.step()
        host, seed = opt.param_groups[0]["lr"], opt.param_groups[1]["lr"]
        assert seed == pytest.approx(host), (kind, host, seed)


def test_a_registered_blueprint_is_allowed_and_germinates_by_name():
    from esper_lightning.blueprints import (
        BlueprintSpec,
        blueprint_table,
        register,
        scratch_registry,
    )

    with scratch_registry():
        register(BlueprintSpec("my_conv", "cnn", lambda c: nn.Conv2d(c, c, 1), "1x1 conv"))
        engine = MorphogenesisEngine(_net(), slots=["net.1"], topology="cnn")  # listed by default
        assert "my_conv" in engine.mask_context.blueprints
        net, engine = _engine(blueprints=["my_conv"])
        masks = engine.report().masks
        assert masks.blueprint.tolist() == [n == "my_conv" for n in blueprint_table()]
        outcome = engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="my_conv"))
        assert outcome.success and engine.slots["net.1"].state.blueprint == "my_conv"
        assert engine.events[-1].blueprint == "my_conv"
        net(torch.zeros(1, 3, 8, 8))  # the seed runs inside the host
    with pytest.raises(ValueError, match="unknown blueprint 'my_conv' for cnn; accepted:"):
        MorphogenesisEngine(_net(), slots=["net.1"], topology="cnn",
                            seeding=SeedingConfig(blueprints=["my_conv"]))


# --- host group names, the timeline, event log lines -------------------------------------------
def test_host_groups_get_names_and_user_names_stay():
    net, engine = _engine()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    engine.attach_optimizer(opt)
    engine.execute(GERMINATE)
    assert [g["name"] for g in opt.param_groups] == ["host", "seed/net.1"]
    params = list(net.parameters())
    two = torch.optim.SGD([{"params": params[:2]}, {"params": params[2:4], "name": "head"},
                           {"params": params[4:]}], lr=0.1)
    name_host_groups(two)
    assert [g["name"] for g in two.param_groups] == ["host/pg1", "head", "host/pg3"]
    clash = torch.optim.SGD([{"params": params[:2], "name": "host"}, {"params": params[2:]}],
                            lr=0.1)
    name_host_groups(clash)
    assert [g["name"] for g in clash.param_groups] == ["host", "host_"]


def test_the_timeline_records_every_slot_after_each_decision_and_survives_state():
    _, engine = _engine()
    engine.execute(GERMINATE)
    engine.tick()
    engine.execute(ADVANCE)
    engine.tick()
    _healthy(engine, "net.1")
    assert engine.execute(ADVANCE).success  # G2 after 1 training epoch (min_training_epochs=1)
    engine.tick()
    rows = [(e.epoch, e.slot_id, e.stage, e.blueprint) for e in engine.timeline]
    assert rows == [
        (0, "net.1", "GERMINATED", "conv_light"), (0, "net.3", "DORMANT", None),
        (1, "net.1", "TRAINING", "conv_light"), (1, "net.3", "DORMANT", None),
        (2, "net.1", "BLENDING", "conv_light"), (2, "net.3", "DORMANT", None),
    ]
    alphas = [e.alpha for e in engine.timeline if e.slot_id == "net.1"]
    assert alphas[:2] == [0.0, 0.0] and alphas[2] == engine.slots["net.1"].alpha > 0
    assert engine.timeline[0].seed_id == engine.slots["net.1"].state.seed_id
    other = MorphogenesisEngine(_net(), slots=["net.1", "net.3"])
    other.load_state_dict(engine.state_dict())
    assert other.timeline == engine.timeline
    state = engine.state_dict()
    del state["timeline"]  # a checkpoint written before the timeline existed
    other.load_state_dict(state)
    assert other.timeline == []


def test_each_lifecycle_event_is_one_info_line(caplog):
    _, engine = _engine()
    with caplog.at_level(logging.INFO, logger="esper_lightning"):
        engine.execute(GERMINATE, reason="plateau")
        engine.tick()
        engine.prune_live("governor_rollback")
    assert [r.getMessage() for r in caplog.records] == [
        "epoch 0: net.1 germinated conv_light (policy: plateau)",
        "epoch 1: net.1 pruned conv_light (governor_rollback)",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_a_loss_scalers_overflow_is_not_read_as_the_seeds_health():
    """Under fp16 a step with an inf gradient is the scaler's to skip: measured only without a
    scaler, where an inf is the seed's own explosion."""
    net, engine = _engine()
    assert engine.execute(GERMINATE).success and engine.execute(ADVANCE).success
    metrics = engine.slots["net.1"].state.metrics
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    for p in engine.seed_parameters():
        p.grad = torch.full_like(p, float("inf"))
    metrics.gradient_health, metrics.has_exploding = 0.7, False
    engine.capture_gradient_stats(scaled=True)
    assert (metrics.gradient_health, metrics.has_exploding) == (0.7, False)  # not measured
    engine.capture_gradient_stats()
    assert (metrics.gradient_health, metrics.has_exploding) == (0.0, True)
    for p in engine.seed_parameters():  # a finite step under the scaler is measured
        p.grad = torch.full_like(p, 1e-3)
    engine.capture_gradient_stats(scaled=True)
    assert (metrics.gradient_health, metrics.has_exploding) == (1.0, False)


def _counted_step(net: nn.Module, x: torch.Tensor) -> int:
    """One real training step of a copy of ``net`` counted by `FlopCounterMode`: apart from the
    ledger's meter (meta tensors, once per architecture)."""
    counter = FlopCounterMode(display=False)
    with counter:
        copy.deepcopy(net)(x).sum().backward()
    return int(counter.get_total_flops())


def test_growth_flops_are_the_live_seeds_share_of_the_steps_and_reach_the_report():
    net, engine = _engine()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    host = _counted_step(net, x)
    engine.compute.end_step(engine.compute.begin_step(net, x))
    assert engine.growth_flops == 0.0 and engine.train_flops == host  # no seed: all the host's
    assert engine.execute(GERMINATE).success
    engine.tick()
    _healthy(engine, "net.1")
    assert engine.execute(ADVANCE).success  # TRAINING: the seed runs in every step
    engine.compute.end_step(engine.compute.begin_step(net, x))
    whole = _counted_step(net, x)
    assert whole > host and engine.growth_flops == whole - host  # the seed's part of the step
    assert engine.train_flops == 2 * host + engine.growth_flops  # the budget counts it whole
    engine.compute.charge_validation(1e6, 3e6)  # validation and counterfactual are no growth
    engine.record_epoch(40.0, 1.5, 1.7)
    report = engine.report(max_epochs=4)
    assert report.growth_flops == whole - host and report.train_flops == engine.train_flops
    engine.prune_live("governor_rollback")
    engine.compute.end_step(engine.compute.begin_step(net, x))
    assert engine.growth_flops == whole - host  # no live seed: the step is the host's again
    assert engine.train_flops == 3 * host + engine.growth_flops
    with pytest.raises(AttributeError):
        engine.growth_flops = 0.0  # read-only: the ledger's kind
