import dataclasses
import math

import numpy as np
import pytest
import torch
from lifecycle_mdp import make_report

from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.alpha import AlphaMode
from esper_lightning.core.lifecycle import STAGE_ONE_HOT_INDEX, SeedStage
from esper_lightning.core.slots import SeedSlot
from esper_lightning.rl import (
    BASE_DIM,
    SLOT_DIM,
    batch_observations,
    blueprint_indices,
    build_observation,
    obs_dim,
)
from esper_lightning.rl import observations as ob

HORIZON = 20


def _slots(n: int = 2) -> list[SeedSlot]:
    return [SeedSlot(f"r0c{i}", channels=4) for i in range(n)]


def _slot_block(obs: np.ndarray, i: int) -> np.ndarray:
    return obs[BASE_DIM + SLOT_DIM * i : BASE_DIM + SLOT_DIM * (i + 1)]


def _blending(slot: SeedSlot) -> SeedSlot:
    """GERMINATED -> TRAINING (10 epochs, measured) -> BLENDING, one tick into a 4-tick ramp."""
    slot.germinate("norm", tempo=4)
    slot.advance()
    metrics = slot.state.metrics
    for _ in range(10):
        metrics.gradient_health, metrics.has_exploding = 0.9, False
        slot.tick()
    metrics.gradient_health, metrics.gradient_norm = 0.8, 2.5
    metrics.has_vanishing = True
    assert slot.advance().passed
    slot.tick()
    slot.record_contribution(3.0)
    slot.tick()
    slot.record_contribution(25.0)  # clipped
    return slot


def test_obs_dim_is_24_plus_30_per_slot():
    assert obs_dim(1) == 54
    assert obs_dim(3) == 114
    with pytest.raises(ValueError):
        obs_dim(0)


def test_base_features_at_episode_start():
    report = make_report(_slots(), epoch=0, max_epochs=HORIZON, accuracies=[42.0, 45.0])
    obs = build_observation(report)
    assert obs.shape == (obs_dim(2),) and obs.dtype == np.float32
    assert obs[ob.EPOCH] == 0.0
    loss = report.val_loss
    assert obs[ob.VAL_LOSS] == pytest.approx(math.log1p(loss) / 7.0)
    assert obs[ob.VAL_ACC] == pytest.approx(0.45)
    # History is left-padded with the "never measured" sentinel, newest last.
    np.testing.assert_allclose(obs[ob.ACC_HISTORY : ob.ACC_HISTORY + 5], [-1, -1, -1, 0.42, 0.45])
    assert list(obs[ob.LOSS_HISTORY : ob.LOSS_HISTORY + 3]) == [-1.0] * 3
    assert obs[ob.LOSS_HISTORY + 4] == pytest.approx(obs[ob.VAL_LOSS])
    assert list(obs[ob.N_TRAINING : ob.N_HOLDING + 1]) == [0.0, 0.0, 0.0]
    assert obs[ob.LAST_SUCCESS] == 1.0
    assert list(obs[ob.LAST_OP : ob.LAST_OP + 6]) == [1, 0, 0, 0, 0, 0]  # WAIT
    assert not obs[BASE_DIM:].any()  # empty slots are all zeros, no sentinels
    assert list(blueprint_indices(report)) == [-1, -1]


def test_epoch_history_last_action_and_counts():
    slots = _slots()
    _blending(slots[0])
    accuracies = [float(a) for a in range(30, 38)]
    report = make_report(
        slots, epoch=25, max_epochs=HORIZON, accuracies=accuracies,
        last_action=Action(LifecycleOp.ADVANCE, slot=0), success=False,
    )
    obs = build_observation(report)
    assert obs[ob.EPOCH] == 1.0  # capped at the horizon
    history = obs[ob.ACC_HISTORY : ob.ACC_HISTORY + 5]
    np.testing.assert_allclose(history, [0.33, 0.34, 0.35, 0.36, 0.37], rtol=1e-6)
    assert obs[ob.N_BLENDING] == 0.5 and obs[ob.N_TRAINING] == 0.0
    assert obs[ob.LAST_SUCCESS] == 0.0
    assert obs[ob.LAST_OP + LifecycleOp.ADVANCE] == 1.0
    assert obs[ob.LAST_OP : ob.LAST_OP + 6].sum() == 1


