"""Rewards of the lifecycle controller, one `RewardBreakdown` per step.

Timing: the reward of step t is computed after the transition, from ``prev_report`` (s_t, the
state the action was chosen in), the executed ``action`` (an illegal choice has already been
replaced by WAIT by the caller) and ``report`` (s_{t+1}, after the action, the epoch tick and one
epoch of training). Action-specific terms judge the decision with what was known at s_t; the
potential-based term uses both states; rent and the terminal term use s_{t+1}.

Modes (formulas component by component in ``docs/rl.md``):

* ``shaped`` (default, after the research code's contribution reward): counterfactual attribution,
  potential-based shaping (PBRS) over the stage potentials, parameter rent, intervention costs,
  fossilize and prune shaping, terminal accuracy term.
* ``simplified``: PBRS, a flat cost per non-WAIT op, terminal accuracy + contributing fossils.
* ``sparse``: terminal only, accuracy minus a parameter cost.

Every mode adds the governor ``rollback`` penalty on the step where a rollback happens (a true
terminal: the PPO buffer stores it ``terminated``, without bootstrap).

Fixes against the research code (docs/design.md): PBRS is summed over every slot and computed
from the real before/after states (it was paid only for the targeted slot, which breaks
telescoping with several slots); attribution is paid for every seed present, fossilized seeds
included (it was paid only for the targeted slot, so WAIT credited slot 0, and stopped at
fossilization, which rewards never fossilizing); the potential of a true terminal state is 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum

from esper_lightning.core.actions import Action, LifecycleOp, action_error
from esper_lightning.core.lifecycle import PRESENT_STAGES, SeedStage
from esper_lightning.core.report import EpochReport
from esper_lightning.core.slots import SlotReport

#: Stage potentials Φ of the PBRS term; stages not listed have potential 0.
STAGE_POTENTIALS: dict[SeedStage, float] = {
    SeedStage.GERMINATED: 1.0,
    SeedStage.TRAINING: 2.0,
    SeedStage.BLENDING: 3.5,
    SeedStage.HOLDING: 5.5,
    SeedStage.FOSSILIZED: 6.0,
}

#: Stages whose seed runs in the forward pass with alpha > 0 and therefore pays rent.
RENTED_STAGES = frozenset({SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED})


class RewardMode(str, Enum):
    SHAPED = "shaped"
    SIMPLIFIED = "simplified"
    SPARSE = "sparse"


def _default_op_costs() -> dict[LifecycleOp, float]:
    return {
        LifecycleOp.WAIT: 0.0,
        LifecycleOp.GERMINATE: 0.15,
        LifecycleOp.SET_ALPHA_TARGET: 0.005,
        LifecycleOp.PRUNE: 0.005,
        LifecycleOp.FOSSILIZE: 0.01,
        LifecycleOp.ADVANCE: 0.0,
    }


@dataclass(frozen=True)
class RewardConfig:
    """Reward mode and coefficients (reasons in ``docs/rl.md``).

    Attributes:
        mode: ``shaped``, ``simplified`` or ``sparse``.
        gamma: PBRS discount; must equal the PPO gamma for the shaping to be policy-invariant.
        pbrs_weight: scale of ``gamma·Φ(s') − Φ(s)``.
        stage_progress_rate, stage_progress_cap: potential gained per epoch in a stage, capped.
        attribution_weight: scale of the counterfactual attribution (percentage points).
        rent_weight, rent_cap, rent_base_fraction, rent_min_host_params: parameter rent
            ``min(rent_weight·ln(1 + g), rent_cap)``, see `rent`.
        op_costs: intervention cost per op (shaped).
        failed_action_penalty: extra cost of a legal op whose gate failed (shaped).
        fossilize_min_contribution: contribution (points) a fossilized seed should have.
        fossilize_hold_epochs: HOLDING epochs for the full fossilize bonus.
        weak_fossilize_penalty: cost of fossilizing a seed below the contribution bar.
        terminal_accuracy_weight: terminal reward per accuracy point (shaped).
        simplified_op_cost, simplified_accuracy_weight, simplified_fossil_bonus: simplified mode.
        sparse_param_weight: sparse mode cost per (seed params / host params).
        rollback_penalty: reward −rollback_penalty on a governor rollback (all modes).
    """

    mode: RewardMode = RewardMode.SHAPED
    gamma: float = 0.995
    pbrs_weight: float = 0.3
    stage_progress_rate: float = 0.3
    stage_progress_cap: float = 2.0
    attribution_weight: float = 1.0
    rent_weight: float = 0.5
    rent_cap: float = 1.5
    rent_base_fraction: float = 0.0039
    rent_min_host_params: int = 200
    op_costs: dict[LifecycleOp, float] = field(default_factory=_default_op_costs)
    failed_action_penalty: float = 0.05
    fossilize_min_contribution: float = 1.0
    fossilize_hold_epochs: int = 5
    weak_fossilize_penalty: float = 0.2
    terminal_accuracy_weight: float = 0.05
    simplified_op_cost: float = 0.01
    simplified_accuracy_weight: float = 3.0
    simplified_fossil_bonus: float = 2.0
    sparse_param_weight: float = 0.1
    rollback_penalty: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", RewardMode(self.mode))
        if set(self.op_costs) != set(LifecycleOp):
            raise ValueError("op_costs needs a cost for every LifecycleOp")


@dataclass(frozen=True)
class RewardBreakdown:
    """Every reward component of one step; `total` is their sum."""

    attribution: float = 0.0
    pbrs: float = 0.0
    rent: float = 0.0
    intervention: float = 0.0
    fossilize: float = 0.0
    prune: float = 0.0
    terminal: float = 0.0
    rollback: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, float]:
        """Components plus ``total`` (for ``rewards/<component>`` logging)."""
        return {**asdict(self), "total": self.total}


def compute_reward(
    prev_report: EpochReport,
    action: Action,
    action_success: bool,
    report: EpochReport,
    config: RewardConfig,
    *,
    terminal: bool = False,
    rollback: bool = False,
) -> RewardBreakdown:
    """Reward of the transition ``prev_report --action--> report``.

    Args:
        prev_report: state s_t in which ``action`` was chosen.
        action: the executed action; it must be legal in ``prev_report`` (substitute WAIT for an
            illegal choice before calling).
        action_success: False when the op's gate failed (the state did not move).
        report: state s_{t+1}.
        config: mode and coefficients.
        terminal: s_{t+1} is the last state of the episode (max epochs reached).
        rollback: the governor rolled back during this step (a true terminal).

    Raises:
        ValueError: on an illegal action, mismatched slots, or a missing accuracy the mode needs.
    """
    error = action_error(action, prev_report.slots, prev_report.mask_context)
    if error is not None:
        raise ValueError(f"reward of an illegal action {action.describe()}: {error}")
    if prev_report.slot_ids != report.slot_ids:
        raise ValueError(f"slot ids changed: {prev_report.slot_ids} -> {report.slot_ids}")
    end = terminal and not rollback
    penalty = -config.rollback_penalty if rollback else 0.0
    if config.mode == RewardMode.SPARSE:
        return RewardBreakdown(terminal=_sparse_terminal(report, config) if end else 0.0,
                               rollback=penalty)
    pbrs = pbrs_term(prev_report, report, config, terminal_state=rollback)
    if config.mode == RewardMode.SIMPLIFIED:
        cost = 0.0 if action.op == LifecycleOp.WAIT else -config.simplified_op_cost
        return RewardBreakdown(
            pbrs=pbrs,
            intervention=cost,
            terminal=_simplified_terminal(report, config) if end else 0.0,
            rollback=penalty,
        )
    return _shaped(prev_report, action, action_success, report, config, end, pbrs, penalty)


def _shaped(
    prev_report: EpochReport, action: Action, action_success: bool, report: EpochReport,
    config: RewardConfig, end: bool, pbrs: float, penalty: float,
) -> RewardBreakdown:
    targeted = prev_report.slots[action.slot]
    intervention = -config.op_costs[action.op]
    if not action_success and action.op != LifecycleOp.WAIT:
        intervention -= config.failed_action_penalty
    fossilize = prune = 0.0
    if action.op == LifecycleOp.FOSSILIZE and action_success:
        fossilize = fossilize_shaping(targeted, config)
    if action.op == LifecycleOp.PRUNE:
        prune = prune_shaping(targeted)
    return RewardBreakdown(
        attribution=attribution_term(prev_report, action, config),
        pbrs=pbrs,
        rent=-rent(report, config),
        intervention=intervention,
        fossilize=fossilize,
        prune=prune,
        terminal=config.terminal_accuracy_weight * _accuracy(report) if end else 0.0,
        rollback=penalty,
    )


# --- components -------------------------------------------------------------------------------
def potential(slot: SlotReport, config: RewardConfig) -> float:
    """Φ(slot) = stage potential + min(rate · epochs in stage, cap) for stages with potential."""
    base = STAGE_POTENTIALS.get(slot.stage, 0.0)
    if base == 0.0:
        return 0.0
    return base + min(config.stage_progress_rate * slot.epochs_in_stage, config.stage_progress_cap)


def pbrs_term(
    prev_report: EpochReport, report: EpochReport, config: RewardConfig, terminal_state: bool
) -> float:
    """``pbrs_weight · Σ_slots (gamma·Φ(s') − Φ(s))``; Φ(s') = 0 when s' is a true terminal."""
    before = sum(potential(slot, config) for slot in prev_report.slots)
    after = 0.0 if terminal_state else sum(potential(slot, config) for slot in report.slots)
    return config.pbrs_weight * (config.gamma * after - before)


def seed_attribution(contribution: float, progress: float | None) -> float:
    """Credit for a seed with counterfactual ``contribution`` and accuracy ``progress`` since
    germination (both in points): harmful seeds pay their contribution; a helpful seed earns
    its contribution, capped by the harmonic mean with progress when it claims more than the
    host gained (a seed that made itself indispensable without improving the host)."""
    if contribution < 0:
        return contribution
    if progress is None:
        return 0.5 * contribution
    if progress <= 0:
        return 0.0
    if contribution >= progress:
        return 2 * progress * contribution / (progress + contribution)
    return contribution


def attribution_term(prev_report: EpochReport, action: Action, config: RewardConfig) -> float:
    """Σ over seeds present at s_t with a measured contribution of their attribution; a PRUNE
    flips the sign for the pruned seed (removing a harmful seed is worth its harm)."""
    total = 0.0
    for i, slot in enumerate(prev_report.slots):
        m = slot.metrics
        if slot.stage not in PRESENT_STAGES or m.counterfactual_contribution is None:
            continue
        progress = None
        if m.current_accuracy is not None and m.initial_accuracy is not None:
            progress = m.current_accuracy - m.initial_accuracy
        credit = seed_attribution(m.counterfactual_contribution, progress)
        if action.op == LifecycleOp.PRUNE and action.slot == i:
            credit = -credit
        total += credit
    return config.attribution_weight * total


def rent(report: EpochReport, config: RewardConfig) -> float:
    """Parameter rent (a cost, >= 0): ``min(rent_weight·ln(1 + g), rent_cap)`` with
    ``g = Σ_rented (rent_base_fraction·host + alpha·seed_params) / max(host, rent_min_host)``."""
    host = report.host_params
    effective = sum(
        config.rent_base_fraction * host + slot.alpha * slot.seed_params
        for slot in report.slots
        if slot.stage in RENTED_STAGES
    )
    growth = effective / max(host, config.rent_min_host_params)
    return min(config.rent_weight * math.log1p(growth), config.rent_cap)


def fossilize_shaping(slot: SlotReport, config: RewardConfig) -> float:
    """Bonus for a successful fossilization of ``slot`` (its state before the action)."""
    c = slot.metrics.counterfactual_contribution
    if c is None or c < config.fossilize_min_contribution:
        return -config.weak_fossilize_penalty
    hold = min(1.0, slot.epochs_in_stage / config.fossilize_hold_epochs)
    return (0.5 + 0.1 * c) * hold


def prune_shaping(slot: SlotReport) -> float:
    """Bonus (harmful seed) or cost (useful seed) of pruning ``slot`` (its state before)."""
    c = slot.metrics.counterfactual_contribution
    if c is None:
        return -0.1  # pruned without evidence either way
    if c < -0.5:
        return 0.15
    if c < 0:
        return 0.1
    return max(-0.3 - 0.05 * c, -0.9)


def _accuracy(report: EpochReport) -> float:
    if report.val_accuracy is None:
        raise ValueError(f"epoch {report.epoch}: the terminal reward needs a validation accuracy")
    return report.val_accuracy


def _simplified_terminal(report: EpochReport, config: RewardConfig) -> float:
    contributing = sum(
        slot.stage == SeedStage.FOSSILIZED
        and (slot.metrics.counterfactual_contribution or 0.0) > 0.0
        for slot in report.slots
    )
    return (
        config.simplified_accuracy_weight * _accuracy(report) / 100.0
        + config.simplified_fossil_bonus * contributing
    )


def _sparse_terminal(report: EpochReport, config: RewardConfig) -> float:
    cost = config.sparse_param_weight * report.seed_params / max(report.host_params, 1)
    return max(-1.0, min(1.0, _accuracy(report) / 100.0 - cost))
