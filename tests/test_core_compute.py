"""`ComputeLedger`: charging by kind, the budget's stepping (cost and rate at the middle of a
batch), the architecture cache and its invalidation, the state round trip and resume, and the
growth share of a step (what live seeds add), against counts taken apart from the meter."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from esper_lightning.core.compute import BUDGET_KINDS, FLOP_KINDS, ComputeLedger, StepCost
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.flops import FlopMeter, host_structure, live_slots, structure
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts.gpt import GPTHost
from esper_lightning.hosts.presets import GPTConfig
from esper_lightning.schedule import BudgetSchedule, LRSchedule, set_base_lrs

LINEAR_STEP = 2 * 8 * 64 * 32 * 2  # forward 2·B·in·out, the weight's gradient as much


def _groups(lr: float = 1.0) -> list[dict]:
    groups = [{"lr": lr, "params": []}]
    set_base_lrs(groups)
    return groups


def test_every_kind_is_charged_apart_and_the_budget_counts_the_training_steps_whole():
    ledger = ComputeLedger(budget_flops=100.0)
    ledger.charge(10)
    ledger.charge(20, "growth")
    ledger.charge(30, "validation")
    ledger.charge(5, "counterfactual")
    assert ledger.flops == {"train": 10.0, "growth": 20.0, "validation": 30.0,
                            "counterfactual": 5.0}
    assert tuple(ledger.flops) == FLOP_KINDS and BUDGET_KINDS == ("train", "growth")
    assert ledger.spent == ledger.train_flops == 30.0 and ledger.fraction == pytest.approx(0.3)
    assert not ledger.exhausted
    ledger.charge(69, "growth")
    assert not ledger.exhausted  # 99: validation and the counterfactual spend no budget
    ledger.charge(1)
    assert ledger.exhausted


@pytest.mark.parametrize(("kind", "flops", "message"), [
    ("growth?", 1.0, "unknown FLOP kind 'growth\\?'; accepted: train, growth, validation, "
     "counterfactual$"),
    ("train", -1.0, "a charge must be >= 0 FLOPs, got -1.0"),
    ("train", float("nan"), "a charge must be >= 0 FLOPs, got nan"),
])
def test_a_bad_charge_is_refused_in_one_line(kind, flops, message):
    ledger = ComputeLedger()
    with pytest.raises(ValueError, match=message):
        ledger.charge(flops, kind)
    assert ledger.flops == dict.fromkeys(FLOP_KINDS, 0.0)  # nothing half-charged


def test_validation_charges_what_the_counterfactual_adds_by_one_rule():
    beside, through = ComputeLedger(), ComputeLedger()
    # A Trainer: the module's validation step (100) and the counterfactual run beside it (300).
    beside.charge_validation(100, 300)
    # An env: the counterfactual's main configuration is the validation forward itself.
    through.charge_validation(100, 300, forward_included=True)
    assert (beside.flops["validation"], beside.flops["counterfactual"]) == (100, 300)
    assert (through.flops["validation"], through.flops["counterfactual"]) == (100, 200)
    beside.charge_validation(100)  # no seed live: no counterfactual
    assert beside.flops["counterfactual"] == 300 and beside.flops["validation"] == 200


def test_a_step_is_metered_and_its_rate_set_at_the_middle_of_the_batch():
    budget = 4 * LINEAR_STEP
    ledger = ComputeLedger(budget_flops=budget, schedule=LRSchedule("cosine"))
    layer, x = nn.Linear(64, 32), torch.zeros(8, 64)
    groups, rates = _groups(), []
    for _ in range(4):
        cost = ledger.begin_step(layer, x, param_groups=groups)
        rates.append(groups[0]["lr"])
        done = ledger.end_step(cost)
    assert cost == StepCost(LINEAR_STEP) and done and ledger.train_flops == budget
    # The cosine multiplier at the middle of each quarter: 1/8, 3/8, 5/8, 7/8 of the budget.
    expected = [LRSchedule("cosine").multiplier(f / 8) for f in (1, 3, 5, 7)]
    assert rates == pytest.approx(expected)
    # Data-parallel ranks each take a batch: the step costs them all.
    assert ComputeLedger().begin_step(layer, x, ranks=3) == StepCost(3 * LINEAR_STEP)


def test_a_constant_schedule_leaves_the_rate_alone_and_no_budget_needs_planned_steps():
    ledger = ComputeLedger()
    groups = _groups(0.5)
    groups[0]["lr"] = 0.123  # whatever the user's scheduler set
    ledger.begin_step(nn.Linear(64, 32), torch.zeros(8, 64), param_groups=groups)
    assert groups[0]["lr"] == 0.123
    wsd = ComputeLedger(schedule=LRSchedule("wsd"))
    with pytest.raises(RuntimeError, match="needs a budget or a planned number of steps"):
        wsd.begin_step(nn.Linear(64, 32), torch.zeros(8, 64), param_groups=_groups())
    wsd.begin_step(nn.Linear(64, 32), torch.zeros(8, 64), param_groups=(g := _groups()),
                   step=0, planned_steps=10)
    assert g[0]["lr"] == pytest.approx(LRSchedule("wsd").multiplier(0.05))


def _stepped(ledger: ComputeLedger, steps: int) -> list[float]:
    """The multiplier of each of ``steps`` steps of a 64-to-32 linear layer (`LINEAR_STEP`)."""
    layer, x, groups, rates = nn.Linear(64, 32), torch.zeros(8, 64), _groups(), []
    for _ in range(steps):
        ledger.end_step(ledger.begin_step(layer, x, param_groups=groups))
        rates.append(groups[0]["lr"])
        assert ledger.multiplier == rates[-1]
    return rates


def test_a_budget_schedule_warms_up_over_flops_and_decays_over_the_budget():
    """Warmup over two steps' FLOPs, a decay over the last half of eight: the multiplier at
    each batch's middle, 1/2, 3/2, ..., 15/2 steps' FLOPs."""
    schedule = BudgetSchedule(LRSchedule("wsd", decay_fraction=0.5), 2 * LINEAR_STEP)
    ledger = ComputeLedger(8 * LINEAR_STEP, schedule=schedule)
    assert _stepped(ledger, 8) == pytest.approx(
        [0.25, 0.75, 1.0, 1.0, 0.875, 0.625, 0.375, 0.125], rel=1e-12)
    assert ledger.exhausted and ledger.middle(LINEAR_STEP) == 8.5 * LINEAR_STEP
    # Its warmup is its own: a constant shape warms up too, then holds.
    flat = ComputeLedger(8 * LINEAR_STEP, schedule=BudgetSchedule(LRSchedule(), 2 * LINEAR_STEP))
    assert _stepped(flat, 4) == [0.25, 0.75, 1.0, 1.0]
    unbudgeted = ComputeLedger(schedule=schedule)
    with pytest.raises(RuntimeError, match="^a BudgetSchedule needs a budget; accepted: "
                                           r"set_budget\(> 0\) before the first step$"):
        _stepped(unbudgeted, 1)


def test_a_rewarm_ramps_the_rate_from_zero_over_flops_from_where_it_is_called():
    ledger = ComputeLedger(schedule=BudgetSchedule(LRSchedule("wsd", decay_fraction=0.2),
                                                   LINEAR_STEP))
    ledger.set_budget(100 * LINEAR_STEP)
    assert _stepped(ledger, 2) == [0.5, 1.0]
    ledger.rewarm(4 * LINEAR_STEP)  # a growth here: its ramp reads each batch's middle too
    assert _stepped(ledger, 5) == [0.125, 0.375, 0.625, 0.875, 1.0]
    ledger.rewarm(2 * LINEAR_STEP)  # the next growth starts it again
    assert _stepped(ledger, 2) == [0.25, 0.75]
    # A constant schedule re-warms too: the rate is set only while a ramp is on.
    constant = ComputeLedger()
    constant.rewarm(2 * LINEAR_STEP)
    assert _stepped(constant, 3) == [0.25, 0.75, 1.0]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=f"^a re-warm takes > 0 FLOPs, got {bad!r}$"):
            ledger.rewarm(bad)


def test_set_budget_moves_the_budget_and_keeps_what_was_spent():
    ledger = ComputeLedger(10 * LINEAR_STEP, schedule=LRSchedule("wsd", decay_fraction=0.5))
    _stepped(ledger, 3)
    ledger.set_budget(3 * LINEAR_STEP)  # a branch of a smaller budget: spent already
    assert ledger.spent == 3 * LINEAR_STEP and ledger.exhausted
    ledger.set_budget(4 * LINEAR_STEP)
    assert _stepped(ledger, 1) == [pytest.approx(0.25)]  # the middle of its last eighth
    with pytest.raises(ValueError, match=r"^budget_flops must be > 0 or None, got 0$"):
        ledger.set_budget(0)
    ledger.set_budget(None)
    assert not ledger.exhausted and ledger.fraction is None


def test_a_branch_puts_back_every_kind_and_the_rewarm_from_the_state():
    """What a branched cooldown saves and restores: a branch's steps, validations and
    re-warm leave no trace once the state is loaded back."""
    ledger = ComputeLedger(schedule=BudgetSchedule(LRSchedule("wsd"), LINEAR_STEP))
    ledger.set_budget(100 * LINEAR_STEP)
    _stepped(ledger, 2)
    ledger.rewarm(4 * LINEAR_STEP)
    ledger.charge_validation(70)
    saved = ledger.state_dict()
    shared = _stepped(copy.deepcopy(ledger), 3)
    ledger.rewarm(LINEAR_STEP)  # the branch's own
    _stepped(ledger, 5)
    ledger.charge_validation(30)
    ledger.load_state_dict(saved)
    assert ledger.flops == {"train": 2 * LINEAR_STEP, "growth": 0.0, "validation": 70.0,
                            "counterfactual": 0.0}
    assert saved["rewarm"] == [2 * LINEAR_STEP, 4 * LINEAR_STEP]
    assert _stepped(ledger, 3) == shared == [0.125, 0.375, 0.625]
    ledger.load_state_dict({"flops": {"train": 5.0}})  # written before re-warms: none
    assert ledger.state_dict()["rewarm"] is None


def test_the_architecture_is_read_again_only_when_invalidated_or_the_key_moves():
    ledger, model = ComputeLedger(), nn.Sequential(nn.Linear(4, 4))
    first = ledger.architecture(model, key=0)
    model.append(nn.Linear(4, 4))  # unseen until someone says a slot changed
    assert ledger.architecture(model, key=0) == first
    revision = ledger.revision
    ledger.invalidate()
    assert ledger.revision == revision + 1
    assert ledger.architecture(model, key=0) != first
    assert len(ledger.architecture(model, key=1)[1]) == 4  # two layers' weight and bias


def test_the_state_round_trips_and_a_resumed_ledger_goes_on():
    ledger = ComputeLedger(budget_flops=1e6, budget_scale=2.0)
    ledger.end_step(StepCost(1000, 300))
    ledger.charge(70, "validation")
    ledger.charge(7, "counterfactual")
    resumed = ComputeLedger(budget_flops=1e6)
    resumed.load_state_dict(ledger.state_dict())
    assert resumed.flops == ledger.flops == {"train": 1000, "growth": 300, "validation": 70,
                                             "counterfactual": 7}
    resumed.end_step(StepCost(1000, 200))
    assert resumed.flops["growth"] == 500 and resumed.spent == 2500
    assert resumed.fraction == pytest.approx(0.0025)


def test_a_state_written_before_growth_was_told_apart_resumes_every_kind_it_kept():
    # Such a ledger charged the live seeds' share to train: the budget it spent is the same.
    ledger = ComputeLedger(budget_flops=1e6)
    ledger.charge(9, "growth")  # whatever this ledger held before: the state replaces it
    ledger.load_state_dict({"flops": {"train": 500.0, "validation": 7.0, "counterfactual": 1.0},
                            "budget_flops": 1e6, "budget_scale": 1.0})
    assert ledger.flops == {"train": 500.0, "growth": 0.0, "validation": 7.0,
                            "counterfactual": 1.0}
    assert ledger.spent == 500.0 and ledger.fraction == pytest.approx(5e-4)
    ledger.end_step(StepCost(100, 40))
    assert ledger.flops["growth"] == 40.0 and ledger.spent == 640.0


def test_a_state_written_before_the_kinds_resumes_its_training_flops_only():
    ledger = ComputeLedger()
    ledger.charge(5, "validation")  # e.g. from the engine's own older state
    ledger.load_state_dict({"train_flops": 123.0, "budget_flops": None, "budget_scale": 1.0})
    assert ledger.flops == {"train": 123.0, "growth": 0.0, "validation": 5.0,
                            "counterfactual": 0.0}


def test_a_total_without_its_split_is_the_hosts_and_a_plain_number_is_training():
    ledger = ComputeLedger(budget_flops=1000.0)
    ledger.end_step(StepCost(100, 50))
    ledger.restore_train_flops(120.0)  # a snapshot that kept the total alone
    assert (ledger.flops["train"], ledger.flops["growth"], ledger.spent) == (120.0, 0.0, 120.0)
    assert not ledger.end_step(30)  # a plain number: a loop that meters no seed
    assert (ledger.flops["train"], ledger.flops["growth"]) == (150.0, 0.0)
    with pytest.raises(ValueError, match="training FLOPs must be >= 0, got -1"):
        ledger.restore_train_flops(-1)


def test_reset_starts_a_new_episode_but_keeps_the_meters_cache():
    meter = FlopMeter()
    ledger = ComputeLedger(budget_flops=10.0, meter=meter)
    ledger.begin_step(nn.Linear(64, 32), torch.zeros(8, 64))
    ledger.charge(3, "validation")
    ledger.reset(20.0, budget_scale=2.0)
    assert ledger.flops == dict.fromkeys(FLOP_KINDS, 0.0)
    assert (ledger.budget_flops, ledger.budget_scale) == (20.0, 2.0)
    ledger.begin_step(nn.Linear(64, 32), torch.zeros(8, 64))
    assert ledger.meter is meter and meter.measurements == 1  # no second meta pass
    with pytest.raises(ValueError, match="budget_flops must be > 0 or None, got -1"):
        ledger.reset(-1)


def test_a_step_like_the_last_costs_what_it_cost_until_something_moves():
    ledger, model = ComputeLedger(), nn.Sequential(nn.Linear(64, 32))
    x = torch.zeros(8, 64)
    assert ledger.training_cost(model, x, key=0) == LINEAR_STEP
    model.append(nn.Linear(32, 32))  # unannounced: the same step as far as the ledger knows
    assert ledger.training_cost(model, x, key=0) == LINEAR_STEP
    ledger.invalidate()  # what the engine says when a slot changes
    grown = ledger.training_cost(model, x, key=0)
    assert grown == LINEAR_STEP + 2 * 8 * 32 * 32 * 3  # the second layer's input grad too
    assert ledger.training_cost(model, torch.zeros(4, 64), key=0) == grown // 2  # a new shape
    assert ledger.meter.measurements == 3


def test_structures_the_caller_read_stand_until_it_reads_new_ones():
    ledger, model = ComputeLedger(), nn.Sequential(nn.Linear(64, 32))
    x = torch.zeros(8, 64)
    arch = structure(model)
    host = host_structure(model, arch)
    assert host is arch  # no seed: the host is the whole model
    assert ledger.step_cost(model, x, arch=arch, host_arch=host) == StepCost(LINEAR_STEP)
    model.append(nn.Linear(32, 32))  # the caller says the architecture is the one it read
    assert ledger.step_cost(model, x, arch=arch, host_arch=host) == StepCost(LINEAR_STEP)
    assert ledger.meter.measurements == 1
    arch = structure(model)  # read again (an env's next epoch)
    grown = ledger.step_cost(model, x, arch=arch, host_arch=host_structure(model, arch))
    assert grown == StepCost(LINEAR_STEP + 2 * 8 * 32 * 32 * 3)
    half = ledger.step_cost(model, torch.zeros(4, 64), arch=arch, host_arch=arch)
    assert half == StepCost(grown.train // 2) and ledger.meter.measurements == 3


# --- the growth share: what live seeds add to a step ------------------------------------------
B, T, D = 4, 16, 32


def _gpt() -> GPTHost:
    torch.manual_seed(0)
    return GPTHost(GPTConfig(block_size=T, n_layer=1, n_head=4, n_embd=D), slots=["r0c0"])


def _grown(stage: str, blueprint: str = "lora") -> tuple[GPTHost, SeedSlot]:
    """A one-block GPT whose slot holds a ``blueprint`` seed in ``stage`` (lifecycle driven by
    hand past gates that want measurements)."""
    host = _gpt()
    slot = MorphogenesisEngine(
        host, seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=0))
    ).slots["r0c0"]
    slot.germinate(blueprint)
    assert slot.state is not None
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    order = ("GERMINATED", "TRAINING", "BLENDING", "HOLDING", "FOSSILIZED")
    for _ in range(order.index(stage)):
        if slot.stage.name == "BLENDING":
            while slot.alpha < 1.0:
                slot.tick()
        if slot.stage.name == "HOLDING":
            slot.state.metrics.counterfactual_contribution = 1.0  # G5 wants a contribution
            assert slot.fossilize().passed
        else:
            assert slot.advance().passed
    assert slot.stage.name == stage
    return host, slot


def counted_step(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one real training step of a copy of ``model`` (forward, then the backward of
    the summed output), by `FlopCounterMode` on real tensors: apart from the meter, which
    counts on meta tensors and never runs a step. Attention under the math backend, which the
    counter has formulas for."""
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        copy.deepcopy(model)(x).float().sum().backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize(("stage", "live"), [("GERMINATED", False), ("TRAINING", True),
                                             ("BLENDING", True), ("HOLDING", True),
                                             ("FOSSILIZED", False)])
