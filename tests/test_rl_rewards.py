"""Reward formulas on hand-built states (real `SeedSlot`s driven through legal transitions)."""

import math

import pytest
from lifecycle_mdp import LifecycleMDP, make_report, optimal_actions

from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import execute_on_slot
from esper_lightning.core.lifecycle import SeedStage
from esper_lightning.core.slots import SeedSlot
from esper_lightning.rl import RewardBreakdown, RewardConfig, RewardMode, compute_reward
from esper_lightning.rl.rewards import potential, seed_attribution

SHAPED = RewardConfig()
GAMMA = SHAPED.gamma  # 0.995


def _slots() -> list[SeedSlot]:
    return [SeedSlot("r0c0", channels=2), SeedSlot("r0c1", channels=2)]


def _to_blending(slot: SeedSlot, blueprint: str, tempo: int = 4) -> SeedSlot:
    """Germinate (accuracy 50 recorded at germination), incubate 10 epochs, start blending."""
    slot.germinate(blueprint, tempo=tempo)
    slot.record_accuracy(50.0)
    assert slot.advance().passed
    for _ in range(10):
        slot.tick()
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    assert slot.advance().passed
    return slot


def _to_holding(slot: SeedSlot, blueprint: str) -> SeedSlot:
    _to_blending(slot, blueprint, tempo=1)
    slot.tick()
    assert slot.advance().passed and slot.stage == SeedStage.HOLDING
    return slot


def _step(slots, action: Action, accuracies=(50.0, 50.0), **reward_kwargs):
    """Report before, execute ``action`` and one epoch tick, report after, reward."""
    config = reward_kwargs.pop("config", SHAPED)
    prev = make_report(slots, accuracies=accuracies[:1])
    result = execute_on_slot(slots[action.slot], action)
    success = result is None or result.passed
    for slot in slots:
        slot.tick()
    after = make_report(slots, accuracies=accuracies, last_action=action, success=success)
    return compute_reward(prev, action, success, after, config, **reward_kwargs)


def _only(breakdown: RewardBreakdown, **expected: float) -> None:
    """Every component equals ``expected`` (missing ones 0) and the total is their sum."""
    for name, value in breakdown.as_dict().items():
        if name != "total":
            assert value == pytest.approx(expected.get(name, 0.0), abs=1e-9), name
    assert breakdown.total == pytest.approx(sum(expected.values()))


# --- building blocks ---------------------------------------------------------------------------
def test_stage_potentials():
    slots = _slots()
    _to_blending(slots[0], "norm")
    slots[0].tick()  # 1 epoch in BLENDING
    views = make_report(slots).slots
    assert potential(views[0], SHAPED) == pytest.approx(3.5 + 0.3)
    assert potential(views[1], SHAPED) == 0.0  # empty
    for _ in range(12):
        slots[0].tick()
    _to_holding(slots[1], "norm")
    views = make_report(slots).slots
    assert views[0].stage == SeedStage.BLENDING  # ramp over; the seed waits for ADVANCE
    assert potential(views[0], SHAPED) == pytest.approx(3.5 + 2.0)  # progress capped
    assert potential(views[1], SHAPED) == pytest.approx(5.5)


def test_seed_attribution_cases():
    assert seed_attribution(-2.0, 5.0) == -2.0  # harmful seeds pay their harm
    assert seed_attribution(2.0, None) == 1.0  # progress unknown: half credit
    assert seed_attribution(2.0, -1.0) == 0.0  # the host did not improve
    assert seed_attribution(2.0, 3.0) == 2.0  # contribution within the host's gain
    assert seed_attribution(6.0, 2.0) == pytest.approx(2 * 2 * 6 / 8)  # harmonic cap


# --- shaped ------------------------------------------------------------------------------------
def test_shaped_wait_with_a_blending_seed():
    slots = _slots()
    seed = _to_blending(slots[1], "norm")  # norm: 5 parameters; tempo 4, linear ramp
    seed.tick()  # 1 epoch in BLENDING, alpha 0.25
    seed.record_accuracy(53.0)  # progress 3 points since germination
    seed.record_contribution(2.0)
    breakdown = _step(slots, Action(), accuracies=(53.0, 53.0))
    # attribution: c = 2 < progress 3 -> 2.0
    # pbrs: 0.3 * (0.995 * (3.5 + 0.3*2) - (3.5 + 0.3*1)) = 0.3 * (4.0795 - 3.8) = 0.08385
    # rent after the step (alpha 0.5): g = (0.0039*1000 + 0.5*5) / 1000 = 0.0064,
    #       0.5 * ln(1.0064) = 0.0031898
    _only(breakdown, attribution=2.0, pbrs=0.08385, rent=-0.5 * math.log(1.0064))


def test_shaped_prune_of_a_harmful_seed():
    slots = _slots()
    seed = _to_holding(slots[0], "depthwise")  # 30 parameters
    seed.record_accuracy(47.0)  # progress -3
    seed.record_contribution(-3.0)
    e_hold = seed.state.metrics.epochs_in_stage
    breakdown = _step(slots, Action(LifecycleOp.PRUNE, slot=0), accuracies=(47.0, 50.0))
    assert slots[0].stage == SeedStage.EMBARGOED
    # attribution: -3 flipped by the prune -> +3; prune shaping c < -0.5 -> +0.15;
    # intervention -0.005; pbrs: 0.3 * (0.995 * 0 - (5.5 + 0.3 * e_hold)); no rent after.
    _only(
        breakdown, attribution=3.0, prune=0.15, intervention=-0.005,
        pbrs=-0.3 * (5.5 + 0.3 * e_hold),
    )


