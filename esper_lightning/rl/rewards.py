"""Rewards of the lifecycle controller: the episode's outcome, plus shaping that cannot change
which policy is best.

The reward of step t, from ``prev_report`` (s_t, where the action was chosen), the executed
action and ``report`` (s_{t+1}, after the action, the epoch tick and one epoch of training)::

    r_t = γ·Φ(s_{t+1}) − Φ(s_t)            shaping; Φ(s_{t+1}) = 0 when the episode ends there
        + op cost                           0 by default
        + terminal_weight · outcome(s_T)    only when s_{t+1} is the max-epoch end
        − rollback_penalty                  when the governor rolled back during the step (the
                                            env restored its snapshot; the episode goes on)

The outcome is `core.outcome.report_outcome`: mean validation accuracy of the last three
epochs minus a parameter cost on the mean seed parameters of those epochs, the very quantity
`esper-lightning compare` judges controllers by (``outcome="bits"``: −100 × the final
validation loss in bits, compare's ``final_bits``, for budgeted language-model runs). Because Φ
is zero at every episode end, the shaping telescopes: an episode's discounted shaping sums to
−Φ(s_0), the same for every policy, so returns rank policies like their outcomes and shaping
only guides learning (potential-based shaping, Ng et al. 1999). The modes differ in Φ:

* ``shaped`` (default): stage potentials of every slot (progress through the lifecycle) plus
  the attribution credit of every present seed (its measured counterfactual contribution,
  capped by the host's own gain, so a seed the host merely came to depend on earns little);
* ``simplified``: stage potentials only;
* ``sparse``: Φ = 0, the outcome alone.

What this replaced, and why (measured on the cpu preset): attribution paid every epoch was
~20× the outcome term per accuracy point and could be farmed by keeping seeds alive; a per-epoch
parameter rent charged one heavy seed −5 per episode; the stage potential of the last state was
never zeroed, adding +3.6 that did not telescope. Returns then barely depended on the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from enum import Enum

from esper_lightning.core.actions import Action, LifecycleOp, action_error
from esper_lightning.core.lifecycle import PRESENT_STAGES, SeedStage
from esper_lightning.core.outcome import OUTCOMES, report_outcome
from esper_lightning.core.report import EpochReport
from esper_lightning.core.slots import SlotReport

#: Stage potentials of the shaping term; stages not listed have potential 0.
STAGE_POTENTIALS: dict[SeedStage, float] = {
    SeedStage.GERMINATED: 1.0,
    SeedStage.TRAINING: 2.0,
    SeedStage.BLENDING: 3.5,
    SeedStage.HOLDING: 5.5,
    SeedStage.FOSSILIZED: 6.0,
}


class RewardMode(str, Enum):
    SHAPED = "shaped"
    SIMPLIFIED = "simplified"
    SPARSE = "sparse"


def _no_op_costs() -> dict[LifecycleOp, float]:
    return {op: 0.0 for op in LifecycleOp}


@dataclass(frozen=True)
class RewardConfig:
    """Reward mode and coefficients (reasons in ``docs/rl.md``).

    Attributes:
        mode: ``shaped``, ``simplified`` or ``sparse``.
        gamma: discount of the shaping; must equal the PPO gamma for exact policy invariance.
        terminal_weight: reward per outcome point at the max-epoch end.
        param_cost: points of outcome per host-sized amount of seed parameters.
        pbrs_weight: scale of the stage potentials.
        stage_progress_rate, stage_progress_cap: stage potential gained per epoch in a stage.
        attribution_weight: scale of the attribution credit in Φ (shaped mode).
        op_costs: cost per executed op (all 0 by default: any cost the outcome does not see
            bends the ranking of policies).
        rollback_penalty: reward −rollback_penalty at the step of a governor rollback (all
            modes).
        outcome: what the terminal term measures (`core.outcome.OUTCOMES`): ``accuracy``, or
            ``bits`` (−100 × the final validation loss in bits, for budgeted runs).
    """

    mode: RewardMode = RewardMode.SHAPED
    gamma: float = 0.995
    terminal_weight: float = 1.0
    param_cost: float = 1.0
    pbrs_weight: float = 0.3
    stage_progress_rate: float = 0.3
    stage_progress_cap: float = 2.0
    attribution_weight: float = 0.3
    op_costs: dict[LifecycleOp, float] = field(default_factory=_no_op_costs)
    rollback_penalty: float = 10.0
    outcome: str = "accuracy"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", RewardMode(self.mode))
        if set(self.op_costs) != set(LifecycleOp):
            raise ValueError("op_costs needs a cost for every LifecycleOp")
        if self.param_cost < 0 or self.rollback_penalty < 0:
            raise ValueError("param_cost and rollback_penalty must be >= 0")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}; accepted: {', '.join(OUTCOMES)}")


@dataclass(frozen=True)
class RewardBreakdown:
    """Every reward component of one step; `total` is their sum."""

    pbrs: float = 0.0
    attribution: float = 0.0
    intervention: float = 0.0
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
        report: state s_{t+1}.
        config: mode and coefficients.
        terminal: s_{t+1} is the last state of the episode (max epochs reached).
        rollback: the governor rolled back during this step; ``report`` is the restored state
            and the episode goes on (`rl.episodes`).

    Raises:
        ValueError: on an illegal action, mismatched slots, or a missing accuracy at the end.
    """
    error = action_error(action, prev_report.slots, prev_report.mask_context)
    if error is not None:
        raise ValueError(f"reward of an illegal action {action.describe()}: {error}")
    if prev_report.slot_ids != report.slot_ids:
        raise ValueError(f"slot ids changed: {prev_report.slot_ids} -> {report.slot_ids}")
    stage = _shaping(stage_potential, prev_report, report, config, terminal)
    credit = _shaping(attribution_potential, prev_report, report, config, terminal)
    return RewardBreakdown(
        pbrs=stage,
        attribution=credit,
        intervention=-config.op_costs[action.op],
        terminal=config.terminal_weight * outcome(report, config) if terminal else 0.0,
        rollback=-config.rollback_penalty if rollback else 0.0,
    )