def test_growth_is_what_the_live_seed_adds_counted_apart(stage, live):
    tokens = torch.zeros(B, T, dtype=torch.long)
    host, slot = _grown(stage)
    bare = counted_step(_gpt(), tokens)  # the same host, its slot empty
    whole = counted_step(host, tokens)
    ledger = ComputeLedger(budget_flops=1e12)
    for _ in range(3):
        ledger.end_step(ledger.begin_step(host, tokens))
    # What the budget spends is the whole step, as before the split: the meter's count alone.
    assert ledger.spent == 3 * whole == 3 * FlopMeter().training_step(host, tokens)
    if live:  # a seed judged: the host's share is the bare host's step, the rest is growth
        assert whole > bare
        assert ledger.flops == {"train": 3 * bare, "growth": 3 * (whole - bare),
                                "validation": 0, "counterfactual": 0}
    else:  # a germinated seed does not run yet; a fossilized one is the host's
        assert ledger.flops["growth"] == 0 and ledger.flops["train"] == 3 * whole
        assert (whole == bare) == (stage == "GERMINATED")
    assert (slot in live_slots(host)) == live


def test_an_incubating_seeds_growth_is_its_own_step_on_a_detached_input():
    tokens = torch.zeros(B, T, dtype=torch.long)
    host, slot = _grown("TRAINING")
    assert slot.seed is not None
    alone = counted_step(slot.seed, torch.zeros(B, T, D))  # a leaf input: no input gradient
    assert ComputeLedger().begin_step(host, tokens) == StepCost(counted_step(_gpt(), tokens),
                                                                alone)


