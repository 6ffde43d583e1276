"""Seed lifecycle contracts: stages, legal transitions, quality gates and seed metrics.

This module is the single place for the lifecycle constants. It holds plain data and pure rules;
`SeedSlot` (in `slots.py`) applies them to a live module.

A seed moves ``DORMANT -> GERMINATED -> TRAINING -> BLENDING -> HOLDING -> FOSSILIZED`` when it
earns its place, or to ``PRUNED -> EMBARGOED -> RESETTING -> DORMANT`` when it is removed. A seed
whose blueprint needs no incubation makes its first three moves in the decision that germinates
it, each through its gate and recorded. Every
epoch advances each slot's counters exactly once (`SeedState.tick`), so the embargo lasts exactly
`EMBARGO_TICKS` decisions followed by `RESETTING_TICKS` decisions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum, IntEnum
from typing import Any

# --- constants (the research code's values, docs/design.md) ----------------------------------
MIN_PRUNE_AGE = 5  # epochs since germination before a prune is legal
MIN_TRAINING_EPOCHS = 10  # G2: epochs incubating in TRAINING before blending may start
MIN_BLENDING_EPOCHS = 10  # G3 (strict): epochs in BLENDING before HOLDING
MIN_TRAINING_IMPROVEMENT = 0.5  # G2 (strict): accuracy points gained during TRAINING
GRADIENT_RATIO_THRESHOLD = 0.10  # G2 (strict): seed/host gradient ratio
MIN_GRADIENT_HEALTH = 0.7  # G2 (permissive)
MIN_FOSSILIZE_CONTRIBUTION = 1.0  # G5 (strict): counterfactual contribution in accuracy points
EMBARGO_TICKS = 5  # decisions a pruned slot stays EMBARGOED
RESETTING_TICKS = 1  # decisions it then spends RESETTING before it is empty again
DEFAULT_BLEND_TEMPO = 5  # alpha ticks of the initial blend when none is given
GRADIENT_EMA_DECAY = 0.9
CONTRIBUTION_VELOCITY_DECAY = 0.7  # weight of the old velocity in its EMA
ALPHA_TOLERANCE = 1e-6
HISTORY_LENGTH = 100  # stage transitions kept per seed


class SeedStage(IntEnum):
    """Lifecycle stage of the seed in a slot. Value 5 (formerly SHADOWING) is reserved."""

    UNKNOWN = 0
    DORMANT = 1
    GERMINATED = 2
    TRAINING = 3
    BLENDING = 4
    HOLDING = 6
    FOSSILIZED = 7
    PRUNED = 8
    EMBARGOED = 9
    RESETTING = 10


RESERVED_STAGE_VALUES = frozenset({5})

#: Stages in which the seed runs in the forward pass.
ACTIVE_STAGES = frozenset(
    {SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED}
)
#: Stages of a removed seed on its way back to an empty slot.
FAILURE_STAGES = frozenset({SeedStage.PRUNED, SeedStage.EMBARGOED, SeedStage.RESETTING})
#: Seeds not yet fossilized nor removed: what the governor prunes on rollback.
LIVE_STAGES = frozenset(
    {SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING}
)
#: Seeds in the model, live or fossilized: what ``max_seeds`` counts and attribution pays for.
PRESENT_STAGES = LIVE_STAGES | {SeedStage.FOSSILIZED}

#: Legal successors; order matters: `default_successor` picks the first non-failure one.
VALID_TRANSITIONS: dict[SeedStage, tuple[SeedStage, ...]] = {
    SeedStage.UNKNOWN: (SeedStage.DORMANT,),
    SeedStage.DORMANT: (SeedStage.GERMINATED,),
    SeedStage.GERMINATED: (SeedStage.TRAINING, SeedStage.PRUNED),
    SeedStage.TRAINING: (SeedStage.BLENDING, SeedStage.PRUNED),
    SeedStage.BLENDING: (SeedStage.HOLDING, SeedStage.PRUNED),
    SeedStage.HOLDING: (SeedStage.FOSSILIZED, SeedStage.BLENDING, SeedStage.PRUNED),
    SeedStage.FOSSILIZED: (),
    SeedStage.PRUNED: (SeedStage.EMBARGOED,),
    SeedStage.EMBARGOED: (SeedStage.RESETTING,),
    SeedStage.RESETTING: (SeedStage.DORMANT,),
}

#: Contiguous one-hot index for observations (value 6 maps to index 5).
STAGE_ONE_HOT_INDEX: dict[SeedStage, int] = {stage: i for i, stage in enumerate(SeedStage)}


class IllegalTransitionError(RuntimeError):
    """A state-machine violation: a programming error, never a user mistake."""


def parse_stage(value: int | SeedStage) -> SeedStage:
    """Convert an integer (from a checkpoint or a report) to a stage, rejecting reserved values."""
    if int(value) in RESERVED_STAGE_VALUES:
        raise ValueError(f"seed stage value {int(value)} is reserved; accepted: {_stage_values()}")
    try:
        return SeedStage(int(value))
    except ValueError:
        raise ValueError(
            f"unknown seed stage value {value!r}; accepted: {_stage_values()}"
        ) from None


def _stage_values() -> str:
    return ", ".join(f"{s.value} ({s.name})" for s in SeedStage)


def is_valid_transition(source: SeedStage, target: SeedStage) -> bool:
    return target in VALID_TRANSITIONS[source]


def default_successor(stage: SeedStage) -> SeedStage | None:
    """The stage an ADVANCE moves to: the first legal successor that is not a failure stage."""
    return next((s for s in VALID_TRANSITIONS[stage] if s not in FAILURE_STAGES), None)


# --- gates ------------------------------------------------------------------------------------
class Gate(IntEnum):
    """Quality gates guarding entry to a stage (G4 is retired)."""

    G0 = 0
    G1 = 1
    G2 = 2
    G3 = 3
    G5 = 5


class GateMode(str, Enum):
    PERMISSIVE = "permissive"
    STRICT = "strict"


GATE_FOR_TARGET: dict[SeedStage, Gate] = {
    SeedStage.GERMINATED: Gate.G0,
    SeedStage.TRAINING: Gate.G1,
    SeedStage.BLENDING: Gate.G2,
    SeedStage.HOLDING: Gate.G3,
    SeedStage.FOSSILIZED: Gate.G5,
}


@dataclass(frozen=True)
class GateConfig:
    """Gate thresholds; the defaults are the constants above."""

    min_training_epochs: int = MIN_TRAINING_EPOCHS
    min_blending_epochs: int = MIN_BLENDING_EPOCHS
    min_training_improvement: float = MIN_TRAINING_IMPROVEMENT
    gradient_ratio_threshold: float = GRADIENT_RATIO_THRESHOLD
    min_gradient_health: float = MIN_GRADIENT_HEALTH
    min_fossilize_contribution: float = MIN_FOSSILIZE_CONTRIBUTION

    def __post_init__(self) -> None:
        for name in ("min_training_epochs", "min_blending_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GateResult:
    gate: int
    passed: bool
    score: float
    checks_passed: tuple[str, ...]
    checks_failed: tuple[str, ...]

    @property
    def message(self) -> str:
        verdict = "passed" if self.passed else "failed: " + ", ".join(self.checks_failed)
        return f"G{self.gate} {verdict}"


# --- metrics ----------------------------------------------------------------------------------
@dataclass
class SeedMetrics:
    """Per-seed measurements. ``None`` means "never measured" (gates fail closed on it).

    Counters are advanced only by `SeedState.tick`; `record_accuracy` records accuracy only.
    Accuracies and contributions are in percentage points.
    """

    epochs_total: int = 0
    epochs_in_stage: int = 0
    initial_accuracy: float | None = None
    current_accuracy: float | None = None
    best_accuracy: float | None = None
    accuracy_at_stage_start: float | None = None
    accuracy_at_blending_start: float | None = None
    counterfactual_contribution: float | None = None
    contribution_se: float | None = None  # its standard error over the examples; None: unknown
    contribution_velocity: float = 0.0
    contribution_age: int | None = None  # ticks since the contribution was last measured
    gradient_norm: float | None = None  # EMA of the seed gradient norm
    gradient_ratio: float | None = None  # EMA of the param-normalised seed/host gradient ratio
    gradient_health: float | None = None
    has_vanishing: bool | None = None
    has_exploding: bool | None = None
    previous_gradient_health: float | None = None  # health as it was at the previous tick
    seed_params: int = 0

    def record_accuracy(self, accuracy: float) -> None:
        if self.initial_accuracy is None:
            self.initial_accuracy = accuracy
        if self.accuracy_at_stage_start is None:
            self.accuracy_at_stage_start = accuracy
        self.current_accuracy = accuracy
        self.best_accuracy = accuracy if self.best_accuracy is None else max(
            self.best_accuracy, accuracy
        )

    def record_contribution(self, contribution: float,
                            standard_error: float | None = None) -> None:
        if self.counterfactual_contribution is not None:
            change = contribution - self.counterfactual_contribution
            decay = CONTRIBUTION_VELOCITY_DECAY
            self.contribution_velocity = decay * self.contribution_velocity + (1 - decay) * change
        self.counterfactual_contribution = contribution
        self.contribution_se = standard_error
        self.contribution_age = 0

    @property
    def improvement_since_stage_start(self) -> float:
        if self.current_accuracy is None or self.accuracy_at_stage_start is None:
            return 0.0
        return self.current_accuracy - self.accuracy_at_stage_start

    @property
    def total_improvement(self) -> float:
        if self.current_accuracy is None or self.initial_accuracy is None:
            return 0.0
        return self.current_accuracy - self.initial_accuracy

    @property
    def is_healthy(self) -> bool | None:
        """False once gradients exploded or went non-finite; None until gradients were measured."""
        if self.gradient_health is None:
            return None
        return not self.has_exploding and math.isfinite(self.gradient_health)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeedMetrics:
        return cls(**data)


@dataclass(frozen=True)
class StageEvent:
    """One transition in a seed's history."""

    source: int
    target: int
    epoch: int  # the seed's `epochs_total` when it happened
    reason: str