def test_blending_slot_features():
    slots = _slots()
    slot = _blending(slots[1])
    report = make_report(slots, max_epochs=HORIZON)
    view = report.slots[1]
    block = _slot_block(build_observation(report), 1)
    expected_stage = np.zeros(10)
    expected_stage[STAGE_ONE_HOT_INDEX[SeedStage.BLENDING]] = 1
    assert block[ob.S_ACTIVE] == 1.0
    np.testing.assert_array_equal(block[ob.S_STAGE : ob.S_STAGE + 10], expected_stage)
    assert block[ob.S_ALPHA] == pytest.approx(slot.alpha) and 0 < slot.alpha < 1
    assert block[ob.S_CONTRIBUTION] == 1.0  # 25 points / 10, clipped
    velocity = 0.3 * (25.0 - 3.0)
    assert block[ob.S_VELOCITY] == pytest.approx(min(1.0, velocity / 10))
    assert block[ob.S_TEMPO] == pytest.approx(4 / 12)
    assert block[ob.S_ALPHA_TARGET] == 1.0
    assert view.alpha_mode == AlphaMode.UP and block[ob.S_ALPHA_MODE] == 0.5
    assert block[ob.S_STEPS_TOTAL] == pytest.approx(4 / HORIZON)
    assert block[ob.S_STEPS_DONE] == pytest.approx(2 / HORIZON)
    assert block[ob.S_TIME_TO_TARGET] == pytest.approx(2 / HORIZON)
    assert block[ob.S_ALPHA_VELOCITY] == pytest.approx(0.25)
    assert block[ob.S_ALGORITHM] == 0.0  # ADD
    assert block[ob.S_GRAD_NORM] == pytest.approx(math.log1p(2.5) / 7)
    assert block[ob.S_GRAD_HEALTH] == pytest.approx(0.8)
    assert block[ob.S_VANISHING] == 1.0 and block[ob.S_EXPLODING] == 0.0
    assert block[ob.S_PREV_HEALTH] == pytest.approx(0.8)
    assert block[ob.S_EPOCHS_IN_STAGE] == pytest.approx(2 / HORIZON)
    assert block[ob.S_FRESHNESS] == 1.0  # measured this epoch
    assert block[ob.S_AGE] == pytest.approx(view.epochs_total / HORIZON)
    assert list(blueprint_indices(report)) == [-1, 3]  # NORM


def test_never_measured_sentinels_on_a_fresh_seed():
    slots = _slots(1)
    slots[0].germinate("depthwise")
    block = _slot_block(build_observation(make_report(slots, max_epochs=HORIZON)), 0)
    assert block[ob.S_CONTRIBUTION] == 0.0
    assert block[ob.S_GRAD_NORM] == 0.0 and block[ob.S_GRAD_HEALTH] == 0.0
    assert block[ob.S_PREV_HEALTH] == -1.0
    assert block[ob.S_FRESHNESS] == -1.0


def test_freshness_decays_with_epochs_since_the_measurement():
    slots = _slots(1)
    slot = _blending(slots[0])
    slot.tick()
    slot.tick()
    block = _slot_block(build_observation(make_report(slots, max_epochs=HORIZON)), 0)
    assert block[ob.S_FRESHNESS] == pytest.approx(0.995**2)


def test_pruned_slot_is_still_described():
    slots = _slots(1)
    _blending(slots[0])
    slots[0].prune("test")
    report = make_report(slots, max_epochs=HORIZON)
    block = _slot_block(build_observation(report), 0)
    assert block[ob.S_ACTIVE] == 1.0
    assert block[ob.S_STAGE + STAGE_ONE_HOT_INDEX[SeedStage.PRUNED]] == 1.0
    assert list(blueprint_indices(report)) == [3]


def test_holding_count_includes_fossilized():
    slots = _slots(2)
    for slot in slots:
        _blending(slot)
        for _ in range(3):
            slot.tick()
        assert slot.advance().passed
    slots[0].fossilize()
    obs = build_observation(make_report(slots, max_epochs=HORIZON))
    assert obs[ob.N_HOLDING] == 1.0


def test_horizon_is_required():
    report = make_report(_slots(), max_epochs=None)
    with pytest.raises(ValueError, match="horizon"):
        build_observation(report)
    assert build_observation(report, horizon=10).shape == (obs_dim(2),)


def test_batch_observations_stacks_features_indices_and_masks():
    slots = _slots()
    slots[1].germinate("depthwise")
    reports = [make_report(_slots(), max_epochs=HORIZON), make_report(slots, max_epochs=HORIZON)]
    batch = batch_observations(reports)
    assert batch.features.shape == (2, obs_dim(2)) and batch.features.dtype == torch.float32
    assert batch.blueprint_idx.tolist() == [[-1, -1], [-1, 4]]
    assert batch.masks.op.shape == (2, 6) and batch.masks.slot_by_op.shape == (2, 6, 2)
    assert batch.masks.op[0, LifecycleOp.GERMINATE] and not batch.masks.op[1, LifecycleOp.GERMINATE]


def test_under_a_budget_the_episode_fraction_is_the_budget_spent():
    report = make_report(_slots(), epoch=4, max_epochs=HORIZON, accuracies=[42.0])
    assert build_observation(report)[ob.EPOCH] == pytest.approx(4 / HORIZON)
    budgeted = dataclasses.replace(report, train_flops=3e9, budget_flops=1e10)
    obs = build_observation(budgeted)
    assert obs[ob.EPOCH] == pytest.approx(0.3) and obs.shape == (obs_dim(2),)
    spent = dataclasses.replace(budgeted, train_flops=1.02e10)  # past it by part of a batch
    assert build_observation(spent)[ob.EPOCH] == 1.0


def test_feature_1_is_log2_of_the_episodes_budget_scale():
    report = make_report(_slots(), epoch=4, max_epochs=HORIZON, accuracies=[42.0])
    assert build_observation(report)[ob.BUDGET_SCALE] == 0.0  # one budget, or none
    budgeted = dataclasses.replace(report, train_flops=3e9, budget_flops=1e10)
    for scale in (0.25, 0.5, 1.0, 2.0, 3.0):
        obs = build_observation(dataclasses.replace(budgeted, budget_scale=scale))
        assert obs[ob.BUDGET_SCALE] == pytest.approx(math.log2(scale))
        assert obs[ob.EPOCH] == pytest.approx(0.3)  # the fraction spent is of its own budget
