"""`schedule`: learning-rate multipliers over the fraction of a run spent."""

import math

import pytest
import torch
from torch import nn

from esper_lightning.core.optim import SeedOptimConfig, add_seed_group
from esper_lightning.schedule import (
    LRSchedule,
    apply_multiplier,
    batch_fraction,
    schedule_error,
    set_base_lrs,
)


@pytest.mark.parametrize("kind", ["wsd", "cosine"])
@pytest.mark.parametrize("floor", [0.0, 0.1, 0.37])
def test_the_decay_ends_at_its_floor_exactly_at_the_budget(kind, floor):
    schedule = LRSchedule(kind, warmup_fraction=0.03, decay_fraction=0.2, min_lr_ratio=floor)
    assert schedule.multiplier(1.0) == floor  # exactly, not approximately
    assert schedule.multiplier(1.5) == floor  # a last batch past the budget stays there
    just_before = schedule.multiplier(1.0 - 1e-9)
    assert floor < just_before < floor + 1e-6 or floor == just_before == 1.0
    # After the warmup (which starts from 0) the lowest multiplier is the floor, at the end.
    assert min(schedule.multiplier(k / 1000) for k in range(30, 1001)) == floor


def test_wsd_warms_up_holds_and_decays_linearly():
    schedule = LRSchedule("wsd", warmup_fraction=0.1, decay_fraction=0.2, min_lr_ratio=0.2)
    assert schedule.multiplier(0.0) == 0.0
    assert schedule.multiplier(0.05) == pytest.approx(0.5)
    assert schedule.multiplier(0.1) == schedule.multiplier(0.5) == schedule.multiplier(0.8) == 1
    assert schedule.multiplier(0.9) == pytest.approx(0.2 + 0.8 * 0.5)  # half way down
    assert LRSchedule("wsd").multiplier(0.9) == pytest.approx(0.5)  # decay 0.2 by default


def test_cosine_decays_after_the_warmup_by_default():
    schedule = LRSchedule("cosine", warmup_fraction=0.2)
    assert schedule.decay_span == pytest.approx(0.8)
    assert schedule.multiplier(0.2) == 1.0
    assert schedule.multiplier(0.6) == pytest.approx(0.5)  # the middle of the half cosine
    assert schedule.multiplier(0.8) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.75)))
    late = LRSchedule("cosine", decay_fraction=0.5)  # stable until half way
    assert late.multiplier(0.5) == 1.0 and late.multiplier(0.75) == pytest.approx(0.5)


def test_constant_is_one_and_leaves_nothing_to_set():
    assert all(LRSchedule().multiplier(f) == 1.0 for f in (0.0, 0.5, 1.0))


@pytest.mark.parametrize(("settings", "message"), [
    (("linear", 0.0, None, 0.0), "unknown lr_schedule 'linear'; accepted: constant, wsd, cosine"),
    (("wsd", 1.0, None, 0.0), "warmup_fraction must be in [0, 1), got 1.0"),
    (("wsd", -0.1, None, 0.0), "warmup_fraction must be in [0, 1), got -0.1"),
    (("cosine", 0.0, 0.0, 0.0), "decay_fraction must be in (0, 1] or null, got 0.0"),
    (("wsd", 0.0, 1.5, 0.0), "decay_fraction must be in (0, 1] or null, got 1.5"),
    (("wsd", 0.5, 0.6, 0.0), "warmup_fraction=0.5 + decay_fraction=0.6 exceed the whole run"),
    (("wsd", 0.9, None, 0.0), "warmup_fraction=0.9 + decay_fraction=0.2 exceed the whole run"),
    (("cosine", 0.0, None, 1.5), "min_lr_ratio must be in [0, 1], got 1.5"),
    (("constant", 0.03, None, 0.0), "warmup_fraction=0.03 has no effect with lr_schedule "
                                    "'constant'"),
])
def test_bad_schedules_are_one_line_naming_the_value(settings, message):
    assert message in schedule_error(*settings)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace("+", r"\+")):
        LRSchedule(*settings)


def test_a_batch_takes_the_multiplier_at_its_middle():
    assert batch_fraction(spent=90.0, cost=10.0, total=100.0) == 0.95
    assert batch_fraction(0, 1, 8) == 1 / 16


def test_a_seed_group_born_mid_run_starts_at_the_current_multiplier_of_its_own_base():
    host = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(host.parameters(), lr=0.1)
    set_base_lrs(optimizer.param_groups)
    apply_multiplier(optimizer.param_groups, 0.25)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    seed = nn.Linear(4, 4)
    add_seed_group(optimizer, "seed/r0c0", list(seed.parameters()), SeedOptimConfig(lr=0.4))
    group = optimizer.param_groups[-1]
    assert (group["initial_lr"], group["lr"]) == (0.4, pytest.approx(0.1))
    apply_multiplier(optimizer.param_groups, 0.5)  # the next batch: every group follows
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.05, 0.2])