def test_the_seeds_off_host_is_the_one_measured_before_the_germination():
    tokens = torch.zeros(B, T, dtype=torch.long)
    host, _ = _grown("BLENDING")
    meter = FlopMeter()
    ledger = ComputeLedger(meter=meter)
    bare = meter.training_step(_gpt(), tokens)  # the host before its seed germinated
    assert meter.measurements == 1
    cost = ledger.begin_step(host, tokens, key=0, ranks=2)
    assert meter.measurements == 2  # the grown step alone: the host's share was cached
    assert cost.train == 2 * bare and cost.total == 2 * meter.training_step(host, tokens)
    assert host_structure(_gpt()) == host_structure(host) != structure(host)
    assert ledger.begin_step(host, tokens, key=0) == StepCost(bare, cost.growth // 2)
    assert meter.measurements == 2  # the same step again: no signature hashed or measured


def test_a_fossilization_moves_the_seeds_share_to_the_host_without_a_new_measurement():
    tokens = torch.zeros(B, T, dtype=torch.long)
    host, slot = _grown("HOLDING")
    ledger = ComputeLedger()
    holding = ledger.begin_step(host, tokens, key=0)
    measured = ledger.meter.measurements
    assert slot.state is not None
    slot.state.metrics.counterfactual_contribution = 1.0
    assert slot.fossilize().passed
    ledger.invalidate()  # what the engine says after every operation on a slot
    fossil = ledger.begin_step(host, tokens, key=0)
    assert fossil == StepCost(holding.total) and holding.growth > 0
    assert ledger.meter.measurements == measured  # the same products: both were cached
