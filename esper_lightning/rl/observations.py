"""Observation features built from an `EpochReport`.

One observation is a float vector of ``obs_dim(S) = 24 + 30·S`` features (S = enabled slots) plus
an int64 vector of S blueprint indices (−1 = empty slot) that the policy embeds. The layout is
documented feature by feature in ``docs/rl.md``; the constants below name the offsets.

Encodings: ``symlog(x) = sign(x)·ln(1 + |x|)`` divided by `SYMLOG_SCALE` (≈ [0, 1] up to ~1000);
`UNKNOWN` (−1) marks "never measured", a value outside every measured range. Counters are divided
by the episode horizon and capped at 1. Empty slots are all zeros (no sentinels).

The layout follows the research code's third observation version, without its per-slot
``interaction_sum`` feature (nothing measures pairwise seed synergy here): 30 features per slot.
`OBSERVATION_VERSION` names the layout; a policy checkpoint records the one it was trained on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from esper_lightning.blueprints import blueprint_index
from esper_lightning.core.actions import LifecycleOp
from esper_lightning.core.alpha import AlphaMode
from esper_lightning.core.lifecycle import STAGE_ONE_HOT_INDEX, SeedStage
from esper_lightning.core.report import EpochReport
from esper_lightning.core.slots import SlotReport
from esper_lightning.rl.distributions import MaskBatch, compact_masks, stack_masks
from esper_lightning.rl.normalizers import RunningMeanStd

SYMLOG_SCALE = 7.0
UNKNOWN = -1.0
HISTORY = 5  # last validation values in the observation (newest = current)
CONTRIBUTION_SCALE = 10.0  # percentage points -> about [-1, 1]
TEMPO_SCALE = 12.0
FRESHNESS_DECAY = 0.995  # per epoch since the contribution was last measured
EMPTY_BLUEPRINT = -1

#: The layout of the features: version 2 added feature 1, the episode's budget scale (version
#: 1, every policy trained before it, had 23 base features). A policy reads only its own.
OBSERVATION_VERSION = 2

# Base block offsets.
EPOCH, BUDGET_SCALE, VAL_LOSS, VAL_ACC = 0, 1, 2, 3
LOSS_HISTORY, ACC_HISTORY = 4, 9
N_TRAINING, N_BLENDING, N_HOLDING = 14, 15, 16
LAST_SUCCESS, LAST_OP = 17, 18
BASE_DIM = LAST_OP + len(LifecycleOp)  # 24

# Per-slot block offsets.
S_ACTIVE, S_STAGE = 0, 1
S_ALPHA = S_STAGE + len(SeedStage)  # 11
S_CONTRIBUTION, S_VELOCITY, S_TEMPO, S_ALPHA_TARGET, S_ALPHA_MODE = 12, 13, 14, 15, 16
S_STEPS_TOTAL, S_STEPS_DONE, S_TIME_TO_TARGET, S_ALPHA_VELOCITY, S_ALGORITHM = 17, 18, 19, 20, 21
S_GRAD_NORM, S_GRAD_HEALTH, S_VANISHING, S_EXPLODING, S_PREV_HEALTH = 22, 23, 24, 25, 26
S_EPOCHS_IN_STAGE, S_FRESHNESS, S_AGE = 27, 28, 29
SLOT_DIM = 30


def obs_dim(n_slots: int) -> int:
    """Length of the float observation for ``n_slots`` enabled slots."""
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, got {n_slots}")
    return BASE_DIM + SLOT_DIM * n_slots


def symlog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


def build_observation(report: EpochReport, horizon: int | None = None) -> np.ndarray:
    """Float features ``[obs_dim(len(report.slots))]`` of one report.

    Args:
        report: the state at this decision.
        horizon: epochs used to scale counters; defaults to ``report.max_epochs``.

    Raises:
        ValueError: when neither the report nor ``horizon`` gives a horizon.
    """
    horizon = report.max_epochs if horizon is None else horizon
    if horizon is None or horizon < 1:
        raise ValueError(f"observation needs a horizon >= 1 (max_epochs), got {horizon}")
    out = np.zeros(obs_dim(len(report.slots)), dtype=np.float32)
    _base_features(out[:BASE_DIM], report, horizon)
    for i, slot in enumerate(report.slots):
        start = BASE_DIM + SLOT_DIM * i
        _slot_features(out[start : start + SLOT_DIM], slot, horizon)
    return out


def blueprint_indices(report: EpochReport) -> np.ndarray:
    """Blueprint index per slot ``[S]`` (int64, the blueprint table's), `EMPTY_BLUEPRINT` for an
    empty slot."""
    return np.array(
        [
            EMPTY_BLUEPRINT
            if slot.seed_id is None
            else blueprint_index(_require(slot.blueprint, slot))
            for slot in report.slots
        ],
        dtype=np.int64,
    )


class ObservationBatch(NamedTuple):
    """What the policy needs for a batch of reports (features are raw: normalise them first).

    Attributes:
        features: float32 ``[B, obs_dim]`` raw features.
        blueprint_idx: long ``[B, S]`` blueprint indices (−1 = empty).
        masks: the reports' action masks, batch shape ``[B]``.
    """

    features: Tensor
    blueprint_idx: Tensor
    masks: MaskBatch


def batch_observations(
    reports: Sequence[EpochReport], horizon: int | None = None
) -> ObservationBatch:
    """Features, blueprint indices and masks of several reports (one per env), as tensors."""
    features = np.stack([build_observation(r, horizon) for r in reports])
    indices = np.stack([blueprint_indices(r) for r in reports])
    masks = stack_masks([r.masks for r in reports])
    return ObservationBatch(torch.from_numpy(features), torch.from_numpy(indices), masks)


def encode_reports(
    reports: Sequence[EpochReport], obs_rms: RunningMeanStd, horizon: int, compact: bool = False
) -> tuple[Tensor, Tensor, Tensor, MaskBatch]:
    """Raw features, normalised features, blueprint indices and masks of a batch of reports:
    exactly what the policy sees, in training and when it drives the callback (``compact``:
    the compact action space, `distributions.compact_masks`)."""
    batch = batch_observations(reports, horizon)
    normalized = obs_rms.normalize(batch.features).float()
    masks = compact_masks(batch.masks) if compact else batch.masks
    return batch.features, normalized, batch.blueprint_idx, masks


def _require(blueprint: str | None, slot: SlotReport) -> str:
    if blueprint is None:
        raise ValueError(f"slot {slot.slot_id!r} holds seed {slot.seed_id!r} without a blueprint")
    return blueprint


def episode_fraction(report: EpochReport, horizon: int) -> float:
    """Feature 0, the fraction of the episode spent: the budget fraction under a compute budget
    (`EpochReport.budget_fraction`, capped at 1), else the epochs before this one over the
    horizon, as policies have always read it (docs/rl.md)."""
    budget = report.budget_fraction
    if budget is not None:
        return min(budget, 1.0)
    return min(report.epoch, horizon) / horizon


def _base_features(out: np.ndarray, report: EpochReport, horizon: int) -> None:
    n_slots = len(report.slots)
    out[EPOCH] = episode_fraction(report, horizon)
    # Size-free: how much bigger or smaller this episode's budget is than the run's base, so a
    # policy can time its decisions by the budget; 0 with one budget (or none).
    out[BUDGET_SCALE] = math.log2(report.budget_scale)
    out[VAL_LOSS] = _scaled_loss(report.val_loss)
    out[VAL_ACC] = UNKNOWN if report.val_accuracy is None else report.val_accuracy / 100.0
    losses = [_scaled_loss(x) for x in report.loss_history[-HISTORY:]]
    accuracies = [x / 100.0 for x in report.accuracy_history[-HISTORY:]]
    out[LOSS_HISTORY : LOSS_HISTORY + HISTORY] = _left_pad(losses)
    out[ACC_HISTORY : ACC_HISTORY + HISTORY] = _left_pad(accuracies)
    out[N_TRAINING] = report.count(SeedStage.TRAINING) / n_slots
    out[N_BLENDING] = report.count(SeedStage.BLENDING) / n_slots
    out[N_HOLDING] = report.count(SeedStage.HOLDING, SeedStage.FOSSILIZED) / n_slots
    out[LAST_SUCCESS] = float(report.last_action_success)
    last_op = LifecycleOp.WAIT if report.last_action is None else report.last_action.op
    out[LAST_OP + int(last_op)] = 1.0


def _scaled_loss(loss: float | None) -> float:
    return UNKNOWN if loss is None else symlog(loss) / SYMLOG_SCALE


def _left_pad(values: list[float]) -> list[float]:
    return [UNKNOWN] * (HISTORY - len(values)) + values


def _slot_features(out: np.ndarray, slot: SlotReport, horizon: int) -> None:
    if slot.seed_id is None:
        return  # empty slot: all zeros
    m = slot.metrics
    out[S_ACTIVE] = 1.0
    out[S_STAGE + STAGE_ONE_HOT_INDEX[slot.stage]] = 1.0
    out[S_ALPHA] = slot.alpha
    contribution = m.counterfactual_contribution or 0.0
    out[S_CONTRIBUTION] = _clip_unit(contribution / CONTRIBUTION_SCALE)
    out[S_VELOCITY] = _clip_unit(m.contribution_velocity / CONTRIBUTION_SCALE)
    out[S_TEMPO] = 0.0 if slot.tempo is None else slot.tempo / TEMPO_SCALE
    out[S_ALPHA_TARGET] = slot.alpha_target
    out[S_ALPHA_MODE] = int(slot.alpha_mode) / 2.0
    ramping = slot.alpha_mode != AlphaMode.HOLD
    remaining = slot.alpha_steps_total - slot.alpha_steps_done if ramping else 0
    out[S_STEPS_TOTAL] = _fraction(slot.alpha_steps_total, horizon)
    out[S_STEPS_DONE] = _fraction(slot.alpha_steps_done, horizon)
    out[S_TIME_TO_TARGET] = _fraction(remaining, horizon)
    out[S_ALPHA_VELOCITY] = _clip_unit(slot.alpha_velocity)
    out[S_ALGORITHM] = 0.0 if slot.algorithm is None else (int(slot.algorithm) - 1) / 2.0
    norm = m.gradient_norm
    finite = norm is not None and math.isfinite(norm)
    out[S_GRAD_NORM] = symlog(norm) / SYMLOG_SCALE if finite else 0.0
    out[S_GRAD_HEALTH] = 0.0 if m.gradient_health is None else min(m.gradient_health, 1.0)
    out[S_VANISHING] = float(bool(m.has_vanishing))
    out[S_EXPLODING] = float(bool(m.has_exploding))
    previous = m.previous_gradient_health
    out[S_PREV_HEALTH] = UNKNOWN if previous is None else min(previous, 1.0)
    out[S_EPOCHS_IN_STAGE] = _fraction(m.epochs_in_stage, horizon)
    age = m.contribution_age
    out[S_FRESHNESS] = UNKNOWN if age is None else FRESHNESS_DECAY**age
    out[S_AGE] = _fraction(m.epochs_total, horizon)


def _fraction(count: int, horizon: int) -> float:
    return min(count, horizon) / horizon


def _clip_unit(x: float) -> float:
    return max(-1.0, min(1.0, x))
