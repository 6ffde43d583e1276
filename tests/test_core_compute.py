"""`ComputeLedger`: charging by kind, the budget's stepping (cost and rate at the middle of a
batch), the architecture cache and its invalidation, the state round trip and resume."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_lightning.core.compute import FLOP_KINDS, ComputeLedger
from esper_lightning.core.flops import FlopMeter
from esper_lightning.schedule import LRSchedule, set_base_lrs

LINEAR_STEP = 2 * 8 * 64 * 32 * 2  # forward 2·B·in·out, the weight's gradient as much


def _groups(lr: float = 1.0) -> list[dict]:
    groups = [{"lr": lr, "params": []}]
    set_base_lrs(groups)
    return groups


def test_every_kind_is_charged_apart_and_only_training_spends_the_budget():
    ledger = ComputeLedger(budget_flops=100.0)
    ledger.charge(10)
    ledger.charge(30, "validation")
    ledger.charge(5, "counterfactual")
    assert ledger.flops == {"train": 10.0, "validation": 30.0, "counterfactual": 5.0}
    assert tuple(ledger.flops) == FLOP_KINDS
    assert ledger.train_flops == 10.0 and ledger.fraction == pytest.approx(0.1)
    assert not ledger.exhausted
    ledger.charge(90)
    assert ledger.exhausted


@pytest.mark.parametrize(("kind", "flops", "message"), [
    ("growth?", 1.0, "unknown FLOP kind 'growth\\?'; accepted: train, validation"),
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
    assert cost == LINEAR_STEP and done and ledger.train_flops == budget
    # The cosine multiplier at the middle of each quarter: 1/8, 3/8, 5/8, 7/8 of the budget.
    expected = [LRSchedule("cosine").multiplier(f / 8) for f in (1, 3, 5, 7)]
    assert rates == pytest.approx(expected)
    # Data-parallel ranks each take a batch: the step costs them all.
    assert ComputeLedger().begin_step(layer, x, ranks=3) == 3 * LINEAR_STEP


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
    ledger.charge(1000)
    ledger.charge(70, "validation")
    ledger.charge(7, "counterfactual")
    resumed = ComputeLedger(budget_flops=1e6)
    resumed.load_state_dict(ledger.state_dict())
    assert resumed.flops == ledger.flops
    resumed.charge(1000)
    assert resumed.train_flops == 2000 and resumed.fraction == pytest.approx(0.002)


def test_a_state_written_before_the_kinds_resumes_its_training_flops_only():
    ledger = ComputeLedger()
    ledger.charge(5, "validation")  # e.g. from the engine's own older state
    ledger.load_state_dict({"train_flops": 123.0, "budget_flops": None, "budget_scale": 1.0})
    assert ledger.flops == {"train": 123.0, "validation": 5.0, "counterfactual": 0.0}


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