# --- components -------------------------------------------------------------------------------
def outcome(report: EpochReport, config: RewardConfig) -> float:
    """The episode's outcome at ``report`` (`core.outcome.report_outcome`)."""
    return report_outcome(report, config.param_cost, config.outcome)


def potential(slot: SlotReport, config: RewardConfig) -> float:
    """Stage potential of one slot: its stage's value + min(rate · epochs in stage, cap)."""
    base = STAGE_POTENTIALS.get(slot.stage, 0.0)
    if base == 0.0:
        return 0.0
    return base + min(config.stage_progress_rate * slot.epochs_in_stage, config.stage_progress_cap)


def stage_potential(report: EpochReport, config: RewardConfig) -> float:
    """``pbrs_weight · Σ_slots potential`` (0 in sparse mode)."""
    if config.mode == RewardMode.SPARSE:
        return 0.0
    return config.pbrs_weight * sum(potential(slot, config) for slot in report.slots)


def seed_attribution(contribution: float, progress: float | None) -> float:
    """Credit for a seed with counterfactual ``contribution`` and accuracy ``progress`` since
    germination (both in points): harmful seeds count their contribution; a helpful seed its
    contribution, capped by the harmonic mean with progress when it claims more than the host
    gained (a seed that made itself indispensable without improving the host)."""
    if contribution < 0:
        return contribution
    if progress is None:
        return 0.5 * contribution
    if progress <= 0:
        return 0.0
    if contribution >= progress:
        return 2 * progress * contribution / (progress + contribution)
    return contribution


def attribution_potential(report: EpochReport, config: RewardConfig) -> float:
    """``attribution_weight · Σ`` attribution credit of every present seed with a measured
    contribution (shaped mode only). Pruning a harmful seed raises it, pruning a useful one
    lowers it, so no special case for PRUNE is needed."""
    if config.mode != RewardMode.SHAPED:
        return 0.0
    total = 0.0
    for slot in report.slots:
        m = slot.metrics
        if slot.stage not in PRESENT_STAGES or m.counterfactual_contribution is None:
            continue
        progress = None
        if m.current_accuracy is not None and m.initial_accuracy is not None:
            progress = m.current_accuracy - m.initial_accuracy
        total += seed_attribution(m.counterfactual_contribution, progress)
    return config.attribution_weight * total


Potential = Callable[[EpochReport, RewardConfig], float]


def _shaping(
    phi: Potential, prev_report: EpochReport, report: EpochReport, config: RewardConfig,
    ended: bool,
) -> float:
    """``γ·Φ(s') − Φ(s)`` with Φ(s') = 0 at an episode end (``phi`` is one of the potentials)."""
    after = 0.0 if ended else phi(report, config)
    return config.gamma * after - phi(prev_report, config)