@dataclass
class SeedState:
    """The lifecycle of one seed: stage, counters, metrics, history and last gate result."""

    seed_id: str
    blueprint: str
    stage: SeedStage = SeedStage.DORMANT
    previous_stage: SeedStage = SeedStage.UNKNOWN
    previous_epochs_in_stage: int = 0
    metrics: SeedMetrics = field(default_factory=SeedMetrics)
    history: list[StageEvent] = field(default_factory=list)
    last_gate: GateResult | None = None
    prune_reason: str | None = None

    def transition(self, target: SeedStage, reason: str) -> None:
        """Move to ``target``; raises `IllegalTransitionError` when the table forbids it."""
        if not is_valid_transition(self.stage, target):
            raise IllegalTransitionError(
                f"seed {self.seed_id!r}: illegal transition {self.stage.name} -> {target.name}"
            )
        self.history.append(
            StageEvent(int(self.stage), int(target), self.metrics.epochs_total, reason)
        )
        del self.history[:-HISTORY_LENGTH]
        self.previous_stage = self.stage
        self.previous_epochs_in_stage = self.metrics.epochs_in_stage
        self.stage = target
        self.metrics.epochs_in_stage = 0
        self.metrics.accuracy_at_stage_start = self.metrics.current_accuracy
        if target == SeedStage.BLENDING and self.metrics.accuracy_at_blending_start is None:
            self.metrics.accuracy_at_blending_start = self.metrics.current_accuracy

    def tick(self, embargo_ticks: int = EMBARGO_TICKS) -> bool:
        """Advance the counters by one decision; move through the embargo pipeline (EMBARGOED
        for ``embargo_ticks`` decisions).

        Returns True when the RESETTING dwell is over and the slot should be emptied.
        """
        if self.stage == SeedStage.PRUNED:
            self.transition(SeedStage.EMBARGOED, "embargo")
            return False
        m = self.metrics
        m.epochs_total += 1
        m.epochs_in_stage += 1
        m.previous_gradient_health = m.gradient_health
        if m.contribution_age is not None:
            m.contribution_age += 1
        if self.stage == SeedStage.EMBARGOED and m.epochs_in_stage >= embargo_ticks:
            self.transition(SeedStage.RESETTING, "embargo_over")
        elif self.stage == SeedStage.RESETTING and m.epochs_in_stage >= RESETTING_TICKS:
            self.transition(SeedStage.DORMANT, "reset")
            return True
        return False

    def to_dict(self) -> dict[str, Any]:
        """Plain data (numbers, strings, lists, dicts): loadable with ``weights_only=True``."""
        return {
            "seed_id": self.seed_id,
            "blueprint": self.blueprint,
            "stage": int(self.stage),
            "previous_stage": int(self.previous_stage),
            "previous_epochs_in_stage": self.previous_epochs_in_stage,
            "metrics": self.metrics.to_dict(),
            "history": [asdict(event) for event in self.history],
            "last_gate": None if self.last_gate is None else _gate_to_dict(self.last_gate),
            "prune_reason": self.prune_reason,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeedState:
        gate = data["last_gate"]
        return cls(
            seed_id=data["seed_id"],
            blueprint=data["blueprint"],
            stage=parse_stage(data["stage"]),
            previous_stage=parse_stage(data["previous_stage"]),
            previous_epochs_in_stage=data["previous_epochs_in_stage"],
            metrics=SeedMetrics.from_dict(data["metrics"]),
            history=[StageEvent(**event) for event in data["history"]],
            last_gate=None if gate is None else _gate_from_dict(gate),
            prune_reason=data["prune_reason"],
        )


def _gate_to_dict(result: GateResult) -> dict[str, Any]:
    out = asdict(result)
    out["checks_passed"] = list(result.checks_passed)
    out["checks_failed"] = list(result.checks_failed)
    return out


def _gate_from_dict(data: dict[str, Any]) -> GateResult:
    return GateResult(
        gate=data["gate"],
        passed=data["passed"],
        score=data["score"],
        checks_passed=tuple(data["checks_passed"]),
        checks_failed=tuple(data["checks_failed"]),
    )


@dataclass(frozen=True)
class AlphaView:
    """What the gates need to know about a slot's alpha controller."""

    alpha: float
    target: float
    holding: bool  # controller mode is HOLD


def blend_checks(alpha: AlphaView) -> list[tuple[str, bool]]:
    """The named checks of "blending is complete": the target is full, the ramp is over (HOLD)
    and alpha sits on the target. Gate G3 reports them; `blend_complete` is their conjunction."""
    return [
        ("alpha_target_full", alpha.target >= 1.0 - ALPHA_TOLERANCE),
        ("alpha_holding", alpha.holding),
        ("alpha_reached", abs(alpha.alpha - alpha.target) <= ALPHA_TOLERANCE),
    ]


def blend_complete(alpha: AlphaView) -> bool:
    """Whether a blending seed is fully blended in and may move to HOLDING."""
    return all(ok for _, ok in blend_checks(alpha))


class QualityGates:
    """Evaluates the gate guarding a target stage. Unknown gates and unmeasured metrics fail.

    Example:
        >>> gates = QualityGates(GateMode.PERMISSIVE)
        >>> state = SeedState("s0", "conv_light")
        >>> gates.check(SeedStage.GERMINATED, state, AlphaView(0.0, 0.0, True)).passed
        True
    """

    def __init__(
        self, mode: GateMode | str = GateMode.PERMISSIVE, config: GateConfig | None = None
    ) -> None:
        self.config = config or GateConfig()
        try:
            self.mode = GateMode(mode)
        except ValueError:
            raise ValueError(
                f"unknown gate mode {mode!r}; accepted: permissive, strict"
            ) from None

    def check(self, target: SeedStage, state: SeedState, alpha: AlphaView, *,
              incubation: int | None = None) -> GateResult:
        """The gate guarding ``target`` for ``state``.

        ``incubation`` is the seed's blueprint's own (`blueprints.BlueprintSpec.incubation`;
        None: the config's ``min_training_epochs``). A blueprint that needs no incubation (0:
        block seeds) is asked G2 at germination (`SeedSlot.germinate`), before the seed ever
        ran: there is nothing to measure then, and G2 records that with its one check,
        ``no_incubation``; at G5 a permissive gate keeps such a seed on its gradients' health
        alone (it grows on a schedule, not on a measured contribution). Should such a seed have
        run in TRAINING (a checkpoint written before
        seeds without incubation germinated straight to BLENDING), G2 judges what it can: its
        gradients measured and not exploding, without the health threshold (an identity
        block's branches are closed at birth, so most of its gradients vanish by
        construction). Every other seed is asked for measured gradients as always: unmeasured
        never passes.
        """
        gate = GATE_FOR_TARGET.get(target)
        if gate is None:
            return GateResult(-1, False, 0.0, (), (f"no_gate_for_{target.name.lower()}",))
        if gate == Gate.G2:
            epochs = self.config.min_training_epochs if incubation is None else incubation
            checks = self._g2(state, epochs, never_incubates=incubation == 0)
        elif gate == Gate.G5:
            checks = self._g5(state, alpha, scheduled=incubation == 0)
        else:
            checks = {
                Gate.G0: self._g0,
                Gate.G1: self._g1,
                Gate.G3: self._g3,
            }[gate](state, alpha)
        passed = tuple(name for name, ok in checks if ok)
        failed = tuple(name for name, ok in checks if not ok)
        score = self._score(gate, state, alpha)
        return GateResult(int(gate), not failed and bool(passed), score, passed, failed)

    @property
    def strict(self) -> bool:
        return self.mode == GateMode.STRICT

    def _g0(self, state: SeedState, alpha: AlphaView) -> list[tuple[str, bool]]:
        return [("seed_id", bool(state.seed_id)), ("blueprint", bool(state.blueprint))]

    def _g1(self, state: SeedState, alpha: AlphaView) -> list[tuple[str, bool]]:
        return [("stage_germinated", state.stage == SeedStage.GERMINATED)]

    def _g2(self, state: SeedState, incubation: int,
            never_incubates: bool) -> list[tuple[str, bool]]:
        m, cfg = state.metrics, self.config
        if never_incubates and m.epochs_total == 0:
            return [("no_incubation", True)]  # a seed that never ran: no gradient to judge
        checks = [("min_training_epochs", m.epochs_in_stage >= incubation)]
        if self.strict:
            checks.append(
                ("min_improvement", m.improvement_since_stage_start >= cfg.min_training_improvement)
            )
            ratio = m.gradient_ratio
            checks.append(("gradient_ratio_measured", ratio is not None))
            checks.append(
                ("gradient_ratio", ratio is not None and ratio >= cfg.gradient_ratio_threshold)
            )
            return checks
        measured = m.gradient_health is not None
        checks.append(("gradient_health_measured", measured))
        checks.append(("not_exploding", measured and not m.has_exploding))
        if not never_incubates:
            value = m.gradient_health if m.gradient_health is not None else -math.inf
            checks.append(("gradient_health", value >= cfg.min_gradient_health))
        return checks

    def _g3(self, state: SeedState, alpha: AlphaView) -> list[tuple[str, bool]]:
        checks = blend_checks(alpha)
        if self.strict:
            blended = state.metrics.epochs_in_stage >= self.config.min_blending_epochs
            checks.append(("min_blending_epochs", blended))
        return checks

    def _g5(self, state: SeedState, alpha: AlphaView,
            scheduled: bool = False) -> list[tuple[str, bool]]:
        m = state.metrics
        contribution = m.counterfactual_contribution
        if scheduled and not self.strict:
            # A seed without incubation (a growth seed) is kept on its schedule, between two
            # validation runs or in a run without any: permissive G5 asks its gradients only.
            return [("healthy", m.is_healthy is True)]
        checks = [
            ("counterfactual_measured", contribution is not None),
            ("healthy", m.is_healthy is True),
        ]
        if self.strict:
            minimum = self.config.min_fossilize_contribution
            enough = contribution is not None and contribution >= minimum
            checks.append(("min_contribution", enough))
        return checks

    @staticmethod
    def _score(gate: Gate, state: SeedState, alpha: AlphaView) -> float:
        if gate == Gate.G2:
            return _unit(state.metrics.improvement_since_stage_start / 5.0)
        if gate == Gate.G3:
            return alpha.alpha
        if gate == Gate.G5:
            contribution = state.metrics.counterfactual_contribution
            return 0.0 if contribution is None else _unit(contribution / 10.0)
        return 1.0


def _unit(x: float) -> float:
    return min(1.0, max(0.0, x))