def test_pruning_a_useful_seed_costs():
    slots = _slots()
    seed = _to_holding(slots[1], "norm")
    seed.record_accuracy(54.0)
    seed.record_contribution(4.0)  # progress 4, contribution 4 -> harmonic 4.0
    breakdown = _step(slots, Action(LifecycleOp.PRUNE, slot=1), accuracies=(54.0, 50.0))
    assert breakdown.attribution == pytest.approx(-4.0)
    assert breakdown.prune == pytest.approx(-0.3 - 0.05 * 4.0)


@pytest.mark.parametrize(("hold_epochs", "contribution", "bonus"), [
    (2, 2.0, (0.5 + 0.1 * 2.0) * 2 / 5),  # partial: fewer than 5 epochs in HOLDING
    (6, 2.0, 0.5 + 0.1 * 2.0),
    (6, 0.5, -0.2),  # below the 1-point bar: weak fossilization
])
def test_shaped_fossilize(hold_epochs, contribution, bonus):
    slots = _slots()
    seed = _to_holding(slots[1], "norm")
    for _ in range(hold_epochs):
        seed.tick()
    seed.record_accuracy(50.0 + contribution)
    seed.record_contribution(contribution)
    breakdown = _step(slots, Action(LifecycleOp.FOSSILIZE, slot=1),
                      accuracies=(50.0 + contribution,) * 2)
    assert slots[1].stage == SeedStage.FOSSILIZED
    assert breakdown.fossilize == pytest.approx(bonus)
    assert breakdown.intervention == pytest.approx(-0.01)


def test_failed_gate_costs_and_germination_cost():
    slots = _slots()
    slots[1].germinate("norm")
    assert slots[1].advance().passed  # TRAINING for 0 epochs: G2 will fail
    breakdown = _step(slots, Action(LifecycleOp.ADVANCE, slot=1))
    assert breakdown.intervention == pytest.approx(-0.05)
    # pbrs: TRAINING e0 -> e1
    assert breakdown.pbrs == pytest.approx(0.3 * (GAMMA * (2.0 + 0.3) - 2.0))
    germinate = Action(LifecycleOp.GERMINATE, slot=0, blueprint=3)
    fresh = _slots()
    breakdown = _step(fresh, germinate)
    # GERMINATED after one tick: potential 1.0 + 0.3.
    _only(breakdown, intervention=-0.15, pbrs=0.3 * GAMMA * 1.3)


def test_terminal_and_rollback_terms():
    slots = _slots()
    breakdown = _step(slots, Action(), accuracies=(60.0, 62.0), terminal=True)
    _only(breakdown, terminal=0.05 * 62.0)
    slots = _slots()
    _to_holding(slots[1], "norm")
    e_hold = slots[1].state.metrics.epochs_in_stage
    breakdown = _step(slots, Action(), terminal=True, rollback=True)
    # A rollback is a true terminal: no accuracy term, the next potential counts as 0.
    assert breakdown.terminal == 0.0 and breakdown.rollback == -10.0
    assert breakdown.pbrs == pytest.approx(-0.3 * (5.5 + 0.3 * e_hold))


def test_illegal_action_raises():
    slots = _slots()
    prev = make_report(slots)
    with pytest.raises(ValueError, match="illegal"):
        compute_reward(prev, Action(LifecycleOp.FOSSILIZE, slot=0), False, prev, SHAPED)


def test_pbrs_telescopes_over_an_episode():
    """With gamma = 1 the shaping terms of an episode sum to Φ(last) − Φ(first)."""
    config = RewardConfig(gamma=1.0)
    env = LifecycleMDP("harmful")
    prev = env.reset()
    start = sum(potential(s, config) for s in prev.slots)
    total = 0.0
    for action in optimal_actions("harmful"):
        report, _, _ = env.step(action)
        total += compute_reward(prev, action, report.last_action_success, report, config).pbrs
        prev = report
    end = sum(potential(s, config) for s in prev.slots)
    assert total == pytest.approx(0.3 * (end - start))


# --- other modes -------------------------------------------------------------------------------
def test_simplified_mode():
    config = RewardConfig(mode="simplified")
    slots = _slots()
    seed = _to_holding(slots[1], "norm")
    for _ in range(7):
        seed.tick()
    seed.record_contribution(2.0)
    breakdown = _step(slots, Action(LifecycleOp.FOSSILIZE, slot=1), accuracies=(55.0, 60.0),
                      config=config, terminal=True)
    # pbrs: HOLDING 7 epochs (5.5 + 2.0 capped) -> FOSSILIZED 1 epoch (6.0 + 0.3);
    # cost 0.01 for a non-WAIT op; terminal: 3 * 60 / 100 + 2 * (one contributing fossil).
    _only(breakdown, pbrs=0.3 * (GAMMA * 6.3 - 7.5), intervention=-0.01, terminal=1.8 + 2.0)


def test_sparse_mode():
    config = RewardConfig(mode=RewardMode.SPARSE)
    slots = _slots()
    _to_holding(slots[0], "depthwise")  # 30 seed parameters, host 1000
    _only(_step(slots, Action(), config=config))
    slots = _slots()
    _to_holding(slots[0], "depthwise")
    breakdown = _step(slots, Action(), accuracies=(70.0, 70.0), config=config, terminal=True)
    _only(breakdown, terminal=0.70 - 0.1 * 30 / 1000)
    breakdown = _step(_slots(), Action(), config=config, terminal=True, rollback=True)
    _only(breakdown, rollback=-10.0)


def test_config_validation():
    with pytest.raises(ValueError):
        RewardConfig(mode="dense")
    with pytest.raises(ValueError, match="op_costs"):
        RewardConfig(op_costs={LifecycleOp.WAIT: 0.0})
